//! The engine thread: it watches the socket (or leaves it to the program's
//! polling threads, see [`super::watch`]), takes in what arrives, runs the
//! timers, lingers where that pays (see [`super::sched`]) and otherwise
//! sleeps in poll(2) until a datagram, a wake-up or the next deadline.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use super::receive::{Received, Rx};
use super::sched::Idle;
use super::shared::Shared;
use super::watch::Watch;

/// The engine thread's loop, until the engine stops; `realtime` if it runs
/// in real time, lingering on the socket up to `window` (ns; see
/// [`super::sched::Linger`]).
pub(super) fn run(sh: &Shared, realtime: bool, window: u64) {
    // Lingering on the socket after the last piece of work (see
    // `sched::Linger`).
    let mut linger = super::sched::Linger::default();
    let mut watch = Watch::default();
    let mut polled = 0;
    // Whether the last look left the socket to pollers (for the log).
    let mut left = false;
    // In real time, the engine thread runs on its program's core.
    let mut follow = if realtime {
        rustix::thread::sched_getaffinity(None)
            .ok()
            .map(super::sched::Follow::new)
    } else {
        None
    };
    while !sh.stop.load(Ordering::Acquire) {
        let now = sh.clock();
        if let Some(f) = follow.as_mut() {
            if let Some(m) = f.decide(now, sh.last_active(), sh.active_cpu()) {
                f.apply(m);
            }
        }
        let p = sh.polled_packets.load(Ordering::Relaxed);
        let pollers_took = p - polled;
        watch.pollers_took(pollers_took);
        polled = p;
        if sh.sleeper.swap(false, Ordering::SeqCst) {
            watch.sleeper(now);
        }
        let away_for = watch.away_for(now, sh.away_max.load(Ordering::Relaxed));
        let away = watch.away(now, sh.last_active(), away_for);
        if away != std::mem::replace(&mut left, away) {
            if away {
                tracing::debug!("polling threads take the packets in: the engine thread leaves the socket to them");
            } else {
                tracing::debug!("the engine thread watches the socket again");
            }
        }
        if away {
            // Pollers take everything in: one socket is one system call.
            // What was steered to the other before is taken in here, now
            // and each time the engine thread comes back (a packet the
            // kernel was steering as the program changed stays at most
            // the time away).
            sh.steer(sh.pinned(false));
            // What waited on the socket through the time away, the pollers
            // did not take in: a program that posts and polls, but polls
            // only now and then or only finds completions waiting, takes
            // nothing in. Taken in at each look while they are about, so
            // nothing waits longer than a time away however seldom they
            // take packets in (looked at without the lock: a ping-pong's
            // poller has usually taken everything). The engine thread
            // stays away, unless the pollers took nothing since the last
            // look and requests no completion shows waited (a program
            // that posts but does not poll, see `Watch::looked`).
            if Watch::pollers_about(sh.clock(), sh.last_active()) && readable(sh.rx().fd()) {
                let got = take_in_away(sh, sh.rx(), true);
                if got.packets > 0 {
                    sh.looked_packets
                        .fetch_add(got.packets as u64, Ordering::Relaxed);
                    let now = sh.clock();
                    watch.engine_took(got.packets, now, sh.last_active());
                    if watch.looked(now, got.unpolled, pollers_took) {
                        stayed(sh, got.unpolled);
                    }
                    continue;
                }
            }
            if sh
                .responses_rx()
                .is_some_and(|r| take_in_away(sh, r, false).packets > 0)
            {
                continue;
            }
            // What the pollers never take in: the CM messages another NIC
            // hands on, the packets that come through `lo` (woken for
            // them, see `leave_to_pollers`).
            if take_in_side(sh) {
                continue;
            }
            if linger.stop() {
                linger_class(realtime, false);
            }
            leave_to_pollers(sh, &mut watch, away_for);
            continue;
        }
        // Staying for a program that spins on memory while threads poll:
        // they take the RC responses in, and the engine thread watches for
        // requests only (see `shared`).
        let leave_responses = sh.responses.is_some()
            && sh.steer_when_staying.load(Ordering::Relaxed)
            && watch.staying(now)
            && Watch::pollers_about(now, sh.last_active())
            && !watch.sleeper_about(now);
        let leave_responses = sh.pinned(leave_responses);
        sh.steer(leave_responses);
        // Receive everything waiting, a batch per system call, each batch
        // handled under the lock.
        let (mut received, mut unpolled) = (0, 0);
        let responses = sh.responses_rx().filter(|_| !leave_responses);
        for rx in std::iter::once(sh.rx())
            .chain(responses)
            .chain(sh.side_rx())
        {
            loop {
                // Handed on fairly: a thread waiting to post or poll gets
                // the lock before the next batch of a flood.
                let mut st = sh.state.lock();
                let active = Watch::pollers_about(sh.clock(), sh.last_active());
                let got = sh.receive(&mut st, rx, false, active, crate::udp::BATCH);
                sh.publish(&st);
                parking_lot::MutexGuard::unlock_fair(st);
                received += got.packets;
                unpolled += got.unpolled;
                if got.packets < crate::udp::BATCH {
                    break;
                }
            }
        }
        sh.engine_packets
            .fetch_add(received as u64, Ordering::Relaxed);
        let now = sh.clock();
        if received > 0 && linger.datagrams(now, window) {
            sh.lingered_packets
                .fetch_add(received as u64, Ordering::Relaxed);
        }
        watch.engine_took(received, now, sh.last_active());
        if watch.back(now, unpolled) {
            stayed(sh, unpolled);
        }
        let mut busy = received > 0;
        let timeout = {
            let mut st = sh.state.lock();
            busy |= st.run_due_timers(&sh.socket);
            let deadline = sh.publish(&st);
            if busy {
                parking_lot::MutexGuard::unlock_fair(st);
                continue;
            }
            // Idle: linger where it pays and no thread polls or posts (in
            // the normal class, yielding the core at each look), then
            // sleep until a datagram, a wake-up, or the next deadline.
            match linger.idle(sh.clock(), window, sh.last_active()) {
                Idle::Linger { started } => {
                    drop(st);
                    if started {
                        linger_class(realtime, true);
                    }
                    std::thread::yield_now();
                    continue;
                }
                Idle::Sleep { stopped } => {
                    if stopped {
                        linger_class(realtime, false);
                    }
                }
            }
            let now = st.now();
            // While threads poll, look at what they took at least every
            // AWAY_MAX: packets they take need not wake this thread.
            let longest = if Watch::pollers_about(now.0, sh.last_active()) {
                super::watch::AWAY_MAX
            } else {
                100_000_000
            };
            let mut until = deadline.map_or(now.0 + longest, |d| d.0.min(now.0 + longest));
            if leave_responses {
                // Responses are left to pollers until AWAY_MAX after the
                // last poll or post, as when away.
                let last = sh.last_active().unwrap_or(now.0);
                until = until.min(last.saturating_add(sh.away_max.load(Ordering::Relaxed)));
            }
            // Published under the lock: a verb that sets an earlier timer
            // after this sees it and wakes us.
            sh.sleeping_until.store(until, Ordering::SeqCst);
            Duration::from_nanos(until.saturating_sub(now.0))
        };
        watch.sleeping(false, now);
        // A thread about to sleep on a completion checks `responses_left`
        // after saying so; we check what it said after setting it: one of
        // the two sees the other (as with `away`).
        sh.responses_left.store(leave_responses, Ordering::SeqCst);
        let responses = match sh.responses_rx() {
            Some(r) if !leave_responses || sh.sleeper.load(Ordering::SeqCst) => Some(r),
            _ => None,
        };
        let watched = std::iter::once(sh.rx())
            .chain(responses)
            .chain(sh.side_rx());
        sleep_watching(sh, watched, timeout);
        sh.responses_left.store(false, Ordering::SeqCst);
    }
}

