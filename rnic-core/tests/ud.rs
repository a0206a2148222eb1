//! Unreliable datagram QPs: a destination per request, DETH with the Q_Key,
//! the GRH area at the head of each receive, no acknowledgements.

use std::time::Duration;

use core::net::IpAddr;
use rnic_core::mem::Access;
use rnic_core::qp::{AttrMask, QpAttr, QpState, QpType};
use rnic_core::sim::{Cluster, LinkConfig};
use rnic_core::wr::{sg_list, RecvWr, SendOp, SendWr, Sge, UdDest, WcOpcode, WcStatus, GRH_LEN};
use rnic_core::{QpCaps, VerbError};
use rnic_wire::encap::ipv4;

const QKEY: u32 = 0x1111_1111; // what ibv_ud_pingpong uses

struct Node {
    pd: rnic_core::mem::PdHandle,
    cq: rnic_core::cq::CqHandle,
    qpn: u32,
    lkey: u32,
}

fn node(c: &mut Cluster, i: usize, qkey: u32) -> Node {
    let nic = &mut c.nics[i];
    let pd = nic.alloc_pd();
    let cq = nic.create_cq(64);
    let qpn = nic
        .create_qp(pd, QpType::Ud, cq, cq, QpCaps::default())
        .unwrap();
    let lkey = nic
        .reg_mr(pd, 0x1000, Box::new(vec![0u8; 65536]), Access::LOCAL_WRITE)
        .unwrap()
        .lkey;
    let attr = QpAttr {
        qkey,
        sq_psn: 0x100,
        ..QpAttr::default()
    };
    nic.to_rts(c.now, qpn, &attr).unwrap();
    Node { pd, cq, qpn, lkey }
}

fn send(
    c: &mut Cluster,
    from: &Node,
    i: usize,
    to: UdDest,
    len: u32,
    imm: Option<u32>,
) -> Result<(), VerbError> {
    let wr = SendWr::new(
        1,
        SendOp::Send { imm },
        sg_list![Sge {
            addr: 0x1000,
            length: len,
            lkey: from.lkey,
        }],
    );
    let now = c.now;
    c.nics[i].post_send_ud(now, from.qpn, wr, to)
}

/// A 2 KiB receive at the start of `to`'s region.
fn post_recv(c: &mut Cluster, to: &Node, wr_id: u64) {
    let sg_list = sg_list![Sge {
        addr: 0x1000,
        length: 2048,
        lkey: to.lkey,
    }];
    let now = c.now;
    c.nics[1]
        .post_recv(now, to.qpn, RecvWr { wr_id, sg_list })
        .unwrap();
}

fn setup(seed: u64) -> (Cluster, Node, Node, IpAddr, IpAddr) {
    let mut c = Cluster::new(seed, LinkConfig::perfect(Duration::from_micros(5)), 2);
    let a = node(&mut c, 0, QKEY);
    let b = node(&mut c, 1, QKEY);
    let (aa, ba) = (c.nics[0].addr(), c.nics[1].addr());
    (c, a, b, aa, ba)
}

#[test]
fn datagram_with_immediate_and_the_grh_area() {
    let (mut c, a, b, aa, ba) = setup(61);
    c.net.record_pcap();
    post_recv(&mut c, &b, 9);
    send(
        &mut c,
        &a,
        0,
        UdDest {
            dest: ba,
            src: None,
            qpn: b.qpn,
            qkey: QKEY,
        },
        1000,
        Some(0x42),
    )
    .unwrap();
    c.run(c.now + Duration::from_millis(10), 1000);
    let sent = c.nics[0].poll_cq(a.cq, 8).unwrap();
    assert_eq!(
        (sent[0].status, sent[0].opcode),
        (WcStatus::Success, WcOpcode::Send)
    );
    let r = c.nics[1].poll_cq(b.cq, 8).unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].wr_id, r[0].status, r[0].byte_len),
        (9, WcStatus::Success, 1000 + GRH_LEN as u32)
    );
    assert_eq!((r[0].imm_data, r[0].src_qp), (Some(0x42), Some(a.qpn)));
    // For IPv4, the IPv4 header sits in the last 20 bytes of the GRH area.
    let mut grh = [0u8; GRH_LEN];
    c.nics[1].read_mr(b.pd, b.lkey, 0x1000, &mut grh).unwrap();
    assert_eq!(grh[..20], [0u8; 20]);
    // Its total length is the datagram's: IPv4, UDP, BTH, DETH, ImmDt, the
    // payload, ICRC.
    assert_eq!(
        u16::from_be_bytes([grh[22], grh[23]]),
        20 + 8 + 12 + 8 + 4 + 1000 + 4
    );
    let (ip, _, _) = ipv4::Repr::parse(&{
        let mut h = grh[20..].to_vec();
        h.resize(20 + 8 + 12 + 8 + 4 + 1000 + 4, 0);
        h
    })
    .unwrap();
    assert_eq!(
        (IpAddr::from(ip.src_addr), IpAddr::from(ip.dst_addr)),
        (aa, ba)
    );
}

