//! What leaves the NIC and when: the transmit queue, the bursts of READ
//! responses and requests it generates as the transport takes what is
//! queued, and the timers.

use crate::datagram::Datagram;
use crate::time::Time;

use super::{Nic, RESPONSE_BURST};

impl Nic {
    /// Hand back a sent datagram's buffer for the NIC to build a later
    /// packet in (at most [`POOL`](crate::pool::POOL) are kept).
    pub fn recycle(&mut self, buf: Vec<u8>) {
        self.pool.keep(buf);
    }

    /// How many datagrams [`Nic::poll_transmit`] has ready, or `None` while
    /// READ responses or requests wait to be generated there too: what a
    /// transport that holds a few datagrams back to send them in one system
    /// call asks.
    pub fn queued_datagrams(&self) -> Option<usize> {
        self.busy.is_empty().then_some(self.tx.len())
    }

    /// The next datagram to send. READ responses are generated here, a
    /// burst per QP in turn, as the caller takes them: a READ of any length
    /// holds no more than a burst of packets in memory.
    pub fn poll_transmit(&mut self) -> Option<Datagram> {
        loop {
            if let Some(d) = self.poll_built() {
                return Some(d);
            }
            if !self.generate_burst() {
                return None;
            }
        }
    }

    /// The datagrams built and not yet handed out, in order.
    pub fn queued(&self) -> impl Iterator<Item = &Datagram> {
        self.tx.iter()
    }

    /// The next datagram already built (requests, ACKs, responses
    /// generated so far), generating nothing: with
    /// [`Nic::generate_burst`], what a transport that paces what the NIC
    /// builds calls instead of [`Nic::poll_transmit`].
    pub fn poll_built(&mut self) -> Option<Datagram> {
        self.tx.pop()
    }

    /// Whether READ responses or requests wait to be generated.
    pub fn more_to_build(&self) -> bool {
        !self.busy.is_empty()
    }

    /// Generate the next QP's burst (in turn): at most [`RESPONSE_BURST`]
    /// READ response packets, then the requests it has room for (up to
    /// `REQUEST_BURST` queued), for [`Nic::poll_built`] to hand out. False
    /// if no QP waits.
    pub fn generate_burst(&mut self) -> bool {
        let Some(qpn) = self.busy.pop_front() else {
            return false;
        };
        let now = self.now;
        let (qps, mut ctx) = self.parts(now);
        if let Some(qp) = qps.get_mut(qpn) {
            qp.busy = false;
            qp.generate_responses(&mut ctx, RESPONSE_BURST);
            qp.req_poll(&mut ctx);
        }
        self.drop_stale_timers();
        true
    }

    /// The time is `now`: run expired timers.
    pub fn handle_timeout(&mut self, now: Time) {
        self.settled(|nic| nic.handle_timeout_inner(now));
    }

    pub(super) fn handle_timeout_inner(&mut self, now: Time) {
        self.gsi_timeout(now);
        // The due entries, earliest first (the same order on every replay);
        // a QP is served once however many entries it has.
        let mut due = Vec::new();
        while let Some(&core::cmp::Reverse((t, qpn))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            if let Some(qp) = self.qps.get_mut(qpn) {
                if qp.timer_at == Some(t) {
                    qp.timer_at = None;
                }
            }
            if !due.contains(&qpn) {
                due.push(qpn);
            }
        }
        let (qps, mut ctx) = self.parts(now);
        for qpn in due {
            let Some(qp) = qps.get_mut(qpn) else { continue };
            if qp.deadline().is_some_and(|t| t <= now) {
                qp.comp_timeout(&mut ctx);
                qp.req_poll(&mut ctx);
            }
            // An entry that came up early, or a deadline left: its entry.
            if let Some(t) = qp.deadline() {
                qp.schedule(&mut ctx, t);
            }
        }
    }

    /// Make the front of the timers exact: pop entries whose QP is gone,
    /// has no deadline, or holds another entry, and move one that is early
    /// to its QP's deadline.
    pub(super) fn drop_stale_timers(&mut self) {
        while let Some(&core::cmp::Reverse((t, qpn))) = self.timers.peek() {
            let Some(qp) = self.qps.get_mut(qpn) else {
                self.timers.pop();
                continue;
            };
            if qp.timer_at != Some(t) {
                self.timers.pop();
                continue;
            }
            match qp.deadline() {
                Some(d) if d == t => break,
                Some(d) => {
                    self.timers.pop();
                    self.timers.push(core::cmp::Reverse((d, qpn)));
                    qp.timer_at = Some(d);
                }
                None => {
                    self.timers.pop();
                    qp.timer_at = None;
                }
            }
        }
    }

    /// When [`Nic::handle_timeout`] must next be called: the front of the
    /// timers, not a walk over the QPs.
    pub fn next_deadline(&self) -> Option<Time> {
        let qps = self.timers.peek().map(|&core::cmp::Reverse((t, _))| t);
        match (qps, self.gsi_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Timer entries held, live and stale (a diagnostic: it stays near the
    /// number of QPs with a deadline).
    pub fn timer_entries(&self) -> usize {
        self.timers.len()
    }
}
