//! `rnic check`'s verdict on every reference capture (rdma_rxe's, the
//! hardware NIC's, the kernel's CM's): rnic's conformance checker against
//! real devices' traffic. Every capture is conformant; where the checker
//! notes something, it is pinned here, with why (tests/captures/README.md
//! says the same).

use std::path::{Path, PathBuf};

use rnic_core::check::{Checker, Finding, Rule, Stats};
use rnic_wire::pcap::PcapReader;
use rnic_wire::LinkType;

fn captures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("captures");
    let mut all = Vec::new();
    let mut dirs = vec![root];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "pcap" || x == "pcapng") {
                all.push(p);
            }
        }
    }
    all.sort();
    all
}

/// A capture's frames, each editable: time, link type and bytes.
type Frames = Vec<(u64, Option<LinkType>, Vec<u8>)>;

fn read_frames(path: &Path) -> Frames {
    let data = std::fs::read(path).unwrap();
    PcapReader::new(&data)
        .unwrap()
        .map(|r| {
            let r = r.unwrap();
            (
                r.timestamp_ns,
                LinkType::from_pcap(r.link_type),
                r.data.to_vec(),
            )
        })
        .collect()
}

/// The frames of reference capture `name`.
fn frames(name: &str) -> Frames {
    read_frames(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("captures")
            .join(name),
    )
}

/// The checker's verdict on `frames`, numbered from 1.
fn check_frames(frames: &[(u64, Option<LinkType>, Vec<u8>)]) -> (Vec<Finding>, Stats) {
    let mut c = Checker::new();
    for (i, (t, link, data)) in frames.iter().enumerate() {
        c.frame(i as u64 + 1, *t, *link, data);
    }
    c.finish()
}

fn check(path: &Path) -> (Vec<Finding>, Stats) {
    check_frames(&read_frames(path))
}

/// `first`, then `second` a second after it, each of `second`'s frames
/// changed by `change` (given its bytes and link type) first.
fn one_after_the_other(
    first: &Frames,
    second: Frames,
    mut change: impl FnMut(&mut Vec<u8>, LinkType),
) -> Frames {
    let mut both = first.clone();
    let end = both.last().unwrap().0;
    let start = second[0].0;
    for (t, link, mut data) in second {
        change(&mut data, link.unwrap());
        both.push((t - start + end + 1_000_000_000, link, data));
    }
    both
}

#[test]
fn every_reference_capture_is_conformant_and_every_note_is_pinned() {
    let all = captures();
    assert!(all.len() >= 70, "{} captures", all.len());
    let mut rc = 0;
    for path in &all {
        let name = path.file_name().unwrap().to_str().unwrap();
        let (found, stats) = check(path);
        rc += stats.rc;
        let notes: Vec<(Vec<u64>, Rule)> =
            found.iter().map(|f| (f.packets.clone(), f.rule)).collect();
        let expected: Vec<(Vec<u64>, Rule)> = match name {
            // netem dropped the FIRST of a message before the capture point,
            // rxe NAKed it, and the capture's first retransmission is the
            // packet after it: the retransmitted FIRST was lost the same way
            // (it turns up after rxe's ACK timeout).
            "rxe-write_bw_loss3.pcap" => vec![(vec![62, 63], Rule::CaptureLoss)],
            "rxe-send_bw_loss3.pcap" => vec![(vec![103, 104], Rule::CaptureLoss)],
            _ => vec![],
        };
        assert_eq!(notes, expected, "{name}: {found:#?}");
    }
    assert!(
        rc >= 60,
        "the checker found only {rc} RC connections in the captures"
    );
}

#[test]
fn the_loss_captures_show_the_checker_at_work() {
    // What the checker rebuilt of a lossy rdma_rxe run: its responses all
    // placed with their requests, the network's copies recognised.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("captures");
    let (_, stats) = check(&root.join("rxe-write_bw_dup10.pcap"));
    assert_eq!(
        (stats.rc, stats.network_copies, stats.unplaced_responses),
        (1, 28, 0)
    );
    let (_, stats) = check(&root.join("rxe-read_bw_loss3.pcap"));
    assert_eq!((stats.rc, stats.unplaced_responses), (1, 0));
}

