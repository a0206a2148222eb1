//! Two NICs with one connected RC QP pair, on a simulated network.

#![allow(dead_code, missing_docs)]

use core::net::IpAddr;
use std::time::Duration;

use rnic_core::cq::CqHandle;
use rnic_core::mem::MwBind;
use rnic_core::mem::{Access, MrKeys, PdHandle};
use rnic_core::qp::{AddressVector, Mtu, QpAttr, QpType};
use rnic_core::sim::{Cluster, LinkConfig};
use rnic_core::time::Time;
pub use rnic_core::wr::{sg_list, SgList};
use rnic_core::wr::{Completion, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus};
use rnic_core::Datagram;
use rnic_core::QpCaps;
use rnic_wire::pcap::PcapReader;
use rnic_wire::{icrc, Frame, IbRepr, LinkType, Opcode, Psn};

pub const A_IOVA: u64 = 0x1_0000_0000;
pub const B_IOVA: u64 = 0x2_0000_0000;
pub const REGION: usize = 256 * 1024;

pub struct Side {
    pub pd: PdHandle,
    pub cq: CqHandle,
    pub qpn: u32,
    pub mr: MrKeys,
}

pub struct Pair {
    pub c: Cluster,
    pub a: Side,
    pub b: Side,
}

pub struct Params {
    pub link: LinkConfig,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub mtu: Mtu,
    pub b_access: Access,
    pub b_qp_access: Access,
    pub qp_type: QpType,
    /// Entries in each side's CQ.
    pub cq_depth: usize,
    /// Bytes in each side's region.
    pub region: usize,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            link: LinkConfig::perfect(Duration::from_micros(5)),
            timeout: 8, // 1.05 ms
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1, // 10 us
            mtu: Mtu::Mtu1024,
            b_access: Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC,
            b_qp_access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            qp_type: QpType::Rc,
            cq_depth: 4096,
            region: REGION,
        }
    }
}

/// PD, CQ, QP and a region of `p.region` bytes of `fill` on NIC `i`.
fn side(c: &mut Cluster, i: usize, iova: u64, access: Access, p: &Params, fill: u8) -> Side {
    let qp_type = p.qp_type;
    let nic = &mut c.nics[i];
    let pd = nic.alloc_pd();
    let cq = nic.create_cq(p.cq_depth);
    let qpn = nic
        .create_qp(pd, qp_type, cq, cq, QpCaps::default())
        .unwrap();
    let mr = nic
        .reg_mr(pd, iova, Box::new(vec![fill; p.region]), access)
        .unwrap();
    Side { pd, cq, qpn, mr }
}

fn connect(
    c: &mut Cluster,
    i: usize,
    me: &Side,
    peer: &Side,
    p: &Params,
    qp_access: Access,
    (sq_psn, rq_psn): (u32, u32),
) {
    let dest = c.nics[1 - i].addr();
    let now = c.now;
    let attr = QpAttr {
        qp_access_flags: qp_access,
        ah_attr: Some(AddressVector {
            dest,
            src: None,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
        }),
        path_mtu: p.mtu,
        dest_qp_num: peer.qpn,
        rq_psn,
        max_dest_rd_atomic: 16,
        min_rnr_timer: p.min_rnr_timer,
        sq_psn,
        timeout: p.timeout,
        retry_cnt: p.retry_cnt,
        rnr_retry: p.rnr_retry,
        max_rd_atomic: 16,
        ..QpAttr::default()
    };
    c.nics[i].to_rts(now, me.qpn, &attr).unwrap();
}

/// A QP on NIC 0 (A) connected to one on NIC 1 (B) as `p` says, each
/// with its region ([`A_IOVA`], [`B_IOVA`]) full of its `fills` byte, A
/// sending from PSN `a_psn` and B from `b_psn`.
pub fn connected(
    c: &mut Cluster,
    p: &Params,
    (a_psn, b_psn): (u32, u32),
    fills: (u8, u8),
) -> (Side, Side) {
    let a_access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let a = side(c, 0, A_IOVA, a_access, p, fills.0);
    let b = side(c, 1, B_IOVA, p.b_access, p, fills.1);
    let a_qp_access = Access::REMOTE_WRITE | Access::REMOTE_READ;
    connect(c, 0, &a, &b, p, a_qp_access, (a_psn, b_psn));
    connect(c, 1, &b, &a, p, p.b_qp_access, (b_psn, a_psn));
    (a, b)
}

