//! `rnic ladder CAPTURE -o out.svg|out.html`: a sequence diagram of a
//! capture, one lifeline per endpoint (address and QP), one arrow per
//! packet labelled with what explains it: opcode, PSN, AckReq, the RETH
//! length, the AETH's syndrome and MSN, immediate data. ACKs, NAKs, RNR
//! NAKs, READ responses and atomic answers each have their colour;
//! retransmissions are dashed; long silences are compressed to one
//! labelled row; runs of the same opcode at consecutive PSNs fold into one
//! arrow ("RC_RDMA_WRITE_MIDDLE x 62").
//!
//! The SVG is the whole diagram, for a document or a small capture. The
//! HTML is one self-contained file (no network access: its script and
//! data are inside) that draws only the rows in view, so that a capture
//! of 100,000 packets stays usable; a click on a row shows the packet's
//! full decode, a folded run opens on a click, and it filters by QP, PSN
//! range and time.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::io;
use std::net::IpAddr;

use rnic_wire::aeth::{NakCode, Syndrome};
use rnic_wire::pcap::PcapStream;
use rnic_wire::{Frame, LinkType, Operation, Transport};

/// Rows shorter than this many runs of one opcode stay unfolded.
const FOLD_AT: usize = 4;
/// A silence at least this long (ns) becomes a labelled gap row.
const GAP_NS: u64 = 1_000_000;
/// Geometry of the SVG.
const ROW: usize = 22;
const TOP: usize = 56;
const LEFT: usize = 150;
const LANE: usize = 210;

/// What a packet is, for its colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Request,
    Ack,
    Nak,
    Rnr,
    ReadResponse,
    AtomicAck,
    Datagram,
    Cm,
}

impl Kind {
    fn colour(self) -> &'static str {
        match self {
            Kind::Request => "#1f5fbf",
            Kind::Ack => "#2e8b3a",
            Kind::Nak => "#d02020",
            Kind::Rnr => "#e07b00",
            Kind::ReadResponse => "#008b8b",
            Kind::AtomicAck => "#7b3fb5",
            Kind::Datagram => "#555555",
            Kind::Cm => "#8a6d00",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Kind::Request => "request",
            Kind::Ack => "ACK",
            Kind::Nak => "NAK",
            Kind::Rnr => "RNR NAK",
            Kind::ReadResponse => "READ response",
            Kind::AtomicAck => "atomic ACK",
            Kind::Datagram => "datagram",
            Kind::Cm => "CM (QP 1)",
        }
    }
}

/// One packet of the diagram.
#[derive(Debug, Clone)]
struct Packet {
    n: u64,
    t: u64,
    src: usize,
    dst: usize,
    opcode: String,
    label: String,
    kind: Kind,
    psn: u32,
    /// A request sent again (its PSN seen before on its stream).
    again: bool,
    /// The destination QP (for the filter).
    qp: u32,
    /// The full decode (HTML only).
    detail: String,
    /// `rnic check` finds a violation this packet shows.
    violation: bool,
}

/// A row: one packet, a folded run of them, or a silence.
#[derive(Debug, Clone)]
enum Row {
    Packets { first: usize, count: usize },
    Gap { ns: u64 },
}

/// The capture as the diagram sees it.
struct Ladder {
    lifelines: Vec<String>,
    packets: Vec<Packet>,
    rows: Vec<Row>,
    skipped: u64,
}

/// What to draw.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Only packets to or from this QP.
    pub qp: Option<u32>,
    /// Only PSNs in this range.
    pub psn: Option<(u32, u32)>,
    /// Only packets in this time range (seconds from the first packet).
    pub time: Option<(f64, f64)>,
    /// Draw every packet, folding nothing.
    pub no_fold: bool,
}

fn endpoint_name(ip: IpAddr, qp: Option<u32>) -> String {
    match qp {
        Some(q) => format!("{ip} QP {q:#x}"),
        None => format!("{ip} QP ?"),
    }
}

