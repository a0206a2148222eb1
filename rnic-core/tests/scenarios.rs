//! The transport's named scenarios, each with a scripted loss or a crafted
//! packet, checked on the wire (the simulator's capture) and in completions.

mod common;

use std::time::Duration;

use common::*;
use rnic_core::qp::QpState;
use rnic_core::sim::DropRule;
use rnic_core::wr::{SendOp, WcStatus};
use rnic_core::ExecKind;
use rnic_wire::aeth::{self, NakCode, Syndrome};
use rnic_wire::{bth, IbRepr, Opcode};

#[test]
fn implied_nak_sequence_error_then_partial_write_retry() {
    let (mut p, a, b) = pair(31, &Params::default());
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    p.write_a(0, &data);
    // A 5-packet WRITE; its third packet is lost once.
    p.c.net.drop_rule(DropRule {
        src: Some(a),
        opcode: None,
        psn: Some(psn(A_PSN).add(2)),
        times: 1,
    });
    let rkey = p.b.mr.rkey;
    p.post(1, SendOp::write(B_IOVA, rkey), p.sge_a(0, 5000));
    p.run();
    assert_eq!(p.completions(0)[0].status, WcStatus::Success);
    assert_eq!(p.read(1, 0, 5000), data);
    let w = wire(&p);
    // B NAKs the gap once, with the PSN it expects.
    let naks: Vec<_> = w
        .iter()
        .filter(|s| s.src == b && s.syndrome == Some(0x60))
        .collect();
    assert_eq!(naks.len(), 1);
    assert_eq!(naks[0].psn, psn(A_PSN).add(2).value());
    // A resends from the lost packet: a MIDDLE, not the whole message.
    let from_a: Vec<_> = w.iter().filter(|s| s.src == a).collect();
    assert_eq!(from_a.len(), 5 + 3);
    assert_eq!(
        (from_a[5].opcode, from_a[5].psn),
        (Opcode::RC_RDMA_WRITE_MIDDLE, psn(A_PSN).add(2).value())
    );
    assert_eq!(p.c.nics[1].executions().len(), 1);
}

#[test]
fn implied_nak_with_the_retry_limit_exceeded() {
    let params = Params {
        retry_cnt: 2,
        ..Params::default()
    };
    let (mut p, a, _) = pair(32, &params);
    p.c.net.drop_rule(DropRule {
        src: Some(a),
        opcode: None,
        psn: Some(psn(A_PSN).add(1)),
        times: u32::MAX,
    });
    let rkey = p.b.mr.rkey;
    p.post(1, SendOp::write(B_IOVA, rkey), p.sge_a(0, 3000));
    p.post(2, SendOp::write(B_IOVA, rkey), p.sge_a(0, 8));
    p.run();
    let c = p.completions(0);
    assert_eq!(
        c.iter().map(|c| c.status).collect::<Vec<_>>(),
        vec![WcStatus::RetryExcErr, WcStatus::WrFlushErr]
    );
    let n = p.c.nics[0].counters();
    // The sequence NAK, then timeouts: retry_cnt + 1 attempts in all.
    assert_eq!(n.rcvd_seq_err, 1);
    assert_eq!(n.completer_retry_err, 3);
}

#[test]
fn local_ack_timeout_then_duplicate_re_acked() {
    let (mut p, _, b) = pair(33, &Params::default());
    p.c.net.drop_rule(DropRule {
        src: Some(b),
        opcode: Some(Opcode::RC_ACKNOWLEDGE),
        psn: None,
        times: 1,
    });
    let rkey = p.b.mr.rkey;
    let start = p.c.now;
    p.post(1, SendOp::write(B_IOVA, rkey), p.sge_a(0, 64));
    p.run();
    assert_eq!(p.completions(0)[0].status, WcStatus::Success);
    // Executed once; the retransmission was a duplicate, answered with an ACK.
    assert_eq!(p.c.nics[1].executions().len(), 1);
    assert_eq!(p.c.nics[1].counters().duplicate_request, 1);
    // The ACK timeout (timeout 8 = 1.048576 ms) from the first send, then one
    // round trip (2 x 5 us) for the retransmission and its ACK.
    assert_eq!(p.c.now - start, Duration::from_nanos(1_048_576 + 10_000));
}

