//! A NIC with several addresses, as a RoCE port on an interface with an
//! IPv4 address, a link-local and a global IPv6 address has several GIDs: a
//! QP sends from the address its address vector names (the source GID) or,
//! if none, from the one the NIC picks for the peer's family and scope; it
//! takes packets only from its peer and only at that address (rdma_rxe's
//! check_addr); and the ICRC covers the addresses each packet carries.

mod common;

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use common::*;
use rnic_core::cq::CqHandle;
use rnic_core::mem::{Access, PdHandle};
use rnic_core::qp::{AddressVector, QpAttr, QpType};
use rnic_core::sim::{Cluster, LinkConfig};
use rnic_core::wr::{RecvWr, SendOp, SendWr, Sge, UdDest, WcStatus};
use rnic_core::{Nic, QpCaps, VerbError};
use rnic_wire::pcap::PcapReader;
use rnic_wire::{bth, reth, Frame, IbRepr, LinkType, Opcode};

fn v6(s: &str) -> IpAddr {
    IpAddr::V6(s.parse::<Ipv6Addr>().unwrap())
}

/// Two NICs, 10.0.0.1 and 10.0.0.2 (the simulator's), each also at a
/// link-local and a global IPv6 address.
fn cluster() -> Cluster {
    let mut c = Cluster::new(7, LinkConfig::perfect(Duration::from_micros(5)), 2);
    c.net.record_pcap();
    for (i, nic) in c.nics.iter_mut().enumerate() {
        nic.add_addr(v6(&format!("fe80::{}", i + 1)));
        nic.add_addr(v6(&format!("fd00::{}", i + 1)));
    }
    c
}

fn av(dest: IpAddr, src: Option<IpAddr>) -> AddressVector {
    AddressVector {
        dest,
        src,
        traffic_class: 0,
        hop_limit: 64,
        flow_label: 0,
    }
}

/// A QP and a 64 KiB region on one NIC.
struct Q {
    qpn: u32,
    pd: PdHandle,
    cq: CqHandle,
    iova: u64,
    lkey: u32,
    rkey: u32,
}

/// A QP of `qp_type` with a 64 KiB region of `fill` at `iova` on NIC `i`.
fn qp(c: &mut Cluster, i: usize, qp_type: QpType, iova: u64, fill: u8) -> Q {
    let nic = &mut c.nics[i];
    let pd = nic.alloc_pd();
    let cq = nic.create_cq(64);
    let qpn = nic
        .create_qp(pd, qp_type, cq, cq, QpCaps::default())
        .unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = nic
        .reg_mr(pd, iova, Box::new(vec![fill; 65536]), access)
        .unwrap();
    Q {
        qpn,
        pd,
        cq,
        iova,
        lkey: mr.lkey,
        rkey: mr.rkey,
    }
}

fn read(c: &Cluster, i: usize, q: &Q, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    c.nics[i].read_mr(q.pd, q.lkey, q.iova, &mut out).unwrap();
    out
}

fn settle(c: &mut Cluster) {
    let limit = c.now + Duration::from_secs(10);
    assert!(c.run(limit, 100_000), "the simulation did not settle");
}

fn wr(wr_id: u64, op: SendOp, q: &Q, len: u32) -> SendWr {
    SendWr::new(
        wr_id,
        op,
        sg_list![Sge {
            addr: q.iova,
            length: len,
            lkey: q.lkey,
        }],
    )
}

fn to_rts(
    c: &mut Cluster,
    i: usize,
    qpn: u32,
    peer: u32,
    av: AddressVector,
) -> Result<(), VerbError> {
    let now = c.now;
    let attr = QpAttr {
        qp_access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ,
        ah_attr: Some(av),
        dest_qp_num: peer,
        rq_psn: 100,
        sq_psn: 100,
        max_dest_rd_atomic: 4,
        max_rd_atomic: 4,
        timeout: 8,
        retry_cnt: 7,
        rnr_retry: 7,
        ..QpAttr::default()
    };
    c.nics[i].to_rts(now, qpn, &attr)
}

/// (source, destination) of every packet on the wire, each ICRC checked.
fn routes(c: &Cluster) -> Vec<(IpAddr, IpAddr)> {
    let pcap = c.net.pcap();
    PcapReader::new(&pcap)
        .unwrap()
        .map(|r| {
            let f = Frame::parse(LinkType::Ethernet, r.unwrap().data).unwrap();
            assert!(f.icrc_ok());
            (f.ip.src_addr(), f.ip.dst_addr())
        })
        .collect()
}

