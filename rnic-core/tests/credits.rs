//! End-to-end credits (IBTA 9.7.7.2): a responder's ACKs say how many
//! receive WQEs it has (the AETH credit count, with the MSN), and the
//! requester keeps its SENDs and WRITEs with immediate within them, as the
//! hardware capture's NIC does and rdma_rxe does not (it ignores them, and
//! advertises the "invalid" code 0x1F). The rule is rdmavt's: a message
//! that takes a receive WQE begins while its SSN is at most LSN + 1, where
//! LSN = MSN + credits; a message that takes none moves LSN on by one.

mod common;

use common::*;
use rnic_core::wr::{SendOp, WcStatus};
use rnic_core::Datagram;
use rnic_wire::aeth::{self, Syndrome};
use rnic_wire::{bth, IbPacket, IbRepr, Opcode, Psn};

fn opcodes(sent: &[Datagram]) -> Vec<Opcode> {
    sent.iter()
        .map(|d| {
            IbPacket::new_checked(&d.payload[..])
                .unwrap()
                .bth()
                .opcode()
        })
        .collect()
}

fn psn_of(d: &Datagram) -> Psn {
    IbPacket::new_checked(&d.payload[..]).unwrap().bth().psn()
}

/// B's ACK of `psn` with `msn` and the credit count `code`, as A takes it.
fn ack(p: &mut Pair, psn: Psn, msn: u32, code: u8) {
    let (a, b) = (p.c.nics[0].addr(), p.c.nics[1].addr());
    let mut ib = IbRepr::new(bth::Repr::new(Opcode::RC_ACKNOWLEDGE, p.a.qpn, psn));
    ib.aeth = Some(aeth::Repr {
        syndrome: Syndrome::Ack { credits: code },
        msn,
    });
    let d = craft(b, a, ib, &[]);
    let now = p.c.now;
    p.c.nics[0].handle_datagram(now, &d);
}

/// `n` one-packet SENDs from A, wr_id 1..=n.
fn post_sends(p: &mut Pair, n: u64) {
    for id in 1..=n {
        let sge = p.sge_a(id * 64, 64);
        p.post(id, SendOp::send(), sge);
    }
}

#[test]
fn sends_wait_for_the_credits_the_responder_advertises() {
    let mut p = Pair::new(1, &Params::default());
    post_sends(&mut p, 10);
    // Before any ACK the requester knows of no receive at the responder:
    // one SEND goes, to learn the count (SSN 1 = LSN 0 + 1).
    let first = take_tx(&mut p.c.nics[0]);
    assert_eq!(opcodes(&first), [Opcode::RC_SEND_ONLY]);
    assert_eq!(p.c.nics[0].counters().credit_waits, 1);
    // Its ACK: MSN 1, two receives left (code 2). LSN = 3: SSNs 2, 3 and
    // one beyond, 4, may go.
    ack(&mut p, psn_of(&first[0]), 1, 2);
    let next = take_tx(&mut p.c.nics[0]);
    assert_eq!(next.len(), 3);
    // The ACK of SSN 2 with no receive left (code 0): LSN 2 + 0 is behind
    // 3, so nothing more.
    ack(&mut p, psn_of(&next[0]), 2, 0);
    assert!(take_tx(&mut p.c.nics[0]).is_empty());
    // The ACK of SSN 4 with four receives (code 4): LSN 8, SSNs 5 to 9.
    ack(&mut p, psn_of(&next[2]), 4, 4);
    let more = take_tx(&mut p.c.nics[0]);
    assert_eq!(more.len(), 5);
    // A repeated ACK of the last PSN acknowledged carries a newer count
    // (a responder re-ACKs a duplicate after receives were posted): taken.
    assert!(take_tx(&mut p.c.nics[0]).is_empty());
    ack(&mut p, psn_of(&next[2]), 4, 5); // code 5: six receives, LSN 10
    let last = take_tx(&mut p.c.nics[0]);
    assert_eq!(last.len(), 1);
    // Every SEND went once, in PSN order.
    let all: Vec<Psn> = first
        .iter()
        .chain(&next)
        .chain(&more)
        .chain(&last)
        .map(psn_of)
        .collect();
    assert!(all.windows(2).all(|w| w[1] == w[0].next()), "{all:?}");
    assert_eq!(all.len(), 10);
}