#[test]
fn partial_read_retry_asks_only_for_what_is_missing() {
    let (mut p, a, b) = pair(34, &Params::default());
    let rkey = p.b.mr.rkey;
    // Put known bytes at B with a WRITE first.
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 13 + 1) as u8).collect();
    p.write_a(0, &data);
    p.post(1, SendOp::write(B_IOVA, rkey), p.sge_a(0, 5000));
    p.run();
    let read_psn = psn(A_PSN).add(5);
    p.c.net.drop_rule(DropRule {
        src: Some(b),
        opcode: None,
        psn: Some(read_psn.add(2)),
        times: 1,
    });
    p.post(2, SendOp::read(B_IOVA, rkey), p.sge_a(20_000, 5000));
    p.run();
    assert!(p
        .completions(0)
        .iter()
        .all(|c| c.status == WcStatus::Success));
    assert_eq!(p.read(0, 20_000, 5000), data);
    let reads: Vec<_> = wire(&p)
        .into_iter()
        .filter(|s| s.src == a && s.opcode == Opcode::RC_RDMA_READ_REQUEST)
        .collect();
    assert_eq!(reads.len(), 2);
    assert_eq!(
        (reads[0].psn, reads[0].reth),
        (read_psn.value(), Some((B_IOVA, 5000)))
    );
    // The re-read starts at the first missing response: VA + 2 PMTU, length reduced.
    assert_eq!(
        (reads[1].psn, reads[1].reth),
        (read_psn.add(2).value(), Some((B_IOVA + 2048, 5000 - 2048)))
    );
}

#[test]
fn ghost_ack_is_ignored() {
    let (mut p, a, b) = pair(35, &Params::default());
    let qpn_a = p.a.qpn;
    let mut ib = IbRepr::new(bth::Repr::new(
        Opcode::RC_ACKNOWLEDGE,
        qpn_a,
        psn(0x12_3456),
    ));
    ib.aeth = Some(aeth::Repr {
        syndrome: Syndrome::ACK_NO_CREDITS,
        msn: 9,
    });
    let now = p.c.now;
    p.c.net.send(now, craft(b, a, ib, &[]));
    p.run();
    assert!(p.completions(0).is_empty());
    assert_eq!(p.c.nics[0].counters().ghost_or_duplicate_response, 1);
    // And the QP works on.
    let rkey = p.b.mr.rkey;
    p.post(1, SendOp::write(B_IOVA, rkey), p.sge_a(0, 8));
    p.run();
    assert_eq!(p.completions(0)[0].status, WcStatus::Success);
}

#[test]
fn bad_response_fails_the_request() {
    let (mut p, a, b) = pair(36, &Params::default());
    // The WRITE never arrives; a READ response for its PSN does.
    p.c.net.drop_rule(DropRule {
        src: Some(a),
        opcode: None,
        psn: None,
        times: u32::MAX,
    });
    let rkey = p.b.mr.rkey;
    p.post(1, SendOp::write(B_IOVA, rkey), p.sge_a(0, 8));
    let mut ib = IbRepr::new(bth::Repr::new(
        Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        p.a.qpn,
        psn(A_PSN),
    ));
    ib.aeth = Some(aeth::Repr {
        syndrome: Syndrome::ACK_NO_CREDITS,
        msn: 1,
    });
    ib.payload_len = 8;
    let now = p.c.now;
    p.c.net.send(now, craft(b, a, ib, &[0; 8]));
    p.run();
    assert_eq!(p.completions(0)[0].status, WcStatus::BadRespErr);
    assert_eq!(
        p.c.nics[0].query_qp(p.a.qpn).unwrap().qp_state,
        QpState::Err
    );
}

#[test]
fn unexpected_opcode_is_an_invalid_request() {
    let (mut p, a, b) = pair(37, &Params::default());
    // A WRITE_MIDDLE with no WRITE_FIRST before it, at the expected PSN.
    let mut ib = IbRepr::new(bth::Repr::new(
        Opcode::RC_RDMA_WRITE_MIDDLE,
        p.b.qpn,
        psn(A_PSN),
    ));
    ib.payload_len = 1024;
    let now = p.c.now;
    p.c.net.send(now, craft(a, b, ib, &[0xAB; 1024]));
    p.run();
    let naks: Vec<_> = wire(&p).into_iter().filter(|s| s.src == b).collect();
    assert_eq!(naks.len(), 1);
    assert_eq!(
        naks[0].syndrome,
        Some(Syndrome::Nak(NakCode::InvalidRequest).to_byte())
    );
    assert_eq!(
        p.c.nics[1].query_qp(p.b.qpn).unwrap().qp_state,
        QpState::Err
    );
    assert!(
        p.read(1, 0, 1024).iter().all(|&x| x == 0),
        "nothing written"
    );
}

