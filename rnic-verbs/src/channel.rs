//! Completion channels (`ibv_comp_channel`): a file descriptor that becomes
//! readable when an armed completion queue gets a completion, so an
//! application can sleep in poll/epoll with its other descriptors instead of
//! spinning on a completion queue.
//!
//! As in verbs: [`CompletionQueue::req_notify`](crate::CompletionQueue::req_notify)
//! arms a queue for its next completion, the engine then queues one event
//! for the channel and makes its descriptor readable, and
//! [`CompletionChannel::get_cq_event`] takes the event. The descriptor stays
//! readable while events are waiting; a spurious readiness is possible (the
//! call then returns [`Error::Timeout`] for a zero
//! timeout), as with any level-triggered descriptor.
//!
//! Asynchronous events ([`AsyncEventQueue`]) are the same thing with
//! another kind of event: both are a [`Waiting`] queue behind a [`Bell`].

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use rnic_core::cq::CqHandle;
use rnic_core::srq::AsyncEvent;
use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

use parking_lot::Mutex;
use std::sync::Weak;

use crate::engine::{BusyPoll, Engine, Woken};
use crate::{Error, Result};

/// An eventfd that is readable while something waits behind it. Blocking,
/// as the descriptors it stands for are in rdma-core: a program may set
/// O_NONBLOCK itself.
#[derive(Debug)]
pub(crate) struct Bell {
    fd: OwnedFd,
}

impl Bell {
    fn new() -> io::Result<Bell> {
        Ok(Bell {
            fd: eventfd(0, EventfdFlags::CLOEXEC)?,
        })
    }

    /// Make the descriptor readable.
    pub fn ring(&self) {
        // Fails only when the counter would overflow, which is readable anyway.
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }

    /// Make it unreadable again, without blocking whether or not the
    /// descriptor is non-blocking.
    fn clear(&self) {
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        if matches!(poll(&mut fds, Some(&Timespec { tv_sec: 0, tv_nsec: 0 })), Ok(n) if n > 0) {
            let mut counter = [0u8; 8];
            let _ = rustix::io::read(&self.fd, &mut counter);
        }
    }

    /// Wait until it is readable, or `timeout` passes (`None`: forever),
    /// through signals.
    fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        let ts = match timeout {
            Some(t) => Some(Timespec::try_from(t).map_err(|_| Error::Timeout)?),
            None => None,
        };
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        match poll(&mut fds, ts.as_ref()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(e) => Err(Error::Io(e.into())),
        }
    }

    /// Read the counter as a program's `read(2)` would: blocking or not as
    /// the descriptor is ([`Error::Timeout`] for EAGAIN), interrupted as
    /// the signal's disposition says.
    fn read(&self) -> Result<()> {
        let mut counter = [0u8; 8];
        match rustix::io::read(&self.fd, &mut counter) {
            Ok(_) => Ok(()),
            Err(rustix::io::Errno::AGAIN) => Err(Error::Timeout),
            Err(e) => Err(Error::Io(e.into())),
        }
    }
}

/// The engine's half of a queue of events: send one and ring the bell.
#[derive(Debug)]
pub(crate) struct Raise<T> {
    events: Sender<T>,
    bell: Arc<Bell>,
}

impl<T> Raise<T> {
    pub fn raise(&self, e: T) {
        let _ = self.events.send(e);
        self.bell.ring();
    }
}

/// The waiting half: events, and a descriptor readable while (and, but for
/// a moment, only while) one waits, as a program that polls it before
/// calling expects.
#[derive(Debug, Clone)]
pub(crate) struct Waiting<T> {
    events: Receiver<T>,
    bell: Arc<Bell>,
}

pub(crate) fn queue<T>() -> io::Result<(Raise<T>, Waiting<T>)> {
    let bell = Arc::new(Bell::new()?);
    let (tx, rx) = crossbeam_channel::unbounded();
    Ok((
        Raise {
            events: tx,
            bell: bell.clone(),
        },
        Waiting { events: rx, bell },
    ))
}

