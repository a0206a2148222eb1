//! The checker against rnic's own traffic on the simulator (which must be
//! clean), and against that traffic with one violation planted: each is
//! flagged with its rule, and nothing else is.

use std::time::Duration;

use super::*;
use crate::mem::Access;
use crate::qp::{AddressVector, Mtu, QpAttr, QpType};
use crate::sim::{Cluster, DropRule, LinkConfig};
use crate::wr::{sg_list, RecvWr, SendOp, SendWr, Sge};
use crate::QpCaps;
use rnic_wire::pcap::PcapReader;
use rnic_wire::{icrc, Opcode};

const IOVA: [u64; 2] = [0x1_0000_0000, 0x2_0000_0000];
const A_PSN: u32 = 0x100;

/// One captured frame.
#[derive(Clone)]
struct Rec {
    t: u64,
    data: Vec<u8>,
}

impl Rec {
    fn frame(&self) -> Frame<'_> {
        Frame::parse(LinkType::Ethernet, &self.data).expect("the simulator's frames parse")
    }
    fn opcode(&self) -> Opcode {
        self.frame().ib.bth().opcode()
    }
    fn psn(&self) -> u32 {
        self.frame().ib.bth().psn().value()
    }
    fn sent_by_a(&self) -> bool {
        self.frame().ip.src_addr() == Cluster::new(0, LinkConfig::default(), 1).nics[0].addr()
    }
    /// Take `n` bytes off the end of the payload, with the IPv4 and UDP
    /// lengths and the ICRC made right.
    fn cut(&mut self, n: usize) {
        let ip = self.frame().ip_offset;
        let end = self.data.len();
        self.data.drain(end - 4 - n..end - 4);
        for at in [ip + 2, ip + 20 + 4] {
            let v = u16::from_be_bytes([self.data[at], self.data[at + 1]]) - n as u16;
            self.data[at..at + 2].copy_from_slice(&v.to_be_bytes());
        }
        let end = self.data.len();
        icrc::fill(&mut self.data[ip..end]).expect("an IP packet");
    }

    /// Change the bytes `at` (from the BTH on) and make the ICRC right.
    fn edit(&mut self, at: usize, bytes: &[u8]) {
        let (ip, ib) = {
            let f = self.frame();
            (f.ip_offset, f.ib_offset)
        };
        self.data[ib + at..ib + at + bytes.len()].copy_from_slice(bytes);
        let end = self.data.len();
        icrc::fill(&mut self.data[ip..end]).expect("an IP packet");
    }
}

/// A WRITE of 4 KiB whose second packet is lost once (PSNs 0x100 to
/// 0x103), a READ of 4 KiB (0x104 to 0x107), a FETCH_AND_ADD whose answer
/// is lost once (0x108), a SEND (0x109), a WRITE with immediate data
/// (0x10a) and a WRITE (0x10b): rnic's traffic between two NICs on the
/// simulator, captured at the sender (lost packets included), as frames.
/// The NAK of 0x101 has everything from there sent again, and the ACK of
/// 0x109 (which shows the atomic's answer lost) everything from 0x108.
fn traffic() -> Vec<Rec> {
    let (mut c, keys) = connected();
    let (a, b) = (c.nics[0].addr(), c.nics[1].addr());
    c.net.drop_rule(DropRule {
        src: Some(a),
        opcode: None,
        psn: Some(Psn::new(A_PSN + 1)),
        times: 1,
    });
    c.net.drop_rule(DropRule {
        src: Some(b),
        opcode: Some(Opcode::RC_ATOMIC_ACKNOWLEDGE),
        psn: None,
        times: 1,
    });
    let sge = |i: usize, off: u64, len: u32| Sge {
        addr: IOVA[i] + off,
        length: len,
        lkey: keys[i].1.lkey,
    };
    let rkey = keys[1].1.rkey;
    let now = c.now;
    for k in 0..2 {
        c.nics[1]
            .post_recv(
                now,
                keys[1].0,
                RecvWr {
                    wr_id: k,
                    sg_list: sg_list![sge(1, 8192 + 1024 * k, 1024)],
                },
            )
            .unwrap();
    }
    let ops = [
        (SendOp::write(IOVA[1], rkey), sge(0, 0, 4096)),
        (SendOp::read(IOVA[1] + 4096, rkey), sge(0, 16384, 4096)),
        (
            SendOp::fetch_add(IOVA[1] + 32768, rkey, 5),
            sge(0, 32768, 8),
        ),
        (SendOp::send(), sge(0, 0, 64)),
        (SendOp::write_imm(IOVA[1], rkey, 7), sge(0, 0, 100)),
        (SendOp::write(IOVA[1] + 40960, rkey), sge(0, 0, 100)),
    ];
    run(c, &keys, ops)
}

