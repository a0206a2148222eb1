//! The responder: request packets to memory and ACKs. PSN classification
//! (expected, duplicate, ahead) with one sequence-error NAK per gap; duplicates
//! re-ACKed, duplicate READs re-executed, duplicate atomics answered from a
//! replay cache; receive-not-ready NAKs; rkey, PD, access and bounds checks
//! with the IBTA NAK codes, writing nothing on failure.

use rnic_wire::aeth::{NakCode, Syndrome};
use rnic_wire::{aeth, atomic_ack_eth, IbPacket, IbRepr, Opcode, Operation, Position, Psn};

use crate::mem::{Access, MemError};
use crate::qp::QpState;
use crate::rc::{
    scatter, sg_len, Ctx, ExecKind, Execution, InMsg, Qp, RdAtomic, ReadStream, Response,
};
use crate::wr::{Completion, WcOpcode, WcStatus};

/// Why a request was refused.
enum Refusal {
    /// NAK with this code; the QP enters the error state.
    Nak(NakCode),
    /// The receive the SEND landed in cannot hold it: NAK remote operational
    /// error; the receive completes with this status (LOC_LEN_ERR when the
    /// message is longer than the buffers, LOC_PROT_ERR when a buffer's
    /// L_Key, PD, rights or bounds are wrong) and the QP enters the error state.
    BadReceive(WcStatus),
    /// No receive posted: RNR NAK, try again later.
    NotReady,
}

impl From<MemError> for Refusal {
    fn from(e: MemError) -> Refusal {
        match e {
            MemError::Misaligned { .. } => Refusal::Nak(NakCode::InvalidRequest),
            _ => Refusal::Nak(NakCode::RemoteAccessError),
        }
    }
}

impl Qp {
    /// A request packet arrived.
    pub(crate) fn resp_packet(&mut self, ctx: &mut Ctx<'_>, pkt: &IbPacket<&[u8]>) {
        if !matches!(
            self.state(),
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            return;
        }
        let psn = pkt.bth().psn();
        if self.is_uc() {
            self.resp_uc(ctx, pkt, psn);
            return;
        }
        let d = psn.diff(self.epsn);
        if d > 0 {
            ctx.counters.out_of_seq_request += 1;
            if !self.seq_nak_sent {
                self.seq_nak_sent = true;
                let epsn = self.epsn;
                self.send_ack(ctx, Syndrome::Nak(NakCode::PsnSeqError), epsn);
            }
            return;
        }
        if d < 0 && ctx.mechanisms.duplicate_detection {
            ctx.counters.duplicate_request += 1;
            self.duplicate(ctx, pkt, psn);
            return;
        }
        self.seq_nak_sent = false;
        match self.execute(ctx, pkt, psn) {
            Ok(()) => {}
            Err(Refusal::NotReady) => {
                ctx.counters.send_rnr_err += 1;
                let timer = self.attr.min_rnr_timer;
                self.send_ack(ctx, Syndrome::RnrNak { timer }, psn);
            }
            Err(Refusal::BadReceive(status)) => {
                self.refuse(ctx, psn, NakCode::RemoteOperationalError, status)
            }
            Err(Refusal::Nak(code)) => self.refuse(ctx, psn, code, WcStatus::LocQpOpErr),
        }
    }

    /// A request at `psn` is refused (a class A or C error): NAK it with
    /// `code`, complete the receive a SEND in progress had taken with
    /// `status`, and enter the error state.
    fn refuse(&mut self, ctx: &mut Ctx<'_>, psn: Psn, code: NakCode, status: WcStatus) {
        self.send_ack(ctx, Syndrome::Nak(code), psn);
        if let Some(InMsg::Send { recv, .. }) = self.in_msg.take() {
            let c = self.recv_completion(recv.wr_id, status);
            ctx.complete(self.recv_cq, c);
        }
        self.enter_error(ctx);
    }

