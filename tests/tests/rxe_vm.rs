//! rnic's Rust API on the wire with the kernel's rdma_rxe, live.
//!
//! The VM of `interop/rxe-vm` boots with its NIC on a tap in a network
//! namespace this test makes (10.88.0.1, fd88::1 and fe80::1 on the host's
//! side; 10.88.0.2 and fd88::2 in the guest). On the host, each case runs
//! in a process of its own in that namespace (this binary again, the
//! `rxe_vm_peer` entry point), which opens the tap with
//! `Device::open_on_interface` and meets rdma-core's unmodified
//! `ibv_rc_pingpong` or `ibv_ud_pingpong` on rxe, with the programs' own
//! endpoint exchange, once as their server and once as their client; and
//! `rping`, connected through the connection manager (`Device::listen`
//! and `Device::connect` against the kernel's rdma_cm and ib_cm), rnic's
//! side speaking rping's protocol: it READs and WRITEs back as the server,
//! and checks every byte of the echo as the client.
//!
//! The pingpongs use one buffer to receive into and send from, so without
//! `-c` rxe's side sends back exactly the bytes it last received: rnic's
//! side sends a different pattern every time and checks every byte of
//! every echo (the first message of rxe as the client is its buffer's fill,
//! 0x7b). For UD it also checks the sender's QPN and the 40-byte GRH area.
//! Every frame on the tap is captured and, here, parsed by rnic-wire with
//! every ICRC checked: from both sides, over IPv4 and IPv6.
//!
//! `interop/rxe-interop` runs the whole matrix (perftest, the drop-in,
//! netem); this is the Rust API's part. It boots a VM (about a minute in
//! all), so it is ignored by `cargo test`; `tools/run-tests` runs it:
//!
//! ```sh
//! cargo test -p rnic-tests --test rxe_vm -- --ignored --nocapture
//! ```

use std::net::IpAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rnic_tests::vm::{self, ip, repo, Setup};
use rnic_verbs::rendezvous;
use rnic_verbs::*;
use rnic_wire::pcap::PcapReader;
use rnic_wire::{Frame, LinkType};

/// What rxe's side does in a case; rnic's side does the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Server,
    Client,
}

#[derive(Debug, Clone, Copy)]
struct Case {
    name: &'static str,
    rxe: Role,
    port: u16,
    ud: bool,
    v6: bool,
    size: usize,
    iters: usize,
    mtu: u32,
    /// rping's protocol, connected through the CM (rnic's
    /// `Device::listen`/`Device::connect`, the kernel's rdma_cm and ib_cm).
    rping: bool,
}

const fn case(name: &'static str, rxe: Role, port: u16, ud: bool, v6: bool) -> Case {
    Case {
        name,
        rxe,
        port,
        ud,
        v6,
        size: if ud { 1024 } else { 16384 },
        iters: 200,
        mtu: 1024,
        rping: false,
    }
}

const fn rping(name: &'static str, rxe: Role, port: u16, v6: bool) -> Case {
    Case {
        size: 4096,
        iters: 100,
        rping: true,
        ..case(name, rxe, port, false, v6)
    }
}

const CASES: [Case; 11] = [
    case("rc_rxe_server", Role::Server, 18800, false, false),
    case("rc_rxe_client", Role::Client, 18801, false, false),
    case("rc_v6_rxe_server", Role::Server, 18802, false, true),
    case("rc_v6_rxe_client", Role::Client, 18803, false, true),
    case("ud_rxe_server", Role::Server, 18804, true, false),
    case("ud_rxe_client", Role::Client, 18805, true, false),
    Case {
        size: 65536,
        iters: 50,
        mtu: 4096,
        ..case("rc_mtu4096_rxe_server", Role::Server, 18806, false, false)
    },
    Case {
        size: 1,
        ..case("rc_1byte_rxe_client", Role::Client, 18807, false, true)
    },
    rping("rping_rxe_server", Role::Server, 18810, false),
    rping("rping_rxe_client", Role::Client, 18811, false),
    rping("rping_v6_rxe_server", Role::Server, 18812, true),
];

