//! What a peer can make the transport do: responses and requests delivered by
//! hand (reordered, duplicated, or crafted with a correct ICRC), as an honest
//! peer on a bad network or a dishonest one produces them. Each test names
//! the rule it holds the engine to.

mod common;

use common::*;
use rnic_core::sim::Datagram;
use rnic_core::wr::{SendOp, SendWr, WcStatus};
use rnic_core::Nic;
use rnic_wire::{IbPacket, Opcode};

/// Everything `nic` wants to send, taken off its queue.
fn take_tx(nic: &mut Nic) -> Vec<Datagram> {
    std::iter::from_fn(|| nic.poll_transmit()).collect()
}

fn opcode(d: &Datagram) -> Opcode {
    IbPacket::new_checked(&d.payload[..])
        .unwrap()
        .bth()
        .opcode()
}

fn psn_of(d: &Datagram) -> u32 {
    IbPacket::new_checked(&d.payload[..])
        .unwrap()
        .bth()
        .psn()
        .value()
}

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
    p.post(
        1,
        SendOp::Write {
            remote_addr: B_IOVA,
            rkey,
            imm: Some(0x1234),
        },
        p.sge_a(0, 3000),
    );
    let now = p.c.now;
    let sg_list = if inline { vec![] } else { p.sge_a(0, 8) };
    p.c.nics[0]
        .post_send(
            now,
            p.a.qpn,
            SendWr {
                wr_id: 2,
                op: SendOp::Write {
                    remote_addr: B_IOVA + 8192,
                    rkey,
                    imm: None,
                },
                sg_list,
                signaled: true,
                solicited: false,
                fence: false,
                inline: inline.then(|| data[..8].to_vec()),
            },
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
