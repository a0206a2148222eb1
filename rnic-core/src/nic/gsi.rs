//! QP1, the General Services Interface: the queue pair every port has for
//! management datagrams, here the communication manager's
//! ([`crate::cm`]). It is no [`crate::rc::Qp`]: nothing posts to it and
//! nothing polls it. A packet to QP 1 is checked as IBTA 13.5 says (a UD
//! SEND_ONLY, the default partition, the GSI's Q_Key, a whole MAD), handed
//! to the NIC's [`CmAgent`], and what the agent answers leaves as UD
//! SEND_ONLY packets from QP 1 to QP 1, from the UDP source port the
//! kernel's QP1 uses.
//!
//! The agent is made when the NIC first meets the CM (a packet to QP 1, or
//! a call of [`Nic::cm`]), its IDs drawn from a stream split from the QP
//! numbers' then: a NIC that never connects through the CM draws the same
//! QP numbers from a seed as before the CM existed.

use core::net::IpAddr;

use rnic_wire::cm::Mad;
use rnic_wire::mad::{self, GSI_QKEY, GSI_QPN, MAD_LEN};
use rnic_wire::{bth, deth, icrc, IbPacket, IbRepr, Opcode, Psn};

use crate::cm::{CmAgent, CmEvent};
use crate::datagram::{Datagram, Header};
use crate::time::Time;

use super::Nic;

/// QP1's state beyond the agent: the PSN of its next packet, the agent's
/// next deadline (kept here, so that the NIC's own deadline costs no walk
/// over the connections), and the UDP port it sends from.
#[derive(Debug)]
pub(super) struct Gsi {
    pub agent: CmAgent,
    psn: Psn,
    pub deadline: Option<Time>,
}

impl Nic {
    /// The UDP source port of QP 1's packets: [`rnic_wire::mad::GSI_UDP_SOURCE_PORT`]
    /// unless a driver that cannot send from it says otherwise (the ICRC
    /// covers the port).
    pub fn set_gsi_source_port(&mut self, port: u16) {
        self.gsi_port = port;
    }
}

/// What became of the packets to QP 1 (a part of [`crate::Counters`]'
/// story the CM tells on its own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GsiCounters {
    /// CM MADs taken in.
    pub mads_received: u64,
    /// CM MADs sent (retries included).
    pub mads_sent: u64,
    /// Packets to QP 1 dropped: not a UD SEND_ONLY, a P_Key of another
    /// partition, a Q_Key other than the GSI's.
    pub dropped_bad_header: u64,
    /// MADs dropped, as the kernel's MAD layer and CM drop them: not 256
    /// bytes, not base version 1, a subnet management class (QP 0's), a
    /// CM method other than Send, a class or class version nobody serves,
    /// an attribute the CM does not define.
    pub dropped_bad_mad: u64,
    /// Get and Set requests of a class nobody serves, answered with a
    /// GetResp of status "unsupported method/attribute" (0x000C), as the
    /// kernel's MAD layer answers them.
    pub answered_unsupported: u64,
    /// rdma_cm requests (REQ) for a port somebody listens on, refused with
    /// REJ 28 as the kernel's rdma_cm refuses them: their rdma_cm header
    /// is not one (version, IP version), names addresses that are not the
    /// packet's (a source other than the one it came from, a destination
    /// that is not this NIC's), or the QP type is not the port space's.
    pub rejected_rdma_cm: u64,
    /// SIDR requests whose rdma_cm header names addresses that are not the
    /// packet's, dropped.
    pub dropped_false_addresses: u64,
}

impl Nic {
    /// The NIC's communication manager, made on first use. After calling
    /// into it, [`Nic::cm_settle`] sends what it produced.
    pub fn cm(&mut self) -> &mut CmAgent {
        &mut self.gsi().agent
    }

    fn gsi(&mut self) -> &mut Gsi {
        let addr = self.addrs[0];
        let (qpns, slot) = (&mut self.qpns, self.slot);
        self.gsi.get_or_insert_with(|| {
            let mut agent = CmAgent::new(crate::device::node_guid(addr), qpns.split());
            if let Some((slot, bits)) = slot {
                agent.restrict_ids(slot, bits);
            }
            Gsi {
                agent,
                psn: Psn::new(0),
                deadline: None,
            }
        })
    }