impl Pair {
    /// A's PSNs start just below the 24-bit wrap, so every run crosses it.
    pub fn new(seed: u64, p: &Params) -> Pair {
        let mut c = Cluster::new(seed, p.link, 2);
        let (a, b) = connected(&mut c, p, (0xFF_FFF0, 0x00_b000), (0, 0));
        c.nics[1].record_executions();
        Pair { c, a, b }
    }

    pub fn sge_a(&self, offset: u64, len: u32) -> SgList {
        sg_list![Sge {
            addr: A_IOVA + offset,
            length: len,
            lkey: self.a.mr.lkey,
        }]
    }

    pub fn post(&mut self, wr_id: u64, op: SendOp, sg_list: SgList) {
        self.post_fenced(wr_id, op, sg_list, false);
    }

    /// Post a WRITE (no immediate) of A's `sg_list` to `remote_addr`
    /// through B's region R_Key.
    pub fn post_write_to_b(&mut self, wr_id: u64, remote_addr: u64, sg_list: SgList) {
        let rkey = self.b.mr.rkey;
        let op = SendOp::write(remote_addr, rkey);
        self.post(wr_id, op, sg_list);
    }

    pub fn post_fenced(&mut self, wr_id: u64, op: SendOp, sg_list: SgList, fence: bool) {
        self.post_signaled(0, wr_id, op, sg_list, fence);
    }

    /// Post a signaled work request on side `side`'s QP (0 = A, 1 = B).
    fn post_signaled(&mut self, side: usize, wr_id: u64, op: SendOp, sg_list: SgList, fence: bool) {
        let now = self.c.now;
        let qpn = [self.a.qpn, self.b.qpn][side];
        self.c.nics[side]
            .post_send(now, qpn, SendWr::new(wr_id, op, sg_list).fence(fence))
            .unwrap();
    }

    pub fn recv_b(&mut self, wr_id: u64, offset: u64, len: u32) {
        let now = self.c.now;
        let sg_list = sg_list![Sge {
            addr: B_IOVA + offset,
            length: len,
            lkey: self.b.mr.lkey,
        }];
        self.c.nics[1]
            .post_recv(now, self.b.qpn, RecvWr { wr_id, sg_list })
            .unwrap();
    }

    pub fn write_a(&mut self, offset: u64, data: &[u8]) {
        // Through a loopback WRITE would be circular; the simulator owns the
        // memory, so fill A's buffer by re-registering a prepared region.
        let nic = &mut self.c.nics[0];
        let region = nic.dereg_mr(self.a.mr.lkey).unwrap();
        let mut bytes = vec![0u8; region.len()];
        region.read(0, &mut bytes);
        bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        self.a.mr = nic
            .reg_mr(
                self.a.pd,
                A_IOVA,
                Box::new(bytes),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
    }

    pub fn read(&self, i: usize, offset: u64, len: usize) -> Vec<u8> {
        let (side, iova) = if i == 0 {
            (&self.a, A_IOVA)
        } else {
            (&self.b, B_IOVA)
        };
        let mut out = vec![0u8; len];
        self.c.nics[i]
            .read_mr(side.pd, side.mr.lkey, iova + offset, &mut out)
            .unwrap();
        out
    }

    /// Run until idle (bounded); panics if the simulation does not settle.
    pub fn run(&mut self) {
        let limit = self.c.now + Duration::from_secs(600);
        assert!(
            self.c.run(limit, 5_000_000),
            "the simulation did not settle"
        );
    }

    pub fn completions(&mut self, i: usize) -> Vec<Completion> {
        let cq = if i == 0 { self.a.cq } else { self.b.cq };
        self.c.nics[i].poll_cq(cq, usize::MAX).unwrap()
    }
}

pub fn t(ns: u64) -> Time {
    Time(ns)
}

/// A's first PSN: Pair starts it just below the 24-bit wrap.
pub const A_PSN: u32 = 0xFF_FFF0;

/// One captured packet, as far as these tests care.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub src: IpAddr,
    pub opcode: Opcode,
    pub psn: u32,
    pub reth: Option<(u64, u32)>,
    pub syndrome: Option<u8>,
}

