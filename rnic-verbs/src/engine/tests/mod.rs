//! The engine's tests: two NICs on loopback driven through the verbs, and
//! what the engine decided meanwhile, read through the accessors below
//! (whether the engine thread left the socket to pollers, what it held,
//! who took packets in).

use std::io;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::sched;
use super::watch::Watch;
use super::Engine;
use crate::*;

mod driven;
mod held;
mod past_udp;
mod watching;

impl Engine {
    /// Whether packets come in through a receive ring (see `frames`).
    pub fn has_ring(&self) -> bool {
        self.shared.frames.is_some()
    }
    /// Datagrams sent past IP and UDP, ever (see `frames::FrameSender`).
    pub fn frames_sent(&self) -> u64 {
        self.shared.state.lock().frames_sent
    }
    /// Whether the engine thread is asleep away from the socket.
    pub fn is_away(&self) -> bool {
        self.shared.away.load(Ordering::SeqCst)
    }
    /// What the process's exit does for this engine (see
    /// [`super::exit::flush_at_exit`]).
    pub fn flush_as_at_exit(&self) {
        self.shared.flush();
    }
    /// Whether datagrams posts produced wait for a poll.
    pub fn holding(&self) -> bool {
        self.shared.state.lock().hold.holding()
    }
    /// Whether ACKs wait for the program's answer, and whether it has
    /// learned that the program answers.
    pub fn answer(&self) -> (bool, bool) {
        let st = self.shared.state.lock();
        (st.hold.for_answer(), st.hold.expects_answer())
    }
    /// How long ACKs wait for an answer now (ns).
    pub fn answer_wait(&self) -> u64 {
        self.shared.state.lock().hold.answer_wait()
    }
    /// The shortest wait for an answer (ns).
    pub fn set_answer_wait(&self, wait: u64) {
        let mut st = self.shared.state.lock();
        st.hold.set_min_wait(wait);
        self.shared.publish(&st);
    }
    /// Times the engine thread stayed for a request that waited for it.
    pub fn stays(&self) -> u64 {
        self.shared.stays.load(Ordering::Relaxed)
    }
    /// Times the engine thread slept away from the socket.
    pub fn away_sleeps(&self) -> u64 {
        self.shared.away_sleeps.load(Ordering::Relaxed)
    }
    /// Whether the NIC has more to build, whether pollers are about,
    /// when the engine thread away would look next if it looked now (at
    /// the latest at `bound`), and the engine's clock.
    pub fn away_until(&self, bound: u64) -> (bool, bool, u64, u64) {
        let st = self.shared.state.lock();
        let now = st.now().0;
        let about = Watch::pollers_about(now, self.shared.last_active());
        (
            st.nic.more_to_build(),
            about,
            st.away_until(bound, about),
            now,
        )
    }
    /// Steer RC responses to the response socket (`Some(true)`), or not,
    /// whatever the engine thread would choose; `None` leaves it to it.
    pub fn pin_steering(&self, on: Option<bool>) {
        let v = match on {
            None => 0,
            Some(false) => 1,
            Some(true) => 2,
        };
        self.shared.pinned_steering.store(v, Ordering::SeqCst);
        if let Some(on) = on {
            self.shared.steer(on);
        }
    }
    /// Steer RC responses apart while staying (as with
    /// `RNIC_RESPONSE_SOCKET=on`), or not.
    pub fn steer_when_staying(&self, on: bool) {
        self.shared.steer_when_staying.store(on, Ordering::Relaxed);
    }
    /// Whether RC responses are steered to the response socket now.
    pub fn steering(&self) -> bool {
        self.shared.steering.load(Ordering::SeqCst)
    }
    /// Times steering started or stopped, ever.
    pub fn steering_changes(&self) -> u64 {
        self.shared.steering_changes.load(Ordering::Relaxed)
    }
    /// Whether runs of datagrams go out as UDP GSO sends now.
    pub(crate) fn gso(&self) -> bool {
        self.shared.state.lock().gso
    }
    /// Make every socket this NIC sends from send without UDP checksums:
    /// the kernel then refuses GSO sends (EINVAL), as some paths do.
    pub(crate) fn send_without_checksums(&self) {
        let st = self.shared.state.lock();
        for s in std::iter::once(&self.shared.socket).chain(st.send_sockets.values()) {
            crate::udp::set_option(
                s.as_fd(),
                libc::SOL_SOCKET,
                libc::SO_NO_CHECK,
                &1 as &libc::c_int,
            )
            .expect("SO_NO_CHECK");
        }
    }
    /// Send one datagram per message from now on, as where GSO is off.
    pub(crate) fn set_gso(&self, on: bool) {
        self.shared.state.lock().gso = on;
    }
    /// Packets polling threads took in, ever.
    pub fn polled_packets(&self) -> u64 {
        self.shared.polled_packets.load(Ordering::Relaxed)
    }
    /// Packets the engine thread took in, ever.
    pub fn engine_packets(&self) -> u64 {
        self.shared.engine_packets.load(Ordering::Relaxed)
    }
    /// Packets the engine thread took in while lingering on the socket
    /// after its last piece of work, ever.
    pub fn lingered_packets(&self) -> u64 {
        self.shared.lingered_packets.load(Ordering::Relaxed)
    }
    /// Packets the engine thread took in at a look while away from the
    /// socket (they waited up to a time away), ever.
    pub fn looked_packets(&self) -> u64 {
        self.shared.looked_packets.load(Ordering::Relaxed)
    }
    /// The engine thread's thread ID.
    pub fn engine_tid(&self) -> i32 {
        self.shared.tid.load(Ordering::Relaxed) as i32
    }
    /// The cores the engine thread may run on now.
    pub fn engine_cpus(&self) -> rustix::thread::CpuSet {
        let pid = rustix::thread::Pid::from_raw(self.engine_tid()).expect("the engine thread runs");
        rustix::thread::sched_getaffinity(Some(pid)).unwrap()
    }
    /// Let the socket go unwatched this long after the last poll.
    pub fn set_away_max(&self, ns: u64) {
        self.shared.away_max.store(ns, Ordering::Relaxed);
    }
}

