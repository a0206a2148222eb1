//! The scenarios: each sets the stage, lets the NICs run, and checks that
//! what happened is what it told.

use std::io;
use std::time::Duration;

use rnic_core::qp::{QpState, QpType};
use rnic_core::wr::{SendOp, WcOpcode, WcStatus};
use rnic_wire::aeth::{NakCode, Syndrome};
use rnic_wire::Opcode;

use super::{Scenario, Setup, Story};

pub const ALL: &[Scenario] = &[
    Scenario {
        name: "loss",
        about: "a lost WRITE packet (NAK, go-back-N), then a lost ACK (the ACK timer, a duplicate)",
        setup: Setup::RC,
        run: loss,
    },
    Scenario {
        name: "rnr",
        about: "a SEND with no receive posted (RNR NAK, the wait), then RNR retries exhausted",
        setup: Setup::RC,
        run: rnr,
    },
    Scenario {
        name: "access",
        about: "a WRITE with a bad R_Key: NAK, the QP in error, what follows flushed",
        setup: Setup::RC,
        run: access,
    },
    Scenario {
        name: "read",
        about: "a lost READ response (re-READ from the middle), a repeated atomic (answered from the saved result)",
        setup: Setup::RC,
        run: read,
    },
    Scenario {
        name: "uc",
        about: "the same loss over UC: no ACK, no NAK, the message is simply gone",
        setup: Setup {
            qp_type: QpType::Uc,
            ..Setup::RC
        },
        run: uc,
    },
    Scenario {
        name: "ud",
        about: "datagrams: no connection, no ACK; a lost datagram or one with no receive is simply gone",
        setup: Setup {
            qp_type: QpType::Ud,
            ..Setup::RC
        },
        run: ud,
    },
    Scenario {
        name: "credits",
        about: "a responder with few receives posted: credits in its ACKs, the requester holding back",
        setup: Setup::RC,
        run: credits,
    },
    Scenario {
        name: "wrap",
        about: "PSNs crossing 0xFFFFFF to 0x000000 in the middle of a message, with a loss there",
        setup: Setup {
            a_psn: 0xFF_FFFE,
            ..Setup::RC
        },
        run: wrap,
    },
];

const A: usize = 0;
const B: usize = 1;

fn loss(s: &mut Story) -> io::Result<()> {
    let first = s.view(A).next_psn.value();
    s.say(
        "A WRITEs 4 KiB into B's memory. With a 1024-byte path MTU that is four\n\
         packets, PSNs 0x000100 to 0x000103. The second one is lost.",
    )?;
    s.lose(A, None, Some(first + 1), 1);
    s.post(
        A,
        1,
        SendOp::write(s.at_b(0), s.side[B].mr.rkey),
        s.sge(A, 0, 4096),
    )?;
    s.run()?;
    let naks = s.count(B, |p| {
        matches!(p.syndrome, Some(Syndrome::Nak(NakCode::PsnSeqError))) && p.psn == first + 1
    });
    s.check(naks == 1, "B NAKs the gap once, naming the lost PSN");
    let again = s.count(A, |p| p.psn == first + 1);
    s.check(
        again == 2,
        "A sends the lost PSN twice (the loss, the resend)",
    );
    s.check(
        s.memory(B, 0, 4096) == Story::pattern(0, 4096),
        "B's memory holds all 4 KiB",
    );
    let ok = s.completed[A]
        .iter()
        .any(|c| c.wr_id == 1 && c.status == WcStatus::Success);
    s.check(ok, "A's WRITE completes successfully");

    s.part(
        Setup::RC,
        "Part 2: a lost ACK. A WRITEs 100 bytes in one packet; B takes it and\n\
         ACKs, and the ACK is lost. A hears nothing: its ACK timer (4.096 us x\n\
         2^10, about 4.2 ms) goes off, and it sends the WRITE again.",
    )?;
    s.lose(B, Some(Opcode::RC_ACKNOWLEDGE), None, 1);
    s.post(
        A,
        2,
        SendOp::write(s.at_b(8192), s.side[B].mr.rkey),
        s.sge(A, 8192, 100),
    )?;
    s.run()?;
    s.check(
        s.count(A, |p| p.opcode == Opcode::RC_RDMA_WRITE_ONLY) == 2,
        "A sends the WRITE twice",
    );
    s.check(
        s.count(B, |p| p.opcode == Opcode::RC_ACKNOWLEDGE) == 2,
        "B acknowledges both copies",
    );
    s.check(s.view(B).msn == 1, "B counts one message, not two (MSN 1)");
    s.check(
        s.memory(B, 8192, 100) == Story::pattern(8192, 100),
        "B's memory holds the 100 bytes",
    );
    s.check(
        s.completed[A].len() == 1 && s.completed[A][0].status == WcStatus::Success,
        "A's WRITE completes once, successfully",
    );
    Ok(())
}

