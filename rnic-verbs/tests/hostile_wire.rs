//! A malicious peer on the real transport: an attacker on this host injects
//! RoCE v2 packets with a correct ICRC, its source spoofed to be the
//! legitimate peer's address (a packet socket on `lo` writes the IP header
//! as given), while a legitimate transfer runs. What it sends must be
//! dropped and counted, change no byte of memory, and leave the transfer
//! intact.
//!
//! Each test runs itself again in a network namespace it makes (and
//! removes), whose `lo` takes injected packets from and to 127/8
//! (`route_localnet`, `accept_local`; the host's settings stay as they
//! are). Needs root, as the frame transport does; without it the tests say
//! they were skipped, and fail if `RNIC_REQUIRE_TOOLS` is set.

use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use rnic_core::rng::Rng;
use rnic_core::sim::{frame_of, Datagram};
use rnic_verbs::*;
use rnic_wire::{bth, icrc, reth, IbRepr, Opcode, Psn};

/// Run `test` (this binary's test of that name) in a network namespace of
/// its own; true in that child, where the test's body runs. In the parent,
/// false once the child has passed.
fn in_own_netns(test: &str) -> bool {
    if std::env::var_os("RNIC_HOSTILE_CHILD").is_some() {
        return true;
    }
    let ns = format!("rnic-hostile-{}-{test}", std::process::id());
    let ip = |args: &[&str]| {
        std::process::Command::new("ip")
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    };
    if !ip(&["netns", "add", &ns]) {
        eprintln!("SKIPPED: cannot make a network namespace (not root?)");
        assert!(
            std::env::var_os("RNIC_REQUIRE_TOOLS").is_none(),
            "root is required"
        );
        return false;
    }
    struct Gone<'a>(&'a str);
    impl Drop for Gone<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", self.0])
                .status();
        }
    }
    let _gone = Gone(&ns);
    assert!(ip(&["-n", &ns, "link", "set", "lo", "up"]));
    let sysctl = [
        "net.ipv4.conf.lo.route_localnet=1",
        "net.ipv4.conf.all.route_localnet=1",
        "net.ipv4.conf.lo.accept_local=1",
        "net.ipv4.conf.all.accept_local=1",
    ];
    let mut args = vec!["netns", "exec", &ns, "sysctl", "-qw"];
    args.extend(sysctl);
    assert!(ip(&args), "sysctl in the namespace");
    let me = std::env::current_exe().unwrap();
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(me)
        .args(["--exact", test, "--nocapture"])
        .env("RNIC_HOSTILE_CHILD", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    false
}

/// Raw IPv4 packets onto the loopback interface, headers as written.
struct Spoofer {
    fd: OwnedFd,
    lo: i32,
}

impl Spoofer {
    fn new() -> Option<Spoofer> {
        // SAFETY: plain socket(2); owned below.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_DGRAM,
                i32::from((libc::ETH_P_IP as u16).to_be()),
            )
        };
        if raw < 0 {
            return None;
        }
        // SAFETY: a new descriptor, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: a NUL-terminated name.
        let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) } as i32;
        (lo > 0).then_some(Spoofer { fd, lo })
    }

    /// Send `d` as an IPv4 packet (its ICRC as the UDP convention has it:
    /// IPv4 ID 0, as rnic's own senders make it).
    fn send(&self, d: &Datagram) {
        let frame = frame_of(d);
        let ip = &frame[14..];
        // SAFETY: sockaddr_ll is plain data; all zeroes is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_IP as u16).to_be();
        sll.sll_ifindex = self.lo;
        sll.sll_halen = 6;
        // SAFETY: sends `ip` to a valid sockaddr_ll of the right size.
        let _ = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                ip.as_ptr().cast(),
                ip.len(),
                0,
                (&sll as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
    }
}

/// A datagram from `src` to `dst` carrying `ib` and `payload`, its ICRC right.
fn forge(src: IpAddr, dst: IpAddr, ib: &IbRepr, payload: &[u8]) -> Datagram {
    let mut buf = vec![0u8; ib.buffer_len()];
    ib.emit(&mut buf, payload).unwrap();
    let n = buf.len();
    let port = 0xC123;
    let crc = icrc::for_udp(src, dst, port, &buf[..n - 4]).unwrap();
    buf[n - 4..].copy_from_slice(&crc.to_le_bytes());
    Datagram {
        src,
        dst,
        src_port: port,
        payload: buf,
    }
}

