//! The engine thread's scheduling: its priority, and the core it runs on.
//!
//! # Priority
//!
//! The engine thread sleeps until a packet arrives, then runs for a few
//! microseconds. When the cores are busy (two programs spinning on their
//! completion queues or on a buffer's last byte, as perftest's latency
//! tests do), a woken thread of the normal class can wait for the running
//! one's time slice to end, up to the scheduler tick (4 ms at HZ=250): one
//! WRITE round trip then costs milliseconds. A real NIC, or rdma_rxe in the
//! kernel's softirq, is never queued behind a program; so where the process
//! may (root, CAP_SYS_NICE or an RLIMIT_RTPRIO above 0), the engine thread
//! runs in SCHED_FIFO at the lowest real-time priority, 1.
//!
//! What that costs: a thread that only wakes for work and never spins,
//! so it takes a core only while packets come in; the kernel keeps 5% of
//! each core for other threads even then (`sched_rt_runtime_us`).
//! `RNIC_ENGINE_PRIORITY=normal` keeps the engine in the normal class. A
//! real-time thread that spins would starve the program on its core, so
//! the engine leaves real time while it lingers (below).
//!
//! # Core
//!
//! A real-time engine thread runs where its program's thread ran last, as
//! long as that thread polls or posts (Receive Flow Steering does the same
//! for the kernel's packet processing: on the core of the thread that
//! consumes the packets). Why: two ping-pong programs spinning on two cores
//! (perftest's latency tests) each have an engine thread, woken by every
//! packet. Where the scheduler puts it on its own program's core, it
//! preempts a program that only waits; put crosswise, each engine thread
//! preempts the *other* program, the one about to answer, and every ACK
//! delays the answer: ib_write_lat over the drop-in took two thirds longer
//! crosswise than with each engine on its program's core, and left to the
//! scheduler a run landed in either (the figures are in
//! `docs/performance.md`).
//!
//! - The engine thread moves at most once per [`FOLLOW_EVERY`]: a program
//!   whose threads post from several cores costs it a move a few times a
//!   second, not one per post.
//! - When no thread has polled or posted for [`FOLLOW_RELEASE`], it may run
//!   on any core the process may again: a program asleep on a completion
//!   channel or on TCP (perftest's bandwidth servers) leaves the engine to
//!   the scheduler's choice, as without this.
//! - In the normal class the engine thread is never pinned: there it could
//!   wait for its program's time slice to end, and the scheduler's choice
//!   of an idle core is worth more.
//!
//! # Lingering
//!
//! Asleep, the engine thread is woken by the kernel when a datagram
//! arrives, which on this virtual machine takes ten microseconds and more
//! (an idle core must wake first): a READ or atomic responder whose program
//! never polls (the server of perftest's ib_read_lat and ib_atomic_lat)
//! answers each request that much later, and a READ round trip was twice a
//! WRITE ping-pong's. So where requests have been coming shortly after the
//! engine ran out of work ([`Linger`]), it keeps looking at the socket for
//! up to [`LINGER_WINDOW`](crate::config::LINGER_WINDOW) before it
//! sleeps, as NAPI busy polling does. It lingers only while no thread of
//! its program polls or posts (pollers take the packets in then), and in
//! the normal class, yielding its core at every look: a thread of the
//! normal class spinning beside it keeps its core. `RNIC_BUSY_POLL_US` sets
//! the window (0: never linger).

use rustix::thread::CpuSet;

use crate::config::Priority;

/// Apply `p` to the calling thread; whether it now runs in real time.
pub(crate) fn apply(p: Priority) -> bool {
    p == Priority::Realtime && set_realtime(true)
}

/// When the engine thread lingers: it scores the idle spells that a
/// datagram ended (from running out of work to the next datagram). A spell
/// within the window counts up, as does one asleep within twice the window
/// (asleep, the spell includes the wake-up, which alone can outlast the
/// window); a linger that ends with no datagram halves the score.
/// It lingers from [`Linger::ON`] up: two short spells in a row start it,
/// one empty linger does not stop a stream that lingered often, two do.
#[derive(Debug, Default)]
pub(crate) struct Linger {
    score: u8,
    /// The spell now: since when the engine has had nothing to do (ns).
    idle_from: Option<u64>,
    /// It slept in this spell.
    slept: bool,
    /// This spell is judged already (a linger ran out in it).
    judged: bool,
    /// It lingers now.
    lingering: bool,
}