fn rnr(s: &mut Story) -> io::Result<()> {
    s.say(
        "A SENDs 64 bytes; B has posted no receive yet. B answers RNR NAK with\n\
         its RNR timer (640 us), A waits that long and tries again. B's\n\
         program posts a receive after 1 ms, and the next try succeeds.",
    )?;
    s.post(A, 1, SendOp::send(), s.sge(A, 0, 64))?;
    s.run_for(Duration::from_millis(1))?;
    s.say("\n(B's program posts a receive)")?;
    s.post_recv(B, 10, s.sge(B, 0, 256))?;
    s.run()?;
    let rnr_naks = s.count(B, |p| matches!(p.syndrome, Some(Syndrome::RnrNak { .. })));
    s.check(
        rnr_naks == 2,
        "B sends an RNR NAK for each try before its receive",
    );
    s.check(
        s.completed[A].iter().any(|c| c.status == WcStatus::Success),
        "A's SEND completes successfully",
    );
    s.check(
        s.completed[B]
            .iter()
            .any(|c| c.wr_id == 10 && c.status == WcStatus::Success && c.byte_len == 64),
        "B's receive completes with 64 bytes",
    );
    s.check(
        s.memory(B, 0, 64) == Story::pattern(0, 64),
        "the 64 bytes are in B's receive buffer",
    );

    s.part(
        Setup {
            rnr_retry: 2,
            ..Setup::RC
        },
        "Part 2: the same SEND with the RNR retry count at 2, and B never posts\n\
         a receive: the first try and two retries, then A gives up.",
    )?;
    s.post(A, 2, SendOp::send(), s.sge(A, 0, 64))?;
    s.run()?;
    s.check(
        s.count(A, |p| p.opcode == Opcode::RC_SEND_ONLY) == 3,
        "A sends the SEND three times",
    );
    s.check(
        s.completed[A]
            .iter()
            .any(|c| c.wr_id == 2 && c.status == WcStatus::RnrRetryExcErr),
        "A's SEND fails with RNR_RETRY_EXC_ERR",
    );
    s.check(
        s.view(A).state == QpState::Err,
        "A's QP is in the error state",
    );
    Ok(())
}

fn access(s: &mut Story) -> io::Result<()> {
    s.say(
        "A WRITEs 64 bytes to B with an R_Key B never gave out, then posts a\n\
         second WRITE, a correct one, behind it.",
    )?;
    let bad = s.side[B].mr.rkey ^ 0x8000_0000;
    s.post(A, 1, SendOp::write(s.at_b(0), bad), s.sge(A, 0, 64))?;
    s.post(
        A,
        2,
        SendOp::write(s.at_b(0), s.side[B].mr.rkey),
        s.sge(A, 0, 64),
    )?;
    s.run()?;
    s.check(
        s.count(B, |p| {
            matches!(p.syndrome, Some(Syndrome::Nak(NakCode::RemoteAccessError)))
        }) == 1,
        "B NAKs with a remote access error",
    );
    let status: Vec<(u64, WcStatus)> = s.completed[A].iter().map(|c| (c.wr_id, c.status)).collect();
    s.check(
        status == [(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)],
        "A's first WRITE fails with REM_ACCESS_ERR, the second is flushed",
    );
    s.check(
        s.view(A).state == QpState::Err,
        "A's QP is in the error state",
    );
    s.check(
        s.view(B).state == QpState::Err,
        "B's QP is in the error state",
    );
    s.check(s.memory(B, 0, 64) == vec![0; 64], "B's memory is untouched");
    s.say(
        "\nA's second WRITE had left with the first (requests are pipelined); B,\n\
         its QP in the error state by then, dropped it. A completes it with\n\
         WR_FLUSH_ERR, as everything a QP in the error state holds. Both\n\
         programs must reset their QPs and connect them again.",
    )?;
    Ok(())
}