/// Read `data` (a pcap or pcapng file) into a ladder.
fn read(input: impl io::Read, opts: &Options, detail: bool) -> io::Result<Ladder> {
    let reader = PcapStream::new(input)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("not a capture: {e}")))?;
    // The conformance checker, fed as the packets go by, pairs each
    // connection's two directions by PSN (and says what it finds wrong):
    // a packet's source QP is the peer's of its connection.
    let mut checker = rnic_core::check::Checker::new();
    // What each packet says; the source QP is learned below.
    struct Raw {
        t: u64,
        src: IpAddr,
        dst: IpAddr,
        dst_qp: u32,
        src_qp: Option<u32>,
        p: Packet,
    }
    let mut raws = Vec::new();
    let mut skipped = 0;
    let mut t0 = None;
    // Per direction, the destination QPs seen: the reverse direction's
    // tells a packet's source QP, when there is one.
    let mut qps_to: HashMap<(IpAddr, IpAddr), HashSet<u32>> = HashMap::new();
    let mut seen_psn: HashSet<(IpAddr, IpAddr, u32, u32)> = HashSet::new();
    for (i, rec) in reader.enumerate() {
        let Ok(rec) = rec else { break };
        let n = i as u64 + 1;
        checker.frame(
            n,
            rec.timestamp_ns,
            LinkType::from_pcap(rec.link_type),
            &rec.data,
        );
        let Some(f) =
            LinkType::from_pcap(rec.link_type).and_then(|l| Frame::parse(l, &rec.data).ok())
        else {
            skipped += 1;
            continue;
        };
        let t = rec
            .timestamp_ns
            .saturating_sub(*t0.get_or_insert(rec.timestamp_ns));
        let ib = &f.ib;
        let info = ib.info();
        let bth = ib.bth();
        let (src, dst) = (f.ip.src_addr(), f.ip.dst_addr());
        let dst_qp = bth.dest_qp();
        let psn = bth.psn().value();
        let syndrome = ib.aeth().map(|a| Syndrome::from_byte(a.syndrome()));
        let kind = if dst_qp == 1 {
            Kind::Cm
        } else if info.transport == Transport::Ud {
            Kind::Datagram
        } else {
            match (info.operation, syndrome) {
                (Operation::Acknowledge, Some(Syndrome::RnrNak { .. })) => Kind::Rnr,
                (Operation::Acknowledge, Some(Syndrome::Nak(_) | Syndrome::Reserved(_))) => {
                    Kind::Nak
                }
                (Operation::Acknowledge, _) => Kind::Ack,
                (Operation::RdmaReadResponse, _) => Kind::ReadResponse,
                (Operation::AtomicAcknowledge, _) => Kind::AtomicAck,
                _ => Kind::Request,
            }
        };
        let mut label = format!("{} {psn:#08x}", info.name);
        if bth.ack_req() {
            label.push_str(" A");
        }
        if let Some(r) = ib.reth() {
            let _ = write!(label, " len={}", r.dma_length());
        }
        match syndrome {
            Some(Syndrome::Ack { .. }) => {}
            Some(Syndrome::Nak(NakCode::PsnSeqError)) => label.push_str(" NAK seq"),
            Some(s) => {
                let _ = write!(label, " {s}");
            }
            None => {}
        }
        if let Some(a) = ib.aeth() {
            let _ = write!(label, " msn={}", a.msn());
        }
        if let Some(i) = ib.immdt() {
            let _ = write!(label, " imm={:#x}", i.immediate());
        }
        let again = kind == Kind::Request && !seen_psn.insert((src, dst, dst_qp, psn));
        qps_to.entry((src, dst)).or_default().insert(dst_qp);
        let detail = if detail {
            let mut v = Vec::new();
            let time = format!("{}.{:06}", t / 1_000_000_000, t % 1_000_000_000 / 1000);
            let _ = crate::dump::write_line(&mut v, n as usize, &time, &f);
            let _ = crate::dump::write_tree(&mut v, &f);
            String::from_utf8_lossy(&v).into_owned()
        } else {
            String::new()
        };
        raws.push(Raw {
            t,
            src,
            dst,
            dst_qp,
            src_qp: ib.deth().map(|d| d.src_qp()),
            p: Packet {
                n,
                t,
                src: 0,
                dst: 0,
                opcode: info.name.to_string(),
                label,
                kind,
                psn,
                again,
                qp: dst_qp,
                detail,
                violation: false,
            },
        });
    }
    let mut peer_of: HashMap<(IpAddr, IpAddr, u32), u32> = HashMap::new();
    for ((a, qa), (b, qb)) in checker.connections() {
        peer_of.insert((a, b, qb), qa);
        peer_of.insert((b, a, qa), qb);
    }
    let (findings, _) = checker.finish();
    let mut flagged: HashMap<u64, Vec<String>> = HashMap::new();
    for f in findings.iter().filter(|f| f.rule.is_violation()) {
        for &n in &f.packets {
            flagged.entry(n).or_default().push(f.to_string());
        }
    }
    let mut lifelines: Vec<String> = Vec::new();
    let mut index: HashMap<(IpAddr, Option<u32>), usize> = HashMap::new();
    let mut lane = |ip: IpAddr, qp: Option<u32>| -> usize {
        *index.entry((ip, qp)).or_insert_with(|| {
            lifelines.push(endpoint_name(ip, qp));
            lifelines.len() - 1
        })
    };
    let mut packets = Vec::new();
    for r in raws {
        let src_qp = r
            .src_qp
            .or_else(|| peer_of.get(&(r.src, r.dst, r.dst_qp)).copied())
            .or_else(|| {
                // The source of a packet a -> b is the QP b's packets to a go to,
                // when there is one (QP 1 answers QP 1).
                if r.dst_qp == 1 {
                    return Some(1);
                }
                let back = qps_to.get(&(r.dst, r.src))?;
                let mut data: Vec<u32> = back.iter().copied().filter(|&q| q != 1).collect();
                data.sort_unstable();
                (data.len() == 1).then(|| data[0])
            });
        let keep = opts.qp.is_none_or(|q| r.dst_qp == q || src_qp == Some(q))
            && opts.psn.is_none_or(|(a, b)| (a..=b).contains(&r.p.psn))
            && opts
                .time
                .is_none_or(|(a, b)| (a..=b).contains(&(r.t as f64 / 1e9)));
        if !keep {
            continue;
        }
        let mut p = r.p;
        if let Some(why) = flagged.get(&p.n) {
            p.violation = true;
            p.label.push_str(" [!]");
            for w in why {
                p.detail.push_str("\nrnic check: ");
                p.detail.push_str(w);
            }
        }
        p.src = lane(r.src, src_qp);
        p.dst = lane(r.dst, Some(r.dst_qp));
        packets.push(p);
    }
    let rows = fold(&packets, !opts.no_fold);
    Ok(Ladder {
        lifelines,
        packets,
        rows,
        skipped,
    })
}

