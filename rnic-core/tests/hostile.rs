//! What a peer can make the transport do: responses and requests delivered by
//! hand (reordered, duplicated, or crafted with a correct ICRC), as an honest
//! peer on a bad network or a dishonest one produces them. Each test names
//! the rule it holds the engine to.

mod common;

use std::time::Duration;

use common::*;
use rnic_core::qp::{AttrMask, QpState};
use rnic_core::sim::DropRule;
use rnic_core::time::Time;
use rnic_core::wr::{InlineData, SendOp, SendWr, WcStatus};
use rnic_core::Datagram;
use rnic_wire::aeth::{self, NakCode, Syndrome};
use rnic_wire::{bth, deth, reth, xrceth, IbPacket, IbRepr, Opcode};

/// Go-back-N rewinds into the middle of a request; an ACK then retires that
/// request before it is resent. The requester must resume at the start of
/// the next request, not at the old packet offset applied to it.
///
/// An honest responder produces exactly this: a 3-packet WRITE_WITH_IMM finds
/// no receive, so its LAST draws an RNR NAK; the network duplicated the LAST,
/// and the copy arrives after a receive was posted, executes, and is ACKed.
fn rnr_nak_then_ack_of_the_same_request(inline: bool) {
    let mut p = Pair::new(41, &Params::default());
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 31 + 7) as u8).collect();
    p.write_a(0, &data);
    let rkey = p.b.mr.rkey;
    p.post(1, SendOp::write_imm(B_IOVA, rkey, 0x1234), p.sge_a(0, 3000));
    let now = p.c.now;
    let sg_list = if inline { SgList::new() } else { p.sge_a(0, 8) };
    p.c.nics[0]
        .post_send(
            now,
            p.a.qpn,
            SendWr::new(2, SendOp::write(B_IOVA + 8192, rkey), sg_list)
                .inline(inline.then(|| InlineData::from_slice(&data[..8]))),
        )
        .unwrap();
    let sent = take_tx(&mut p.c.nics[0]);
    assert_eq!(
        sent.iter().map(opcode).collect::<Vec<_>>(),
        [
            Opcode::RC_RDMA_WRITE_FIRST,
            Opcode::RC_RDMA_WRITE_MIDDLE,
            Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
            Opcode::RC_RDMA_WRITE_ONLY,
        ]
    );
    // B takes the WRITE_WITH_IMM but has no receive: RNR NAK for its LAST.
    // The 8-byte WRITE is lost.
    for d in &sent[..3] {
        p.c.nics[1].handle_datagram(now, d);
    }
    let rnr = take_tx(&mut p.c.nics[1]);
    assert_eq!(rnr.len(), 1);
    // A receive is posted; the network's copy of the LAST executes and is ACKed.
    p.recv_b(9, 0, 64);
    p.c.nics[1].handle_datagram(now, &sent[2]);
    let ack = take_tx(&mut p.c.nics[1]);
    assert_eq!(ack.len(), 1);
    assert_eq!(psn_of(&ack[0]), psn_of(&sent[2]));
    // A hears the RNR NAK (go back to the LAST, wait 10 us), then at once the ACK.
    p.c.nics[0].handle_datagram(now, &rnr[0]);
    p.c.nics[0].handle_datagram(now, &ack[0]);
    p.run();
    let c = p.completions(0);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(p.read(1, 0, 3000), data);
    assert_eq!(p.read(1, 8192, 8), &data[..8]);
    // Each request executed once: the WRITE_WITH_IMM, then the WRITE, resent
    // whole as one WRITE_ONLY at its own PSN.
    assert_eq!(p.c.nics[1].executions().len(), 2);
    assert_eq!(p.c.nics[0].counters().sent_pkts, 5);
}

#[test]
fn ack_retiring_a_request_rewound_into_resumes_at_the_next() {
    rnr_nak_then_ack_of_the_same_request(false);
}

#[test]
fn ack_retiring_a_request_rewound_into_then_an_inline_write() {
    rnr_nak_then_ack_of_the_same_request(true);
}

/// A's packets to B are lost from now on; B's still reach A.
fn cut_a_to_b(p: &mut Pair) {
    let a = p.c.nics[0].addr();
    p.c.net.drop_rule(DropRule {
        src: Some(a),
        opcode: None,
        psn: None,
        times: u32::MAX,
    });
}

/// A WRITE_ONLY of 8 bytes from A to B's region start, at B's expected PSN.
fn write_only(p: &Pair) -> IbRepr {
    let mut ib = IbRepr::new(bth::Repr::new(
        Opcode::RC_RDMA_WRITE_ONLY,
        p.b.qpn,
        psn(A_PSN),
    ));
    ib.reth = Some(reth::Repr {
        va: B_IOVA,
        r_key: p.b.mr.rkey,
        dma_length: 8,
    });
    ib.bth.ack_req = true;
    ib.payload_len = 8;
    ib
}

fn deliver_to_b(p: &mut Pair, d: Datagram) {
    let now = p.c.now;
    p.c.nics[1].handle_datagram(now, &d);
}

