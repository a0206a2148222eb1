//! The NIC's in-flight budget: all of a NIC's requesters together have at
//! most one QP's window of packets unacknowledged (1024), and every QP the
//! budget holds back goes on as room frees. Without the budget, many QPs
//! each with a little in flight put far more on the way than a receiving
//! socket holds; without the hand-over, a QP held back with nothing in
//! flight (so no ACK and no timer of its own to wake it) waits for ever.

use std::time::Duration;

use rnic_core::qp::Mtu;
use rnic_core::sim::{Cluster, LinkConfig};
use rnic_core::wr::{sg_list, SendOp, SendWr, Sge, WcStatus};

mod common;
use common::{connected, Params, Side, A_IOVA, B_IOVA};

/// 64 KiB messages in 4096-byte packets: 16 packets each.
const MSG: u32 = 65536;
const PACKETS_PER_MSG: usize = 16;
/// The budget (one QP's window).
const BUDGET: usize = 1024;
/// Connections.
const N: usize = 64;

/// `n` connected RC QP pairs from NIC 0 (A) to NIC 1 (B), each side with a
/// 2 * MSG region of its own (connection `i`'s A full of `i + 1`, B's 0).
fn connect(c: &mut Cluster, n: usize) -> Vec<(Side, Side)> {
    connect_mtu(c, n, Mtu::Mtu4096)
}

fn connect_mtu(c: &mut Cluster, n: usize, mtu: Mtu) -> Vec<(Side, Side)> {
    let p = Params {
        mtu,
        timeout: 14, // 67 ms
        cq_depth: 64,
        region: 2 * MSG as usize,
        ..Params::default()
    };
    (0..n)
        .map(|i| {
            let psn = 0x10_0000 + i as u32;
            connected(c, &p, (psn, psn), (i as u8 + 1, 0))
        })
        .collect()
}

/// Two 64 KiB WRITEs on every connection, A's region to B's.
fn post_writes(c: &mut Cluster, conns: &[(Side, Side)]) {
    for (i, conn) in conns.iter().enumerate() {
        for k in 0..2u64 {
            post_write(c, conn, i as u64 * 2 + k, k * u64::from(MSG), MSG);
        }
    }
}

/// A WRITE of `len` bytes at offset `at` of A's region to the same offset
/// of B's.
fn post_write(c: &mut Cluster, (a, b): &(Side, Side), wr_id: u64, at: u64, len: u32) {
    let wr = SendWr::new(
        wr_id,
        SendOp::write(B_IOVA + at, b.mr.rkey),
        sg_list![Sge {
            addr: A_IOVA + at,
            length: len,
            lkey: a.mr.lkey,
        }],
    );
    let now = c.now;
    c.nics[0].post_send(now, a.qpn, wr).unwrap();
}

fn completions(c: &mut Cluster, conns: &[(Side, Side)]) -> Vec<(u64, WcStatus)> {
    let mut all = Vec::new();
    for (a, _) in conns {
        for w in c.nics[0].poll_cq(a.cq, 64).unwrap() {
            all.push((w.wr_id, w.status));
        }
    }
    all.sort_by_key(|w| w.0);
    all
}

/// 64 connections, each with two WRITEs posted and what the budget lets go
/// on the wire: 2048 packets wanted to go at once; the budget let 1024.
fn started(seed: u64) -> (Cluster, Vec<(Side, Side)>) {
    let mut c = Cluster::new(seed, LinkConfig::perfect(Duration::from_micros(20)), 2);
    let conns = connect(&mut c, N);
    post_writes(&mut c, &conns);
    c.flush();
    assert_eq!(N * 2 * PACKETS_PER_MSG, 2 * BUDGET);
    assert_eq!(c.net.in_flight(), BUDGET);
    (c, conns)
}

