//! `rnic dump`: one line per RoCE v2 packet, a field tree with `-v`, a summary.

use std::collections::BTreeMap;
use std::io::{self, Write};

use rnic_wire::aeth::{self, Syndrome};
use rnic_wire::pcap::PcapReader;
use rnic_wire::{
    atomic_ack_eth, atomic_eth, cm, deth, feth, ieth, immdt, mad, reth, xrceth, Error, Frame,
    IbRepr, IpRepr, LinkType, Opcode, Operation,
};

/// How to print.
pub struct Options {
    /// Print the field tree of every packet.
    pub verbose: bool,
    /// Print only the summary.
    pub quiet: bool,
}

/// What a dump found.
#[derive(Debug, Default)]
pub struct Summary {
    /// RoCE v2 packets decoded.
    pub roce: usize,
    /// Packets per opcode.
    pub per_opcode: BTreeMap<Opcode, usize>,
    /// Packets whose ICRC did not verify.
    pub icrc_bad: usize,
    /// Frames of other protocols.
    pub skipped: usize,
    /// RoCE v2 frames (UDP port 4791) that did not parse.
    pub malformed: usize,
    /// An error that stopped reading the file.
    pub file_error: Option<Error>,
}

impl Summary {
    /// No bad ICRC, no malformed packet, and the whole file read.
    pub fn all_good(&self) -> bool {
        self.icrc_bad == 0 && self.malformed == 0 && self.file_error.is_none()
    }
}

/// Decode `data` (a whole capture file) to `out`.
pub fn dump(data: &[u8], opts: &Options, out: &mut impl Write) -> io::Result<Summary> {
    let mut summary = Summary::default();
    let reader = match PcapReader::new(data) {
        Ok(r) => r,
        Err(e) => {
            writeln!(out, "not a capture file: {e}")?;
            summary.file_error = Some(e);
            return Ok(summary);
        }
    };
    let mut first_ts = None;
    for (index, rec) in reader.enumerate() {
        let n = index + 1;
        let rec = match rec {
            Ok(r) => r,
            Err(e) => {
                writeln!(out, "{n:5} capture file error: {e}")?;
                summary.file_error = Some(e);
                break;
            }
        };
        let t0 = *first_ts.get_or_insert(rec.timestamp_ns);
        let rel = rec.timestamp_ns.saturating_sub(t0);
        let time = format!("{}.{:06}", rel / 1_000_000_000, rel % 1_000_000_000 / 1000);
        let Some(link) = LinkType::from_pcap(rec.link_type) else {
            summary.skipped += 1;
            continue;
        };
        match Frame::parse(link, rec.data) {
            Ok(frame) => {
                summary.roce += 1;
                *summary
                    .per_opcode
                    .entry(frame.ib.info().opcode)
                    .or_default() += 1;
                let ok = frame.icrc_ok();
                if !ok {
                    summary.icrc_bad += 1;
                }
                if !opts.quiet {
                    write_line(out, n, &time, &frame)?;
                    if opts.verbose {
                        write_tree(out, &frame)?;
                    }
                }
            }
            Err(e) if e.is_not_roce() => summary.skipped += 1,
            Err(e) => {
                summary.malformed += 1;
                if !opts.quiet {
                    writeln!(out, "{n:5} {time} malformed RoCE v2 packet: {e}")?;
                }
            }
        }
    }
    write_summary(out, &summary)?;
    Ok(summary)
}