/// The rows: runs of one opcode between the same two lifelines at
/// consecutive PSNs fold (when `fold`), silences become gap rows.
fn fold(packets: &[Packet], fold: bool) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut i = 0;
    while i < packets.len() {
        if i > 0 {
            let dt = packets[i].t.saturating_sub(packets[i - 1].t);
            if dt >= GAP_NS {
                rows.push(Row::Gap { ns: dt });
            }
        }
        let mut j = i + 1;
        if fold {
            while j < packets.len() {
                let (a, b) = (&packets[j - 1], &packets[j]);
                let same = a.src == b.src
                    && a.dst == b.dst
                    && a.opcode == b.opcode
                    && a.again == b.again
                    && b.psn == (a.psn + 1) & 0xFF_FFFF
                    && b.t.saturating_sub(a.t) < GAP_NS;
                if !same {
                    break;
                }
                j += 1;
            }
            if j - i < FOLD_AT {
                j = i + 1;
            }
        }
        rows.push(Row::Packets {
            first: i,
            count: j - i,
        });
        i = j;
    }
    rows
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn ms(ns: u64) -> String {
    format!("{:.3} ms", ns as f64 / 1e6)
}

/// The row's text: a packet's label, or a run's.
fn row_label(l: &Ladder, first: usize, count: usize) -> String {
    let p = &l.packets[first];
    if count == 1 {
        p.label.clone()
    } else {
        let last = &l.packets[first + count - 1];
        format!("{} x {count} ({:#08x}..{:#08x})", p.opcode, p.psn, last.psn)
    }
}

