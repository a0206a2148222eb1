//! RC transport scenarios on the simulator.

mod common;

use std::time::Duration;

use common::*;
use rnic_core::mem::Access;
use rnic_core::sim::LinkConfig;
use rnic_core::wr::{InlineData, SendOp, WcOpcode, WcStatus};

/// A datagram's opcode and PSN.
fn sent(d: &rnic_core::Datagram) -> (rnic_wire::Opcode, u32) {
    (opcode(d), psn_of(d))
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn write_then_read_back() {
    let mut p = Pair::new(1, &Params::default());
    let data = pattern(5000, 3);
    p.write_a(0, &data);
    let rkey = p.b.mr.rkey;
    p.post(1, SendOp::write(B_IOVA + 100, rkey), p.sge_a(0, 5000));
    p.post(2, SendOp::read(B_IOVA + 100, rkey), p.sge_a(10_000, 5000));
    p.run();
    let c = p.completions(0);
    assert_eq!(c.len(), 2);
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
    assert_eq!((c[0].wr_id, c[0].opcode), (1, WcOpcode::RdmaWrite));
    assert_eq!(
        (c[1].wr_id, c[1].opcode, c[1].byte_len),
        (2, WcOpcode::RdmaRead, 5000)
    );
    assert_eq!(p.read(1, 100, 5000), data);
    assert_eq!(p.read(0, 10_000, 5000), data);
    // The target's CPU saw nothing: no completion on B.
    assert!(p.completions(1).is_empty());
}

#[test]
fn send_with_immediate_and_write_with_immediate() {
    let mut p = Pair::new(2, &Params::default());
    let data = pattern(3000, 9);
    p.write_a(0, &data);
    p.recv_b(77, 0, 4096);
    p.recv_b(78, 8192, 16);
    p.post(1, SendOp::send_imm(0xdead_beef), p.sge_a(0, 3000));
    let rkey = p.b.mr.rkey;
    p.post(
        2,
        SendOp::write_imm(B_IOVA + 20_000, rkey, 5),
        p.sge_a(0, 0),
    );
    p.run();
    let a = p.completions(0);
    assert!(a.iter().all(|c| c.status == WcStatus::Success), "{a:?}");
    let b = p.completions(1);
    assert_eq!(b.len(), 2);
    assert_eq!(
        (b[0].wr_id, b[0].opcode, b[0].byte_len, b[0].imm_data),
        (77, WcOpcode::Recv, 3000, Some(0xdead_beef))
    );
    assert_eq!(
        (b[1].wr_id, b[1].opcode, b[1].byte_len, b[1].imm_data),
        (78, WcOpcode::RecvRdmaWithImm, 0, Some(5))
    );
    assert_eq!(p.read(1, 0, 3000), data);
}

#[test]
fn atomics() {
    let mut p = Pair::new(3, &Params::default());
    let rkey = p.b.mr.rkey;
    let va = B_IOVA + 64;
    // CAS that matches (0 -> 7), CAS that does not (compare 1), FETCH_ADD 5.
    p.post(1, SendOp::compare_swap(va, rkey, 0, 7), p.sge_a(0, 8));
    p.post(2, SendOp::compare_swap(va, rkey, 1, 9), p.sge_a(8, 8));
    p.post(3, SendOp::fetch_add(va, rkey, 5), p.sge_a(16, 8));
    p.run();
    let c = p.completions(0);
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
    let orig = |o| u64::from_ne_bytes(p.read(0, o, 8).try_into().unwrap());
    assert_eq!((orig(0), orig(8), orig(16)), (0, 7, 7));
    assert_eq!(u64::from_ne_bytes(p.read(1, 64, 8).try_into().unwrap()), 12);
}

#[test]
fn rkey_violation_writes_nothing_and_flushes_the_rest() {
    let mut p = Pair::new(4, &Params::default());
    p.write_a(0, &pattern(2048, 1));
    let rkey = p.b.mr.rkey;
    // Past the end of B's region, then a good WRITE that must be flushed.
    p.post(
        1,
        SendOp::write(B_IOVA + REGION as u64 - 1000, rkey),
        p.sge_a(0, 2048),
    );
    p.post(2, SendOp::write(B_IOVA, rkey), p.sge_a(0, 2048));
    p.run();
    let c = p.completions(0);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]
    );
    assert!(p
        .read(1, REGION as u64 - 1000, 1000)
        .iter()
        .all(|&b| b == 0));
    assert!(p.read(1, 0, 2048).iter().all(|&b| b == 0));
    assert!(p.c.nics[1].executions().is_empty());
}