/// rdma_rxe's check_type_state: a packet whose opcode belongs to another
/// transport than the QP's is dropped, even from the QP's peer at the
/// expected PSN. A UD or XRC SEND must not complete an RC receive.
#[test]
fn another_transports_send_is_dropped_by_an_rc_qp() {
    let mut p = Pair::new(42, &Params::default());
    let (a, b) = (p.c.nics[0].addr(), p.c.nics[1].addr());
    p.recv_b(1, 0, 64);
    let mut ud = IbRepr::new(bth::Repr::new(Opcode::UD_SEND_ONLY, p.b.qpn, psn(A_PSN)));
    ud.deth = Some(deth::Repr {
        q_key: 0x1111_1111,
        src_qp: p.a.qpn,
    });
    ud.payload_len = 16;
    deliver_to_b(&mut p, craft(a, b, ud, &[0xEE; 16]));
    let mut xrc = IbRepr::new(bth::Repr::new(Opcode::XRC_SEND_ONLY, p.b.qpn, psn(A_PSN)));
    xrc.xrceth = Some(xrceth::Repr { xrc_srq: 1 });
    xrc.payload_len = 16;
    deliver_to_b(&mut p, craft(a, b, xrc, &[0xEE; 16]));
    assert_eq!(p.c.nics[1].counters().wrong_transport, 2);
    assert!(p.completions(1).is_empty(), "no RC receive completed");
    assert!(p.read(1, 0, 64).iter().all(|&x| x == 0));
    assert!(p.c.nics[0].poll_transmit().is_none() && p.c.nics[1].poll_transmit().is_none());
    // The receive is still there for a real RC SEND.
    p.post(2, SendOp::send(), p.sge_a(0, 16));
    p.run();
    assert_eq!(p.completions(1)[0].wr_id, 1);
}

/// IBTA 9.2.6 and 10.9.3 (rdma_rxe's hdr_check and check_keys): a packet
/// with a TVer other than 0, or a P_Key of another partition, is dropped and
/// counted; the limited-member form of the default P_Key (0x7FFF) matches.
#[test]
fn tver_and_pkey_are_checked_on_receive() {
    let mut p = Pair::new(43, &Params::default());
    let (a, b) = (p.c.nics[0].addr(), p.c.nics[1].addr());
    let data = [0x5A; 8];
    let bad_tver = craft_raw(a, b, write_only(&p), &data, |buf| buf[1] |= 0x0F);
    deliver_to_b(&mut p, bad_tver);
    let mut other_partition = write_only(&p);
    other_partition.bth.p_key = 0x8001;
    deliver_to_b(&mut p, craft(a, b, other_partition, &data));
    let c = p.c.nics[1].counters();
    assert_eq!((c.bad_tver, c.pkey_violations), (1, 1));
    assert_eq!(p.c.nics[1].executions().len(), 0);
    assert_eq!(p.read(1, 0, 8), [0; 8]);
    let mut limited = write_only(&p);
    limited.bth.p_key = 0x7FFF;
    deliver_to_b(&mut p, craft(a, b, limited, &data));
    assert_eq!(p.read(1, 0, 8), data);
}

/// IBTA 9.7.5.2.8: after an RNR NAK the requester waits exactly the time
/// the NAK's timer field names (table 45), not its own min_rnr_timer (which
/// is what its responder sends). Measured on the simulated clock.
#[test]
fn rnr_wait_is_the_naks_timer_to_the_nanosecond() {
    for (b_timer, wait_us) in [(1u8, 10u64), (14, 1_280), (0, 655_360)] {
        let params = Params {
            min_rnr_timer: b_timer,
            ..Params::default()
        };
        let mut p = Pair::new(44, &params);
        // A's own min_rnr_timer is something else again.
        let now = p.c.now;
        let qpn = p.a.qpn;
        let attr = rnic_core::qp::QpAttr {
            min_rnr_timer: if b_timer == 0 { 1 } else { 0 },
            ..p.c.nics[0].query_qp(qpn).unwrap()
        };
        p.c.nics[0]
            .modify_qp(now, qpn, &attr, AttrMask::MIN_RNR_TIMER)
            .unwrap();
        p.post(1, SendOp::send(), p.sge_a(0, 16));
        let send = take_tx(&mut p.c.nics[0]);
        deliver_to_b(&mut p, send[0].clone());
        let nak = take_tx(&mut p.c.nics[1]);
        let t0 = p.c.now;
        p.c.nics[0].handle_datagram(t0, &nak[0]);
        let due = t0 + Duration::from_micros(wait_us);
        assert_eq!(p.c.nics[0].next_deadline(), Some(due), "timer {b_timer}");
        p.c.nics[0].handle_timeout(Time(due.as_nanos() - 1));
        assert!(p.c.nics[0].poll_transmit().is_none(), "resent early");
        p.c.nics[0].handle_timeout(due);
        let resent = take_tx(&mut p.c.nics[0]);
        assert_eq!(resent.len(), 1, "resent at the NAK's time");
        assert_eq!(psn_of(&resent[0]), A_PSN);
    }
}

/// max_dest_rd_atomic = 0 leaves the responder no resource for a READ or an
/// atomic: NAK invalid request (rdma_rxe's check_resource), nothing read
/// or changed.
#[test]
fn no_responder_resources_means_invalid_request() {
    for op in ["read", "fetch_add"] {
        let (mut p, _, b) = pair(45, &Params::default());
        // B: RTS -> SQD -> SQD with max_dest_rd_atomic 0 -> RTS.
        let now = p.c.now;
        let qpn = p.b.qpn;
        let cur = p.c.nics[1].query_qp(qpn).unwrap();
        for (state, mask) in [
            (QpState::Sqd, AttrMask::STATE),
            (QpState::Sqd, AttrMask::MAX_DEST_RD_ATOMIC),
            (QpState::Rts, AttrMask::STATE),
        ] {
            let attr = rnic_core::qp::QpAttr {
                qp_state: state,
                max_dest_rd_atomic: 0,
                ..cur
            };
            p.c.nics[1].modify_qp(now, qpn, &attr, mask).unwrap();
        }
        let rkey = p.b.mr.rkey;
        let wr = if op == "read" {
            SendOp::read(B_IOVA, rkey)
        } else {
            SendOp::fetch_add(B_IOVA, rkey, 5)
        };
        p.post(1, wr, p.sge_a(0, 8));
        p.run();
        assert_eq!(p.completions(0)[0].status, WcStatus::RemInvReqErr, "{op}");
        let from_b: Vec<_> = wire(&p).into_iter().filter(|s| s.src == b).collect();
        assert_eq!(from_b.len(), 1);
        assert_eq!(from_b[0].syndrome, Some(0x61));
        assert!(p.c.nics[1].executions().is_empty());
        assert_eq!(p.read(1, 0, 8), [0; 8]);
    }
}

