//! Completions handed over to the program and not yet polled.
//!
//! A completion queue has a depth, and the NIC never hands over more than the
//! depth allows (the program's unpolled completions count against it, see
//! `Nic::deliver_cq`). So the queue is a ring that grows to the most the
//! program has ever left unpolled and then stays: once warm, delivering and
//! polling allocate nothing. (An unbounded channel allocates a block every
//! few dozen completions, forever.)

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use parking_lot::Mutex;
use rnic_core::wr::Completion;
use rustix::event::{eventfd, EventfdFlags};

/// The completions waiting for the program's poll, and a descriptor to
/// sleep on until one arrives (a thread that waits drives the engine, see
/// `engine::drive`, and sleeps on the socket too).
#[derive(Debug, Default)]
pub(crate) struct Delivered {
    queue: Mutex<VecDeque<Completion>>,
    /// Threads asleep on `bell`.
    ringing: AtomicUsize,
    /// Readable once a completion arrived for a thread asleep on it (made
    /// at the first such wait).
    bell: OnceLock<OwnedFd>,
}

/// A thread asleep on [`Delivered::bell`], until dropped.
pub(crate) struct Listening<'a> {
    delivered: &'a Delivered,
    bell: BorrowedFd<'a>,
}

impl Listening<'_> {
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.bell
    }

    /// Make the descriptor unreadable again, before looking at the queue.
    pub fn clear(&self) {
        let mut counter = [0u8; 8];
        let _ = rustix::io::read(self.bell, &mut counter);
    }
}

impl Drop for Listening<'_> {
    fn drop(&mut self) {
        self.delivered.ringing.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Delivered {
    /// Hand over completions: `deliver` gets how many are waiting unpolled
    /// and a place to put more, and returns how many it put there. Threads
    /// asleep on the bell ([`Delivered::listen`]) are woken if any arrived.
    pub(crate) fn deliver<R>(
        &self,
        deliver: impl FnOnce(usize, &mut dyn FnMut(Completion)) -> R,
    ) -> R {
        let mut q = self.queue.lock();
        let before = q.len();
        let r = deliver(before, &mut |c| q.push_back(c));
        if q.len() > before {
            drop(q);
            // After the push: a listener that said so before it looked at
            // the queue either saw the completion or is rung.
            if self.ringing.load(Ordering::SeqCst) > 0 {
                if let Some(b) = self.bell.get() {
                    let _ = rustix::io::write(b, &1u64.to_ne_bytes());
                }
            }
        }
        r
    }

    /// Sleep on a descriptor that becomes readable when a completion
    /// arrives, until the returned guard is dropped; look at the queue
    /// after this, not before.
    pub(crate) fn listen(&self) -> std::io::Result<Listening<'_>> {
        if self.bell.get().is_none() {
            let fd = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
            let _ = self.bell.set(fd);
        }
        let bell = self.bell.get().expect("set above").as_fd();
        self.ringing.fetch_add(1, Ordering::SeqCst);
        Ok(Listening {
            delivered: self,
            bell,
        })
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic_core::wr::{WcOpcode, WcStatus};
    use std::sync::Arc;

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

    /// The bell rings for a delivery while a thread listens, and stays
    /// quiet once nobody does (the engine thread pays no system call for
    /// a queue nobody sleeps on).
    #[test]
    fn the_bell_rings_for_a_delivery_while_someone_listens() {
        let readable = |fd: BorrowedFd<'_>| {
            let mut fds = [rustix::event::PollFd::from_borrowed_fd(
                fd,
                rustix::event::PollFlags::IN,
            )];
            let zero = rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            rustix::event::poll(&mut fds, Some(&zero)).unwrap() == 1
        };
        let d = Arc::new(Delivered::default());
        let l = d.listen().unwrap();
        assert!(!readable(l.fd()));
        let other = {
            let d = d.clone();
            std::thread::spawn(move || d.deliver(|_, put| put(completion(7))))
        };
        other.join().unwrap();
        assert!(readable(l.fd()), "rung");
        l.clear();
        assert!(!readable(l.fd()));
        assert_eq!(d.pop().map(|c| c.wr_id), Some(7));
        let fd = l.fd().try_clone_to_owned().unwrap();
        drop(l);
        d.deliver(|_, put| put(completion(8)));
        assert!(!readable(fd.as_fd()), "nobody listens: not rung");
    }
}