fn endpoint(ip: std::net::IpAddr, port: u16) -> String {
    match ip {
        std::net::IpAddr::V4(a) => format!("{a}:{port}"),
        std::net::IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

pub(crate) fn write_line(
    out: &mut impl Write,
    n: usize,
    time: &str,
    f: &Frame<'_>,
) -> io::Result<()> {
    let ib = &f.ib;
    let bth = ib.bth();
    let mut flags = String::new();
    for (on, c) in [
        (bth.solicited(), 'S'),
        (bth.mig_req(), 'M'),
        (bth.ack_req(), 'A'),
    ] {
        if on {
            flags.push(c);
        }
    }
    if bth.fecn() {
        flags.push_str(" FECN");
    }
    if bth.becn() {
        flags.push_str(" BECN");
    }
    let mut line = format!(
        "{n:5} {time} {} > {} {} qp={:#08x} psn={:#08x}",
        endpoint(f.ip.src_addr(), f.udp.src_port),
        endpoint(f.ip.dst_addr(), f.udp.dst_port),
        ib.info().name,
        bth.dest_qp(),
        bth.psn().value(),
    );
    if !flags.is_empty() {
        line.push_str(&format!(" [{flags}]"));
    }
    if bth.pad_count() != 0 {
        line.push_str(&format!(" pad={}", bth.pad_count()));
    }
    if let Some(h) = ib.xrceth() {
        line.push_str(&format!(" xrcsrq={:#08x}", h.xrc_srq()));
    }
    if let Some(h) = ib.deth() {
        line.push_str(&format!(
            " qkey={:#010x} srcqp={:#08x}",
            h.q_key(),
            h.src_qp()
        ));
    }
    if let Some(h) = ib.feth() {
        line.push_str(&format!(" sel={} plt={:#x}", h.sel(), h.plt()));
    }
    if let Some(h) = ib.reth() {
        line.push_str(&format!(
            " va={:#x} rkey={:#010x} dmalen={}",
            h.va(),
            h.r_key(),
            h.dma_length()
        ));
    }
    if let Some(h) = ib.atomic_eth() {
        line.push_str(&format!(" va={:#x} rkey={:#010x}", h.va(), h.r_key()));
        if ib.info().operation == Operation::FetchAdd {
            line.push_str(&format!(" add={:#x}", h.swap_or_add_data()));
        } else {
            line.push_str(&format!(
                " swap={:#x} cmp={:#x}",
                h.swap_or_add_data(),
                h.compare_data()
            ));
        }
    }
    if let Some(h) = ib.immdt() {
        line.push_str(&format!(" imm={:#010x}", h.immediate()));
    }
    if let Some(h) = ib.ieth() {
        line.push_str(&format!(" inv_rkey={:#010x}", h.r_key()));
    }
    if let Some(h) = ib.aeth() {
        line.push_str(&format!(
            " {} msn={}",
            Syndrome::from_byte(h.syndrome()),
            h.msn()
        ));
    }
    if let Some(h) = ib.atomic_ack_eth() {
        line.push_str(&format!(" orig={:#x}", h.orig_rem_dt()));
    }
    if ib.info().has_payload {
        line.push_str(&format!(" len={}", ib.payload().len()));
    }
    match mad_of(f) {
        Some(Ok(m)) => line.push_str(&format!(" | {m}")),
        Some(Err(e)) => match mad_header(f) {
            // A MAD, not a CM message (another class, a GetResp): its
            // common header says what it is.
            Some(h) => line.push_str(&format!(" | {h} (not a CM message: {e})")),
            None => line.push_str(&format!(" | MAD not decoded: {e}")),
        },
        None => {}
    }
    if f.icrc_ok() {
        line.push_str(" icrc=ok");
    } else {
        line.push_str(&format!(
            " icrc=BAD (stored {:#010x}, computed {:#010x})",
            ib.icrc(),
            f.computed_icrc
        ));
    }
    writeln!(out, "{line}")
}

pub(crate) fn write_tree(out: &mut impl Write, f: &Frame<'_>) -> io::Result<()> {
    if let Some(eth) = f.ethernet {
        writeln!(out, "        {eth}")?;
    }
    match f.ip {
        IpRepr::V4(ip) => writeln!(out, "        {ip} len={}", f.ip_packet.len())?,
        IpRepr::V6(ip) => writeln!(out, "        {ip} plen={}", f.ip_packet.len() - 40)?,
    }
    writeln!(out, "        {}", f.udp)?;
    let ib = &f.ib;
    let bth = ib.bth();
    writeln!(
        out,
        "        BTH opcode={:#04x} ({}) SE={} M={} PadCnt={} TVer={} P_Key={:#06x} FECN={} BECN={} Resv6a={:#x} DestQP={:#08x} A={} Resv7={:#x} PSN={}",
        bth.opcode().0,
        ib.info().name,
        u8::from(bth.solicited()),
        u8::from(bth.mig_req()),
        bth.pad_count(),
        bth.tver(),
        bth.p_key(),
        u8::from(bth.fecn()),
        u8::from(bth.becn()),
        bth.resv6a(),
        bth.dest_qp(),
        u8::from(bth.ack_req()),
        bth.resv7(),
        bth.psn().value()
    )?;
    // The value Reprs print every remaining field, in wire order.
    if let Ok(repr) = IbRepr::parse(ib) {
        let IbRepr {
            xrceth,
            deth,
            feth,
            reth,
            atomic_eth,
            immdt,
            ieth,
            aeth,
            atomic_ack_eth,
            ..
        } = repr;
        print_opt::<xrceth::Repr>(out, xrceth)?;
        print_opt::<deth::Repr>(out, deth)?;
        print_opt::<feth::Repr>(out, feth)?;
        print_opt::<reth::Repr>(out, reth)?;
        print_opt::<atomic_eth::Repr>(out, atomic_eth)?;
        print_opt::<immdt::Repr>(out, immdt)?;
        print_opt::<ieth::Repr>(out, ieth)?;
        print_opt::<aeth::Repr>(out, aeth)?;
        print_opt::<atomic_ack_eth::Repr>(out, atomic_ack_eth)?;
    }
    match mad_of(f) {
        Some(Ok(m)) => writeln!(out, "        {}\n        {m}", m.header)?,
        Some(Err(e)) => match mad_header(f) {
            Some(h) => writeln!(out, "        {h}\n        not a CM message: {e}")?,
            None => writeln!(out, "        MAD not decoded: {e}")?,
        },
        None => {}
    }
    if ib.info().has_payload {
        let p = ib.payload();
        let head: Vec<String> = p.iter().take(16).map(|b| format!("{b:02x}")).collect();
        writeln!(
            out,
            "        payload {} B{}{}",
            p.len(),
            if p.is_empty() { "" } else { ": " },
            head.join(" ") + if p.len() > 16 { " ..." } else { "" }
        )?;
    }
    writeln!(
        out,
        "        ICRC stored={:#010x} computed={:#010x} {}",
        ib.icrc(),
        f.computed_icrc,
        if f.icrc_ok() { "ok" } else { "BAD" }
    )
}

/// The CM MAD a packet carries, if it is a management datagram: a UD
/// SEND to QP1 (the General Services Interface).
fn mad_of(f: &Frame<'_>) -> Option<Result<cm::Mad, Error>> {
    let ib = &f.ib;
    (ib.bth().dest_qp() == mad::GSI_QPN && ib.deth().is_some())
        .then(|| cm::Mad::parse(ib.payload()))
}

/// The common MAD header of a packet to QP 1, if it has one.
fn mad_header(f: &Frame<'_>) -> Option<mad::Repr> {
    let p = mad::Packet::new_checked(f.ib.payload()).ok()?;
    mad::Repr::parse(&p).ok()
}

fn print_opt<R: std::fmt::Display>(out: &mut impl Write, r: Option<R>) -> io::Result<()> {
    match r {
        Some(r) => writeln!(out, "        {r}"),
        None => Ok(()),
    }
}

fn write_summary(out: &mut impl Write, s: &Summary) -> io::Result<()> {
    writeln!(out, "---")?;
    writeln!(
        out,
        "{} RoCE v2 packets, {} ICRC failures, {} malformed, {} non-RoCE frames skipped",
        s.roce, s.icrc_bad, s.malformed, s.skipped
    )?;
    for (op, count) in &s.per_opcode {
        writeln!(out, "  {count:7}  {op}")?;
    }
    if let Some(e) = &s.file_error {
        writeln!(out, "reading stopped early: {e}")?;
    }
    Ok(())
}