    /// Run `f` on the communication manager at `now`, then queue the MADs
    /// it produced: how a driver calls [`CmAgent::connect`],
    /// [`CmAgent::accept`] and the rest.
    pub fn cm_call<R>(&mut self, now: Time, f: impl FnOnce(&mut CmAgent, Time) -> R) -> R {
        self.now = self.now.max(now);
        let r = f(self.cm(), now);
        self.cm_settle();
        r
    }

    /// The NIC's process is ending: destroy every connection (see
    /// [`CmAgent::destroy_all`]) and, with `again`, send the DREQs still
    /// unanswered once more. How many DREQs wait for their DREP. A NIC
    /// whose communication manager never ran has nothing to do.
    pub fn cm_closing(&mut self, now: Time, again: bool) -> usize {
        if self.gsi.is_none() {
            return 0;
        }
        self.cm_call(now, |cm, now| {
            cm.destroy_all(now);
            if again {
                cm.resend_dreqs();
            }
            cm.unanswered_dreqs()
        })
    }

    /// Queue what the communication manager has to send, and note its
    /// next deadline.
    pub fn cm_settle(&mut self) {
        let Some(g) = self.gsi.as_mut() else { return };
        let out: Vec<(IpAddr, Mad)> = g.agent.take_outgoing().collect();
        g.deadline = g.agent.next_deadline();
        for (to, mad) in out {
            self.send_mad(to, &mad);
        }
    }

    /// The next thing the communication manager tells the application.
    pub fn poll_cm_event(&mut self) -> Option<CmEvent> {
        self.gsi.as_mut()?.agent.poll_event()
    }

    /// What QP 1 has counted.
    pub fn gsi_counters(&self) -> GsiCounters {
        self.gsi_counters
    }

    /// A MAD to `to`'s QP 1, from the NIC's address of its family.
    fn send_mad(&mut self, to: IpAddr, mad: &Mad) {
        self.send_mad_with(to, |b| mad.emit(b));
    }

    /// A MAD that `emit` writes into its 256 bytes, to `to`'s QP 1.
    fn send_mad_with(&mut self, to: IpAddr, emit: impl FnOnce(&mut [u8])) {
        let Some(src) = self.source_for(to) else {
            self.counters.send_err += 1;
            return;
        };
        let psn = {
            let g = self.gsi();
            let psn = g.psn;
            g.psn = psn.next();
            psn
        };
        let mut ib = IbRepr::new(bth::Repr::new(Opcode::UD_SEND_ONLY, GSI_QPN, psn));
        ib.deth = Some(deth::Repr {
            q_key: GSI_QKEY,
            src_qp: GSI_QPN,
        });
        ib.payload_len = MAD_LEN;
        let mut buf = self.pool.take();
        buf.clear();
        buf.resize(ib.buffer_len(), 0);
        if ib.emit_with(&mut buf, emit).is_err() {
            self.counters.send_err += 1;
            return;
        }
        let n = buf.len();
        let src_port = self.gsi_port;
        match icrc::for_udp(src, to, src_port, &buf[..n - 4]) {
            Ok(crc) => buf[n - 4..].copy_from_slice(&crc.to_le_bytes()),
            Err(_) => {
                self.counters.send_err += 1;
                return;
            }
        }
        self.gsi_counters.mads_sent += 1;
        self.counters.sent_pkts += 1;
        self.tx.push(Datagram {
            src,
            dst: to,
            src_port,
            payload: buf,
            header: Some(Header::of(&ib)),
            ipv4_id: 0,
        });
    }

    /// A packet to QP 1 from `src`, its ICRC verified.
    pub(super) fn gsi_packet(&mut self, now: Time, src: IpAddr, pkt: &IbPacket<&[u8]>) {
        let qkey = pkt.deth().map(|d| d.q_key());
        let header_ok = pkt.bth().opcode() == Opcode::UD_SEND_ONLY
            && super::receive::pkey_matches(pkt.bth().p_key(), bth::DEFAULT_P_KEY)
            && qkey == Some(GSI_QKEY);
        if !header_ok {
            self.gsi_counters.dropped_bad_header += 1;
            return;
        }
        let payload = pkt.payload();
        let Some(verdict) = mad_verdict(payload) else {
            self.gsi_counters.dropped_bad_mad += 1;
            return;
        };
        self.counters.rcvd_pkts += 1;
        self.gsi_counters.mads_received += 1;
        let mad = match verdict {
            Verdict::Cm(mad) => mad,
            Verdict::Unsupported => {
                // The request comes back as its response: method GetResp,
                // status "unsupported method/attribute combination".
                self.gsi_counters.answered_unsupported += 1;
                self.send_mad_with(src, |b| {
                    b.copy_from_slice(&payload[..MAD_LEN]);
                    let mut p = mad::Packet::new_unchecked(b);
                    p.set_method(mad::METHOD_GET_RESP);
                    p.set_status(mad::STATUS_UNSUPPORTED_METHOD_ATTRIBUTE);
                });
                return;
            }
        };
        match self.rdma_cm_check(src, &mad) {
            RdmaCm::Holds => self.cm_call(now, |cm, now| cm.on_mad(now, src, &mad)),
            RdmaCm::Refused(req) => {
                let tid = mad.header.transaction_id;
                if self.cm_call(now, |cm, _| cm.refuse_request(src, tid, &req)) {
                    self.gsi_counters.rejected_rdma_cm += 1;
                }
            }
            RdmaCm::FalseAddresses => self.gsi_counters.dropped_false_addresses += 1,
        }
    }

