//! A two-NIC session driven by arbitrary bytes: the body of the `nic_packets`
//! fuzz target.
//!
//! Two NICs with a connected QP pair (RC, UC or UD). The input decides, step
//! by step: packets forged with a correct ICRC (so they reach the transport,
//! not just the parser); work requests good and bad on both sides (every
//! operation, wrong keys, fences, inline data); receives; the real traffic
//! held in flight, then delivered in any order, duplicated or dropped, so that
//! responses interleave with timers and posts; time advanced by microseconds
//! (inside RNR and ACK timers) or by milliseconds (through them); and the QP
//! moved to SQD, back to RTS, or to ERR.
//!
//! Nothing may panic; every completion must belong to a posted work request,
//! and none may complete twice.

use core::net::{IpAddr, Ipv4Addr};
use std::collections::HashSet;
use std::time::Duration;

use rnic_wire::icrc;

use crate::cq::CqHandle;
use crate::mem::Access;
use crate::qp::{AddressVector, AttrMask, Mtu, QpAttr, QpState, QpType};
use crate::time::Time;
use crate::wr::{sg_list, InlineData, RecvWr, SendOp, SendWr, Sge, UdDest};
use crate::Datagram;
use crate::{Nic, QpCaps};

use super::{Input, MTUS};

const IOVA: u64 = 0x10_0000;
const LEN: usize = 16384;
/// Datagrams held in flight per direction; beyond it the oldest is lost.
const IN_FLIGHT: usize = 256;
/// Steps taken from one input.
const STEPS: usize = 256;

struct Side {
    nic: Nic,
    addr: IpAddr,
    qpn: u32,
    cq: CqHandle,
    lkey: u32,
    rkey: u32,
}

fn side(i: u8, qp_type: QpType) -> Option<Side> {
    let addr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, i));
    let mut nic = Nic::new(addr, u64::from(i));
    let pd = nic.alloc_pd();
    let cq = nic.create_cq(4096);
    let qpn = nic.create_qp(pd, qp_type, cq, cq, QpCaps::default()).ok()?;
    let access =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let keys = nic
        .reg_mr(
            pd,
            IOVA,
            Box::new(vec![0u8; LEN]),
            access | Access::FLUSH_GLOBAL,
        )
        .ok()?;
    Some(Side {
        nic,
        addr,
        qpn,
        cq,
        lkey: keys.lkey,
        rkey: keys.rkey,
    })
}

fn connect(me: &mut Side, peer: (IpAddr, u32), mtu: Mtu, now: Time) {
    let attr = QpAttr {
        qp_access_flags: Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC
            | Access::FLUSH_GLOBAL,
        ah_attr: Some(AddressVector {
            dest: peer.0,
            src: None,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
        }),
        path_mtu: mtu,
        dest_qp_num: peer.1,
        rq_psn: 0xFF_FFF0,
        sq_psn: 0xFF_FFF0,
        max_dest_rd_atomic: 4,
        max_rd_atomic: 4,
        timeout: 4,
        retry_cnt: 2,
        rnr_retry: 2,
        min_rnr_timer: 1,
        qkey: 0x1111_1111,
        ..QpAttr::default()
    };
    let _ = me.nic.to_rts(now, me.qpn, &attr);
}

/// A packet made of input bytes, aimed at `to`'s QP if asked, with an ICRC
/// that verifies, from `from`. With bit 2 of `aim` it is a response the
/// requester there would look at: an RC response opcode (ACK, NAK, READ
/// response, atomic ACK: the AETH syndrome and MSN from the input), the
/// default P_Key, TVer 0, and a PSN in or just past its window of
/// unacknowledged PSNs, where random bytes almost never land.
fn forge(input: &mut Input<'_>, from: IpAddr, to: &Side) -> Datagram {
    let n = usize::from(input.byte()) + 16;
    let aim = input.byte();
    let mut p = input.bytes(n);
    if aim & 1 == 1 {
        p[5..8].copy_from_slice(&to.qpn.to_be_bytes()[1..]);
    }
    if aim & 4 != 0 {
        // RDMA READ response FIRST, MIDDLE, LAST, ONLY; ACKNOWLEDGE; ATOMIC
        // ACKNOWLEDGE.
        p[0] = [0x0D, 0x0E, 0x0F, 0x10, 0x11, 0x12][usize::from(p[0] % 6)];
        p[1] &= 0x30; // pad count from the input; no SE, MigReq 0, TVer 0
        p[2..4].copy_from_slice(&rnic_wire::bth::DEFAULT_P_KEY.to_be_bytes());
        p[5..8].copy_from_slice(&to.qpn.to_be_bytes()[1..]);
        if let Some((una, outstanding)) = to.nic.send_window(to.qpn) {
            let psn = una.add(u32::from(p[9]) % (outstanding + 2));
            p[8] = 0;
            p[9..12].copy_from_slice(&psn.value().to_be_bytes()[1..]);
        }
    }
    let port = 0xC000 | u16::from(aim >> 1);
    if let Ok(crc) = icrc::for_udp(from, to.addr, port, &p[..n - 4]) {
        p[n - 4..].copy_from_slice(&crc.to_le_bytes());
    }
    Datagram::new(from, to.addr, port, p)
}