#[test]
fn the_source_is_the_one_named_or_the_nics_choice_for_the_peer() {
    let mut c = cluster();
    let nic = &c.nics[0];
    assert_eq!(nic.addrs().len(), 3);
    let a4 = nic.addr();
    assert_eq!(
        nic.source_for(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))),
        Some(a4)
    );
    assert_eq!(nic.source_for(v6("fd00::2")), Some(v6("fd00::1")));
    assert_eq!(nic.source_for(v6("fe80::2")), Some(v6("fe80::1")));
    assert_eq!(nic.source_for(v6("2001:db8::2")), Some(v6("fd00::1")));
    let only4 = Nic::new(a4, 1);
    assert_eq!(only4.source_for(v6("fd00::2")), None);

    let qa = qp(&mut c, 0, QpType::Rc, 0x1000, 0).qpn;
    let qb = qp(&mut c, 1, QpType::Rc, 0x2000, 0).qpn;
    // A source that is not the NIC's, or of the other family: refused.
    let e = to_rts(&mut c, 0, qa, qb, av(v6("fd00::2"), Some(v6("fd00::9")))).unwrap_err();
    assert!(matches!(e, VerbError::Modify(_)), "{e:?}");
    let e = to_rts(&mut c, 0, qa, qb, av(v6("fd00::2"), Some(a4))).unwrap_err();
    assert!(matches!(e, VerbError::Modify(_)), "{e:?}");
    // None: the NIC's choice, which the QP then reports.
    to_rts(&mut c, 0, qa, qb, av(v6("fd00::2"), None)).unwrap();
    let got = c.nics[0].query_qp(qa).unwrap().ah_attr.unwrap();
    assert_eq!(got.src, Some(v6("fd00::1")));
    // A QP on the NIC without IPv6: no source to choose.
    let mut lone = Nic::new(a4, 2);
    let pd = lone.alloc_pd();
    let cq = lone.create_cq(4);
    let q = lone
        .create_qp(pd, QpType::Rc, cq, cq, QpCaps::default())
        .unwrap();
    let attr = QpAttr {
        ah_attr: Some(av(v6("fd00::2"), None)),
        dest_qp_num: 5,
        ..QpAttr::default()
    };
    assert!(lone.to_rts(c.now, q, &attr).is_err());
}

#[test]
fn an_rc_transfer_over_ipv6_goes_between_the_named_addresses() {
    let mut c = cluster();
    let a = qp(&mut c, 0, QpType::Rc, 0x1000, 0x5A);
    let b = qp(&mut c, 1, QpType::Rc, 0x2000, 0);
    to_rts(
        &mut c,
        0,
        a.qpn,
        b.qpn,
        av(v6("fd00::2"), Some(v6("fd00::1"))),
    )
    .unwrap();
    to_rts(
        &mut c,
        1,
        b.qpn,
        a.qpn,
        av(v6("fd00::1"), Some(v6("fd00::2"))),
    )
    .unwrap();
    let write = SendOp::write(b.iova, b.rkey);
    let now = c.now;
    c.nics[0]
        .post_send(now, a.qpn, wr(1, write, &a, 5000))
        .unwrap();
    settle(&mut c);
    let done = c.nics[0].poll_cq(a.cq, 8).unwrap();
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(done[0].status, WcStatus::Success);
    let r = routes(&c);
    assert!(r.len() >= 6, "five WRITE packets and an ACK: {r:?}");
    for (src, dst) in &r {
        assert!(
            (*src, *dst) == (v6("fd00::1"), v6("fd00::2"))
                || (*src, *dst) == (v6("fd00::2"), v6("fd00::1")),
            "{src} -> {dst}"
        );
    }
    assert!(read(&c, 1, &b, 5000).iter().all(|&x| x == 0x5A));
    assert_eq!(read(&c, 1, &b, 5001)[5000], 0);
}