/// What the engine does, idle (see [`Linger::idle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Idle {
    /// Look at the socket again (`started`: first look of this linger).
    Linger { started: bool },
    /// Sleep (`stopped`: it lingered until now).
    Sleep { stopped: bool },
}

impl Linger {
    /// The score from which the engine lingers.
    pub const ON: u8 = 2;
    /// The highest score.
    const MOST: u8 = 4;

    /// Datagrams came in at `now`: the spell, if any, ends; whether they
    /// found the engine lingering.
    pub fn datagrams(&mut self, now: u64, window: u64) -> bool {
        if let Some(from) = self.idle_from.take() {
            if !std::mem::take(&mut self.judged) {
                let gap = now.saturating_sub(from);
                let short = if self.slept { 2 * window } else { window };
                if gap <= short {
                    self.score = (self.score + 1).min(Self::MOST);
                } else {
                    self.score /= 2;
                }
            }
        }
        self.slept = false;
        self.lingering
    }

    /// Nothing to do at `now`: linger or sleep. A thread of the program
    /// polled or posted last at `last_active`: while threads poll or post
    /// (they may take packets in), it never lingers.
    pub fn idle(&mut self, now: u64, window: u64, last_active: Option<u64>) -> Idle {
        let may = !super::watch::Watch::pollers_about(now, last_active);
        let from = *self.idle_from.get_or_insert(now);
        let within = now.saturating_sub(from) < window;
        if may && within && !self.judged && self.score >= Self::ON {
            let started = !std::mem::replace(&mut self.lingering, true);
            return Idle::Linger { started };
        }
        if self.lingering && !within && !self.judged {
            // Ran out with no datagram.
            self.judged = true;
            self.score /= 2;
        }
        Idle::Sleep {
            stopped: self.stop(),
        }
    }

    /// It sleeps now (idle, or away from the socket); whether it was
    /// lingering until now.
    pub fn stop(&mut self) -> bool {
        self.slept |= self.idle_from.is_some();
        std::mem::take(&mut self.lingering)
    }

    /// Whether it lingers now.
    #[cfg(test)]
    fn lingering(&self) -> bool {
        self.lingering
    }
}

/// Move the calling thread into SCHED_FIFO at priority 1 (`on`), or back
/// into the normal class; whether it worked (refused without the
/// privilege, changing nothing).
pub(crate) fn set_realtime(on: bool) -> bool {
    let (policy, priority) = if on {
        (libc::SCHED_FIFO, 1)
    } else {
        (libc::SCHED_OTHER, 0)
    };
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: sched_setscheduler on the calling thread (pid 0) reads a
    // valid sched_param.
    unsafe { libc::sched_setscheduler(0, policy, &param) == 0 }
}

/// The shortest time between two moves of the engine thread (ns).
pub const FOLLOW_EVERY: u64 = 10_000_000;
/// How long after the last poll or post the engine thread stays on the
/// program's core (ns).
pub const FOLLOW_RELEASE: u64 = 100_000_000;
/// A thread that polled or posted this recently is running (ns).
const FOLLOW_ACTIVE: u64 = super::watch::POLLER_ACTIVE;

/// The core the calling thread runs on (glibc reads it from the thread's
/// restartable-sequence area: no system call).
pub(crate) fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu takes no arguments; -1 on failure.
    usize::try_from(unsafe { libc::sched_getcpu() }).ok()
}

/// The set of core `c` alone.
pub(crate) fn one_core(c: usize) -> CpuSet {
    let mut one = CpuSet::new();
    one.set(c);
    one
}

