//! Signals, for a thread that waits in rnic instead of in `read(2)`.
//!
//! `ibv_get_cq_event` is a `read(2)` of the channel's descriptor, and
//! programs rely on how a signal ends it: a handler installed without
//! `SA_RESTART` makes it fail with `EINTR` (qperf ends each test with
//! `alarm`), one with `SA_RESTART` is invisible, and the kernel prefers
//! the waiting thread for a signal sent to the process. A thread that
//! waits on the NIC's socket as well as on the channel (see
//! `engine::drive`) sleeps in ppoll(2), which a signal always ends, and
//! runs the engine between sleeps. So it blocks every signal while it
//! works, and lets in what its program lets in only while it sleeps (the
//! kernel then prefers it, as in `read(2)`):
//!
//! - a signal that came while it worked is pending when it is about to
//!   sleep: it knows which, and judges it by its disposition before it
//!   lets it in ([`Blocked::let_in`]);
//! - a signal that ends the sleep has run its handler already: the wait
//!   ends with `EINTR` if a signal the thread lets in has a handler without
//!   `SA_RESTART` ([`Blocked::sleep`]). That is exact unless the program
//!   has handlers of both kinds, where a signal of the restarting kind
//!   also ends the wait: a spurious `EINTR` that a program can retry,
//!   rather than a wait that goes on after a signal that should have
//!   ended it.
//!
//! rnic's own threads block every signal from their first instruction
//! ([`spawn`]): a program's handler never runs on them.

// sigprocmask, sigaction and signalfd, which std and rustix do not wrap.
#![allow(unsafe_code)]

use std::io;
use std::mem::MaybeUninit;
use std::time::Duration;

/// A signal set.
#[derive(Clone, Copy)]
pub(crate) struct SigSet(libc::sigset_t);

impl SigSet {
    fn empty() -> SigSet {
        let mut s = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: initialises `s`.
        unsafe { libc::sigemptyset(s.as_mut_ptr()) };
        // SAFETY: initialised above.
        SigSet(unsafe { s.assume_init() })
    }

    fn full() -> SigSet {
        let mut s = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: initialises `s`.
        unsafe { libc::sigfillset(s.as_mut_ptr()) };
        // SAFETY: initialised above.
        SigSet(unsafe { s.assume_init() })
    }

    fn has(&self, sig: i32) -> bool {
        // SAFETY: an initialised set; an invalid number yields -1.
        unsafe { libc::sigismember(&self.0, sig) == 1 }
    }

    fn add(&mut self, sig: i32) {
        // SAFETY: an initialised set.
        unsafe { libc::sigaddset(&mut self.0, sig) };
    }

    /// The signals in `self` that are not in `other`.
    fn minus(&self, other: &SigSet) -> SigSet {
        let mut s = SigSet::empty();
        for sig in signals() {
            if self.has(sig) && !other.has(sig) {
                s.add(sig);
            }
        }
        s
    }

    fn is_empty(&self) -> bool {
        signals().all(|s| !self.has(s))
    }
}

/// Every signal number.
fn signals() -> impl Iterator<Item = i32> {
    1..=libc::SIGRTMAX()
}