/// A receive whose L_Key is wrong completes with LOC_PROT_ERR (the buffer
/// is not the QP's to write), the SEND is NAKed remote operational error,
/// and nothing is written; a SEND longer than a good receive stays
/// LOC_LEN_ERR (rc.rs `send_longer_than_the_receive`).
#[test]
fn a_receive_with_a_bad_lkey_is_a_protection_error() {
    let mut p = Pair::new(46, &Params::default());
    let now = p.c.now;
    let bad = rnic_core::wr::RecvWr {
        wr_id: 7,
        sg_list: sg_list![rnic_core::wr::Sge {
            addr: B_IOVA,
            length: 64,
            lkey: p.b.mr.lkey ^ 0x100,
        }],
    };
    p.c.nics[1].post_recv(now, p.b.qpn, bad).unwrap();
    p.write_a(0, &[0x77; 32]);
    p.post(1, SendOp::send(), p.sge_a(0, 32));
    p.run();
    assert_eq!(p.completions(0)[0].status, WcStatus::RemOpErr);
    let c = p.completions(1);
    assert_eq!((c[0].wr_id, c[0].status), (7, WcStatus::LocProtErr));
    assert_eq!(p.read(1, 0, 64), [0; 64]);
}

/// Moving a QP to RESET empties its queues without a completion (rdma_rxe's
/// rxe_qp_reset): a CQ shared with other QPs, or the same QP brought back,
/// sees nothing stale. Then the QP works again.
/// Completions a QP left unpolled (receives flushed by its error) go with
/// it to RESET, as mlx5 cleans its CQs: a program that resets the QP and
/// uses it again polls nothing from before. Another QP's stay.
#[test]
fn reset_takes_the_qps_unpolled_completions_out_of_its_cqs() {
    let mut p = Pair::new(48, &Params::default());
    let now = p.c.now;
    let (pd, cq) = (p.a.pd, p.a.cq);
    let nic = &mut p.c.nics[0];
    let other = nic
        .create_qp(pd, rnic_core::qp::QpType::Rc, cq, cq, Default::default())
        .unwrap();
    let attr = rnic_core::qp::QpAttr {
        dest_qp_num: p.b.qpn,
        ..nic.query_qp(p.a.qpn).unwrap()
    };
    nic.to_rts(now, other, &attr).unwrap();
    for (qpn, wr_id) in [(p.a.qpn, 1), (p.a.qpn, 2), (other, 3)] {
        let recv = rnic_core::wr::RecvWr {
            wr_id,
            sg_list: p.sge_a(0, 8),
        };
        p.c.nics[0].post_recv(now, qpn, recv).unwrap();
    }
    let nic = &mut p.c.nics[0];
    for qpn in [p.a.qpn, other] {
        let attr = rnic_core::qp::QpAttr {
            qp_state: QpState::Err,
            ..nic.query_qp(qpn).unwrap()
        };
        nic.modify_qp(now, qpn, &attr, AttrMask::STATE).unwrap();
    }
    let attr = rnic_core::qp::QpAttr {
        qp_state: QpState::Reset,
        ..nic.query_qp(p.a.qpn).unwrap()
    };
    nic.modify_qp(now, p.a.qpn, &attr, AttrMask::STATE).unwrap();
    let left: Vec<_> = p
        .completions(0)
        .iter()
        .map(|c| (c.wr_id, c.qp_num, c.status))
        .collect();
    assert_eq!(left, vec![(3, other, WcStatus::WrFlushErr)]);
    // Destroyed, a QP takes its unpolled completions with it too.
    let recv = rnic_core::wr::RecvWr {
        wr_id: 4,
        sg_list: p.sge_a(0, 8),
    };
    let now = p.c.now;
    let nic = &mut p.c.nics[0];
    let attr = rnic_core::qp::QpAttr {
        dest_qp_num: p.b.qpn,
        ..nic.query_qp(other).unwrap()
    };
    let attr = rnic_core::qp::QpAttr {
        qp_state: QpState::Reset,
        ..attr
    };
    nic.modify_qp(now, other, &attr, AttrMask::STATE).unwrap();
    let attr = rnic_core::qp::QpAttr {
        qp_state: QpState::Rts,
        ..attr
    };
    nic.to_rts(now, other, &attr).unwrap();
    nic.post_recv(now, other, recv).unwrap();
    let attr = rnic_core::qp::QpAttr {
        qp_state: QpState::Err,
        ..attr
    };
    nic.modify_qp(now, other, &attr, AttrMask::STATE).unwrap();
    nic.destroy_qp(other).unwrap();
    assert!(p.completions(0).is_empty());
}