    /// UC (IBTA 9.8.3): no acknowledgements and no retransmission. A PSN gap
    /// drops the message it falls in (its receive, if any, serves the next
    /// message); the responder takes up again at the next FIRST or ONLY
    /// packet. A request it cannot carry out is dropped, silently.
    fn resp_uc(&mut self, ctx: &mut Ctx<'_>, pkt: &IbPacket<&[u8]>, psn: Psn) {
        if psn != self.epsn {
            ctx.counters.out_of_seq_request += 1;
            self.abort_message(ctx);
        }
        self.epsn = psn.next();
        let starts = pkt.info().position.starts_message();
        if starts && self.in_msg.is_some() {
            // The LAST of the previous message was lost.
            self.abort_message(ctx);
        }
        if !starts && self.in_msg.is_none() {
            return; // the rest of a message already dropped
        }
        if self.execute(ctx, pkt, psn).is_err() {
            if self.in_msg.is_some() {
                self.abort_message(ctx);
            } else {
                ctx.counters.uc_dropped += 1;
            }
        }
    }

    /// Drop the message in progress; a receive it had taken goes back first in line.
    fn abort_message(&mut self, ctx: &mut Ctx<'_>) {
        if let Some(m) = self.in_msg.take() {
            ctx.counters.uc_dropped += 1;
            if let InMsg::Send { recv, .. } = m {
                self.return_recv(ctx, recv);
            }
        }
    }

    fn duplicate(&mut self, ctx: &mut Ctx<'_>, pkt: &IbPacket<&[u8]>, psn: Psn) {
        match pkt.info().operation {
            Operation::RdmaReadRequest => {
                let Some(r) = pkt.reth() else { return };
                let (va, len, rkey) = (r.va(), u64::from(r.dma_length()), r.r_key());
                let pmtu = self.pmtu();
                // rdma_rxe's duplicate_request: the READ this PSN belongs to,
                // asked again in whole or in part (same R_Key, a range inside
                // the original), and its responses must fit the original's
                // PSNs; anything else is dropped (a class D error).
                let origin = self.rd_atomic.iter().find_map(|e| match *e {
                    RdAtomic::Read {
                        psn: p,
                        npkts,
                        va: va0,
                        len: len0,
                        rkey: rkey0,
                    } => {
                        let k = psn.forward_from(p);
                        let fits = k < npkts
                            && rkey == rkey0
                            && va >= va0
                            && va.checked_add(len).is_some_and(|end| end <= va0 + len0)
                            && u64::from(k) + len.div_ceil(pmtu).max(1) <= u64::from(npkts);
                        fits.then_some(p)
                    }
                    _ => None,
                });
                let Some(origin) = origin else {
                    ctx.counters.duplicate_read_refused += 1;
                    return;
                };
                // Re-execute: READ has no side effect at the responder.
                // The range was readable the first time; if it is not now
                // (deregistered meanwhile), answer as for a new request.
                if let Err(Refusal::Nak(code)) =
                    self.read_reply(ctx, origin, psn, va, rkey, len, true)
                {
                    self.send_ack(ctx, Syndrome::Nak(code), psn);
                }
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                // Never executed twice: the saved result, with its MSN.
                let saved = self.rd_atomic.iter().find_map(|e| match *e {
                    RdAtomic::Atomic { psn: p, orig, msn } if p == psn => Some((orig, msn)),
                    _ => None,
                });
                match saved {
                    Some((orig, msn)) if ctx.mechanisms.atomic_replay_cache => {
                        self.atomic_ack(ctx, psn, orig, msn)
                    }
                    // Without the cache: execute it again (what the cache prevents).
                    Some(_) => {
                        let _ = self.execute_atomic(ctx, pkt, psn, true);
                    }
                    None => {}
                }
            }
            Operation::AtomicWrite | Operation::Flush => {
                let saved = self.rd_atomic.iter().find_map(|e| match *e {
                    RdAtomic::Placed { psn: p, msn } if p == psn => Some(msn),
                    _ => None,
                });
                let again = !ctx.mechanisms.atomic_replay_cache
                    && pkt.info().operation == Operation::AtomicWrite;
                match saved {
                    Some(_) if again => {
                        let _ = self.exec_atomic_write(ctx, pkt, psn, true);
                    }
                    Some(msn) => self.empty_read_response(ctx, psn, msn),
                    None => {}
                }
            }
            _ => {
                if pkt.bth().ack_req() {
                    // Say again that the SENDs and WRITEs are done, up to
                    // the last one: never with the PSN of a READ or atomic
                    // done since. A plain ACK must not cover a READ whose
                    // responses may still be on their way: rdma_rxe's
                    // completer takes an ACK with a READ's last PSN as that
                    // READ's completion, data missing (its own responder
                    // re-ACKs with the same PSN as here, its ack_psn).
                    let last = self.ack_psn.sub(1);
                    let syndrome = self.ack_syndrome(ctx);
                    self.send_ack(ctx, syndrome, last);
                }
            }
        }
    }

