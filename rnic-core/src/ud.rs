//! Unreliable datagram: one packet per message, a destination per request
//! (DETH carries the Q_Key and the source QP), no acknowledgements, and the
//! 40-byte GRH area at the head of every receive buffer.

use core::net::IpAddr;

use rnic_wire::encap::{ipv4, ipv6};
use rnic_wire::{deth, immdt, IbPacket, IbRepr, Opcode, MAX_PAYLOAD};

use crate::qp::QpState;
use crate::rc::{gather_wr, scatter, sg_len, Ctx, Qp};
use crate::wr::{Completion, NetworkHdr, SendOp, SendWr, UdDest, WcOpcode, WcStatus, GRH_LEN};

impl Qp {
    /// Send `wr` (a SEND, with or without immediate) to `to`. It completes once
    /// sent: nothing acknowledges a datagram.
    pub(crate) fn post_ud(&mut self, ctx: &mut Ctx<'_>, wr: SendWr, to: UdDest) {
        let SendOp::Send { imm } = wr.op else {
            return;
        };
        let len = match &wr.inline {
            Some(data) => data.len(),
            None => sg_len(&wr.sg_list) as usize,
        };
        // The address handle's source address, if it names one of the
        // NIC's of the peer's family; else the NIC's choice.
        let src = match to.src {
            Some(s) if ctx.addrs.contains(&s) && s.is_ipv4() == to.dest.is_ipv4() => Some(s),
            Some(_) => None,
            None => crate::qp::source_for(ctx.addrs, to.dest),
        };
        let status = match src {
            _ if len > MAX_PAYLOAD => WcStatus::LocLenErr,
            None => WcStatus::LocQpOpErr,
            Some(src) => {
                let opcode = if imm.is_some() {
                    Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
                } else {
                    Opcode::UD_SEND_ONLY
                };
                let psn = self.sq_psn;
                let mut ib = IbRepr::new(rnic_wire::bth::Repr::new(opcode, to.qpn, psn));
                ib.bth.solicited = wr.solicited;
                // A Q_Key with its high bit set in the request means "the
                // QP's own" (IBTA 10.2.5): an application cannot send a
                // privileged Q_Key it was not given.
                let q_key = if to.qkey & 0x8000_0000 != 0 {
                    self.attr.qkey
                } else {
                    to.qkey
                };
                ib.deth = Some(deth::Repr {
                    q_key,
                    src_qp: self.qpn,
                });
                ib.immdt = imm.map(|immediate| immdt::Repr { immediate });
                ib.payload_len = len;
                // Gathered straight into the packet.
                let pd = self.pd;
                let fill = |mem: &crate::mem::Memory, p: &mut [u8]| gather_wr(mem, pd, &wr, 0, p);
                match self.transmit_to_with(ctx, (src, to.dest), &ib, fill) {
                    Ok(()) => {
                        self.sq_psn = psn.next();
                        WcStatus::Success
                    }
                    Err(_) => WcStatus::LocProtErr,
                }
            }
        };
        if status != WcStatus::Success || wr.signaled {
            ctx.complete(
                self.send_cq,
                Completion {
                    wr_id: wr.wr_id,
                    status,
                    opcode: WcOpcode::Send,
                    // As on RC: the length and the immediate on success.
                    byte_len: if status == WcStatus::Success {
                        len as u32
                    } else {
                        0
                    },
                    imm_data: imm.filter(|_| status == WcStatus::Success),
                    qp_num: self.qpn,
                    src_qp: None,
                    invalidated_rkey: None,
                    network: None,
                },
            );
        }
        if status != WcStatus::Success {
            self.enter_sqe(ctx);
        }
    }

    /// A UD SEND arrived from `src`. Dropped, silently and counted, when the
    /// Q_Key is not this QP's or no receive is posted (UD has no RNR NAK).
    pub(crate) fn resp_ud(
        &mut self,
        ctx: &mut Ctx<'_>,
        pkt: &IbPacket<&[u8]>,
        src: IpAddr,
        dst: IpAddr,
    ) {
        if !matches!(
            self.state(),
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            return;
        }
        let Some(d) = pkt.deth() else { return };
        if d.q_key() != self.attr.qkey {
            ctx.counters.qkey_violations += 1;
            return;
        }
        let Some(recv) = self.take_recv(ctx) else {
            ctx.counters.ud_dropped_no_recv += 1;
            return;
        };
        let payload = pkt.payload();
        // The GRH area and the payload, as they land, built in the QP's
        // scratch buffer (no allocation per datagram once warm).
        let mut data = std::mem::take(&mut self.scratch);
        data.clear();
        data.resize(GRH_LEN, 0);
        // The IB packet as it arrived, ImmDt, pad and ICRC included.
        let ib_len = pkt.covered().len() + 4;
        grh_area(&mut data[..GRH_LEN], src, dst, ib_len);
        data.extend_from_slice(payload);
        let status = if data.len() as u64 > sg_len(&recv.sg_list) {
            WcStatus::LocLenErr
        } else if scatter(ctx.mem, self.pd, &recv.sg_list, 0, &data).is_err() {
            WcStatus::LocProtErr
        } else {
            WcStatus::Success
        };
        ctx.counters.rdma_recvs += 1;
        ctx.complete(
            self.recv_cq,
            Completion {
                byte_len: if status == WcStatus::Success {
                    data.len() as u32
                } else {
                    0
                },
                imm_data: pkt.immdt().map(|i| i.immediate()),
                src_qp: Some(d.src_qp()),
                network: Some(match src {
                    IpAddr::V4(_) => NetworkHdr::Ipv4,
                    IpAddr::V6(_) => NetworkHdr::Ipv6,
                }),
                ..self.recv_completion(recv.wr_id, status)
            },
        );
        self.scratch = data;
    }
}

/// The 40 bytes verbs puts before a UD payload: for IPv6 the IPv6 header (the
/// GRH's layout), for IPv4 zeros then the IPv4 header in the last 20 bytes,
/// with the lengths of the datagram that carried the `ib_len` bytes of IB
/// packet (as rdma_rxe copies the real header).
fn grh_area(out: &mut [u8], src: IpAddr, dst: IpAddr, ib_len: usize) {
    out.fill(0);
    let udp_len = 8 + ib_len;
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let _ = ipv4::Repr::new(s, d).emit(&mut out[20..], udp_len);
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let _ = ipv6::Repr::new(s, d).emit(out, udp_len);
        }
        _ => {}
    }
}
