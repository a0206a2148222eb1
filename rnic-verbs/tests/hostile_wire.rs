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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rnic_core::rng::Rng;
use rnic_core::sim::frame_of;
use rnic_core::Datagram;
use rnic_verbs::*;
use rnic_wire::{aeth, atomic_eth, bth, icrc, reth, IbRepr, Opcode, Psn};

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
    Datagram::new(src, dst, port, buf)
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
/// WRITEs of the legitimate transfer in flight at once.
const DEPTH: usize = 16;

/// A writes all of B's region in chunks and reads it back: the legitimate
/// transfer. Returns how long it took.
fn transfer(a: &End, b: &End, round: u8) -> Duration {
    let start = Instant::now();
    transfer_counted(a, b, round, &AtomicU64::new(0));
    start.elapsed()
}

/// [`transfer`], adding each chunk to `done` as it completes. It keeps
/// [`DEPTH`] WRITEs in flight, as a bandwidth test does: one at a time,
/// the rate it makes is the inverse of a round trip, and an attack that
/// delays each ACK by a queue it made halves it without taking a byte of
/// throughput from the connection.
fn transfer_counted(a: &End, b: &End, round: u8, done: &AtomicU64) {
    let data: Vec<u8> = (0..REGION).map(|i| (i as u8) ^ round).collect();
    assert!(a.mr.write(0, &data));
    let chunks = REGION / CHUNK;
    let (mut posted, mut completed) = (0, 0);
    while completed < chunks {
        while posted < chunks && posted - completed < DEPTH {
            let off = posted * CHUNK;
            let wr = SendWr::new(
                posted as u64,
                SendOp::write(b.mr.addr() + off as u64, b.mr.rkey()),
                vec![a.mr.sge(off, CHUNK as u32)].into(),
            );
            a.qp.post_send(wr).unwrap();
            posted += 1;
        }
        let c = a.cq.wait(Duration::from_secs(20)).unwrap();
        assert_eq!((c.wr_id, c.status), (completed as u64, WcStatus::Success));
        completed += 1;
        done.fetch_add(CHUNK as u64, Ordering::Relaxed);
    }
    let mut got = vec![0u8; REGION];
    assert!(b.mr.read(0, &mut got));
    assert!(got == data, "the legitimate transfer arrived intact");
}

/// The legitimate transfer, round after round (each checked whole), while
/// the attacks run: the bytes it moved in each phase of them, against
/// what it moves alone.
struct Legit {
    done: AtomicU64,
    stop: AtomicBool,
    phases: std::sync::Mutex<Vec<(&'static str, Instant, u64)>>,
}

impl Legit {
    fn new() -> Legit {
        Legit {
            done: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            phases: Default::default(),
        }
    }

    /// Transfer rounds until told to stop; the rounds done.
    fn run(&self, a: &End, b: &End) -> u32 {
        let mut round = 0u32;
        while !self.stop.load(Ordering::Acquire) {
            transfer_counted(a, b, 0x40 | round as u8, &self.done);
            round += 1;
        }
        round
    }

    /// A phase of the attack begins now (the previous one ends).
    fn phase(&self, name: &'static str) {
        let done = self.done.load(Ordering::Relaxed);
        self.phases
            .lock()
            .unwrap()
            .push((name, Instant::now(), done));
    }

