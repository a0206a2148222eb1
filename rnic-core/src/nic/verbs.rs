//! The NIC's control verbs: protection domains, memory regions and
//! windows, completion queues, queue pairs and their state machine, shared
//! receive queues, and the asynchronous events they raise.

use std::collections::VecDeque;

use rnic_wire::Psn;

use crate::cq::{Cq, CqHandle, CqTable};
use crate::device::DEVICE_ATTR;
use crate::error::VerbError;
use crate::mem::{Access, MrKeys, PdHandle, Region};
use crate::qp::{self, AttrMask, QpAttr, QpState, QpType, QpView};
use crate::rc::{Qp, QpCaps};
use crate::srq::{AsyncEvent, Srq, SrqHandle};
use crate::table::free_slot;
use crate::time::Time;
use crate::wr::Completion;

use super::Nic;

/// Take QP `qp`'s unpolled completions out of its CQs, as mlx5 cleans its
/// CQs when a QP is reset or destroyed (mlx5_cq_clean).
fn remove_completions(cqs: &mut CqTable, qp: &Qp) {
    for h in [qp.send_cq, qp.recv_cq] {
        if let Some(q) = cqs.get_mut(h) {
            q.remove_qp(qp.qpn);
        }
    }
}

impl Nic {
    /// Take a QP from RESET to RTS with the three `ibv_modify_qp` calls of
    /// rdma-core's pingpong programs, the values from `attr`. RC
    /// (`ibv_rc_pingpong`): INIT with P_Key index, port and access flags; RTR
    /// with address vector, path MTU, destination QP, receive PSN,
    /// max_dest_rd_atomic and min_rnr_timer; RTS with send PSN, timeout,
    /// retry_cnt, rnr_retry and max_rd_atomic. UC (`ibv_uc_pingpong`): the same
    /// without the RC-only attributes. UD (`ibv_ud_pingpong`): INIT with P_Key
    /// index, port and Q_Key; RTR with nothing; RTS with the send PSN.
    pub fn to_rts(&mut self, now: Time, qpn: u32, attr: &QpAttr) -> Result<(), VerbError> {
        use AttrMask as M;
        let t = self.qps.get(qpn).ok_or(VerbError::NoSuchQp(qpn))?.qp_type;
        let steps = match t {
            QpType::Rc => [
                (QpState::Init, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
                (
                    QpState::Rtr,
                    M::AV
                        | M::PATH_MTU
                        | M::DEST_QPN
                        | M::RQ_PSN
                        | M::MAX_DEST_RD_ATOMIC
                        | M::MIN_RNR_TIMER,
                ),
                (
                    QpState::Rts,
                    M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
                ),
            ],
            QpType::Uc => [
                (QpState::Init, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
                (QpState::Rtr, M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN),
                (QpState::Rts, M::SQ_PSN),
            ],
            QpType::Ud => [
                (QpState::Init, M::PKEY_INDEX | M::PORT | M::QKEY),
                (QpState::Rtr, M::EMPTY),
                (QpState::Rts, M::SQ_PSN),
            ],
        };
        for (state, mask) in steps {
            let a = QpAttr {
                qp_state: state,
                ..*attr
            };
            self.modify_qp(now, qpn, &a, M::STATE | mask)?;
        }
        Ok(())
    }

    /// The UDP source port of QP `qpn`'s packets, which the ICRC covers: the
    /// driver must send them from exactly this port. Overrides
    /// [`Nic::set_udp_source_port`] for this QP.
    pub fn set_qp_source_port(&mut self, qpn: u32, port: u16) -> Result<(), VerbError> {
        let qp = self.qps.get_mut(qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        qp.src_port = Some(port);
        Ok(())
    }

    /// Allocate a protection domain.
    pub fn alloc_pd(&mut self) -> PdHandle {
        self.mem.alloc_pd()
    }

    /// Count one more user of `pd` that is none of the NIC's own objects (a
    /// parent domain over it): `dealloc_pd` is refused until
    /// [`Nic::pd_release`].
    pub fn pd_acquire(&mut self, pd: PdHandle) -> Result<(), VerbError> {
        Ok(self.mem.pd_acquire(pd)?)
    }

    /// One user of `pd` fewer (see [`Nic::pd_acquire`]).
    pub fn pd_release(&mut self, pd: PdHandle) {
        self.mem.pd_release(pd);
    }

    /// Free a protection domain (`ibv_dealloc_pd`): refused while a region,
    /// window or queue pair is in it.
    pub fn dealloc_pd(&mut self, pd: PdHandle) -> Result<(), VerbError> {
        Ok(self.mem.dealloc_pd(pd)?)
    }

    /// The owner of `pd` is done with it: freed now, or with the last
    /// region, window or queue pair in it. Nothing new can be made in it.
    pub fn release_pd(&mut self, pd: PdHandle) -> Result<(), VerbError> {
        Ok(self.mem.release_pd(pd)?)
    }

    /// Register memory.
    pub fn reg_mr(
        &mut self,
        pd: PdHandle,
        iova: u64,
        region: Box<dyn Region>,
        access: Access,
    ) -> Result<MrKeys, VerbError> {
        Ok(self.mem.register(pd, iova, region, access)?)
    }

    /// Change a registered region in place (`ibv_rereg_mr`), keeping its
    /// keys: see [`Memory::reregister`](crate::mem::Memory::reregister).
    pub fn rereg_mr(
        &mut self,
        lkey: u32,
        pd: Option<PdHandle>,
        access: Option<Access>,
        translation: Option<(u64, Box<dyn Region>)>,
    ) -> Result<Option<Box<dyn Region>>, VerbError> {
        Ok(self.mem.reregister(lkey, pd, access, translation)?)
    }

    /// Deregister memory and take it back.
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<Box<dyn Region>, VerbError> {
        Ok(self.mem.deregister(lkey)?)
    }

    /// Allocate a type 2 memory window (`ibv_alloc_mw`); bind it with a
    /// [`SendOp::BindMw`](crate::wr::SendOp::BindMw) work request.
    pub fn alloc_mw(&mut self, pd: PdHandle) -> Result<u32, VerbError> {
        Ok(self.mem.alloc_mw(pd)?)
    }

    /// Allocate a memory window of type `kind` (`ibv_alloc_mw`).
    pub fn alloc_mw_of(
        &mut self,
        pd: PdHandle,
        kind: crate::mem::MwType,
    ) -> Result<u32, VerbError> {
        Ok(self.mem.alloc_mw_of(pd, kind)?)
    }

    /// Free a memory window (`ibv_dealloc_mw`), by its current R_Key.
    pub fn dealloc_mw(&mut self, rkey: u32) -> Result<(), VerbError> {
        Ok(self.mem.dealloc_mw(rkey)?)
    }

    /// Check that local key `lkey` of `pd` covers `len` bytes at `addr` with
    /// `access`, as a work request's SGE would be checked (`ibv_advise_mr`).
    pub fn check_local(
        &self,
        pd: PdHandle,
        lkey: u32,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(), VerbError> {
        self.mem.check(lkey, pd, addr, len, access)?;
        Ok(())
    }

    /// Read `len` bytes of a region through its local key (for tests and tools).
    pub fn read_mr(
        &self,
        pd: PdHandle,
        lkey: u32,
        addr: u64,
        out: &mut [u8],
    ) -> Result<(), VerbError> {
        let span = self
            .mem
            .check(lkey, pd, addr, out.len() as u64, Access::NONE)?;
        self.mem.read(span, out);
        Ok(())
    }

    /// Create a completion queue of `depth` entries (at most
    /// `DEVICE_ATTR.max_cqe`; more is clamped).
    pub fn create_cq(&mut self, depth: usize) -> CqHandle {
        let depth = depth.min(DEVICE_ATTR.max_cqe as usize);
        self.cqs.insert(Cq::new(depth))
    }

    /// Destroy CQ `cq` (`ibv_destroy_cq`) with the completions still in it.
    /// Refused ([`VerbError::CqBusy`]) while a QP completes into it, as
    /// verbs refuses with EBUSY. Its handle may name a new CQ later.
    pub fn destroy_cq(&mut self, cq: CqHandle) -> Result<(), VerbError> {
        self.cq_mut(cq)?;
        if self.qps.iter().any(|q| q.send_cq == cq || q.recv_cq == cq) {
            return Err(VerbError::CqBusy(cq));
        }
        self.cqs.remove(cq);
        self.overrun_cqs.retain(|&h| h != cq);
        Ok(())
    }

    pub(super) fn cq_mut(&mut self, cq: CqHandle) -> Result<&mut Cq, VerbError> {
        self.cqs.get_mut(cq).ok_or(VerbError::NoSuchCq(cq))
    }

    /// Change CQ `cq`'s depth (`ibv_resize_cq`), at most
    /// `DEVICE_ATTR.max_cqe`. `outside` counts completions already handed to
    /// the consumer and not yet polled: with more waiting than `depth`, it
    /// fails with [`VerbError::CqTooSmall`] and nothing changes.
    pub fn resize_cq(
        &mut self,
        cq: CqHandle,
        depth: usize,
        outside: usize,
    ) -> Result<(), VerbError> {
        if depth > DEVICE_ATTR.max_cqe as usize {
            return Err(VerbError::CapsTooLarge);
        }
        let q = self.cq_mut(cq)?;
        if q.resize(depth, outside) {
            Ok(())
        } else {
            Err(VerbError::CqTooSmall {
                depth,
                waiting: q.len() + outside,
            })
        }
    }

    /// Move the CQs a completion went to since the last call onto the end
    /// of `out`, each once: only those have anything for
    /// [`Nic::deliver_cq`] (a driver that hands completions over after each
    /// batch looks at those, however many CQs there are).
    pub fn take_pending_cqs(&mut self, out: &mut Vec<CqHandle>) {
        self.cqs.take_pending(out);
    }

    /// Hand CQ `cq`'s completions to a consumer that already holds
    /// `outside` of them unpolled (a driver that queues completions where the
    /// program polls them): the depth counts both, and completions that do
    /// not fit overrun the CQ as if they had arrived to a full queue
    /// (IBV_EVENT_CQ_ERR, and the QPs that complete into it go to error).
    /// Each goes to `each`, in order; returns how many did.
    pub fn deliver_cq(
        &mut self,
        cq: CqHandle,
        outside: usize,
        each: impl FnMut(Completion),
    ) -> Result<usize, VerbError> {
        let q = self.cq_mut(cq)?;
        let room = q.depth().saturating_sub(outside);
        let first = q.overrun_beyond(room);
        let out = q.drain_into(room, each);
        if first {
            self.events.push_back(AsyncEvent::CqError(cq));
            self.overrun_cqs.push(cq);
            self.settle();
        }
        Ok(out)
    }

    /// The send and receive CQs of QP `qpn`.
    pub fn qp_cqs(&self, qpn: u32) -> Option<(CqHandle, CqHandle)> {
        self.qps.get(qpn).map(|q| (q.send_cq, q.recv_cq))
    }

    /// Take up to `max` completions.
    pub fn poll_cq(&mut self, cq: CqHandle, max: usize) -> Result<Vec<Completion>, VerbError> {
        Ok(self.cq_mut(cq)?.poll(max))
    }

    /// Create a QP in the RESET state; returns its number.
    pub fn create_qp(
        &mut self,
        pd: PdHandle,
        qp_type: QpType,
        send_cq: CqHandle,
        recv_cq: CqHandle,
        caps: QpCaps,
    ) -> Result<u32, VerbError> {
        self.create_qp_numbered(pd, qp_type, send_cq, recv_cq, caps, None)
    }

    /// As [`Nic::create_qp`], with QP number `qpn` if given (free, in
    /// 0x11..=0xFFFFFE): to replay a capture into a NIC set up as the one
    /// that made it. A NIC on a network lets its numbers be drawn.
    pub fn create_qp_numbered(
        &mut self,
        pd: PdHandle,
        qp_type: QpType,
        send_cq: CqHandle,
        recv_cq: CqHandle,
        caps: QpCaps,
        qpn: Option<u32>,
    ) -> Result<u32, VerbError> {
        let a = DEVICE_ATTR;
        if caps.max_send_wr > a.max_qp_wr
            || caps.max_recv_wr > a.max_qp_wr
            || caps.max_send_sge > a.max_sge
            || caps.max_recv_sge > a.max_sge
        {
            return Err(VerbError::CapsTooLarge);
        }
        for cq in [send_cq, recv_cq] {
            if self.cqs.get(cq).is_none() {
                return Err(VerbError::NoSuchCq(cq));
            }
        }
        let qps = &self.qps;
        let taken = |q| qps.get(q).is_some();
        let qpn = match qpn {
            None => self.qpns.draw(taken),
            Some(q) => self.qpns.claim(q, taken).then_some(q),
        }
        .ok_or(VerbError::Unsupported("that QP number is not free"))?;
        self.mem.pd_acquire(pd)?;
        self.qps
            .insert(Qp::new(qpn, qp_type, pd, send_cq, recv_cq, caps));
        Ok(qpn)
    }

    /// Destroy a QP (`ibv_destroy_qp`): its work requests are dropped
    /// without completions, as verbs does, and packets for its number find
    /// nothing from now on (the number is not handed out again until
    /// [`QUARANTINE`](crate::rng::QUARANTINE) more QPs have been destroyed).
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), VerbError> {
        let qp = self.qps.remove(qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        self.qpns.release(qpn);
        self.mem.pd_release(qp.pd);
        // Its unpolled completions go with it: a QP number reused later
        // never finds completions of the QP before it.
        remove_completions(&mut self.cqs, &qp);
        if let Some(h) = qp.srq {
            if let Ok(s) = self.srq_mut(h) {
                s.users = s.users.saturating_sub(1);
            }
        }
        self.busy.retain(|&q| q != qpn);
        // What it had in flight frees room for the others.
        self.inflight = self.inflight.saturating_sub(qp.counted);
        self.starved.retain(|&q| q != qpn);
        self.settle();
        Ok(())
    }

    /// The QP's attributes, with its PSNs as they stand now, as a NIC
    /// reports them (rdma_rxe's `req.psn` and `resp.psn`, ConnectX's next
    /// send and receive PSNs): `rq_psn` is the PSN the responder expects
    /// next, once in RTR; `sq_psn` the PSN the next new request gets, once
    /// in RTS. Before that, what the program set (0 if nothing).
    pub fn query_qp(&self, qpn: u32) -> Result<QpAttr, VerbError> {
        let qp = self.qps.get(qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        let mut attr = qp.attr;
        let state = qp.state();
        if !matches!(state, QpState::Reset | QpState::Init) {
            attr.rq_psn = qp.epsn.value();
        }
        if !matches!(state, QpState::Reset | QpState::Init | QpState::Rtr) {
            attr.sq_psn = qp.sq_psn.value();
        }
        Ok(attr)
    }

    /// What RC or UC QP `qpn`'s transport is doing (see [`QpView`]); `None`
    /// for no such QP, or a UD one.
    pub fn qp_view(&self, qpn: u32) -> Option<QpView> {
        let qp = self.qps.get(qpn)?;
        let credits = (!qp.credits_unlimited).then(|| {
            // LSN is the last message the credits allow; the SSN the last
            // begun.
            u32::try_from(qp.lsn.diff(qp.ssn)).unwrap_or(0)
        });
        Some(QpView {
            state: qp.state(),
            next_psn: qp.sq_psn,
            oldest_unacked: qp.una,
            outstanding: qp.sq.len(),
            retries_left: qp.retry_left,
            rnr_retries_left: qp.rnr_left,
            ack_timer: qp.ack_deadline.is_some(),
            rnr_wait: qp.rnr_until.is_some(),
            window: qp.window,
            credits,
            expected_psn: qp.epsn,
            msn: qp.msn,
            receives: qp.rq.len(),
            rd_atomic: qp.rd_atomic.len(),
            nak_sent: qp.seq_nak_sent,
            in_message: qp.in_msg.is_some(),
        })
    }

    /// `ibv_modify_qp`.
    pub fn modify_qp(
        &mut self,
        now: Time,
        qpn: u32,
        attr: &QpAttr,
        mask: AttrMask,
    ) -> Result<(), VerbError> {
        self.settled(|nic| nic.modify_qp_inner(now, qpn, attr, mask))
    }

    pub(super) fn modify_qp_inner(
        &mut self,
        now: Time,
        qpn: u32,
        attr: &QpAttr,
        mask: AttrMask,
    ) -> Result<(), VerbError> {
        let mut attr = *attr;
        if mask.contains(AttrMask::AV) {
            if let Some(av) = attr.ah_attr {
                attr.ah_attr = Some(self.resolve_source(av).map_err(VerbError::Modify)?);
            }
        }
        let attr = &attr;
        let limits = self.limits;
        let (qps, mut ctx) = self.parts(now);
        let qp = qps.get_mut(qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        let t =
            qp::modify(qp.qp_type, &mut qp.attr, attr, mask, &limits).map_err(VerbError::Modify)?;
        match (t.from, t.to) {
            (_, QpState::Reset) => {
                qp.reset(&mut ctx);
                // Completions of the QP not yet polled go too (flushed
                // receives, say): a program that resets a QP after an error
                // and uses it again sees nothing from before, as mlx5 cleans
                // its CQs (mlx5_cq_clean). The layer holding completions
                // handed over to the program cleans those
                // ([`Nic::qp_cqs`]).
                remove_completions(ctx.cqs, qp);
            }
            (QpState::Init, QpState::Rtr) => {
                qp.epsn = Psn::new(qp.attr.rq_psn);
                qp.ack_psn = qp.epsn;
                qp.msn = 0;
                qp.seq_nak_sent = false;
            }
            (QpState::Rtr, QpState::Rts) => {
                qp.sq_psn = Psn::new(qp.attr.sq_psn);
                qp.una = qp.sq_psn;
                qp.heard_una = qp.sq_psn;
                qp.max_sent = qp.sq_psn;
                qp.retry_left = qp.attr.retry_cnt;
                qp.rnr_left = qp.attr.rnr_retry;
            }
            (from, QpState::Err) if from != QpState::Err => qp.flush(&mut ctx),
            (QpState::Rts, QpState::Sqd) => qp.sq_drained = false,
            _ => {}
        }
        qp.req_poll(&mut ctx);
        Ok(())
    }

    /// Create a shared receive queue of `max_wr` receives of up to `max_sge`
    /// entries each (`ibv_create_srq`).
    pub fn create_srq(
        &mut self,
        pd: PdHandle,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<SrqHandle, VerbError> {
        if max_wr > DEVICE_ATTR.max_qp_wr || max_sge > DEVICE_ATTR.max_sge {
            return Err(VerbError::CapsTooLarge);
        }
        self.mem.pd_acquire(pd)?;
        let srq = Srq {
            pd,
            users: 0,
            queue: VecDeque::new(),
            max_wr,
            max_sge,
            limit: 0,
        };
        let i = free_slot(&mut self.srqs);
        self.srqs[i] = Some(srq);
        Ok(SrqHandle(i as u32))
    }

    /// `ibv_destroy_srq`: refused (SrqBusy) while a QP takes its receives
    /// from it. The receives still posted go without a completion.
    pub fn destroy_srq(&mut self, srq: SrqHandle) -> Result<(), VerbError> {
        let s = self.srq_mut(srq)?;
        if s.users > 0 {
            return Err(VerbError::SrqBusy(srq));
        }
        let pd = s.pd;
        self.srqs[srq.0 as usize] = None;
        self.mem.pd_release(pd);
        Ok(())
    }

    pub(super) fn srq_mut(&mut self, srq: SrqHandle) -> Result<&mut Srq, VerbError> {
        self.srqs
            .get_mut(srq.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(VerbError::Unsupported("no such SRQ"))
    }

    /// Arm the SRQ's limit (`ibv_modify_srq` with IBV_SRQ_LIMIT): when fewer
    /// than `limit` receives remain, an `AsyncEvent::SrqLimitReached` is raised
    /// once. 0 disarms.
    pub fn arm_srq(&mut self, srq: SrqHandle, limit: u32) -> Result<(), VerbError> {
        let s = self.srq_mut(srq)?;
        if limit > s.max_wr {
            return Err(VerbError::CapsTooLarge);
        }
        s.limit = limit;
        Ok(())
    }

    /// Receives waiting in an SRQ.
    pub fn srq_len(&self, srq: SrqHandle) -> Option<usize> {
        self.srqs
            .get(srq.0 as usize)
            .and_then(Option::as_ref)
            .map(|s| s.queue.len())
    }

    /// Make a QP (in RESET, with nothing posted) take its receives from `srq`,
    /// as `ibv_create_qp` with `srq` set does.
    pub fn attach_srq(&mut self, qpn: u32, srq: SrqHandle) -> Result<(), VerbError> {
        self.srq_mut(srq)?;
        let qp = self.qps.get_mut(qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        if qp.state() != QpState::Reset || !qp.rq.is_empty() || qp.srq.is_some() {
            return Err(VerbError::BadState(qp.state()));
        }
        qp.srq = Some(srq);
        self.srq_mut(srq)?.users += 1;
        Ok(())
    }

    /// The next asynchronous event (`ibv_get_async_event`).
    pub fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }
}