#[test]
fn wrong_key_byte_and_missing_rights() {
    // The QP refuses remote writes.
    let params = Params {
        b_qp_access: Access::REMOTE_READ,
        ..Params::default()
    };
    let mut p = Pair::new(5, &params);
    let rkey = p.b.mr.rkey;
    p.post(1, SendOp::write(B_IOVA, rkey), p.sge_a(0, 16));
    p.run();
    assert_eq!(p.completions(0)[0].status, WcStatus::RemInvReqErr);

    let mut p = Pair::new(6, &Params::default());
    let bad = p.b.mr.rkey ^ 0x01;
    p.post(1, SendOp::read(B_IOVA, bad), p.sge_a(0, 16));
    p.run();
    assert_eq!(p.completions(0)[0].status, WcStatus::RemAccessErr);
}

#[test]
fn send_longer_than_the_receive() {
    let mut p = Pair::new(7, &Params::default());
    p.recv_b(1, 0, 100);
    p.post(1, SendOp::send(), p.sge_a(0, 2000));
    p.run();
    assert_eq!(p.completions(0)[0].status, WcStatus::RemOpErr);
    assert_eq!(p.completions(1)[0].status, WcStatus::LocLenErr);
}

#[test]
fn rnr_retry_exceeded_and_not() {
    let params = Params {
        rnr_retry: 2,
        ..Params::default()
    };
    let mut p = Pair::new(8, &params);
    p.post(1, SendOp::send(), p.sge_a(0, 10));
    p.run();
    assert_eq!(p.completions(0)[0].status, WcStatus::RnrRetryExcErr);
    // The first try and two retries were refused.
    assert_eq!(p.c.nics[1].counters().send_rnr_err, 3);

    let mut p = Pair::new(9, &params);
    p.post(1, SendOp::send(), p.sge_a(0, 10));
    // Let one RNR NAK happen, then post the receive.
    let until = p.c.now + Duration::from_micros(12);
    p.c.run(until, 1000);
    p.recv_b(5, 0, 64);
    p.run();
    assert_eq!(p.completions(0)[0].status, WcStatus::Success);
    assert!(p.c.nics[0].counters().rcvd_rnr_err >= 1);
}

#[test]
fn peer_gone_exactly_retry_cnt_plus_one_timeouts() {
    // timeout 10 = 4.194304 ms.
    let params = Params {
        retry_cnt: 3,
        timeout: 10,
        ..Params::default()
    };
    let mut p = Pair::new(10, &params);
    let (a, b) = (p.c.nics[0].addr(), p.c.nics[1].addr());
    p.c.net.partition(a, b);
    let rkey = p.b.mr.rkey;
    p.post(1, SendOp::write(B_IOVA, rkey), p.sge_a(0, 8));
    p.post(2, SendOp::write(B_IOVA, rkey), p.sge_a(0, 8));
    let start = p.c.now;
    p.run();
    let c = p.completions(0);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    let counters = p.c.nics[0].counters();
    assert_eq!(counters.completer_retry_err, 4);
    assert_eq!(counters.retry_exceeded_err, 1);
    // Four timeouts of 4.194304 ms each, to the nanosecond.
    assert_eq!(p.c.now - start, Duration::from_nanos((4096 << 10) * 4));
}

#[test]
fn lossy_link_still_delivers_exactly_once() {
    let params = Params {
        link: LinkConfig {
            loss: 0.1,
            duplicate: 0.1,
            corrupt: 0.05,
            delay: Duration::from_micros(5),
            jitter: Duration::from_micros(20),
        },
        ..Params::default()
    };
    let mut p = Pair::new(11, &params);
    let data = pattern(64 * 1024, 5);
    p.write_a(0, &data);
    let rkey = p.b.mr.rkey;
    for i in 0..8u64 {
        p.post(
            i,
            SendOp::write(B_IOVA + i * 8192, rkey),
            p.sge_a(i * 8192, 8192),
        );
    }
    p.post(100, SendOp::read(B_IOVA, rkey), p.sge_a(100_000, 65536));
    p.run();
    let c = p.completions(0);
    assert_eq!(c.len(), 9);
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
    assert_eq!(p.read(1, 0, 65536), data);
    assert_eq!(p.read(0, 100_000, 65536), data);
    let n1 = p.c.nics[1].counters();
    assert!(
        n1.icrc_errors + p.c.nics[0].counters().icrc_errors > 0,
        "corruption was caught"
    );
    let writes = p.c.nics[1]
        .executions()
        .iter()
        .filter(|e| matches!(e.kind, rnic_core::ExecKind::Write { .. }))
        .count();
    assert_eq!(writes, 8, "each WRITE executed exactly once");
}

