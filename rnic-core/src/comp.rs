//! The completer: ACKs, NAKs, READ responses and atomic ACKs to completions, in
//! post order; retransmission on sequence-error NAKs, RNR NAKs and local ACK
//! timeouts, within retry_cnt and rnr_retry.

use rnic_wire::aeth::{self, NakCode, Syndrome};
use rnic_wire::{IbPacket, Operation, Psn};

use crate::qp::QpState;
use crate::rc::{scatter, Ctx, Qp, MAX_INFLIGHT_PKTS, RECOVERY_WINDOW};
use crate::time::{local_ack_timeout, Time};
use crate::wr::{SendOp, WcStatus};

impl Qp {
    /// A response packet (ACK, READ response, atomic ACK) arrived.
    pub(crate) fn comp_packet(&mut self, ctx: &mut Ctx<'_>, pkt: &IbPacket<&[u8]>) {
        if !matches!(self.state(), QpState::Rts | QpState::Sqd) || self.is_uc() {
            return;
        }
        let psn = pkt.bth().psn();
        let credits = pkt
            .aeth()
            .and_then(|a| match Syndrome::from_byte(a.syndrome()) {
                Syndrome::Ack { credits } => Some((a.msn(), credits)),
                _ => None,
            });
        // Only PSNs that were sent and not yet acknowledged mean anything; an
        // ACK for anything else (a ghost ACK, or a late duplicate) is ignored.
        let outstanding = self.max_sent.forward_from(self.una);
        if psn.forward_from(self.una) >= outstanding {
            // An ACK for the PSN just before `una` repeats what is known,
            // but for its credit count: a responder that re-ACKs a
            // duplicate may have had receives posted since (rdmavt takes
            // these too).
            if let (Some((msn, code)), true) = (credits, psn.next() == self.una) {
                if pkt.info().operation == Operation::Acknowledge {
                    self.take_credits(msn, code);
                }
            }
            ctx.counters.ghost_or_duplicate_response += 1;
            return;
        }
        if let Some((msn, code)) = credits {
            self.take_credits(msn, code);
        }
        // The responder is answering: whatever this packet completes, the
        // local ACK timer restarts (as rdma_rxe's completer re-arms it for
        // every response). A responder slower than its requester still
        // drains the responses it owed before a lost one when it is asked
        // again; a timeout in the middle of that would spend a retry while
        // answers arrive, one per timeout, until RETRY_EXC_ERR. The retry
        // budget itself is refilled only by progress.
        if self.ack_deadline.is_some() {
            self.arm_ack_timer(ctx);
        }
        match pkt.info().operation {
            Operation::Acknowledge => {
                let Some(a) = pkt.aeth() else { return };
                match Syndrome::from_byte(a.syndrome()) {
                    Syndrome::Ack { .. } => {
                        self.ack_through(ctx, psn);
                    }
                    Syndrome::RnrNak { timer } => self.on_rnr_nak(ctx, psn, timer),
                    Syndrome::Nak(NakCode::PsnSeqError) => self.on_seq_nak(ctx, psn),
                    Syndrome::Nak(code) => {
                        let status = match code {
                            NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                            _ => WcStatus::RemOpErr,
                        };
                        self.on_fatal_nak(ctx, psn, status);
                    }
                    Syndrome::Reserved(_) => self.on_fatal_nak(ctx, psn, WcStatus::BadRespErr),
                }
            }
            Operation::RdmaReadResponse => self.on_read_response(ctx, pkt, psn),
            Operation::AtomicAcknowledge => {
                let Some(ack) = pkt.atomic_ack_eth() else {
                    return;
                };
                let Some(i) = self.pending_wqe(psn) else {
                    return;
                };
                if !self.sq[i].wr.op.is_atomic() {
                    self.on_fatal_nak(ctx, psn, WcStatus::BadRespErr);
                    return;
                }
                if !self.ack_before(ctx, psn) {
                    return;
                }
                // Acknowledging what came before may have retired requests.
                let Some(i) = self.pending_wqe(psn) else {
                    return;
                };
                let orig = ack.orig_rem_dt().to_ne_bytes();
                let pd = self.pd;
                let result = scatter(ctx.mem, pd, &self.sq[i].wr.sg_list, 0, &orig);
                self.sq[i].status = Some(if result.is_ok() {
                    WcStatus::Success
                } else {
                    WcStatus::LocProtErr
                });
                self.una = psn.next();
                self.progress(ctx);
                if result.is_err() {
                    self.enter_error(ctx);
                }
            }
            _ => {}
        }
    }

