//! The communication manager's messages against the real bytes of the Linux
//! kernel's CM (ib_cm and rdma_cm on rdma_rxe): every CM MAD of
//! `tests/captures/cm/` parses, re-emits byte for byte, and agrees field by
//! field with the independent decode beside each capture (`*.decode.txt`,
//! see `tests/captures/README.md`).

mod common;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};

use rnic_wire::cm::{self, CmaHeader, Mad, Message, Path};
use rnic_wire::mad::{GSI_QKEY, GSI_QPN, MAD_LEN};
use rnic_wire::pcap::PcapReader;
use rnic_wire::{Frame, LinkType, Opcode};

/// The decode's fields for each CM frame (by frame number): every
/// `key=value` from its MAD line on, and its private-data lines.
struct Decoded {
    fields: HashMap<String, String>,
    lines: Vec<String>,
}

fn read_decode(text: &str) -> HashMap<usize, Decoded> {
    let mut out = HashMap::new();
    let mut frame = None;
    let mut in_cm = false;
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix('#') {
            frame = rest.split_whitespace().next().and_then(|n| n.parse().ok());
            in_cm = false;
            continue;
        }
        if t.starts_with("MAD ") {
            in_cm = true;
        }
        let Some(n) = frame.filter(|_| in_cm) else {
            continue;
        };
        let d = out.entry(n).or_insert_with(|| Decoded {
            fields: HashMap::new(),
            lines: Vec::new(),
        });
        d.lines.push(t.to_string());
        // Tokens of the MAD header line and the CMA header line keep their
        // own names apart from the message's ("status", "port").
        let prefix = if t.starts_with("CMA hdr:") {
            "cma."
        } else if t.starts_with("MAD ") {
            "mad."
        } else {
            ""
        };
        for tok in t.split_whitespace() {
            if let Some((k, v)) = tok.split_once('=') {
                let v = v.trim_end_matches(';');
                let v = v.split('(').next().unwrap_or(v);
                d.fields
                    .entry(format!("{prefix}{k}"))
                    .or_insert_with(|| v.to_string());
            }
        }
    }
    out
}

fn gid_text(g: Ipv6Addr) -> String {
    match g.to_ipv4_mapped() {
        Some(v4) => v4.to_string(),
        None => g.to_string(),
    }
}

