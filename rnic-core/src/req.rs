//! The requester: send work requests to packets (PMTU segmentation, RETH on
//! the first packet, AckReq on the last), and go-back-N.

use rnic_wire::{atomic_eth, feth, ieth, immdt, reth, IbRepr, Opcode, Psn};

use crate::qp::{QpState, QpType};
use crate::rc::{gather_wr, Ctx, Qp, ACK_EVERY, NIC_INFLIGHT_PKTS, REQUEST_BURST};
use crate::srq::AsyncEvent;
use crate::time::{local_ack_timeout, Time};
use crate::wr::{SendOp, WcStatus};

impl Qp {
    /// Send what the window and the NIC's budget allow, and count what is
    /// now unacknowledged towards the budget.
    pub(crate) fn req_poll(&mut self, ctx: &mut Ctx<'_>) {
        self.send_what_fits(ctx);
        self.recount(ctx);
    }

    /// Packets sent and not yet acknowledged (up to where sending resumes).
    /// Only RC waits for acknowledgements; UC and UD count nothing.
    fn outstanding(&self) -> u32 {
        match self.state() {
            QpState::Rts | QpState::Sqd if self.qp_type == QpType::Rc => {
                self.first_psn_of_next().forward_from(self.una)
            }
            _ => 0,
        }
    }

    /// Bring this QP's part of the NIC's in-flight count up to date.
    pub(crate) fn recount(&mut self, ctx: &mut Ctx<'_>) {
        let now = self.outstanding();
        *ctx.inflight = ctx
            .inflight
            .saturating_sub(self.counted)
            .saturating_add(now);
        self.counted = now;
    }

    fn send_what_fits(&mut self, ctx: &mut Ctx<'_>) {
        let draining = match self.state() {
            QpState::Rts => false,
            QpState::Sqd => true,
            _ => return,
        };
        if let Some(t) = self.rnr_until {
            if ctx.now < t {
                return;
            }
            self.rnr_until = None;
        }
        // What the other QPs have in flight leaves this one the rest.
        let others = ctx.inflight.saturating_sub(self.counted);
        let budget = NIC_INFLIGHT_PKTS.saturating_sub(others);
        // Where sending stops: the packet that reaches it asks for an ACK.
        let limit = self.window.min(budget);
        while self.next_wqe < self.sq.len() {
            if ctx.tx.len() >= REQUEST_BURST {
                // The rest as the transport takes these: packets are built
                // as they leave, not a whole window ahead of them.
                self.mark_busy(ctx);
                break;
            }
            let outstanding = self.first_psn_of_next().forward_from(self.una);
            if outstanding >= self.window {
                break;
            }
            if outstanding >= budget {
                if !self.starved {
                    self.starved = true;
                    ctx.starved.push_back(self.qpn);
                }
                break;
            }
            let w = &self.sq[self.next_wqe];
            // SQD (IBTA 10.3.1): messages already begun are finished, and
            // resent if need be; none is begun.
            if draining && self.next_pkt == 0 && !w.first_psn.is_before(self.max_sent) {
                break;
            }
            if w.status.is_some() {
                // A local operation already done, passed over by go-back-N.
                self.next_wqe += 1;
                self.next_pkt = 0;
                continue;
            }
            if w.wr.fence && self.next_pkt == 0 {
                let unfinished = self
                    .sq
                    .iter()
                    .take(self.next_wqe)
                    .any(|w| w.wr.op.is_read_or_atomic() && w.status.is_none());
                if unfinished {
                    break;
                }
            }
            if w.wr.op.is_read_or_atomic() {
                let pending = self
                    .sq
                    .iter()
                    .take(self.next_wqe)
                    .filter(|w| w.wr.op.is_read_or_atomic() && w.status.is_none())
                    .count();
                if pending >= usize::from(self.attr.max_rd_atomic.max(1)) {
                    break;
                }
            }
            // A message begun for the first time (not resent by go-back-N).
            let begins = !w.wr.op.is_local()
                && self.next_pkt == 0
                && !w.first_psn.is_before(self.max_sent)
                && self.qp_type == QpType::Rc;
            let op = w.wr.op;
            if begins && !self.credits_allow(op) {
                if !self.credit_wait {
                    self.credit_wait = true;
                    ctx.counters.credit_waits += 1;
                }
                break;
            }
            let sent = if op.is_local() {
                self.exec_local(ctx)
            } else {
                // With other QPs sending, the last packet of this turn asks
                // too: the QP sends on only when the others have had
                // theirs. (Alone, it sends on as soon as the transport
                // has taken the burst, and asks every ACK_EVERY packets.)
                let ends_burst =
                    ctx.tx.len() + 1 >= REQUEST_BURST && (others > 0 || !ctx.busy.is_empty());
                self.send_next_packet(ctx, limit, ends_burst)
            };
            if !sent {
                break;
            }
            if begins {
                self.begin_message(op);
            }
        }
        if self.ack_deadline.is_none() && self.una != self.first_psn_of_next() {
            self.arm_ack_timer(ctx);
        }
        if draining && !self.sq_drained && self.una == self.max_sent && self.next_pkt == 0 {
            self.sq_drained = true;
            if self.attr.en_sqd_async_notify {
                ctx.events.push_back(AsyncEvent::SqDrained(self.qpn));
            }
        }
    }