    /// Everything through `psn` is acknowledged. Returns false if a READ or
    /// atomic before `psn` has not had its response: that response was lost or
    /// overtaken (UDP may reorder), which implies a NAK (IBTA 9.7.5.1.3): ask
    /// again from its first missing response, once per gap.
    fn ack_through(&mut self, ctx: &mut Ctx<'_>, psn: Psn) -> bool {
        for i in 0..self.sq.len() {
            let w = &self.sq[i];
            if w.status.is_some() {
                continue;
            }
            if w.first_psn.is_after(psn) {
                break;
            }
            if w.wr.op.is_read_or_atomic() {
                let missing = w.first_psn.add(w.resp_done);
                // Requests before the READ/atomic are acknowledged.
                let was_retrying = self.retry_started;
                if missing != self.una {
                    self.una = missing;
                    self.progress(ctx);
                }
                if !was_retrying {
                    self.retry_from(ctx, missing);
                }
                return false;
            }
            if !w.last_psn().is_after(psn) {
                self.sq[i].status = Some(WcStatus::Success);
            }
        }
        self.una = psn.next();
        self.progress(ctx);
        true
    }

    /// A response at `psn` implies everything before it was acknowledged;
    /// false if that cannot be (see [`Qp::ack_through`]).
    fn ack_before(&mut self, ctx: &mut Ctx<'_>, psn: Psn) -> bool {
        psn == self.una || self.ack_through(ctx, psn.sub(1))
    }

    /// Acknowledged progress: reset the retry budget and the timer, open the
    /// window, complete what can be completed.
    fn progress(&mut self, ctx: &mut Ctx<'_>) {
        if let Some((psn, sent, in_flight)) = self.rtt_probe {
            if !self.una.is_before(psn) {
                self.rtt_probe = None;
                self.round_trip(ctx, ctx.now.since(sent), in_flight);
            }
        }
        self.responder_heard();
        self.complete_front(ctx);
        // An ACK may overtake a go-back-N: the responder has what the
        // requester was about to resend. Go on from the first PSN it does
        // not have. Left behind `una`, the next packet would count as
        // 2^24 - k packets outstanding: a window full for ever.
        if self.first_psn_of_next().is_before(self.una) {
            self.go_back(self.una);
        }
        if self.una == self.max_sent || self.sq.is_empty() {
            self.ack_deadline = None;
        } else {
            self.arm_ack_timer(ctx);
        }
    }

    /// A round trip was timed, `in_flight` packets unacknowledged when it
    /// began. Whatever queue lies between this requester and its responder
    /// (a slow responder's socket, a VM's NIC), the window keeps its delay
    /// under a quarter of the local ACK timeout: when a packet is lost, the
    /// responder NAKs it once and drops the rest of the queue behind it, and
    /// the resent packet reaches it only after that queue. A queue longer
    /// than the timeout spends a retry per timeout while it drains, and
    /// retry_cnt of them fail a healthy connection (RETRY_EXC_ERR). Past the
    /// target, the window becomes what the responder took in the target's
    /// time (`in_flight` scaled by target / rtt); past half of it, the window
    /// grows by a packet per acknowledgement instead of doubling per round
    /// trip. TIMELY and Swift steer RDMA's windows by delay the same way.
    fn round_trip(&mut self, ctx: &mut Ctx<'_>, rtt: core::time::Duration, in_flight: u32) {
        let Some(timeout) = local_ack_timeout(self.attr.timeout) else {
            self.delay_high = false;
            return;
        };
        let target = timeout / 4;
        if rtt > target {
            let fits = u128::from(in_flight) * target.as_nanos() / rtt.as_nanos().max(1);
            let fits = u32::try_from(fits).unwrap_or(u32::MAX).max(RECOVERY_WINDOW);
            if fits < self.window {
                self.window = fits;
                ctx.counters.window_delay_cuts += 1;
            }
        }
        self.delay_high = rtt > target / 2;
    }

    /// The responder answered in sequence: the retry budget is whole again
    /// (retry_cnt counts retries in a row without an answer), the window
    /// opens by what was acknowledged, and a NAK or a gap may start a
    /// retransmission again.
    fn responder_heard(&mut self) {
        self.retry_left = self.attr.retry_cnt;
        self.rnr_left = self.attr.rnr_retry;
        self.retry_started = false;
        let acked = self.una.forward_from(self.heard_una).min(MAX_INFLIGHT_PKTS);
        self.heard_una = self.una;
        let grow = if self.delay_high { acked.min(1) } else { acked };
        self.window = (self.window + grow).min(MAX_INFLIGHT_PKTS);
    }