/// Two NICs on a perfect simulated link, an RC QP on each connected to the
/// other (A sends from PSN [`A_PSN`], MTU 1024), and a 64 KiB region on
/// each open to every remote access: the QP numbers and regions.
fn connected() -> (Cluster, Vec<(u32, crate::mem::MrKeys)>) {
    let mut c = Cluster::new(3, LinkConfig::perfect(Duration::from_micros(5)), 2);
    c.net.record_pcap();
    let mut keys = Vec::new();
    for (i, iova) in IOVA.into_iter().enumerate() {
        let nic = &mut c.nics[i];
        let pd = nic.alloc_pd();
        let cq = nic.create_cq(64);
        let qpn = nic
            .create_qp(pd, QpType::Rc, cq, cq, QpCaps::default())
            .unwrap();
        let access = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        let mr = nic
            .reg_mr(pd, iova, Box::new(vec![i as u8; 65536]), access)
            .unwrap();
        keys.push((qpn, mr));
    }
    let psn = [A_PSN, 0xb000];
    for i in 0..2 {
        let attr = QpAttr {
            qp_access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            ah_attr: Some(AddressVector {
                dest: c.nics[1 - i].addr(),
                src: None,
                traffic_class: 0,
                hop_limit: 64,
                flow_label: 0,
            }),
            path_mtu: Mtu::Mtu1024,
            dest_qp_num: keys[1 - i].0,
            rq_psn: psn[1 - i],
            max_dest_rd_atomic: 16,
            min_rnr_timer: 1,
            sq_psn: psn[i],
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
            ..QpAttr::default()
        };
        let now = c.now;
        c.nics[i].to_rts(now, keys[i].0, &attr).unwrap();
    }
    (c, keys)
}

/// Post `ops` on A's QP, let the simulation settle, and return what it
/// captured.
fn run(
    mut c: Cluster,
    keys: &[(u32, crate::mem::MrKeys)],
    ops: impl IntoIterator<Item = (SendOp, Sge)>,
) -> Vec<Rec> {
    let now = c.now;
    for (k, (op, sge)) in ops.into_iter().enumerate() {
        c.nics[0]
            .post_send(now, keys[0].0, SendWr::new(k as u64, op, sg_list![sge]))
            .unwrap();
    }
    let limit = c.now + Duration::from_secs(5);
    assert!(c.run(limit, 100_000), "the simulation settles");
    let pcap = c.net.pcap();
    PcapReader::new(&pcap)
        .unwrap()
        .map(|r| {
            let r = r.unwrap();
            Rec {
                t: r.timestamp_ns,
                data: r.data.to_vec(),
            }
        })
        .collect()
}

fn check(recs: &[Rec]) -> Vec<Finding> {
    let mut c = Checker::new();
    for (i, r) in recs.iter().enumerate() {
        c.frame(i as u64 + 1, r.t, Some(LinkType::Ethernet), &r.data);
    }
    c.finish().0
}

fn rules(found: &[Finding]) -> Vec<Rule> {
    let mut r: Vec<Rule> = found.iter().map(|f| f.rule).collect();
    r.sort();
    r.dedup();
    r
}

/// The index of the `k`th frame (from 0) matching `f`.
fn nth(recs: &[Rec], k: usize, f: impl Fn(&Rec) -> bool) -> usize {
    recs.iter()
        .enumerate()
        .filter(|(_, r)| f(r))
        .nth(k)
        .map(|(i, _)| i)
        .expect("the traffic has that packet")
}

