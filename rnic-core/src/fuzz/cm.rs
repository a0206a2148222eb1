//! The communication manager on QP 1 (`cm`): two NICs, A connecting and B
//! listening with a small backlog, driven by the input. It forges MADs to
//! B's QP 1 (arbitrary bytes behind a good header, or a real message with
//! fields rewritten: another comm ID, attribute, TID), drops, duplicates
//! and reorders the real exchange, lets time pass, and makes either side's
//! application accept, reject, get ready or disconnect.
//!
//! Nothing may panic, and:
//! - B reports a connection established only if its application accepted
//!   it (no forged RTU or REQ makes one);
//! - B never holds more unanswered requests than its backlog, and every
//!   connection it holds, past a timewait and every retry, is one its
//!   application still has to answer or one it connected;
//! - every packet either NIC sends is a well-formed UD SEND to QP 1.

use core::net::{IpAddr, Ipv4Addr};
use std::collections::HashSet;
use std::time::Duration;

use rnic_wire::cm::{Mad, Path};
use rnic_wire::mad::{GSI_QKEY, GSI_QPN, MAD_LEN};
use rnic_wire::{bth, deth, IbPacket, IbRepr, Opcode, Psn};

use super::{assert_well_formed, datagram, Input};
use crate::cm::{AcceptParams, CmEvent, CmId, ConnectParams};
use crate::time::Time;
use crate::{Datagram, Nic};

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 9, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 9, 0, 2));
/// A service ID of the IB CM's own: the REQs here carry no rdma_cm header,
/// which rdma_cm's port spaces would refuse (REJ 28).
const SERVICE: u64 = 0x1000_0000_0000_4e20;
const BACKLOG: usize = 3;