/// A device whose recv CQ `a` reports to a channel, connected to `b`.
pub(super) struct Pair {
    pub(super) a: Device,
    pub(super) chan: CompletionChannel,
    pub(super) a_rcq: CompletionQueue,
    pub(super) a_scq: CompletionQueue,
    pub(super) _a_qp: QueuePair,
    pub(super) a_mr: MemoryRegion,
    /// Where b's WRITEs land.
    pub(super) a_target: MemoryRegion,
    pub(super) b_scq: CompletionQueue,
    pub(super) b_qp: QueuePair,
    pub(super) b_mr: MemoryRegion,
    pub(super) a_pd: ProtectionDomain,
    pub(super) b_pd: ProtectionDomain,
}

pub(super) fn pair() -> Pair {
    pair_with(&Config::from_env().unwrap())
}

/// A pair whose NICs take packets in from their UDP sockets, not a
/// receive ring: for what the engine does with a socket alone.
pub(super) fn pair_on_sockets() -> Pair {
    pair_with(&Config {
        ring: false,
        ..Config::from_env().unwrap()
    })
}

fn pair_with(config: &Config) -> Pair {
    let (a, b) = (
        Device::open_loopback_with(config).unwrap(),
        Device::open_loopback_with(config).unwrap(),
    );
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let chan = a.create_comp_channel().unwrap();
    let a_rcq = a.create_cq_with_channel(64, &chan).unwrap();
    let a_scq = a.create_cq(64).unwrap();
    let b_scq = b.create_cq(64).unwrap();
    let a_qp = pa.create_rc_qp(&a_scq, &a_rcq, QpCaps::default()).unwrap();
    let b_qp = pb.create_rc_qp(&b_scq, &b_scq, QpCaps::default()).unwrap();
    let o = ConnectOptions::default();
    a_qp.connect(&b_qp.endpoint(), &o).unwrap();
    b_qp.connect(&a_qp.endpoint(), &o).unwrap();
    Pair {
        a_mr: pa.register(64, Access::LOCAL_WRITE).unwrap(),
        a_target: pa
            .register(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap(),
        b_mr: pb.register(64, Access::LOCAL_WRITE).unwrap(),
        a,
        chan,
        a_rcq,
        a_scq,
        _a_qp: a_qp,
        b_scq,
        b_qp,
        a_pd: pa,
        b_pd: pb,
    }
}

/// A receive (`ids.0`) posted on `to`'s QP over its region's first 64
/// bytes, then a SEND (`ids.1`) of `from`'s region's first 8 into it.
pub(super) fn send_one(
    from: (&QueuePair, &MemoryRegion),
    to: (&QueuePair, &MemoryRegion),
    ids: (u64, u64),
    signaled: bool,
) {
    to.0.post_recv(RecvWr {
        wr_id: ids.0,
        sg_list: sg_list![to.1.sge(0, 64)],
    })
    .unwrap();
    from.0
        .post_send(
            SendWr::new(ids.1, SendOp::send(), sg_list![from.1.sge(0, 8)]).signaled(signaled),
        )
        .unwrap();
}

impl Pair {
    /// A program that only posts: receives posted on a's QP every
    /// 100 us (a full receive queue refuses them: posts all the same),
    /// never a poll, until `stop` (at most 100,000).
    pub(super) fn post_receives_until(&self, stop: &AtomicBool) {
        for i in 0..100_000 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let _ = self._a_qp.post_recv(RecvWr {
                wr_id: 1000 + i,
                sg_list: sg_list![self.a_mr.sge(0, 64)],
            });
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    pub(super) fn post(&self) {
        send_one(
            (&self.b_qp, &self.b_mr),
            (&self._a_qp, &self.a_mr),
            (1, 2),
            true,
        );
    }

    /// One WRITE from b into `a_target`.
    pub(super) fn write(&self) {
        self.b_qp
            .post_send(SendWr::new(
                3,
                SendOp::write(self.a_target.addr(), self.a_target.rkey()),
                sg_list![self.b_mr.sge(0, 8)],
            ))
            .unwrap();
    }

    /// One SEND from a to b, both sides' completions spun for (bounded).
    pub(super) fn send_polled(&self, i: u64) {
        send_one(
            (&self._a_qp, &self.a_mr),
            (&self.b_qp, &self.b_mr),
            (i, i),
            true,
        );
        let c = self.a_scq.spin(Duration::from_secs(10)).unwrap();
        assert_eq!((c.wr_id, c.status), (i, WcStatus::Success));
        let c = self.b_scq.spin(Duration::from_secs(10)).unwrap();
        assert_eq!((c.wr_id, c.status), (i, WcStatus::Success));
    }

    pub(super) fn sent(&self) {
        let c = self.b_scq.wait(Duration::from_secs(10)).unwrap();
        assert_eq!(
            c.status,
            WcStatus::Success,
            "away {}",
            self.a.engine.is_away()
        );
    }

    /// One SEND from b into a receive posted on a, which `take` waits
    /// for: posted from another thread once this one is waiting.
    pub(super) fn send_later(&self, take: impl FnOnce(&CompletionQueue) -> Result<Completion>) {
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                self.post();
                self.sent();
            });
            let c = take(&self.a_rcq).expect("the SEND arrives");
            assert_eq!(c.status, WcStatus::Success);
        });
    }

    /// SENDs from another thread, taken here by polling without a
    /// pause, until a's engine thread leaves the socket to the poller
    /// (bounded).
    pub(super) fn until_away(&self) {
        let stop = AtomicBool::new(false);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        // Completions taken here: the sender keeps fewer than a's
        // receive CQ holds outstanding, even if this thread is held up.
        let taken_here = std::sync::atomic::AtomicU64::new(0);
        let mut taken = 0;
        let posted = std::thread::scope(|s| {
            let sender = s.spawn(|| {
                let mut n = 0;
                while n < 5000 && !stop.load(Ordering::Relaxed) {
                    if n - taken_here.load(Ordering::Relaxed) >= 32 {
                        std::thread::yield_now();
                        continue;
                    }
                    self.post();
                    self.sent();
                    n += 1;
                }
                n
            });
            // Polling on until the last SEND is acknowledged: the
            // engine, once away, leaves its packets to this thread.
            while !sender.is_finished() {
                if let Some(c) = self.a_rcq.try_next() {
                    assert_eq!(c.status, WcStatus::Success);
                    taken += 1;
                    taken_here.store(taken, Ordering::Relaxed);
                }
                if self.a.engine.is_away() {
                    stop.store(true, Ordering::Relaxed);
                }
                assert!(std::time::Instant::now() < deadline, "bounded");
            }
            sender.join().unwrap()
        });
        assert!(
            stop.load(Ordering::Relaxed),
            "the engine thread kept watching a socket a poller served ({posted} SENDs)"
        );
        while taken < posted {
            let c = self.a_rcq.spin(Duration::from_secs(10)).unwrap();
            assert_eq!(c.status, WcStatus::Success);
            taken += 1;
        }
    }
}

