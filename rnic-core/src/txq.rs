//! The NIC's transmit queue: the datagrams built and not yet handed to the
//! transport, in order.
//!
//! Each datagram gets a sequence number, its place in everything the NIC
//! has queued since it began. A responder QP keeps the number of the plain
//! ACK it queued last, and while that ACK still waits here, a newer ACK
//! withdraws it and goes to the back instead: an ACK acknowledges every
//! PSN up to its own (the IBTA lets a responder coalesce acknowledgments),
//! so the newer one says everything the older said. A stream of small WRITEs
//! whose every message asks for an ACK (as rdma_rxe's and rnic's
//! requesters ask) then answers a batch received together with one ACK,
//! not one per message, as hardware responders do.

use std::collections::VecDeque;

use crate::datagram::Datagram;

/// The transmit queue (see the module's documentation).
#[derive(Debug, Default)]
pub(crate) struct TxQueue {
    /// Withdrawn datagrams leave a `None` in their place, skipped when it
    /// comes to the front.
    q: VecDeque<Option<Datagram>>,
    /// Entries taken off the front so far: the sequence number of `q[0]`.
    taken: u64,
    /// The `None`s in `q`.
    withdrawn: usize,
}

impl TxQueue {
    /// Queue `d` at the back; its sequence number.
    pub fn push(&mut self, d: Datagram) -> u64 {
        self.q.push_back(Some(d));
        self.taken + (self.q.len() as u64 - 1)
    }

    /// The datagram at the front.
    pub fn pop(&mut self) -> Option<Datagram> {
        loop {
            let entry = self.q.pop_front()?;
            self.taken += 1;
            match entry {
                Some(d) => return Some(d),
                None => self.withdrawn -= 1,
            }
        }
    }

    /// Take datagram `seq` out if it still waits: its buffer, for reuse.
    pub fn withdraw(&mut self, seq: u64) -> Option<Vec<u8>> {
        let at = usize::try_from(seq.checked_sub(self.taken)?).ok()?;
        let d = self.q.get_mut(at)?.take()?;
        self.withdrawn += 1;
        Some(d.payload)
    }

    /// Datagrams waiting.
    pub fn len(&self) -> usize {
        self.q.len() - self.withdrawn
    }

    /// The datagrams waiting, front first.
    pub fn iter(&self) -> impl Iterator<Item = &Datagram> {
        self.q.iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::{IpAddr, Ipv4Addr};

    fn d(tag: u8) -> Datagram {
        let a = IpAddr::V4(Ipv4Addr::LOCALHOST);
        Datagram::new(a, a, 4791, vec![tag])
    }

    fn tags(q: &TxQueue) -> Vec<u8> {
        q.iter().map(|d| d.payload[0]).collect()
    }

    #[test]
    fn a_withdrawn_datagram_is_never_handed_out_and_a_sent_one_cannot_be_withdrawn() {
        let mut q = TxQueue::default();
        let s: Vec<u64> = (1..=4).map(|t| q.push(d(t))).collect();
        assert_eq!(s, [0, 1, 2, 3]);
        assert_eq!(q.withdraw(1), Some(vec![2]));
        assert_eq!(q.withdraw(1), None, "once");
        assert_eq!((q.len(), tags(&q)), (3, vec![1, 3, 4]));
        assert_eq!(q.pop().map(|d| d.payload), Some(vec![1]));
        // The withdrawn one is skipped; the numbers go on past it.
        assert_eq!(q.pop().map(|d| d.payload), Some(vec![3]));
        assert_eq!(q.withdraw(0), None, "sent");
        assert_eq!(q.withdraw(2), None, "sent");
        assert_eq!(q.push(d(5)), 4);
        assert_eq!(q.withdraw(4), Some(vec![5]));
        assert_eq!(q.withdraw(9), None, "never queued");
        assert_eq!((q.len(), tags(&q)), (1, vec![4]));
        assert_eq!(q.pop().map(|d| d.payload), Some(vec![4]));
        assert!(q.pop().is_none());
        assert_eq!((q.len(), q.q.len()), (0, 0));
        assert_eq!(q.push(d(6)), 5);
    }
}