/// Our values under the decode's names.
fn ours(m: &Mad) -> HashMap<&'static str, String> {
    let h = &m.header;
    let mut f: HashMap<&'static str, String> = HashMap::from([
        ("mad.base_ver", h.base_version.to_string()),
        ("mad.class", format!("{:#04x}", h.mgmt_class)),
        ("mad.class_ver", h.class_version.to_string()),
        ("mad.method", format!("{:#04x}", h.method)),
        ("mad.status", format!("{:#06x}", h.status)),
        ("mad.class_specific", format!("{:#06x}", h.class_specific)),
        ("mad.TID", format!("{:#018x}", h.transaction_id)),
        ("mad.attr", format!("{:#06x}", h.attribute_id)),
        ("mad.attr_mod", format!("{:#010x}", h.attribute_modifier)),
    ]);
    let hex = |v: u64, w: usize| format!("{v:#0w$x}", w = w + 2);
    let path = |f: &mut HashMap<&'static str, String>, p: &Path| {
        f.insert("local_lid", hex(p.local_lid.into(), 4));
        f.insert("remote_lid", hex(p.remote_lid.into(), 4));
        f.insert("local_gid", gid_text(p.local_gid));
        f.insert("remote_gid", gid_text(p.remote_gid));
        f.insert("flow_label", format!("{:#x}", p.flow_label));
        f.insert("packet_rate", p.packet_rate.to_string());
        f.insert("traffic_class", hex(p.traffic_class.into(), 2));
        f.insert("hop_limit", p.hop_limit.to_string());
        f.insert("sl", p.sl.to_string());
        f.insert("subnet_local", u8::from(p.subnet_local).to_string());
        f.insert("local_ack_timeout", p.local_ack_timeout.to_string());
    };
    let cma = |f: &mut HashMap<&'static str, String>, pd: &[u8]| {
        if let Some(c) = CmaHeader::parse(pd) {
            f.insert("cma.version", hex(c.version.into(), 2));
            f.insert(
                "cma.ip_version",
                if c.src.is_ipv4() { "4" } else { "6" }.into(),
            );
            f.insert("cma.port", c.src_port.to_string());
            f.insert("cma.src", c.src.to_string());
            f.insert("cma.dst", c.dst.to_string());
        }
    };
    match &m.message {
        Message::Req(r) => {
            f.insert("local_comm_id", hex(r.local_comm_id.into(), 8));
            f.insert("service_id", hex(r.service_id, 16));
            f.insert("local_ca_guid", hex(r.local_ca_guid, 16));
            f.insert("local_qkey", hex(r.local_qkey.into(), 8));
            f.insert("local_qpn", hex(r.local_qpn.into(), 6));
            f.insert("responder_resources", r.responder_resources.to_string());
            f.insert("initiator_depth", r.initiator_depth.to_string());
            f.insert("local_eecn", hex(r.local_eecn.into(), 6));
            f.insert("remote_eecn", hex(r.remote_eecn.into(), 6));
            f.insert(
                "remote_cm_resp_timeout",
                r.remote_cm_response_timeout.to_string(),
            );
            f.insert("transport", r.transport_service_type.to_string());
            f.insert("e2e_fc", u8::from(r.end_to_end_flow_control).to_string());
            f.insert("starting_psn", hex(r.starting_psn.into(), 6));
            f.insert(
                "local_cm_resp_timeout",
                r.local_cm_response_timeout.to_string(),
            );
            f.insert("retry_count", r.retry_count.to_string());
            f.insert("pkey", hex(r.partition_key.into(), 4));
            f.insert("path_mtu", r.path_mtu.to_string());
            f.insert("rdc", u8::from(r.rdc_exists).to_string());
            f.insert("rnr_retry", r.rnr_retry_count.to_string());
            f.insert("max_cm_retries", r.max_cm_retries.to_string());
            f.insert("srq", u8::from(r.srq).to_string());
            f.insert("ext_transport", r.extended_transport_type.to_string());
            path(&mut f, &r.primary);
            cma(&mut f, &r.private_data);
        }
        Message::Rep(r) => {
            f.insert("local_comm_id", hex(r.local_comm_id.into(), 8));
            f.insert("remote_comm_id", hex(r.remote_comm_id.into(), 8));
            f.insert("local_qkey", hex(r.local_qkey.into(), 8));
            f.insert("local_qpn", hex(r.local_qpn.into(), 6));
            f.insert("local_eecn", hex(r.local_eecn.into(), 6));
            f.insert("starting_psn", hex(r.starting_psn.into(), 6));
            f.insert("responder_resources", r.responder_resources.to_string());
            f.insert("initiator_depth", r.initiator_depth.to_string());
            f.insert("target_ack_delay", r.target_ack_delay.to_string());
            f.insert("failover", r.failover_accepted.to_string());
            f.insert("e2e_fc", u8::from(r.end_to_end_flow_control).to_string());
            f.insert("rnr_retry", r.rnr_retry_count.to_string());
            f.insert("srq", u8::from(r.srq).to_string());
            f.insert("local_ca_guid", hex(r.local_ca_guid, 16));
        }
        Message::Rej(r) => {
            f.insert("local_comm_id", hex(r.local_comm_id.into(), 8));
            f.insert("remote_comm_id", hex(r.remote_comm_id.into(), 8));
            let answered = match r.message_rejected {
                cm::Answered::Req => 0,
                cm::Answered::Rep => 1,
                cm::Answered::Other => 2,
                cm::Answered::Reserved => 3,
            };
            f.insert("message_rejected", answered.to_string());
            f.insert("reject_info_len", r.reject_info_length.to_string());
            f.insert("reason", r.reason.to_string());
        }
        Message::Rtu(r) | Message::Drep(r) => {
            f.insert("local_comm_id", hex(r.local_comm_id.into(), 8));
            f.insert("remote_comm_id", hex(r.remote_comm_id.into(), 8));
        }
        Message::Dreq(r) => {
            f.insert("local_comm_id", hex(r.local_comm_id.into(), 8));
            f.insert("remote_comm_id", hex(r.remote_comm_id.into(), 8));
            f.insert("remote_qpn", hex(r.remote_qpn_eecn.into(), 6));
        }
        Message::SidrReq(r) => {
            f.insert("request_id", hex(r.request_id.into(), 8));
            f.insert("pkey", hex(r.partition_key.into(), 4));
            f.insert("service_id", hex(r.service_id, 16));
            cma(&mut f, &r.private_data);
        }
        Message::SidrRep(r) => {
            f.insert("request_id", hex(r.request_id.into(), 8));
            f.insert("status", r.status.to_string());
            f.insert("add_info_len", r.additional_info_length.to_string());
            f.insert("qpn", hex(r.qpn.into(), 6));
            f.insert("service_id", hex(r.service_id, 16));
            f.insert("qkey", hex(r.qkey.into(), 8));
        }
        Message::Mra(_) => {}
    }
    f
}