fn read(s: &mut Story) -> io::Result<()> {
    s.say(
        "First A WRITEs 4 KiB into B's memory, so that there is something to\n\
         read.",
    )?;
    s.post(
        A,
        1,
        SendOp::write(s.at_b(0), s.side[B].mr.rkey),
        s.sge(A, 0, 4096),
    )?;
    s.run()?;
    let first = s.view(A).next_psn.value();
    s.say(&format!(
        "\nNow A READs those 4 KiB back, into its own memory 16 KiB on. B answers\n\
         with four READ response packets, PSNs {first:#08x} to {:#08x} (a READ\n\
         takes as many PSNs as it has responses); the second is lost.",
        first + 3
    ))?;
    s.lose(
        B,
        Some(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE),
        Some(first + 1),
        1,
    );
    s.post(
        A,
        2,
        SendOp::read(s.at_b(0), s.side[B].mr.rkey),
        s.sge(A, 16384, 4096),
    )?;
    s.run()?;
    let reads = s.count(A, |p| p.opcode == Opcode::RC_RDMA_READ_REQUEST);
    s.check(reads == 2, "A sends the READ, then one more for the rest");
    s.check(
        s.count(B, |p| p.opcode == Opcode::RC_RDMA_READ_RESPONSE_FIRST) == 2,
        "B answers the second READ from the missing PSN on",
    );
    s.check(
        s.count(A, |p| {
            p.opcode == Opcode::RC_RDMA_READ_REQUEST && p.psn == first + 1
        }) == 1,
        "the second READ starts at the missing response's PSN",
    );
    s.check(
        s.memory(A, 16384, 4096) == Story::pattern(0, 4096),
        "A's memory holds the 4 KiB it read",
    );
    s.check(
        s.completed[A].iter().any(|c| {
            c.wr_id == 2 && c.status == WcStatus::Success && c.opcode == WcOpcode::RdmaRead
        }),
        "A's READ completes successfully",
    );

    s.part(
        Setup::RC,
        "Part 2: a repeated atomic. A adds 5 to a counter in B's memory (0); the\n\
         answer is lost, A's ACK timer goes off, and it sends the FETCH_AND_ADD\n\
         again. Executing it twice would make the counter 10.",
    )?;
    s.lose(B, Some(Opcode::RC_ATOMIC_ACKNOWLEDGE), None, 1);
    s.post(
        A,
        3,
        SendOp::fetch_add(s.at_b(4096), s.side[B].mr.rkey, 5),
        s.sge(A, 32768, 8),
    )?;
    s.run()?;
    let counter = u64::from_ne_bytes(s.memory(B, 4096, 8).try_into().unwrap_or([0; 8]));
    let fetched = u64::from_ne_bytes(s.memory(A, 32768, 8).try_into().unwrap_or([0; 8]));
    s.check(
        s.count(A, |p| p.opcode == Opcode::RC_FETCH_ADD) == 2,
        "A sends the atomic twice",
    );
    s.check(counter == 5, "B's counter is 5: the atomic ran once");
    s.check(fetched == 0, "A got the original value, 0, both times");
    s.say(&format!(
        "\nB's counter: {counter}. A's result: {fetched}. The responder kept the\n\
         atomic's result among its responder resources (max_dest_rd_atomic of\n\
         them) and sent it again rather than adding twice."
    ))?;
    Ok(())
}

fn uc(s: &mut Story) -> io::Result<()> {
    s.say(
        "The same 4 KiB WRITE as in `loss`, over an unreliable connection, its\n\
         second packet lost; then a second WRITE of 64 bytes.",
    )?;
    let first = s.view(A).next_psn.value();
    s.lose(A, None, Some(first + 1), 1);
    s.post(
        A,
        1,
        SendOp::write(s.at_b(0), s.side[B].mr.rkey),
        s.sge(A, 0, 4096),
    )?;
    s.post(
        A,
        2,
        SendOp::write(s.at_b(8192), s.side[B].mr.rkey),
        s.sge(A, 8192, 64),
    )?;
    s.run()?;
    s.check(
        s.sent[B].is_empty(),
        "B sends nothing at all: UC has no ACK and no NAK",
    );
    s.check(
        s.completed[A].len() == 2 && s.completed[A].iter().all(|c| c.status == WcStatus::Success),
        "both of A's WRITEs complete successfully as soon as they are sent",
    );
    s.check(
        s.memory(B, 3072, 1024) != Story::pattern(3072, 1024),
        "the first WRITE's last packet was not placed: its message was dropped",
    );
    s.check(
        s.memory(B, 8192, 64) == Story::pattern(8192, 64),
        "the second WRITE arrived whole",
    );
    s.say(
        "\nA's completion says only that the WRITE left. What B's memory holds of\n\
         the first message is whatever arrived before the gap: the program must\n\
         find out for itself, which is why UC suits data where a loss is\n\
         tolerable or is detected above.",
    )?;
    Ok(())
}

