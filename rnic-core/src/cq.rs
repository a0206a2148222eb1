//! Completion queues.

use std::collections::VecDeque;

use crate::wr::Completion;

/// A completion queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqHandle(pub u32);

/// A completion queue of bounded depth. An overrun is an error of the CQ
/// (IBTA 11.4.2.1; rdma_rxe's RESPST_ERR_CQ_OVERFLOW): the NIC raises
/// IBV_EVENT_CQ_ERR and moves the QPs that complete into it to the error
/// state. The completion that did not fit, and every one after, is counted.
#[derive(Debug)]
pub struct Cq {
    entries: VecDeque<Completion>,
    depth: usize,
    overruns: u64,
    error: bool,
    /// In its table's list of queues with completions to hand over (see
    /// [`CqTable::take_pending`]).
    listed: bool,
}

impl Cq {
    /// A queue holding up to `depth` completions.
    pub fn new(depth: usize) -> Cq {
        Cq {
            entries: VecDeque::new(),
            depth,
            overruns: 0,
            error: false,
            listed: false,
        }
    }

    /// Add a completion. True if it overran the queue for the first time:
    /// the CQ is now in error.
    pub fn push(&mut self, c: Completion) -> bool {
        if self.error || self.entries.len() >= self.depth {
            self.overruns += 1;
            return !std::mem::replace(&mut self.error, true);
        }
        self.entries.push_back(c);
        false
    }

    /// Remove the completions of QP `qpn` (a QP reset, as mlx5 cleans its
    /// CQs); how many there were.
    pub fn remove_qp(&mut self, qpn: u32) -> usize {
        let before = self.entries.len();
        self.entries.retain(|c| c.qp_num != qpn);
        before - self.entries.len()
    }

    /// Take up to `max` completions, oldest first.
    pub fn poll(&mut self, max: usize) -> Vec<Completion> {
        let n = max.min(self.entries.len());
        self.entries.drain(..n).collect()
    }

    /// Hand up to `max` completions to `each`, in order, without
    /// allocating; how many.
    pub fn drain_into(&mut self, max: usize, mut each: impl FnMut(Completion)) -> usize {
        let n = max.min(self.entries.len());
        for c in self.entries.drain(..n) {
            each(c);
        }
        n
    }

    /// Change the depth to `depth` (`ibv_resize_cq`). `outside` completions
    /// already handed on to the consumer but not yet taken by it count as
    /// waiting. Refused, and nothing changes, if more than `depth` are waiting.
    pub fn resize(&mut self, depth: usize, outside: usize) -> bool {
        if depth == 0 || self.entries.len() + outside > depth {
            return false;
        }
        self.depth = depth;
        true
    }

    /// The most completions it holds.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Drop the completions waiting beyond the first `keep`, as completions
    /// that found the queue full: they overrun it. True if this is the
    /// queue's first overrun (it is now in error).
    pub fn overrun_beyond(&mut self, keep: usize) -> bool {
        if self.entries.len() <= keep {
            return false;
        }
        self.overruns += (self.entries.len() - keep) as u64;
        self.entries.truncate(keep);
        !std::mem::replace(&mut self.error, true)
    }

    /// Completions that did not fit.
    pub fn overruns(&self) -> u64 {
        self.overruns
    }

    /// Completions waiting.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is waiting.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A NIC's completion queues, by handle. A destroyed queue's slot is
/// reused by the next one created, so the table is as long as the most
/// queues alive at once, however many come and go.
///
/// It lists the queues a completion went to since they were last taken
/// ([`CqTable::take_pending`]): a driver that hands completions over after
/// each batch of packets looks at those, not at every queue (a thousand
/// idle queues cost nothing per packet).
#[derive(Debug, Default)]
pub struct CqTable {
    slots: Vec<Option<Cq>>,
    /// Queues completions went to, each once, since last taken (a
    /// destroyed queue's handle may linger: looking it up finds nothing,
    /// or its slot's next queue).
    pending: Vec<CqHandle>,
}

impl CqTable {
    /// Put completion `c` on queue `h`: true if this is the queue's first
    /// overrun ([`Cq::push`]); false too if there is no such queue.
    pub fn complete(&mut self, h: CqHandle, c: Completion) -> bool {
        let Some(q) = self.get_mut(h) else {
            return false;
        };
        let overrun = q.push(c);
        if !q.listed && !q.entries.is_empty() {
            q.listed = true;
            self.pending.push(h);
        }
        overrun
    }

