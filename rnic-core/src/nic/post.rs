//! Work posted to the NIC's queues: sends (connected and UD) and
//! receives (a QP's own, or a shared receive queue's), each checked before
//! it is queued.

use crate::device::DEVICE_ATTR;
use crate::error::VerbError;
use crate::qp::{QpState, QpType};
use crate::rc::{sg_len, SendWqe};
use crate::srq::SrqHandle;
use crate::time::Time;
use crate::wr::{RecvWr, SendOp, SendWr, Sge, UdDest};

use super::Nic;

/// No more scatter/gather entries than the queue takes.
fn check_sges(sg_list: &[Sge], max: u32) -> Result<(), VerbError> {
    if sg_list.len() > max as usize {
        return Err(VerbError::TooManySge {
            given: sg_list.len(),
            max,
        });
    }
    Ok(())
}

/// Inline data only on SEND and WRITE, and no more than the device takes.
fn check_inline(wr: &SendWr) -> Result<(), VerbError> {
    match &wr.inline {
        Some(data)
            if !wr.op.takes_inline() || data.len() > DEVICE_ATTR.max_inline_data as usize =>
        {
            Err(VerbError::BadInline { len: data.len() })
        }
        _ => Ok(()),
    }
}

impl Nic {
    /// `ibv_post_send`. In the error state (and the send queue error state of
    /// UC and UD) the request completes at once with WR_FLUSH_ERR, as verbs
    /// specifies.
    pub fn post_send(&mut self, now: Time, qpn: u32, wr: SendWr) -> Result<(), VerbError> {
        self.settled(|nic| nic.post_send_inner(now, qpn, wr))
    }

    pub(super) fn post_send_inner(
        &mut self,
        now: Time,
        qpn: u32,
        wr: SendWr,
    ) -> Result<(), VerbError> {
        let (qps, mut ctx) = self.parts(now);
        let qp = qps.get_mut(qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        check_sges(&wr.sg_list, qp.caps.max_send_sge)?;
        if qp.sq.len() >= qp.caps.max_send_wr as usize {
            return Err(VerbError::QueueFull);
        }
        if wr.op.is_atomic() && (wr.sg_list.len() != 1 || wr.sg_list[0].length != 8) {
            return Err(VerbError::BadAtomicSge);
        }
        if qp.qp_type == QpType::Ud {
            return Err(VerbError::Unsupported(
                "post_send on a UD queue pair: use post_send_ud",
            ));
        }
        if qp.is_uc() && (wr.op.is_read_or_atomic() || matches!(wr.op, SendOp::SendWithInv { .. }))
        {
            return Err(VerbError::Unsupported(
                "READ, atomics, ATOMIC_WRITE, FLUSH and SEND_WITH_INV on a UC queue pair",
            ));
        }
        check_inline(&wr)?;
        let len = match (&wr.inline, wr.op) {
            (Some(data), _) => data.len() as u64,
            (
                None,
                SendOp::Send { .. }
                | SendOp::SendWithInv { .. }
                | SendOp::Write { .. }
                | SendOp::Read { .. },
            ) => sg_len(&wr.sg_list),
            // Their data is in the request itself, or there is none.
            (None, _) => 0,
        };
        if len > 1 << 31 {
            return Err(VerbError::MessageTooLong(len));
        }
        match qp.state() {
            QpState::Rts | QpState::Sqd => {}
            QpState::Err | QpState::Sqe => {
                qp.flush_one(&mut ctx, &wr);
                return Ok(());
            }
            s => return Err(VerbError::BadState(s)),
        }
        let pmtu = qp.pmtu();
        let npkts = match wr.op {
            SendOp::LocalInv { .. } | SendOp::BindMw(_) => 0,
            SendOp::CompareSwap { .. }
            | SendOp::FetchAdd { .. }
            | SendOp::AtomicWrite { .. }
            | SendOp::Flush { .. } => 1,
            _ => len.div_ceil(pmtu).max(1) as u32,
        };
        if matches!(wr.op, SendOp::Read { .. }) && npkts >= 1 << 23 {
            return Err(VerbError::ReadTooManyPackets { len, pmtu });
        }
        let first_psn = qp.sq_psn;
        qp.sq_psn = first_psn.add(npkts);
        qp.sq.push_back(SendWqe {
            wr,
            len,
            first_psn,
            npkts,
            resp_done: 0,
            read_start: 0,
            status: None,
        });
        qp.req_poll(&mut ctx);
        Ok(())
    }

    /// `ibv_post_send` on a UD QP: a SEND (with or without immediate) of at
    /// most 4096 bytes to `to`.
    pub fn post_send_ud(
        &mut self,
        now: Time,
        qpn: u32,
        wr: SendWr,
        to: UdDest,
    ) -> Result<(), VerbError> {
        self.settled(|nic| nic.post_send_ud_inner(now, qpn, wr, to))
    }

    pub(super) fn post_send_ud_inner(
        &mut self,
        now: Time,
        qpn: u32,
        wr: SendWr,
        to: UdDest,
    ) -> Result<(), VerbError> {
        let (qps, mut ctx) = self.parts(now);
        let qp = qps.get_mut(qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        if qp.qp_type != QpType::Ud {
            return Err(VerbError::Unsupported(
                "post_send_ud on a connected queue pair",
            ));
        }
        if !matches!(wr.op, SendOp::Send { .. }) {
            return Err(VerbError::Unsupported("UD carries SENDs only"));
        }
        check_inline(&wr)?;
        check_sges(&wr.sg_list, qp.caps.max_send_sge)?;
        match qp.state() {
            QpState::Rts => qp.post_ud(&mut ctx, wr, to),
            QpState::Err | QpState::Sqe => qp.flush_one(&mut ctx, &wr),
            s => return Err(VerbError::BadState(s)),
        }
        Ok(())
    }

    /// `ibv_post_srq_recv`.
    pub fn post_srq_recv(&mut self, srq: SrqHandle, wr: RecvWr) -> Result<(), VerbError> {
        let s = self.srq_mut(srq)?;
        check_sges(&wr.sg_list, s.max_sge)?;
        if s.queue.len() >= s.max_wr as usize {
            return Err(VerbError::QueueFull);
        }
        s.queue.push_back(wr);
        Ok(())
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, now: Time, qpn: u32, wr: RecvWr) -> Result<(), VerbError> {
        self.settled(|nic| nic.post_recv_inner(now, qpn, wr))
    }

    pub(super) fn post_recv_inner(
        &mut self,
        now: Time,
        qpn: u32,
        wr: RecvWr,
    ) -> Result<(), VerbError> {
        let (qps, mut ctx) = self.parts(now);
        let qp = qps.get_mut(qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        check_sges(&wr.sg_list, qp.caps.max_recv_sge)?;
        if qp.srq.is_some() {
            return Err(VerbError::Unsupported(
                "post_recv on a QP with an SRQ: post to the SRQ",
            ));
        }
        if qp.rq.len() >= qp.caps.max_recv_wr as usize {
            return Err(VerbError::QueueFull);
        }
        if qp.state() == QpState::Reset {
            return Err(VerbError::BadState(QpState::Reset));
        }
        qp.rq.push_back(wr);
        if qp.state() == QpState::Err {
            qp.flush(&mut ctx);
        }
        Ok(())
    }
}
