//! Two NICs with a connected QP pair (RC, UC or UD), driven by the fuzzer: it
//! forges packets with a correct ICRC (so they reach the transport, not just
//! the parser), posts work requests good and bad, moves or drops the real
//! traffic, and advances time. Nothing may panic, and every completion must
//! belong to a work request that was posted.

#![no_main]

use core::net::{IpAddr, Ipv4Addr};
use std::collections::HashSet;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use rnic_core::cq::CqHandle;
use rnic_core::mem::Access;
use rnic_core::qp::{Mtu, QpAttr, QpType};
use rnic_core::sim::Datagram;
use rnic_core::time::Time;
use rnic_core::wr::{RecvWr, SendOp, SendWr, Sge, UdDest};
use rnic_core::{Nic, QpCaps};
use rnic_wire::icrc;

const IOVA: u64 = 0x10_0000;
const LEN: usize = 16384;

struct Side {
    nic: Nic,
    addr: IpAddr,
    qpn: u32,
    cq: CqHandle,
    lkey: u32,
    rkey: u32,
}

fn side(i: u8, qp_type: QpType) -> Side {
    let addr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, i));
    let mut nic = Nic::new(addr, u64::from(i));
    let pd = nic.alloc_pd();
    let cq = nic.create_cq(4096);
    let qpn = nic
        .create_qp(pd, qp_type, cq, cq, QpCaps::default())
        .expect("a QP");
    let access =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let keys = nic
        .reg_mr(
            pd,
            IOVA,
            Box::new(vec![0u8; LEN]),
            access | Access::FLUSH_GLOBAL,
        )
        .expect("a region");
    Side {
        nic,
        addr,
        qpn,
        cq,
        lkey: keys.lkey,
        rkey: keys.rkey,
    }
}

fn connect(me: &mut Side, peer: (IpAddr, u32), mtu: Mtu, now: Time) {
    let attr = QpAttr {
        qp_access_flags: Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC
            | Access::FLUSH_GLOBAL,
        ah_attr: Some(rnic_core::qp::AddressVector {
            dest: peer.0,
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

/// Bytes from the input, zeros once it runs out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }
    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

/// A packet made of fuzzer bytes, aimed at `to`'s QP if asked, with an ICRC
/// that verifies, from `from`.
fn forge(input: &mut Input<'_>, from: IpAddr, to: &Side) -> Datagram {
    let n = usize::from(input.byte()) + 16;
    let aim = input.byte();
    let mut p = input.bytes(n);
    if aim & 1 == 1 {
        p[5..8].copy_from_slice(&to.qpn.to_be_bytes()[1..]);
    }
    let port = 0xC000 | u16::from(aim >> 1);
    if let Ok(crc) = icrc::for_udp(from, to.addr, port, &p[..n - 4]) {
        p[n - 4..].copy_from_slice(&crc.to_le_bytes());
    }
    Datagram {
        src: from,
        dst: to.addr,
        src_port: port,
        payload: p,
    }
}

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
        0 => SendOp::Send { imm: None },
        1 => SendOp::Send {
            imm: Some(input.u32()),
        },
        2 => SendOp::Write {
            remote_addr,
            rkey,
            imm: None,
        },
        3 => SendOp::Write {
            remote_addr,
            rkey,
            imm: Some(7),
        },
        4 => SendOp::Read { remote_addr, rkey },
        5 => SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare: 0,
            swap: 1,
        },
        6 => SendOp::FetchAdd {
            remote_addr,
            rkey,
            add: 1,
        },
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
    SendWr {
        wr_id: id,
        op,
        sg_list: vec![Sge {
            addr: IOVA + off,
            length: if atomic { 8 } else { len },
            lkey: if kind & 0x20 == 0 { s.lkey } else { s.lkey ^ 1 },
        }],
        signaled: kind & 0x10 == 0,
        solicited: false,
        fence: kind & 0x08 != 0,
        inline: (kind & 0x04 != 0).then(|| vec![9; usize::from(input.byte())]),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let setup = input.byte();
    let qp_type = [QpType::Rc, QpType::Uc, QpType::Ud][usize::from(setup % 3)];
    let mtu = [Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096][usize::from((setup >> 2) % 3)];
    let mut now = Time(1_000_000);
    let (mut a, mut b) = (side(1, qp_type), side(2, qp_type));
    let (pa, pb) = ((a.addr, a.qpn), (b.addr, b.qpn));
    connect(&mut a, pb, mtu, now);
    connect(&mut b, pa, mtu, now);
    let mut posted: HashSet<u64> = HashSet::new();
    let mut id = 0u64;
    for _ in 0..64 {
        if input.done() {
            break;
        }
        match input.byte() % 7 {
            0 => {
                let d = forge(&mut input, a.addr, &b);
                b.nic.handle_datagram(now, &d);
            }
            1 => {
                let d = forge(&mut input, b.addr, &a);
                a.nic.handle_datagram(now, &d);
            }
            2 | 3 => {
                id += 1;
                let wr = work_request(&mut input, &a, b.rkey, id);
                let ok = if qp_type == QpType::Ud {
                    let to = UdDest {
                        dest: b.addr,
                        qpn: b.qpn,
                        qkey: 0x1111_1111,
                    };
                    a.nic.post_send_ud(now, a.qpn, wr, to).is_ok()
                } else {
                    a.nic.post_send(now, a.qpn, wr).is_ok()
                };
                if ok {
                    posted.insert(id);
                }
            }
            4 => {
                id += 1;
                let len = u32::from(input.byte()) * 32;
                let wr = RecvWr {
                    wr_id: id,
                    sg_list: vec![Sge {
                        addr: IOVA,
                        length: len,
                        lkey: b.lkey,
                    }],
                };
                if b.nic.post_recv(now, b.qpn, wr).is_ok() {
                    posted.insert(id);
                }
            }
            5 => {
                // The real traffic, each datagram kept or dropped by a bit.
                let keep = input.byte();
                let mut bit = 0;
                for _ in 0..4 {
                    while let Some(d) = a.nic.poll_transmit() {
                        if keep >> (bit % 8) & 1 == 1 {
                            b.nic.handle_datagram(now, &d);
                        }
                        bit += 1;
                    }
                    while let Some(d) = b.nic.poll_transmit() {
                        if keep >> (bit % 8) & 1 == 1 {
                            a.nic.handle_datagram(now, &d);
                        }
                        bit += 1;
                    }
                }
            }
            _ => {
                now = now + Duration::from_micros(u64::from(input.byte()) * 500);
                a.nic.handle_timeout(now);
                b.nic.handle_timeout(now);
            }
        }
    }
    for s in [&mut a, &mut b] {
        if let Ok(done) = s.nic.poll_cq(s.cq, usize::MAX) {
            for c in done {
                assert!(posted.contains(&c.wr_id), "a completion for nothing: {c:?}");
            }
        }
    }
});