impl<T> Waiting<T> {
    /// The next event if one waits. The bell is cleared before looking, so
    /// that an event raised meanwhile rings it again; it rings on if more
    /// wait.
    fn take(&self) -> Option<T> {
        self.bell.clear();
        let e = self.events.try_recv().ok()?;
        if !self.events.is_empty() {
            self.bell.ring();
        }
        Some(e)
    }

    /// The next event, waiting up to `timeout` for one (`None`: forever;
    /// zero: do not wait), through signals.
    pub(crate) fn next(&self, timeout: Option<Duration>) -> Result<T> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(e) = self.take() {
                return Ok(e);
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                return Err(Error::Timeout);
            }
            self.bell.wait(left)?;
        }
    }

    /// The next event, waiting as `read(2)` on the descriptor waits, which
    /// is what rdma-core's `ibv_get_cq_event` and `ibv_get_async_event`
    /// are: for as long as it takes if the descriptor is blocking, not at
    /// all ([`Error::Timeout`]) if the program made it non-blocking; and a
    /// signal whose handler was installed without `SA_RESTART` ends the
    /// wait with [`io::ErrorKind::Interrupted`] (programs such as qperf end
    /// a test with `alarm` and count on it).
    pub(crate) fn read(&self) -> Result<T> {
        loop {
            if let Ok(e) = self.events.try_recv() {
                self.bell.clear();
                if !self.events.is_empty() {
                    self.bell.ring();
                }
                return Ok(e);
            }
            // Consumes the ring of an event raised since, which is then
            // in the queue.
            self.bell.read()?;
        }
    }

    /// The next event, with the calling thread driving `engine` as it
    /// waits (see `engine::drive`), on a blocking descriptor. Without a
    /// deadline it is [`Waiting::read`]: a signal ends it as it would end
    /// `read(2)`. With one it is [`Waiting::next`]: signals do not end it.
    fn next_driven(
        &self,
        engine: &Engine,
        deadline: Option<Instant>,
        busy_poll: &BusyPoll,
    ) -> Result<T> {
        loop {
            if let Some(e) = self.take() {
                return Ok(e);
            }
            let events = &self.events;
            let ready = &mut || !events.is_empty();
            match engine.drive(self.bell.fd.as_fd(), deadline, busy_poll, ready)? {
                Woken::Ready => {}
                Woken::Interrupted if deadline.is_none() => {
                    return Err(Error::Io(io::Error::from_raw_os_error(libc::EINTR)));
                }
                Woken::Interrupted => {}
                Woken::TimedOut => return self.take().ok_or(Error::Timeout),
            }
        }
    }
}

impl<T> AsFd for Waiting<T> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.bell.fd.as_fd()
    }
}

/// A completion queue's arming, shared by its handle and the engine.
#[derive(Debug)]
pub(crate) struct Notify {
    pub armed: Arc<AtomicBool>,
    pub signal: Arc<Raise<CqHandle>>,
}

impl Notify {
    /// A completion arrived for `cq`: raise one event if armed, and disarm.
    pub fn completed(&self, cq: CqHandle) {
        if self.armed.swap(false, Ordering::AcqRel) {
            self.signal.raise(cq);
        }
    }
}

/// A completion channel (`ibv_create_comp_channel`).
///
/// A thread that waits for its next event in
/// [`read_cq_event`](Self::read_cq_event) or
/// [`get_cq_event`](Self::get_cq_event), when the channel's queues are all
/// of one device, sleeps on that device's socket as well, and takes in
/// what arrives itself: one wake-up per event instead of two (see
/// `engine::drive`).
#[derive(Debug, Clone)]
pub struct CompletionChannel {
    pub(crate) signal: Arc<Raise<CqHandle>>,
    waiting: Waiting<CqHandle>,
    /// The engines of the devices whose queues report here.
    engines: Arc<Mutex<Vec<Weak<Engine>>>>,
    /// The last wait was driven: arming one of the channel's queues needs
    /// the engine thread no more than a poll does, since the next wait
    /// will take in what arrives.
    pub(crate) driven: Arc<AtomicBool>,
    /// Whether its waits spin before they sleep.
    busy_poll: Arc<BusyPoll>,
}

