//! `rnic ladder`: the SVG of a small capture held to a golden file, the
//! HTML self-contained and carrying every packet, a large capture folded
//! into few rows, and bad input refused with a message.

use std::path::{Path, PathBuf};
use std::process::Command;

fn rnic(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args(args)
        .output()
        .expect("run rnic");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rnic-ladder-{}-{name}", std::process::id()))
}

/// The SVG of rdma_rxe's RNR capture, byte for byte as reviewed
/// (`RNIC_BLESS=1` writes it anew after a deliberate change).
#[test]
fn the_svg_of_a_small_capture_is_the_golden_one() {
    let capture = repo().join("tests/captures/rxe-ops_rnr.pcap");
    let out = temp("rnr.svg");
    let (ok, text) = rnic(&[
        "ladder",
        capture.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    let svg = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let golden = repo().join("tools/tests/golden/ladder-rxe-ops_rnr.svg");
    if std::env::var_os("RNIC_BLESS").is_some() {
        std::fs::write(&golden, &svg).unwrap();
    }
    let want = std::fs::read_to_string(&golden).unwrap();
    assert_eq!(svg, want, "the ladder differs from {}", golden.display());
    // What it must show: both QPs, the RNR NAKs in their colour, the ACK.
    assert!(svg.contains("10.77.0.1 QP 0x") && svg.contains("10.77.0.2 QP 0x"));
    assert!(svg.contains("RNR"), "{svg}");
    assert!(svg.contains("#e07b00"), "RNR NAKs in orange");
}

#[test]
fn the_html_is_self_contained_and_carries_every_packet() {
    let capture = repo().join("tests/captures/rxe-read_bw_loss3.pcap");
    let out = temp("read.html");
    let (ok, text) = rnic(&[
        "ladder",
        capture.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    let html = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    for outside in [
        "src=\"http",
        "href=\"http",
        "<link",
        "<script src",
        "@import",
        "url(",
    ] {
        assert!(
            !html.contains(outside),
            "the page reaches outside: {outside}"
        );
    }
    let start = html
        .find(r#"<script id="data" type="application/json">"#)
        .unwrap();
    let json = &html[start..];
    let json = &json[json.find('>').unwrap() + 1..json.find("</script>").unwrap()];
    let data: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(data["packets"].as_array().unwrap().len(), 239);
    assert_eq!(data["lifelines"].as_array().unwrap().len(), 2);
    // The full decode of each packet is there for a click.
    let first = &data["packets"][0];
    assert!(
        first[9].as_str().unwrap().contains("RC_RDMA_READ_REQUEST"),
        "{first}"
    );
}

/// A capture of 100,000 packets (one long WRITE stream, cut from a real
/// one) folds into a few rows: the page draws rows, not packets.
#[test]
fn a_large_capture_folds_into_few_rows() {
    use rnic_wire::pcap::{PcapReader, PcapWriter};
    let data = std::fs::read(repo().join("tests/captures/rxe-write_bw.pcap")).unwrap();
    let middle = PcapReader::new(&data)
        .unwrap()
        .map(|r| r.unwrap())
        .find(|r| {
            rnic_wire::Frame::parse(rnic_wire::LinkType::Ethernet, r.data)
                .is_ok_and(|f| f.ib.bth().opcode() == rnic_wire::Opcode::RC_RDMA_WRITE_MIDDLE)
        })
        .unwrap()
        .data
        .to_vec();
    let mut w = PcapWriter::new(Vec::new(), 1).unwrap();
    let f = rnic_wire::Frame::parse(rnic_wire::LinkType::Ethernet, &middle).unwrap();
    let (ip, ib) = (f.ip_offset, f.ib_offset);
    let mut frame = middle.clone();
    for k in 0..100_000u32 {
        frame[ib + 9..ib + 12].copy_from_slice(&k.to_be_bytes()[1..]);
        let end = frame.len();
        rnic_wire::icrc::fill(&mut frame[ip..end]).unwrap();
        w.write_packet(u64::from(k) * 1000, &frame).unwrap();
    }
    let capture = temp("large.pcap");
    std::fs::write(&capture, w.into_inner()).unwrap();
    let out = temp("large.html");
    let (ok, text) = rnic(&[
        "ladder",
        capture.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_file(&capture);
    assert!(ok, "{text}");
    let html = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let rows = html.matches(r#"["p","#).count();
    assert!(rows < 10, "{rows} rows for one run of 100,000 packets");
    assert!(html.contains("RC_RDMA_WRITE_MIDDLE"));
}

#[test]
fn bad_input_is_refused_with_a_message() {
    let junk = temp("junk.pcap");
    std::fs::write(&junk, b"not a capture at all").unwrap();
    let out = temp("junk.svg");
    let (ok, text) = rnic(&[
        "ladder",
        junk.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(text.contains("not a capture"), "{text}");
    let (ok, text) = rnic(&["ladder", junk.to_str().unwrap(), "-o", "/tmp/x.png"]);
    assert!(!ok);
    assert!(text.contains("FILE.svg or FILE.html"), "{text}");
    // A capture cut in the middle of a packet: what came before is drawn.
    let mut cut = std::fs::read(repo().join("tests/captures/rxe-ops_rnr.pcap")).unwrap();
    cut.truncate(cut.len() - 30);
    std::fs::write(&junk, &cut).unwrap();
    let (ok, text) = rnic(&[
        "ladder",
        junk.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_file(&junk);
    let _ = std::fs::remove_file(&out);
    assert!(ok, "{text}");
}