    fn execute(
        &mut self,
        ctx: &mut Ctx<'_>,
        pkt: &IbPacket<&[u8]>,
        psn: Psn,
    ) -> Result<(), Refusal> {
        let info = pkt.info();
        let pmtu = self.pmtu();
        let payload = pkt.payload();
        let position = info.position;
        // Packets of a multi-packet message carry exactly a PMTU, except the last.
        let full = matches!(position, Position::First | Position::Middle);
        if (full && payload.len() as u64 != pmtu) || payload.len() as u64 > pmtu {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }
        // A message in progress must be continued by its MIDDLE/LAST packets.
        let continues = matches!(position, Position::Middle | Position::Last);
        match (&self.in_msg, continues) {
            (Some(InMsg::Send { .. }), true) if info.operation == Operation::Send => {}
            (Some(InMsg::Write { .. }), true) if info.operation == Operation::RdmaWrite => {}
            (None, false) => {}
            _ => return Err(Refusal::Nak(NakCode::InvalidRequest)),
        }
        let takes_resource = matches!(
            info.operation,
            Operation::RdmaReadRequest
                | Operation::CompareSwap
                | Operation::FetchAdd
                | Operation::AtomicWrite
                | Operation::Flush
        );
        if takes_resource && self.attr.max_dest_rd_atomic == 0 {
            // No responder resources to hold it (IBTA 9.7.5.2.4 class C; as
            // rdma_rxe's check_resource): an invalid request.
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }
        // C9-94: no DMA length beyond 2^31 (rdma_rxe check_length).
        if pkt.reth().is_some_and(|r| r.dma_length() > 1 << 31) {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }
        match info.operation {
            Operation::Send => self.exec_send(ctx, pkt, psn)?,
            Operation::RdmaWrite => self.exec_write(ctx, pkt, psn)?,
            Operation::RdmaReadRequest => {
                if !self.attr.qp_access_flags.contains(Access::REMOTE_READ) {
                    return Err(Refusal::Nak(NakCode::InvalidRequest));
                }
                let r = pkt.reth().ok_or(Refusal::Nak(NakCode::InvalidRequest))?;
                let (va, len, rkey) = (r.va(), u64::from(r.dma_length()), r.r_key());
                let npkts = self.read_reply(ctx, psn, psn, va, rkey, len, false)?;
                self.remember(RdAtomic::Read {
                    psn,
                    npkts,
                    va,
                    len,
                    rkey,
                });
                self.msn = self.msn.wrapping_add(1);
                self.epsn = psn.add(npkts);
                return Ok(());
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                return self.execute_atomic(ctx, pkt, psn, false);
            }
            Operation::AtomicWrite => return self.exec_atomic_write(ctx, pkt, psn, false),
            Operation::Flush => return self.exec_flush(ctx, pkt, psn),
            _ => return Err(Refusal::Nak(NakCode::InvalidRequest)),
        }
        self.epsn = psn.next();
        self.ack_psn = self.epsn;
        if pkt.bth().ack_req() && !self.is_uc() {
            let syndrome = self.ack_syndrome(ctx);
            self.send_ack(ctx, syndrome, psn);
        }
        Ok(())
    }

