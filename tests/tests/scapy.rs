//! Independent vectors: packets built by Scapy (`scapy.contrib.roce`) verify under
//! rnic and carry the fields Scapy put there; packets rnic builds verify under
//! Scapy's `compute_icrc`. IPv4 and IPv6, with the masked fields (TOS/traffic
//! class, TTL/hop limit, flow label, FECN/BECN) set at random so the masking is
//! exercised.

mod common;

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::process::Command;

use rnic_wire::encap::{ethernet, ipv4, ipv6};
use rnic_wire::opcode::OPCODES;
use rnic_wire::pcap::{PcapReader, PcapWriter};
use rnic_wire::{Frame, FrameRepr, IpRepr, LinkType};
use serde_json::Value;

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scapy/vectors.py")
}

fn scapy_available() -> bool {
    common::tool_available(&common::python(), &["-c", "import scapy.contrib.roce"])
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

#[test]
fn scapy_packets_verify_under_rnic() {
    if !scapy_available() {
        return;
    }
    let dir = common::TempDir::new("scapy-make");
    let pcap = dir.0.join("scapy.pcap");
    let json = dir.0.join("scapy.json");
    let out = Command::new(common::python())
        .arg(script())
        .arg("make")
        .args([&pcap, &json])
        .output()
        .expect("run vectors.py");
    assert!(
        out.status.success(),
        "vectors.py make: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let expected = expected.as_array().unwrap();
    let data = std::fs::read(&pcap).unwrap();
    let records: Vec<_> = PcapReader::new(&data)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(records.len(), expected.len());
    assert!(records.len() >= 200);
    let (mut v4, mut v6) = (0, 0);
    for (i, (rec, exp)) in records.iter().zip(expected).enumerate() {
        let f = Frame::parse(LinkType::Ethernet, rec.data)
            .unwrap_or_else(|e| panic!("Scapy packet {i}: {e}"));
        assert!(f.icrc_ok(), "Scapy packet {i}: ICRC does not verify");
        match f.ip {
            IpRepr::V4(_) => v4 += 1,
            IpRepr::V6(_) => v6 += 1,
        }
        assert_eq!(exp["v6"].as_bool().unwrap(), matches!(f.ip, IpRepr::V6(_)));
        let bth = f.ib.bth();
        let field = |k: &str| exp[k].as_u64().unwrap();
        assert_eq!(u64::from(bth.opcode().0), field("opcode"), "packet {i}");
        assert_eq!(u64::from(bth.solicited()), field("solicited"));
        assert_eq!(u64::from(bth.mig_req()), field("migreq"));
        assert_eq!(u64::from(bth.pad_count()), field("padcount"));
        assert_eq!(u64::from(bth.p_key()), field("pkey"));
        assert_eq!(u64::from(bth.fecn()), field("fecn"));
        assert_eq!(u64::from(bth.becn()), field("becn"));
        assert_eq!(u64::from(bth.dest_qp()), field("dqpn"));
        assert_eq!(u64::from(bth.ack_req()), field("ackreq"));
        assert_eq!(u64::from(bth.psn().value()), field("psn"));
        let ext = &f.ib.as_bytes()[12..f.ib.header_len()];
        assert_eq!(ext, hex(exp["ext"].as_str().unwrap()), "packet {i} headers");
        assert_eq!(f.ib.payload(), hex(exp["payload"].as_str().unwrap()));
        assert_eq!(
            f.ib.icrc().to_le_bytes().to_vec(),
            hex(exp["icrc"].as_str().unwrap())
        );
    }
    assert!(v4 >= 100 && v6 >= 100, "{v4} IPv4, {v6} IPv6");
}

#[test]
fn rnic_packets_verify_under_scapy() {
    if !scapy_available() {
        return;
    }
    let dir = common::TempDir::new("scapy-check");
    let pcap = dir.0.join("rnic.pcap");
    let mut w = PcapWriter::new(std::fs::File::create(&pcap).unwrap(), 1).unwrap();
    let mut next = common::rng(0x5ca9);
    let mut count = 0;
    for round in 0..4 {
        for info in OPCODES {
            let payload_len = [0usize, 1, 3, 4, 255, 1024, 4093, 4096][(next() % 8) as usize];
            let ib = common::ib_repr_for(info, payload_len, &mut next);
            let ip = if round % 2 == 0 {
                let mut r =
                    ipv4::Repr::new(Ipv4Addr::new(10, 77, 0, 1), Ipv4Addr::new(10, 77, 0, 2));
                r.tos = next() as u8;
                r.ttl = next() as u8;
                r.ident = next() as u16;
                IpRepr::V4(r)
            } else {
                let mut r = ipv6::Repr::new(
                    "fd00::1".parse::<Ipv6Addr>().unwrap(),
                    "fd00::2".parse::<Ipv6Addr>().unwrap(),
                );
                r.traffic_class = next() as u8;
                r.flow_label = next() as u32 & 0xF_FFFF;
                r.hop_limit = next() as u8;
                IpRepr::V6(r)
            };
            let frame = FrameRepr {
                ethernet: Some(ethernet::Repr::default()),
                ip,
                src_port: 0xC000 | next() as u16,
                ib,
            };
            let payload: Vec<u8> = (0..ib.payload_len).map(|_| next() as u8).collect();
            let mut buf = vec![0u8; frame.buffer_len()];
            frame.emit(&mut buf, &payload).unwrap();
            w.write_packet(count, &buf).unwrap();
            count += 1;
        }
    }
    w.flush().unwrap();
    drop(w);
    let out = Command::new(common::python())
        .arg(script())
        .arg("check")
        .arg(&pcap)
        .output()
        .expect("run vectors.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "Scapy disagrees:\n{stdout}");
    assert!(
        stdout.contains(&format!("{count} passed, 0 failed")),
        "Scapy checked a different number of packets than the {count} written:\n{stdout}"
    );
}