const HOST4: &str = "10.88.0.1";
const GUEST4: &str = "10.88.0.2";
const GUEST6: &str = "fd88::2";
const HOST6: &str = "fd88::1";
const UD_QKEY: u32 = 0x1111_1111;
const GRH: usize = 40;

impl Case {
    /// rxe's command line, as the guest script runs it (GID4 and GID6 are
    /// replaced there by rxe's IPv4 and IPv6 GID indices).
    fn guest_line(&self) -> String {
        if self.rping {
            let (host, guest) = if self.v6 {
                (HOST6, GUEST6)
            } else {
                (HOST4, GUEST4)
            };
            let (role, addrs) = match self.rxe {
                Role::Server => ("server", format!("-a {guest}")),
                Role::Client => ("client", format!("-a {host} -I {guest}")),
            };
            return format!(
                "{} {role} {} rping {addrs} -V -C {} -S {}",
                self.name, self.port, self.iters, self.size
            );
        }
        let prog = if self.ud {
            "ibv_ud_pingpong"
        } else {
            "ibv_rc_pingpong"
        };
        let role = match self.rxe {
            Role::Server => "server",
            Role::Client => "client",
        };
        let gid = if self.v6 { "GID6" } else { "GID4" };
        let mtu = if self.ud {
            String::new()
        } else {
            format!(" -m {}", self.mtu)
        };
        format!(
            "{} {role} {} {prog} -g {gid} -n {} -s {}{mtu}",
            self.name, self.port, self.iters, self.size
        )
    }
}

/// Message `k` of rnic's side: a pattern of its own.
fn message(k: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ k.wrapping_mul(0x9d) ^ (i >> 8)) as u8)
        .collect()
}

/// rping's message `ping` of `len` bytes, as rping's client makes them:
/// text without a NUL but the last byte (the server echoes
/// `strlen(buf) + 1` bytes).
fn rping_message(ping: usize, len: usize) -> Vec<u8> {
    let mut m = format!("rdma-ping-{ping}: ").into_bytes();
    m.extend((0..len).map(|i| b'A' + ((ping + i) % 58) as u8));
    m.truncate(len - 1);
    m.push(0);
    m
}

/// What rping sends to say where a buffer is: address, R_Key and length,
/// big-endian (`struct rping_rdma_info`).
fn rping_info(addr: u64, rkey: u32, len: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&addr.to_be_bytes());
    b[8..12].copy_from_slice(&rkey.to_be_bytes());
    b[12..].copy_from_slice(&len.to_be_bytes());
    b
}

/// The address, R_Key and length of a `struct rping_rdma_info`
/// ([`rping_info`] read back).
fn parse_rping_info(b: &[u8; 16]) -> (u64, u32, usize) {
    let addr = u64::from_be_bytes(b[..8].try_into().unwrap());
    let rkey = u32::from_be_bytes(b[8..12].try_into().unwrap());
    let len = u32::from_be_bytes(b[12..].try_into().unwrap());
    (addr, rkey, len as usize)
}