/// A send work request: `kind` picks the operation (`kind % 10`) and its
/// flaws (bit 7: a key from the input; bit 5: a wrong lkey; bit 4:
/// unsignaled; bit 3: fenced; bit 2: inline), then local offset (x64),
/// length (x48) and remote offset (x56).
fn work_request(input: &mut Input<'_>, s: &Side, peer_rkey: u32, id: u64) -> SendWr {
    let kind = input.byte();
    let off = u64::from(input.byte()) * 64;
    let len = u32::from(input.byte()) * 48;
    let rkey = if kind & 0x80 == 0 {
        peer_rkey
    } else {
        input.u32()
    };
    let remote_addr = IOVA + u64::from(input.byte()) * 56;
    let op = match kind % 10 {
        0 => SendOp::send(),
        1 => SendOp::send_imm(input.u32()),
        2 => SendOp::write(remote_addr, rkey),
        3 => SendOp::write_imm(remote_addr, rkey, 7),
        4 => SendOp::read(remote_addr, rkey),
        5 => SendOp::compare_swap(remote_addr, rkey, 0, 1),
        6 => SendOp::fetch_add(remote_addr, rkey, 1),
        7 => SendOp::AtomicWrite {
            remote_addr,
            rkey,
            data: [3; 8],
        },
        8 => SendOp::Flush {
            remote_addr,
            rkey,
            len,
            placement: input.byte() & 3,
            whole_region: kind & 0x40 != 0,
        },
        _ => SendOp::SendWithInv {
            invalidate_rkey: rkey,
        },
    };
    let atomic = matches!(op, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. });
    SendWr::new(
        id,
        op,
        sg_list![Sge {
            addr: IOVA + off,
            length: if atomic { 8 } else { len },
            lkey: if kind & 0x20 == 0 { s.lkey } else { s.lkey ^ 1 },
        }],
    )
    .signaled(kind & 0x10 == 0)
    .fence(kind & 0x08 != 0)
    .inline((kind & 0x04 != 0).then(|| InlineData::from_elem(9, usize::from(input.byte()))))
}

/// The steps an input byte selects (`byte % 10`), and what they read next.
mod step {
    /// Forge a packet to B (then: length - 16, aim, bytes).
    pub const FORGE_TO_B: u8 = 0;
    /// Forge a packet to A.
    pub const FORGE_TO_A: u8 = 1;
    /// Post a send work request at A (see `work_request`).
    pub const POST_A: u8 = 2;
    /// Post a send work request at B.
    pub const POST_B: u8 = 3;
    /// Post a receive (then: length / 32; bit 0 of the step byte's high
    /// nibble picks A, else B).
    pub const RECV: u8 = 4;
    /// Take what both NICs want to send into the network.
    pub const COLLECT: u8 = 5;
    /// Deliver a datagram in flight (then: bit 0 the direction, 1 = B to A;
    /// bit 1 keep a copy in flight, a duplicate; the rest picks which).
    pub const DELIVER: u8 = 6;
    /// Drop a datagram in flight (then: as for DELIVER).
    pub const DROP: u8 = 7;
    /// Advance time (then: bit 7 set, (b & 0x7f) x 500 us; else b us) and
    /// run the timers.
    pub const TIME: u8 = 8;
    /// Modify A's QP (then: 0 SQD, 1 RTS, 2 ERR).
    pub const MODIFY: u8 = 9;
}

/// Which of the queued datagrams, and how, a DELIVER or DROP step names.
fn pick(input: &mut Input<'_>, queues: &[Vec<Datagram>; 2]) -> Option<(usize, usize, bool)> {
    let b = input.byte();
    let dir = usize::from(b & 1);
    let q = &queues[dir];
    if q.is_empty() {
        return None;
    }
    Some((dir, usize::from(b >> 2) % q.len(), b & 2 != 0))
}