#[test]
fn rkey_violation_on_the_wire() {
    let (mut p, _, b) = pair(38, &Params::default());
    let rkey = p.b.mr.rkey;
    p.post(
        1,
        SendOp::read(B_IOVA + REGION as u64, rkey),
        p.sge_a(0, 16),
    );
    p.run();
    assert_eq!(p.completions(0)[0].status, WcStatus::RemAccessErr);
    let from_b: Vec<_> = wire(&p).into_iter().filter(|s| s.src == b).collect();
    assert_eq!(from_b.len(), 1);
    assert_eq!(
        (from_b[0].opcode, from_b[0].syndrome),
        (Opcode::RC_ACKNOWLEDGE, Some(0x62))
    );
    assert!(!p.c.nics[1]
        .executions()
        .iter()
        .any(|e| matches!(e.kind, ExecKind::Read { .. })));
}

#[test]
fn psns_wrap_and_b_psns_are_its_own() {
    let (mut p, a, b) = pair(39, &Params::default());
    let rkey = p.b.mr.rkey;
    for i in 0..20 {
        p.post(i, SendOp::write(B_IOVA, rkey), p.sge_a(0, 8));
    }
    p.run();
    assert!(p
        .completions(0)
        .iter()
        .all(|c| c.status == WcStatus::Success));
    let w = wire(&p);
    let a_psns: Vec<u32> = w.iter().filter(|s| s.src == a).map(|s| s.psn).collect();
    let expected: Vec<u32> = (0..20).map(|i| psn(A_PSN).add(i).value()).collect();
    assert_eq!(a_psns, expected, "through 0xffffff and on from 0");
    // B's requester is idle; B's ACKs carry A's PSNs.
    assert!(w
        .iter()
        .filter(|s| s.src == b)
        .all(|s| s.opcode == Opcode::RC_ACKNOWLEDGE));
}

/// A local ACK timeout shrinks the requester's window to 16 packets, the
/// last of which asks for an ACK; each ACK then doubles it. Resending a
/// whole 1024-packet window to a responder that could not take the last
/// one (a slow receiver behind a full queue) would lose its head again.
#[test]
fn a_timeout_resends_a_small_window_and_acks_open_it_again() {
    let (mut p, a, b) = pair(36, &Params::default());
    let data: Vec<u8> = (0..200 * 1024u32).map(|i| (i * 31 + 7) as u8).collect();
    p.write_a(0, &data);
    // The responder's ACKs of the first pass are lost.
    p.c.net.partition(b, a);
    let sg = p.sge_a(0, data.len() as u32);
    p.post_write_to_b(1, B_IOVA, sg);
    // Past the first pass, before the ACK timeout (1.05 ms).
    let until = p.c.now + Duration::from_micros(500);
    p.c.run(until, 1_000_000);
    p.c.net.heal(b, a);
    p.run();
    assert_eq!(p.completions(0)[0].status, WcStatus::Success);
    assert_eq!(p.read(1, 0, data.len()), data);
    let seen = wire(&p);
    // The first pass: 200 packets from A, in PSN order.
    let from_a: Vec<usize> = (0..seen.len()).filter(|&i| seen[i].src == a).collect();
    let first_pass: Vec<u32> = from_a[..200].iter().map(|&i| seen[i].psn).collect();
    let in_order: Vec<u32> = (0..200).map(|k| psn(A_PSN).add(k).value()).collect();
    assert_eq!(first_pass, in_order);
    // After it: the bursts from A between answers from B.
    let after = &seen[from_a[200]..];
    assert_eq!(
        after[0].psn, A_PSN,
        "the retransmission starts at the first PSN"
    );
    let mut bursts = vec![];
    let mut run = 0;
    for s in after {
        if s.src == a {
            run += 1;
        } else if run > 0 {
            bursts.push(run);
            run = 0;
        }
    }
    if run > 0 {
        bursts.push(run);
    }
    assert_eq!(
        &bursts[..3],
        &[16, 32, 64],
        "bursts after the timeout: {bursts:?}"
    );
    assert_eq!(bursts.iter().sum::<usize>(), 200);
}