    fn exec_send(
        &mut self,
        ctx: &mut Ctx<'_>,
        pkt: &IbPacket<&[u8]>,
        psn: Psn,
    ) -> Result<(), Refusal> {
        let info = pkt.info();
        if self.in_msg.is_none() {
            let recv = self.take_recv(ctx).ok_or(Refusal::NotReady)?;
            self.in_msg = Some(InMsg::Send {
                recv,
                offset: 0,
                first_psn: psn,
                data: Vec::new(),
            });
        }
        let Some(InMsg::Send {
            recv, offset, data, ..
        }) = &mut self.in_msg
        else {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        };
        let payload = pkt.payload();
        if *offset + payload.len() as u64 > sg_len(&recv.sg_list) {
            // The SEND is longer than the receive buffer (rdma_rxe NAKs 0x63).
            return Err(Refusal::BadReceive(WcStatus::LocLenErr));
        }
        let pd = self.pd;
        scatter(ctx.mem, pd, &recv.sg_list, *offset, payload)
            .map_err(|_| Refusal::BadReceive(WcStatus::LocProtErr))?;
        *offset += payload.len() as u64;
        if ctx.exec_log.is_some() {
            data.extend_from_slice(payload);
        }
        if info.position.ends_message() {
            let Some(InMsg::Send {
                recv,
                offset,
                first_psn,
                data,
            }) = self.in_msg.take()
            else {
                return Ok(());
            };
            let invalidated_rkey = pkt.ieth().map(|i| i.r_key());
            let mut status = WcStatus::Success;
            if let Some(rkey) = invalidated_rkey {
                // SEND_WITH_INV: the window must be this QP's (IBTA 10.6.7).
                if ctx.mem.invalidate(rkey, self.pd, Some(self.qpn)).is_err() {
                    // The data is in place; the receive completes in error
                    // (the status rdma_rxe gives it) and the request is NAKed.
                    status = WcStatus::RemInvReqErr;
                }
            }
            if status == WcStatus::Success {
                self.msn = self.msn.wrapping_add(1);
                ctx.counters.rdma_recvs += 1;
                self.log(ctx, first_psn, ExecKind::Send { data });
            }
            ctx.complete(
                self.recv_cq,
                Completion {
                    byte_len: offset as u32,
                    imm_data: pkt.immdt().map(|i| i.immediate()),
                    invalidated_rkey,
                    ..self.recv_completion(recv.wr_id, status)
                },
            );
            if status != WcStatus::Success {
                return Err(Refusal::Nak(NakCode::InvalidRequest));
            }
        }
        Ok(())
    }

    fn exec_write(
        &mut self,
        ctx: &mut Ctx<'_>,
        pkt: &IbPacket<&[u8]>,
        psn: Psn,
    ) -> Result<(), Refusal> {
        let info = pkt.info();
        if !self.attr.qp_access_flags.contains(Access::REMOTE_WRITE) {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }
        // WRITE with immediate consumes a receive: check before writing anything.
        if info.has_immediate() && self.recvs_available(ctx) == 0 {
            return Err(Refusal::NotReady);
        }
        if self.in_msg.is_none() {
            let r = pkt.reth().ok_or(Refusal::Nak(NakCode::InvalidRequest))?;
            let len = u64::from(r.dma_length());
            // A zero-length WRITE names no memory: its R_Key is not checked.
            if len > 0 {
                ctx.mem.check_remote(
                    r.r_key(),
                    self.pd,
                    self.qpn,
                    r.va(),
                    len,
                    Access::REMOTE_WRITE,
                )?;
            }
            self.in_msg = Some(InMsg::Write {
                va: r.va(),
                rkey: r.r_key(),
                remaining: len,
                first_psn: psn,
                data: Vec::new(),
                start_va: r.va(),
                length: len,
            });
        }
        let Some(InMsg::Write {
            va,
            rkey,
            remaining,
            data,
            ..
        }) = &mut self.in_msg
        else {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        };
        let payload = pkt.payload();
        let n = payload.len() as u64;
        let ends = info.position.ends_message();
        if n > *remaining || (ends && n != *remaining) {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }
        if n > 0 {
            let span =
                ctx.mem
                    .check_remote(*rkey, self.pd, self.qpn, *va, n, Access::REMOTE_WRITE)?;
            ctx.mem.write(span, payload);
        }
        *va = va.wrapping_add(n);
        *remaining -= n;
        if ctx.exec_log.is_some() {
            data.extend_from_slice(payload);
        }
        if ends {
            let Some(InMsg::Write {
                first_psn,
                data,
                start_va,
                length,
                ..
            }) = self.in_msg.take()
            else {
                return Ok(());
            };
            self.msn = self.msn.wrapping_add(1);
            self.log(ctx, first_psn, ExecKind::Write { va: start_va, data });
            if let Some(imm) = pkt.immdt() {
                if let Some(recv) = self.take_recv(ctx) {
                    ctx.complete(
                        self.recv_cq,
                        Completion {
                            opcode: WcOpcode::RecvRdmaWithImm,
                            byte_len: length as u32,
                            imm_data: Some(imm.immediate()),
                            ..self.recv_completion(recv.wr_id, WcStatus::Success)
                        },
                    );
                }
            }
        }
        Ok(())
    }