/// Run one session from `data`. Panics if an invariant breaks (or the engine does).
pub fn run(data: &[u8]) {
    let mut input = Input(data);
    let setup = input.byte();
    let qp_type = [QpType::Rc, QpType::Uc, QpType::Ud][usize::from(setup % 3)];
    let mtu = MTUS[usize::from((setup >> 2) % 3)];
    let mut now = Time(1_000_000);
    let (Some(mut a), Some(mut b)) = (side(1, qp_type), side(2, qp_type)) else {
        panic!("the harness sets up");
    };
    let (pa, pb) = ((a.addr, a.qpn), (b.addr, b.qpn));
    connect(&mut a, pb, mtu, now);
    connect(&mut b, pa, mtu, now);
    let mut posted: HashSet<u64> = HashSet::new();
    let mut id = 0u64;
    // In flight: [A to B, B to A].
    let mut net: [Vec<Datagram>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..STEPS {
        if input.done() {
            break;
        }
        let s = input.byte();
        match s % 10 {
            step::FORGE_TO_B => {
                let d = forge(&mut input, a.addr, &b);
                b.nic.handle_datagram(now, &d);
            }
            step::FORGE_TO_A => {
                let d = forge(&mut input, b.addr, &a);
                a.nic.handle_datagram(now, &d);
            }
            step::POST_A | step::POST_B => {
                id += 1;
                let (me, peer) = if s % 10 == step::POST_A {
                    (&mut a, &b)
                } else {
                    (&mut b, &a)
                };
                let wr = work_request(&mut input, me, peer.rkey, id);
                let ok = if qp_type == QpType::Ud {
                    let to = UdDest {
                        dest: peer.addr,
                        src: None,
                        qpn: peer.qpn,
                        qkey: 0x1111_1111,
                    };
                    me.nic.post_send_ud(now, me.qpn, wr, to).is_ok()
                } else {
                    me.nic.post_send(now, me.qpn, wr).is_ok()
                };
                if ok {
                    posted.insert(id);
                }
            }
            step::RECV => {
                id += 1;
                let len = u32::from(input.byte()) * 32;
                let me = if (s >> 4) & 1 == 1 { &mut a } else { &mut b };
                let wr = RecvWr {
                    wr_id: id,
                    sg_list: sg_list![Sge {
                        addr: IOVA,
                        length: len,
                        lkey: me.lkey,
                    }],
                };
                if me.nic.post_recv(now, me.qpn, wr).is_ok() {
                    posted.insert(id);
                }
            }
            step::COLLECT => {
                for (dir, nic) in [(0, &mut a.nic), (1, &mut b.nic)] {
                    while let Some(d) = nic.poll_transmit() {
                        if net[dir].len() == IN_FLIGHT {
                            net[dir].remove(0);
                        }
                        net[dir].push(d);
                    }
                }
            }
            step::DELIVER => {
                if let Some((dir, i, keep)) = pick(&mut input, &net) {
                    let d = if keep {
                        net[dir][i].clone()
                    } else {
                        net[dir].remove(i)
                    };
                    let to = if dir == 0 { &mut b.nic } else { &mut a.nic };
                    to.handle_datagram(now, &d);
                }
            }
            step::DROP => {
                if let Some((dir, i, _)) = pick(&mut input, &net) {
                    net[dir].remove(i);
                }
            }
            step::TIME => {
                let t = input.byte();
                now = now
                    + if t & 0x80 != 0 {
                        Duration::from_micros(u64::from(t & 0x7f) * 500)
                    } else {
                        Duration::from_micros(u64::from(t))
                    };
                a.nic.handle_timeout(now);
                b.nic.handle_timeout(now);
            }
            step::MODIFY => {
                let state = match input.byte() % 3 {
                    0 => QpState::Sqd,
                    1 => QpState::Rts,
                    _ => QpState::Err,
                };
                let attr = QpAttr {
                    qp_state: state,
                    ..QpAttr::default()
                };
                let _ = a.nic.modify_qp(now, a.qpn, &attr, AttrMask::STATE);
            }
            _ => {}
        }
    }
    let mut completed = HashSet::new();
    for s in [&mut a, &mut b] {
        if let Ok(done) = s.nic.poll_cq(s.cq, usize::MAX) {
            for c in done {
                assert!(posted.contains(&c.wr_id), "a completion for nothing: {c:?}");
                assert!(completed.insert(c.wr_id), "completed twice: {c:?}");
            }
        }
    }
}