#[test]
fn rnic_s_own_traffic_with_losses_is_clean() {
    let recs = traffic();
    // The losses happened: a NAK and a repeated atomic.
    assert!(recs.iter().any(|r| {
        r.frame().ib.aeth().is_some_and(|a| {
            Syndrome::from_byte(a.syndrome()) == Syndrome::Nak(NakCode::PsnSeqError)
        })
    }));
    assert_eq!(
        recs.iter()
            .filter(|r| r.opcode() == Opcode::RC_FETCH_ADD)
            .count(),
        3
    );
    assert_eq!(
        recs.iter()
            .filter(|r| r.opcode() == Opcode::RC_ATOMIC_ACKNOWLEDGE)
            .count(),
        2
    );
    let found = check(&recs);
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn a_packet_the_capture_missed_but_the_responder_acknowledged_is_a_capture_loss() {
    let base = traffic();
    // The WRITE with immediate data, sent once, then acknowledged.
    let mut recs = base.clone();
    let i = nth(&recs, 0, |r| r.sent_by_a() && r.psn() == A_PSN + 10);
    recs.remove(i);
    let found = check(&recs);
    assert_eq!(rules(&found), [Rule::CaptureLoss], "{found:#?}");
    // The last request, acknowledged, and nothing after it.
    let mut recs = base;
    let i = nth(&recs, 0, |r| r.sent_by_a() && r.psn() == A_PSN + 11);
    recs.remove(i);
    let found = check(&recs);
    assert_eq!(rules(&found), [Rule::CaptureLoss], "{found:#?}");
}

#[test]
fn planted_violations_are_each_flagged_with_their_rule() {
    let base = traffic();
    let ack = |r: &Rec| {
        r.opcode() == Opcode::RC_ACKNOWLEDGE && {
            let f = r.frame();
            let a = f.ib.aeth().unwrap();
            matches!(Syndrome::from_byte(a.syndrome()), Syndrome::Ack { .. })
        }
    };

    // An MSN that does not count: the last ACK's MSN three higher.
    let mut recs = base.clone();
    let i = recs.iter().rposition(ack).unwrap();
    let msn = recs[i].frame().ib.aeth().unwrap().msn();
    recs[i].edit(13, &(msn + 3).to_be_bytes()[1..]);
    assert_eq!(rules(&check(&recs)), [Rule::MsnCount]);

    // A READ response cut short: its LAST four bytes shorter.
    let mut recs = base.clone();
    let i = nth(&recs, 0, |r| {
        r.opcode() == Opcode::RC_RDMA_READ_RESPONSE_LAST
    });
    recs[i].cut(4);
    let found = check(&recs);
    assert_eq!(rules(&found), [Rule::ReadResponse], "{found:#?}");

    // A retransmission from the wrong PSN: the resent second packet of the
    // WRITE taken out, so that the resending seems to begin at the third.
    let mut recs = base.clone();
    let i = nth(&recs, 1, |r| r.sent_by_a() && r.psn() == A_PSN + 1);
    recs.remove(i);
    let found = check(&recs);
    assert_eq!(rules(&found), [Rule::GoBackN], "{found:#?}");

    // A repeated atomic answered with another original value.
    let mut recs = base.clone();
    let i = nth(&recs, 1, |r| r.opcode() == Opcode::RC_ATOMIC_ACKNOWLEDGE);
    recs[i].edit(12 + 4, &0xdead_u64.to_be_bytes());
    assert_eq!(rules(&check(&recs)), [Rule::AtomicReplay]);

    // A MIDDLE inside a message of another operation (the WRITE's second
    // packet made a SEND_MIDDLE, in both its copies).
    let mut recs = base.clone();
    for k in 0..2 {
        let i = nth(&recs, k, |r| r.sent_by_a() && r.psn() == A_PSN + 1);
        recs[i].edit(0, &[Opcode::RC_SEND_MIDDLE.0]);
    }
    let found = check(&recs);
    assert!(rules(&found).contains(&Rule::OpcodeSequence), "{found:#?}");

    // An ICRC that does not verify.
    let mut recs = base.clone();
    let last = recs[3].data.len() - 1;
    recs[3].data[last] ^= 1;
    assert_eq!(rules(&check(&recs)), [Rule::Icrc]);

    // An RNR NAK for a WRITE, which takes no receive.
    let mut recs = base.clone();
    let i = nth(&recs, 0, |r| ack(r) && r.psn() == A_PSN + 3);
    recs[i].edit(12, &[0x21]);
    let found = check(&recs);
    assert!(rules(&found).contains(&Rule::NakCode), "{found:#?}");

    // A FIRST or MIDDLE with a pad count.
    let mut recs = base.clone();
    let i = nth(&recs, 0, |r| r.sent_by_a() && r.psn() == A_PSN);
    let b1 = recs[i].data[recs[i].frame().ib_offset + 1];
    recs[i].edit(1, &[b1 | 0x10]);
    let found = check(&recs);
    assert!(rules(&found).contains(&Rule::Payload), "{found:#?}");

    // A response for a PSN never sent, and a request after it that shows
    // the requester had not sent it.
    // (The ACK of the SEND at 0x109 made one of 0x10f, before the
    // requester's next new request, 0x10a.)
    let mut recs = base.clone();
    let i = nth(&recs, 0, |r| ack(r) && r.psn() == A_PSN + 9);
    recs[i].edit(9, &(A_PSN + 15).to_be_bytes()[1..]);
    let found = check(&recs);
    assert!(rules(&found).contains(&Rule::AckUnsent), "{found:#?}");

    // A NAK for a PSN acknowledged already: the ACK of 0x109 made a
    // sequence-error NAK of 0x102, after the ACK of 0x103.
    let mut recs = base.clone();
    let i = nth(&recs, 0, |r| ack(r) && r.psn() == A_PSN + 9);
    recs[i].edit(9, &(A_PSN + 2).to_be_bytes()[1..]);
    recs[i].edit(12, &[0x60]);
    let found = check(&recs);
    assert!(
        rules(&found).contains(&Rule::AckOutsideWindow),
        "{found:#?}"
    );

    // PSNs skipped for good: the WRITE's third packet and every response
    // after it taken out, so nobody NAKs, resends or acknowledges it.
    let mut recs = base.clone();
    recs.retain(|r| r.sent_by_a() && r.psn() != A_PSN + 2);
    let found = check(&recs);
    assert!(rules(&found).contains(&Rule::PsnSkip), "{found:#?}");
}

#[test]
fn a_network_copy_is_not_the_nic_s() {
    let mut recs = traffic();
    let i = nth(&recs, 0, |r| r.sent_by_a() && r.psn() == A_PSN + 3);
    let mut copy = recs[i].clone();
    copy.t += 1000;
    recs.insert(i + 1, copy);
    let mut c = Checker::new();
    for (k, r) in recs.iter().enumerate() {
        c.frame(k as u64 + 1, r.t, Some(LinkType::Ethernet), &r.data);
    }
    let (found, stats) = c.finish();
    assert!(found.is_empty(), "{found:#?}");
    assert_eq!(stats.network_copies, 1);
}

#[test]
fn bad_input_is_counted_never_a_panic() {
    let mut c = Checker::new();
    c.frame(1, 0, Some(LinkType::Ethernet), &[0u8; 3]);
    c.frame(2, 0, None, &[1, 2, 3]);
    let recs = traffic();
    let cut = &recs[0].data[..recs[0].data.len() - 5];
    c.frame(3, 0, Some(LinkType::Ethernet), cut);
    let (found, stats) = c.finish();
    assert!(found.is_empty());
    assert_eq!(stats.frames, 3);
    assert_eq!(stats.roce, 0);
}

/// The same go-back-N fault as above, on a connection whose responses the
/// network reordered (a copy of the NAK, MSN 0, after the ACK of MSN 1):
/// it cannot be told from a packet the network held back, and is a note.
#[test]
fn an_order_dependent_finding_on_a_reordered_connection_is_a_note() {
    let base = traffic();
    let mut recs = base.clone();
    let i = nth(&recs, 1, |r| r.sent_by_a() && r.psn() == A_PSN + 1);
    recs.remove(i);
    let nak = nth(&recs, 0, |r| {
        r.psn() == A_PSN + 1 && r.frame().ib.aeth().is_some()
    });
    let ack = nth(&recs, 0, |r| {
        r.psn() == A_PSN + 3 && r.frame().ib.aeth().is_some()
    });
    let mut late = recs[nak].clone();
    late.t = recs[ack].t;
    recs.insert(ack + 1, late);
    let found = check(&recs);
    assert_eq!(rules(&found), [Rule::Reordered], "{found:#?}");
    assert!(found[0].what.contains("[go-back-n]"));
}

/// A WRITE is re-ACKed after the atomic behind it was done: the ACK names
/// the WRITE's PSN and carries the MSN of now, the atomic counted, whether
/// its answer came before the re-ACK or not.
/// That is what rnic and rdma_rxe send, and no MSN miscount; one more
/// than that still is.
#[test]
fn a_re_ack_may_count_an_atomic_answered_beyond_its_psn() {
    let (mut c, keys) = connected();
    let b = c.nics[1].addr();
    let sge = Sge {
        addr: IOVA[0],
        length: 64,
        lkey: keys[0].1.lkey,
    };
    let atomic = Sge {
        addr: IOVA[0] + 1024,
        length: 8,
        lkey: keys[0].1.lkey,
    };
    let rkey = keys[1].1.rkey;
    // A WRITE at A_PSN, acknowledged.
    let now = c.now;
    c.nics[0]
        .post_send(
            now,
            keys[0].0,
            SendWr::new(9, SendOp::write(IOVA[1], rkey), sg_list![sge]),
        )
        .unwrap();
    let limit = c.now + Duration::from_secs(1);
    assert!(c.run(limit, 1_000), "the WRITE completes");
    // B answers the WRITE at A_PSN + 1 and the atomic at A_PSN + 2. Both
    // answers are lost: A sends both again, B re-ACKs the WRITE and
    // answers the atomic from its saved result.
    for (opcode, psn) in [
        (Opcode::RC_ACKNOWLEDGE, A_PSN + 1),
        (Opcode::RC_ATOMIC_ACKNOWLEDGE, A_PSN + 2),
    ] {
        c.net.drop_rule(DropRule {
            src: Some(b),
            opcode: Some(opcode),
            psn: Some(Psn::new(psn)),
            times: 1,
        });
    }
    let mut recs = run(
        c,
        &keys,
        [
            (SendOp::write(IOVA[1] + 64, rkey), sge),
            (SendOp::fetch_add(IOVA[1] + 1024, rkey, 1), atomic),
        ],
    );
    let ack = |r: &Rec| {
        (r.opcode() == Opcode::RC_ACKNOWLEDGE)
            .then(|| (r.psn(), r.frame().ib.aeth().unwrap().msn()))
    };
    let acks: Vec<(u32, u32)> = recs.iter().filter_map(ack).collect();
    let re_ack = (A_PSN + 1, 3);
    assert_eq!(acks, [(A_PSN, 1), (A_PSN + 1, 2), re_ack]);
    // A responder may leave the WRITE's first ACK to the atomic's answer
    // behind it (rnic does, when both arrive in one batch): then the
    // re-ACK is the first plain ACK past A_PSN.
    let first = recs
        .iter()
        .position(|r| ack(r) == Some((A_PSN + 1, 2)))
        .unwrap();
    recs.remove(first);
    let found = check(&recs);
    assert!(found.is_empty(), "{found:#?}");

    // The atomic's first answer missing from the capture (lost before
    // the capture point): the re-ACK counts an atomic whose answer comes
    // only after it, the one sent right after the WRITE.
    let mut unanswered = recs.clone();
    let answer = unanswered
        .iter()
        .position(|r| r.opcode() == Opcode::RC_ATOMIC_ACKNOWLEDGE)
        .unwrap();
    unanswered.remove(answer);
    let re = unanswered
        .iter()
        .position(|r| ack(r) == Some(re_ack))
        .unwrap();
    assert!(
        !unanswered[..re]
            .iter()
            .any(|r| r.opcode() == Opcode::RC_ATOMIC_ACKNOWLEDGE),
        "the atomic's answer comes after the re-ACK"
    );
    let found = check(&unanswered);
    assert!(found.is_empty(), "{found:#?}");

    // The same re-ACK counting a message nobody sent.
    let i = recs
        .iter()
        .rposition(|r| {
            r.opcode() == Opcode::RC_ACKNOWLEDGE
                && (r.psn(), r.frame().ib.aeth().unwrap().msn()) == re_ack
        })
        .unwrap();
    recs[i].edit(13, &4u32.to_be_bytes()[1..]);
    assert_eq!(rules(&check(&recs)), [Rule::MsnCount]);
}
