//! What the engine puts on the wire, judged by independent tools: the
//! simulator's capture of a lossy run goes to Scapy (every ICRC recomputed by
//! `scapy.contrib.roce`) and to tshark (every frame decoded as InfiniBand, none
//! malformed, opcodes and PSNs as rnic-wire reads them).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use rnic_core::sim::LinkConfig;
use rnic_core::wr::{SendOp, WcStatus};
use rnic_wire::pcap::PcapReader;
use rnic_wire::{Frame, LinkType};

fn tool(program: &str, probe: &[&str]) -> bool {
    let ok = Command::new(program)
        .args(probe)
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("RNIC_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "{program} is required (RNIC_REQUIRE_TOOLS=1)"
        );
        eprintln!("NOTE: {program} is not installed; this check did nothing");
    }
    ok
}

/// A run with every operation over a lossy, duplicating, reordering link.
fn capture() -> Vec<u8> {
    let params = Params {
        link: LinkConfig {
            loss: 0.1,
            duplicate: 0.1,
            corrupt: 0.0, // corrupted frames are the network's, not the engine's
            delay: Duration::from_micros(5),
            jitter: Duration::from_micros(10),
        },
        ..Params::default()
    };
    let mut p = Pair::new(21, &params);
    p.c.net.record_pcap();
    p.write_a(0, &(0..8192u32).map(|i| i as u8).collect::<Vec<_>>());
    let rkey = p.b.mr.rkey;
    p.recv_b(1, 100_000, 4096);
    p.post(1, SendOp::send_imm(7), p.sge_a(0, 3000));
    p.post(2, SendOp::write(B_IOVA, rkey), p.sge_a(0, 5000));
    p.post(3, SendOp::write_imm(B_IOVA, rkey, 9), p.sge_a(0, 1));
    p.recv_b(2, 110_000, 16);
    p.post(4, SendOp::read(B_IOVA, rkey), p.sge_a(50_000, 5000));
    p.post(
        5,
        SendOp::compare_swap(B_IOVA + 8, rkey, 0, 1),
        p.sge_a(60_000, 8),
    );
    p.post(
        6,
        SendOp::fetch_add(B_IOVA + 16, rkey, 3),
        p.sge_a(60_008, 8),
    );
    p.run();
    let c = p.completions(0);
    assert!(
        c.len() == 6 && c.iter().all(|c| c.status == WcStatus::Success),
        "{c:?}"
    );
    p.c.net.pcap()
}

#[test]
fn every_frame_parses_and_verifies_in_rnic_wire() {
    let pcap = capture();
    let mut n = 0;
    for rec in PcapReader::new(&pcap).unwrap() {
        let f = Frame::parse(LinkType::Ethernet, rec.unwrap().data).unwrap();
        assert!(f.icrc_ok());
        n += 1;
    }
    assert!(n > 30, "{n} frames");
}

#[test]
fn scapy_recomputes_every_icrc() {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    if !tool(&python, &["-c", "import scapy.contrib.roce"]) {
        return;
    }
    let path = std::env::temp_dir().join(format!("rnic-sim-{}.pcap", std::process::id()));
    std::fs::write(&path, capture()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/scapy/vectors.py");
    let out = Command::new(python)
        .arg(script)
        .arg("check")
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "Scapy disagrees:\n{text}");
    assert!(text.contains(" passed, 0 failed"), "{text}");
}

#[test]
fn tshark_decodes_every_frame() {
    if !tool("tshark", &["--version"]) {
        return;
    }
    let pcap = capture();
    let path = std::env::temp_dir().join(format!("rnic-sim-ts-{}.pcap", std::process::id()));
    std::fs::write(&path, &pcap).unwrap();
    let out = Command::new("tshark")
        .args([
            "-n",
            "-T",
            "fields",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "infiniband.bth.psn",
            "-e",
            "_ws.malformed",
            "-r",
        ])
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let ours: Vec<(u8, u32)> = PcapReader::new(&pcap)
        .unwrap()
        .map(|r| {
            let f = Frame::parse(LinkType::Ethernet, r.unwrap().data).unwrap();
            (f.ib.bth().opcode().0, f.ib.bth().psn().value())
        })
        .collect();
    let theirs: Vec<(u8, u32)> = text
        .lines()
        .map(|l| {
            let cols: Vec<&str> = l.split('\t').collect();
            assert!(
                cols.len() < 3 || cols[2].is_empty(),
                "tshark: malformed frame: {l}"
            );
            (
                cols[0].parse().expect("an opcode"),
                cols[1].parse().expect("a PSN"),
            )
        })
        .collect();
    assert_eq!(ours, theirs);
}
