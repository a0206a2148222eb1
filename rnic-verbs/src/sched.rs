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
//! `RNIC_ENGINE_PRIORITY=normal` keeps the engine in the normal class, and
//! polling the engine (`RNIC_BUSY_POLL_US`) is refused in real time, where
//! it would starve the program.
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
//! delays the answer. Measured on two cores, ib_write_lat over the drop-in,
//! 64 B: half a round trip of 30 to 33 us with each engine on its program's
//! core, 53 to 56 us crosswise; left to the scheduler, a run landed in
//! either, and the same held for `rnic perf --lat`.
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

use rustix::thread::CpuSet;

use crate::Error;

/// What the engine thread asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Priority {
    /// SCHED_FIFO 1 if permitted, else normal.
    Realtime,
    /// The normal class, as the process's other threads.
    Normal,
}

impl Priority {
    /// `RNIC_ENGINE_PRIORITY` (`realtime`, the default, or `normal`).
    pub fn from_env() -> Result<Priority, Error> {
        Priority::parse(std::env::var("RNIC_ENGINE_PRIORITY").ok().as_deref())
    }

    /// The variable's value, if set.
    fn parse(value: Option<&str>) -> Result<Priority, Error> {
        match value {
            None | Some("realtime" | "") => Ok(Priority::Realtime),
            Some("normal") => Ok(Priority::Normal),
            Some(v) => Err(Error::BadEnv {
                var: "RNIC_ENGINE_PRIORITY".into(),
                value: v.into(),
                expected: "realtime or normal",
            }),
        }
    }
}

/// Apply `p` to the calling thread; whether it now runs in real time.
pub(crate) fn apply(p: Priority) -> bool {
    if p == Priority::Normal {
        return false;
    }
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler on the calling thread (pid 0) reads a
    // valid sched_param; refused without the privilege, changing nothing.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) == 0 }
}

/// The shortest time between two moves of the engine thread (ns).
pub const FOLLOW_EVERY: u64 = 10_000_000;
/// How long after the last poll or post the engine thread stays on the
/// program's core (ns).
pub const FOLLOW_RELEASE: u64 = 100_000_000;
/// A thread that polled or posted this recently is running (ns).
const FOLLOW_ACTIVE: u64 = crate::watch::POLLER_ACTIVE;

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

    #[test]
    fn the_variable_is_parsed_and_a_bad_value_named() {
        assert_eq!(Priority::parse(None).unwrap(), Priority::Realtime);
        assert_eq!(Priority::parse(Some("")).unwrap(), Priority::Realtime);
        assert_eq!(
            Priority::parse(Some("realtime")).unwrap(),
            Priority::Realtime
        );
        assert_eq!(Priority::parse(Some("normal")).unwrap(), Priority::Normal);
        let e = Priority::parse(Some("fast")).unwrap_err().to_string();
        assert_eq!(
            e,
            "RNIC_ENGINE_PRIORITY=\"fast\": expected realtime or normal"
        );
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
}
