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

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use rnic_core::cq::CqHandle;
use rnic_core::srq::AsyncEvent;
use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

use crate::{Error, Result};

/// The channel's shared half: what the engine signals.
#[derive(Debug)]
pub(crate) struct Signal {
    fd: OwnedFd,
    events: Sender<CqHandle>,
}

impl Signal {
    fn raise(&self, cq: CqHandle) {
        let _ = self.events.send(cq);
        // Fails only when the counter would overflow, which is readable anyway.
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }
}

/// A completion queue's arming, shared by its handle and the engine.
#[derive(Debug)]
pub(crate) struct Notify {
    pub armed: Arc<AtomicBool>,
    pub signal: Arc<Signal>,
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
#[derive(Debug, Clone)]
pub struct CompletionChannel {
    pub(crate) signal: Arc<Signal>,
    events: Receiver<CqHandle>,
}

impl CompletionChannel {
    pub(crate) fn new() -> io::Result<CompletionChannel> {
        // Blocking, as rdma-core's channel descriptor is: a program may set
        // O_NONBLOCK itself, and rnic reads only after poll says readable.
        let fd = eventfd(0, EventfdFlags::CLOEXEC)?;
        let (events, rx) = crossbeam_channel::unbounded();
        Ok(CompletionChannel {
            signal: Arc::new(Signal { fd, events }),
            events: rx,
        })
    }

    /// Wait up to `timeout` (zero: do not wait) for an event, and return the
    /// number of the completion queue it is for
    /// ([`CompletionQueue::id`](crate::CompletionQueue::id)). The queue is
    /// disarmed: poll it, then arm it again.
    pub fn get_cq_event(&self, timeout: Duration) -> Result<u32> {
        let deadline = Instant::now() + timeout;
        loop {
            drain(&self.signal.fd);
            if let Ok(cq) = self.events.try_recv() {
                if !self.events.is_empty() {
                    // More events wait: keep the descriptor readable.
                    let _ = rustix::io::write(&self.signal.fd, &1u64.to_ne_bytes());
                }
                return Ok(cq.0);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout);
            }
            let ts = Timespec::try_from(left).map_err(|_| Error::Timeout)?;
            let mut fds = [PollFd::new(&self.signal.fd, PollFlags::IN)];
            match poll(&mut fds, Some(&ts)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(Error::Io(e.into())),
            }
        }
    }

    /// Wait for an event as `read(2)` on the descriptor waits, which is what
    /// rdma-core's `ibv_get_cq_event` is: for as long as it takes if the
    /// descriptor is blocking, not at all ([`Error::Timeout`]) if the
    /// program made it non-blocking; and a signal whose handler was
    /// installed without `SA_RESTART` ends the wait with
    /// [`io::ErrorKind::Interrupted`] (programs such as qperf end a test
    /// with `alarm` and count on it). [`get_cq_event`](Self::get_cq_event)
    /// waits through signals instead.
    pub fn read_cq_event(&self) -> Result<u32> {
        loop {
            if let Ok(cq) = self.events.try_recv() {
                // Readable while (and only while) more events wait, as a
                // program that polls the descriptor before calling expects.
                drain(&self.signal.fd);
                if !self.events.is_empty() {
                    let _ = rustix::io::write(&self.signal.fd, &1u64.to_ne_bytes());
                }
                return Ok(cq.0);
            }
            read_counter(&self.signal.fd)?;
        }
    }
}

/// Read an eventfd's counter as a program's `read(2)` would: blocking or
/// not as the descriptor is, interrupted as the signal's disposition says.
fn read_counter(fd: &OwnedFd) -> Result<()> {
    let mut counter = [0u8; 8];
    match rustix::io::read(fd, &mut counter) {
        Ok(_) => Ok(()),
        Err(rustix::io::Errno::AGAIN) => Err(Error::Timeout),
        Err(e) => Err(Error::Io(e.into())),
    }
}

impl AsFd for CompletionChannel {
    /// The descriptor to poll: readable when an event waits.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.signal.fd.as_fd()
    }
}

/// Reset an eventfd's counter if it is readable, without blocking whether or
/// not the descriptor is non-blocking.
fn drain(fd: &OwnedFd) {
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    if matches!(poll(&mut fds, Some(&Timespec { tv_sec: 0, tv_nsec: 0 })), Ok(n) if n > 0) {
        let mut counter = [0u8; 8];
        let _ = rustix::io::read(fd, &mut counter);
    }
}

/// An eventfd that is readable while something waits behind it.
#[derive(Debug)]
pub(crate) struct Bell {
    fd: OwnedFd,
}

impl Bell {
    fn new() -> io::Result<Bell> {
        Ok(Bell {
            // Blocking, as the descriptor it stands for is (see above).
            fd: eventfd(0, EventfdFlags::CLOEXEC)?,
        })
    }
    /// Make the descriptor readable.
    pub fn ring(&self) {
        // Fails only when the counter would overflow, which is readable anyway.
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }
    /// Make it unreadable again.
    fn clear(&self) {
        drain(&self.fd);
    }
    /// Wait until it is readable, or `timeout` passes (`None`: forever).
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
}

/// Asynchronous events (`ibv_get_async_event`) with a descriptor that is
/// readable while one waits (`ibv_context.async_fd`).
#[derive(Debug)]
pub struct AsyncEventQueue {
    events: Receiver<AsyncEvent>,
    bell: Arc<Bell>,
}

impl AsyncEventQueue {
    #[allow(clippy::type_complexity)]
    pub(crate) fn new() -> io::Result<(AsyncEventQueue, Sender<AsyncEvent>, Arc<Bell>)> {
        let bell = Arc::new(Bell::new()?);
        let (tx, rx) = crossbeam_channel::unbounded();
        Ok((
            AsyncEventQueue {
                events: rx,
                bell: bell.clone(),
            },
            tx,
            bell,
        ))
    }

    /// The next event, waiting up to `timeout` for one (`None`: forever;
    /// zero: do not wait).
    pub fn next(&self, timeout: Option<Duration>) -> Result<AsyncEvent> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            self.bell.clear();
            if let Ok(e) = self.events.try_recv() {
                if !self.events.is_empty() {
                    self.bell.ring();
                }
                return Ok(e);
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                return Err(Error::Timeout);
            }
            self.bell.wait(left)?;
        }
    }

    /// The next event, waiting as `read(2)` on the descriptor does (what
    /// rdma-core's `ibv_get_async_event` is): see
    /// [`CompletionChannel::read_cq_event`].
    pub fn read_event(&self) -> Result<AsyncEvent> {
        loop {
            if let Ok(e) = self.events.try_recv() {
                // Readable while (and only while) more events wait.
                self.bell.clear();
                if !self.events.is_empty() {
                    self.bell.ring();
                }
                return Ok(e);
            }
            read_counter(&self.bell.fd)?;
        }
    }
}

impl AsFd for AsyncEventQueue {
    /// The descriptor to poll: readable when an event waits.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.bell.fd.as_fd()
    }
}