    /// Execute an atomic and answer it. `again` (only with the replay cache
    /// switched off) re-executes a duplicate.
    fn execute_atomic(
        &mut self,
        ctx: &mut Ctx<'_>,
        pkt: &IbPacket<&[u8]>,
        psn: Psn,
        again: bool,
    ) -> Result<(), Refusal> {
        if !self.attr.qp_access_flags.contains(Access::REMOTE_ATOMIC) {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }
        let a = pkt
            .atomic_eth()
            .ok_or(Refusal::Nak(NakCode::InvalidRequest))?;
        let span =
            ctx.mem
                .check_atomic(a.r_key(), self.pd, self.qpn, a.va(), Access::REMOTE_ATOMIC)?;
        let orig = ctx.mem.read_u64(span);
        let new = if pkt.info().operation == Operation::FetchAdd {
            orig.wrapping_add(a.swap_or_add_data())
        } else if orig == a.compare_data() {
            a.swap_or_add_data()
        } else {
            orig
        };
        ctx.mem.write_u64(span, new);
        self.log(
            ctx,
            psn,
            ExecKind::Atomic {
                va: a.va(),
                orig,
                new,
            },
        );
        let msn = self.consume(psn, again);
        self.remember(RdAtomic::Atomic { psn, orig, msn });
        self.atomic_ack(ctx, psn, orig, msn);
        Ok(())
    }

    /// ATOMIC_WRITE: 8 bytes stored at once at an aligned address, answered
    /// by an empty READ response and kept for duplicates, which are answered
    /// again and never re-executed (`again` only with the replay cache off).
    fn exec_atomic_write(
        &mut self,
        ctx: &mut Ctx<'_>,
        pkt: &IbPacket<&[u8]>,
        psn: Psn,
        again: bool,
    ) -> Result<(), Refusal> {
        if !self.attr.qp_access_flags.contains(Access::REMOTE_WRITE) {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }
        let r = pkt.reth().ok_or(Refusal::Nak(NakCode::InvalidRequest))?;
        let data = pkt.payload();
        if data.len() != 8 || r.dma_length() != 8 {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }
        let span =
            ctx.mem
                .check_atomic(r.r_key(), self.pd, self.qpn, r.va(), Access::REMOTE_WRITE)?;
        ctx.mem.write(span, data);
        let kind = ExecKind::Write {
            va: r.va(),
            data: data.to_vec(),
        };
        self.log(ctx, psn, kind);
        self.placed(ctx, psn, again);
        Ok(())
    }

    /// FLUSH (IBTA 1.5 memory placement extensions): every earlier request
    /// has already been carried out into memory, so global visibility holds
    /// as it arrives; persistence asks the memory to persist the range.
    fn exec_flush(
        &mut self,
        ctx: &mut Ctx<'_>,
        pkt: &IbPacket<&[u8]>,
        psn: Psn,
    ) -> Result<(), Refusal> {
        let invalid = Refusal::Nak(NakCode::InvalidRequest);
        let (Some(f), Some(r)) = (pkt.feth(), pkt.reth()) else {
            return Err(invalid);
        };
        let mut needed = Access::NONE;
        for (bit, right) in [(1, Access::FLUSH_GLOBAL), (2, Access::FLUSH_PERSISTENT)] {
            if f.plt() & bit != 0 {
                needed = needed | right;
            }
        }
        if f.plt() & !3 != 0 || f.sel() > 1 || !self.attr.qp_access_flags.contains(needed) {
            return Err(invalid);
        }
        let (va, len) = if f.sel() == 1 {
            ctx.mem.extent(r.r_key(), self.pd, self.qpn)?
        } else {
            (r.va(), u64::from(r.dma_length()))
        };
        if len > 0 {
            let span = ctx
                .mem
                .check_remote(r.r_key(), self.pd, self.qpn, va, len, needed)?;
            if needed.contains(Access::FLUSH_PERSISTENT) && !ctx.mem.persist(span) {
                return Err(Refusal::Nak(NakCode::RemoteOperationalError));
            }
        }
        self.log(ctx, psn, ExecKind::Flush { va, len });
        self.placed(ctx, psn, false);
        Ok(())
    }