#[test]
fn inline_data_needs_no_memory_region_and_survives_retransmission() {
    let params = Params {
        link: LinkConfig {
            loss: 0.3,
            duplicate: 0.1,
            corrupt: 0.0,
            delay: Duration::from_micros(5),
            jitter: Duration::from_micros(10),
        },
        ..Params::default()
    };
    let mut p = Pair::new(12, &params);
    let msg: Vec<u8> = (0..200u8).collect();
    p.recv_b(1, 0, 256);
    let rkey = p.b.mr.rkey;
    let now = p.c.now;
    let qpn = p.a.qpn;
    for (id, op) in [(1, SendOp::send()), (2, SendOp::write(B_IOVA + 1000, rkey))] {
        // The list is ignored: the bytes travel with the request.
        let wr = rnic_core::wr::SendWr::new(id, op, SgList::new())
            .inline(Some(InlineData::from_slice(&msg)));
        p.c.nics[0].post_send(now, qpn, wr).unwrap();
    }
    p.run();
    assert!(p
        .completions(0)
        .iter()
        .all(|c| c.status == WcStatus::Success));
    assert_eq!(p.completions(1)[0].byte_len, 200);
    assert_eq!(p.read(1, 0, 200), msg);
    assert_eq!(p.read(1, 1000, 200), msg);
    // READ takes no inline data, and the device takes at most 256 bytes.
    for (op, len) in [(SendOp::read(B_IOVA, rkey), 8), (SendOp::send(), 257)] {
        let wr = rnic_core::wr::SendWr::new(9, op, p.sge_a(0, 8))
            .inline(Some(InlineData::from_elem(0, len)));
        let now = p.c.now;
        assert!(matches!(
            p.c.nics[0].post_send(now, qpn, wr),
            Err(rnic_core::VerbError::BadInline { .. })
        ));
    }
}

#[test]
fn a_message_longer_than_the_in_flight_window_asks_for_acks_on_the_way() {
    // 1 MiB at PMTU 256: 4096 packets, four times the 1024 packets a
    // requester keeps in flight. Without an AckReq inside the message it
    // would wait for an ACK nobody was asked for and time out for ever.
    let params = Params {
        mtu: rnic_core::qp::Mtu::Mtu256,
        ..Params::default()
    };
    let mut p = Pair::new(40, &params);
    p.c.net.record_pcap();
    let len = 1 << 20;
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let data = pattern(len, 5);
    let src = p.c.nics[0]
        .reg_mr(p.a.pd, 0x7_0000_0000, Box::new(data.clone()), rw)
        .unwrap();
    let dst = p.c.nics[1]
        .reg_mr(p.b.pd, 0x8_0000_0000, Box::new(vec![0u8; len]), rw)
        .unwrap();
    p.post(
        1,
        SendOp::write(0x8_0000_0000, dst.rkey),
        sg_list![rnic_core::wr::Sge {
            addr: 0x7_0000_0000,
            length: len as u32,
            lkey: src.lkey,
        }],
    );
    p.run();
    let c = p.completions(0);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].status, WcStatus::Success);
    assert_eq!(p.c.nics[0].counters().completer_retry_err, 0, "no timeout");
    let mut got = vec![0u8; len];
    p.c.nics[1]
        .read_mr(p.b.pd, dst.lkey, 0x8_0000_0000, &mut got)
        .unwrap();
    assert!(got == data);
    // AckReq every 64 packets and on the last.
    let pcap = p.c.net.pcap();
    let asked: Vec<u32> = rnic_wire::pcap::PcapReader::new(&pcap)
        .unwrap()
        .filter_map(|r| {
            let f =
                rnic_wire::Frame::parse(rnic_wire::LinkType::Ethernet, r.unwrap().data).unwrap();
            let b = f.ib.bth();
            (b.ack_req() && f.ib.info().is_request()).then(|| b.psn().value())
        })
        .collect();
    assert_eq!(asked.len(), 4096 / 64);
}