    /// Whether an rdma_cm request holds: its header is rdma_cm's and names
    /// the addresses the packet came from and to, and a REQ's transport is
    /// its port space's (any other MAD holds).
    fn rdma_cm_check(&self, src: IpAddr, mad: &Mad) -> RdmaCm {
        use rnic_wire::cm::{CmaHeader, Message, PortSpace};
        let (service, data) = match &mad.message {
            Message::Req(r) => (r.service_id, &r.private_data[..]),
            Message::SidrReq(r) => (r.service_id, &r.private_data[..]),
            _ => return RdmaCm::Holds,
        };
        // rdma_cm's service IDs: 0x0000_0000_01PP_pppp (port space, port).
        let space = match PortSpace::from_number((service >> 16) as u16) {
            Some(s) if service >> 24 == 1 => s,
            _ => return RdmaCm::Holds,
        };
        let holds =
            CmaHeader::parse(data).is_some_and(|h| h.src == src && self.addrs.contains(&h.dst));
        match &mad.message {
            Message::Req(r) => {
                // rdma_cm's TCP port space connects RC QPs, its UDP port
                // space none (UD is resolved by SIDR), its IB port space
                // RC or UC.
                let served = match space {
                    PortSpace::Tcp => r.transport_service_type == 0,
                    PortSpace::Udp => false,
                    PortSpace::Ib | PortSpace::Ipoib => r.transport_service_type <= 1,
                };
                if holds && served {
                    RdmaCm::Holds
                } else {
                    RdmaCm::Refused(Box::new(*r))
                }
            }
            _ if holds => RdmaCm::Holds,
            _ => RdmaCm::FalseAddresses,
        }
    }

    /// The communication manager's timers, if due.
    pub(super) fn gsi_timeout(&mut self, now: Time) {
        if self
            .gsi
            .as_ref()
            .and_then(|g| g.deadline)
            .is_some_and(|d| d <= now)
        {
            self.cm_call(now, |cm, now| cm.on_timer(now));
        }
    }

    /// When the communication manager next needs [`Nic::handle_timeout`].
    pub(super) fn gsi_deadline(&self) -> Option<Time> {
        self.gsi.as_ref().and_then(|g| g.deadline)
    }
}

/// What QP 1 makes of a MAD.
enum Verdict {
    /// A CM message.
    Cm(Box<Mad>),
    /// A Get or Set of a class or attribute nobody here serves.
    Unsupported,
}

/// The checks of the kernel's MAD layer and CM, in its order (`None`: the
/// MAD is dropped): 256 bytes, base version 1, not a subnet management
/// class, a CM MAD with method Send unless it is about ClassPortInfo;
/// then the CM (class version 2, method Send, an attribute it defines)
/// takes it, or a Get or a Set is answered as unsupported.
fn mad_verdict(payload: &[u8]) -> Option<Verdict> {
    if payload.len() != MAD_LEN {
        return None;
    }
    let h = mad::Repr::parse(&mad::Packet::new_checked(payload).ok()?).ok()?;
    if h.base_version != mad::BASE_VERSION
        || matches!(
            h.mgmt_class,
            mad::CLASS_SUBN_LID_ROUTED | mad::CLASS_SUBN_DIRECTED_ROUTE
        )
        || (h.mgmt_class == mad::CLASS_CM
            && h.attribute_id != mad::ATTR_CLASS_PORT_INFO
            && h.method != mad::METHOD_SEND)
    {
        return None;
    }
    if h.mgmt_class == mad::CLASS_CM
        && h.class_version == mad::CM_CLASS_VERSION
        && h.method == mad::METHOD_SEND
    {
        return Mad::parse(payload).ok().map(|m| Verdict::Cm(Box::new(m)));
    }
    matches!(h.method, mad::METHOD_GET | mad::METHOD_SET).then_some(Verdict::Unsupported)
}

