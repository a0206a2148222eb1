//! A thread asleep on a completion channel drives the engine itself.
//!
//! A program that waits in `ibv_get_cq_event` sleeps until its next
//! completion. Were it to sleep on the channel's descriptor alone, every
//! completion would cost two wake-ups in a row: the kernel wakes the engine
//! thread for the datagram, and the engine thread wakes the program through
//! the descriptor. On a virtual machine a wake-up of an idle core takes ten
//! microseconds and more, and a blocking TCP receive pays one: an event-
//! driven ping-pong took twice TCP's round trip.
//!
//! So the waiting thread sleeps on the NIC's socket as well as on the
//! channel, and when a datagram wakes it, takes it in itself, as a polling
//! thread does (`Engine::progress`): one wake-up, the one TCP pays. The
//! engine thread counts it as a thread that polls (see `watch`): it leaves
//! the socket to it, and keeps the timers. Arming a queue whose channel is
//! waited on so does not bring the engine thread back to the socket (see
//! [`crate::channel`]).
//!
//! The wait is ppoll(2), which a signal always ends; the thread lets
//! signals in, and ends its wait for them, the way `read(2)` would have
//! (see [`crate::signals`]).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use super::thread::take_in_side;
use super::Engine;
use crate::signals::Blocked;

/// How a driven wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woken {
    /// `ready` said so.
    Ready,
    /// A signal came whose handler would have ended `read(2)` with EINTR.
    Interrupted,
    /// The deadline passed.
    TimedOut,
}

impl Engine {
    /// Sleep until `ready` says so (or `deadline` passes), taking in what
    /// arrives on this thread; `bell` is readable when another thread (the
    /// engine's) made `ready` true.
    pub(crate) fn drive(
        &self,
        bell: BorrowedFd<'_>,
        deadline: Option<Instant>,
        busy_poll: &BusyPoll,
        ready: &mut dyn FnMut() -> bool,
    ) -> io::Result<Woken> {
        let sh = &*self.shared;
        let started = Instant::now();
        let window = Duration::from_nanos(sh.busy_poll_window);
        // Whether it spun before its first sleep, and slept.
        let (mut spun, mut slept) = (false, false);
        // Signals are let in only while it sleeps (see `signals`).
        let mut blocked = Blocked::all()?;
        sh.drivers.fetch_add(1, Ordering::SeqCst);
        let _leaving = Leaving(self);
        // Whether to look at the side inlets: at first, then only when the
        // sleep said one of them is readable (a look is a system call).
        let mut aside = true;
        loop {
            self.progress();
            if std::mem::take(&mut aside) {
                take_in_side(sh);
            }
            if ready() {
                busy_poll.ended(started.elapsed(), window, slept);
                return Ok(Woken::Ready);
            }
            if !std::mem::replace(&mut spun, true)
                && !window.is_zero()
                && busy_poll.may()
                && self.spin(window, ready)
            {
                busy_poll.ended(started.elapsed(), window, false);
                return Ok(Woken::Ready);
            }
            // A signal that came meanwhile: let in (its handler runs now,
            // on this thread), and judged.
            if blocked.pending_any() {
                if blocked.let_in()? {
                    return Ok(Woken::Interrupted);
                }
                blocked = Blocked::all()?;
                continue;
            }
            let timeout = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(Woken::TimedOut);
                    }
                    Some(left)
                }
                None => None,
            };
            // Requests and, steered apart or not, responses: what the
            // engine thread would watch for this program; and what only
            // the engine thread takes in otherwise, which it does not
            // watch while a thread drives it.
            let responses = sh
                .responses_rx()
                .filter(|_| sh.steering.load(Ordering::Relaxed));
            let side_from = 2 + usize::from(responses.is_some());
            let watched = std::iter::once(bell)
                .chain(std::iter::once(sh.rx().fd()))
                .chain(responses.into_iter().chain(sh.side_rx()).map(|r| r.fd()));
            let mut fds = [libc::pollfd {
                fd: -1,
                events: 0,
                revents: 0,
            }; 5];
            let mut n = 0;
            for (slot, fd) in fds.iter_mut().zip(watched) {
                slot.fd = fd.as_raw_fd();
                slot.events = libc::POLLIN;
                n += 1;
            }
            slept = true;
            if blocked.sleep(&mut fds[..n], timeout)? {
                return Ok(Woken::Interrupted);
            }
            aside = fds[side_from.min(n)..n]
                .iter()
                .any(|f| f.revents & libc::POLLIN != 0);
        }
    }
}