#[test]
fn reset_discards_work_requests_without_completions() {
    let mut p = Pair::new(47, &Params::default());
    cut_a_to_b(&mut p);
    for i in 0..3 {
        p.post_write_to_b(i, B_IOVA, p.sge_a(0, 8));
    }
    let now = p.c.now;
    let recv = rnic_core::wr::RecvWr {
        wr_id: 10,
        sg_list: p.sge_a(0, 8),
    };
    p.c.nics[0].post_recv(now, p.a.qpn, recv).unwrap();
    let qpn = p.a.qpn;
    let mut attr = p.c.nics[0].query_qp(qpn).unwrap();
    attr.qp_state = QpState::Reset;
    p.c.nics[0]
        .modify_qp(now, qpn, &attr, AttrMask::STATE)
        .unwrap();
    p.run();
    assert!(p.completions(0).is_empty(), "no completion from RESET");
    // Brought back to RTS with fresh PSNs on both sides, it works.
    let mut q = Pair::new(47, &Params::default());
    std::mem::swap(&mut q.c.nics[0], &mut p.c.nics[0]);
    let attr = rnic_core::qp::QpAttr {
        qp_state: QpState::Reset,
        ..q.c.nics[0].query_qp(qpn).unwrap()
    };
    let rts = rnic_core::qp::QpAttr {
        dest_qp_num: q.b.qpn,
        sq_psn: A_PSN,
        rq_psn: 0x00_b000,
        ..attr
    };
    let now = q.c.now;
    q.c.nics[0].to_rts(now, qpn, &rts).unwrap();
    q.a = p.a;
    q.post(20, SendOp::write(B_IOVA, q.b.mr.rkey), q.sge_a(0, 8));
    q.run();
    let c = q.completions(0);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(20, WcStatus::Success)]
    );
}

/// One go-back-N at a time (rdma_rxe's started_retry): a stream of
/// sequence NAKs naming the oldest unacknowledged PSN, sent by someone who
/// can spoof the responder while the first retransmission is in flight,
/// starts one retransmission, not one per NAK, and does not exhaust
/// retry_cnt.
#[test]
fn a_stream_of_sequence_naks_starts_one_retransmission() {
    let params = Params {
        link: rnic_core::sim::LinkConfig::perfect(Duration::from_micros(100)),
        retry_cnt: 3,
        ..Params::default()
    };
    let mut p = Pair::new(48, &params);
    let (a, b) = (p.c.nics[0].addr(), p.c.nics[1].addr());
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 3) as u8).collect();
    p.write_a(0, &data);
    p.post_write_to_b(1, B_IOVA, p.sge_a(0, 4096));
    // Ten NAKs for A's first PSN, 2 us apart, while the WRITE is on its way.
    for i in 0..10u64 {
        let mut ib = IbRepr::new(bth::Repr::new(Opcode::RC_ACKNOWLEDGE, p.a.qpn, psn(A_PSN)));
        ib.aeth = Some(aeth::Repr {
            syndrome: Syndrome::Nak(NakCode::PsnSeqError),
            msn: 0,
        });
        let at = p.c.now + Duration::from_micros(2 * i + 1);
        p.c.net.send(at, craft(b, a, ib, &[]));
    }
    p.run();
    let c = p.completions(0);
    assert_eq!(c[0].status, WcStatus::Success);
    assert_eq!(p.read(1, 0, 4096), data);
    let n = p.c.nics[0].counters();
    assert_eq!(n.rcvd_seq_err, 10);
    assert_eq!(n.seq_nak_ignored, 9);
    assert_eq!(n.completer_retry_err, 1);
    assert_eq!(p.c.nics[1].executions().len(), 1);
}

/// A READ request from A's address to B at `psn` for `len` bytes at `va`.
fn read_request(p: &Pair, psn_v: u32, va: u64, rkey: u32, len: u32) -> Datagram {
    let (a, b) = (p.c.nics[0].addr(), p.c.nics[1].addr());
    let mut ib = IbRepr::new(bth::Repr::new(
        Opcode::RC_RDMA_READ_REQUEST,
        p.b.qpn,
        psn(psn_v),
    ));
    ib.reth = Some(reth::Repr {
        va,
        r_key: rkey,
        dma_length: len,
    });
    ib.bth.ack_req = true;
    craft(a, b, ib, &[])
}

/// One 32-byte request for a 64 MiB region, and three copies of it: the
/// responder builds nothing until the transmit queue takes packets, then
/// hands out one response (65,536 packets), not four; a copy restarts the
/// response in progress instead of queueing another. Memory held per QP is
/// a few words per READ, whatever its length.
#[test]
fn a_huge_read_is_generated_as_it_is_sent_and_copies_do_not_multiply_it() {
    let mut p = Pair::new(49, &Params::default());
    const BIG: usize = 64 << 20;
    const BIG_IOVA: u64 = 0x10_0000_0000;
    let pd = p.b.pd;
    let mut region = vec![0u8; BIG];
    region[BIG - 1] = 0xAB;
    let keys = p.c.nics[1]
        .reg_mr(
            pd,
            BIG_IOVA,
            Box::new(region),
            rnic_core::mem::Access::LOCAL_WRITE | rnic_core::mem::Access::REMOTE_READ,
        )
        .unwrap();
    let req = read_request(&p, A_PSN, BIG_IOVA, keys.rkey, BIG as u32);
    for _ in 0..4 {
        deliver_to_b(&mut p, req.clone());
    }
    assert_eq!(p.c.nics[1].counters().sent_pkts, 0, "nothing built yet");
    // The transmit queue takes packets: one burst is built at a time.
    let first = p.c.nics[1].poll_transmit().unwrap();
    assert_eq!(opcode(&first), Opcode::RC_RDMA_READ_RESPONSE_FIRST);
    assert!(p.c.nics[1].counters().sent_pkts <= 16);
    let mut n = 1u32;
    let mut last = first;
    while let Some(d) = p.c.nics[1].poll_transmit() {
        n += 1;
        last = d;
    }
    assert_eq!(n, 65_536);
    assert_eq!(opcode(&last), Opcode::RC_RDMA_READ_RESPONSE_LAST);
    assert_eq!(psn_of(&last), psn(A_PSN).add(65_535).value());
    let tail = IbPacket::new_checked(&last.payload[..]).unwrap();
    assert_eq!(tail.payload()[1023], 0xAB);
    assert_eq!(p.c.nics[1].counters().duplicate_request, 3);
}

