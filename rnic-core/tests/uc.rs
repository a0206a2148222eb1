//! Unreliable connected QPs: the same requester, no acknowledgements, no
//! retransmission; a gap drops the message it falls in.

mod common;

use common::*;
use rnic_core::qp::{AttrMask, QpAttr, QpState, QpType};
use rnic_core::sim::DropRule;
use rnic_core::wr::{SendOp, SendWr, Sge, WcOpcode, WcStatus};
use rnic_core::VerbError;
use rnic_wire::pcap::PcapReader;
use rnic_wire::{Frame, LinkType, Opcode, Psn, Transport};

fn uc() -> Params {
    Params {
        qp_type: QpType::Uc,
        ..Params::default()
    }
}

fn opcodes(p: &Pair) -> Vec<(bool, Opcode)> {
    let a = p.c.nics[0].addr();
    PcapReader::new(&p.c.net.pcap())
        .unwrap()
        .map(|r| {
            let f = Frame::parse(LinkType::Ethernet, r.unwrap().data).unwrap();
            assert!(f.icrc_ok());
            (f.ip.src_addr() == a, f.ib.bth().opcode())
        })
        .collect()
}

#[test]
fn write_and_send_without_acks() {
    let mut p = Pair::new(51, &uc());
    p.c.net.record_pcap();
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 3) as u8).collect();
    p.write_a(0, &data);
    let rkey = p.b.mr.rkey;
    p.recv_b(7, 100_000, 4096);
    p.post(1, SendOp::write(B_IOVA, rkey), p.sge_a(0, 3000));
    p.post(2, SendOp::send_imm(3), p.sge_a(0, 3000));
    p.run();
    assert!(p
        .completions(0)
        .iter()
        .all(|c| c.status == WcStatus::Success));
    let r = p.completions(1);
    assert_eq!(
        (r[0].wr_id, r[0].opcode, r[0].byte_len, r[0].imm_data),
        (7, WcOpcode::Recv, 3000, Some(3))
    );
    assert_eq!(p.read(1, 0, 3000), data);
    assert_eq!(p.read(1, 100_000, 3000), data);
    let ops = opcodes(&p);
    // Only A speaks, in UC opcodes, with AckReq never set.
    assert!(ops
        .iter()
        .all(|(from_a, op)| *from_a && op.info().unwrap().transport == Transport::Uc));
    assert_eq!(ops[0].1, Opcode::UC_RDMA_WRITE_FIRST);
    assert_eq!(ops[5].1, Opcode::UC_SEND_LAST_WITH_IMMEDIATE);
}

#[test]
fn a_lost_packet_drops_its_message_and_the_receive_serves_the_next() {
    let mut p = Pair::new(52, &uc());
    let a = p.c.nics[0].addr();
    let first: Vec<u8> = vec![0x11; 3000];
    let second: Vec<u8> = vec![0x22; 2000];
    p.write_a(0, &first);
    p.write_a(4096, &second);
    p.recv_b(7, 0, 4096);
    // The SEND's middle packet is lost; nothing is ever resent.
    p.c.net.drop_rule(DropRule {
        src: Some(a),
        opcode: None,
        psn: Some(Psn::new(0xFF_FFF1)),
        times: 1,
    });
    p.post(1, SendOp::send(), p.sge_a(0, 3000));
    p.post(2, SendOp::send(), p.sge_a(4096, 2000));
    p.run();
    // The requester cannot know: both succeed.
    assert!(p
        .completions(0)
        .iter()
        .all(|c| c.status == WcStatus::Success));
    // The receiver got the second message, in the receive the first had taken.
    let r = p.completions(1);
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].wr_id, r[0].byte_len), (7, 2000));
    assert_eq!(p.read(1, 0, 2000), second);
    assert_eq!(p.c.nics[1].counters().uc_dropped, 1);
    assert_eq!(p.c.nics[0].counters().completer_retry_err, 0);
}