/// A responder that answers slower than the requester asks (rdma_rxe in an
/// emulated VM, here a link of 10 MB/s from B) still owes the responses to
/// READs asked before a lost one when the requester asks again. Those
/// answers keep arriving for longer than the local ACK timeout: each one
/// restarts the timer (as rdma_rxe's completer does), so the requester
/// waits for them instead of spending a retry per timeout until
/// RETRY_EXC_ERR.
#[test]
fn a_slow_responder_draining_its_backlog_is_not_timed_out() {
    let (mut p, a, b) = pair(37, &Params::default());
    let len = 64 * 1024;
    let data: Vec<u8> = (0..len as u32).map(|i| (i * 29 + 3) as u8).collect();
    p.write_a(0, &data);
    p.post_write_to_b(1, B_IOVA, p.sge_a(0, len as u32));
    p.run();
    assert_eq!(p.completions(0)[0].status, WcStatus::Success);
    let rkey = p.b.mr.rkey;
    // Sixteen READs of 4 KiB (four responses each): 64 KiB from B, which
    // takes 33 ms at 2 MB/s, 31 ACK timeouts (1.05 ms each).
    p.c.net.set_bandwidth(b, a, 2_000_000);
    let first_read = psn(A_PSN).add(64);
    p.c.net.drop_rule(DropRule {
        src: Some(b),
        opcode: None,
        psn: Some(first_read.add(1)),
        times: 1,
    });
    for k in 0..16u64 {
        let op = SendOp::read(B_IOVA + k * 4096, rkey);
        let sg = p.sge_a(128 * 1024 + k * 4096, 4096);
        p.post(10 + k, op, sg);
    }
    p.run();
    let done = p.completions(0);
    assert_eq!(done.len(), 16);
    assert!(
        done.iter().all(|c| c.status == WcStatus::Success),
        "{done:?}"
    );
    assert_eq!(p.read(0, 128 * 1024, len), data);
    // One go-back-N from the lost response (at most the sixteen READs
    // again), not one per timeout.
    let reasked = wire(&p)
        .iter()
        .filter(|s| s.src == a && s.opcode == Opcode::RC_RDMA_READ_REQUEST)
        .count();
    assert!((17..=32).contains(&reasked), "{reasked} READ requests");
    assert_eq!(p.c.nics[0].counters().retry_exceeded_err, 0);
}

/// A responder slower than its requester (rdma_rxe in an emulated VM: it
/// checks the ICRC of every packet, stale ones too) builds a queue in
/// front of itself. A requester that keeps its whole window of 1,024
/// packets in that queue makes the queue's delay (14 ms here) longer than
/// all its retries: when a packet is lost, the responder NAKs it once and
/// then drops what follows until the resent packet comes through the
/// queue, and a timeout every 1.05 ms spends the seven retries before it
/// does (RETRY_EXC_ERR on a healthy link, as ib_send_bw saw against
/// rdma_rxe). Timing its round trips, the requester keeps the queue within
/// a quarter of its local ACK timeout.
#[test]
fn a_queue_in_front_of_a_slow_responder_stays_inside_the_ack_timeout() {
    let (mut p, a, b) = pair(39, &Params::default());
    let msg = 16 * 1024;
    let data: Vec<u8> = (0..msg as u32).map(|i| (i * 17 + 11) as u8).collect();
    p.write_a(0, &data);
    // About 75 packets of 1 KiB a millisecond from A to B: an ACK every
    // 16-packet message, every 0.2 ms, well inside the 1.05 ms timeout.
    p.c.net.set_bandwidth(a, b, 80_000_000);
    let messages = 256u32;
    p.c.net.drop_rule(DropRule {
        src: Some(a),
        opcode: None,
        psn: Some(psn(A_PSN).add(2500)),
        times: 1,
    });
    for k in 0..u64::from(messages) {
        let sg = p.sge_a(0, msg as u32);
        p.post_write_to_b(k, B_IOVA + (k % 8) * msg as u64, sg);
    }
    p.run();
    let done = p.completions(0);
    assert_eq!(done.len(), messages as usize);
    assert!(
        done.iter().all(|c| c.status == WcStatus::Success),
        "{:?}",
        done.iter().find(|c| c.status != WcStatus::Success)
    );
    for k in 0..8 {
        assert_eq!(p.read(1, k * msg as u64, msg), data);
    }
    let n = p.c.nics[0].counters();
    assert_eq!(n.retry_exceeded_err, 0);
    // The loss costs one NAK and at most a timeout, not a retry per
    // timeout while the queue drains.
    assert_eq!(n.rcvd_seq_err, 1);
    assert!(n.completer_retry_err <= 2, "{n:?}");
    assert!(n.window_delay_cuts > 0, "{n:?}");
}

