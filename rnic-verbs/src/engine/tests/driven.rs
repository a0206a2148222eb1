//! A thread asleep on a completion channel takes in its packets itself
//! (`drive`), and a signal ends its wait as it would end `read(2)`.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use super::pair;
use crate::signals::counting::{install, ran};
use crate::*;

/// SENDs from b, `gap` apart, `n` of them, each taken on a by a thread
/// that arms its queue and waits for the event in `read_cq_event`.
fn event_driven_receiver(p: &super::Pair, n: u64, gap: Duration) {
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..n {
                p.post();
                p.sent();
                std::thread::sleep(gap);
            }
        });
        let mut got = 0;
        while got < n {
            p.a_rcq.req_notify();
            while let Some(c) = p.a_rcq.try_next() {
                assert_eq!(c.status, WcStatus::Success);
                got += 1;
            }
            if got < n {
                // Bounded: the sender's SENDs keep coming until the last.
                p.chan.get_cq_event(Duration::from_secs(10)).unwrap();
            }
        }
    });
}

/// Every SEND wakes the waiting thread, which takes it in: the engine
/// thread, which would otherwise be woken first and then wake the
/// waiter, leaves the socket to it (it took in the first packets, until
/// it had seen a thread take them, and no more than a few after).
#[test]
fn a_thread_asleep_on_its_channel_takes_its_packets_in_itself() {
    let p = pair();
    let n = 400;
    let (engine0, polled0) = (p.a.engine.engine_packets(), p.a.engine.polled_packets());
    event_driven_receiver(&p, n, Duration::from_micros(200));
    let engine = p.a.engine.engine_packets() - engine0;
    let polled = p.a.engine.polled_packets() - polled0;
    assert!(
        polled >= n * 3 / 4 && engine <= n / 4,
        "of {n} SENDs the waiting thread took {polled}, the engine thread {engine}"
    );
}

/// Where the program made the descriptor non-blocking, a wait for an event
/// returns at once, as `read(2)` does, and nothing is driven.
#[test]
fn a_non_blocking_channel_is_not_waited_on() {
    let p = pair();
    let fd = p.chan.as_fd();
    let flags = rustix::fs::fcntl_getfl(fd).unwrap();
    rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK).unwrap();
    p.a_rcq.req_notify();
    let t = std::time::Instant::now();
    assert!(matches!(p.chan.read_cq_event(), Err(Error::Timeout)));
    assert!(t.elapsed() < Duration::from_secs(1));
    assert!(!p.chan.driven.load(Ordering::Relaxed));
}

/// A signal sent to a thread waiting in `read_cq_event`: with a handler
/// installed without SA_RESTART the wait ends with EINTR (qperf ends its
/// tests so, with alarm), with SA_RESTART it goes on to the event; the
/// handler runs once either way, on that thread.
#[test]
#[allow(unsafe_code)]
fn a_signal_ends_a_driven_wait_exactly_when_it_would_end_read() {
    let sig = libc::SIGRTMIN() + 6;
    for restart in [false, true] {
        install(sig, if restart { libc::SA_RESTART } else { 0 });
        let p = pair();
        let handled = ran(sig);
        let (tid_tx, tid_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let waiting = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                // The thread lets in this signal alone: the handlers other
                // tests install for theirs are not its program's.
                let mut only = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
                // SAFETY: initialises the set, then sets this thread's mask.
                unsafe {
                    libc::sigfillset(only.as_mut_ptr());
                    libc::sigdelset(only.as_mut_ptr(), sig);
                    libc::pthread_sigmask(libc::SIG_SETMASK, only.as_ptr(), std::ptr::null_mut());
                }
                // SAFETY: this thread's own handle.
                tid_tx
                    .send(unsafe { libc::pthread_self() } as usize)
                    .unwrap();
                p.a_rcq.req_notify();
                waiting.store(true, Ordering::SeqCst);
                let r = p.chan.read_cq_event();
                done_tx
                    .send(r.map_err(|e| match e {
                        Error::Io(e) => e.raw_os_error(),
                        _ => None,
                    }))
                    .unwrap();
            });
            let tid = tid_rx.recv().unwrap();
            while !waiting.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_millis(50));
            // SAFETY: the thread lives until it has sent its result.
            assert_eq!(
                unsafe { libc::pthread_kill(tid as libc::pthread_t, sig) },
                0
            );
            let early = done_rx.recv_timeout(Duration::from_millis(500));
            // However it went, the SEND ends a wait still going.
            p.post();
            p.sent();
            let r = match early {
                Ok(r) => r,
                Err(_) => done_rx.recv_timeout(Duration::from_secs(10)).unwrap(),
            };
            if restart {
                assert!(early.is_err(), "SA_RESTART: the wait went on");
                assert_eq!(r, Ok(p.a_rcq.id()));
            } else {
                assert_eq!(early, Ok(Err(Some(libc::EINTR))), "no SA_RESTART: EINTR");
            }
        });
        assert_eq!(ran(sig), handled + 1, "restart {restart}");
    }
}