/// A real-time engine thread lingers in the normal class, where spinning
/// starves no one, and sleeps in real time, where a datagram's wake-up
/// preempts a busy program (see `sched`): the class for `lingering`.
fn linger_class(realtime: bool, lingering: bool) {
    if realtime {
        super::sched::set_realtime(!lingering);
    }
}

/// Sleep without the socket while threads poll (they take the packets), at
/// most `away_for` past the last poll, and until the next timer.
///
/// While they poll, this thread wakes every `away_for` (see
/// [`Watch::away_for`]) only to see that they still do. It takes the state
/// lock only if a deadline is due
/// (`Shared::deadline`, published by whoever changed the state last): on
/// the core the program spins on, a real-time thread that takes the lock
/// preempts the poller holding it, spins, sleeps on it, and is woken again
/// when the poller lets go. (A timer it might miss so is one that a
/// thread armed without publishing; `wake_for` covers the race between
/// publishing and this read.)
fn leave_to_pollers(sh: &Shared, watch: &mut Watch, away_for: u64) {
    let now = sh.clock();
    let last = sh.last_active().unwrap_or(now);
    let bound = last.saturating_add(away_for);
    // Set before the deadline is read: a thread that publishes an earlier
    // one after the read sees this and wakes us (`Shared::wake_for`).
    sh.sleeping_until.store(bound, Ordering::SeqCst);
    let due = sh.deadline.load(Ordering::SeqCst);
    let timeout = if due > now {
        let until = due.min(bound);
        sh.sleeping_until.store(until, Ordering::SeqCst);
        Duration::from_nanos(until.saturating_sub(now))
    } else {
        let mut st = sh.state.lock();
        st.run_due_timers(&sh.socket);
        sh.publish(&st);
        let now = st.now().0;
        let until = st.away_until(bound, Watch::pollers_about(now, sh.last_active()));
        sh.sleeping_until.store(until, Ordering::SeqCst);
        Duration::from_nanos(until.saturating_sub(now))
    };
    // A thread about to sleep checks `away` after saying so; we check what
    // it said after setting `away`: one of the two sees the other.
    sh.away.store(true, Ordering::SeqCst);
    if !sh.sleeper.load(Ordering::SeqCst) {
        watch.sleeping(true, now);
        sh.away_sleeps.fetch_add(1, Ordering::Relaxed);
        // Woken too for what only this thread takes in (taken in at the
        // next look).
        sleep_watching(sh, sh.side_rx(), timeout);
    }
    sh.away.store(false, Ordering::SeqCst);
    sh.sleeping_until.store(u64::MAX, Ordering::SeqCst);
}