/// `rnic check` and `rnic ladder` read a capture as a stream, a record or
/// block at a time: on every reference capture, what the stream yields is
/// what the in-memory reader yields.
#[test]
fn the_stream_reads_every_reference_capture_as_the_reader_does() {
    use rnic_wire::pcap::PcapStream;
    for path in captures() {
        let data = std::fs::read(&path).unwrap();
        let whole: Vec<_> = PcapReader::new(&data)
            .unwrap()
            .map(|r| r.map(|r| (r.timestamp_ns, r.link_type, r.data.to_vec(), r.orig_len)))
            .collect();
        let streamed: Vec<_> =
            PcapStream::new(std::io::BufReader::new(std::fs::File::open(&path).unwrap()))
                .unwrap()
                .map(|r| r.map(|r| (r.timestamp_ns, r.link_type, r.data, r.orig_len)))
                .collect();
        assert_eq!(whole.len(), streamed.len(), "{}", path.display());
        for (a, b) in whole.iter().zip(&streamed) {
            assert_eq!(a.as_ref().ok(), b.as_ref().ok(), "{}", path.display());
        }
    }
}

/// The hardware NIC's responder grants credits (6 and 8 in its ACKs) and
/// its requester keeps within them: no `credits` warning. The same
/// capture with every grant made 0 (the ICRC made right) shows its SENDs
/// beyond the grant, each warned about; a warning leaves the capture
/// conformant.
#[test]
fn credits_the_hardware_nic_is_granted_it_keeps_to() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("captures/hw-rc-send-imm.pcap");
    let (found, _) = check(&path);
    assert!(found.is_empty(), "{found:#?}");

    let mut all = read_frames(&path);
    let mut granted = std::collections::BTreeSet::new();
    for (_, link, frame) in &mut all {
        let syndrome = link
            .and_then(|l| rnic_wire::Frame::parse(l, frame).ok())
            .and_then(|f| Some(f.ib.aeth()?.syndrome()));
        if let Some(syndrome) = syndrome.filter(|s| s >> 5 == 0) {
            granted.insert(syndrome & 0x1f);
            let aeth = 12;
            edit(frame, link.unwrap(), 0, aeth, &[0]); // ACK, no credits
        }
    }
    // Credit codes 5 and 6: 6 and 8 receives (IBTA table 43).
    assert_eq!(granted.into_iter().collect::<Vec<_>>(), [5, 6]);
    let (found, _) = check_frames(&all);
    let rules: std::collections::BTreeSet<Rule> = found.iter().map(|f| f.rule).collect();
    assert_eq!(
        rules.into_iter().collect::<Vec<_>>(),
        [Rule::Credits],
        "{found:#?}"
    );
    assert!(found.len() >= 5, "{found:#?}");
    assert!(found.iter().all(|f| !f.rule.is_violation()));
}

/// Change an IPv4 RoCE frame's payload length by `delta` bytes (added as
/// zeros, or taken off, before the ICRC), or its bytes `at` (from the BTH
/// on), with the IPv4 and UDP lengths and the ICRC made right.
fn edit(frame: &mut Vec<u8>, link: LinkType, delta: isize, at: usize, bytes: &[u8]) {
    let f = rnic_wire::Frame::parse(link, frame).unwrap();
    let (ip, ib) = (f.ip_offset, f.ib_offset);
    assert_eq!(frame[ip] >> 4, 4, "an IPv4 frame");
    let end = frame.len() - 4;
    if delta >= 0 {
        frame.splice(end..end, std::iter::repeat_n(0, delta as usize));
    } else {
        frame.drain(end - delta.unsigned_abs()..end);
    }
    for off in [ip + 2, ip + 20 + 4] {
        let v = u16::from_be_bytes([frame[off], frame[off + 1]]) as isize + delta;
        frame[off..off + 2].copy_from_slice(&(v as u16).to_be_bytes());
    }
    frame[ib + at..ib + at + bytes.len()].copy_from_slice(bytes);
    let end = frame.len();
    rnic_wire::icrc::fill(&mut frame[ip..end]).unwrap();
}