fn write_only(op: Opcode, qpn: u32, psn: Psn, va: u64, rkey: u32, len: usize) -> IbRepr {
    let mut ib = IbRepr::new(bth::Repr::new(op, qpn, psn));
    ib.reth = Some(reth::Repr {
        va,
        r_key: rkey,
        dma_length: len as u32,
    });
    ib.bth.ack_req = true;
    ib.payload_len = len;
    ib
}

struct End {
    dev: Device,
    pd: ProtectionDomain,
    mr: MemoryRegion,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn end(qp_type: QpType, len: usize) -> End {
    let dev = Device::open_loopback().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let mr = pd
        .register(
            len,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let cq = dev.create_cq(1024).unwrap();
    let qp = pd
        .create_qp(qp_type, &cq, &cq, QpCaps::default(), None)
        .unwrap();
    End {
        dev,
        pd,
        mr,
        cq,
        qp,
    }
}

fn connect(a: &End, b: &End) {
    let o = ConnectOptions::default();
    a.qp.connect(&b.qp.endpoint(), &o).unwrap();
    b.qp.connect(&a.qp.endpoint(), &o).unwrap();
}

const REGION: usize = 1 << 20;
const CHUNK: usize = 4096;

/// A writes all of B's region in chunks and reads it back: the legitimate
/// transfer. Returns how long it took.
fn transfer(a: &End, b: &End, round: u8) -> Duration {
    let start = Instant::now();
    let data: Vec<u8> = (0..REGION).map(|i| (i as u8) ^ round).collect();
    assert!(a.mr.write(0, &data));
    for (k, off) in (0..REGION).step_by(CHUNK).enumerate() {
        let wr = SendWr {
            wr_id: k as u64,
            op: SendOp::Write {
                remote_addr: b.mr.addr() + off as u64,
                rkey: b.mr.rkey(),
                imm: None,
            },
            sg_list: vec![a.mr.sge(off, CHUNK as u32)].into(),
            signaled: true,
            solicited: false,
            fence: false,
            inline: None,
        };
        a.qp.post_send(wr).unwrap();
        let c = a.cq.wait(Duration::from_secs(20)).unwrap();
        assert_eq!((c.wr_id, c.status), (k as u64, WcStatus::Success));
    }
    let mut got = vec![0u8; REGION];
    assert!(b.mr.read(0, &mut got));
    assert!(got == data, "the legitimate transfer arrived intact");
    start.elapsed()
}

#[test]
fn spoofed_packets_are_dropped_counted_and_harmless() {
    if !in_own_netns("spoofed_packets_are_dropped_counted_and_harmless") {
        return;
    }
    let spoofer = Spoofer::new().expect("a packet socket");
    let (a, b) = (end(QpType::Rc, REGION), end(QpType::Rc, REGION));
    // A second region at B that the attacker aims at: nobody writes it.
    let victim =
        b.pd.register(
            65536,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    assert!(victim.write(0, &[0x5A; 65536]));
    connect(&a, &b);
    let calm = transfer(&a, &b, 1);
    let before = b.dev.counters().unwrap();

    let (src, dst) = (a.dev.addr(), b.dev.addr());
    let qpn = b.qp.qpn();
    let rq_psn = Psn::new(a.qp.endpoint().psn);
    let attack = std::thread::scope(|s| {
        let attacker = s.spawn(|| {
            let mut rng = Rng::new(7);
            let mut sent = [0u64; 4];
            for k in 0..5_000 {
                // (Paced: a full receive buffer would drop some uncounted.)
                if k % 16 == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
                // 1. Floods to QPs that do not exist (one in 2^24 is B's).
                let q = (rng.next_u64() as u32) & 0xFF_FFFF;
                if q != qpn {
                    let ib = write_only(Opcode::RC_RDMA_WRITE_ONLY, q, Psn::new(0), 0, 0, 8);
                    spoofer.send(&forge(src, dst, &ib, &[1; 8]));
                    sent[0] += 1;
                }
                // 2. B's QP, a PSN in the half of the space behind it (the
                // attacker cannot know where the window is; the test keeps
                // clear of it so that one lucky packet does not end the run)
                // and a guessed R_Key into the victim region.
                let behind = rq_psn.sub(1 + (rng.below(1 << 22) as u32) + (1 << 21));
                let ib = write_only(
                    Opcode::RC_RDMA_WRITE_ONLY,
                    qpn,
                    behind,
                    victim.addr(),
                    rng.next_u64() as u32,
                    64,
                );
                spoofer.send(&forge(src, dst, &ib, &[0xEE; 64]));
                sent[1] += 1;
                // 3. A wrong ICRC.
                let mut d = forge(src, dst, &ib, &[0xEE; 64]);
                let n = d.payload.len();
                d.payload[n - 1] ^= 0xFF;
                spoofer.send(&d);
                sent[2] += 1;
                // 4. Truncated: a BTH and half a RETH.
                let mut t = forge(src, dst, &ib, &[0xEE; 64]);
                t.payload.truncate(18);
                spoofer.send(&t);
                sent[3] += 1;
            }
            sent
        });
        let t = transfer(&a, &b, 2);
        (attacker.join().unwrap(), t)
    });
    let (sent, attacked) = attack;
    // Give the last injected packets time to be taken in.
    std::thread::sleep(Duration::from_millis(200));
    let after = b.dev.counters().unwrap();
    let grew = |f: fn(&rnic_core::Counters) -> u64| f(&after) - f(&before);
    assert!(grew(|c| c.unknown_qp) >= sent[0], "floods counted");
    assert!(
        grew(|c| c.duplicate_request) >= sent[1],
        "stale PSNs counted"
    );
    assert!(grew(|c| c.icrc_errors) >= sent[2], "bad ICRCs counted");
    assert!(
        grew(|c| c.malformed) >= sent[3],
        "truncated packets counted"
    );
    // Not one byte of the victim region changed, and B's QP lives on.
    let mut v = vec![0u8; 65536];
    assert!(victim.read(0, &mut v));
    assert!(
        v.iter().all(|&x| x == 0x5A),
        "the victim region is unchanged"
    );
    transfer(&a, &b, 3);
    println!(
        "legitimate 1 MiB transfer: {calm:?} alone, {attacked:?} under {} spoofed packets",
        sent.iter().sum::<u64>()
    );
    assert!(b.cq.poll().is_empty(), "nothing completed at B");
}

#[test]
fn guessed_rkeys_open_nothing() {
    // UC drops a WRITE whose R_Key is wrong and carries on (an RC QP would
    // go to the error state, as the IBTA requires), so a UC QP lets an
    // attacker who knows the connection make guess after guess.
    if !in_own_netns("guessed_rkeys_open_nothing") {
        return;
    }
    let spoofer = Spoofer::new().expect("a packet socket");
    let (a, b) = (end(QpType::Uc, 65536), end(QpType::Uc, 65536));
    assert!(b.mr.write(0, &[0x5A; 65536]));
    connect(&a, &b);
    let before = b.dev.counters().unwrap();
    let (src, dst) = (a.dev.addr(), b.dev.addr());
    let (qpn, mut psn) = (b.qp.qpn(), Psn::new(a.qp.endpoint().psn));
    let mut rng = Rng::new(11);
    const TRIES: u64 = 100_000;
    for k in 0..TRIES {
        if k % 64 == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
        let rkey = rng.next_u64() as u32;
        let ib = write_only(Opcode::UC_RDMA_WRITE_ONLY, qpn, psn, b.mr.addr(), rkey, 64);
        spoofer.send(&forge(src, dst, &ib, &[0xEE; 64]));
        psn = psn.next();
    }
    std::thread::sleep(Duration::from_millis(300));
    let after = b.dev.counters().unwrap();
    let mut got = vec![0u8; 65536];
    assert!(b.mr.read(0, &mut got));
    assert!(
        got.iter().all(|&x| x == 0x5A),
        "a guessed R_Key opened memory"
    );
    // Every guess reached the key check and was refused.
    let refused = after.uc_dropped - before.uc_dropped;
    assert_eq!(refused, TRIES, "every guess refused");
    // The connection still works.
    assert!(a.mr.write(0, &[7; 64]));
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Write {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
            imm: None,
        },
        sg_list: vec![a.mr.sge(0, 64)].into(),
        signaled: true,
        solicited: false,
        fence: false,
        inline: None,
    };
    // The attacker moved B's expected PSN; UC takes a new message anywhere.
    a.qp.post_send(wr).unwrap();
    assert_eq!(
        a.cq.wait(Duration::from_secs(5)).unwrap().status,
        WcStatus::Success
    );
    std::thread::sleep(Duration::from_millis(100));
    assert!(b.mr.read(0, &mut got));
    assert_eq!(&got[..64], &[7; 64]);
}