fn check_private_data(what: &str, m: &Message, d: &Decoded) {
    let pd = m.private_data();
    for line in &d.lines {
        if let Some(rest) = line.strip_prefix("private data: all ") {
            let n: usize = rest.split(' ').next().unwrap().parse().unwrap();
            assert_eq!(pd.len(), n, "{what}: private data length");
            assert!(pd.iter().all(|&b| b == 0), "{what}: private data not zero");
        } else if let Some(rest) = line.strip_prefix("private data: ") {
            let mut it = rest.split_whitespace();
            let n: usize = it.next().unwrap().parse().unwrap();
            assert_eq!(pd.len(), n, "{what}: private data length");
            let hex = rest.split(": ").nth(1).unwrap().split(' ').next().unwrap();
            let bytes: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            assert_eq!(&pd[..bytes.len()], &bytes[..], "{what}: private data");
            assert!(pd[bytes.len()..].iter().all(|&b| b == 0), "{what}");
        }
        if line.contains("consumer private data after the header: all zero") {
            assert!(pd[cm::CMA_HEADER_LEN..].iter().all(|&b| b == 0), "{what}");
        }
    }
}

/// What every message of a kind must have had compared, so that a decode
/// whose names drifted cannot make the test compare nothing.
fn required(m: &Message) -> &'static [&'static str] {
    match m {
        Message::Req(_) => &[
            "mad.TID",
            "local_comm_id",
            "service_id",
            "local_qpn",
            "starting_psn",
            "path_mtu",
            "flow_label",
            "local_gid",
            "remote_gid",
            "local_ack_timeout",
            "rnr_retry",
            "retry_count",
            "cma.port",
            "cma.src",
        ],
        Message::Rep(_) => &[
            "mad.TID",
            "local_comm_id",
            "remote_comm_id",
            "local_qpn",
            "starting_psn",
            "target_ack_delay",
            "local_ca_guid",
        ],
        Message::Rej(_) => &["mad.TID", "local_comm_id", "remote_comm_id", "reason"],
        Message::Rtu(_) | Message::Drep(_) => &["mad.TID", "local_comm_id", "remote_comm_id"],
        Message::Dreq(_) => &["mad.TID", "remote_qpn"],
        Message::SidrReq(_) => &["mad.TID", "request_id", "service_id", "cma.port"],
        Message::SidrRep(_) => &["mad.TID", "request_id", "qpn", "qkey", "status"],
        Message::Mra(_) => &["mad.TID"],
    }
}

fn cm_captures() -> Vec<std::path::PathBuf> {
    let dir = common::captures_dir().join("cm");
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/captures/cm exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    v.sort();
    v
}