    /// Whether the responder's end-to-end credits let message `op` begin
    /// now (IBTA 9.7.7.2): always for one that takes no receive WQE; for
    /// one that does, while its SSN is at most one beyond the limit
    /// (rdmavt's rule: the one beyond it asks for a new count), or when
    /// nothing is outstanding, so that a responder whose count the
    /// requester cannot follow still gets one message at a time.
    fn credits_allow(&self, op: SendOp) -> bool {
        if self.credits_unlimited || !op.consumes_recv() {
            return true;
        }
        let ssn = self.ssn.next();
        !ssn.is_after(self.lsn.next()) || self.una == self.max_sent
    }

    /// Message `op` has begun: it takes the next SSN; one that takes no
    /// receive WQE moves the limit on with it (the responder's MSN will
    /// count it, and its credits do not).
    fn begin_message(&mut self, op: SendOp) {
        self.ssn = self.ssn.next();
        self.credit_wait = false;
        if !self.credits_unlimited && !op.consumes_recv() {
            self.lsn = self.lsn.next();
        }
    }

    /// What an ACK's AETH says of the responder's receive queue: `msn`
    /// and the credit count `code` (IBTA 9.7.7.2.5). The limit only moves
    /// on: an ACK overtaken by a later one says less.
    pub(crate) fn take_credits(&mut self, msn: u32, code: u8) {
        match rnic_wire::aeth::decode_credits(code) {
            None => self.credits_unlimited = true,
            Some(n) => {
                let limit = Psn::new(msn).add(n);
                if limit.is_after(self.lsn) {
                    self.lsn = limit;
                }
            }
        }
    }

    /// The PSN of the next packet to send.
    pub(crate) fn first_psn_of_next(&self) -> Psn {
        match self.sq.get(self.next_wqe) {
            Some(w) => w.first_psn.add(self.next_pkt),
            None => self.sq_psn,
        }
    }

    pub(crate) fn arm_ack_timer(&mut self, ctx: &mut Ctx<'_>) {
        self.ack_deadline = local_ack_timeout(self.attr.timeout).map(|d| ctx.now + d);
        if let Some(t) = self.ack_deadline {
            self.schedule(ctx, t);
        }
    }

    /// A deadline at `t` was set: make sure the NIC's timers hold an entry
    /// for this QP no later than it (one earlier is moved when it comes up).
    pub(crate) fn schedule(&mut self, ctx: &mut Ctx<'_>, t: Time) {
        if self.timer_at.is_none_or(|e| t < e) {
            ctx.timers.push(core::cmp::Reverse((t, self.qpn)));
            self.timer_at = Some(t);
        }
    }

    /// Carry out the local operation `sq[next_wqe]` (BIND_MW, LOCAL_INV) where
    /// the send queue reaches it: requests before it have been sent, requests
    /// after it are not. It completes in post order like any other. False if
    /// it failed (the QP is then in the error state).
    fn exec_local(&mut self, ctx: &mut Ctx<'_>) -> bool {
        let idx = self.next_wqe;
        let result = match self.sq[idx].wr.op {
            SendOp::LocalInv { rkey } => ctx
                .mem
                .invalidate(rkey, self.pd, None)
                .map_err(|_| WcStatus::LocQpOpErr),
            SendOp::BindMw(b) => ctx
                .mem
                .bind_mw(self.pd, self.qpn, &b)
                .map(|_| ())
                .map_err(|_| WcStatus::MwBindErr),
            _ => Err(WcStatus::LocQpOpErr),
        };
        match result {
            Ok(()) => {
                self.sq[idx].status = Some(WcStatus::Success);
                self.next_wqe += 1;
                self.next_pkt = 0;
                self.complete_front(ctx);
                true
            }
            Err(status) => {
                self.fail_local(ctx, idx, status);
                false
            }
        }
    }

