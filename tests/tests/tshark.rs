//! Every RoCE v2 packet of every reference capture, decoded by rnic-wire and by
//! Wireshark's dissector (`tshark -T json`), must agree field by field.

mod common;

use std::collections::HashMap;
use std::process::Command;

use common::{flatten, num};
use rnic_wire::pcap::PcapReader;
use rnic_wire::{Frame, IpRepr, LinkType};
use serde_json::Value;

/// tshark bytes "aa:bb:cc".
fn bytes(s: &str) -> Vec<u8> {
    s.split(':')
        .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
        .collect()
}

struct Checker<'a> {
    fields: &'a HashMap<String, Vec<String>>,
    what: String,
    compared: usize,
    /// tshark flagged the frame "Malformed Packet" and stopped dissecting: fields
    /// it did not reach are skipped, the ones it did reach must still agree.
    tshark_gave_up: bool,
}

impl Checker<'_> {
    fn theirs(&self, key: &str) -> Option<&Vec<String>> {
        let theirs = self.fields.get(key);
        assert!(
            theirs.is_some() || self.tshark_gave_up,
            "{}: tshark has no {key}",
            self.what
        );
        theirs
    }

    /// tshark must have `key` and one of its values must equal `ours`.
    fn num(&mut self, key: &str, ours: u64) {
        let Some(theirs) = self.theirs(key) else {
            return;
        };
        assert!(
            theirs.iter().any(|t| num(t) == ours),
            "{}: {key}: rnic {ours:#x}, tshark {theirs:?}",
            self.what
        );
        self.compared += 1;
    }

    fn bytes(&mut self, key: &str, ours: &[u8]) {
        let Some(theirs) = self.theirs(key) else {
            return;
        };
        assert!(
            theirs.iter().any(|t| bytes(t) == ours),
            "{}: {key}: rnic {ours:02x?}, tshark {theirs:?}",
            self.what
        );
        self.compared += 1;
    }

    fn text(&mut self, key: &str, ours: &str) {
        let Some(theirs) = self.theirs(key) else {
            return;
        };
        assert!(
            theirs.iter().any(|t| t == ours),
            "{}: {key}: rnic {ours}, tshark {theirs:?}",
            self.what
        );
        self.compared += 1;
    }
}

fn compare(frame: &Frame<'_>, fields: &HashMap<String, Vec<String>>, what: String) -> usize {
    let mut c = Checker {
        fields,
        what,
        compared: 0,
        tshark_gave_up: fields.contains_key("_ws.malformed"),
    };
    match frame.ip {
        IpRepr::V4(ip) => {
            c.text("ip.src", &ip.src_addr.to_string());
            c.text("ip.dst", &ip.dst_addr.to_string());
            c.num("ip.id", u64::from(ip.ident));
            c.num("ip.ttl", u64::from(ip.ttl));
            c.num("ip.dsfield", u64::from(ip.tos));
        }
        IpRepr::V6(ip) => {
            c.text("ipv6.src", &ip.src_addr.to_string());
            c.text("ipv6.dst", &ip.dst_addr.to_string());
            c.num("ipv6.hlim", u64::from(ip.hop_limit));
            c.num("ipv6.flow", u64::from(ip.flow_label));
        }
    }
    c.num("udp.srcport", u64::from(frame.udp.src_port));
    c.num("udp.dstport", u64::from(frame.udp.dst_port));

    let ib = &frame.ib;
    let bth = ib.bth();
    c.num("infiniband.bth.opcode", u64::from(bth.opcode().0));
    c.num("infiniband.bth.se", u64::from(bth.solicited()));
    c.num("infiniband.bth.m", u64::from(bth.mig_req()));
    c.num("infiniband.bth.padcnt", u64::from(bth.pad_count()));
    c.num("infiniband.bth.tver", u64::from(bth.tver()));
    c.num("infiniband.bth.p_key", u64::from(bth.p_key()));
    c.bytes("infiniband.reserved", &[bth.header()[4]]);
    c.num("infiniband.bth.destqp", u64::from(bth.dest_qp()));
    c.num("infiniband.bth.a", u64::from(bth.ack_req()));
    c.num("infiniband.bth.reserved7", u64::from(bth.resv7()));
    c.num("infiniband.bth.psn", u64::from(bth.psn().value()));
    if let Some(h) = ib.reth() {
        c.num("infiniband.reth.va", h.va());
        c.num("infiniband.reth.r_key", u64::from(h.r_key()));
        c.num("infiniband.reth.dmalen", u64::from(h.dma_length()));
    }
    if let Some(h) = ib.atomic_eth() {
        c.num("infiniband.reth.va", h.va());
        c.num("infiniband.reth.r_key", u64::from(h.r_key()));
        c.num("infiniband.atomiceth.swapdt", h.swap_or_add_data());
        c.num("infiniband.atomiceth.cmpdt", h.compare_data());
    }
    if let Some(h) = ib.aeth() {
        c.num("infiniband.aeth.syndrome", u64::from(h.syndrome()));
        c.num("infiniband.aeth.msn", u64::from(h.msn()));
    }
    if let Some(h) = ib.atomic_ack_eth() {
        c.num("infiniband.atomicacketh.origremdt", h.orig_rem_dt());
    }
    if let Some(h) = ib.deth() {
        c.num("infiniband.deth.q_key", u64::from(h.q_key()));
        c.num("infiniband.deth.srcqp", u64::from(h.src_qp()));
    }
    if let Some(h) = ib.immdt() {
        c.bytes("infiniband.immdt", h.header());
    }
    if let Some(h) = ib.ieth() {
        c.bytes("infiniband.ieth", h.header());
    }
    // tshark shows the ICRC as the four wire bytes read big-endian.
    c.num(
        "infiniband.invariant.crc",
        u64::from(ib.icrc().swap_bytes()),
    );
    // Wireshark 4.0 hands the payload to the "data" dissector with its pad bytes.
    if !ib.padded_payload().is_empty() {
        c.num("data.len", ib.padded_payload().len() as u64);
        c.bytes("data.data", ib.padded_payload());
    }
    c.compared
}