/// ACKs queued together coalesce: eight small WRITEs, each asking for an
/// ACK, reach the responder in one batch, and one ACK goes back, the last
/// one's, completing all eight. An atomic's response between two ACKs
/// keeps its place, the ACK after it leaving after it; and an ACK that has
/// left is not taken back (two batches, two ACKs).
#[test]
fn acks_queued_together_coalesce_into_the_last() {
    use rnic_wire::Opcode;
    let mut p = Pair::new(50, &Params::default());
    let now = p.c.now;
    for i in 0..8 {
        p.post_write_to_b(i, B_IOVA + 64 * i, p.sge_a(64 * i, 64));
    }
    let requests = take_tx(&mut p.c.nics[0]);
    assert_eq!(requests.len(), 8);
    for d in &requests {
        p.c.nics[1].handle_datagram(now, d);
    }
    let before = p.c.nics[1].counters();
    let acks = take_tx(&mut p.c.nics[1]);
    let last = psn_of(&requests[7]);
    assert_eq!(
        acks.iter().map(sent).collect::<Vec<_>>(),
        [(Opcode::RC_ACKNOWLEDGE, last)]
    );
    assert_eq!((before.sent_pkts, before.acks_coalesced), (1, 7));
    for d in &acks {
        p.c.nics[0].handle_datagram(now, d);
    }
    let c = p.completions(0);
    assert_eq!(c.len(), 8);
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
    // WRITE, FETCH_ADD, WRITE in one batch: the atomic's response, then
    // the second WRITE's ACK, which says what the first WRITE's did.
    p.post_write_to_b(8, B_IOVA, p.sge_a(0, 64));
    let add = SendOp::fetch_add(B_IOVA + 1024, p.b.mr.rkey, 1);
    p.post(9, add, p.sge_a(1024, 8));
    p.post_write_to_b(10, B_IOVA + 64, p.sge_a(64, 64));
    let requests = take_tx(&mut p.c.nics[0]);
    for d in &requests {
        p.c.nics[1].handle_datagram(now, d);
    }
    let psns: Vec<u32> = requests.iter().map(psn_of).collect();
    assert_eq!(
        take_tx(&mut p.c.nics[1])
            .iter()
            .map(sent)
            .collect::<Vec<_>>(),
        [
            (Opcode::RC_ATOMIC_ACKNOWLEDGE, psns[1]),
            (Opcode::RC_ACKNOWLEDGE, psns[2])
        ]
    );
    // Two WRITEs taken in one at a time, each ACK taken out as it is
    // queued: both leave.
    p.post_write_to_b(11, B_IOVA, p.sge_a(0, 64));
    p.post_write_to_b(12, B_IOVA + 64, p.sge_a(64, 64));
    let mut acks = Vec::new();
    for d in take_tx(&mut p.c.nics[0]) {
        p.c.nics[1].handle_datagram(now, &d);
        acks.extend(take_tx(&mut p.c.nics[1]));
    }
    assert_eq!(acks.len(), 2);
    assert_eq!(p.c.nics[1].counters().acks_coalesced, 7 + 1);
}

/// `ibv_query_qp` reports the PSNs as they stand (what rdma_rxe and
/// ConnectX do), not what the program set: a WRITE of 5 packets and a READ
/// of 5 from 0xFFFFF0 cross the wrap on A's send queue and B's receive
/// queue alike.
#[test]
fn query_reports_the_psns_as_they_stand() {
    let mut p = Pair::new(1, &Params::default());
    let rkey = p.b.mr.rkey;
    let before = p.c.nics[0].query_qp(p.a.qpn).unwrap();
    assert_eq!(before.sq_psn, 0xFF_FFF0);
    let write = SendOp::write(B_IOVA, rkey);
    p.post(1, write, p.sge_a(0, 5000));
    let read = SendOp::read(B_IOVA, rkey);
    p.post(2, read, p.sge_a(10_000, 5000));
    p.run();
    assert_eq!(p.completions(0).len(), 2);
    // Ten PSNs on from 0xFFFFF0: 0xFFFFFA.
    let a = p.c.nics[0].query_qp(p.a.qpn).unwrap();
    let b = p.c.nics[1].query_qp(p.b.qpn).unwrap();
    assert_eq!(a.sq_psn, 0xFF_FFFA);
    assert_eq!(b.rq_psn, 0xFF_FFFA);
    // Nothing went the other way: B's send queue and A's receive queue
    // stand where they began.
    assert_eq!((b.sq_psn, a.rq_psn), (0x00_b000, 0x00_b000));
    let more = SendOp::write(B_IOVA, rkey);
    p.post(3, more, p.sge_a(0, 8 * 1024));
    p.run();
    // Eight more: past the wrap.
    let a = p.c.nics[0].query_qp(p.a.qpn).unwrap();
    let b = p.c.nics[1].query_qp(p.b.qpn).unwrap();
    assert_eq!((a.sq_psn, b.rq_psn), (0x00_0002, 0x00_0002));
}