/// C9-94: a DMA length above 2^31 is an invalid request (rdma_rxe
/// check_length), whatever the region.
#[test]
fn a_read_longer_than_two_gib_is_an_invalid_request() {
    let mut p = Pair::new(50, &Params::default());
    let rkey = p.b.mr.rkey;
    let d = read_request(&p, A_PSN, B_IOVA, rkey, (1 << 31) + 1);
    deliver_to_b(&mut p, d);
    let out = take_tx(&mut p.c.nics[1]);
    assert_eq!(out.len(), 1);
    let nak = IbPacket::new_checked(&out[0].payload[..]).unwrap();
    assert_eq!(nak.aeth().unwrap().syndrome(), 0x61);
}

/// More READs in progress than max_dest_rd_atomic (16 here) granted: the
/// one beyond is an invalid request, before any work is done for it.
#[test]
fn reads_beyond_max_dest_rd_atomic_in_progress_are_refused() {
    let mut p = Pair::new(51, &Params::default());
    let rkey = p.b.mr.rkey;
    for i in 0..17u32 {
        // Each READ is 2 packets long.
        let d = read_request(&p, psn(A_PSN).add(2 * i).value(), B_IOVA, rkey, 2048);
        deliver_to_b(&mut p, d);
    }
    let out = take_tx(&mut p.c.nics[1]);
    let naks: Vec<_> = out
        .iter()
        .filter(|d| opcode(d) == Opcode::RC_ACKNOWLEDGE)
        .collect();
    assert_eq!(naks.len(), 1);
    assert_eq!(psn_of(naks[0]), psn(A_PSN).add(32).value());
    let nak = IbPacket::new_checked(&naks[0].payload[..]).unwrap();
    assert_eq!(nak.aeth().unwrap().syndrome(), 0x61);
    // The sixteen before it were answered in full, in PSN order, and the NAK after them.
    assert_eq!(out.len(), 33);
    assert_eq!(
        out.iter().position(|d| opcode(d) == Opcode::RC_ACKNOWLEDGE),
        Some(32)
    );
}

/// A duplicate READ, answered again after its original was answered in
/// full, holds no resource a new READ needs: the requester may have taken
/// the original's responses meanwhile (a network that reorders makes it
/// retransmit a READ whose responses were only late) and sent READs up to
/// its limit. As rdma_rxe recycles its oldest responder resource, the
/// re-execution makes room; the limit is still the limit on the READs
/// themselves (the test above).
#[test]
fn a_read_answered_again_gives_way_to_new_reads() {
    let mut p = Pair::new(53, &Params::default());
    let rkey = p.b.mr.rkey;
    let r = psn(A_PSN);
    let d = read_request(&p, r.value(), B_IOVA, rkey, 2048);
    deliver_to_b(&mut p, d);
    assert_eq!(take_tx(&mut p.c.nics[1]).len(), 2, "answered in full");
    // Asked again, and sixteen new READs after it before any response of
    // the second answer left.
    let d = read_request(&p, r.value(), B_IOVA, rkey, 2048);
    deliver_to_b(&mut p, d);
    for i in 1..=16u32 {
        let d = read_request(&p, r.add(2 * i).value(), B_IOVA, rkey, 2048);
        deliver_to_b(&mut p, d);
    }
    let out = take_tx(&mut p.c.nics[1]);
    assert!(
        out.iter().all(|d| opcode(d) != Opcode::RC_ACKNOWLEDGE),
        "no NAK: {:?}",
        out.iter().map(psn_of).collect::<Vec<_>>()
    );
    let new: Vec<u32> = out
        .iter()
        .map(psn_of)
        .filter(|&q| psn(q).diff(r.add(2)) >= 0)
        .collect();
    let want: Vec<u32> = (0..32).map(|k| r.add(2 + k).value()).collect();
    assert_eq!(new, want, "every new READ answered in full, in order");
}

/// A duplicate READ is answered only if it is its READ again, or a part of
/// it: the same R_Key, a range inside the original, and responses within
/// the original's PSNs (rdma_rxe duplicate_request). Otherwise it is
/// dropped and counted; it never produces responses on PSNs of later
/// requests.
#[test]
fn a_duplicate_read_must_be_a_subset_of_the_original() {
    let (mut p, _, _) = pair(52, &Params::default());
    let rkey = p.b.mr.rkey;
    // A 2-packet READ at R = A_PSN (R and R + 1), then a WRITE at R + 2.
    p.post(1, SendOp::read(B_IOVA, rkey), p.sge_a(0, 2048));
    p.post_write_to_b(2, B_IOVA + 4096, p.sge_a(0, 8));
    p.run();
    assert_eq!(p.completions(0).len(), 2);
    let other = p.a.mr.rkey;
    let r = psn(A_PSN);
    for (at, va, len, key) in [
        (r, B_IOVA, 8192, rkey),        // more than the original asked
        (r, B_IOVA - 8, 16, rkey),      // starts before it
        (r, B_IOVA + 2040, 16, rkey),   // ends after it
        (r, B_IOVA, 16, other),         // another R_Key
        (r.add(1), B_IOVA, 2048, rkey), // inside, but its responses run into R + 2
        (r.add(2), B_IOVA, 8, rkey),    // the WRITE's PSN: no READ there
    ] {
        let d = read_request(&p, at.value(), va, key, len);
        deliver_to_b(&mut p, d);
    }
    assert!(take_tx(&mut p.c.nics[1]).is_empty());
    assert_eq!(p.c.nics[1].counters().duplicate_read_refused, 6);
    // The same READ, or the part of it from its second packet, is answered
    // on the original's PSNs.
    for (at, va, len, n) in [(r, B_IOVA, 2048, 2), (r.add(1), B_IOVA + 1024, 1024, 1)] {
        let d = read_request(&p, at.value(), va, rkey, len);
        deliver_to_b(&mut p, d);
        let out = take_tx(&mut p.c.nics[1]);
        assert_eq!(out.len(), n);
        assert_eq!(psn_of(&out[0]), at.value());
        assert_eq!(psn_of(out.last().unwrap()), r.add(1).value());
    }
}

