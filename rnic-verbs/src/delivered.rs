//! Completions handed over to the program and not yet polled.
//!
//! A completion queue has a depth, and the NIC never hands over more than the
//! depth allows (the program's unpolled completions count against it, see
//! `Nic::deliver_cq`). So the queue is a ring that grows to the most the
//! program has ever left unpolled and then stays: once warm, delivering and
//! polling allocate nothing. (An unbounded channel allocates a block every
//! few dozen completions, forever.)

use std::collections::VecDeque;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use rnic_core::wr::Completion;

/// The completions waiting for the program's poll, and a way to sleep until
/// one arrives.
#[derive(Debug, Default)]
pub(crate) struct Delivered {
    queue: Mutex<VecDeque<Completion>>,
    arrived: Condvar,
}

impl Delivered {
    /// Hand over completions: `deliver` gets how many are waiting unpolled
    /// and a place to put more, and returns how many it put there. Sleepers
    /// in [`Delivered::wait_until`] are woken if any arrived.
    pub(crate) fn deliver<R>(
        &self,
        deliver: impl FnOnce(usize, &mut dyn FnMut(Completion)) -> R,
    ) -> R {
        let mut q = self.queue.lock();
        let before = q.len();
        let r = deliver(before, &mut |c| q.push_back(c));
        if q.len() > before {
            self.arrived.notify_all();
        }
        r
    }

    /// The oldest waiting completion.
    pub(crate) fn pop(&self) -> Option<Completion> {
        self.queue.lock().pop_front()
    }

    /// Remove those of QP `qpn`.
    pub(crate) fn remove_qp(&self, qpn: u32) {
        self.queue.lock().retain(|c| c.qp_num != qpn);
    }

    /// How many are waiting.
    pub(crate) fn len(&self) -> usize {
        self.queue.lock().len()
    }

    /// Move up to `max` of the oldest onto the end of `out`; how many.
    pub(crate) fn take_into(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        let mut q = self.queue.lock();
        let n = q.len().min(max);
        out.extend(q.drain(..n));
        n
    }

    /// The oldest waiting completion, sleeping until `deadline` for one.
    pub(crate) fn wait_until(&self, deadline: Instant) -> Option<Completion> {
        let mut q = self.queue.lock();
        loop {
            if let Some(c) = q.pop_front() {
                return Some(c);
            }
            if self.arrived.wait_until(&mut q, deadline).timed_out() {
                return q.pop_front();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic_core::wr::{WcOpcode, WcStatus};
    use std::sync::Arc;
    use std::time::Duration;

    fn completion(wr_id: u64) -> Completion {
        Completion {
            wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::RdmaWrite,
            byte_len: 0,
            imm_data: None,
            qp_num: 0x11,
            src_qp: None,
            invalidated_rkey: None,
            network: None,
        }
    }

    #[test]
    fn delivery_sees_what_is_waiting_and_polls_come_out_in_order() {
        let d = Delivered::default();
        let n = d.deliver(|waiting, put| {
            assert_eq!(waiting, 0);
            (1..=3).for_each(|i| put(completion(i)));
            3
        });
        assert_eq!(n, 3);
        d.deliver(|waiting, _| assert_eq!(waiting, 3));
        assert_eq!(d.pop().map(|c| c.wr_id), Some(1));
        assert_eq!(d.len(), 2);
        let mut rest = Vec::new();
        assert_eq!(d.take_into(&mut rest, usize::MAX), 2);
        let rest: Vec<u64> = rest.iter().map(|c| c.wr_id).collect();
        assert_eq!(rest, [2, 3]);
        assert_eq!(d.pop(), None);
    }

    #[test]
    fn a_sleeper_wakes_for_a_delivery_and_times_out_without_one() {
        let d = Arc::new(Delivered::default());
        let start = Instant::now();
        assert_eq!(d.wait_until(start + Duration::from_millis(20)), None);
        assert!(start.elapsed() >= Duration::from_millis(20));
        // Woken by the delivery, not by its deadline: the deadline is far.
        let deadline = Instant::now() + Duration::from_secs(20);
        let sleeper = {
            let d = d.clone();
            std::thread::spawn(move || (d.wait_until(deadline), Instant::now()))
        };
        std::thread::sleep(Duration::from_millis(20));
        d.deliver(|_, put| put(completion(7)));
        let (got, woke) = sleeper.join().unwrap();
        assert_eq!(got.map(|c| c.wr_id), Some(7));
        assert!(
            woke + Duration::from_secs(10) < deadline,
            "slept to the deadline"
        );
    }
}
