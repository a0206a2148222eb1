//! What a process's exit sends: the ACKs and datagrams its engines hold,
//! and the closing of the connections its CM holds.

use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use super::shared::Shared;

/// The engines this process started (with its process ID then), for
/// [`flush_at_exit`].
static LIVE: Mutex<Vec<(u32, Weak<Shared>)>> = Mutex::new(Vec::new());

/// How long [`flush_at_exit`] waits for a lock another thread holds.
const EXIT_WAIT: Duration = Duration::from_millis(100);

/// Count `sh` among this process's engines, and have the process send what
/// they hold when it exits.
#[allow(unsafe_code)]
pub(super) fn register(sh: &Arc<Shared>) {
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    let mut live = LIVE.lock();
    live.retain(|(_, w)| w.strong_count() > 0);
    live.push((std::process::id(), Arc::downgrade(sh)));
    drop(live);
    AT_EXIT.call_once(|| {
        extern "C" fn at_exit() {
            flush_at_exit();
        }
        // SAFETY: `at_exit` is a plain function that neither unwinds (a
        // panic in it aborts) nor calls `exit`.
        if unsafe { libc::atexit(at_exit) } != 0 {
            tracing::warn!("atexit refused: ACKs held at exit will not be sent");
        }
    });
}

/// At exit (`exit(3)`, or `main` returning): send what every engine of
/// this process holds, ACKs held for the program's answer above all.
///
/// A hardware NIC acknowledges what it took in whatever its program does
/// next; rnic holds the ACK of a request for the program's answer (see
/// [`super::hold::Hold::hold_for_answer`]), and a program that takes the last
/// request of a ping-pong in and exits without destroying its QP (as many
/// do: the kernel cleans up after them) would leave it unacknowledged: the
/// peer retransmits to a NIC that is gone and fails the request with
/// `IBV_WC_RETRY_EXC_ERR`. The engine threads are still running here, but
/// their next look may come after the process is gone. An engine of the
/// parent process (a forked child's copy) is left alone: its ACKs are the
/// parent's to send.
pub(super) fn flush_at_exit() {
    let pid = std::process::id();
    let Some(live) = LIVE.try_lock_for(EXIT_WAIT) else {
        return;
    };
    let engines: Vec<Arc<Shared>> = live
        .iter()
        .filter(|(p, _)| *p == pid)
        .filter_map(|(_, w)| w.upgrade())
        .collect();
    drop(live);
    for sh in &engines {
        sh.flush();
    }
    close_connections(&engines);
}

/// How long a process's exit waits for the DREPs of its DREQs.
const DREP_WAIT: Duration = Duration::from_secs(1);
/// How often it sends an unanswered DREQ again meanwhile.
const DREQ_AGAIN: Duration = Duration::from_millis(200);

/// At exit: close every connection the process's programs left up, as the
/// kernel's CM does when a process closes rdma_cm (a DREQ for each; see
/// [`rnic_core::cm::CmAgent::destroy`]), and give the DREQs a moment to be
/// answered. The kernel's CM outlives the process and rnic's does not: a
/// DREQ lost as the process ends (a program that disconnects and exits at
/// once, as rping does) would leave the peer's program waiting for ever
/// for a disconnection. So the exit waits up to [`DREP_WAIT`], sending the
/// DREQs again every [`DREQ_AGAIN`] (a DREQ twice is answered twice, and
/// harmless); it does not wait at all when every DREQ was answered, or
/// none was sent.
fn close_connections(engines: &[Arc<Shared>]) {
    let start = std::time::Instant::now();
    let mut again = false;
    let mut last = start;
    loop {
        let mut waiting = 0;
        for sh in engines {
            waiting += sh.close_connections(again);
        }
        if waiting == 0 || start.elapsed() >= DREP_WAIT {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
        again = last.elapsed() >= DREQ_AGAIN;
        if again {
            last = std::time::Instant::now();
        }
    }
}

impl Shared {
    /// Destroy every connection of the NIC's CM (and with `again`, send
    /// the unanswered DREQs again): how many DREQs wait for an answer.
    fn close_connections(&self, again: bool) -> usize {
        let Some(mut st) = self.state.try_lock_for(EXIT_WAIT) else {
            return 0;
        };
        let now = st.now();
        let waiting = st.nic.cm_closing(now, again);
        st.pump(&self.socket);
        self.publish(&st);
        waiting
    }

    /// Send what is held now: ACKs held for an answer, datagrams posts
    /// left for the next poll (see [`flush_at_exit`]).
    pub(super) fn flush(&self) {
        if let Some(mut st) = self.state.try_lock_for(EXIT_WAIT) {
            st.pump(&self.socket);
            self.publish(&st);
        }
    }
}