/// What [`Nic::rdma_cm_check`] found.
enum RdmaCm {
    Holds,
    /// A REQ the CM refuses (REJ 28, or 8 if nobody listens).
    Refused(Box<rnic_wire::cm::Req>),
    /// A SIDR_REQ whose header names other addresses.
    FalseAddresses,
}

#[cfg(test)]
mod tests {
    use core::net::{Ipv4Addr, Ipv6Addr};
    use std::time::Duration;

    use rnic_wire::cm::{Message, Path, Rej};

    use super::*;
    use crate::cm::{AcceptParams, ConnectParams};
    use crate::sim::{Cluster, LinkConfig};
    use rnic_wire::mad::GSI_UDP_SOURCE_PORT;

    const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    /// A service ID of the IB CM's own, outside rdma_cm's port spaces: no
    /// rdma_cm header is asked for.
    const SERVICE: u64 = 0x1000_0000_0000_4e20;
    /// rdma_cm's TCP port 20000.
    const RDMA_CM_SERVICE: u64 = 0x0106_4e20;

    fn gid(a: IpAddr) -> Ipv6Addr {
        match a {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        }
    }

    fn connect_params() -> ConnectParams {
        ConnectParams {
            service_id: SERVICE,
            qpn: 0x123,
            starting_psn: 0x10_0000,
            responder_resources: 4,
            initiator_depth: 4,
            retry_count: 7,
            rnr_retry_count: 7,
            path_mtu: 3,
            path: Path {
                local_lid: 0xFFFF,
                remote_lid: 0xFFFF,
                local_gid: gid(A),
                remote_gid: gid(B),
                hop_limit: 64,
                local_ack_timeout: 18,
                ..Path::NONE
            },
            transport: 0,
            private_data: b"hello".to_vec(),
        }
    }

    /// Two NICs and every datagram that passed between them.
    struct Wire {
        nics: [crate::Nic; 2],
        seen: Vec<Datagram>,
    }

    impl Wire {
        fn new() -> Wire {
            Wire {
                nics: [crate::Nic::new(A, 1), crate::Nic::new(B, 2)],
                seen: Vec::new(),
            }
        }

        /// Deliver until both are quiet.
        fn run(&mut self) {
            for _ in 0..100 {
                let mut moved = false;
                for i in 0..2 {
                    while let Some(d) = self.nics[i].poll_transmit() {
                        self.nics[1 - i].handle_datagram(Time::ZERO, &d);
                        self.seen.push(d);
                        moved = true;
                    }
                }
                if !moved {
                    return;
                }
            }
            panic!("the NICs never went quiet");
        }

        fn events(&mut self, i: usize) -> Vec<CmEvent> {
            std::iter::from_fn(|| self.nics[i].poll_cm_event()).collect()
        }
    }

