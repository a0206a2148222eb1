//! Signals, for a thread that waits in rnic instead of in `read(2)`.
//!
//! `ibv_get_cq_event` is a `read(2)` of the channel's descriptor, and
//! programs rely on how a signal ends it: a handler installed without
//! `SA_RESTART` makes it fail with `EINTR` (qperf ends each test with
//! `alarm`), one with `SA_RESTART` is invisible. A thread that waits on the
//! NIC's socket as well as on the channel (see `engine::drive`) sleeps in
//! poll(2), which the kernel never restarts: left as it is, every signal
//! would end the wait. So the waiting thread blocks every signal, watches
//! the ones its program lets in through a signalfd, and when one comes,
//! looks at its disposition before letting it in: the handler runs as it
//! would have, and the wait ends with `EINTR` exactly when `read(2)` would
//! have.
//!
//! rnic's own threads block every signal from their first instruction
//! ([`spawn`]): a signal sent to the process while its waiting thread
//! blocks them goes to another thread that lets it in, and the engine
//! thread must not be that thread (the program's handler would run there
//! and the wait would never end).

// sigprocmask, sigaction and signalfd, which std and rustix do not wrap.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

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

    fn same(&self, other: &SigSet) -> bool {
        signals().all(|s| self.has(s) == other.has(s))
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

    /// A descriptor that is readable while a signal the thread's own mask
    /// lets in is pending, for it or for the process (one per thread, kept
    /// between waits).
    pub fn watch(&self) -> io::Result<BorrowedFd<'static>> {
        thread_local! {
            static WATCH: RefCell<Option<(SigSet, OwnedFd)>> = const { RefCell::new(None) };
        }
        let wanted = SigSet::full().minus(&self.own);
        WATCH.with(|w| {
            let mut w = w.borrow_mut();
            let fd = match w.as_ref() {
                Some((mask, fd)) if mask.same(&wanted) => fd.as_raw_fd(),
                Some((_, fd)) => {
                    // SAFETY: updates the mask of this thread's own signalfd.
                    if unsafe { libc::signalfd(fd.as_raw_fd(), &wanted.0, 0) } < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    let raw = fd.as_raw_fd();
                    if let Some((mask, _)) = w.as_mut() {
                        *mask = wanted;
                    }
                    raw
                }
                None => {
                    // SAFETY: a new descriptor, owned below.
                    let raw = unsafe {
                        libc::signalfd(-1, &wanted.0, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC)
                    };
                    if raw < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    // SAFETY: just opened, owned by nothing else.
                    *w = Some((wanted, unsafe { OwnedFd::from_raw_fd(raw) }));
                    raw
                }
            };
            // SAFETY: the descriptor lives in this thread's local until the
            // thread ends, and only this thread borrows it.
            Ok(unsafe { BorrowedFd::borrow_raw(fd) })
        })
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

/// Whether one of `pending` has a handler installed without `SA_RESTART`
/// (read before it runs: `SA_RESETHAND` resets it).
fn interrupts(pending: &SigSet) -> bool {
    signals().filter(|&s| pending.has(s)).any(|sig| {
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
pub(crate) fn spawn<F, T>(builder: std::thread::Builder, f: F) -> io::Result<std::thread::JoinHandle<T>>
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static RAN: AtomicUsize = AtomicUsize::new(0);

    extern "C" fn handler(_: i32) {
        RAN.fetch_add(1, Ordering::SeqCst);
    }

    fn install(sig: i32, flags: i32) {
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = handler as *const () as usize;
        act.sa_flags = flags;
        // SAFETY: a valid handler, installed for the test's own signal.
        assert_eq!(unsafe { libc::sigaction(sig, &act, std::ptr::null_mut()) }, 0);
    }

    /// A signal sent while the thread blocks all is seen on the watch
    /// descriptor, runs its handler when let in, and interrupts exactly
    /// when the handler lacks SA_RESTART.
    #[test]
    fn a_blocked_signal_is_watched_run_and_judged_by_its_disposition() {
        let (restart, plain) = (libc::SIGRTMIN() + 3, libc::SIGRTMIN() + 4);
        install(restart, libc::SA_RESTART);
        install(plain, 0);
        std::thread::spawn(move || {
            for (sig, interrupts) in [(restart, false), (plain, true)] {
                let b = Blocked::all().unwrap();
                let fd = b.watch().unwrap();
                let mut fds = [rustix::event::PollFd::from_borrowed_fd(
                    fd,
                    rustix::event::PollFlags::IN,
                )];
                let zero = rustix::event::Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                assert_eq!(rustix::event::poll(&mut fds, Some(&zero)).unwrap(), 0);
                let before = RAN.load(Ordering::SeqCst);
                // SAFETY: sends a signal to this thread.
                unsafe { libc::pthread_kill(libc::pthread_self(), sig) };
                assert_eq!(RAN.load(Ordering::SeqCst), before, "blocked");
                assert_eq!(rustix::event::poll(&mut fds, Some(&zero)).unwrap(), 1);
                assert_eq!(b.let_in().unwrap(), interrupts, "signal {sig}");
                assert_eq!(RAN.load(Ordering::SeqCst), before + 1, "handled");
            }
        })
        .join()
        .unwrap();
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