#[test]
fn a_connected_qp_takes_packets_only_at_its_own_address() {
    let mut c = cluster();
    let a = qp(&mut c, 0, QpType::Rc, 0x1000, 0);
    let b = qp(&mut c, 1, QpType::Rc, 0x2000, 0);
    to_rts(
        &mut c,
        0,
        a.qpn,
        b.qpn,
        av(v6("fd00::2"), Some(v6("fd00::1"))),
    )
    .unwrap();
    to_rts(
        &mut c,
        1,
        b.qpn,
        a.qpn,
        av(v6("fd00::1"), Some(v6("fd00::2"))),
    )
    .unwrap();
    // The WRITE A would send next (PSN 100), with a correct ICRC, but
    // from or to an address that is not the QPs': B's QP does not take it
    // (the link-local address is B's, but not its QP's).
    let write = || {
        let mut ib = IbRepr::new(bth::Repr::new(Opcode::RC_RDMA_WRITE_ONLY, b.qpn, psn(100)));
        ib.reth = Some(reth::Repr {
            va: b.iova,
            r_key: b.rkey,
            dma_length: 4,
        });
        ib.payload_len = 4;
        ib
    };
    let before = c.nics[1].counters();
    let now = c.now;
    let (a4, b4) = (c.nics[0].addr(), c.nics[1].addr());
    for (src, dst) in [
        (v6("fd00::1"), v6("fe80::2")),
        (v6("fe80::1"), v6("fd00::2")),
        (a4, b4),
    ] {
        c.nics[1].handle_datagram(now, &craft(src, dst, write(), &[1, 2, 3, 4]));
    }
    let after = c.nics[1].counters();
    assert_eq!(after.unknown_qp - before.unknown_qp, 3);
    assert_eq!(after.rcvd_pkts, before.rcvd_pkts);
    assert_eq!(read(&c, 1, &b, 4), [0; 4], "nothing written");
    // The same packet between the QPs' own addresses is taken.
    let good = craft(v6("fd00::1"), v6("fd00::2"), write(), &[1, 2, 3, 4]);
    c.nics[1].handle_datagram(now, &good);
    assert_eq!(read(&c, 1, &b, 4), [1, 2, 3, 4]);
}

#[test]
fn a_datagram_goes_from_the_address_handles_source() {
    let mut c = cluster();
    let a = qp(&mut c, 0, QpType::Ud, 0x4000, 0x33);
    let b = qp(&mut c, 1, QpType::Ud, 0x4000, 0);
    for (i, q) in [(0, &a), (1, &b)] {
        let attr = QpAttr {
            qkey: 0x1111,
            ..QpAttr::default()
        };
        let now = c.now;
        c.nics[i].to_rts(now, q.qpn, &attr).unwrap();
    }
    let now = c.now;
    let recv = RecvWr {
        wr_id: 9,
        sg_list: sg_list![Sge {
            addr: b.iova,
            length: 1024,
            lkey: b.lkey,
        }],
    };
    c.nics[1].post_recv(now, b.qpn, recv).unwrap();
    let to = |src| UdDest {
        dest: v6("fd00::2"),
        src,
        qpn: b.qpn,
        qkey: 0x1111,
    };
    let send = SendOp::send();
    // The link-local source the handle names, though the NIC would pick
    // the global one for a global peer.
    c.nics[0]
        .post_send_ud(now, a.qpn, wr(1, send, &a, 16), to(Some(v6("fe80::1"))))
        .unwrap();
    // A source of the other family: the send fails (and the send queue
    // with it, as a UD error does), nothing is sent.
    let a4 = c.nics[0].addr();
    c.nics[0]
        .post_send_ud(now, a.qpn, wr(2, send, &a, 16), to(Some(a4)))
        .unwrap();
    settle(&mut c);
    let done = c.nics[0].poll_cq(a.cq, 8).unwrap();
    assert_eq!(done.len(), 2);
    assert_eq!((done[0].wr_id, done[0].status), (1, WcStatus::Success));
    assert_eq!((done[1].wr_id, done[1].status), (2, WcStatus::LocQpOpErr));
    assert_eq!(routes(&c), [(v6("fe80::1"), v6("fd00::2"))]);
    let got = c.nics[1].poll_cq(b.cq, 8).unwrap();
    assert_eq!(got.len(), 1);
    // The GRH area counts in byte_len, as verbs has it.
    assert_eq!(
        (got[0].status, got[0].byte_len),
        (WcStatus::Success, 40 + 16)
    );
    // The GRH area holds the IPv6 header the datagram came with.
    let grh = read(&c, 1, &b, 40 + 16);
    assert_eq!(grh[0] >> 4, 6);
    assert_eq!(
        &grh[8..24],
        &"fe80::1".parse::<Ipv6Addr>().unwrap().octets()
    );
    assert_eq!(
        &grh[24..40],
        &"fd00::2".parse::<Ipv6Addr>().unwrap().octets()
    );
    assert!(grh[40..].iter().all(|&x| x == 0x33));
}