    /// A one-packet request at `psn` that takes a responder resource is
    /// done: count it and expect the next PSN, unless it was a re-execution
    /// (`again`). Returns the MSN to answer with.
    fn consume(&mut self, psn: Psn, again: bool) -> u32 {
        if !again {
            self.msn = self.msn.wrapping_add(1);
            self.epsn = psn.next();
        }
        self.msn
    }

    /// ATOMIC_WRITE or FLUSH at `psn` is done: remember it and answer.
    fn placed(&mut self, ctx: &mut Ctx<'_>, psn: Psn, again: bool) {
        let msn = self.consume(psn, again);
        self.remember(RdAtomic::Placed { psn, msn });
        self.empty_read_response(ctx, psn, msn);
    }

    /// The answer to ATOMIC_WRITE and FLUSH: a READ response with no data.
    fn empty_read_response(&mut self, ctx: &mut Ctx<'_>, psn: Psn, msn: u32) {
        let mut ib = IbRepr::new(self.bth(Opcode::RC_RDMA_READ_RESPONSE_ONLY, psn));
        ib.aeth = Some(aeth::Repr {
            syndrome: self.ack_syndrome(ctx),
            msn: msn & 0xFF_FFFF,
        });
        self.respond(ctx, &ib, &[]);
    }

    /// Answer a READ of `len` bytes at `va` from PSN `psn`, for the READ
    /// that began at `origin` (itself, unless `duplicate`): check the whole
    /// range now, then queue the response to be generated a packet at a
    /// time as the transmit queue takes it ([`Qp::generate_responses`]).
    /// A duplicate restarts its READ's response if that is still queued,
    /// rather than queueing a second; a new READ beyond max_dest_rd_atomic
    /// responses in progress is an invalid request. Returns the number of
    /// response packets.
    #[allow(clippy::too_many_arguments)]
    fn read_reply(
        &mut self,
        ctx: &mut Ctx<'_>,
        origin: Psn,
        psn: Psn,
        va: u64,
        rkey: u32,
        len: u64,
        duplicate: bool,
    ) -> Result<u32, Refusal> {
        if len > 0 {
            ctx.mem
                .check_remote(rkey, self.pd, self.qpn, va, len, Access::REMOTE_READ)?;
        }
        let npkts = len.div_ceil(self.pmtu()).max(1) as u32;
        let stream = ReadStream {
            origin,
            psn,
            va,
            remaining: len,
            rkey,
            first: true,
            msn: if duplicate {
                self.msn
            } else {
                self.msn.wrapping_add(1)
            },
            again: duplicate,
        };
        let mut streams = self.responses.iter_mut().filter_map(|r| match r {
            Response::Read(s) => Some(s),
            Response::Ready { .. } => None,
        });
        if duplicate {
            if let Some(s) = streams.find(|s| s.origin == origin) {
                *s = stream;
                self.log(ctx, psn, ExecKind::Read { va, len, duplicate });
                return Ok(npkts);
            }
        } else if streams.count() >= usize::from(self.attr.max_dest_rd_atomic) {
            // A READ answered again after its original was answered in
            // full holds no resource: the requester may have taken the
            // original's responses since (they were late, not lost) and
            // sent new READs up to its limit. The oldest such answer makes
            // room (the requester completes READs in PSN order: if any of
            // them is done with, the oldest is), as rdma_rxe recycles its
            // oldest resource. Beyond that, more READs in progress than
            // this responder granted the requester (IBTA 9.7.5.2.4 class C).
            let epsn = self.epsn;
            let again = self
                .responses
                .iter()
                .enumerate()
                .filter_map(|(i, r)| match r {
                    Response::Read(s) if s.again => Some((s.origin.diff(epsn), i)),
                    _ => None,
                })
                .min()
                .map(|(_, i)| i);
            match again {
                Some(i) => {
                    self.responses.remove(i);
                }
                None => return Err(Refusal::Nak(NakCode::InvalidRequest)),
            }
        }
        self.log(ctx, psn, ExecKind::Read { va, len, duplicate });
        self.responses.push_back(Response::Read(stream));
        self.mark_busy(ctx);
        Ok(npkts)
    }