#[test]
fn read_and_atomics_are_refused_on_uc() {
    let mut p = Pair::new(53, &uc());
    let rkey = p.b.mr.rkey;
    let now = p.c.now;
    let wr = rnic_core::wr::SendWr::new(1, SendOp::read(B_IOVA, rkey), p.sge_a(0, 8));
    let qpn = p.a.qpn;
    assert!(matches!(
        p.c.nics[0].post_send(now, qpn, wr),
        Err(VerbError::Unsupported(_))
    ));
}

mod props {
    use super::*;
    use proptest::prelude::*;
    use rnic_core::sim::LinkConfig;
    use std::time::Duration;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        /// Whatever the network does, a receive completes only with one whole
        /// message that was sent: never part of one, never parts of two.
        #[test]
        fn receives_hold_whole_messages(
            seed in any::<u64>(),
            loss in 0.0..0.3f64,
            duplicate in 0.0..0.2f64,
            jitter in 0u64..40,
            sizes in proptest::collection::vec(1u32..4000, 1..12),
        ) {
            let link = LinkConfig { loss, duplicate, corrupt: 0.0, delay: Duration::from_micros(5), jitter: Duration::from_micros(jitter) };
            let mut p = Pair::new(seed, &Params { link, ..uc() });
            // Message i is the byte i+1 repeated, from its own place in A.
            for (i, &n) in sizes.iter().enumerate() {
                p.write_a(i as u64 * 4096, &vec![i as u8 + 1; n as usize]);
            }
            for i in 0..sizes.len() * 3 {
                p.recv_b(i as u64, i as u64 * 4096, 4096);
            }
            for (i, &n) in sizes.iter().enumerate() {
                p.post(i as u64, SendOp::send(), p.sge_a(i as u64 * 4096, n));
            }
            p.run();
            prop_assert!(p.completions(0).iter().all(|c| c.status == WcStatus::Success));
            for r in p.completions(1) {
                prop_assert_eq!(r.status, WcStatus::Success);
                let got = p.read(1, r.wr_id * 4096, r.byte_len as usize);
                let tag = got[0];
                prop_assert!(tag >= 1 && (tag as usize) <= sizes.len(), "unknown message");
                prop_assert_eq!(r.byte_len, sizes[tag as usize - 1], "length of message {}", tag);
                prop_assert!(got.iter().all(|&b| b == tag), "receive {} mixes messages", r.wr_id);
            }
        }
    }
}

#[test]
fn a_local_error_stops_the_send_queue_only_until_rts_again() {
    let mut p = Pair::new(54, &uc());
    let rkey_a = p.a.mr.rkey;
    let mut bad = p.sge_a(0, 64);
    bad[0].lkey ^= 0x80;
    p.post(1, SendOp::send(), bad);
    p.post(2, SendOp::send(), p.sge_a(0, 64));
    p.run();
    let c = p.completions(0);
    let got: Vec<_> = c.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        got,
        [(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)],
        "the failed request, then the rest flushed"
    );
    let a_qpn = p.a.qpn;
    assert_eq!(p.c.nics[0].query_qp(a_qpn).unwrap().qp_state, QpState::Sqe);
    // The receive side is not stopped: B can still WRITE into A.
    let now = p.c.now;
    let b_qpn = p.b.qpn;
    let b_lkey = p.b.mr.lkey;
    p.c.nics[1]
        .post_send(
            now,
            b_qpn,
            SendWr::new(
                5,
                SendOp::write(A_IOVA + 200_000, rkey_a),
                sg_list![Sge {
                    addr: B_IOVA,
                    length: 8,
                    lkey: b_lkey,
                }],
            ),
        )
        .unwrap();
    p.run();
    assert_eq!(p.completions(1)[0].status, WcStatus::Success);
    assert_eq!(p.c.nics[0].counters().rcvd_pkts, 1);
    // SQE -> RTS, and sending works again.
    let attr = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    p.c.nics[0]
        .modify_qp(now, a_qpn, &attr, AttrMask::STATE)
        .unwrap();
    p.recv_b(7, 0, 64);
    p.post(3, SendOp::send(), p.sge_a(0, 64));
    p.run();
    assert_eq!(p.completions(0)[0].status, WcStatus::Success);
    assert_eq!(p.completions(1)[0].wr_id, 7);
}