#[test]
fn every_cm_mad_of_the_kernel_parses_re_emits_and_matches_the_decode() {
    let files = cm_captures();
    assert_eq!(files.len(), 12, "the CM reference captures");
    let (mut mads, mut fields) = (0, 0);
    let mut kinds = HashMap::new();
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let decode = std::fs::read_to_string(path.with_extension("decode.txt")).unwrap();
        let decoded = read_decode(&decode);
        let data = std::fs::read(&path).unwrap();
        let mut seen = 0;
        for (i, rec) in PcapReader::new(&data).unwrap().enumerate() {
            let rec = rec.unwrap();
            let what = format!("{name} frame {}", i + 1);
            let frame = Frame::parse(LinkType::from_pcap(rec.link_type).unwrap(), rec.data)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let bth = frame.ib.bth();
            if bth.dest_qp() != GSI_QPN {
                continue;
            }
            // What every CM packet of the kernel is (the captures' README).
            assert_eq!(bth.opcode(), Opcode::UD_SEND_ONLY, "{what}");
            assert_eq!(bth.p_key(), 0xFFFF, "{what}");
            let deth = frame.ib.deth().unwrap();
            assert_eq!((deth.q_key(), deth.src_qp()), (GSI_QKEY, GSI_QPN), "{what}");
            assert_eq!(frame.udp.src_port, 55410, "{what}: QP1's UDP source port");
            let payload = frame.ib.payload();
            assert_eq!(payload.len(), MAD_LEN, "{what}");
            let mad = Mad::parse(payload).unwrap_or_else(|e| panic!("{what}: {e}"));
            let mut again = [0u8; MAD_LEN];
            mad.emit(&mut again);
            assert_eq!(&again[..], payload, "{what}: re-emitted bytes differ");

            let d = decoded
                .get(&(i + 1))
                .unwrap_or_else(|| panic!("{what}: not in the decode"));
            let ours = ours(&mad);
            let mut compared = Vec::new();
            for (k, theirs) in &d.fields {
                if let Some(v) = ours.get(k.as_str()) {
                    assert_eq!(v, theirs, "{what}: {k}");
                    compared.push(k.as_str());
                }
            }
            for k in required(&mad.message) {
                assert!(compared.contains(k), "{what}: {k} not compared");
            }
            check_private_data(&what, &mad.message, d);
            // rdma_cm's service ID, the kernel's flow label and its
            // transaction ID, from the REQ's own fields.
            if let Message::Req(r) = &mad.message {
                let hi = (mad.header.transaction_id >> 32) as u32;
                assert_eq!(
                    mad.header.transaction_id,
                    cm::kernel_tid(hi, r.local_comm_id),
                    "{what}"
                );
                let (_, port) = cm::rdma_cm_port(r.service_id).expect("an rdma_cm service ID");
                let h = CmaHeader::parse(&r.private_data).unwrap();
                assert_eq!(
                    r.primary.flow_label,
                    cm::rdma_cm_flow_label(h.src_port, port),
                    "{what}"
                );
                assert!(
                    matches!(
                        (h.src, IpAddr::from(r.primary.local_gid)),
                        (IpAddr::V4(a), IpAddr::V6(g)) if g.to_ipv4_mapped() == Some(a)
                    ) || IpAddr::from(r.primary.local_gid) == h.src
                );
            }
            *kinds.entry(mad.message.name()).or_insert(0) += 1;
            fields += compared.len();
            mads += 1;
            seen += 1;
        }
        assert!(seen > 0, "{name}: no CM MAD");
        assert_eq!(seen, decoded.len(), "{name}: CM frames in the decode");
    }
    println!("{mads} CM MADs, {fields} fields equal to the decode's: {kinds:?}");
    for k in [
        "REQ", "REP", "RTU", "REJ", "DREQ", "DREP", "SIDR_REQ", "SIDR_REP",
    ] {
        assert!(kinds.contains_key(k), "no {k} in the captures");
    }
}

/// The RC data of a connection the kernel made through the CM leaves from
/// the UDP port it derives from the REQ's flow label, both ways.
#[test]
fn the_data_path_s_udp_port_follows_the_req_s_flow_label() {
    let path = common::captures_dir().join("cm/cm-rping.pcap");
    let data = std::fs::read(path).unwrap();
    let mut port = None;
    let mut data_packets = 0;
    for rec in PcapReader::new(&data).unwrap() {
        let rec = rec.unwrap();
        let frame = Frame::parse(LinkType::from_pcap(rec.link_type).unwrap(), rec.data).unwrap();
        if frame.ib.bth().dest_qp() == GSI_QPN {
            if let Ok(Mad {
                message: Message::Req(r),
                ..
            }) = Mad::parse(frame.ib.payload())
            {
                port = Some(cm::flow_label_udp_sport(r.primary.flow_label));
            }
        } else {
            assert_eq!(Some(frame.udp.src_port), port);
            data_packets += 1;
        }
    }
    assert_eq!(data_packets, 36);
}