/// UC streams are judged as RC's requests are, but for what needs the
/// responder: a FIRST cut short and a FIRST where a LAST belongs, in
/// rdma_rxe's UC ping-pong, are each flagged.
#[test]
fn uc_requests_are_judged_for_their_payload_and_opcode_sequence() {
    let base = frames("rxe-uc_pingpong.pcap");
    assert!(check_frames(&base).0.is_empty());
    let first_of_a = 0; // UC_SEND_FIRST, 1024 bytes
    let last_of_a = 1; // UC_SEND_LAST

    let mut cut = base.clone();
    let link = cut[first_of_a].1.unwrap();
    edit(&mut cut[first_of_a].2, link, -4, 0, &[]);
    let (found, _) = check_frames(&cut);
    assert!(
        found.len() == 1 && found[0].rule == Rule::Payload && found[0].packets == [1],
        "{found:#?}"
    );

    let mut twice = base.clone();
    let link = twice[last_of_a].1.unwrap();
    let uc_send_first = 0x20;
    edit(&mut twice[last_of_a].2, link, 0, 0, &[uc_send_first]);
    let (found, _) = check_frames(&twice);
    assert!(
        found.iter().all(|f| f.rule == Rule::OpcodeSequence)
            && found.iter().any(|f| f.packets == [2]),
        "{found:#?}"
    );
}

/// Two runs between the same two addresses whose QPs drew the same
/// numbers (rdma_rxe's ping-pong, then its 256-byte-MTU WRITE stream, both
/// to QP 0x11), in one capture: two connections on each QP number, each
/// conformant, not one whose PSNs jump. As drawn, the second's first PSN
/// lies far from the first's; moved to 5,000 PSNs after where the first
/// left off, it still begins anew, the first connection being idle.
#[test]
fn a_qp_number_used_again_is_a_new_connection() {
    let first = frames("rxe-rc_pingpong.pcap");
    let second = frames("rxe-write_bw_mtu256.pcap");
    let a = |data: &[u8], link| {
        let f = rnic_wire::Frame::parse(link, data).unwrap();
        (f.ip.src_addr().to_string() == "10.77.0.1" && f.ib.info().is_request())
            .then(|| f.ib.bth().psn())
    };
    let next = first
        .iter()
        .filter_map(|(_, link, data)| a(data, link.unwrap()))
        .next_back()
        .unwrap()
        .next();
    let begins = second
        .iter()
        .find_map(|(_, link, data)| a(data, link.unwrap()))
        .unwrap();
    let alone = |name| check_frames(&frames(name)).1.rc;
    let rc = alone("rxe-rc_pingpong.pcap") + alone("rxe-write_bw_mtu256.pcap");
    // Frame 45 acknowledges the first's last SEND from 10.77.0.1.
    let mut unacknowledged = first.clone();
    unacknowledged.remove(44);
    let near = next.add(5000).value().wrapping_sub(begins.value()) & 0xff_ffff;
    for (first, shift) in [(&first, 0), (&unacknowledged, 0), (&first, near)] {
        let both = one_after_the_other(first, second.clone(), |data, link| {
            let f = rnic_wire::Frame::parse(link, data).unwrap();
            let psn = (f.ib.bth().psn().value() + shift) & 0xff_ffff;
            edit(data, link, 0, 9, &psn.to_be_bytes()[1..]);
        });
        let (found, stats) = check_frames(&both);
        assert!(found.is_empty(), "shift {shift:#x}: {found:#?}");
        assert_eq!(stats.rc, rc, "shift {shift:#x}");
    }
}

/// The requester's QP number used again, for a connection to another QP
/// of the same peer: rdma_rxe's ping-pong between QPs 0x11, then its
/// 256-byte-MTU WRITE stream from QP 0x11 to (renumbered) QP 0x12. The
/// second's responses come to QP 0x11 as the first's did, and must be
/// taken as answers to the second's requests.
#[test]
fn responses_to_a_qp_number_used_again_answer_its_new_connection() {
    let mut renumbered = 0;
    let both = one_after_the_other(
        &frames("rxe-rc_pingpong.pcap"),
        frames("rxe-write_bw_mtu256.pcap"),
        |data, link| {
            let f = rnic_wire::Frame::parse(link, data).unwrap();
            if f.ip.src_addr().to_string() == "10.77.0.1" {
                assert_eq!(f.ib.bth().dest_qp(), 0x11);
                edit(data, link, 0, 5, &[0, 0, 0x12]);
                renumbered += 1;
            }
        },
    );
    assert!(renumbered > 100);
    let (found, stats) = check_frames(&both);
    assert!(found.is_empty(), "{found:#?}");
    assert_eq!(stats.unplaced_responses, 0);
}