/// With 1024-byte packets a 64 KiB WRITE is 64 packets, and a transport
/// that paces what the NIC builds (as the engine does: a burst of 32 per QP
/// in turn) has QPs cut in the middle of a message when the budget is
/// spent: 32 connections with two WRITEs each, 32 packets each on the way.
/// Few of those end a message or are a 64th packet; unless the packet
/// that spends the budget (and the last of each QP's burst) asks for an
/// ACK, after a round or two nothing on the way does, nothing
/// frees the budget until every QP's ACK timer goes off, and the
/// retransmissions, under the same budget, go the same way (`rnic perf
/// write -q 100 -t 2`: 327-476 retransmissions and 0.3 Gb/s where one QP
/// makes 13).
#[test]
fn when_the_budget_is_spent_a_packet_on_the_way_asks_for_an_ack() {
    let mut c = Cluster::new(5, LinkConfig::perfect(Duration::from_micros(20)), 2);
    let conns = connect_mtu(&mut c, 33, Mtu::Mtu1024);
    // One QP with a single 40-packet WRITE: the others' bursts then no
    // longer add up to the budget at a burst's end, and the packet that
    // spends it is in the middle of one.
    post_write(&mut c, &conns[0], 99, 0, 40 * 1024);
    post_writes(&mut c, &conns[1..]);
    let mut sent = Vec::new();
    for _ in 0..10_000 {
        match c.nics[0].poll_built() {
            Some(d) => sent.push(d),
            None if c.nics[0].generate_burst() => {}
            None => break,
        }
    }
    assert_eq!(sent.len(), BUDGET, "the budget leaves, no more");
    let bth = |d: &rnic_core::Datagram| {
        let p = rnic_wire::IbPacket::new_checked(&d.payload[..]).unwrap();
        rnic_wire::IbRepr::parse(&p).unwrap().bth
    };
    // Every QP's last packet on the way asks for an ACK.
    let mut last_of = std::collections::HashMap::new();
    for d in &sent {
        let h = bth(d);
        last_of.insert(h.dest_qp, h.ack_req);
    }
    for (qp, asks) in &last_of {
        assert!(asks, "QP {qp:#x}'s last packet on the way asks for an ACK");
    }
    // The packet that spent the budget asks for the ACK that frees it.
    assert!(
        bth(sent.last().unwrap()).ack_req,
        "the packet that spent the budget asks for an ACK"
    );
}

#[test]
fn many_qps_together_keep_to_one_window_and_all_finish() {
    let (mut c, conns) = started(11);
    // Every step after: never more data on the way than the budget (ACKs
    // travel the other way).
    let mut most = 0;
    for _ in 0..100_000 {
        if !c.step() {
            break;
        }
        let a = c.nics[0].addr();
        most = most.max(c.net.in_flight_from(a));
    }
    assert!(most <= BUDGET, "{most} packets from A on the way at once");
    let done = completions(&mut c, &conns);
    assert_eq!(done.len(), 2 * N, "every WRITE completes");
    assert!(done.iter().all(|w| w.1 == WcStatus::Success), "{done:?}");
    assert_eq!(
        c.nics[0].counters().completer_retry_err,
        0,
        "nothing resent"
    );
    for (i, (_, b)) in conns.iter().enumerate() {
        let mut got = vec![0u8; 2 * MSG as usize];
        c.nics[1]
            .read_mr(b.pd, b.mr.lkey, B_IOVA, &mut got)
            .unwrap();
        assert!(got.iter().all(|&x| x == i as u8 + 1), "connection {i}");
    }
}

/// QPs holding the whole budget are destroyed with it in flight: what they
/// held goes to the QPs waiting at once, which then finish, long before the
/// destroyed QPs' ACK timers (67 ms) would have come up.
#[test]
fn destroying_the_qps_that_hold_the_budget_lets_the_others_go() {
    let (mut c, conns) = started(12);
    // The first half took the budget (32 QPs x 32 packets).
    let (held, waiting) = conns.split_at(N / 2);
    for (a, b) in held {
        c.nics[0].destroy_qp(a.qpn).unwrap();
        c.nics[1].destroy_qp(b.qpn).unwrap();
    }
    c.run(c.now + Duration::from_millis(5), 100_000);
    let done = completions(&mut c, waiting);
    assert_eq!(done.len(), N, "the waiting QPs' WRITEs all complete");
    assert!(done.iter().all(|w| w.1 == WcStatus::Success), "{done:?}");
}

/// A requester builds its packets as the transport takes them: posting
/// 2,048 packets' worth (of which the budget lets 1,024 go) leaves at most
/// a burst of 32 built in the transmit queue, the rest waiting to be built
/// in the NIC's busy list; taking them all yields the whole budget, each
/// connection's packets in PSN order. (Built a window ahead, 1,024 buffers
/// were allocated at once and freed again after the send.)
#[test]
fn requests_are_built_as_they_leave() {
    let mut c = Cluster::new(13, LinkConfig::perfect(Duration::from_micros(20)), 2);
    let conns = connect(&mut c, N);
    let before = c.nics[0].footprint().packets;
    post_writes(&mut c, &conns);
    let built = c.nics[0].footprint().packets - before;
    assert!(built <= 32, "{built} packets built ahead of the transport");
    assert_eq!(c.nics[0].queued_datagrams(), None, "more to build");
    let mut last = std::collections::HashMap::new();
    let mut n = 0;
    while let Some(d) = c.nics[0].poll_transmit() {
        let p = rnic_wire::IbPacket::new_checked(&d.payload[..]).unwrap();
        let bth = rnic_wire::IbRepr::parse(&p).unwrap().bth;
        if let Some(prev) = last.insert(bth.dest_qp, bth.psn) {
            assert_eq!(bth.psn, prev.next(), "QP {:#x} in PSN order", bth.dest_qp);
        }
        n += 1;
    }
    assert_eq!(n, BUDGET, "the whole budget leaves");
}