    /// Complete finished requests at the head of the send queue, in post order.
    pub(crate) fn complete_front(&mut self, ctx: &mut Ctx<'_>) {
        while let Some(w) = self.sq.front() {
            let Some(status) = w.status else { break };
            let Some(w) = self.sq.pop_front() else { break };
            if self.next_wqe == 0 {
                // The request the requester was (re)sending is retired before
                // it was resent in full (an ACK overtook a go-back-N): carry
                // on with the next request, from its first packet.
                self.next_pkt = 0;
            } else {
                self.next_wqe -= 1;
            }
            if status != WcStatus::Success || w.wr.signaled {
                ctx.complete(self.send_cq, self.send_completion(&w, status));
            }
        }
    }

    fn on_seq_nak(&mut self, ctx: &mut Ctx<'_>, psn: Psn) {
        ctx.counters.rcvd_seq_err += 1;
        if !self.ack_before(ctx, psn) {
            return;
        }
        // One go-back-N at a time (as rdma_rxe's started_retry): while the
        // retransmission is on its way, more NAKs for the same PSN say
        // nothing new. Without this, a sender of packets ahead of the
        // responder's PSN (each draws a NAK) spends the whole retry budget
        // while the retransmission is still in flight. The responder's
        // progress (an ACK, or a NAK further on) ends the retry; the local
        // ACK timer still retries if it is lost.
        if self.retry_started {
            ctx.counters.seq_nak_ignored += 1;
            return;
        }
        self.retry_from(ctx, psn);
    }

    fn on_rnr_nak(&mut self, ctx: &mut Ctx<'_>, psn: Psn, timer: u8) {
        ctx.counters.rcvd_rnr_err += 1;
        if !self.ack_before(ctx, psn) {
            return;
        }
        // rnr_retry 7 means retry forever (IBTA 9.7.5.2.8).
        if self.attr.rnr_retry != 7 {
            if self.rnr_left == 0 {
                ctx.counters.retry_rnr_exceeded_err += 1;
                self.fail_at(ctx, psn, WcStatus::RnrRetryExcErr);
                return;
            }
            self.rnr_left -= 1;
        }
        // Wait what the NAK's timer names (IBTA 9.7.5.2.8, table 45). The
        // QP's own min_rnr_timer is what its responder puts in the RNR NAKs
        // it sends; it has no say here.
        let wait = aeth::rnr_timer_micros(timer);
        let until = ctx.now + std::time::Duration::from_micros(u64::from(wait));
        self.rnr_until = Some(until);
        self.schedule(ctx, until);
        self.ack_deadline = None;
        self.go_back(psn);
    }

    fn on_fatal_nak(&mut self, ctx: &mut Ctx<'_>, psn: Psn, status: WcStatus) {
        // The NAK names the failed request; what came before it was executed.
        self.ack_before(ctx, psn);
        self.fail_at(ctx, psn, status);
    }

    /// The request holding `psn` fails with `status`; the QP enters the error state.
    fn fail_at(&mut self, ctx: &mut Ctx<'_>, psn: Psn, status: WcStatus) {
        // The request holding the PSN, or else the oldest unfinished one.
        let i = self
            .pending_wqe(psn)
            .or_else(|| self.sq.iter().position(|w| w.status.is_none()));
        if let Some(i) = i {
            self.sq[i].status = Some(status);
        }
        self.complete_front(ctx);
        self.enter_error(ctx);
    }

    /// Start a go-back-N retransmission from `psn`, spending one retry;
    /// false (and the QP in error) if none was left.
    fn retry_from(&mut self, ctx: &mut Ctx<'_>, psn: Psn) -> bool {
        if !self.spend_retry(ctx) {
            return false;
        }
        // A loss: half the window that lost it, as TCP halves its window.
        let in_flight = self.max_sent.forward_from(self.una);
        self.window = (in_flight / 2).clamp(RECOVERY_WINDOW, MAX_INFLIGHT_PKTS);
        self.retry_started = true;
        self.go_back(psn);
        true
    }

    /// Spend one retry; false (and the QP in error) if none was left.
    fn spend_retry(&mut self, ctx: &mut Ctx<'_>) -> bool {
        ctx.counters.completer_retry_err += 1;
        if self.retry_left == 0 {
            ctx.counters.retry_exceeded_err += 1;
            let una = self.una;
            self.fail_at(ctx, una, WcStatus::RetryExcErr);
            return false;
        }
        self.retry_left -= 1;
        true
    }