/// A READ response's packets come FIRST, MIDDLE..., LAST (or ONLY) from
/// where the request asked: a LAST where the FIRST is due is dropped and
/// counted, and its bytes land nowhere.
#[test]
fn read_responses_out_of_position_are_dropped() {
    let mut p = Pair::new(53, &Params::default());
    let (a, b) = (p.c.nics[0].addr(), p.c.nics[1].addr());
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 11) as u8).collect();
    p.write_a(0, &data);
    let rkey = p.b.mr.rkey;
    p.post_write_to_b(1, B_IOVA, p.sge_a(0, 3000));
    p.run();
    p.completions(0);
    let read_psn = psn(A_PSN).add(3);
    p.post(2, SendOp::read(B_IOVA, rkey), p.sge_a(10_000, 3000));
    let req = take_tx(&mut p.c.nics[0]);
    deliver_to_b(&mut p, req[0].clone());
    let responses = take_tx(&mut p.c.nics[1]);
    assert_eq!(responses.len(), 3);
    // A LAST (with a full PMTU of bytes) at the FIRST's PSN, and an ONLY.
    for op in [
        Opcode::RC_RDMA_READ_RESPONSE_LAST,
        Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
    ] {
        let mut ib = IbRepr::new(bth::Repr::new(op, p.a.qpn, read_psn));
        if op == Opcode::RC_RDMA_READ_RESPONSE_LAST {
            ib.aeth = Some(aeth::Repr {
                syndrome: Syndrome::ACK_NO_CREDITS,
                msn: 2,
            });
        }
        ib.payload_len = 1024;
        let now = p.c.now;
        p.c.nics[0].handle_datagram(now, &craft(b, a, ib, &[0xEE; 1024]));
    }
    assert_eq!(p.c.nics[0].counters().read_response_out_of_order, 2);
    let now = p.c.now;
    for d in &responses {
        p.c.nics[0].handle_datagram(now, d);
    }
    assert_eq!(p.completions(0)[0].status, WcStatus::Success);
    assert_eq!(p.read(0, 10_000, 3000), data);
}

/// SQD (IBTA 10.3.1, 11.6.3.3): a message already begun is finished,
/// retransmissions included; no new one is begun; once nothing is in
/// flight the SQ-drained event is raised (asked for with
/// EN_SQD_ASYNC_NOTIFY). Back in RTS, the rest goes.
#[test]
fn sqd_finishes_what_was_begun_resends_a_loss_and_then_reports_drained() {
    let (mut p, a, _) = pair(54, &Params::default());
    // 1,536 packets at PMTU 1024: more than the 1,024 in flight at once, so
    // the message is half sent when the QP enters SQD.
    const LEN: usize = 1536 * 1024;
    const IOVA: u64 = 0x30_0000_0000;
    let data: Vec<u8> = (0..LEN as u32).map(|i| (i ^ (i >> 9)) as u8).collect();
    let access = rnic_core::mem::Access::LOCAL_WRITE | rnic_core::mem::Access::REMOTE_WRITE;
    let (pa, pb) = (p.a.pd, p.b.pd);
    let src = p.c.nics[0]
        .reg_mr(pa, IOVA, Box::new(data.clone()), access)
        .unwrap();
    let dst = p.c.nics[1]
        .reg_mr(pb, IOVA, Box::new(vec![0u8; LEN]), access)
        .unwrap();
    // One loss the responder NAKs (a gap), one only the ACK timer finds:
    // the last packet, lost when first sent and again when the NAK's
    // go-back-N resends it.
    for (lost, times) in [(1000, 1), (1535, 2)] {
        p.c.net.drop_rule(DropRule {
            src: Some(a),
            opcode: None,
            psn: Some(psn(A_PSN).add(lost)),
            times,
        });
    }
    let sge = rnic_core::wr::Sge {
        addr: IOVA,
        length: LEN as u32,
        lkey: src.lkey,
    };
    p.post(1, SendOp::write(IOVA, dst.rkey), sg_list![sge]);
    p.post_write_to_b(2, B_IOVA, p.sge_a(0, 8));
    let now = p.c.now;
    let qpn = p.a.qpn;
    let sqd = rnic_core::qp::QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..p.c.nics[0].query_qp(qpn).unwrap()
    };
    p.c.nics[0]
        .modify_qp(
            now,
            qpn,
            &sqd,
            AttrMask::STATE | AttrMask::EN_SQD_ASYNC_NOTIFY,
        )
        .unwrap();
    assert_eq!(p.c.nics[0].poll_async_event(), None, "not drained yet");
    p.run();
    let c = p.completions(0);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success)]
    );
    assert!(
        p.c.nics[0].counters().completer_retry_err >= 1,
        "the loss was resent"
    );
    let mut out = vec![0u8; LEN];
    p.c.nics[1].read_mr(pb, dst.lkey, IOVA, &mut out).unwrap();
    assert!(out == data);
    assert_eq!(p.c.nics[1].executions().len(), 1, "the second WRITE waits");
    assert_eq!(
        p.c.nics[0].poll_async_event(),
        Some(rnic_core::srq::AsyncEvent::SqDrained(qpn))
    );
    let rts = rnic_core::qp::QpAttr {
        qp_state: QpState::Rts,
        ..sqd
    };
    let now = p.c.now;
    p.c.nics[0]
        .modify_qp(now, qpn, &rts, AttrMask::STATE)
        .unwrap();
    p.run();
    assert_eq!(p.completions(0)[0].wr_id, 2);
    assert_eq!(p.c.nics[0].poll_async_event(), None, "raised once");
}