/// Away from the socket, one batch from `rx` under the lock (handed on
/// fairly), `program_active` as [`EngineState::receive_at_most`](super::state::EngineState::receive_at_most) takes it.
fn take_in_away(sh: &Shared, rx: Rx<'_>, program_active: bool) -> Received {
    let mut st = sh.state.lock();
    let got = sh.receive(&mut st, rx, false, program_active, crate::udp::BATCH);
    sh.publish(&st);
    parking_lot::MutexGuard::unlock_fair(st);
    sh.engine_packets
        .fetch_add(got.packets as u64, Ordering::Relaxed);
    got
}

/// Take in what waits where only the engine thread looks (see
/// [`Shared::side_rx`]), or a thread that drives it from a wait (see
/// `drive`); whether anything did.
pub(super) fn take_in_side(sh: &Shared) -> bool {
    let mut took = false;
    for rx in sh.side_rx() {
        if readable(rx.fd()) {
            took |= take_in_away(sh, rx, false).packets > 0;
        }
    }
    took
}

/// `requests` that no completion shows waited for the engine thread: it
/// watches the socket again (`Watch::back` said so).
fn stayed(sh: &Shared, requests: usize) {
    sh.stays.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(
        requests,
        "requests no completion shows waited for the engine thread: it watches the socket again"
    );
}

/// Whether datagrams wait on `fd` (poll(2), not waiting).
fn readable(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(poll(&mut fds, Some(&now)), Ok(n) if n > 0)
}

/// Sleep until a wake-up, a packet on one of `rxs`, another NIC of the
/// address or interface connecting (accepted then, see `relay`), or
/// `timeout`.
fn sleep_watching<'a>(sh: &'a Shared, rxs: impl Iterator<Item = Rx<'a>>, timeout: Duration) {
    // The socket, the response socket, two side inlets, the wake-up, the
    // listener.
    let mut fds = [(); 6].map(|()| PollFd::new(&sh.wake, PollFlags::IN));
    let mut watched = 1;
    for rx in rxs.take(fds.len() - 2) {
        fds[watched] = PollFd::from_borrowed_fd(rx.fd(), PollFlags::IN);
        watched += 1;
    }
    let joining = sh.listener.as_ref().map(|l| {
        fds[watched] = PollFd::new(l, PollFlags::IN);
        watched += 1;
        watched - 1
    });
    sleep(sh, &mut fds[..watched], timeout);
    if joining.is_some_and(|k| fds[k].revents().contains(PollFlags::IN)) {
        sh.state.lock().relay.accept();
    }
}

/// poll(2) on `fds` for up to `timeout`, then take any wake-up.
fn sleep(sh: &Shared, fds: &mut [PollFd<'_>], timeout: Duration) {
    let ts = Timespec::try_from(timeout).unwrap_or(Timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    });
    let ready = poll(fds, Some(&ts));
    sh.sleeping_until.store(u64::MAX, Ordering::SeqCst);
    // Timed out: nobody woke it (one system call less per look at the
    // pollers).
    if ready != Ok(0) {
        let mut counter = [0u8; 8];
        let _ = rustix::io::read(sh.wake.as_fd(), &mut counter);
    }
}