fn ud(s: &mut Story) -> io::Result<()> {
    s.say(
        "Two UD QPs: no connection between them, each SEND carries its\n\
         destination (address, QP number, Q_Key) in its work request. B posts\n\
         two receives of 1 KiB; A sends three datagrams of 100 bytes, the\n\
         second is lost; then a fourth, for which B has no receive left.",
    )?;
    for k in 0..2 {
        s.post_recv(B, 10 + k, s.sge(B, 1024 * k, 1024))?;
    }
    let first = s.view(A).next_psn.value();
    s.lose(A, None, Some(first + 1), 1);
    for k in 0..3 {
        s.post_ud(A, 1 + k, s.sge(A, 100 * k, 100))?;
    }
    s.run()?;
    s.post_ud(A, 4, s.sge(A, 300, 100))?;
    s.run()?;
    s.check(s.sent[B].is_empty(), "B sends nothing back");
    s.check(
        s.completed[A].len() == 4 && s.completed[A].iter().all(|c| c.status == WcStatus::Success),
        "all four of A's SENDs complete successfully: UD completes a SEND when it leaves",
    );
    let got: Vec<(u64, u32)> = s.completed[B]
        .iter()
        .map(|c| (c.wr_id, c.byte_len))
        .collect();
    s.check(
        got == [(10, 140), (11, 140)],
        "B's two receives take the first and the third datagram, each 40 + 100 bytes",
    );
    s.check(
        s.memory(B, 1024 + 40, 100) == Story::pattern(200, 100),
        "B's second receive holds the third datagram",
    );
    s.say(
        "B's program sees two datagrams and no sign of the two it missed: a UD\n\
         program numbers its messages itself when it must know.",
    )?;
    Ok(())
}

fn credits(s: &mut Story) -> io::Result<()> {
    s.say(
        "B posts 2 receives. Every ACK carries B's credit count: how many more\n\
         receives it has posted. A begins a SEND only while its credits allow,\n\
         and one beyond them (to learn a new count, as the IBTA allows: that one\n\
         may draw an RNR NAK); the rest it holds back, off the wire, until\n\
         credits come. A SENDs once, then three more at once; after 1 ms B's\n\
         program posts two more receives.",
    )?;
    for k in 0..2 {
        s.post_recv(B, 10 + k, s.sge(B, 1024 * k, 1024))?;
    }
    s.post(A, 1, SendOp::send(), s.sge(A, 0, 64))?;
    s.run()?;
    s.say("\n(A has seen B's count: one receive left. Now three more SENDs)")?;
    for k in 1..4 {
        s.post(A, 1 + k, SendOp::send(), s.sge(A, 64 * k, 64))?;
    }
    let last = s.view(A).next_psn.value() - 1;
    s.run_for(Duration::from_millis(1))?;
    let held = s.view(A).outstanding;
    s.say(&format!(
        "\n(B's program posts two more receives; A holds {held} SEND(s) back)"
    ))?;
    for k in 2..4 {
        s.post_recv(B, 10 + k, s.sge(B, 1024 * k, 1024))?;
    }
    s.run()?;
    s.check(
        held == 2,
        "A holds two SENDs back: one waits out an RNR NAK, one for credit",
    );
    s.check(
        s.count(A, |p| p.opcode == Opcode::RC_SEND_ONLY && p.psn == last) == 1,
        "the SEND held for credit goes on the wire once, after the receives",
    );
    s.check(
        s.count(B, |p| matches!(p.syndrome, Some(Syndrome::RnrNak { .. }))) == 2,
        "only the SEND beyond the credits draws RNR NAKs",
    );
    s.check(
        s.completed[A].len() == 4 && s.completed[A].iter().all(|c| c.status == WcStatus::Success),
        "all four SENDs complete successfully",
    );
    s.check(
        s.completed[B].len() == 4,
        "B's four receives each take a SEND",
    );
    Ok(())
}

fn wrap(s: &mut Story) -> io::Result<()> {
    s.say(
        "PSNs are 24 bits. A's QP starts at PSN 0xFFFFFE; a 4 KiB WRITE (four\n\
         packets) takes 0xFFFFFE, 0xFFFFFF, 0x000000 and 0x000001. The packet\n\
         at 0x000000 is lost: B NAKs it, A goes back across the wrap.",
    )?;
    s.lose(A, None, Some(0), 1);
    s.post(
        A,
        1,
        SendOp::write(s.at_b(0), s.side[B].mr.rkey),
        s.sge(A, 0, 4096),
    )?;
    s.run()?;
    let psns: Vec<u32> = s.sent[A].iter().map(|p| p.psn).collect();
    s.check(
        psns == [0xFF_FFFE, 0xFF_FFFF, 0, 1, 0, 1],
        "A sends 0xFFFFFE, 0xFFFFFF, 0, 1, then 0 and 1 again",
    );
    s.check(
        s.memory(B, 0, 4096) == Story::pattern(0, 4096),
        "B's memory holds all 4 KiB",
    );
    s.check(
        s.view(A).next_psn.value() == 2 && s.view(B).expected_psn.value() == 2,
        "both sides go on at PSN 2",
    );
    Ok(())
}