    /// Send the next packet of `sq[next_wqe]`, `limit` being the most
    /// packets the window and the NIC's budget let this QP have
    /// unacknowledged now; false if the request failed locally.
    fn send_next_packet(&mut self, ctx: &mut Ctx<'_>, limit: u32, ends_burst: bool) -> bool {
        let pmtu = self.pmtu();
        let idx = self.next_wqe;
        let k = self.next_pkt;
        let (op, len, first_psn, npkts, solicited) = {
            let w = &self.sq[idx];
            (w.wr.op, w.len, w.first_psn, w.npkts, w.wr.solicited)
        };
        let psn = first_psn.add(k);
        let offset = u64::from(k) * pmtu;
        let last = k + 1 == npkts;
        let mut ib;
        // Where the payload comes from: written into the packet as it is
        // built, straight from the registered memory.
        let mut payload = Payload::None;
        match op {
            SendOp::Send { .. } | SendOp::SendWithInv { .. } | SendOp::Write { .. } => {
                let (imm, inv) = match op {
                    SendOp::Send { imm } | SendOp::Write { imm, .. } => (imm, None),
                    SendOp::SendWithInv { invalidate_rkey } => (None, Some(invalidate_rkey)),
                    _ => (None, None),
                };
                let take = (len - offset).min(pmtu) as usize;
                payload = Payload::Gather { offset };
                let is_write = matches!(op, SendOp::Write { .. });
                let opcode = match (is_write, k == 0, last, imm.is_some()) {
                    (false, true, true, false) => Opcode::RC_SEND_ONLY,
                    (false, true, true, true) => Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
                    (false, true, false, _) => Opcode::RC_SEND_FIRST,
                    (false, false, false, _) => Opcode::RC_SEND_MIDDLE,
                    (false, false, true, false) => Opcode::RC_SEND_LAST,
                    (false, false, true, true) => Opcode::RC_SEND_LAST_WITH_IMMEDIATE,
                    (true, true, true, false) => Opcode::RC_RDMA_WRITE_ONLY,
                    (true, true, true, true) => Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
                    (true, true, false, _) => Opcode::RC_RDMA_WRITE_FIRST,
                    (true, false, false, _) => Opcode::RC_RDMA_WRITE_MIDDLE,
                    (true, false, true, false) => Opcode::RC_RDMA_WRITE_LAST,
                    (true, false, true, true) => Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
                };
                let opcode = match (inv, opcode) {
                    (Some(_), Opcode::RC_SEND_ONLY) => Opcode::RC_SEND_ONLY_WITH_INVALIDATE,
                    (Some(_), Opcode::RC_SEND_LAST) => Opcode::RC_SEND_LAST_WITH_INVALIDATE,
                    _ => opcode,
                };
                // UC opcodes are the RC ones in the UC transport (0x20 up).
                let opcode = if self.is_uc() {
                    Opcode(opcode.0 | 0x20)
                } else {
                    opcode
                };
                ib = IbRepr::new(self.bth(opcode, psn));
                if let SendOp::Write {
                    remote_addr, rkey, ..
                } = op
                {
                    if k == 0 {
                        ib.reth = Some(reth::Repr {
                            va: remote_addr,
                            r_key: rkey,
                            dma_length: len as u32,
                        });
                    }
                }
                if last {
                    ib.immdt = imm.map(|immediate| immdt::Repr { immediate });
                    ib.ieth = inv.map(|r_key| ieth::Repr { r_key });
                }
                ib.bth.solicited = last && solicited;
                // UC has no acknowledgements to ask for. The packet that
                // fills the window, or the NIC's budget, asks too: nothing
                // more goes out until an ACK comes (a window shrunk by a
                // timeout is smaller than ACK_EVERY; and with a thousand
                // QPs sharing the budget, each has a few packets of a
                // message out: without the ask none was acknowledged, the
                // budget stayed spent, and every QP timed out).
                let fills_window = psn.next().forward_from(self.una) >= limit;
                ib.bth.ack_req = (last || (k + 1) % ACK_EVERY == 0 || fills_window || ends_burst)
                    && !self.is_uc();
                ib.payload_len = take;
            }
            SendOp::Read { remote_addr, rkey } => {
                // A re-issued READ asks only for what is still missing.
                self.sq[idx].read_start = k;
                ib = IbRepr::new(self.bth(Opcode::RC_RDMA_READ_REQUEST, psn));
                ib.reth = Some(reth::Repr {
                    va: remote_addr.wrapping_add(offset),
                    r_key: rkey,
                    dma_length: (len - offset.min(len)) as u32,
                });
                ib.bth.ack_req = true;
            }
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                ib = IbRepr::new(self.bth(Opcode::RC_COMPARE_SWAP, psn));
                ib.atomic_eth = Some(atomic_eth::Repr {
                    va: remote_addr,
                    r_key: rkey,
                    swap_or_add_data: swap,
                    compare_data: compare,
                });
                ib.bth.ack_req = true;
            }
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                ib = IbRepr::new(self.bth(Opcode::RC_FETCH_ADD, psn));
                ib.atomic_eth = Some(atomic_eth::Repr {
                    va: remote_addr,
                    r_key: rkey,
                    swap_or_add_data: add,
                    compare_data: 0,
                });
                ib.bth.ack_req = true;
            }
            SendOp::AtomicWrite {
                remote_addr,
                rkey,
                data,
            } => {
                ib = IbRepr::new(self.bth(Opcode::RC_ATOMIC_WRITE, psn));
                ib.reth = Some(reth::Repr {
                    va: remote_addr,
                    r_key: rkey,
                    dma_length: 8,
                });
                payload = Payload::Word(data);
                ib.payload_len = 8;
                ib.bth.ack_req = true;
            }
            SendOp::Flush {
                remote_addr,
                rkey,
                len,
                placement,
                whole_region,
            } => {
                ib = IbRepr::new(self.bth(Opcode::RC_FLUSH, psn));
                ib.feth = Some(feth::Repr {
                    sel: u8::from(whole_region),
                    plt: placement,
                });
                ib.reth = Some(reth::Repr {
                    va: remote_addr,
                    r_key: rkey,
                    dma_length: len,
                });
                ib.bth.ack_req = true;
            }
            SendOp::LocalInv { .. } | SendOp::BindMw(_) => {
                return self.exec_local(ctx);
            }
        }
        match payload {
            Payload::None => self.transmit(ctx, &ib, &[]),
            Payload::Word(w) => self.transmit(ctx, &ib, &w),
            Payload::Gather { offset } => {
                let (pd, wr) = (self.pd, &self.sq[idx].wr);
                let filled =
                    self.transmit_with(ctx, &ib, |mem, p| gather_wr(mem, pd, wr, offset, p));
                if filled.is_err() {
                    self.fail_local(ctx, idx, WcStatus::LocProtErr);
                    return false;
                }
            }
        }
        let end = if op.is_read_or_atomic() {
            first_psn.add(npkts)
        } else {
            psn.next()
        };
        if end.is_after(self.max_sent) {
            // Sent for the first time: it may time a round trip (a resent
            // one never does).
            if self.rtt_probe.is_none() && self.qp_type == QpType::Rc {
                self.rtt_probe = Some((end, ctx.now, end.forward_from(self.una)));
            }
            self.max_sent = end;
        }
        if op.is_read_or_atomic() || last {
            self.next_wqe += 1;
            self.next_pkt = 0;
        } else {
            self.next_pkt += 1;
        }
        if self.is_uc() {
            // Nothing will acknowledge it: a UC request is done once sent.
            self.una = end;
            if last {
                self.sq[idx].status = Some(WcStatus::Success);
                self.complete_front(ctx);
            }
        }
        true
    }

    /// A request failed before reaching the wire: it completes with `status`
    /// and the QP enters the error state (RC), or the send queue error state
    /// (UC, whose receive side is independent of its send side).
    fn fail_local(&mut self, ctx: &mut Ctx<'_>, idx: usize, status: WcStatus) {
        self.sq[idx].status = Some(status);
        // Requests before it that are already acknowledged complete first.
        self.complete_front(ctx);
        if self.is_uc() {
            self.enter_sqe(ctx);
        } else {
            self.enter_error(ctx);
        }
    }

    /// Go back to `psn`: resend from the request that holds it (go-back-N).
    pub(crate) fn go_back(&mut self, psn: Psn) {
        self.rtt_probe = None;
        if let Some(i) = self.pending_wqe(psn) {
            let w = &self.sq[i];
            self.next_wqe = i;
            self.next_pkt = if w.wr.op.is_read_or_atomic() {
                // A READ restarts at the first response not received.
                if matches!(w.wr.op, SendOp::Read { .. }) {
                    w.resp_done
                } else {
                    0
                }
            } else {
                psn.forward_from(w.first_psn)
            };
        }
    }
}

/// The payload of a request packet being built.
enum Payload {
    /// None (READ and atomic requests, FLUSH).
    None,
    /// The 8 bytes of an ATOMIC WRITE.
    Word([u8; 8]),
    /// The work request's data from `offset` (its gather list, or the
    /// bytes posted inline), as many as the packet carries.
    Gather { offset: u64 },
}