/// tshark's CM dissector (what Wireshark 4.0 has of one: no MRA, no SIDR)
/// agrees with every field both decode, but the REQ's flow label and packet
/// rate word, which tshark misreads (see `tests/captures/cm/README.md`).
#[test]
fn tshark_s_cm_dissector_agrees() {
    if !common::tool_available("tshark", &["--version"]) {
        return;
    }
    let mut compared = 0;
    for path in cm_captures() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let out = std::process::Command::new("tshark")
            .args(["-n", "-T", "json", "-r"])
            .arg(&path)
            .output()
            .expect("run tshark");
        assert!(out.status.success(), "tshark failed on {name}");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let data = std::fs::read(&path).unwrap();
        let records: Vec<_> = PcapReader::new(&data)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        for (i, (rec, pkt)) in records.iter().zip(json.as_array().unwrap()).enumerate() {
            let what = format!("{name} frame {}", i + 1);
            let frame =
                Frame::parse(LinkType::from_pcap(rec.link_type).unwrap(), rec.data).unwrap();
            if frame.ib.bth().dest_qp() != GSI_QPN {
                continue;
            }
            let mad = Mad::parse(frame.ib.payload()).unwrap();
            let mut fields = HashMap::new();
            common::flatten(&pkt["_source"]["layers"], &mut fields);
            let h = &mad.header;
            let mut want: Vec<(&str, u64)> = vec![
                ("infiniband.mad.mgmtclass", h.mgmt_class.into()),
                ("infiniband.mad.method", h.method.into()),
                ("infiniband.mad.transactionid", h.transaction_id),
                ("infiniband.mad.attributeid", h.attribute_id.into()),
            ];
            match &mad.message {
                Message::Req(r) => want.extend([
                    ("infiniband.cm.req", u64::from(r.local_comm_id)),
                    ("infiniband.cm.req.serviceid", r.service_id),
                    ("infiniband.cm.req.localcaguid", r.local_ca_guid),
                    ("infiniband.cm.req.localqpn", r.local_qpn.into()),
                    (
                        "infiniband.cm.req.responderres",
                        r.responder_resources.into(),
                    ),
                    ("infiniband.cm.req.initdepth", r.initiator_depth.into()),
                    (
                        "infiniband.cm.req.remoteresptout",
                        r.remote_cm_response_timeout.into(),
                    ),
                    ("infiniband.cm.req.startpsn", r.starting_psn.into()),
                    (
                        "infiniband.cm.req.localresptout",
                        r.local_cm_response_timeout.into(),
                    ),
                    ("infiniband.cm.req.retrcount", r.retry_count.into()),
                    ("infiniband.cm.req.pkey", r.partition_key.into()),
                    ("infiniband.cm.req.pppmtu", r.path_mtu.into()),
                    ("infiniband.cm.req.rnrretrcount", r.rnr_retry_count.into()),
                    ("infiniband.cm.req.maxcmretr", r.max_cm_retries.into()),
                    ("infiniband.cm.req.srq", r.srq.into()),
                    (
                        "infiniband.cm.req.prim_locallid",
                        r.primary.local_lid.into(),
                    ),
                    ("infiniband.cm.req.prim_hoplim", r.primary.hop_limit.into()),
                    ("infiniband.cm.req.prim_sl", r.primary.sl.into()),
                    (
                        "infiniband.cm.req.prim_localacktout",
                        r.primary.local_ack_timeout.into(),
                    ),
                ]),
                Message::Rep(r) => want.extend([
                    (
                        "infiniband.cm.rep.remotecommid",
                        u64::from(r.remote_comm_id),
                    ),
                    ("infiniband.cm.rep.localqpn", r.local_qpn.into()),
                    ("infiniband.cm.rep.startpsn", r.starting_psn.into()),
                    ("infiniband.cm.rep.respres", r.responder_resources.into()),
                    ("infiniband.cm.rep.initdepth", r.initiator_depth.into()),
                    ("infiniband.cm.rep.tgtackdelay", r.target_ack_delay.into()),
                    ("infiniband.cm.rep.rnrretrcount", r.rnr_retry_count.into()),
                    ("infiniband.cm.rep.localcaguid", r.local_ca_guid),
                ]),
                Message::Rej(r) => want.extend([
                    ("infiniband.cm.rej.localcommid", u64::from(r.local_comm_id)),
                    ("infiniband.cm.rej.remotecommid", r.remote_comm_id.into()),
                    ("infiniband.cm.rej.reason", r.reason.into()),
                    ("infiniband.cm.rej.rejinfolen", r.reject_info_length.into()),
                ]),
                Message::Rtu(r) => want.extend([
                    ("infiniband.cm.rtu.localcommid", u64::from(r.local_comm_id)),
                    ("infiniband.cm.rtu.remotecommid", r.remote_comm_id.into()),
                ]),
                Message::Dreq(r) => want.extend([
                    ("infiniband.cm.dreq.localcommid", u64::from(r.local_comm_id)),
                    ("infiniband.cm.dreq.remotecommid", r.remote_comm_id.into()),
                ]),
                Message::Drep(r) => want.extend([
                    ("infiniband.cm.drsp.localcommid", u64::from(r.local_comm_id)),
                    ("infiniband.cm.drsp.remotecommid", r.remote_comm_id.into()),
                ]),
                // Not dissected by tshark 4.0.
                Message::Mra(_) | Message::SidrReq(_) | Message::SidrRep(_) => {}
            }
            for (key, ours) in want {
                let theirs = fields
                    .get(key)
                    .and_then(|v| v.first())
                    .unwrap_or_else(|| panic!("{what}: tshark has no {key}"));
                assert_eq!(common::num(theirs), ours, "{what}: {key}");
                compared += 1;
            }
        }
    }
    println!("{compared} CM fields equal to tshark's");
    assert!(compared > 600, "only {compared} fields compared");
}