// Away, the engine thread comes back to the socket TEST_AWAY after the
// last poll or post: long enough that a test thread held up by a busy
// machine does not let it come back before the packet it sends.
pub(super) const TEST_AWAY: u64 = 50_000_000;

/// A pair whose a's engine thread has left the socket to this thread,
/// coming back TEST_AWAY after the last poll or post.
pub(super) fn pair_away() -> Pair {
    away(pair())
}

/// [`pair_away`] on sockets ([`pair_on_sockets`]).
pub(super) fn pair_away_on_sockets() -> Pair {
    away(pair_on_sockets())
}

fn away(p: Pair) -> Pair {
    p.a.engine.set_away_max(TEST_AWAY);
    p.until_away();
    p
}

/// A WRITE of `len` bytes from a to b (at PMTU 1024, more packets
/// than one pump builds: PUMP_BURSTS bursts of at most 32 requests):
/// a's source and b's target regions, the source filled.
pub(super) fn long_write(p: &Pair, len: usize) -> (SendWr, MemoryRegion, MemoryRegion, Vec<u8>) {
    let src = p.a_pd.register(len, Access::LOCAL_WRITE).unwrap();
    let dst = p
        .b_pd
        .register(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    assert!(src.write(0, &data));
    let wr = SendWr::new(
        7,
        SendOp::write(dst.addr(), dst.rkey()),
        sg_list![src.sge(0, len as u32)],
    );
    (wr, src, dst, data)
}

/// `data` lands in `dst` (bounded: the last packets of a UC WRITE may
/// still be on their way when the sender's completion comes).
pub(super) fn lands(dst: &MemoryRegion, data: &[u8], what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut got = vec![0u8; data.len()];
    while !(dst.read(0, &mut got) && got == data) {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: the WRITE's bytes land"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}