    /// Generate up to `budget` READ response packets (and the responses
    /// queued behind them) into the transmit queue; the QP goes back in the
    /// busy list if more remain. Each packet reads memory through the R_Key
    /// again (as rdma_rxe's rxe_recheck_mr): if the region went away
    /// meanwhile, the READ is NAKed with a remote access error there.
    pub(crate) fn generate_responses(&mut self, ctx: &mut Ctx<'_>, budget: usize) {
        let pmtu = self.pmtu();
        let mut sent = 0;
        while sent < budget {
            let Some(front) = self.responses.front_mut() else {
                return;
            };
            let s = match front {
                Response::Ready { .. } => {
                    if let Some(Response::Ready { d, .. }) = self.responses.pop_front() {
                        ctx.send(d);
                    }
                    continue;
                }
                Response::Read(s) => s,
            };
            let take = s.remaining.min(pmtu);
            let last = take == s.remaining;
            let opcode = match (s.first, last) {
                (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
            };
            let stream = *s;
            let mut span = None;
            if take > 0 {
                match ctx.mem.check_remote(
                    stream.rkey,
                    self.pd,
                    self.qpn,
                    stream.va,
                    take,
                    Access::REMOTE_READ,
                ) {
                    Ok(s) => span = Some(s),
                    Err(_) => {
                        self.responses.clear();
                        let code = NakCode::RemoteAccessError;
                        self.send_ack(ctx, Syndrome::Nak(code), stream.psn);
                        self.enter_error(ctx);
                        return;
                    }
                }
            }
            let mut ib = IbRepr::new(self.bth(opcode, stream.psn));
            if opcode
                .info()
                .is_some_and(|i| i.has(rnic_wire::ExtHeader::Aeth))
            {
                ib.aeth = Some(aeth::Repr {
                    syndrome: self.ack_syndrome(ctx),
                    msn: stream.msn & 0xFF_FFFF,
                });
            }
            ib.payload_len = take as usize;
            // Read from the region straight into the packet.
            let read = |mem: &crate::mem::Memory, p: &mut [u8]| {
                if let Some(span) = span {
                    mem.read(span, p);
                }
                Ok::<(), core::convert::Infallible>(())
            };
            if let Err(never) = self.transmit_with(ctx, &ib, read) {
                match never {}
            }
            sent += 1;
            if last {
                self.responses.pop_front();
            } else if let Some(Response::Read(s)) = self.responses.front_mut() {
                s.psn = s.psn.next();
                s.va = s.va.wrapping_add(take);
                s.remaining -= take;
                s.first = false;
            }
        }
        if !self.responses.is_empty() {
            self.mark_busy(ctx);
        }
    }

    fn atomic_ack(&mut self, ctx: &mut Ctx<'_>, psn: Psn, orig: u64, msn: u32) {
        let mut ib = IbRepr::new(self.bth(Opcode::RC_ATOMIC_ACKNOWLEDGE, psn));
        ib.aeth = Some(aeth::Repr {
            syndrome: self.ack_syndrome(ctx),
            msn: msn & 0xFF_FFFF,
        });
        ib.atomic_ack_eth = Some(atomic_ack_eth::Repr { orig_rem_dt: orig });
        self.respond(ctx, &ib, &[]);
    }

    fn remember(&mut self, e: RdAtomic) {
        self.rd_atomic.push_back(e);
        while self.rd_atomic.len() > usize::from(self.attr.max_dest_rd_atomic.max(1)) {
            self.rd_atomic.pop_front();
        }
    }

    fn log(&self, ctx: &mut Ctx<'_>, psn: Psn, kind: ExecKind) {
        if let Some(log) = ctx.exec_log {
            log.push(Execution {
                qpn: self.qpn,
                psn,
                kind,
            });
        }
    }
}