/// Whether thread `tid` runs in the real-time class.
#[cfg(test)]
pub(crate) fn is_realtime(tid: i32) -> bool {
    // SAFETY: reads a thread's policy; -1 if there is no such thread.
    unsafe { libc::sched_getscheduler(tid) == libc::SCHED_FIFO }
}

/// A move of the engine thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Move {
    /// Onto this core alone.
    To(usize),
    /// Back to every core it was allowed at its start.
    Free,
}

/// Where the engine thread runs, from when and where its program's threads
/// last polled or posted (times in ns on the engine's clock).
#[derive(Debug)]
pub(crate) struct Follow {
    /// The cores the engine thread may run on (the process's own mask).
    allowed: CpuSet,
    /// The core it is pinned to, if any.
    pinned: Option<usize>,
    /// When it last moved.
    moved_at: Option<u64>,
}

impl Follow {
    pub fn new(allowed: CpuSet) -> Follow {
        Follow {
            allowed,
            pinned: None,
            moved_at: None,
        }
    }

    /// What to do now: a thread last polled or posted at `last_active`, on
    /// core `cpu`.
    pub fn decide(
        &mut self,
        now: u64,
        last_active: Option<u64>,
        cpu: Option<usize>,
    ) -> Option<Move> {
        if self
            .moved_at
            .is_some_and(|t| now.saturating_sub(t) < FOLLOW_EVERY)
        {
            return None;
        }
        let idle = last_active.map_or(u64::MAX, |t| now.saturating_sub(t));
        let m = match cpu {
            Some(c) if idle < FOLLOW_ACTIVE && self.allowed.is_set(c) && self.pinned != Some(c) => {
                self.pinned = Some(c);
                Move::To(c)
            }
            _ if idle >= FOLLOW_RELEASE && self.pinned.is_some() => {
                self.pinned = None;
                Move::Free
            }
            _ => return None,
        };
        self.moved_at = Some(now);
        Some(m)
    }