/// A CQ that overruns is in error (IBTA 11.4.2.1; rdma_rxe's
/// RESPST_ERR_CQ_OVERFLOW): IBV_EVENT_CQ_ERR, and the QP completing into it
/// goes to the error state with IBV_EVENT_QP_FATAL, rather than completions
/// vanishing while the QP runs on.
#[test]
fn a_cq_overrun_is_a_cq_error_and_its_qps_go_to_error() {
    let params = Params {
        cq_depth: 2,
        ..Params::default()
    };
    let mut p = Pair::new(55, &params);
    for i in 0..4 {
        p.post_write_to_b(i, B_IOVA, p.sge_a(0, 8));
    }
    p.run();
    assert_eq!(p.completions(0).len(), 2);
    let cq = p.a.cq;
    let qpn = p.a.qpn;
    assert_eq!(
        p.c.nics[0].poll_async_event(),
        Some(rnic_core::srq::AsyncEvent::CqError(cq))
    );
    assert_eq!(
        p.c.nics[0].poll_async_event(),
        Some(rnic_core::srq::AsyncEvent::QpFatal(qpn))
    );
    assert_eq!(p.c.nics[0].query_qp(qpn).unwrap().qp_state, QpState::Err);
    // Drained by the application, the CQ still takes nothing: it is in error.
    p.post(9, SendOp::send(), p.sge_a(0, 8));
    assert!(p.completions(0).is_empty());
}

/// A READ whose response would need 2^23 PSNs or more (2 GiB at PMTU 256)
/// is refused when posted: the requester's modular PSN comparisons cannot
/// span half the 24-bit space. One packet fewer is accepted.
#[test]
fn a_read_of_two_to_the_23_packets_is_refused_at_post() {
    let params = Params {
        mtu: rnic_core::qp::Mtu::Mtu256,
        ..Params::default()
    };
    let mut p = Pair::new(56, &params);
    let rkey = p.b.mr.rkey;
    let now = p.c.now;
    let qpn = p.a.qpn;
    let lkey = p.a.mr.lkey;
    let read = |len: u32| {
        SendWr::new(
            1,
            SendOp::read(B_IOVA, rkey),
            sg_list![rnic_core::wr::Sge {
                addr: A_IOVA,
                length: len,
                lkey,
            }],
        )
    };
    let e = p.c.nics[0].post_send(now, qpn, read(1 << 31)).unwrap_err();
    assert_eq!(
        e,
        rnic_core::VerbError::ReadTooManyPackets {
            len: 1 << 31,
            pmtu: 256
        }
    );
    p.c.nics[0]
        .post_send(now, qpn, read((1 << 31) - 256))
        .unwrap();
}

/// `ibv_destroy_qp`: packets for a destroyed QP find nothing (counted as
/// for an unknown QP, memory untouched, no answer), its number is not given
/// out again, and destroying it twice is an error.
#[test]
fn a_destroyed_qp_takes_no_more_packets() {
    let mut p = Pair::new(44, &Params::default());
    let (a, b) = (p.c.nics[0].addr(), p.c.nics[1].addr());
    let qpn = p.b.qpn;
    p.c.nics[1].destroy_qp(qpn).unwrap();
    assert!(p.c.nics[1].destroy_qp(qpn).is_err(), "destroyed twice");
    assert!(p.c.nics[1].query_qp(qpn).is_err());
    let before = p.c.nics[1].counters().unknown_qp;
    let write = craft(a, b, write_only(&p), &[0x5A; 8]);
    deliver_to_b(&mut p, write);
    assert_eq!(p.c.nics[1].counters().unknown_qp, before + 1);
    assert_eq!(p.read(1, 0, 8), [0; 8]);
    assert!(p.c.nics[1].poll_transmit().is_none(), "no answer");
    // A new QP on B gets a new number.
    let pd = p.b.pd;
    let cq = p.b.cq;
    let fresh = p.c.nics[1]
        .create_qp(pd, rnic_core::qp::QpType::Rc, cq, cq, Default::default())
        .unwrap();
    assert_ne!(fresh, qpn);
}

/// A duplicate WRITE (its ACK lost, say) that arrives after a READ: the
/// re-ACK names the last WRITE, never the READ's PSNs. rdma_rxe's completer
/// takes a plain ACK with a READ's last PSN as the end of that READ, so an
/// ACK covering a READ whose LAST response was lost completed it with half
/// its data (seen under netem, rdma_rxe reading 8 KiB from rnic).
#[test]
fn a_duplicates_re_ack_never_covers_a_read_since() {
    let mut p = Pair::new(50, &Params::default());
    let (a, b) = (p.c.nics[0].addr(), p.c.nics[1].addr());
    let write = craft(a, b, write_only(&p), &[7; 8]);
    deliver_to_b(&mut p, write.clone());
    let two_packets = 2 * p.c.nics[1].query_qp(p.b.qpn).unwrap().path_mtu.bytes() as u32;
    let read = read_request(&p, A_PSN + 1, B_IOVA, p.b.mr.rkey, two_packets);
    deliver_to_b(&mut p, read);
    deliver_to_b(&mut p, write);
    let sent: Vec<_> = take_tx(&mut p.c.nics[1])
        .iter()
        .map(|d| (opcode(d), psn_of(d)))
        .collect();
    let read = psn(A_PSN).next();
    assert_eq!(
        sent,
        [
            (Opcode::RC_ACKNOWLEDGE, A_PSN),
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, read.value()),
            (Opcode::RC_RDMA_READ_RESPONSE_LAST, read.next().value()),
            (Opcode::RC_ACKNOWLEDGE, A_PSN),
        ]
    );
}

