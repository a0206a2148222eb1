//! `rnic check`'s verdict on every reference capture (rdma_rxe's, the
//! hardware NIC's, the kernel's CM's): rnic's conformance checker against
//! real devices' traffic. Every capture is conformant; where the checker
//! notes something, it is pinned here, with why (tests/captures/README.md
//! says the same).

use std::path::{Path, PathBuf};

use rnic_core::check::{Checker, Finding, Rule};
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

fn check(path: &Path) -> (Vec<Finding>, rnic_core::check::Stats) {
    let data = std::fs::read(path).unwrap();
    let mut c = Checker::new();
    for (i, r) in PcapReader::new(&data).unwrap().enumerate() {
        let r = r.unwrap();
        c.frame(
            i as u64 + 1,
            r.timestamp_ns,
            LinkType::from_pcap(r.link_type),
            r.data,
        );
    }
    c.finish()
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