    /// Make the move on the calling thread (the engine thread).
    pub fn apply(&self, m: Move) {
        let set = match m {
            Move::To(c) => one_core(c),
            Move::Free => self.allowed,
        };
        if let Err(e) = rustix::thread::sched_setaffinity(None, &set) {
            tracing::debug!(?m, error = %e, "the engine thread could not move");
        } else {
            tracing::trace!(?m, "the engine thread moved");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_cores() -> CpuSet {
        let mut s = CpuSet::new();
        s.set(0);
        s.set(1);
        s
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn the_engine_follows_a_running_thread_and_is_freed_when_it_stops() {
        let mut f = Follow::new(two_cores());
        // Nobody ran yet: nothing to follow.
        assert_eq!(f.decide(1000 * MS, None, None), None);
        assert_eq!(f.decide(1000 * MS, None, Some(1)), None);
        // A thread polled on core 1 just now.
        assert_eq!(
            f.decide(1000 * MS, Some(1000 * MS), Some(1)),
            Some(Move::To(1))
        );
        // Still there: no move.
        assert_eq!(f.decide(1020 * MS, Some(1020 * MS), Some(1)), None);
        // It polls on core 0 now, but the last move was too recent.
        assert_eq!(f.decide(1005 * MS, Some(1005 * MS), Some(0)), None);
        assert_eq!(
            f.decide(1030 * MS, Some(1030 * MS), Some(0)),
            Some(Move::To(0))
        );
        // A core the process may not use is not followed.
        assert_eq!(f.decide(1050 * MS, Some(1050 * MS), Some(5)), None);
        // A thread that stopped a while ago is not followed ...
        assert_eq!(f.decide(1060 * MS, Some(1050 * MS), Some(1)), None);
        // ... and after FOLLOW_RELEASE the engine is free again, once.
        let later = 1050 * MS + FOLLOW_RELEASE;
        assert_eq!(f.decide(later - 1, Some(1050 * MS), Some(1)), None);
        assert_eq!(f.decide(later, Some(1050 * MS), Some(1)), Some(Move::Free));
        assert_eq!(f.decide(later + 20 * MS, Some(1050 * MS), Some(1)), None);
    }

    /// Normal changes nothing; real time is taken where permitted and
    /// refused, changing nothing, where not.
    #[test]
    fn normal_leaves_the_thread_alone() {
        std::thread::spawn(|| {
            assert!(!apply(Priority::Normal));
            // SAFETY: reads the calling thread's policy.
            assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_OTHER);
            let rt = apply(Priority::Realtime);
            // SAFETY: as above.
            let policy = unsafe { libc::sched_getscheduler(0) };
            assert_eq!(rt, policy == libc::SCHED_FIFO);
        })
        .join()
        .unwrap();
    }

    /// A responder's spells, in microseconds: the engine sleeps through
    /// the first (2 short ones start lingering), lingers while datagrams
    /// come within the window, survives one that does not, and stops
    /// after two; a poller about, or a window of 0, stops it too.
    #[test]
    fn lingering_starts_after_short_spells_and_stops_after_empty_lingers() {
        const W: u64 = crate::config::LINGER_WINDOW;
        let us = |t: u64| t * 1000;
        let mut l = Linger::default();
        // Spell at 0, asleep, datagram at 90 us: short, as asleep.
        assert_eq!(l.idle(0, W, None), Idle::Sleep { stopped: false });
        l.stop();
        assert!(!l.datagrams(us(90), W));
        assert_eq!(l.idle(us(100), W, None), Idle::Sleep { stopped: false });
        l.stop();
        // A datagram 101 us later: too late even asleep; score 0.
        l.datagrams(us(201), W);
        for t in [300, 400] {
            assert_eq!(l.idle(us(t), W, None), Idle::Sleep { stopped: false });
            l.stop();
            l.datagrams(us(t + 30), W);
        }
        // Two short spells: it lingers at the next.
        assert_eq!(l.idle(us(500), W, None), Idle::Linger { started: true });
        assert_eq!(l.idle(us(530), W, None), Idle::Linger { started: false });
        assert!(l.datagrams(us(540), W), "found lingering");
        // Awake, a spell must be within the window itself.
        assert_eq!(l.idle(us(560), W, None), Idle::Linger { started: false });
        assert!(l.datagrams(us(609), W));
        assert_eq!(l.idle(us(650), W, None), Idle::Linger { started: false });
        assert_eq!(l.idle(us(699), W, None), Idle::Linger { started: false });
        // Ran out at 700 (score 4 to 2): asleep, the datagram at 750 is
        // not judged again.
        assert_eq!(l.idle(us(700), W, None), Idle::Sleep { stopped: true });
        l.stop();
        assert!(!l.datagrams(us(750), W));
        assert_eq!(l.idle(us(800), W, None), Idle::Linger { started: true });
        assert_eq!(l.idle(us(850), W, None), Idle::Sleep { stopped: true });
        l.stop();
        l.datagrams(us(900), W);
        // Score 1: two empty lingers stopped it.
        assert_eq!(l.idle(us(1000), W, None), Idle::Sleep { stopped: false });
        // A poller about, or a window of 0: never.
        let mut l = Linger::default();
        for t in 0..4 {
            l.idle(us(100 * t), W, None);
            assert_eq!(l.datagrams(us(100 * t + 10), W), t >= 2);
        }
        // A thread polled or posted just now: the linger stops.
        assert_eq!(
            l.idle(us(500), W, Some(us(499))),
            Idle::Sleep { stopped: true }
        );
        l.datagrams(us(510), W);
        assert_eq!(l.idle(us(600), 0, None), Idle::Sleep { stopped: false });
        assert!(!l.lingering());
    }

    /// The engine thread leaves real time to linger and comes back, where
    /// the process may run in real time at all.
    #[test]
    fn the_engine_thread_can_leave_real_time_and_come_back() {
        std::thread::spawn(|| {
            if !apply(Priority::Realtime) {
                return;
            }
            assert!(set_realtime(false));
            // SAFETY: reads the calling thread's policy.
            assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_OTHER);
            assert!(set_realtime(true));
            // SAFETY: as above.
            assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_FIFO);
        })
        .join()
        .unwrap();
    }
}
