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
}

impl Cq {
    /// A queue holding up to `depth` completions.
    pub fn new(depth: usize) -> Cq {
        Cq {
            entries: VecDeque::new(),
            depth,
            overruns: 0,
            error: false,
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

    /// Take up to `max` completions, oldest first.
    pub fn poll(&mut self, max: usize) -> Vec<Completion> {
        let n = max.min(self.entries.len());
        self.entries.drain(..n).collect()
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