impl Engine {
    /// Take in what arrives, on this thread, until `ready` or for `window`
    /// (yielding the core at each look: a thread that shares it keeps it);
    /// whether `ready`.
    fn spin(&self, window: Duration, ready: &mut dyn FnMut() -> bool) -> bool {
        let from = Instant::now();
        while from.elapsed() < window {
            std::thread::yield_now();
            self.progress();
            if ready() {
                return true;
            }
        }
        false
    }
}

/// Whether a wait spins before it sleeps: the waits of a ping-pong end
/// within a round trip, and spinning through one costs no more CPU per
/// message than a wake-up (as NAPI busy polling under a blocking
/// receive). It scores the waits that ended, as the engine thread's
/// lingering does (`sched::Linger`): one that ended within the window,
/// or within twice the window with a sleep (the wake-up alone can outlast
/// the window), counts up; one that spun through the window and slept on
/// halves the score, so two in a row stop a program whose answers come
/// later than the window (a server with think time, a request now and
/// then) from spinning.
#[derive(Debug, Default)]
pub(crate) struct BusyPoll {
    score: AtomicU8,
}

impl BusyPoll {
    /// The score from which a wait spins.
    const ON: u8 = 2;
    /// The highest score.
    const MOST: u8 = 4;

    fn may(&self) -> bool {
        self.score.load(Ordering::Relaxed) >= Self::ON
    }

    /// A wait ended after `took`, having `slept` (after spinning, or not).
    fn ended(&self, took: Duration, window: Duration, slept: bool) {
        let short = if slept { 2 * window } else { window };
        let s = self.score.load(Ordering::Relaxed);
        let next = if took <= short {
            (s + 1).min(Self::MOST)
        } else {
            s / 2
        };
        self.score.store(next, Ordering::Relaxed);
    }
}

/// The driving thread leaves: the engine thread looks after the socket
/// again once no thread polls (see `watch`).
///
/// What its last batch left for the next poll (the ACK of the SEND it
/// waited for, say) leaves now: a thread that polls comes back for it
/// within microseconds, one that waited may not come back for a long
/// time, and the engine thread, away while threads are about, sends it
/// only when it next looks. ACKs held for the program's answer keep
/// waiting for it (see `hold`), and so does what is left to build
/// beyond a pump.
struct Leaving<'a>(&'a Engine);

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        let sh = &*self.0.shared;
        let now = sh.active();
        {
            let mut st = sh.state.lock();
            if st.hold.due().is_some_and(|t| t.0 <= now) || st.nic.more_to_build() {
                st.pump(&sh.socket);
                let next = st.timer_deadline();
                sh.publish(&st);
                drop(st);
                sh.wake_for(next);
            }
        }
        sh.drivers.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_micros(50);
    const US: fn(u64) -> Duration = Duration::from_micros;

    /// Two short waits start the spinning; a wait that spun through the
    /// window and slept long halves the score, so one such wait does not
    /// stop a ping-pong that spun often, and two do. A wait that ended
    /// within twice the window with a sleep counts as short.
    #[test]
    fn waits_spin_after_short_ones_and_stop_after_long_ones() {
        let b = BusyPoll::default();
        assert!(!b.may(), "a new channel's waits sleep at once");
        b.ended(US(80), W, true);
        assert!(!b.may());
        b.ended(US(30), W, false);
        assert!(b.may(), "two short waits");
        b.ended(US(90), W, false);
        assert!(
            !b.may(),
            "spun 50 us, and no answer until 90: too long without a sleep"
        );
        for _ in 0..4 {
            b.ended(US(10), W, false);
        }
        b.ended(US(5000), W, true);
        assert!(b.may(), "one long wait after many short ones");
        b.ended(US(5000), W, true);
        assert!(!b.may(), "two");
    }
}