    /// Stop after the round in progress; the rate in each phase as a
    /// fraction of `calm` (bytes per second alone), printed. Phases shorter
    /// than 50 ms are taken together with the next: a round's check and
    /// refill (a millisecond or two without a WRITE) would otherwise make
    /// one look stopped.
    fn report(&self, calm: f64) -> Vec<(String, f64)> {
        self.phase("end");
        self.stop.store(true, Ordering::Release);
        let phases = self.phases.lock().unwrap();
        let mut out = Vec::new();
        let mut from = 0;
        for i in 1..phases.len() {
            let ((_, t0, d0), (_, t1, d1)) = (phases[from], phases[i]);
            if t1 - t0 < Duration::from_millis(50) && i + 1 < phases.len() {
                continue;
            }
            let name = phases[from..i]
                .iter()
                .map(|p| p.0)
                .collect::<Vec<_>>()
                .join(" + ");
            let rate = (d1 - d0) as f64 / (t1 - t0).as_secs_f64();
            println!(
                "legitimate transfer during {name} ({:?}): {:.1} MB/s, {:.2}x of alone",
                t1 - t0,
                rate / 1e6,
                rate / calm
            );
            out.push((name, rate / calm));
            from = i;
        }
        out
    }
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
    let wr = SendWr::new(
        1,
        SendOp::write(b.mr.addr(), b.mr.rkey()),
        vec![a.mr.sge(0, 64)].into(),
    );
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

/// `forge`, with the packet changed by `patch` before its ICRC is made.
fn forge_patched(
    src: IpAddr,
    dst: IpAddr,
    ib: &IbRepr,
    payload: &[u8],
    patch: impl FnOnce(&mut Vec<u8>),
) -> Datagram {
    let mut d = forge(src, dst, ib, payload);
    patch(&mut d.payload);
    let n = d.payload.len();
    let crc = icrc::for_udp(src, dst, d.src_port, &d.payload[..n - 4]).unwrap();
    d.payload[n - 4..].copy_from_slice(&crc.to_le_bytes());
    d
}

fn atomic(op: Opcode, qpn: u32, psn: Psn, va: u64, rkey: u32) -> IbRepr {
    let mut ib = IbRepr::new(bth::Repr::new(op, qpn, psn));
    ib.atomic_eth = Some(atomic_eth::Repr {
        va,
        r_key: rkey,
        swap_or_add_data: 1,
        compare_data: 0,
    });
    ib.bth.ack_req = true;
    ib
}

fn read_request(qpn: u32, psn: Psn, va: u64, rkey: u32, len: u32) -> IbRepr {
    let mut ib = IbRepr::new(bth::Repr::new(Opcode::RC_RDMA_READ_REQUEST, qpn, psn));
    ib.reth = Some(reth::Repr {
        va,
        r_key: rkey,
        dma_length: len,
    });
    ib.bth.ack_req = true;
    ib
}

/// This process's resident memory.
fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Wait (at most 5 s) until `f` of `dev`'s counters reaches `want`.
fn counter_reaches(dev: &Device, f: fn(&rnic_core::Counters) -> u64, want: u64) -> u64 {
    let t = Instant::now();
    loop {
        let v = f(&dev.counters().unwrap());
        if v >= want || t.elapsed() > Duration::from_secs(5) {
            return v;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn an_on_path_attacker_gets_the_iba_nak_class_by_class() {
    // The attacker knows a connection (its QPN, the PSN it expects, the
    // peer's address): what RoCE cannot hide from someone on the path. A
    // request it forges is then the peer's, and the victim QP must answer
    // it as the IBTA says, write nothing, and go to the error state where
    // the IBTA says so; the NIC's other connection, a legitimate 1 MiB
    // transfer from the same peer address, goes on untouched.
    if !in_own_netns("an_on_path_attacker_gets_the_iba_nak_class_by_class") {
        return;
    }
    let spoofer = Spoofer::new().expect("a packet socket");
    let (a, b) = (end(QpType::Rc, REGION), end(QpType::Rc, REGION));
    connect(&a, &b);
    // Its rate alone: bytes per second over 16 rounds (about a tenth of
    // a second; four, at 30 ms, varied by a quarter from run to run).
    let calm = {
        let t: Duration = (1..=16).map(|r| transfer(&a, &b, r)).sum();
        (16 * REGION) as f64 / t.as_secs_f64()
    };
    const LEN: usize = 65536;
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let w = b.pd.register(LEN, all | Access::REMOTE_ATOMIC).unwrap();
    let ro = b.pd.register(LEN, Access::REMOTE_READ).unwrap();
    let other_pd = b.dev.alloc_pd().unwrap();
    let other = other_pd.register(LEN, all | Access::REMOTE_ATOMIC).unwrap();
    let big = b.pd.register(64 << 20, Access::REMOTE_READ).unwrap();
    for (r, fill) in [(&w, 0x11u8), (&ro, 0x22), (&other, 0x33)] {
        assert!(r.write(0, &vec![fill; LEN]));
    }
    let (src, dst) = (a.dev.addr(), b.dev.addr());
    let vcq = (a.dev.create_cq(64).unwrap(), b.dev.create_cq(64).unwrap());
    // A fresh connection between the same two addresses for each attack:
    // the victim at B, its peer (never sending) at A.
    let victim = || {
        let p =
            a.pd.create_rc_qp(&vcq.0, &vcq.0, QpCaps::default())
                .unwrap();
        let v =
            b.pd.create_rc_qp(&vcq.1, &vcq.1, QpCaps::default())
                .unwrap();
        connect_qps(&p, &v);
        let psn = Psn::new(p.endpoint().psn);
        (p, v, psn)
    };
    type Nak = fn(&rnic_core::Counters) -> u64;
    let access: Nak = |c| c.nak_remote_access_sent;
    let invalid: Nak = |c| c.nak_invalid_request_sent;
    let w_end = w.addr() + LEN as u64;
    let mtu_plus = vec![0xEE; 2048];
    #[allow(clippy::type_complexity)]
    let attacks: Vec<(&str, Nak, Box<dyn Fn(u32, Psn) -> Datagram>)> = vec![
        (
            "a WRITE whose VA + length wraps around 2^64",
            access,
            Box::new(|q, p| {
                let ib = write_only(
                    Opcode::RC_RDMA_WRITE_ONLY,
                    q,
                    p,
                    u64::MAX - 15,
                    w.rkey(),
                    64,
                );
                forge(src, dst, &ib, &[0xEE; 64])
            }),
        ),
        (
            "a WRITE one byte past the region's end",
            access,
            Box::new(|q, p| {
                let ib = write_only(Opcode::RC_RDMA_WRITE_ONLY, q, p, w_end - 63, w.rkey(), 64);
                forge(src, dst, &ib, &[0xEE; 64])
            }),
        ),
        (
            "a WRITE to a read-only region",
            access,
            Box::new(|q, p| {
                let ib = write_only(Opcode::RC_RDMA_WRITE_ONLY, q, p, ro.addr(), ro.rkey(), 64);
                forge(src, dst, &ib, &[0xEE; 64])
            }),
        ),
        (
            "a WRITE with another protection domain's R_Key",
            access,
            Box::new(|q, p| {
                let ib = write_only(
                    Opcode::RC_RDMA_WRITE_ONLY,
                    q,
                    p,
                    other.addr(),
                    other.rkey(),
                    64,
                );
                forge(src, dst, &ib, &[0xEE; 64])
            }),
        ),
        (
            "a fetch-and-add at a misaligned address",
            invalid,
            Box::new(|q, p| {
                let ib = atomic(Opcode::RC_FETCH_ADD, q, p, w.addr() + 4, w.rkey());
                forge(src, dst, &ib, &[])
            }),
        ),
        (
            "a compare-and-swap on a read-only region",
            access,
            Box::new(|q, p| {
                let ib = atomic(Opcode::RC_COMPARE_SWAP, q, p, ro.addr(), ro.rkey());
                forge(src, dst, &ib, &[])
            }),
        ),
        (
            "a WRITE whose payload is longer than the path MTU",
            invalid,
            Box::new(|q, p| {
                let ib = write_only(Opcode::RC_RDMA_WRITE_ONLY, q, p, w.addr(), w.rkey(), 2048);
                forge(src, dst, &ib, &mtu_plus)
            }),
        ),
        (
            "a WRITE whose pad count eats into its payload",
            invalid,
            Box::new(|q, p| {
                let ib = write_only(Opcode::RC_RDMA_WRITE_ONLY, q, p, w.addr(), w.rkey(), 64);
                forge_patched(src, dst, &ib, &[0xEE; 64], |b| b[1] |= 0x30)
            }),
        ),
        (
            "a READ past the region's end",
            access,
            Box::new(|q, p| {
                forge(
                    src,
                    dst,
                    &read_request(q, p, w.addr(), w.rkey(), LEN as u32 + 1),
                    &[],
                )
            }),
        ),
        (
            "a READ of more than 2 GiB",
            invalid,
            Box::new(|q, p| {
                forge(
                    src,
                    dst,
                    &read_request(q, p, w.addr(), w.rkey(), (1 << 31) + 1),
                    &[],
                )
            }),
        ),
    ];

    let before_a = a.dev.counters().unwrap();
    let legit = Legit::new();
    let rounds = std::thread::scope(|s| {
        // However the attacks end, the legitimate transfer stops with them.
        struct Stop<'a>(&'a Legit);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.stop.store(true, Ordering::Release);
            }
        }
        let _stop = Stop(&legit);
        let runner = s.spawn(|| legit.run(&a, &b));
        legit.phase("forged requests, class by class");
        for (what, nak, packet) in &attacks {
            let (_p, v, psn) = victim();
            let was = nak(&b.dev.counters().unwrap());
            spoofer.send(&packet(v.qpn(), psn));
            let now = counter_reaches(&b.dev, *nak, was + 1);
            assert_eq!(now, was + 1, "{what}: one NAK of its kind");
            let state = v.query().unwrap().qp_state;
            assert_eq!(state, QpState::Err, "{what}: the victim QP is in error");
        }
        // Stale packets for a QP destroyed and made again: nothing there.
        legit.phase("stale packets for a destroyed QP");
        let (p, v, psn) = victim();
        let old = v.qpn();
        drop(v);
        let (_p2, v2, _) = victim();
        assert_ne!(v2.qpn(), old, "a QP number is not given out again at once");
        let was = b.dev.counters().unwrap().unknown_qp;
        for k in 0..100 {
            let ib = write_only(
                Opcode::RC_RDMA_WRITE_ONLY,
                old,
                psn.add(k),
                w.addr(),
                w.rkey(),
                64,
            );
            spoofer.send(&forge(src, dst, &ib, &[0xEE; 64]));
        }
        let now = counter_reaches(&b.dev, |c| c.unknown_qp, was + 100);
        assert!(now >= was + 100, "stale packets counted as for no QP");
        drop(p);
        // Ghost ACKs and READ responses for PSNs the legitimate requester
        // never sent (half the PSN space ahead of it).
        legit.phase("ghost ACKs and READ responses");
        let ahead = Psn::new(a.qp.endpoint().psn).add(1 << 22);
        let was = a.dev.counters().unwrap().ghost_or_duplicate_response;
        for k in 0..200 {
            let mut ack = IbRepr::new(bth::Repr::new(
                Opcode::RC_ACKNOWLEDGE,
                a.qp.qpn(),
                ahead.add(k),
            ));
            ack.aeth = Some(aeth::Repr {
                syndrome: aeth::Syndrome::ACK_NO_CREDITS,
                msn: k,
            });
            spoofer.send(&forge(dst, src, &ack, &[]));
            let mut resp = IbRepr::new(bth::Repr::new(
                Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                a.qp.qpn(),
                ahead.add(k),
            ));
            resp.aeth = ack.aeth;
            resp.payload_len = 64;
            spoofer.send(&forge(dst, src, &resp, &[0xEE; 64]));
        }
        let now = counter_reaches(&a.dev, |c| c.ghost_or_duplicate_response, was + 400);
        assert!(
            now >= was + 400,
            "ghost responses counted: {} of 400",
            now - was
        );
        // A READ of a whole 64 MiB region: answered as it is sent, never
        // queued whole (the peer at A drops the responses it never asked for).
        let (_p, v, psn) = victim();
        legit.phase("a 64 MiB READ's responses");
        let rss0 = rss();
        let sent0 = b.dev.counters().unwrap().sent_pkts;
        let ib = read_request(v.qpn(), psn, big.addr(), big.rkey(), 64 << 20);
        spoofer.send(&forge(src, dst, &ib, &[]));
        let packets = (64u64 << 20) / 1024;
        let t = Instant::now();
        while b.dev.counters().unwrap().sent_pkts < sent0 + packets
            && t.elapsed() < Duration::from_secs(60)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let grew = rss().saturating_sub(rss0);
        println!(
            "a 64 MiB READ answered: resident memory grew {} KiB",
            grew >> 10
        );
        assert!(grew < 16 << 20, "a 64 MiB READ grew memory by {grew} bytes");
        // A flood to QPs that do not exist: memory stays flat.
        legit.phase("a flood to QPs that do not exist");
        let rss0 = rss();
        let mut rng = Rng::new(3);
        for k in 0..50_000u32 {
            if k % 16 == 0 {
                std::thread::sleep(Duration::from_micros(100));
            }
            let q = (rng.next_u64() as u32) & 0xFF_FFFF;
            let ib = write_only(Opcode::RC_RDMA_WRITE_ONLY, q, Psn::new(k), 0, 0, 8);
            spoofer.send(&forge(src, dst, &ib, &[1; 8]));
        }
        let grew = rss().saturating_sub(rss0);
        println!(
            "50,000 packets to QPs that do not exist: resident memory grew {} KiB",
            grew >> 10
        );
        assert!(grew < 4 << 20, "a flood grew memory by {grew} bytes");
        let ratios = legit.report(calm);
        (runner.join().unwrap(), ratios)
    });
    // Not one byte of any region changed; the legitimate connection lives.
    for (r, fill, name) in [
        (&w, 0x11u8, "W"),
        (&ro, 0x22, "RO"),
        (&other, 0x33, "OTHER"),
    ] {
        let mut got = vec![0u8; LEN];
        assert!(r.read(0, &mut got));
        assert!(got.iter().all(|&x| x == fill), "region {name} changed");
    }
    let after_a = a.dev.counters().unwrap();
    assert_eq!(after_a.retry_exceeded_err, before_a.retry_exceeded_err);
    transfer(&a, &b, 3);
    let (rounds, ratios) = rounds;
    let worst = ratios.iter().map(|r| r.1).fold(f64::INFINITY, f64::min);
    println!(
        "legitimate transfer: {rounds} rounds of 1 MiB beside the attacks, all intact; slowest phase at {worst:.2}x of its rate alone"
    );
}

fn connect_qps(p: &QueuePair, v: &QueuePair) {
    let o = ConnectOptions::default();
    p.connect(&v.endpoint(), &o).unwrap();
    v.connect(&p.endpoint(), &o).unwrap();
}
