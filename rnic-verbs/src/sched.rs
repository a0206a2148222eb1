//! The engine thread's scheduling priority.
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

#[cfg(test)]
mod tests {
    use super::*;

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