/// Where the kernel's QPs started sending, as rnic's `QpSetup` reads REQ
/// and REP: each side's Starting PSN is the first it receives, so the
/// active side's requests start at the REP's and the passive side's at the
/// REQ's (ib_cm's `sq_psn`/`rq_psn`; rnic read them the other way round
/// once, and only rnic could talk to it).
#[test]
fn qp_setups_start_where_the_kernel_s_qps_started() {
    use rnic_verbs::cm::{AcceptParams, ConnectParams, QpSetup};
    let mut checked = 0;
    for path in cm_captures() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let data = std::fs::read(&path).unwrap();
        let mut reqs = HashMap::new();
        let mut setups = Vec::new();
        // The first request each QP sent, by destination address and QP
        // (both of the kernel's devices number QPs from 0x11).
        let mut first_request: HashMap<(IpAddr, u32), u32> = HashMap::new();
        for rec in PcapReader::new(&data).unwrap() {
            let rec = rec.unwrap();
            let frame =
                Frame::parse(LinkType::from_pcap(rec.link_type).unwrap(), rec.data).unwrap();
            let bth = frame.ib.bth();
            if bth.dest_qp() != GSI_QPN {
                let is_request = bth.opcode().info().is_some_and(|i| i.is_request());
                if is_request {
                    first_request
                        .entry((frame.ip.dst_addr(), bth.dest_qp()))
                        .or_insert(bth.psn().value());
                }
                continue;
            }
            let (src, dst) = (frame.ip.src_addr(), frame.ip.dst_addr());
            match Mad::parse(frame.ib.payload()).unwrap().message {
                Message::Req(r) if r.transport_service_type == 0 => {
                    reqs.insert(r.local_comm_id, (r, src, dst));
                }
                Message::Rep(p) => {
                    let Some((r, active, passive)) = reqs.get(&p.remote_comm_id).cloned() else {
                        continue;
                    };
                    let connect = ConnectParams {
                        service_id: r.service_id,
                        qpn: r.local_qpn,
                        starting_psn: r.starting_psn,
                        responder_resources: r.responder_resources,
                        initiator_depth: r.initiator_depth,
                        retry_count: r.retry_count,
                        rnr_retry_count: r.rnr_retry_count,
                        path_mtu: r.path_mtu,
                        path: r.primary,
                        transport: 0,
                        private_data: r.private_data.to_vec(),
                    };
                    let accept = AcceptParams {
                        qpn: p.local_qpn,
                        starting_psn: p.starting_psn,
                        responder_resources: p.responder_resources,
                        initiator_depth: p.initiator_depth,
                        rnr_retry_count: p.rnr_retry_count,
                        private_data: Vec::new(),
                    };
                    let a = QpSetup::active(&connect, &p, active, passive);
                    let mtu = rnic_verbs::Mtu::Mtu4096;
                    let b = QpSetup::passive(&r, active, passive, &accept, mtu);
                    assert_eq!((a.sq_psn, a.rq_psn), (b.rq_psn, b.sq_psn), "{name}");
                    setups.push((a, b, (active, r.local_qpn), (passive, p.local_qpn)));
                }
                _ => {}
            }
        }
        for (a, b, active_qpn, passive_qpn) in setups {
            if let Some(&psn) = first_request.get(&passive_qpn) {
                assert_eq!(psn, a.sq_psn, "{name}: the active side's first request");
                checked += 1;
            }
            if let Some(&psn) = first_request.get(&active_qpn) {
                assert_eq!(psn, b.sq_psn, "{name}: the passive side's first request");
                checked += 1;
            }
        }
    }
    assert!(checked >= 10, "{checked} first requests checked");
    println!("{checked} first requests start where QpSetup says");
}