    /// Move the queues completions went to since the last call onto the
    /// end of `out`, each once: a queue a completion went to since it was
    /// last taken is among them.
    pub fn take_pending(&mut self, out: &mut Vec<CqHandle>) {
        let mut pending = std::mem::take(&mut self.pending);
        for h in pending.drain(..) {
            if let Some(q) = self.get_mut(h) {
                q.listed = false;
            }
            out.push(h);
        }
        self.pending = pending;
    }

    /// Add `cq`; its handle.
    pub fn insert(&mut self, cq: Cq) -> CqHandle {
        let i = crate::table::free_slot(&mut self.slots);
        self.slots[i] = Some(cq);
        CqHandle(i as u32)
    }

    /// Remove the queue `h`, if there is one.
    pub fn remove(&mut self, h: CqHandle) -> Option<Cq> {
        self.slots.get_mut(h.0 as usize).and_then(Option::take)
    }

    /// The queue `h`, if there is one.
    pub fn get(&self, h: CqHandle) -> Option<&Cq> {
        self.slots.get(h.0 as usize).and_then(Option::as_ref)
    }

    /// The queue `h`, if there is one.
    pub fn get_mut(&mut self, h: CqHandle) -> Option<&mut Cq> {
        self.slots.get_mut(h.0 as usize).and_then(Option::as_mut)
    }

    /// Slots the table holds, queues or free.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wr::{WcOpcode, WcStatus};

    fn done(wr_id: u64) -> Completion {
        Completion {
            wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm_data: None,
            qp_num: 1,
            src_qp: None,
            invalidated_rkey: None,
            network: None,
        }
    }

    #[test]
    fn the_table_lists_each_queue_a_completion_went_to_once() {
        let mut t = CqTable::default();
        let (a, b, idle) = (
            t.insert(Cq::new(8)),
            t.insert(Cq::new(8)),
            t.insert(Cq::new(8)),
        );
        let mut out = Vec::new();
        t.take_pending(&mut out);
        assert!(out.is_empty(), "nothing completed");
        assert!(!t.complete(a, done(1)));
        assert!(!t.complete(b, done(2)));
        assert!(!t.complete(a, done(3)));
        t.take_pending(&mut out);
        assert_eq!(out, [a, b], "each once, the idle queue not at all");
        out.clear();
        t.take_pending(&mut out);
        assert!(out.is_empty(), "taken");
        // Not yet drained, and completed again: listed again.
        assert!(!t.complete(b, done(4)));
        t.take_pending(&mut out);
        assert_eq!(out, [b]);
        assert_eq!(t.get(a).unwrap().len(), 2);
        assert_eq!(t.get(idle).unwrap().len(), 0);
        assert!(!t.complete(CqHandle(99), done(5)), "no such queue");
    }

    #[test]
    fn resizing_keeps_room_for_what_waits() {
        let mut q = Cq::new(4);
        for i in 0..3 {
            assert!(!q.push(done(i)));
        }
        // Three waiting here and one with the consumer: 3 is too small.
        assert!(!q.resize(3, 1));
        assert_eq!(q.depth(), 4);
        assert!(!q.resize(0, 0));
        assert!(q.resize(2 + 1, 0), "exactly the number waiting fits");
        assert!(q.push(done(3)), "the fourth overruns the new depth");
        let mut q = Cq::new(1);
        assert!(q.resize(8, 0));
        for i in 0..8 {
            assert!(!q.push(done(i)));
        }
        assert_eq!(q.poll(usize::MAX).len(), 8);
    }
}