/// An ACK that lands inside a request while go-back-N is resending an earlier
/// one: the requester goes on from the first unacknowledged PSN, never from
/// the start of a request the ACK has partly covered. Resuming at the start
/// put the next PSN to send behind the oldest unacknowledged one: the window
/// (counted from that PSN) then looked full forever, and the timer, seeing
/// nothing outstanding past it, never resent. The QP hung in RTS with its
/// requests posted (seen as perftest's `ib_write_bw -b` hanging on loopback,
/// where one lost datagram in a few thousand is enough).
///
/// An honest responder on a lossy network produces it: the window ends in
/// the middle of a WRITE, and the ACK of the request before that WRITE is
/// lost; the ACK of the window's last packet arrives after the local ACK
/// timeout has rewound to the first request.
#[test]
fn an_ack_inside_a_request_after_a_rewind_resumes_at_the_oldest_unacked_psn() {
    let mut p = Pair::new(49, &Params::default());
    let data: Vec<u8> = (0..160 * 1024u32).map(|i| (i * 13 + 5) as u8).collect();
    p.write_a(0, &data);
    // A first WRITE lost whole: the timeout shrinks the window to 16
    // packets; its resend is taken and ACKed, which doubles it to 32.
    p.post_write_to_b(1, B_IOVA, p.sge_a(0, 16 * 1024));
    take_tx(&mut p.c.nics[0]);
    let mut now = p.c.now + Duration::from_millis(2);
    p.c.nics[0].handle_timeout(now);
    for d in take_tx(&mut p.c.nics[0]) {
        p.c.nics[1].handle_datagram(now, &d);
    }
    for d in take_tx(&mut p.c.nics[1]) {
        p.c.nics[0].handle_datagram(now, &d);
    }
    // Two WRITEs, of 16 and 128 packets: the window of 32 ends in the
    // middle of the second, on a packet that asks for an ACK.
    p.post_write_to_b(2, B_IOVA + 16 * 1024, p.sge_a(16 * 1024, 16 * 1024));
    p.post_write_to_b(3, B_IOVA + 32 * 1024, p.sge_a(32 * 1024, 128 * 1024));
    let window = take_tx(&mut p.c.nics[0]);
    assert_eq!(window.len(), 32);
    // B ACKs the first WRITE's last packet (lost) and the window's last
    // (taken as each leaves: two ACKs in one batch would coalesce).
    let mut acks = Vec::new();
    for part in window.chunks(16) {
        for d in part {
            p.c.nics[1].handle_datagram(now, d);
        }
        acks.extend(take_tx(&mut p.c.nics[1]));
    }
    assert_eq!(
        acks.iter().map(psn_of).collect::<Vec<_>>(),
        [psn_of(&window[15]), psn_of(&window[31])]
    );
    // A times out first, rewinds to the 16-packet WRITE and resends it.
    now = now + Duration::from_millis(2);
    p.c.nics[0].handle_timeout(now);
    let resent = take_tx(&mut p.c.nics[0]);
    assert_eq!(psn_of(&resent[0]), psn_of(&window[0]));
    // The late ACK of the window's last packet: everything up to the
    // middle of the 128-packet WRITE is done.
    p.c.nics[0].handle_datagram(now, &acks[1]);
    let next = take_tx(&mut p.c.nics[0]);
    assert!(
        !next.is_empty(),
        "the requester sends after an ACK that opened its window"
    );
    assert_eq!(psn_of(&next[0]), psn_of(&window[31]) + 1);
    p.c.now = now;
    for d in resent.into_iter().chain(next) {
        p.c.net.send(now, d);
    }
    p.run();
    let c = p.completions(0);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    assert_eq!(p.read(1, 0, 160 * 1024), data);
}

/// The same state reached by the simulator with one lost ACK: a timeout
/// leaves a window of 32 packets, which ends inside a 48-packet WRITE; the
/// ACK of its last packet is lost; the next timeout rewinds to the WRITE's
/// start and resends 16 packets, and the responder's re-ACK of that
/// duplicate names the last packet it has, which is the last one sent.
#[test]
fn a_re_ack_overtaking_a_rewind_inside_a_write_does_not_stall_it() {
    let params = Params {
        mtu: rnic_core::qp::Mtu::Mtu256,
        ..Params::default()
    };
    let mut p = Pair::new(50, &params);
    let b = p.c.nics[1].addr();
    let data: Vec<u8> = (0..13 * 1024u32).map(|i| (i * 13 + 5) as u8).collect();
    p.write_a(0, &data);
    let lose_an_ack = DropRule {
        src: Some(b),
        opcode: Some(Opcode::RC_ACKNOWLEDGE),
        psn: None,
        times: 1,
    };
    p.c.net.drop_rule(lose_an_ack);
    p.post_write_to_b(1, B_IOVA, p.sge_a(0, 1024));
    p.run();
    p.c.net.drop_rule(lose_an_ack);
    p.post_write_to_b(2, B_IOVA + 1024, p.sge_a(1024, 12 * 1024));
    p.run();
    let c = p.completions(0);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(p.read(1, 0, 13 * 1024), data);
    assert_eq!(p.c.nics[0].counters().completer_retry_err, 2);
}