#[test]
fn wrong_qkey_and_no_receive_are_dropped_silently() {
    let (mut c, a, b, _, ba) = setup(62);
    // No receive posted: dropped, and no RNR NAK (nothing comes back).
    send(
        &mut c,
        &a,
        0,
        UdDest {
            dest: ba,
            src: None,
            qpn: b.qpn,
            qkey: QKEY,
        },
        8,
        None,
    )
    .unwrap();
    c.run(c.now + Duration::from_millis(10), 1000);
    assert_eq!(c.nics[1].counters().ud_dropped_no_recv, 1);
    assert_eq!(c.nics[1].counters().sent_pkts, 0);
    // A receive, but the wrong Q_Key.
    post_recv(&mut c, &b, 9);
    send(
        &mut c,
        &a,
        0,
        UdDest {
            dest: ba,
            src: None,
            qpn: b.qpn,
            qkey: QKEY ^ 1,
        },
        8,
        None,
    )
    .unwrap();
    c.run(c.now + Duration::from_millis(10), 1000);
    assert_eq!(c.nics[1].counters().qkey_violations, 1);
    assert!(c.nics[1].poll_cq(b.cq, 8).unwrap().is_empty());
    // The right Q_Key: delivered into the receive that waited.
    send(
        &mut c,
        &a,
        0,
        UdDest {
            dest: ba,
            src: None,
            qpn: b.qpn,
            qkey: QKEY,
        },
        8,
        None,
    )
    .unwrap();
    c.run(c.now + Duration::from_millis(10), 1000);
    assert_eq!(c.nics[1].poll_cq(b.cq, 8).unwrap()[0].byte_len, 48);
}

#[test]
fn ud_rules() {
    let (mut c, a, b, _, ba) = setup(63);
    // Larger than one packet: a local length error.
    send(
        &mut c,
        &a,
        0,
        UdDest {
            dest: ba,
            src: None,
            qpn: b.qpn,
            qkey: QKEY,
        },
        5000,
        None,
    )
    .unwrap();
    assert_eq!(
        c.nics[0].poll_cq(a.cq, 8).unwrap()[0].status,
        WcStatus::LocLenErr
    );
    // The send queue stops (SQE): later sends are flushed until RTS again.
    assert_eq!(c.nics[0].query_qp(a.qpn).unwrap().qp_state, QpState::Sqe);
    let to_b = UdDest {
        dest: ba,
        src: None,
        qpn: b.qpn,
        qkey: QKEY,
    };
    send(&mut c, &a, 0, to_b, 8, None).unwrap();
    assert_eq!(
        c.nics[0].poll_cq(a.cq, 8).unwrap()[0].status,
        WcStatus::WrFlushErr
    );
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    let now = c.now;
    c.nics[0]
        .modify_qp(now, a.qpn, &rts, AttrMask::STATE)
        .unwrap();
    send(&mut c, &a, 0, to_b, 8, None).unwrap();
    assert_eq!(
        c.nics[0].poll_cq(a.cq, 8).unwrap()[0].status,
        WcStatus::Success
    );
    // post_send is for connected QPs; UD carries SENDs only.
    let now = c.now;
    let wr = SendWr::new(2, SendOp::read(0, 0), sg_list![]);
    assert!(c.nics[0].post_send(now, a.qpn, wr.clone()).is_err());
    assert!(c.nics[0]
        .post_send_ud(
            now,
            a.qpn,
            wr,
            UdDest {
                dest: ba,
                src: None,
                qpn: b.qpn,
                qkey: QKEY
            }
        )
        .is_err());
    // A gather list running past the region's end: a local protection
    // error, and nothing sent (the packet was being built when the gather
    // failed).
    let sent = c.nics[0].counters().sent_pkts;
    let wr = SendWr::new(
        3,
        SendOp::send(),
        sg_list![Sge {
            addr: 0x1000 + 65536 - 4,
            length: 8,
            lkey: a.lkey,
        }],
    );
    c.nics[0].post_send_ud(now, a.qpn, wr, to_b).unwrap();
    let done = c.nics[0].poll_cq(a.cq, 8).unwrap();
    assert_eq!((done[0].wr_id, done[0].status), (3, WcStatus::LocProtErr));
    assert_eq!(c.nics[0].counters().sent_pkts, sent, "nothing sent");
}

#[test]
fn a_qkey_with_the_high_bit_set_sends_the_qps_own() {
    let (mut c, a, b, _, ba) = setup(64);
    post_recv(&mut c, &b, 9);
    // A's own Q_Key is QKEY, which B expects; the request names another
    // with the high bit set, which means "use the QP's".
    let to_b = UdDest {
        dest: ba,
        src: None,
        qpn: b.qpn,
        qkey: 0x8000_0001,
    };
    send(&mut c, &a, 0, to_b, 8, None).unwrap();
    c.run(c.now + Duration::from_millis(10), 1000);
    let r = c.nics[1].poll_cq(b.cq, 8).unwrap();
    assert_eq!((r.len(), r[0].status), (1, WcStatus::Success));
    assert_eq!(c.nics[1].counters().qkey_violations, 0);
}
