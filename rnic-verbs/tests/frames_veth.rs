//! The frame transport on both sides of a real link: two network
//! namespaces joined by a veth pair, each end with an IPv4 address, a
//! global IPv6 address and its link-local one, and an rnic NIC on each end
//! (`Device::open_on_interface`, a process of its own in each namespace).
//! The NICs' GID tables come from the interfaces, in a RoCE port's order,
//! and an RC connection over each GID (IPv4, IPv6, link-local IPv6) moves
//! a WRITE, a READ of it back and a SEND, every byte checked on both sides.
//!
//! Needs root (namespaces, CAP_NET_RAW); without it the test says it was
//! skipped, and fails if `RNIC_REQUIRE_TOOLS` is set.

use std::net::IpAddr;
use std::process::{Command, Output};
use std::time::Duration;

use rnic_verbs::rendezvous::{self, EndpointRecord, RemoteBuffer};
use rnic_verbs::*;

const T: Duration = Duration::from_secs(20);
/// Bytes written and read back per connection.
const LEN: usize = 256 * 1024;
/// Where the SEND lands in the server's region, and its length; where the
/// client's READ lands, and where it sends from.
const RECV_AT: usize = LEN;
const SEND_LEN: usize = 1000;
const READ_AT: usize = LEN;
const SEND_AT: usize = 2 * LEN;
/// The GIDs each side uses, by index in the port's table: the IPv4 one,
/// the global IPv6 one, the link-local one.
const GIDS: [usize; 3] = [1, 2, 0];