#[test]
fn writes_and_reads_take_no_credit_and_move_the_limit_on() {
    let mut p = Pair::new(2, &Params::default());
    let rkey = p.b.mr.rkey;
    // A WRITE and a READ need no receive WQE: they go with no credit
    // known, and the SEND after them is SSN 3 against LSN 0 + 2.
    let sge = p.sge_a(0, 64);
    p.post(1, SendOp::write(B_IOVA, rkey), sge);
    let sge = p.sge_a(64, 64);
    p.post(2, SendOp::read(B_IOVA, rkey), sge);
    post_sends(&mut p, 2);
    let sent = take_tx(&mut p.c.nics[0]);
    assert_eq!(
        opcodes(&sent),
        [
            Opcode::RC_RDMA_WRITE_ONLY,
            Opcode::RC_RDMA_READ_REQUEST,
            Opcode::RC_SEND_ONLY,
        ]
    );
    // A WRITE with immediate takes a receive WQE, as a SEND does.
    let mut p = Pair::new(3, &Params::default());
    for id in 1..=2 {
        let sge = p.sge_a(0, 64);
        p.post(id, SendOp::write_imm(B_IOVA, p.b.mr.rkey, 7), sge);
    }
    let sent = take_tx(&mut p.c.nics[0]);
    assert_eq!(opcodes(&sent), [Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE]);
}

#[test]
fn the_invalid_credit_code_lifts_the_limit() {
    let mut p = Pair::new(4, &Params::default());
    post_sends(&mut p, 8);
    let first = take_tx(&mut p.c.nics[0]);
    assert_eq!(first.len(), 1);
    // rdma_rxe's ACK: code 0x1F, no count kept. Everything goes.
    ack(&mut p, psn_of(&first[0]), 1, aeth::CREDITS_INVALID);
    assert_eq!(take_tx(&mut p.c.nics[0]).len(), 7);
    // A later count does not bring the limit back (rdmavt's rule too).
    let rest = take_tx(&mut p.c.nics[0]);
    assert!(rest.is_empty());
    ack(&mut p, psn_of(&first[0]).add(7), 8, 0);
    post_sends(&mut p, 3);
    assert_eq!(take_tx(&mut p.c.nics[0]).len(), 3);
}

#[test]
fn a_stale_ack_does_not_pull_the_limit_back() {
    let mut p = Pair::new(5, &Params::default());
    post_sends(&mut p, 3);
    let first = take_tx(&mut p.c.nics[0]);
    ack(&mut p, psn_of(&first[0]), 1, 4); // LSN 5: SSNs up to 6
    let next = take_tx(&mut p.c.nics[0]);
    assert_eq!(next.len(), 2);
    // An ACK the network held back, of SSN 2 with no credit left then:
    // LSN 2 + 0 is behind 5, and what was allowed stays allowed.
    ack(&mut p, psn_of(&next[0]), 2, 0);
    post_sends(&mut p, 4);
    assert_eq!(take_tx(&mut p.c.nics[0]).len(), 3, "SSNs 4 to 6");
}

/// The responder's application keeps four receives posted, reposting one
/// as each completes; the requester posts 64 SENDs at once. Kept to the
/// credits, it never draws an RNR NAK; sent blindly (rdma_rxe), the fifth
/// SEND would find the receive queue empty.
#[test]
fn a_requester_kept_to_credits_draws_no_rnr_nak() {
    let mut p = Pair::new(6, &Params::default());
    for id in 0..4 {
        p.recv_b(1000 + id, id * 128, 128);
    }
    post_sends(&mut p, 64);
    let mut reposted = 4;
    let mut received = Vec::new();
    for _ in 0..1_000_000 {
        if !p.c.step() {
            break;
        }
        for c in p.completions(1) {
            assert_eq!(c.status, WcStatus::Success);
            received.push(c.wr_id);
            p.recv_b(1000 + reposted, (reposted % 4) * 128, 128);
            reposted += 1;
        }
    }
    assert_eq!(received.len(), 64);
    assert_eq!(received, (1000..1064).collect::<Vec<_>>());
    let done = p.completions(0);
    assert_eq!(done.len(), 64);
    assert!(done.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(p.c.nics[1].counters().send_rnr_err, 0);
    assert!(p.c.nics[0].counters().credit_waits > 0);
}
