//! Shared receive queues: one queue of receives that several QPs take from,
//! and the limit event that tells the application it is running low.

use std::collections::VecDeque;

use crate::mem::PdHandle;
use crate::wr::RecvWr;

/// A shared receive queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrqHandle(pub u32);

/// An asynchronous event (`ibv_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// IBV_EVENT_SRQ_LIMIT_REACHED: fewer receives than the armed limit remain.
    /// The limit disarms itself; arm it again with `Nic::arm_srq`.
    SrqLimitReached(SrqHandle),
    /// IBV_EVENT_SQ_DRAINED: the QP (by number), moved to SQD with
    /// IBV_QP_EN_SQD_ASYNC_NOTIFY, has no request in flight any more: every
    /// message it had begun is sent and acknowledged (IBTA 11.6.3.3).
    SqDrained(u32),
    /// IBV_EVENT_CQ_ERR: the CQ overran; it takes no more completions.
    CqError(crate::cq::CqHandle),
    /// IBV_EVENT_QP_FATAL: the QP (by number) went to the error state
    /// because a CQ it completes into overran.
    QpFatal(u32),
}

#[derive(Debug)]
pub(crate) struct Srq {
    /// Its protection domain, which it counts as a user of.
    pub pd: PdHandle,
    /// QPs that take their receives from it: it cannot be destroyed while
    /// there are any.
    pub users: u32,
    pub queue: VecDeque<RecvWr>,
    pub max_wr: u32,
    pub max_sge: u32,
    /// Armed limit (`srq_limit`); 0 = not armed.
    pub limit: u32,
}

impl Srq {
    /// Take the next receive; `Some(event)` if that crossed the armed limit.
    pub fn take(&mut self, h: SrqHandle) -> (Option<RecvWr>, Option<AsyncEvent>) {
        let r = self.queue.pop_front();
        let mut event = None;
        if r.is_some() && self.limit > 0 && (self.queue.len() as u32) < self.limit {
            self.limit = 0;
            event = Some(AsyncEvent::SrqLimitReached(h));
        }
        (r, event)
    }
}
