//! Completion queues.

use std::collections::VecDeque;

use crate::wr::Completion;

/// A completion queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqHandle(pub u32);

/// A completion queue of bounded depth. An overrun is an error of the CQ (as on
/// hardware, where it raises IBV_EVENT_CQ_ERR): the completion that did not fit
/// is counted, never silently lost.
#[derive(Debug)]
pub struct Cq {
    entries: VecDeque<Completion>,
    depth: usize,
    overruns: u64,
}

impl Cq {
    /// A queue holding up to `depth` completions.
    pub fn new(depth: usize) -> Cq {
        Cq {
            entries: VecDeque::new(),
            depth,
            overruns: 0,
        }
    }

    /// Add a completion.
    pub fn push(&mut self, c: Completion) {
        if self.entries.len() >= self.depth {
            self.overruns += 1;
        } else {
            self.entries.push_back(c);
        }
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
