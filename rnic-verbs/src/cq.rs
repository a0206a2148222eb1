//! Completion queues and their completion channels.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rnic_core::cq::CqHandle;

use crate::channel;
use crate::delivered::Delivered;
use crate::engine::{BusyPoll, CqSink, Woken};
use crate::{Completion, CompletionChannel, Device, Error, Result};

impl Device {
    /// Create a completion queue of `depth` entries.
    pub fn create_cq(&self, depth: usize) -> Result<CompletionQueue> {
        self.create_cq_inner(depth, None)
    }

    /// A completion channel (`ibv_create_comp_channel`), for
    /// [`Device::create_cq_with_channel`].
    pub fn create_comp_channel(&self) -> Result<CompletionChannel> {
        Ok(CompletionChannel::new()?)
    }

    /// Create a completion queue whose events, once armed with
    /// [`CompletionQueue::req_notify`], go to `channel`.
    pub fn create_cq_with_channel(
        &self,
        depth: usize,
        channel: &CompletionChannel,
    ) -> Result<CompletionQueue> {
        self.create_cq_inner(depth, Some(channel))
    }

    /// Change `cq`'s depth (`ibv_resize_cq`). Fails, changing nothing, when
    /// more completions are waiting to be polled than `depth`.
    pub fn resize_cq(&self, cq: &CompletionQueue, depth: usize) -> Result<()> {
        let (h, delivered) = (cq.cq, cq.delivered.clone());
        self.call(move |st| st.nic.resize_cq(h, depth, delivered.len()))?
            .map_err(Error::from)
    }

    fn create_cq_inner(
        &self,
        depth: usize,
        channel: Option<&CompletionChannel>,
    ) -> Result<CompletionQueue> {
        let delivered = Arc::new(Delivered::default());
        let armed = Arc::new(AtomicBool::new(false));
        if let Some(c) = channel {
            c.serves(&self.engine);
        }
        let driven = channel.map(|c| c.driven.clone());
        let notify = channel.map(|c| channel::Notify {
            armed: armed.clone(),
            signal: c.signal.clone(),
        });
        let sink = CqSink {
            delivered: delivered.clone(),
            notify,
        };
        let cq = self.engine.call(move |st| {
            let h = st.nic.create_cq(depth);
            st.cqs.insert(h, sink);
            h
        })?;
        Ok(CompletionQueue {
            cq,
            delivered,
            armed,
            driven,
            busy_poll: BusyPoll::default(),
            dev: self.clone(),
            destroyed: AtomicBool::new(false),
        })
    }
}

/// A completion queue. Dropping it destroys it, at once or, if queue pairs
/// still complete into it, with the last of them.
#[derive(Debug)]
pub struct CompletionQueue {
    pub(crate) cq: CqHandle,
    pub(crate) delivered: Arc<Delivered>,
    pub(crate) armed: Arc<AtomicBool>,
    /// Its channel's waits are driven (see [`CompletionChannel`]), if it
    /// has a channel.
    driven: Option<Arc<AtomicBool>>,
    /// Whether [`CompletionQueue::wait`] spins before it sleeps.
    busy_poll: BusyPoll,
    /// For run-to-completion: a poll that finds the queue empty takes in
    /// what has arrived itself.
    pub(crate) dev: Device,
    /// Destroyed in the NIC already: the drop must not destroy the CQ
    /// made in the same slot since.
    pub(crate) destroyed: AtomicBool,
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        if !self.destroyed.load(Ordering::Acquire) {
            let cq = self.cq;
            let _ = self.dev.call(move |st| st.release_cq(cq));
        }
    }
}

impl CompletionQueue {
    /// Destroy it now (`ibv_destroy_cq`). Refused while queue pairs
    /// complete into it ([`VerbError::CqBusy`](crate::VerbError::CqBusy)); the completions still in
    /// it go with it.
    pub fn destroy_now(&self) -> Result<()> {
        if self.destroyed.load(Ordering::Acquire) {
            return Ok(());
        }
        let cq = self.cq;
        self.dev.call(move |st| st.destroy_cq(cq))??;
        self.destroyed.store(true, Ordering::Release);
        Ok(())
    }
    /// Its number, as [`CompletionChannel::get_cq_event`] reports it.
    pub fn id(&self) -> u32 {
        self.cq.0
    }
    /// Ask for one event on the queue's completion channel at its next
    /// completion (`ibv_req_notify_cq` with solicited_only 0). Completions
    /// already waiting do not count: arm, poll, then wait for the event.
    pub fn req_notify(&self) {
        self.armed.store(true, Ordering::Release);
        // A thread that waits on the channel takes in what arrives itself.
        if !self
            .driven
            .as_ref()
            .is_some_and(|d| d.load(Ordering::Relaxed))
        {
            self.dev.engine.expect_sleeper();
        }
    }
    /// Take the completions waiting (none is an empty vector). If none
    /// is, first take in what the NIC has received, on this thread.
    pub fn poll(&self) -> Vec<Completion> {
        let mut out = Vec::new();
        self.poll_into(&mut out, usize::MAX);
        out
    }
    /// Move up to `max` of the completions waiting onto the end of `out`,
    /// oldest first, and say how many (`ibv_poll_cq` into the caller's
    /// array: once `out` has the room, nothing is allocated). If none is
    /// waiting, first take in what the NIC has received, on this thread.
    pub fn poll_into(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        if self.is_empty() {
            self.dev.engine.progress();
        }
        self.delivered.take_into(out, max)
    }

    /// Take the next completion waiting, if any (no allocation). If none
    /// is, first take in what the NIC has received, on this thread.
    pub fn try_next(&self) -> Option<Completion> {
        if let Some(c) = self.delivered.pop() {
            return Some(c);
        }
        self.dev.engine.progress();
        self.delivered.pop()
    }
    /// Poll until a completion arrives or `timeout` passes, never sleeping:
    /// the latency mode of perftest and of `rnic perf --lat`. It keeps a
    /// core busy, and the packets it waits for are taken in on this thread.
    pub fn spin(&self, timeout: Duration) -> Result<Completion> {
        let start = std::time::Instant::now();
        loop {
            if let Some(c) = self.try_next() {
                return Ok(c);
            }
            if start.elapsed() >= timeout {
                return Err(Error::Timeout);
            }
            std::hint::spin_loop();
        }
    }
    /// How many completions are waiting.
    pub fn len(&self) -> usize {
        self.delivered.len()
    }
    /// Whether none is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Wait up to `timeout` for one completion, sleeping while none comes.
    /// The thread sleeps on the device's socket as well, and takes in what
    /// arrives itself, as a wait on a completion channel does (one wake-up
    /// per completion, see [`CompletionChannel`]); signals do not end the
    /// wait.
    pub fn wait(&self, timeout: Duration) -> Result<Completion> {
        if let Some(c) = self.try_next() {
            return Ok(c);
        }
        let deadline = std::time::Instant::now() + timeout;
        let listening = self.delivered.listen()?;
        let delivered = &self.delivered;
        loop {
            if let Some(c) = delivered.pop() {
                return Ok(c);
            }
            let woken = self.dev.engine.drive(
                listening.fd(),
                Some(deadline),
                &self.busy_poll,
                &mut || delivered.len() > 0,
            )?;
            listening.clear();
            if woken == Woken::TimedOut {
                return delivered.pop().ok_or(Error::Timeout);
            }
        }
    }
}
