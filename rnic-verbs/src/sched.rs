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
        match std::env::var("RNIC_ENGINE_PRIORITY") {
            Err(_) => Ok(Priority::Realtime),
            Ok(v) => match v.as_str() {
                "realtime" | "" => Ok(Priority::Realtime),
                "normal" => Ok(Priority::Normal),
                _ => Err(Error::BadEnv {
                    var: "RNIC_ENGINE_PRIORITY".into(),
                    value: v,
                    expected: "realtime or normal",
                }),
            },
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