/// rnic's side of an rping case, through the CM with rnic-verbs' API:
/// as the client, it advertises a buffer, lets rxe's server READ it and
/// WRITE it back into a second one, and checks every byte; as the server,
/// it READs the client's buffer and WRITEs it back (rxe's `rping -c -V`
/// checks the echo).
fn peer_rping(iface: &str, c: &Case) -> std::result::Result<String, String> {
    let e = |what: &str| {
        let what = what.to_string();
        move |err: Error| format!("{what}: {err}")
    };
    let share = std::env::var("RNIC_RXE_SHARE").map_err(|_| "no RNIC_RXE_SHARE")?;
    let listening = Path::new(&share)
        .join("out")
        .join(format!("{}.listening", c.name));
    let dev = Device::open_on_interface(iface).map_err(e("open the tap"))?;
    let (host, guest) = if c.v6 {
        (HOST6, GUEST6)
    } else {
        (HOST4, GUEST4)
    };
    let host: IpAddr = host.parse().unwrap();
    let gid = dev
        .gids()
        .iter()
        .position(|a| *a == host)
        .ok_or_else(|| format!("{host} is not in rnic's GID table"))?;
    let pd = dev.alloc_pd().map_err(e("alloc_pd"))?;
    let (scq, rcq) = (
        dev.create_cq(8).map_err(e("create_cq"))?,
        dev.create_cq(8).map_err(e("create_cq"))?,
    );
    let mut qp = pd
        .qp_builder(&scq, &rcq)
        .max_send_wr(4)
        .max_recv_wr(4)
        .build()
        .map_err(e("create_qp"))?;
    qp.use_gid(gid).map_err(e("use_gid"))?;
    let remote = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let (start, sink) = (
        pd.register(c.size, remote).map_err(e("register"))?,
        pd.register(c.size, remote).map_err(e("register"))?,
    );
    // Two receive slots of 16 bytes, then the send slot.
    let ctl = pd
        .register(48, Access::LOCAL_WRITE)
        .map_err(e("register"))?;
    let post_recv = |slot: usize| {
        qp.post_recv(RecvWr {
            wr_id: slot as u64,
            sg_list: sg_list![ctl.sge(slot * 16, 16)],
        })
        .map_err(e("post_recv"))
    };
    // INIT, as rdma_create_qp leaves it, so that the receives are up
    // before the connection (connect and accept take it on from there).
    let init = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: remote,
        port_num: 1,
        ..QpAttr::default()
    };
    let mask = AttrMask::STATE | AttrMask::ACCESS_FLAGS | AttrMask::PKEY_INDEX | AttrMask::PORT;
    qp.modify(&init, mask).map_err(e("INIT"))?;
    post_recv(0)?;
    post_recv(1)?;
    let wait = Duration::from_secs(30);
    let done = |cq: &CompletionQueue, what: &str| -> std::result::Result<Completion, String> {
        let wc = cq.wait(wait).map_err(e(what))?;
        if wc.status != WcStatus::Success {
            return Err(format!("{what}: {wc:?}"));
        }
        Ok(wc)
    };
    // A receive of rping's 16 bytes, its slot posted again.
    let recv = || -> std::result::Result<[u8; 16], String> {
        let wc = done(&rcq, "a receive")?;
        if wc.byte_len != 16 {
            return Err(format!("rping sent {} bytes, not 16", wc.byte_len));
        }
        let mut b = [0u8; 16];
        ctl.read(wc.wr_id as usize * 16, &mut b);
        post_recv(wc.wr_id as usize)?;
        Ok(b)
    };
    let send = |info: [u8; 16]| -> std::result::Result<(), String> {
        ctl.write(32, &info);
        qp.post_send(SendWr::new(1, SendOp::send(), sg_list![ctl.sge(32, 16)]))
            .map_err(e("post_send"))?;
        done(&scq, "a SEND").map(|_| ())
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    match c.rxe {
        Role::Server => {
            while !listening.exists() {
                if Instant::now() > deadline {
                    return Err("rxe's rping never listened".into());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let to = std::net::SocketAddr::new(guest.parse().unwrap(), c.port);
            let conn = dev.connect(&qp, to, &[], wait).map_err(e("connect"))?;
            for ping in 0..c.iters {
                let m = rping_message(ping, c.size);
                start.write(0, &m);
                sink.write(0, &vec![0; c.size]);
                send(rping_info(start.addr(), start.rkey(), c.size as u32))?;
                recv()?; // it has READ the start buffer
                send(rping_info(sink.addr(), sink.rkey(), c.size as u32))?;
                recv()?; // it has WRITTEN it back
                let mut got = vec![0; c.size];
                sink.read(0, &mut got);
                if got != m {
                    let at = got.iter().zip(&m).position(|(a, b)| a != b);
                    return Err(format!(
                        "ping {ping}: the echo differs, first at byte {at:?}"
                    ));
                }
            }
            conn.disconnect(wait).map_err(e("disconnect"))?;
        }
        Role::Client => {
            let listener = dev.listen(c.port).map_err(e("listen"))?;
            std::fs::write(&listening, b"").map_err(|err| err.to_string())?;
            let request = listener
                .next(deadline - Instant::now())
                .map_err(e("a request"))?;
            let conn = request.accept(&qp, &[], wait).map_err(e("accept"))?;
            for ping in 0..c.iters {
                let (addr, rkey, len) = parse_rping_info(&recv()?);
                if len != c.size {
                    return Err(format!("ping {ping}: rping advertised {len} bytes"));
                }
                let read = SendWr::new(
                    2,
                    SendOp::read(addr, rkey),
                    sg_list![sink.sge(0, len as u32)],
                );
                qp.post_send(read).map_err(e("post_send READ"))?;
                done(&scq, "the READ")?;
                let mut got = vec![0; len];
                sink.read(0, &mut got);
                let text = format!("rdma-ping-{ping}: ");
                if !got.starts_with(text.as_bytes()) || got.last() != Some(&0) {
                    return Err(format!(
                        "ping {ping}: READ {:?}",
                        String::from_utf8_lossy(&got[..32])
                    ));
                }
                send([0; 16])?; // go ahead
                let (addr, rkey, _) = parse_rping_info(&recv()?);
                let n = got.iter().position(|&b| b == 0).unwrap() + 1;
                let write = SendWr::new(
                    3,
                    SendOp::write(addr, rkey),
                    sg_list![sink.sge(0, n as u32)],
                );
                qp.post_send(write).map_err(e("post_send WRITE"))?;
                done(&scq, "the WRITE")?;
                send([0; 16])?; // it is there
            }
            conn.wait_disconnect(wait)
                .map_err(e("the client's disconnect"))?;
        }
    }
    Ok(format!(
        "{} rping rounds of {} B through the CM over GID {gid}, every byte checked",
        c.iters, c.size
    ))
}

/// rnic's side of one case, in the namespace; Err says what went wrong.
fn peer(iface: &str, c: &Case) -> std::result::Result<String, String> {
    if c.rping {
        return peer_rping(iface, c);
    }
    let e = |what: &str| {
        let what = what.to_string();
        move |err: Error| format!("{what}: {err}")
    };
    let dev = Device::open_on_interface(iface).map_err(e("open the tap"))?;
    let want: IpAddr = if c.v6 { "fd88::1" } else { HOST4 }.parse().unwrap();
    let gid = dev
        .gids()
        .iter()
        .position(|a| *a == want)
        .ok_or_else(|| format!("{want} is not in rnic's GID table {:?}", dev.gids()))?;
    let pd = dev.alloc_pd().map_err(e("alloc_pd"))?;
    let grh = if c.ud { GRH } else { 0 };
    let slot = c.size + grh;
    // Receive slots, one per message, then the send slot.
    let mr = pd
        .register((c.iters + 1) * slot, Access::LOCAL_WRITE)
        .map_err(e("register"))?;
    let send_at = c.iters * slot;
    let cq = dev.create_cq(2 * c.iters + 8).map_err(e("create_cq"))?;
    let mut qp = pd
        .qp_builder(&cq, &cq)
        .qp_type(if c.ud { QpType::Ud } else { QpType::Rc })
        .max_recv_wr(c.iters as u32)
        .max_send_wr(4)
        .build()
        .map_err(e("create_qp"))?;
    qp.use_gid(gid).map_err(e("use_gid"))?;
    let post_recvs = |qp: &QueuePair| {
        (0..c.iters).try_for_each(|k| {
            qp.post_recv(RecvWr {
                wr_id: k as u64,
                sg_list: sg_list![mr.sge(k * slot, slot as u32)],
            })
            .map_err(e("post_recv"))
        })
    };
    // Receives go up once the QP is out of RESET: a UD QP is ready before
    // the exchange; an RC QP once connected (a SEND that comes sooner draws
    // an RNR NAK, and ibv_rc_pingpong retries it for ever).
    if c.ud {
        qp.ready_ud(UD_QKEY).map_err(e("ready_ud"))?;
        post_recvs(&qp)?;
    }
    let mine = qp.endpoint();
    let remote = match c.rxe {
        Role::Server => {
            rendezvous::connect_pingpong(GUEST4, c.port, &mine, Duration::from_secs(120))
        }
        Role::Client => rendezvous::serve_pingpong(c.port, &mine),
    }
    .map_err(|err| format!("the endpoint exchange: {err}"))?;
    let want_remote: IpAddr = if c.v6 { GUEST6 } else { GUEST4 }.parse().unwrap();
    if remote.addr != want_remote {
        return Err(format!("rxe's GID is {}, not {want_remote}", remote.addr));
    }
    let ah = if c.ud {
        Some(
            pd.create_ah_from(remote.addr, gid)
                .map_err(e("create_ah"))?,
        )
    } else {
        let o = ConnectOptions {
            mtu: Mtu::from_bytes(c.mtu).ok_or("bad MTU")?,
            ..ConnectOptions::default()
        };
        qp.connect(&remote, &o).map_err(e("connect"))?;
        post_recvs(&qp)?;
        None
    };
    let wait = Duration::from_secs(30);
    let send = |k: usize| -> std::result::Result<(), String> {
        mr.write(send_at, &message(k, c.size));
        let wr = SendWr::new(
            1 << 32 | k as u64,
            SendOp::send(),
            sg_list![mr.sge(send_at, c.size as u32)],
        );
        match &ah {
            Some(ah) => qp.post_send_ud(wr, ah, remote.qpn, UD_QKEY),
            None => qp.post_send(wr),
        }
        .map_err(e("post_send"))
    };
    // Completions arrive in any order between the send and receive queues.
    let mut sent = 0;
    let mut received = 0;
    let check = |wc: Completion, sent: &mut usize, received: &mut usize| {
        if wc.status != WcStatus::Success {
            return Err(format!("a completion failed: {wc:?}"));
        }
        if wc.wr_id >> 32 == 1 {
            *sent += 1;
            return Ok(());
        }
        let k = wc.wr_id as usize;
        if k != *received {
            return Err(format!("receive {k} completed where {received} was next"));
        }
        if wc.byte_len as usize != c.size + grh {
            return Err(format!(
                "message {k}: {} bytes, not {}",
                wc.byte_len,
                c.size + grh
            ));
        }
        if c.ud && wc.src_qp != Some(remote.qpn) {
            return Err(format!(
                "message {k}: from QP {:?}, not {:#x}",
                wc.src_qp, remote.qpn
            ));
        }
        // rxe echoes what it received last: as the server, our message k;
        // as the client, its buffer's fill first, then our message k - 1.
        let expect = match (c.rxe, k) {
            (Role::Client, 0) => vec![0x7b; c.size],
            (Role::Client, k) => message(k - 1, c.size),
            (Role::Server, k) => message(k, c.size),
        };
        let mut got = vec![0; c.size];
        mr.read(k * slot + grh, &mut got);
        if got != expect {
            let at = got.iter().zip(&expect).position(|(a, b)| a != b);
            return Err(format!(
                "message {k} differs from what was sent, first at byte {at:?}"
            ));
        }
        if c.ud {
            let mut g = [0u8; GRH];
            mr.read(k * slot, &mut g);
            let src: [u8; 4] = g[GRH - 8..GRH - 4].try_into().unwrap();
            if !c.v6 && IpAddr::from(src) != want_remote {
                return Err(format!(
                    "message {k}: the GRH area names {src:?} as its source"
                ));
            }
        }
        *received += 1;
        Ok(())
    };
    for k in 0..c.iters {
        // As the client, rnic speaks first; as the server, it answers.
        if c.rxe == Role::Server {
            send(k)?;
            while sent < k + 1 || received < k + 1 {
                let wc = cq.wait(wait).map_err(e("waiting for a completion"))?;
                check(wc, &mut sent, &mut received)?;
            }
        } else {
            while received < k + 1 {
                let wc = cq.wait(wait).map_err(e("waiting for a completion"))?;
                check(wc, &mut sent, &mut received)?;
            }
            send(k)?;
            while sent < k + 1 {
                let wc = cq.wait(wait).map_err(e("waiting for a completion"))?;
                check(wc, &mut sent, &mut received)?;
            }
        }
    }
    // Give rxe's side the last ACK's way back before the QP goes.
    std::thread::sleep(Duration::from_millis(200));
    Ok(format!(
        "{} messages of {} B each way on {} GID {gid}, every echo byte for byte",
        c.iters,
        c.size,
        if c.ud { "UD" } else { "RC" }
    ))
}

/// The entry point of a case's process (see the file's comment); does
/// nothing unless started by `rnic_verbs_and_rdma_rxe_pingpong_byte_for_byte`.
#[test]
#[ignore = "started by rnic_verbs_and_rdma_rxe_pingpong_byte_for_byte"]
fn rxe_vm_peer() {
    let (Ok(iface), Ok(name)) = (
        std::env::var("RNIC_RXE_IFACE"),
        std::env::var("RNIC_RXE_CASE"),
    ) else {
        return;
    };
    let c = CASES.iter().find(|c| c.name == name).expect("a known case");
    match peer(&iface, c) {
        Ok(s) => println!("\nrxe-vm-ok: {s}"),
        Err(s) => panic!("{}: {s}", c.name),
    }
}

#[test]
#[ignore = "boots the rdma_rxe VM (about a minute): tools/run-tests runs it"]
fn rnic_verbs_and_rdma_rxe_pingpong_byte_for_byte() {
    let root = repo();
    vm::build();
    let mut s = Setup::new("rxe-rs", false);
    let tap = format!("rxr{}", std::process::id() % 100_000);
    let sysctl = Command::new("ip")
        .args(["netns", "exec", &s.ns, "sysctl", "-qw"])
        .args([
            "net.ipv6.conf.all.disable_ipv6=0",
            "net.ipv6.conf.default.disable_ipv6=0",
            "net.ipv6.conf.all.accept_dad=0",
            "net.ipv6.conf.default.accept_dad=0",
        ])
        .status()
        .unwrap();
    assert!(sysctl.success());
    ip(&["-n", &s.ns, "tuntap", "add", "dev", &tap, "mode", "tap"]);
    ip(&[
        "-n",
        &s.ns,
        "link",
        "set",
        &tap,
        "mtu",
        "9000",
        "addrgenmode",
        "none",
    ]);
    ip(&["-n", &s.ns, "addr", "add", "10.88.0.1/24", "dev", &tap]);
    ip(&[
        "-n",
        &s.ns,
        "addr",
        "add",
        "fe80::1/64",
        "dev",
        &tap,
        "nodad",
    ]);
    ip(&[
        "-n",
        &s.ns,
        "addr",
        "add",
        "fd88::1/64",
        "dev",
        &tap,
        "nodad",
    ]);
    ip(&["-n", &s.ns, "link", "set", &tap, "up"]);

    let cases: String = CASES.iter().map(|c| c.guest_line() + "\n").collect();
    std::fs::write(s.share.join("cases"), cases).unwrap();
    for f in ["pingpongs.sh", "tap-rxe.sh"] {
        std::fs::copy(root.join("interop/guest").join(f), s.share.join(f)).unwrap();
    }
    let pcap = s.share.join("out/tap.pcap");
    s.children.push(vm::capture(&s.ns, &tap, &pcap));
    let vm = Command::new(root.join("interop/rxe-vm/run"))
        .arg(&s.share)
        .arg("pingpongs.sh")
        .env("RXE_VM_NETNS", &s.ns)
        .env("RXE_VM_TAP", &tap)
        .env("RXE_VM_TIMEOUT", "900")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("boot the VM");
    s.children.push(vm);

    let me = std::env::current_exe().unwrap();
    let mut failures = Vec::new();
    for c in &CASES {
        let out = Command::new("ip")
            .args(["netns", "exec", &s.ns, "timeout", "240"])
            .arg(&me)
            .args([
                "--exact",
                "rxe_vm_peer",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("RNIC_RXE_IFACE", &tap)
            .env("RNIC_RXE_CASE", c.name)
            .env("RNIC_RXE_SHARE", &s.share)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let ok = text.lines().find_map(|l| l.strip_prefix("rxe-vm-ok: "));
        match ok {
            Some(l) if out.status.success() => eprintln!("{:<24} rnic: {l}", c.name),
            _ => {
                eprintln!("{:<24} rnic: FAILED\n{text}", c.name);
                failures.push(format!("{}: rnic's side failed", c.name));
            }
        }
    }
    let vm = s.children.pop().unwrap();
    let vm = vm.wait_with_output().unwrap();
    // The capture ends with the VM; tcpdump writes each packet as it goes.
    // Read it once it has stopped growing (bounded).
    vm::settled(&pcap);
    let results = std::fs::read_to_string(s.share.join("out/results")).unwrap_or_default();
    for c in &CASES {
        let rc = results
            .lines()
            .find_map(|l| l.strip_prefix(c.name)?.strip_prefix(' '))
            .unwrap_or("never ran");
        if rc != "0" {
            let log = std::fs::read_to_string(s.share.join(format!("out/{}.txt", c.name)))
                .unwrap_or_default();
            eprintln!("{:<24} rxe: exit {rc}\n{log}", c.name);
            failures.push(format!("{}: rxe's side exited {rc}", c.name));
        }
    }
    if !vm.status.success() {
        let guest = std::fs::read_to_string(s.share.join("out/guest.log")).unwrap_or_default();
        let tail: Vec<_> = guest.lines().rev().take(40).collect();
        eprintln!(
            "the VM exited {:?}: {}\nguest log (last lines, newest first):\n{}",
            vm.status.code(),
            String::from_utf8_lossy(&vm.stderr),
            tail.join("\n")
        );
        failures.push("the guest script failed".into());
    }

    // Every frame either side put on the tap.
    let bytes = std::fs::read(&pcap).expect("the capture");
    let mut frames = 0;
    let mut bad = Vec::new();
    let mut from = std::collections::BTreeMap::<IpAddr, usize>::new();
    let mut opcodes = std::collections::BTreeSet::new();
    for (n, rec) in PcapReader::new(&bytes).expect("a pcap file").enumerate() {
        let Ok(rec) = rec else {
            break; // the last record may be cut short when tcpdump stops
        };
        let link = LinkType::from_pcap(rec.link_type).expect("a known link type");
        match Frame::parse(link, rec.data) {
            Ok(f) => {
                frames += 1;
                *from.entry(f.ip.src_addr()).or_default() += 1;
                let op = f.ib.info().opcode;
                opcodes.insert(op.name().unwrap_or("?"));
                if !f.icrc_ok() {
                    bad.push(format!("frame {}: bad ICRC", n + 1));
                }
            }
            Err(e) if e.is_not_roce() => {}
            Err(e) => bad.push(format!("frame {}: {e}", n + 1)),
        }
    }
    eprintln!("{frames} RoCE v2 frames on the tap, by source {from:?}; opcodes {opcodes:?}");
    assert!(bad.is_empty(), "frames that do not verify: {bad:?}");
    for op in [
        "RC_SEND_FIRST",
        "RC_SEND_MIDDLE",
        "RC_SEND_LAST",
        "RC_SEND_ONLY",
        "RC_ACKNOWLEDGE",
        "RC_RDMA_READ_REQUEST",
        "UD_SEND_ONLY",
    ] {
        assert!(opcodes.contains(op), "no {op} on the wire: {opcodes:?}");
    }
    for a in [HOST4, GUEST4, "fd88::1", GUEST6] {
        let a: IpAddr = a.parse().unwrap();
        assert!(
            from.get(&a).is_some_and(|&n| n > 0),
            "no frame from {a}: {from:?}"
        );
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
