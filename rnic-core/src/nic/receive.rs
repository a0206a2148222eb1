//! Packets that arrive: from a UDP socket (the ICRC checked under the
//! UDP convention) or as whole frames (the ICRC checked over the IP header
//! they came with), then the checks every packet passes before its QP sees
//! it.

use core::net::IpAddr;

use rnic_wire::encap::{Frame, IpRepr, LinkType};
use rnic_wire::{icrc, IbPacket};

use crate::datagram::{Arrival, Datagram, Header};
use crate::qp::QpType;
use crate::time::Time;

use super::Nic;

/// Whether a packet's P_Key matches the QP's (IBTA 10.9.3): the same
/// partition (low 15 bits, not 0) and at least one of them a full member.
pub(super) fn pkey_matches(packet: u16, qp: u16) -> bool {
    let (a, b) = (packet & 0x7FFF, qp & 0x7FFF);
    a != 0 && a == b && (packet | qp) & 0x8000 != 0
}

impl Nic {
    /// Count a datagram the driver could not pass on (truncated, or from a
    /// sender that is not an IP address) as malformed.
    pub fn count_malformed(&mut self) {
        self.counters.malformed += 1;
    }

    /// A UDP datagram to port 4791 arrived. Its ICRC is checked under the UDP
    /// convention (see [`rnic_wire::icrc::for_udp`]), in IPv4 for the
    /// identifications a GSO send's segments carry too
    /// ([`rnic_wire::icrc::udp_ident`]); a packet that fails it, or does not
    /// parse, is dropped and counted. Returns what the packet is, if it
    /// parsed, whatever became of it (see [`crate::datagram`]).
    pub fn handle_datagram(&mut self, now: Time, d: &Datagram) -> Option<Arrival> {
        self.handle_udp(now, d.src, d.dst, d.src_port, &d.payload)
    }

    /// Handle a UDP payload from `src` (port `src_port`) to `dst`, in place:
    /// what [`Nic::handle_datagram`] does, for a caller whose bytes sit in
    /// its own receive buffer.
    pub fn handle_udp(
        &mut self,
        now: Time,
        src: IpAddr,
        dst: IpAddr,
        src_port: u16,
        payload: &[u8],
    ) -> Option<Arrival> {
        self.settled(|nic| nic.handle_udp_inner(now, src, dst, src_port, payload))
    }

    pub(super) fn handle_udp_inner(
        &mut self,
        now: Time,
        src: IpAddr,
        dst: IpAddr,
        src_port: u16,
        payload: &[u8],
    ) -> Option<Arrival> {
        let Ok(pkt) = IbPacket::new_checked(payload) else {
            self.counters.malformed += 1;
            return None;
        };
        let covered = pkt.covered();
        let ident = icrc::udp_ident(
            src,
            dst,
            src_port,
            covered,
            pkt.icrc(),
            &mut self.gso_deltas,
        );
        match ident {
            Ok(Some(_)) => self.handle_checked(now, src, dst, &pkt),
            _ => self.counters.icrc_errors += 1,
        }
        Some(Arrival {
            src,
            dst,
            src_port,
            header: Header::of_packet(&pkt),
            ipv4_id: ident.ok().flatten().unwrap_or(0),
        })
    }

    /// A whole frame, as a transport that sees every header receives it
    /// (`link` says how it begins: an Ethernet header, or the IP header).
    /// Its ICRC is verified over the IP header it arrived with, the IPv4
    /// identification included, whatever the peer put there: rdma_rxe puts
    /// a new value in every packet, which a UDP socket never shows. A frame
    /// that is not RoCE v2 to this NIC's address (another protocol, UDP
    /// port or destination) is dropped and counted as foreign; a RoCE v2
    /// frame that does not parse, as malformed. Returns its addresses and
    /// what the packet is, if it parsed as RoCE v2, whatever became of it.
    pub fn handle_frame(&mut self, now: Time, link: LinkType, frame: &[u8]) -> Option<Arrival> {
        self.settled(|nic| nic.handle_frame_inner(now, link, frame))
    }

    pub(super) fn handle_frame_inner(
        &mut self,
        now: Time,
        link: LinkType,
        frame: &[u8],
    ) -> Option<Arrival> {
        let f = match Frame::parse(link, frame) {
            Ok(f) => f,
            Err(e) if e.is_not_roce() => {
                self.counters.foreign_frames += 1;
                return None;
            }
            Err(_) => {
                self.counters.malformed += 1;
                return None;
            }
        };
        let arrival = Arrival {
            src: f.ip.src_addr(),
            dst: f.ip.dst_addr(),
            src_port: f.udp.src_port,
            header: Header::of_packet(&f.ib),
            ipv4_id: match &f.ip {
                IpRepr::V4(ip) => ip.ident,
                IpRepr::V6(_) => 0,
            },
        };
        if !self.addrs.contains(&arrival.dst) {
            self.counters.foreign_frames += 1;
        } else if !f.icrc_ok() {
            self.counters.icrc_errors += 1;
        } else {
            self.handle_checked(now, arrival.src, arrival.dst, &f.ib);
        }
        Some(arrival)
    }

    /// A packet whose ICRC verified, from `src` to `dst`.
    pub(super) fn handle_checked(
        &mut self,
        now: Time,
        src: IpAddr,
        dst: IpAddr,
        pkt: &IbPacket<&[u8]>,
    ) {
        // IBTA 9.2.6: only transport header version 0 is defined.
        if pkt.bth().tver() != rnic_wire::bth::TVER {
            self.counters.bad_tver += 1;
            return;
        }
        let qpn = pkt.bth().dest_qp();
        if qpn == rnic_wire::mad::GSI_QPN {
            self.gsi_packet(now, src, pkt);
            return;
        }
        let (qps, mut ctx) = self.parts(now);
        let Some(qp) = qps.get_mut(qpn) else {
            ctx.counters.unknown_qp += 1;
            return;
        };
        // rnic's P_Key table has one entry (index 0): the default partition.
        if !pkey_matches(pkt.bth().p_key(), rnic_wire::bth::DEFAULT_P_KEY) {
            ctx.counters.pkey_violations += 1;
            return;
        }
        // The transport in the opcode must be the QP's own.
        let transport = match qp.qp_type {
            QpType::Rc => rnic_wire::Transport::Rc,
            QpType::Uc => rnic_wire::Transport::Uc,
            QpType::Ud => rnic_wire::Transport::Ud,
        };
        if pkt.info().transport != transport {
            ctx.counters.wrong_transport += 1;
            return;
        }
        if qp.qp_type == QpType::Ud {
            ctx.counters.rcvd_pkts += 1;
            qp.resp_ud(&mut ctx, pkt, src, dst);
            return;
        }
        // A connected QP takes packets from its peer only, sent to the
        // address it sends from (rdma_rxe's check_addr).
        if !qp
            .attr
            .ah_attr
            .is_some_and(|a| a.dest == src && a.src.is_none_or(|s| s == dst))
        {
            ctx.counters.unknown_qp += 1;
            return;
        }
        ctx.counters.rcvd_pkts += 1;
        if pkt.info().is_request() {
            qp.resp_packet(&mut ctx, pkt);
        } else {
            qp.comp_packet(&mut ctx, pkt);
        }
        qp.req_poll(&mut ctx);
    }
}