#[test]
fn every_field_matches_tshark() {
    if !common::tool_available("tshark", &["--version"]) {
        return;
    }
    let mut total_packets = 0;
    let mut total_fields = 0;
    let mut tshark_malformed = Vec::new();
    for path in common::captures() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        // The hardware capture's UDP source port 69 makes tshark pick TFTP.
        let out = Command::new("tshark")
            .args(["-n", "--disable-protocol", "tftp", "-T", "json", "-r"])
            .arg(&path)
            .output()
            .expect("run tshark");
        assert!(out.status.success(), "tshark failed on {name}");
        let json: Value = serde_json::from_slice(&out.stdout).expect("tshark JSON");
        let packets = json.as_array().expect("a JSON array of packets");

        let data = std::fs::read(&path).unwrap();
        let records: Vec<_> = PcapReader::new(&data)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(records.len(), packets.len(), "{name}: frame count");

        let mut roce = 0;
        for (i, (rec, pkt)) in records.iter().zip(packets).enumerate() {
            let layers = &pkt["_source"]["layers"];
            let theirs = layers.get("infiniband");
            let ours = Frame::parse(LinkType::from_pcap(rec.link_type).unwrap(), rec.data);
            let what = format!("{name} frame {}", i + 1);
            match (ours, theirs) {
                (Ok(frame), Some(_)) => {
                    assert!(frame.icrc_ok(), "{what}: ICRC does not verify");
                    let mut fields = HashMap::new();
                    flatten(layers, &mut fields);
                    if fields.contains_key("_ws.malformed") {
                        tshark_malformed.push(what.clone());
                    }
                    let n = compare(&frame, &fields, what);
                    assert!(n >= 17, "{name}: only {n} fields compared");
                    total_fields += n;
                    roce += 1;
                }
                (Err(e), None) => assert!(e.is_not_roce(), "{what}: {e}"),
                (Ok(_), None) => panic!("{what}: rnic sees RoCE v2, tshark does not"),
                (Err(e), Some(_)) => panic!("{what}: tshark sees RoCE v2, rnic says {e}"),
            }
        }
        assert!(roce > 0, "{name}: no RoCE v2 packets");
        total_packets += roce;
    }
    println!("{total_packets} packets, {total_fields} fields equal to tshark's");
    // Wireshark 4.0 throws on some short padded payloads that rdma_rxe accepted
    // and whose ICRC verifies; list them so a newer dissector can be checked.
    println!(
        "{} frames tshark called malformed (compared up to where it stopped): {:?}",
        tshark_malformed.len(),
        tshark_malformed
    );
    assert!(
        tshark_malformed.len() < 40,
        "tshark gave up on too many frames"
    );
    assert!(
        total_packets >= 4000,
        "the reference captures hold 4171 RoCE v2 packets"
    );
}