    fn on_read_response(&mut self, ctx: &mut Ctx<'_>, pkt: &IbPacket<&[u8]>, psn: Psn) {
        let Some(i) = self.pending_wqe(psn) else {
            return;
        };
        match self.sq[i].wr.op {
            SendOp::Read { .. } => {}
            SendOp::AtomicWrite { .. } | SendOp::Flush { .. } => {
                self.on_empty_read_response(ctx, pkt, psn);
                return;
            }
            _ => {
                self.on_fatal_nak(ctx, psn, WcStatus::BadRespErr);
                return;
            }
        }
        let expected = self.sq[i].first_psn.add(self.sq[i].resp_done);
        if psn != expected {
            // A response of this READ ahead of the one expected: the one
            // missing may only be late (UDP reorders; netem's reordering
            // lands inside nearly every 16-packet response), so it is
            // dropped and nothing is asked again yet, as rdma_rxe's
            // completer does (check_psn). A response to a later request
            // shows the loss (`ack_before` then asks again), and the local
            // ACK timer does if none comes. Asking again at once made
            // every reordered packet re-request all the READs in flight,
            // each time hundreds of responses, until the retries ran out.
            ctx.counters.read_response_out_of_order += 1;
            return;
        }
        if !self.ack_before(ctx, psn) {
            return;
        }
        // Acknowledging what came before may have retired requests.
        let Some(i) = self.pending_wqe(psn) else {
            return;
        };
        let pmtu = self.pmtu();
        let w = &self.sq[i];
        // A READ response (IBTA 9.4.3) begins with FIRST or ONLY
        // where the READ request asked from, goes on with MIDDLE, and ends
        // with LAST or ONLY. A response to a re-issued READ may instead go
        // on from MIDDLE (rdma_rxe replays a partial READ that way).
        let k = w.resp_done;
        let position = pkt.info().position;
        let final_packet = k + 1 == w.npkts;
        let fits = match position {
            rnic_wire::Position::First => k == w.read_start && !final_packet,
            rnic_wire::Position::Only => k == w.read_start && final_packet,
            rnic_wire::Position::Middle => k > 0 && !final_packet,
            rnic_wire::Position::Last => k > 0 && final_packet,
        };
        if !fits {
            ctx.counters.read_response_out_of_order += 1;
            return;
        }
        let offset = u64::from(w.resp_done) * pmtu;
        let want = (w.len - offset.min(w.len)).min(pmtu);
        let data = pkt.payload();
        if data.len() as u64 != want {
            self.fail_at(ctx, psn, WcStatus::BadRespErr);
            return;
        }
        let pd = self.pd;
        if scatter(ctx.mem, pd, &self.sq[i].wr.sg_list, offset, data).is_err() {
            self.fail_at(ctx, psn, WcStatus::LocProtErr);
            return;
        }
        let w = &mut self.sq[i];
        w.resp_done += 1;
        self.una = psn.next();
        if w.resp_done == w.npkts {
            w.status = Some(WcStatus::Success);
        }
        self.progress(ctx);
    }

    /// ATOMIC_WRITE and FLUSH are answered by one READ response with no data.
    fn on_empty_read_response(&mut self, ctx: &mut Ctx<'_>, pkt: &IbPacket<&[u8]>, psn: Psn) {
        if !self.ack_before(ctx, psn) {
            return;
        }
        let Some(i) = self.pending_wqe(psn) else {
            return;
        };
        if !pkt.payload().is_empty() || pkt.info().position != rnic_wire::Position::Only {
            self.fail_at(ctx, psn, WcStatus::BadRespErr);
            return;
        }
        self.sq[i].status = Some(WcStatus::Success);
        self.una = psn.next();
        self.progress(ctx);
    }

    /// The local ACK timer or the RNR wait may have expired.
    pub(crate) fn comp_timeout(&mut self, ctx: &mut Ctx<'_>) {
        if let Some(t) = self.ack_deadline {
            if ctx.now >= t {
                self.ack_deadline = None;
                let sending = matches!(self.state(), QpState::Rts | QpState::Sqd);
                if self.una != self.max_sent && sending {
                    let una = self.una;
                    if !self.retry_from(ctx, una) {
                        return;
                    }
                    self.window = RECOVERY_WINDOW;
                    self.arm_ack_timer(ctx);
                }
            }
        }
    }

    /// When this QP next needs the time.
    pub(crate) fn deadline(&self) -> Option<Time> {
        match (self.ack_deadline, self.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