fn gid(a: IpAddr) -> core::net::Ipv6Addr {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

fn connect_params(qpn: u32) -> ConnectParams {
    ConnectParams {
        service_id: SERVICE,
        qpn,
        starting_psn: qpn * 3,
        responder_resources: 1,
        initiator_depth: 1,
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
        private_data: vec![1, 2, 3],
    }
}

/// A UD SEND_ONLY to B's QP 1 from A carrying `payload`.
fn to_b(payload: &[u8], bad_icrc: bool) -> Datagram {
    let mut ib = IbRepr::new(bth::Repr::new(Opcode::UD_SEND_ONLY, GSI_QPN, Psn::new(0)));
    ib.deth = Some(deth::Repr {
        q_key: GSI_QKEY,
        src_qp: GSI_QPN,
    });
    ib.payload_len = payload.len();
    let mut buf = vec![0u8; ib.buffer_len()];
    if ib
        .emit_with(&mut buf, |p| p.copy_from_slice(payload))
        .is_err()
    {
        buf.clear();
    }
    buf.truncate(buf.len().saturating_sub(4));
    datagram(A, B, rnic_wire::mad::GSI_UDP_SOURCE_PORT, buf, bad_icrc)
}

/// The CM MAD a datagram carries, if it is one.
fn mad_of(d: &Datagram) -> Option<Mad> {
    let p = IbPacket::new_checked(&d.payload[..]).ok()?;
    Mad::parse(p.payload().get(..MAD_LEN)?).ok()
}

/// Run one session on `data`.
pub fn run(data: &[u8]) {
    let mut input = Input(data);
    let mut a = Nic::new(A, u64::from(input.byte()));
    let mut b = Nic::new(B, u64::from(input.byte()) + 1000);
    b.cm().listen_with_backlog(SERVICE, BACKLOG).ok();
    let mut now = Time::ZERO;
    // Datagrams on the wire, each with its destination's index.
    let mut wire: Vec<Datagram> = Vec::new();
    // B's requests its application has not answered, and those it accepted.
    let mut pending: Vec<CmId> = Vec::new();
    let mut pending_sidr: Vec<CmId> = Vec::new();
    let mut accepted: HashSet<CmId> = HashSet::new();
    // A's connections that got a REP, not yet ready.
    let mut replied: Vec<CmId> = Vec::new();
    let mut established_b: HashSet<CmId> = HashSet::new();
    let mut established_a: Vec<CmId> = Vec::new();
    let mut qpn = 0x100u32;
    let mut last_real: Option<[u8; MAD_LEN]> = None;

    for _ in 0..400 {
        if input.done() {
            break;
        }
        match input.byte() % 14 {
            // A connects.
            0 | 1 => {
                qpn += 1;
                let _ = a.cm_call(now, |cm, now| cm.connect(now, B, &connect_params(qpn)));
            }
            // Deliver the oldest datagram on the wire (or one chosen).
            2..=4 if !wire.is_empty() => {
                let k = usize::from(input.byte()) % wire.len();
                let d = if input.byte() % 4 == 0 {
                    wire.remove(k)
                } else {
                    wire.remove(0)
                };
                if d.src == A {
                    if let Some(m) = mad_of(&d) {
                        let mut raw = [0u8; MAD_LEN];
                        m.emit(&mut raw);
                        last_real = Some(raw);
                    }
                }
                let to = if d.dst == B { &mut b } else { &mut a };
                to.handle_datagram(now, &d);
            }
            // Duplicate or drop one.
            5 if !wire.is_empty() => {
                let k = usize::from(input.byte()) % wire.len();
                if input.byte() % 2 == 0 {
                    wire.push(wire[k].clone());
                } else {
                    wire.remove(k);
                }
            }
            // Forge: arbitrary bytes, or the last real MAD A sent with some
            // bytes rewritten (a comm ID, the attribute, the TID, a field).
            6 => {
                let mut m = match last_real {
                    Some(raw) if input.byte() % 2 == 0 => raw.to_vec(),
                    _ => input.bytes(MAD_LEN),
                };
                for _ in 0..(input.byte() % 4) {
                    let at = usize::from(input.byte()) % m.len().max(1);
                    if let Some(x) = m.get_mut(at) {
                        *x = input.byte();
                    }
                }
                let len = if input.byte() % 8 == 0 {
                    usize::from(input.byte()) % (MAD_LEN + 8)
                } else {
                    MAD_LEN
                };
                m.resize(len, 0);
                let bad = input.byte() % 16 == 0;
                b.handle_datagram(now, &to_b(&m, bad));
            }
            // Time passes (up to a few response timeouts).
            7 => {
                now = now + Duration::from_millis(u64::from(input.u16()) * 20);
                for nic in [&mut a, &mut b] {
                    if nic.next_deadline().is_some_and(|d| d <= now) {
                        nic.handle_timeout(now);
                    }
                }
            }
            // B's application accepts or rejects a pending request.
            8 if !pending_sidr.is_empty() && input.byte() % 2 == 0 => {
                let id = pending_sidr.remove(0);
                let status = input.byte() % 3;
                let _ = b.cm_call(now, |cm, _| {
                    cm.sidr_reply(id, status, 0x16, 0x0123_4567, b"ud")
                });
            }
            8 if !pending.is_empty() => {
                let k = usize::from(input.byte()) % pending.len();
                let id = pending.remove(k);
                if input.byte() % 3 == 0 {
                    let _ = b.cm_call(now, |cm, _| cm.reject(id, 28, b"no"));
                } else {
                    let p = AcceptParams {
                        qpn: 0x5000 + id.0 % 0x1000,
                        starting_psn: 7,
                        responder_resources: 1,
                        initiator_depth: 1,
                        rnr_retry_count: 7,
                        private_data: vec![9],
                    };
                    if b.cm_call(now, |cm, now| cm.accept(now, id, &p)).is_ok() {
                        accepted.insert(id);
                    }
                }
            }
            // A's application makes a replied connection ready (RTU).
            9 => {
                if let Some(id) = replied.pop() {
                    let _ = a.cm_call(now, |cm, _| cm.ready(id));
                }
            }
            // Either side disconnects an established connection.
            10 => {
                if input.byte() % 2 == 0 {
                    if let Some(&id) = established_a.first() {
                        let _ = a.cm_call(now, |cm, now| cm.disconnect(now, id));
                    }
                } else if let Some(&id) = established_b.iter().next() {
                    let _ = b.cm_call(now, |cm, now| cm.disconnect(now, id));
                }
            }
            // A asks by SIDR for B's UD QP.
            11 => {
                let n = usize::from(input.byte() % 8);
                let data = input.bytes(n);
                let _ = a.cm_call(now, |cm, now| cm.sidr_request(now, B, SERVICE, &data));
            }
            // Either side's application destroys one of its IDs, in
            // whatever state it is.
            12 => {
                if input.byte() % 2 == 0 {
                    let ids: Vec<CmId> = established_a.iter().chain(&replied).copied().collect();
                    if !ids.is_empty() {
                        let id = ids[usize::from(input.byte()) % ids.len()];
                        a.cm_call(now, |cm, now| cm.destroy(now, id));
                        established_a.retain(|&x| x != id);
                        replied.retain(|&x| x != id);
                    }
                } else {
                    let ids: Vec<CmId> = pending
                        .iter()
                        .chain(&accepted)
                        .chain(&pending_sidr)
                        .copied()
                        .collect();
                    if !ids.is_empty() {
                        let id = ids[usize::from(input.byte()) % ids.len()];
                        b.cm_call(now, |cm, now| cm.destroy(now, id));
                        pending.retain(|&x| x != id);
                        pending_sidr.retain(|&x| x != id);
                        accepted.remove(&id);
                        established_b.remove(&id);
                    }
                }
            }
            // Nothing happens.
            _ => {}
        }
        // What the NICs sent goes on the wire; what they report is taken.
        for nic in [&mut a, &mut b] {
            while let Some(d) = nic.poll_transmit() {
                assert_well_formed(&d);
                let p = IbPacket::new_checked(&d.payload[..]).expect("well formed");
                assert_eq!(p.bth().dest_qp(), GSI_QPN, "only QP 1 speaks here");
                wire.push(d);
            }
        }
        wire.truncate(64);
        while let Some(e) = b.poll_cm_event() {
            match e {
                CmEvent::Request { id, .. } => pending.push(id),
                CmEvent::Established { id } => {
                    assert!(
                        accepted.contains(&id),
                        "B established {id:?}, which its application never accepted"
                    );
                    established_b.insert(id);
                }
                CmEvent::Rejected { id, .. } | CmEvent::Unreachable { id } => {
                    pending.retain(|&p| p != id);
                    established_b.remove(&id);
                }
                CmEvent::DisconnectRequest { id } | CmEvent::Disconnected { id } => {
                    established_b.remove(&id);
                }
                CmEvent::SidrRequest { id, .. } => pending_sidr.push(id),
                CmEvent::Reply { .. } | CmEvent::SidrReply { .. } => {
                    panic!("B, which never connects, got an answer")
                }
            }
        }
        while let Some(e) = a.poll_cm_event() {
            match e {
                CmEvent::Reply { id, .. } => replied.push(id),
                CmEvent::Established { id } => established_a.push(id),
                CmEvent::DisconnectRequest { id }
                | CmEvent::Disconnected { id }
                | CmEvent::Rejected { id, .. }
                | CmEvent::Unreachable { id } => {
                    established_a.retain(|&x| x != id);
                    replied.retain(|&x| x != id);
                }
                CmEvent::Request { .. } | CmEvent::SidrRequest { .. } => {
                    panic!("A, which never listens, got a request")
                }
                _ => {}
            }
        }
        assert!(
            pending.len() + pending_sidr.len() <= BACKLOG,
            "B holds {} unanswered requests, more than its backlog",
            pending.len() + pending_sidr.len()
        );
        assert!(b.cm().requests_dropped <= 400);
    }
    // Everything on the wire arrives; then long enough for every retry and
    // timewait to end.
    for d in wire.drain(..) {
        let to = if d.dst == B { &mut b } else { &mut a };
        to.handle_datagram(now, &d);
    }
    for nic in [&mut a, &mut b] {
        // Each connection's retries and timewait end (about 17 rounds
        // each, a few connections' deadlines apart).
        for _ in 0..20_000 {
            let Some(t) = nic.next_deadline() else { break };
            now = now.max(t);
            nic.handle_timeout(now);
            while nic.poll_transmit().is_some() {}
        }
        assert_eq!(nic.next_deadline(), None, "a CM timer that never ends");
    }
    // What B still holds: requests its application has not answered, and
    // connections it accepted that are still up (never more).
    assert!(
        b.cm().connections() <= BACKLOG + accepted.len(),
        "B holds {} connections: its backlog is {BACKLOG} and it accepted {}",
        b.cm().connections(),
        accepted.len()
    );
}