    /// An rdma_cm request whose header lies about where it comes from, or
    /// names an address that is not the listener's NIC's, is dropped and
    /// counted: no request reaches the listener, nothing is answered. The
    /// same request with its true addresses is taken.
    /// rdma_cm's checks of a REQ, after the listener's: a header that is
    /// not rdma_cm's, or names other addresses, or a QP type the port
    /// space does not connect, is refused with REJ 28 (REJ 8 where nobody
    /// listens), and nothing is kept.
    #[test]
    fn rdma_cm_refuses_a_request_its_header_or_type_does_not_fit() {
        use rnic_wire::cm::CmaHeader;
        const C: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3));
        let header = |src, dst, version| {
            let mut d = vec![0; 56];
            CmaHeader {
                version: 0,
                src_port: 4000,
                src,
                dst,
            }
            .emit(&mut d);
            d[0] = version;
            d
        };
        // (header, transport, listening, REJ reason or None for taken)
        let cases = [
            (header(A, B, 0), 0, true, None),
            (header(C, B, 0), 0, true, Some(28)),
            (header(A, C, 0), 0, true, Some(28)),
            (header(A, B, 1), 0, true, Some(28)),
            (vec![], 0, true, Some(28)),
            (header(A, B, 0), 1, true, Some(28)),
            (header(C, B, 0), 0, false, Some(8)),
        ];
        for (k, (data, transport, listening, want)) in cases.into_iter().enumerate() {
            let mut w = Wire::new();
            if listening {
                w.nics[1].cm().listen(RDMA_CM_SERVICE).unwrap();
            }
            let mut p = connect_params();
            p.service_id = RDMA_CM_SERVICE;
            p.private_data = data;
            p.transport = transport;
            w.nics[0]
                .cm_call(Time::ZERO, |cm, now| cm.connect(now, B, &p))
                .unwrap();
            w.run();
            let got = w.events(1);
            let g = w.nics[1].gsi_counters();
            assert_eq!(g.mads_received, 1, "case {k}");
            match want {
                None => {
                    assert!(
                        matches!(got[..], [CmEvent::Request { .. }]),
                        "case {k}: {got:?}"
                    );
                    assert_eq!(g.rejected_rdma_cm, 0, "case {k}");
                }
                Some(reason) => {
                    assert!(got.is_empty(), "case {k}: {got:?}");
                    assert_eq!(w.nics[1].cm().connections(), 0, "case {k}: nothing kept");
                    assert_eq!(g.mads_sent, 1, "case {k}: one REJ");
                    let a = w.events(0);
                    assert!(
                        matches!(&a[..], [CmEvent::Rejected { reason: r, .. }] if *r == reason),
                        "case {k}: {a:?}"
                    );
                    assert_eq!(g.rejected_rdma_cm, u64::from(listening), "case {k}");
                }
            }
        }
    }

    /// A NIC in a slot of the QP number space draws its CM IDs from the same
    /// slot, and the packets its peer sends name them: what a driver that
    /// shares an address between NICs reads ([`crate::cm::packet_addressee`]).
    #[test]
    fn a_nic_in_a_slot_is_named_by_its_peer_s_cm_packets() {
        use crate::cm::{packet_addressee, Addressee};
        let mut w = Wire::new();
        w.nics[0].restrict_qpns(0x5, 4).unwrap();
        w.nics[1].restrict_qpns(0xC, 4).unwrap();
        w.nics[1].cm().listen(SERVICE).unwrap();
        let id_a = w.nics[0]
            .cm_call(Time::ZERO, |cm, now| cm.connect(now, B, &connect_params()))
            .unwrap();
        assert_eq!(id_a.0 >> 28, 0x5);
        w.run();
        let [CmEvent::Request { id: id_b, .. }] = w.events(1)[..] else {
            panic!("B saw no REQ");
        };
        assert_eq!(id_b.0 >> 28, 0xC);
        w.nics[1]
            .cm_call(Time::ZERO, |cm, _| cm.reject(id_b, 28, b"no"))
            .unwrap();
        w.run();
        let names: Vec<_> = w
            .seen
            .iter()
            .map(|d| packet_addressee(&d.payload))
            .collect();
        assert_eq!(
            names,
            [
                Some(Addressee::Service(SERVICE)),
                Some(Addressee::Agent(id_a.0))
            ]
        );
        // Not a CM packet: nobody's.
        assert_eq!(packet_addressee(&w.seen[0].payload[..20]), None);
        // Too late once the CM has drawn IDs.
        assert!(w.nics[0].restrict_qpns(0x6, 4).is_err());
    }

    /// REQ, REP and RTU cross the simulated wire as UD packets between the
    /// two NICs' QP 1, from UDP port 55410, and each side ends with the
    /// other's QP number and PSN.
    #[test]
    fn two_nics_connect_through_qp1() {
        let mut w = Wire::new();
        let now = Time::ZERO;
        w.nics[1].cm().listen(SERVICE).unwrap();
        let id_a = w.nics[0]
            .cm_call(now, |cm, now| cm.connect(now, B, &connect_params()))
            .unwrap();
        w.run();
        let [CmEvent::Request {
            id: id_b,
            from,
            req,
        }] = &w.events(1)[..]
        else {
            panic!("B saw no REQ");
        };
        assert_eq!(
            (*from, req.local_qpn, req.starting_psn),
            (A, 0x123, 0x10_0000)
        );
        assert_eq!(&req.private_data[..5], b"hello");
        let accept = AcceptParams {
            qpn: 0x456,
            starting_psn: 0x20_0000,
            responder_resources: 4,
            initiator_depth: 4,
            rnr_retry_count: 7,
            private_data: vec![],
        };
        let id_b = *id_b;
        w.nics[1]
            .cm_call(now, |cm, now| cm.accept(now, id_b, &accept))
            .unwrap();
        w.run();
        let [CmEvent::Reply { id, rep }] = &w.events(0)[..] else {
            panic!("A saw no REP");
        };
        assert_eq!(
            (*id, rep.local_qpn, rep.starting_psn),
            (id_a, 0x456, 0x20_0000)
        );
        w.nics[0].cm_call(now, |cm, _| cm.ready(id_a)).unwrap();
        w.run();
        assert_eq!(w.events(0), [CmEvent::Established { id: id_a }]);
        assert_eq!(w.events(1), [CmEvent::Established { id: id_b }]);
        // Every packet: UD SEND_ONLY, QP 1 to QP 1, from port 55410.
        assert_eq!(w.seen.len(), 3);
        for d in &w.seen {
            assert_eq!(d.src_port, GSI_UDP_SOURCE_PORT);
            let p = IbPacket::new_checked(&d.payload[..]).unwrap();
            assert_eq!(p.bth().opcode(), Opcode::UD_SEND_ONLY);
            assert_eq!(p.bth().dest_qp(), GSI_QPN);
            assert_eq!(
                p.deth().map(|d| (d.q_key(), d.src_qp())),
                Some((GSI_QKEY, 1))
            );
        }
        assert_eq!(w.nics[1].gsi_counters().mads_received, 2);
        assert_eq!(w.nics[0].gsi_counters().mads_sent, 2);
    }

    /// Events wait their turn: two REQs taken in one go are two requests,
    /// each polled on its own.
    #[test]
    fn cm_events_are_polled_one_at_a_time() {
        let mut w = Wire::new();
        w.nics[1].cm().listen(SERVICE).unwrap();
        for qpn in [0x123, 0x124] {
            let mut p = connect_params();
            p.qpn = qpn;
            w.nics[0]
                .cm_call(Time::ZERO, |cm, now| cm.connect(now, B, &p))
                .unwrap();
        }
        w.run();
        let first = w.nics[1].poll_cm_event();
        let second = w.nics[1].poll_cm_event();
        assert!(matches!(first, Some(CmEvent::Request { req, .. }) if req.local_qpn == 0x123));
        assert!(matches!(second, Some(CmEvent::Request { req, .. }) if req.local_qpn == 0x124));
        assert_eq!(w.nics[1].poll_cm_event(), None);
    }

    /// A flood of REQs nobody completes holds no more than the listener's
    /// backlog: the rest are dropped (counted, no REJ: the kernel's CM
    /// leaves a retry its chance), and answering one makes room.
    #[test]
    fn a_req_flood_holds_the_backlog_and_no_more() {
        let mut w = Wire::new();
        w.nics[1].cm().listen_with_backlog(SERVICE, 4).unwrap();
        for k in 0..100 {
            let mut p = connect_params();
            p.qpn = 0x200 + k;
            w.nics[0]
                .cm_call(Time::ZERO, |cm, now| cm.connect(now, B, &p))
                .unwrap();
        }
        w.run();
        let requests = w.events(1);
        assert_eq!(requests.len(), 4);
        assert_eq!(w.nics[1].cm().connections(), 4);
        assert_eq!(w.nics[1].cm().requests_dropped, 96);
        assert!(w.seen.iter().all(|d| d.src == A), "B answered the flood");
        // Refusing one makes room for the next REQ (a retry, here a new one).
        let CmEvent::Request { id, .. } = requests[0] else {
            panic!()
        };
        w.nics[1]
            .cm_call(Time::ZERO, |cm, _| cm.reject(id, 28, &[]))
            .unwrap();
        let mut p = connect_params();
        p.qpn = 0x999;
        w.nics[0]
            .cm_call(Time::ZERO, |cm, now| cm.connect(now, B, &p))
            .unwrap();
        w.run();
        assert!(
            matches!(&w.events(1)[..], [CmEvent::Request { req, .. }] if req.local_qpn == 0x999)
        );
    }

    /// A packet to QP 1 from A's address, built from parts.
    fn to_qp1(opcode: Opcode, p_key: u16, q_key: u32, mad: &[u8]) -> Datagram {
        let mut ib = IbRepr::new(bth::Repr::new(opcode, GSI_QPN, Psn::new(0)));
        ib.bth.p_key = p_key;
        ib.deth = Some(deth::Repr {
            q_key,
            src_qp: GSI_QPN,
        });
        if opcode == Opcode::UD_SEND_ONLY_WITH_IMMEDIATE {
            ib.immdt = Some(rnic_wire::immdt::Repr { immediate: 0 });
        }
        ib.payload_len = mad.len();
        let mut buf = vec![0; ib.buffer_len()];
        ib.emit_with(&mut buf, |p| p.copy_from_slice(mad)).unwrap();
        let n = buf.len();
        let crc = icrc::for_udp(A, B, GSI_UDP_SOURCE_PORT, &buf[..n - 4]).unwrap();
        buf[n - 4..].copy_from_slice(&crc.to_le_bytes());
        Datagram::new(A, B, GSI_UDP_SOURCE_PORT, buf)
    }

    fn req_mad() -> [u8; MAD_LEN] {
        // A REQ as A's CM would send it, taken off the wire.
        let mut a = crate::Nic::new(A, 1);
        let now = Time::ZERO;
        a.cm_call(now, |cm, now| cm.connect(now, B, &connect_params()))
            .unwrap();
        let d = a.poll_transmit().unwrap();
        let p = IbPacket::new_checked(&d.payload[..]).unwrap();
        p.payload()[..MAD_LEN].try_into().unwrap()
    }

    /// QP 1 takes only a UD SEND_ONLY of the default partition with the
    /// GSI's Q_Key carrying a CM MAD (IBTA 13.5.1, as rdma_rxe's
    /// `check_keys` for QP 1): anything else is dropped and counted,
    /// and never reaches a listener.
    /// A Get or a Set nobody serves comes back as a GetResp of status
    /// 0x000C, the rest of the MAD as it was: the kernel's MAD layer's
    /// answer, for the SA's class and for the CM's ClassPortInfo alike.
    #[test]
    fn a_get_nobody_serves_is_answered_unsupported() {
        for (class, attribute, method) in [
            (0x03, 0x0035, mad::METHOD_GET),
            (mad::CLASS_CM, mad::ATTR_CLASS_PORT_INFO, mad::METHOD_GET),
            (0x04, 0x0010, mad::METHOD_SET),
        ] {
            let mut m = req_mad();
            m[1] = class;
            m[3] = method;
            m[16..18].copy_from_slice(&attribute.to_be_bytes());
            let mut b = crate::Nic::new(B, 2);
            b.handle_datagram(
                Time::ZERO,
                &to_qp1(Opcode::UD_SEND_ONLY, 0xFFFF, GSI_QKEY, &m),
            );
            let d = b.poll_transmit().expect("an answer");
            assert!(b.poll_transmit().is_none());
            assert_eq!(d.dst, A);
            let ib = rnic_wire::IbPacket::new_checked(&d.payload[..]).unwrap();
            assert_eq!(ib.bth().dest_qp(), GSI_QPN);
            let got = ib.payload();
            let mut want = m;
            want[3] = mad::METHOD_GET_RESP;
            want[4..6].copy_from_slice(&0x000Cu16.to_be_bytes());
            assert_eq!(got, &want[..], "class {class:#x}");
            assert_eq!(b.gsi_counters().answered_unsupported, 1);
        }
    }

    #[test]
    fn qp1_takes_only_gsi_cm_mads() {
        let good = req_mad();
        let mut other_class = good;
        other_class[1] = 0x04; // the SA's class
        let mut unknown_attr = good;
        unknown_attr[16..18].copy_from_slice(&0x0099u16.to_be_bytes());
        let mut base_version = good;
        base_version[0] = 2;
        let mut class_version = good;
        class_version[2] = 1;
        let mut long = good.to_vec();
        long.extend_from_slice(&[0x55; 64]);
        let mut cm_get = good;
        cm_get[3] = mad::METHOD_GET; // a Get of a REQ: no such method
        let mut smp_get = good;
        smp_get[1] = mad::CLASS_SUBN_LID_ROUTED;
        smp_get[3] = mad::METHOD_GET;
        let bad = [
            (
                to_qp1(Opcode::UD_SEND_ONLY, 0xFFFF, 0x8001_0001, &good),
                "Q_Key",
            ),
            (
                to_qp1(Opcode::UD_SEND_ONLY, 0xFFFF, 0x0000_0000, &good),
                "Q_Key 0",
            ),
            (
                to_qp1(Opcode::UD_SEND_ONLY, 0x1234, GSI_QKEY, &good),
                "P_Key",
            ),
            (
                to_qp1(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE, 0xFFFF, GSI_QKEY, &good),
                "opcode",
            ),
            (
                to_qp1(Opcode::UD_SEND_ONLY, 0xFFFF, GSI_QKEY, &good[..200]),
                "short",
            ),
            (
                to_qp1(Opcode::UD_SEND_ONLY, 0xFFFF, GSI_QKEY, &other_class),
                "class",
            ),
            (
                to_qp1(Opcode::UD_SEND_ONLY, 0xFFFF, GSI_QKEY, &unknown_attr),
                "attribute",
            ),
            (
                to_qp1(Opcode::UD_SEND_ONLY, 0xFFFF, GSI_QKEY, &base_version),
                "base version",
            ),
            (
                to_qp1(Opcode::UD_SEND_ONLY, 0xFFFF, GSI_QKEY, &class_version),
                "class version",
            ),
            (
                to_qp1(Opcode::UD_SEND_ONLY, 0xFFFF, GSI_QKEY, &long),
                "long",
            ),
            (
                to_qp1(Opcode::UD_SEND_ONLY, 0xFFFF, GSI_QKEY, &cm_get),
                "CM Get",
            ),
            (
                to_qp1(Opcode::UD_SEND_ONLY, 0xFFFF, GSI_QKEY, &smp_get),
                "SMP Get",
            ),
        ];
        let mut b = crate::Nic::new(B, 2);
        b.cm().listen(SERVICE).unwrap();
        for (d, what) in &bad {
            b.handle_datagram(Time::ZERO, d);
            assert!(b.poll_cm_event().is_none(), "{what}: reached the listener");
            assert!(b.poll_transmit().is_none(), "{what}: answered");
        }
        let g = b.gsi_counters();
        assert_eq!((g.dropped_bad_header, g.dropped_bad_mad), (4, 8));
        // The same MAD, as it should be, is a REQ for the listener.
        b.handle_datagram(
            Time::ZERO,
            &to_qp1(Opcode::UD_SEND_ONLY, 0xFFFF, GSI_QKEY, &good),
        );
        assert!(matches!(b.poll_cm_event(), Some(CmEvent::Request { .. })));
        assert_eq!(b.gsi_counters().mads_received, 1);
    }

    /// A REQ to a service nobody listens on is refused on the wire with
    /// reason 8 and Local Communication ID 0, as the kernel's CM does; the
    /// active side learns it as a rejection.
    #[test]
    fn no_listener_is_a_rej_8_on_the_wire() {
        let mut w = Wire::new();
        let id = w.nics[0]
            .cm_call(Time::ZERO, |cm, now| cm.connect(now, B, &connect_params()))
            .unwrap();
        w.run();
        let rej = w
            .seen
            .iter()
            .filter(|d| d.src == B)
            .find_map(|d| {
                let p = IbPacket::new_checked(&d.payload[..]).ok()?;
                match Mad::parse(&p.payload()[..MAD_LEN]).ok()?.message {
                    Message::Rej(r) => Some(r),
                    _ => None,
                }
            })
            .expect("B sent a REJ");
        let Rej {
            reason,
            local_comm_id,
            remote_comm_id,
            ..
        } = rej;
        assert_eq!((reason, local_comm_id, remote_comm_id), (8, 0, id.0));
        assert!(matches!(
            &w.events(0)[..],
            [CmEvent::Rejected { reason: 8, .. }]
        ));
    }

    /// A REQ that goes unanswered is sent again on the CM's timer, which
    /// the NIC's own deadline includes, and the attempt ends unreachable
    /// once the retries are spent.
    #[test]
    fn the_cm_timer_is_the_nic_s() {
        let mut c = Cluster::new(11, LinkConfig::default(), 2);
        c.net.partition(A, B);
        let now = c.now;
        let mut p = connect_params();
        p.path.local_ack_timeout = 18;
        let id = c.nics[0]
            .cm_call(now, |cm, now| {
                cm.max_retries = 2;
                cm.response_timeout = 8;
                cm.connect(now, B, &p)
            })
            .unwrap();
        assert!(c.nics[0].next_deadline().is_some(), "the REQ's retry timer");
        let limit = c.now + Duration::from_secs(600);
        c.run(limit, 10_000);
        assert_eq!(c.nics[0].gsi_counters().mads_sent, 3);
        let events: Vec<_> = std::iter::from_fn(|| c.nics[0].poll_cm_event()).collect();
        assert_eq!(events, [CmEvent::Unreachable { id }]);
        assert_eq!(c.nics[0].next_deadline(), None);
    }
}