pub fn wire(p: &Pair) -> Vec<Seen> {
    let pcap = p.c.net.pcap();
    PcapReader::new(&pcap)
        .unwrap()
        .map(|r| {
            let f = Frame::parse(LinkType::Ethernet, r.unwrap().data).unwrap();
            assert!(f.icrc_ok());
            Seen {
                src: f.ip.src_addr(),
                opcode: f.ib.bth().opcode(),
                psn: f.ib.bth().psn().value(),
                reth: f.ib.reth().map(|r| (r.va(), r.dma_length())),
                syndrome: f.ib.aeth().map(|a| a.syndrome()),
            }
        })
        .collect()
}

/// A packet from `src` to `dst`'s QP, with a correct ICRC.
pub fn craft(src: IpAddr, dst: IpAddr, ib: IbRepr, payload: &[u8]) -> Datagram {
    craft_raw(src, dst, ib, payload, |_| {})
}

/// As [`craft`], with `edit` applied to the bytes before the ICRC is
/// computed: for fields `emit` always writes right (TVer, say).
pub fn craft_raw(
    src: IpAddr,
    dst: IpAddr,
    ib: IbRepr,
    payload: &[u8],
    edit: impl FnOnce(&mut [u8]),
) -> Datagram {
    let mut buf = vec![0u8; ib.buffer_len()];
    ib.emit(&mut buf, payload).unwrap();
    edit(&mut buf);
    let n = buf.len();
    let crc = icrc::for_udp(src, dst, 0xC000, &buf[..n - 4]).unwrap();
    buf[n - 4..].copy_from_slice(&crc.to_le_bytes());
    Datagram::new(src, dst, 0xC000, buf)
}

/// Everything `nic` has to send now.
pub fn take_tx(nic: &mut rnic_core::Nic) -> Vec<Datagram> {
    std::iter::from_fn(|| nic.poll_transmit()).collect()
}

/// A datagram's BTH opcode.
pub fn opcode(d: &Datagram) -> Opcode {
    rnic_wire::IbPacket::new_checked(&d.payload[..])
        .unwrap()
        .bth()
        .opcode()
}

/// A datagram's BTH PSN.
pub fn psn_of(d: &Datagram) -> u32 {
    rnic_wire::IbPacket::new_checked(&d.payload[..])
        .unwrap()
        .bth()
        .psn()
        .value()
}

pub fn psn(v: u32) -> Psn {
    Psn::new(v)
}

/// A pair whose wire is recorded, with A's and B's addresses.
pub fn pair(seed: u64, params: &Params) -> (Pair, IpAddr, IpAddr) {
    let mut p = Pair::new(seed, params);
    p.c.net.record_pcap();
    let (a, b) = (p.c.nics[0].addr(), p.c.nics[1].addr());
    (p, a, b)
}

/// Post a work request without local buffers on B's QP.
pub fn post_b(p: &mut Pair, wr_id: u64, op: SendOp) {
    p.post_signaled(1, wr_id, op, SgList::new(), false);
}

/// Allocate a window on B and bind it to B's QP over 256 bytes at B_IOVA + 4096.
pub fn bound_window(p: &mut Pair, access: Access) -> u32 {
    let mw = p.c.nics[1].alloc_mw(p.b.pd).unwrap();
    let new_rkey = (mw & !0xFF) | (mw.wrapping_add(1) & 0xFF);
    let mr_lkey = p.b.mr.lkey;
    post_b(
        p,
        50,
        SendOp::BindMw(MwBind {
            mw_rkey: mw,
            new_rkey,
            mr_lkey,
            addr: B_IOVA + 4096,
            length: 256,
            access,
        }),
    );
    p.run();
    let done = p.completions(1);
    assert_eq!(done.len(), 1);
    let c = &done[0];
    assert_eq!(
        (c.wr_id, c.status, c.opcode),
        (50, WcStatus::Success, WcOpcode::BindMw)
    );
    new_rkey
}