/// The SVG of `data`.
pub fn svg(input: impl io::Read, opts: &Options) -> io::Result<String> {
    let l = read(input, opts, false)?;
    let width = LEFT + LANE * l.lifelines.len().max(2) + 40;
    let height = TOP + ROW * (l.rows.len() + 1) + 20;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="monospace" font-size="11">"##
    );
    let _ = writeln!(s, r##"<rect width="100%" height="100%" fill="white"/>"##);
    let _ = writeln!(
        s,
        r##"<text x="8" y="16" font-size="12">{} packets, {} rows ({} frames not RoCE v2)</text>"##,
        l.packets.len(),
        l.rows.len(),
        l.skipped
    );
    let x = |lane: usize| LEFT + LANE * lane + LANE / 2;
    for (i, name) in l.lifelines.iter().enumerate() {
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" text-anchor="middle" font-weight="bold">{}</text><line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#999" stroke-width="1"/>"##,
            x(i),
            TOP - 14,
            esc(name),
            x(i),
            TOP - 8,
            x(i),
            height - 10
        );
    }
    let _ = writeln!(
        s,
        r##"<defs><marker id="head" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="context-stroke"/></marker></defs>"##
    );
    for (k, row) in l.rows.iter().enumerate() {
        let y = TOP + ROW * (k + 1);
        match *row {
            Row::Gap { ns } => {
                let _ = writeln!(
                    s,
                    r##"<text x="{}" y="{}" text-anchor="middle" fill="#888">- - -  {} of silence  - - -</text>"##,
                    width / 2,
                    y,
                    ms(ns)
                );
            }
            Row::Packets { first, count } => {
                let p = &l.packets[first];
                let (x1, x2) = (x(p.src), x(p.dst));
                let dash = if p.again {
                    r##" stroke-dasharray="5,3""##
                } else {
                    ""
                };
                let stroke = if count > 1 { "3" } else { "1.5" };
                let _ = writeln!(
                    s,
                    r##"<text x="8" y="{}" fill="#666">#{} {}</text>"##,
                    y + 4,
                    p.n,
                    ms(p.t)
                );
                let _ = writeln!(
                    s,
                    r##"<line x1="{x1}" y1="{y}" x2="{x2}" y2="{y}" stroke="{}" stroke-width="{}"{dash} marker-end="url(#head)"/>"##,
                    p.kind.colour(),
                    stroke
                );
                let mut text = row_label(&l, first, count);
                if p.again {
                    text.push_str(" (again)");
                }
                let _ = writeln!(
                    s,
                    r##"<text x="{}" y="{}" text-anchor="middle" fill="{}">{}</text>"##,
                    (x1 + x2) / 2,
                    y - 4,
                    p.kind.colour(),
                    esc(&text)
                );
            }
        }
    }
    s.push_str("</svg>\n");
    Ok(s)
}

/// The HTML of `data`, titled `name`.
pub fn html(input: impl io::Read, name: &str, opts: &Options) -> io::Result<String> {
    let l = read(input, opts, true)?;
    let mut packets = Vec::with_capacity(l.packets.len());
    for p in &l.packets {
        packets.push(serde_json::json!([
            p.n,
            p.t,
            p.src,
            p.dst,
            p.label,
            p.kind.colour(),
            p.again,
            p.qp,
            p.psn,
            p.detail,
            p.opcode
        ]));
    }
    let rows: Vec<serde_json::Value> = l
        .rows
        .iter()
        .map(|r| match *r {
            Row::Gap { ns } => serde_json::json!(["gap", ns]),
            Row::Packets { first, count } => serde_json::json!(["p", first, count]),
        })
        .collect();
    let legend: Vec<serde_json::Value> = [
        Kind::Request,
        Kind::Ack,
        Kind::Nak,
        Kind::Rnr,
        Kind::ReadResponse,
        Kind::AtomicAck,
        Kind::Datagram,
        Kind::Cm,
    ]
    .iter()
    .map(|k| serde_json::json!([k.name(), k.colour()]))
    .collect();
    let data = serde_json::json!({
        "name": name,
        "lifelines": l.lifelines,
        "packets": packets,
        "rows": rows,
        "legend": legend,
        "skipped": l.skipped,
    });
    // `</` inside the JSON would end the script element.
    let json = data.to_string().replace("</", "<\\/");
    Ok(HTML.replace("@TITLE@", &esc(name)).replace("@DATA@", &json))
}

const HTML: &str = include_str!("ladder.html");

/// Write the ladder of the capture `input` reads (named `name`) to
/// `output`: SVG or HTML by its extension.
pub fn write(
    input: impl io::Read,
    name: &str,
    opts: &Options,
    output: &std::path::Path,
) -> io::Result<()> {
    let text = match output.extension().and_then(|e| e.to_str()) {
        Some("svg") => svg(input, opts)?,
        Some("html" | "htm") => html(input, name, opts)?,
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: the output is FILE.svg or FILE.html", output.display()),
            ))
        }
    };
    std::fs::write(output, text)
}