impl CompletionChannel {
    pub(crate) fn new() -> io::Result<CompletionChannel> {
        let (signal, waiting) = queue()?;
        Ok(CompletionChannel {
            signal: Arc::new(signal),
            waiting,
            engines: Arc::default(),
            driven: Arc::default(),
            busy_poll: Arc::default(),
        })
    }

    /// A queue of `engine`'s device reports here.
    pub(crate) fn serves(&self, engine: &Arc<Engine>) {
        let mut e = self.engines.lock();
        e.retain(|w| w.strong_count() > 0);
        if !e
            .iter()
            .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(engine)))
        {
            e.push(Arc::downgrade(engine));
        }
    }

    /// The engine a waiting thread drives: the one device's whose queues
    /// report here, if there is one, and if a wait on the descriptor
    /// blocks (a program that made it non-blocking wants an answer now).
    fn driver(&self) -> Option<Arc<Engine>> {
        let e = self.engines.lock();
        let [one] = e.as_slice() else { return None };
        let engine = one.upgrade()?;
        drop(e);
        let blocking = rustix::fs::fcntl_getfl(&self.waiting.bell.fd)
            .is_ok_and(|f| !f.contains(rustix::fs::OFlags::NONBLOCK));
        blocking.then_some(engine)
    }

    /// Wait up to `timeout` (zero: do not wait) for an event, and return the
    /// number of the completion queue it is for
    /// ([`CompletionQueue::id`](crate::CompletionQueue::id)). The queue is
    /// disarmed: poll it, then arm it again. Signals do not end the wait.
    pub fn get_cq_event(&self, timeout: Duration) -> Result<u32> {
        if let Some(engine) = self.driver().filter(|_| !timeout.is_zero()) {
            self.driven.store(true, Ordering::Relaxed);
            let deadline = Instant::now() + timeout;
            return self
                .waiting
                .next_driven(&engine, Some(deadline), &self.busy_poll)
                .map(|cq| cq.0);
        }
        self.driven.store(false, Ordering::Relaxed);
        self.waiting.next(Some(timeout)).map(|cq| cq.0)
    }

    /// [`get_cq_event`](Self::get_cq_event) as `read(2)` on the descriptor
    /// waits: as long as it takes, not at all if the descriptor is
    /// non-blocking ([`Error::Timeout`]), ended by a signal whose handler
    /// lacks `SA_RESTART` ([`io::ErrorKind::Interrupted`]). This is what
    /// rdma-core's `ibv_get_cq_event` does.
    pub fn read_cq_event(&self) -> Result<u32> {
        if let Some(engine) = self.driver() {
            self.driven.store(true, Ordering::Relaxed);
            return self
                .waiting
                .next_driven(&engine, None, &self.busy_poll)
                .map(|cq| cq.0);
        }
        self.driven.store(false, Ordering::Relaxed);
        self.waiting.read().map(|cq| cq.0)
    }
}

impl AsFd for CompletionChannel {
    /// The descriptor to poll: readable when an event waits.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.waiting.bell.fd.as_fd()
    }
}

/// Asynchronous events (`ibv_get_async_event`) with a descriptor that is
/// readable while one waits (`ibv_context.async_fd`).
#[derive(Debug)]
pub struct AsyncEventQueue {
    waiting: Waiting<AsyncEvent>,
}

impl AsyncEventQueue {
    /// The queue, and the engine's half of it.
    pub(crate) fn new() -> io::Result<(AsyncEventQueue, Raise<AsyncEvent>)> {
        let (raise, waiting) = queue()?;
        Ok((AsyncEventQueue { waiting }, raise))
    }

    /// The next event, waiting up to `timeout` for one (`None`: forever;
    /// zero: do not wait). Signals do not end the wait.
    pub fn next(&self, timeout: Option<Duration>) -> Result<AsyncEvent> {
        self.waiting.next(timeout)
    }

    /// The next event, waiting as `read(2)` on the descriptor does (what
    /// rdma-core's `ibv_get_async_event` is): see
    /// [`CompletionChannel::read_cq_event`].
    pub fn read_event(&self) -> Result<AsyncEvent> {
        self.waiting.read()
    }
}

impl AsFd for AsyncEventQueue {
    /// The descriptor to poll: readable when an event waits.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.waiting.bell.fd.as_fd()
    }
}