/// Set the calling thread's mask to `to`; returns the one it had.
fn set_mask(to: &SigSet) -> io::Result<SigSet> {
    let mut old = SigSet::empty();
    // SAFETY: both sets are valid; pthread_sigmask returns an errno.
    match unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &to.0, &mut old.0) } {
        0 => Ok(old),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// The calling thread with every signal blocked, until dropped (or
/// [`Blocked::let_in`]), when its own mask comes back.
pub(crate) struct Blocked {
    /// The thread's own mask: the signals its program keeps out.
    own: SigSet,
}

impl Blocked {
    pub fn all() -> io::Result<Blocked> {
        Ok(Blocked {
            own: set_mask(&SigSet::full())?,
        })
    }

    /// Sleep in ppoll(2) on `fds` for up to `timeout` (`None`: until one
    /// is ready), letting in the signals the thread's own mask lets in:
    /// whether a signal that came ended the wait as it would have ended
    /// `read(2)` (see the module's documentation). The system call itself,
    /// not the C library's: that one is a cancellation point, and a thread
    /// cancelled there would unwind through frames that cannot be unwound.
    pub fn sleep(&self, fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<bool> {
        let ts = timeout.map(|t| libc::timespec {
            tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: t.subsec_nanos().into(),
        });
        let tsp = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: valid descriptors and a timespec that outlive the call;
        // the kernel's signal set is the first 8 bytes of the C library's.
        let r = unsafe {
            libc::syscall(
                libc::SYS_ppoll,
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                tsp,
                &self.own.0 as *const libc::sigset_t,
                8usize,
            )
        };
        if r >= 0 {
            return Ok(false);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
        Ok(interrupts(&SigSet::full().minus(&self.own)))
    }

    /// Whether a signal the thread lets in is pending.
    pub fn pending_any(&self) -> bool {
        !self.pending().is_empty()
    }

    /// The pending signals that the thread's own mask lets in.
    fn pending(&self) -> SigSet {
        let mut p = SigSet::empty();
        // SAFETY: fills a valid set.
        unsafe { libc::sigpending(&mut p.0) };
        p.minus(&self.own)
    }

    /// A signal the thread lets in is pending: let the pending ones in (their
    /// handlers run now), and say whether `read(2)` would have ended with
    /// `EINTR` for them. The thread keeps its own mask afterwards.
    pub fn let_in(self) -> io::Result<bool> {
        let pending = self.pending();
        let interrupts = !pending.is_empty() && interrupts(&pending);
        set_mask(&self.own)?;
        std::mem::forget(self);
        Ok(interrupts)
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        let _ = set_mask(&self.own);
    }
}

/// Whether one of `signals` has a handler installed without `SA_RESTART`
/// (for a pending signal, read before it runs: `SA_RESETHAND` resets it).
fn interrupts(set: &SigSet) -> bool {
    signals().filter(|&s| set.has(s)).any(|sig| {
        let mut act = MaybeUninit::<libc::sigaction>::uninit();
        // SAFETY: reads the disposition only (no new action).
        if unsafe { libc::sigaction(sig, std::ptr::null(), act.as_mut_ptr()) } != 0 {
            return false;
        }
        // SAFETY: filled in by sigaction.
        let act = unsafe { act.assume_init() };
        act.sa_sigaction != libc::SIG_DFL
            && act.sa_sigaction != libc::SIG_IGN
            && act.sa_flags & libc::SA_RESTART == 0
    })
}

/// Start a thread of rnic's own, with every signal blocked from its first
/// instruction (see the module's documentation).
pub(crate) fn spawn<F, T>(
    builder: std::thread::Builder,
    f: F,
) -> io::Result<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    // The new thread takes the mask of the one that starts it.
    let blocked = Blocked::all()?;
    let t = builder.spawn(f);
    drop(blocked);
    t
}

/// A handler that counts, for the tests here and the engine's.
#[cfg(test)]
pub(crate) mod counting {
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// How often each signal's handler ran.
    static RAN: [AtomicUsize; 65] = [const { AtomicUsize::new(0) }; 65];

    extern "C" fn handler(sig: i32) {
        if let Some(n) = usize::try_from(sig).ok().and_then(|s| RAN.get(s)) {
            n.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Install the counting handler for `sig`, with `flags`.
    pub fn install(sig: i32, flags: i32) {
        // SAFETY: a zeroed sigaction is valid.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = handler as *const () as usize;
        act.sa_flags = flags;
        // SAFETY: a valid handler, installed for the test's own signal.
        assert_eq!(
            unsafe { libc::sigaction(sig, &act, std::ptr::null_mut()) },
            0
        );
    }

    /// How often `sig`'s handler has run.
    pub fn ran(sig: i32) -> usize {
        RAN[usize::try_from(sig).expect("a signal number")].load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::counting::{install, ran};
    use super::*;

    /// A signal sent while the thread blocks all waits, is seen pending,
    /// runs its handler when let in, and interrupts exactly when the
    /// handler lacks SA_RESTART.
    #[test]
    fn a_blocked_signal_is_seen_run_and_judged_by_its_disposition() {
        let (restart, plain) = (libc::SIGRTMIN() + 3, libc::SIGRTMIN() + 4);
        install(restart, libc::SA_RESTART);
        install(plain, 0);
        std::thread::spawn(move || {
            for (sig, interrupts) in [(restart, false), (plain, true)] {
                let b = Blocked::all().unwrap();
                assert!(!b.pending_any());
                let before = ran(sig);
                // SAFETY: sends a signal to this thread.
                unsafe { libc::pthread_kill(libc::pthread_self(), sig) };
                assert_eq!(ran(sig), before, "blocked");
                assert!(b.pending_any());
                assert_eq!(b.let_in().unwrap(), interrupts, "signal {sig}");
                assert_eq!(ran(sig), before + 1, "handled");
            }
        })
        .join()
        .unwrap();
    }

    /// A signal that comes during the sleep runs its handler there, and
    /// ends the sleep as it would end read(2) when the only handlers the
    /// thread lets in are of one kind.
    #[test]
    fn a_signal_in_the_sleep_ends_it_as_read_would_end() {
        let sig = libc::SIGRTMIN() + 5;
        // Only this signal's handler is let in: the others stay blocked.
        for (flags, interrupts) in [(libc::SA_RESTART, false), (0, true)] {
            install(sig, flags);
            let (tx, rx) = std::sync::mpsc::channel();
            let t = std::thread::spawn(move || {
                let mut only = SigSet::full();
                // SAFETY: removes a valid signal from an initialised set.
                unsafe { libc::sigdelset(&mut only.0, sig) };
                set_mask(&only).unwrap();
                let b = Blocked::all().unwrap();
                // SAFETY: this thread's own handle.
                tx.send(unsafe { libc::pthread_self() } as usize).unwrap();
                let before = ran(sig);
                let r = b.sleep(&mut [], Some(Duration::from_secs(10))).unwrap();
                (r, ran(sig) - before)
            });
            let tid = rx.recv().unwrap();
            std::thread::sleep(Duration::from_millis(50));
            // SAFETY: the thread lives until joined below.
            unsafe { libc::pthread_kill(tid as libc::pthread_t, sig) };
            assert_eq!(t.join().unwrap(), (interrupts, 1), "flags {flags}");
        }
    }

    /// rnic's threads block every signal.
    #[test]
    fn spawned_threads_block_every_signal() {
        let t = spawn(std::thread::Builder::new(), || {
            let mut m = SigSet::empty();
            // SAFETY: reads this thread's mask.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut m.0) };
            m.has(libc::SIGALRM) && m.has(libc::SIGINT) && m.has(libc::SIGRTMIN())
        })
        .unwrap();
        assert!(t.join().unwrap());
        let mut m = SigSet::empty();
        // SAFETY: as above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut m.0) };
        assert!(!m.has(libc::SIGALRM), "the caller's mask comes back");
    }
}