/// A READ response overtaken by the next one is late, not lost: the
/// requester drops the early one and asks nothing again (as rdma_rxe's
/// completer does); the sender resends what it dropped only if asked, so
/// here the READ completes once the timer asks again from the late one.
/// What it must not do is re-request every READ in flight for each
/// reordered packet.
#[test]
fn a_reordered_read_response_asks_nothing_again() {
    let mut p = Pair::new(1, &Params::default());
    let rkey = p.b.mr.rkey;
    let read = SendOp::read(B_IOVA, rkey);
    p.post(1, read, p.sge_a(0, 4096));
    let now = p.c.now;
    let take = |nic: &mut rnic_core::Nic| -> Vec<_> {
        std::iter::from_fn(|| nic.poll_transmit()).collect()
    };
    let req = take(&mut p.c.nics[0]);
    assert_eq!(req.len(), 1);
    p.c.nics[1].handle_datagram(now, &req[0]);
    let resp = take(&mut p.c.nics[1]);
    assert_eq!(resp.len(), 4, "FIRST, MIDDLE, MIDDLE, LAST");
    // The second MIDDLE overtakes the first.
    for i in [0, 2, 1, 3] {
        p.c.nics[0].handle_datagram(now, &resp[i]);
    }
    // Nothing asked again: the READ request is not resent.
    assert!(take(&mut p.c.nics[0]).is_empty());
    let c = p.completions(0);
    assert_eq!(c.len(), 0, "the READ waits for the response it dropped");
    assert_eq!(p.c.nics[0].counters().completer_retry_err, 0);
    // The overtaking one, and the LAST behind the one dropped.
    assert_eq!(p.c.nics[0].counters().read_response_out_of_order, 2);
    // The local ACK timer asks again from the dropped response, and the
    // READ completes with the right bytes.
    p.run();
    let c = p.completions(0);
    assert_eq!((c.len(), c[0].status), (1, WcStatus::Success));
    assert_eq!(p.c.nics[0].counters().completer_retry_err, 1);
    assert_eq!(p.read(0, 0, 4096), p.read(1, 0, 4096));
}

/// A loss halves the window, as TCP's does: of a 64-packet WRITE whose
/// eleventh packet is lost, the go-back-N resends half of what was in
/// flight, and the rest as acknowledgements open the window again.
#[test]
fn a_loss_halves_the_window_and_acks_open_it() {
    let mut p = Pair::new(1, &Params::default());
    let rkey = p.b.mr.rkey;
    let write = SendOp::write(B_IOVA, rkey);
    p.post(1, write, p.sge_a(0, 64 * 1024));
    let now = p.c.now;
    let take = |nic: &mut rnic_core::Nic| -> Vec<_> {
        std::iter::from_fn(|| nic.poll_transmit()).collect()
    };
    let sent = take(&mut p.c.nics[0]);
    assert_eq!(sent.len(), 64);
    for (i, d) in sent.iter().enumerate() {
        if i != 10 {
            p.c.nics[1].handle_datagram(now, d);
        }
    }
    // B acknowledges the first ten and NAKs the gap (its ACKs may be
    // coalesced; the NAK is the last word).
    for d in take(&mut p.c.nics[1]) {
        p.c.nics[0].handle_datagram(now, &d);
    }
    // 54 packets were in flight from the lost one: 27 go again.
    let again = take(&mut p.c.nics[0]);
    assert_eq!(again.len(), 27, "half the window that lost a packet");
    for d in &again {
        p.c.nics[1].handle_datagram(now, d);
    }
    for d in take(&mut p.c.nics[1]) {
        p.c.nics[0].handle_datagram(now, &d);
    }
    // 27 acknowledged: the window is 54 again, which the remaining 27
    // fit in.
    let rest = take(&mut p.c.nics[0]);
    assert_eq!(rest.len(), 27);
    p.run();
    let c = p.completions(0);
    assert_eq!((c.len(), c[0].status), (1, WcStatus::Success));
    assert_eq!(p.read(1, 0, 64 * 1024), p.read(0, 0, 64 * 1024));
}