/// Timers come from a heap of deadlines, not a walk over every QP: with
/// 2,000 idle QPs beside the busy one, a transfer whose ACKs are lost still
/// retransmits on time. A QP whose ACK timer is re-armed (every ACK) adds
/// no entry: beside it, a QP waiting on a peer that never answers holds an
/// entry in front of the busy QP's deadlines the whole time, where
/// entries added per ACK would pile up; the heap stays near the number of
/// QPs with a deadline.
#[test]
fn timers_are_a_heap_that_idle_qps_do_not_fill() {
    let (mut p, a, b) = pair(38, &Params::default());
    let (pd, cq) = (p.a.pd, p.a.cq);
    for _ in 0..2000 {
        p.c.nics[0]
            .create_qp(pd, rnic_core::qp::QpType::Rc, cq, cq, Default::default())
            .unwrap();
    }
    let data: Vec<u8> = (0..200 * 1024u32).map(|i| (i * 13 + 5) as u8).collect();
    p.write_a(0, &data);
    // The waiting QP: connected as A's is, to a QP B does not have.
    let waiting_cq = p.c.nics[0].create_cq(16);
    let waiting = p.c.nics[0]
        .create_qp(
            pd,
            rnic_core::qp::QpType::Rc,
            waiting_cq,
            waiting_cq,
            Default::default(),
        )
        .unwrap();
    let mut attr = p.c.nics[0].query_qp(p.a.qpn).unwrap();
    attr.dest_qp_num = 0xFF_FFFE;
    let now = p.c.now;
    p.c.nics[0].to_rts(now, waiting, &attr).unwrap();
    let rkey = p.b.mr.rkey;
    let op = SendOp::write(B_IOVA, rkey);
    let wr = rnic_core::wr::SendWr::new(99, op, p.sge_a(0, 8));
    p.c.nics[0].post_send(now, waiting, wr).unwrap();
    let sg = p.sge_a(0, data.len() as u32);
    p.post_write_to_b(1, B_IOVA, sg);
    // B's ACKs of the first pass are lost, so the local ACK timer (1.05
    // ms) must fire.
    p.c.net.partition(b, a);
    let heal_at = p.c.now + Duration::from_micros(500);
    let mut most = 0;
    let limit = p.c.now + Duration::from_secs(60);
    let mut settled = false;
    for _ in 0..1_000_000 {
        if p.c.now >= heal_at {
            p.c.net.heal(b, a);
        }
        most = most.max(p.c.nics[0].timer_entries());
        if p.c.next_event().is_none() {
            settled = true;
            break;
        }
        assert!(p.c.now < limit, "still running after 60 s");
        p.c.step();
    }
    assert!(settled, "the simulation did not settle");
    assert_eq!(p.completions(0)[0].status, WcStatus::Success);
    assert_eq!(p.read(1, 0, data.len()), data);
    assert!(
        p.c.nics[0].counters().completer_retry_err > 0,
        "a timeout fired"
    );
    assert!(most <= 4, "{most} timer entries for one QP with a deadline");
    assert_eq!(p.c.nics[0].timer_entries(), 0, "nothing left once idle");
    let gave_up = p.c.nics[0].poll_cq(waiting_cq, 4).unwrap();
    assert_eq!(
        gave_up[0].status,
        WcStatus::RetryExcErr,
        "the waiting QP waited"
    );
}

/// A peer that is gone (every packet lost): the request fails with
/// RETRY_EXC_ERR after exactly retry_cnt + 1 local ACK timeouts of
/// 4.096 us x 2^timeout each, the first sent at the post and each
/// retransmission when the previous wait ran out; what was posted after
/// it is flushed.
#[test]
fn a_dead_peer_fails_the_request_after_exactly_its_retries() {
    for (timeout, retry_cnt) in [(8, 0), (12, 3), (14, 7)] {
        let params = Params {
            timeout,
            retry_cnt,
            ..Params::default()
        };
        let (mut p, a, b) = pair(71, &params);
        p.c.net.partition(a, b);
        let t0 = p.c.now;
        p.post_write_to_b(1, B_IOVA, p.sge_a(0, 64));
        p.post_write_to_b(2, B_IOVA, p.sge_a(0, 64));
        p.run();
        let statuses: Vec<_> = p.completions(0).iter().map(|c| c.status).collect();
        assert_eq!(statuses, [WcStatus::RetryExcErr, WcStatus::WrFlushErr]);
        let attempt = Duration::from_nanos(4096 << timeout);
        assert_eq!(
            p.c.now - t0,
            attempt * (u32::from(retry_cnt) + 1),
            "timeout {timeout}, retry_cnt {retry_cnt}"
        );
        let n = p.c.nics[0].counters();
        assert_eq!(n.retry_exceeded_err, 1);
        assert_eq!(n.completer_retry_err, u64::from(retry_cnt) + 1);
    }
}