fn pattern(i: usize, round: usize) -> u8 {
    (i.wrapping_mul(7) + round * 31) as u8
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

/// The namespaces, removed (and the veth pair with them) when dropped.
struct Namespaces(Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// One side: a process running the `veth_peer` test in namespace `ns`.
fn side(ns: &str, role: &str, iface: &str, port: u16, gids: &str) -> std::process::Child {
    side_with(ns, role, iface, port, gids, &[])
}

/// [`side`], with more variables in its environment.
fn side_with(
    ns: &str,
    role: &str,
    iface: &str,
    port: u16,
    gids: &str,
    env: &[(&str, &str)],
) -> std::process::Child {
    let me = std::env::current_exe().unwrap();
    Command::new("ip")
        .args(["netns", "exec", ns, "timeout", "90"])
        .arg(me)
        .args(["--exact", "veth_peer", "--nocapture", "--test-threads=1"])
        .envs(env.iter().copied())
        .env("RNIC_VETH_ROLE", role)
        .env("RNIC_VETH_IFACE", iface)
        .env("RNIC_VETH_PORT", port.to_string())
        .env("RNIC_VETH_GIDS", gids)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Two namespaces joined by a veth pair (see the file's comment): the
/// namespaces (removed when dropped) and the two ends' names; `None`, with
/// a note, if namespaces cannot be made here.
fn veth_pair(tag: &str) -> Option<(Namespaces, String, String)> {
    let id = std::process::id() % 100_000;
    let ns = Namespaces(vec![
        format!("rnic-veth-{id}-{tag}a"),
        format!("rnic-veth-{id}-{tag}b"),
    ]);
    let (a, b) = (&ns.0[0], &ns.0[1]);
    if !ip(&["netns", "add", a]) {
        eprintln!("SKIPPED: cannot make a network namespace (not root?)");
        assert!(
            std::env::var_os("RNIC_REQUIRE_TOOLS").is_none(),
            "root is required"
        );
        return None;
    }
    assert!(ip(&["netns", "add", b]));
    let (va, vb) = (format!("r{tag}a{id}"), format!("r{tag}b{id}"));
    for n in [a, b] {
        // Addresses usable at once: no duplicate address detection, so no
        // IPv6 address is "tentative" (unbindable) when a NIC starts.
        assert!(ip(&[
            "netns",
            "exec",
            n,
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.accept_dad=0",
            "net.ipv6.conf.default.accept_dad=0",
            "net.ipv6.conf.all.disable_ipv6=0",
            "net.ipv6.conf.default.disable_ipv6=0",
        ]));
        assert!(ip(&["-n", n, "link", "set", "lo", "up"]));
    }
    assert!(ip(&[
        "link", "add", &va, "netns", a, "type", "veth", "peer", "name", &vb, "netns", b
    ]));
    for (n, dev, v4, v6) in [
        (a, &va, "10.99.0.1/24", "fd99::1/64"),
        (b, &vb, "10.99.0.2/24", "fd99::2/64"),
    ] {
        assert!(ip(&["-n", n, "addr", "add", v4, "dev", dev]));
        assert!(ip(&["-n", n, "addr", "add", v6, "dev", dev, "nodad"]));
        assert!(ip(&["-n", n, "link", "set", dev, "up"]));
    }
    // The kernel gives each end its link-local address once the link is
    // up at both ends: wait for both (at most 5 s).
    for (n, dev) in [(a, &va), (b, &vb)] {
        let has_link_local = || {
            Command::new("ip")
                .args(["-n", n, "-6", "addr", "show", "dev", dev, "scope", "link"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("fe80::"))
        };
        let mut tries = 0;
        while !has_link_local() {
            tries += 1;
            assert!(tries < 100, "{dev} has no link-local address after 5 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Some((ns, va, vb))
}

#[test]
fn rdma_over_a_veth_pair_on_ipv4_ipv6_and_link_local() {
    if std::env::var_os("RNIC_VETH_ROLE").is_some() {
        return; // a side's process: `veth_peer` runs there
    }
    let Some((ns, va, vb)) = veth_pair("v") else {
        return;
    };
    let (a, b) = (&ns.0[0], &ns.0[1]);
    let id = std::process::id() % 100_000;
    let port = 41_000 + (id % 4_000) as u16 * 4;
    let server = side(b, "server", &vb, port, "1,2,0");
    let client = side(a, "client", &va, port, "1,2,0")
        .wait_with_output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    let (c, s) = (text(&client), text(&server));
    println!("client:\n{c}\nserver:\n{s}");
    assert!(client.status.success(), "the client failed:\n{c}");
    assert!(server.status.success(), "the server failed:\n{s}");
    for g in GIDS {
        assert!(c.contains(&format!("gid {g} ")), "no run on GID {g}:\n{c}");
        assert!(s.contains(&format!("gid {g} ")), "no run on GID {g}:\n{s}");
    }
    // The IPv4 run's datagrams, once the kernel had resolved the peer's
    // link-layer address, went past IP and UDP: most of a 256 KiB WRITE's
    // 64 and a READ's.
    for (side, t) in [("client", &c), ("server", &s)] {
        let past: u64 = t
            .lines()
            .find_map(|l| l.strip_prefix("sent_past_ip="))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no sent_past_ip from the {side}:\n{t}"));
        assert!(
            past >= 32,
            "the {side} sent {past} datagrams past IP and UDP"
        );
    }
}

/// UDP GSO on a real link, proven on the wire: both NICs send runs of
/// datagrams as GSO sends (`RNIC_GSO=on`; by default only loopback does),
/// both veth ends have `tx-udp-segmentation off`, so the kernel cuts every
/// send into datagrams itself and numbers their IPv4 identification 0, 1,
/// 2, ..., and each segment's ICRC must have been made for its number.
/// Each NIC takes whole frames and verifies every ICRC over the header the
/// frame came with; a capture on the server's end checks every frame again
/// and shows that the identifications were there to check.
#[test]
fn gso_segments_carry_the_icrc_of_their_identification() {
    if std::env::var_os("RNIC_VETH_ROLE").is_some() {
        return;
    }
    let Some((ns, va, vb)) = veth_pair("g") else {
        return;
    };
    let (a, b) = (&ns.0[0], &ns.0[1]);
    // Both ends: READ responses go the other way. (With the offload on,
    // veth hands the peer the uncut message, which no frame socket takes.)
    for (n, dev) in [(a, &va), (b, &vb)] {
        let ethtool = Command::new("ip")
            .args([
                "netns",
                "exec",
                n,
                "ethtool",
                "-K",
                dev,
                "tx-udp-segmentation",
                "off",
            ])
            .status();
        assert!(
            ethtool.is_ok_and(|s| s.success()),
            "ethtool -K {dev} tx-udp-segmentation off"
        );
    }
    let dir = std::env::temp_dir().join(format!("rnic-gso-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("vb.pcap");
    let mut tcpdump = Command::new("ip")
        .args([
            "netns", "exec", b, "tcpdump", "-Z", "root", "-U", "-n", "-s", "0",
        ])
        .args(["-i", &vb, "-w"])
        .arg(&pcap)
        .args(["udp", "port", "4791"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("tcpdump");
    let t0 = std::time::Instant::now();
    while !pcap.exists() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    let id = std::process::id() % 100_000;
    let port = 37_000 + (id % 4_000) as u16 * 4;
    let gso = [("RNIC_GSO", "on")];
    let server = side_with(b, "server", &vb, port, "1,2", &gso);
    let client = side_with(a, "client", &va, port, "1,2", &gso)
        .wait_with_output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let _ = tcpdump.kill();
    let _ = tcpdump.wait();
    let (c, s) = (text(&client), text(&server));
    println!("client:\n{c}\nserver:\n{s}");
    assert!(client.status.success(), "the client failed:\n{c}");
    assert!(server.status.success(), "the server failed:\n{s}");
    assert!(
        s.contains("icrc_errors=0"),
        "the server's NIC refused packets:\n{s}"
    );
    assert!(
        c.contains("icrc_errors=0"),
        "the client's NIC refused packets:\n{c}"
    );

    let bytes = std::fs::read(&pcap).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let reader = rnic_wire::pcap::PcapReader::new(&bytes).unwrap();
    let (mut frames, mut numbered, mut top, mut v6) = (0, 0, 0u16, 0);
    for r in reader {
        let r = r.unwrap();
        let f = rnic_wire::encap::Frame::parse(rnic_wire::encap::LinkType::Ethernet, r.data)
            .unwrap_or_else(|e| panic!("frame {frames} does not parse: {e}"));
        assert!(f.icrc_ok(), "frame {frames}: wrong ICRC");
        frames += 1;
        match f.ip {
            rnic_wire::encap::IpRepr::V4(ip) => {
                if ip.ident != 0 {
                    numbered += 1;
                }
                top = top.max(ip.ident);
            }
            rnic_wire::encap::IpRepr::V6(_) => v6 += 1,
        }
    }
    println!("{frames} frames, every ICRC right; {numbered} IPv4 ones with identification 1..={top}; {v6} IPv6");
    // 256 KiB at 1024 bytes a packet, written and read back, per GID:
    // about 1,100 frames (a busy machine's capture may miss some).
    assert!(frames > 500, "{frames} frames");
    assert!(
        numbered > 100,
        "the kernel cut GSO sends: {numbered} numbered frames"
    );
    assert!(top < rnic_wire::icrc::UDP_GSO_IDS, "identification {top}");
    assert!(v6 > 100, "{v6} IPv6 frames");
}

/// One side of the test above, in its namespace (does nothing unless
/// `RNIC_VETH_ROLE` is set).
#[test]
fn veth_peer() {
    let Ok(role) = std::env::var("RNIC_VETH_ROLE") else {
        return;
    };
    let iface = std::env::var("RNIC_VETH_IFACE").unwrap();
    let port: u16 = std::env::var("RNIC_VETH_PORT").unwrap().parse().unwrap();
    let server = role == "server";
    let rounds: Vec<usize> = std::env::var("RNIC_VETH_GIDS")
        .unwrap()
        .split(',')
        .map(|g| g.parse().unwrap())
        .collect();
    let dev = Device::open_on_interface(&iface).unwrap();
    let gids = dev.gids().to_vec();
    println!("{iface}: GIDs {gids:?}");
    // The interface's addresses as a RoCE port lists them: link-local,
    // IPv4, global IPv6.
    let me = if server { 2 } else { 1 };
    assert_eq!(gids.len(), 3, "{gids:?}");
    assert!(matches!(gids[0], IpAddr::V6(a) if a.segments()[0] == 0xfe80));
    assert_eq!(gids[1], IpAddr::from([10, 99, 0, me]));
    assert_eq!(gids[2], format!("fd99::{me}").parse::<IpAddr>().unwrap());
    assert_eq!(
        dev.addr(),
        gids[1],
        "the device's own address is its IPv4 one"
    );
    // Every QP lives to the end: a late packet for one destroyed would
    // count as for an unknown QP too.
    let mut keep = Vec::new();
    for (round, &g) in rounds.iter().enumerate() {
        let port = port + round as u16;
        let pd = dev.alloc_pd().unwrap();
        let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let mr = pd.register(3 * LEN, rights).unwrap();
        let cq = dev.create_cq(16).unwrap();
        let mut qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
        qp.use_gid(g).unwrap();
        println!("qpn {:#08x}", qp.qpn());
        assert_eq!(qp.endpoint().addr, gids[g]);
        let mine = EndpointRecord {
            endpoint: qp.endpoint(),
            buffer: Some(RemoteBuffer {
                va: mr.addr(),
                rkey: mr.rkey(),
                len: LEN as u64,
            }),
        };
        let theirs = if server {
            rendezvous::serve(port, &mine).unwrap()
        } else {
            rendezvous::connect("10.99.0.2", port, &mine, T).unwrap()
        };
        assert_eq!(
            theirs.endpoint.addr.is_ipv4(),
            gids[g].is_ipv4(),
            "the peer's GID is of this GID's family"
        );
        let o = ConnectOptions {
            mtu: Mtu::Mtu1024,
            access: Access::REMOTE_WRITE | Access::REMOTE_READ,
            ..ConnectOptions::default()
        };
        qp.connect(&theirs.endpoint, &o).unwrap();
        if server {
            qp.post_recv(RecvWr {
                wr_id: 1,
                sg_list: sg_list![mr.sge(RECV_AT, SEND_LEN as u32)],
            })
            .unwrap();
            // Both QPs are ready before the first request: none meets a
            // QP not yet connected (which counts as for an unknown QP).
            rendezvous::serve(port + 20, &mine).unwrap();
            // The SEND comes after the WRITE: once it is here, so is the
            // WRITE's every byte.
            let c = cq.wait(T).unwrap();
            assert_eq!(
                (c.status, c.opcode, c.byte_len),
                (WcStatus::Success, WcOpcode::Recv, SEND_LEN as u32)
            );
            let mut got = vec![0u8; LEN + SEND_LEN];
            mr.read(0, &mut got);
            for (i, &x) in got[..LEN].iter().enumerate() {
                assert_eq!(x, pattern(i, round), "WRITE byte {i} on GID {g}");
            }
            for (i, &x) in got[LEN..].iter().enumerate() {
                assert_eq!(x, pattern(i, round + 1), "SEND byte {i} on GID {g}");
            }
            // Stay until the client has read its bytes back.
            rendezvous::serve(port + 10, &mine).unwrap();
        } else {
            rendezvous::connect("10.99.0.2", port + 20, &mine, T).unwrap();
            let data: Vec<u8> = (0..LEN).map(|i| pattern(i, round)).collect();
            mr.write(0, &data);
            let msg: Vec<u8> = (0..SEND_LEN).map(|i| pattern(i, round + 1)).collect();
            mr.write(SEND_AT, &msg);
            let peer = theirs.buffer.unwrap();
            let wr = |wr_id, op, sg| SendWr::new(wr_id, op, sg);
            let write = SendOp::write(peer.va, peer.rkey);
            qp.post_send(wr(1, write, sg_list![mr.sge(0, LEN as u32)]))
                .unwrap();
            let read = SendOp::read(peer.va, peer.rkey);
            qp.post_send(wr(2, read, sg_list![mr.sge(READ_AT, LEN as u32)]))
                .unwrap();
            let send = SendOp::send();
            let sg = sg_list![mr.sge(SEND_AT, SEND_LEN as u32)];
            qp.post_send(wr(3, send, sg)).unwrap();
            for id in 1..=3 {
                let c = cq.wait(T).unwrap();
                assert_eq!((c.wr_id, c.status), (id, WcStatus::Success), "{c:?}");
            }
            let mut back = vec![0u8; LEN];
            mr.read(READ_AT, &mut back);
            assert!(back == data, "the READ brought back what was written");
            rendezvous::connect("10.99.0.2", port + 10, &mine, T).unwrap();
        }
        println!("gid {g} {}: WRITE, READ and SEND intact", gids[g]);
        keep.push((qp, cq, mr, pd));
    }
    // What reached this NIC was for its QPs: another NIC's packets on the
    // same address stopped at its frame socket's filter.
    let c = dev.counters().unwrap();
    println!("unknown_qp={} icrc_errors={}", c.unknown_qp, c.icrc_errors);
    println!("sent_past_ip={}", dev.sent_past_ip().unwrap());
}

/// Two NICs on each end of the link, four processes, two connections at
/// once: each NIC takes a slot of the QP numbers, and its frame socket
/// only its own QPs' packets, so none sees the other's.
#[test]
fn two_nics_share_each_address() {
    if std::env::var_os("RNIC_VETH_ROLE").is_some() {
        return;
    }
    let Some((ns, va, vb)) = veth_pair("s") else {
        return;
    };
    let (a, b) = (&ns.0[0], &ns.0[1]);
    let id = std::process::id() % 100_000;
    let port = 45_000 + (id % 4_000) as u16 * 4;
    // Two connections, each over the IPv4 GID and then the IPv6 one.
    let servers = [
        side(b, "server", &vb, port, "1,2"),
        side(b, "server", &vb, port + 2, "1,2"),
    ];
    let clients = [
        side(a, "client", &va, port, "1,2"),
        side(a, "client", &va, port + 2, "1,2"),
    ];
    let mut slots = Vec::new();
    for p in clients.into_iter().chain(servers) {
        let o = p.wait_with_output().unwrap();
        let t = text(&o);
        println!("{t}");
        assert!(o.status.success(), "a side failed:\n{t}");
        assert!(t.contains("unknown_qp=0 icrc_errors=0"), "{t}");
        let qpns: Vec<u32> = t
            .lines()
            .filter_map(|l| l.strip_prefix("qpn 0x"))
            .map(|q| u32::from_str_radix(q.trim(), 16).unwrap())
            .collect();
        assert_eq!(qpns.len(), 2, "{t}");
        assert_eq!(qpns[0] >> 20, qpns[1] >> 20, "one slot per NIC: {qpns:x?}");
        slots.push(qpns[0] >> 20);
    }
    // The two NICs on each end have slots of their own.
    assert_ne!(slots[0], slots[1], "{slots:?}");
    assert_ne!(slots[2], slots[3], "{slots:?}");
}

/// A NIC on the frame transport reaches its own address: what this host
/// sends to one of its own addresses goes through `lo`, never through the
/// interface, and the NIC takes it in there too (as rdma_rxe loops such a
/// packet back, and a hardware NIC does). Two QPs of one NIC, connected to
/// each other over the IPv4 GID and then the IPv6 one, move a WRITE and a
/// SEND, every byte checked. Without the NIC's frame socket on `lo`,
/// nothing arrives and the first WRITE never completes.
#[test]
fn a_nic_reaches_its_own_address() {
    if std::env::var_os("RNIC_VETH_ROLE").is_some() {
        return;
    }
    let Some((ns, _va, vb)) = veth_pair("o") else {
        return;
    };
    let me = std::env::current_exe().unwrap();
    let o = Command::new("ip")
        .args(["netns", "exec", &ns.0[1], "timeout", "60"])
        .arg(me)
        .args(["--exact", "veth_self", "--nocapture", "--test-threads=1"])
        .env("RNIC_VETH_SELF", &vb)
        .output()
        .unwrap();
    let t = text(&o);
    println!("{t}");
    assert!(o.status.success(), "{t}");
    assert_eq!(
        t.matches("to itself: WRITE and SEND intact").count(),
        2,
        "{t}"
    );
    assert!(
        t.contains("longer than a frame: counted as malformed"),
        "{t}"
    );
}

/// The process of [`a_nic_reaches_its_own_address`], in the namespace.
#[test]
fn veth_self() {
    let Ok(iface) = std::env::var("RNIC_VETH_SELF") else {
        return;
    };
    let dev = Device::open_on_interface(&iface).unwrap();
    let gids = dev.gids().to_vec();
    // A datagram to port 4791 longer than a frame of the NIC's receive
    // ring holds (8,112 bytes of IP packet; `lo` carries 64 KiB) arrives
    // cut: it is counted as malformed and nothing else, and the ring
    // carries on (the WRITEs and SENDs below cross it, and wrap it).
    // Each names a QP of the NIC in its BTH, as the ring's filter asks.
    let (pd, cq) = (dev.alloc_pd().unwrap(), dev.create_cq(1).unwrap());
    let target = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    let before = dev.counters().unwrap().malformed;
    let udp = std::net::UdpSocket::bind((gids[1], 0)).unwrap();
    for len in [8_085, 8_200, 60_000] {
        let mut d = vec![0x64; len];
        d[..12].copy_from_slice(&[0x04, 0, 0xFF, 0xFF, 0, 0, 0, 0, 0, 0, 0, 1]);
        d[5..8].copy_from_slice(&target.qpn().to_be_bytes()[1..]);
        udp.send_to(&d, (gids[1], 4791)).unwrap();
    }
    let mut tries = 0;
    while dev.counters().unwrap().malformed < before + 3 {
        tries += 1;
        assert!(
            tries < 100,
            "datagrams longer than a frame were not counted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(dev.counters().unwrap().malformed, before + 3);
    println!("datagrams longer than a frame: counted as malformed");
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let mut keep = Vec::new();
    for (round, g) in [1usize, 2].into_iter().enumerate() {
        let mr = pd.register(2 * LEN + SEND_LEN, rights).unwrap();
        let cq = dev.create_cq(16).unwrap();
        let mut a = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
        let mut b = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
        a.use_gid(g).unwrap();
        b.use_gid(g).unwrap();
        let o = ConnectOptions {
            mtu: Mtu::Mtu1024,
            access: Access::REMOTE_WRITE,
            ..ConnectOptions::default()
        };
        let (ea, eb) = (a.endpoint(), b.endpoint());
        assert_eq!((ea.addr, eb.addr), (gids[g], gids[g]));
        a.connect(&eb, &o).unwrap();
        b.connect(&ea, &o).unwrap();
        b.post_recv(RecvWr {
            wr_id: 9,
            sg_list: sg_list![mr.sge(2 * LEN, SEND_LEN as u32)],
        })
        .unwrap();
        let data: Vec<u8> = (0..LEN).map(|i| pattern(i, round)).collect();
        mr.write(0, &data);
        let write = SendOp::write(mr.addr() + LEN as u64, mr.rkey());
        a.post_send(SendWr::new(1, write, sg_list![mr.sge(0, LEN as u32)]))
            .unwrap();
        a.post_send(SendWr::new(
            2,
            SendOp::send(),
            sg_list![mr.sge(0, SEND_LEN as u32)],
        ))
        .unwrap();
        let mut done = Vec::new();
        for _ in 0..3 {
            let c = cq.wait(T).expect("a completion");
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            done.push(c.wr_id);
        }
        done.sort_unstable();
        assert_eq!(done, [1, 2, 9]);
        let mut got = vec![0u8; LEN + SEND_LEN];
        mr.read(LEN, &mut got);
        assert!(got[..LEN] == data[..], "the WRITE's bytes");
        assert!(got[LEN..] == data[..SEND_LEN], "the SEND's bytes");
        println!("gid {g} {}: to itself: WRITE and SEND intact", gids[g]);
        keep.push((a, b, cq, mr));
    }
}
