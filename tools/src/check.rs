//! `rnic check CAPTURE`: an IBTA conformance verdict for a capture of any
//! NIC's traffic (see `rnic_core::check` for the rules and what the checker
//! can know from a capture).

use std::io::{self, Read, Write};
use std::time::Instant;

use rnic_core::check::{Checker, Kind, Rule};
use rnic_wire::pcap::PcapStream;
use rnic_wire::LinkType;

/// What a check found.
pub struct Verdict {
    /// Violations (a NIC broke a rule).
    pub violations: usize,
    /// The file could not be read whole.
    pub file_error: bool,
}

/// Check the pcap or pcapng file `input` reads, one packet at a time
/// (memory grows with the connections, not with the file), printing the
/// report to `out`.
pub fn check(input: impl Read, name: &str, out: &mut impl Write) -> io::Result<Verdict> {
    let started = Instant::now();
    let mut checker = Checker::new();
    let mut file_error = false;
    match PcapStream::new(input) {
        Ok(reader) => {
            for (i, rec) in reader.enumerate() {
                match rec {
                    Ok(r) => checker.frame(
                        i as u64 + 1,
                        r.timestamp_ns,
                        LinkType::from_pcap(r.link_type),
                        &r.data,
                    ),
                    Err(e) => {
                        writeln!(
                            out,
                            "{name}: capture file error at frame {}: {e} (the report covers the frames before it)",
                            i + 1
                        )?;
                        file_error = true;
                        break;
                    }
                }
            }
        }
        Err(e) => {
            writeln!(out, "{name}: not a capture file: {e}")?;
            return Ok(Verdict {
                violations: 0,
                file_error: true,
            });
        }
    }
    let (findings, stats) = checker.finish();
    let took = started.elapsed();
    writeln!(
        out,
        "{name}: {} RoCE v2 packets of {} frames ({} malformed, {} copies the network made, {} responses to requests the capture does not hold); {} RC, {} UC connections, {} UD flows",
        stats.roce,
        stats.frames,
        stats.malformed,
        stats.network_copies,
        stats.unplaced_responses,
        stats.rc,
        stats.uc,
        stats.ud
    )?;
    for (kind, label) in [
        (Kind::Violation, "violation"),
        (Kind::Warning, "warning"),
        (Kind::Note, "note"),
    ] {
        for f in findings.iter().filter(|f| f.rule.kind() == kind) {
            writeln!(out, "  {label}: {f}")?;
        }
    }
    let violations = findings.iter().filter(|f| f.rule.is_violation()).count();
    let mut per_rule: Vec<(Rule, usize)> = Rule::ALL
        .iter()
        .map(|&r| (r, findings.iter().filter(|f| f.rule == r).count()))
        .filter(|&(_, n)| n > 0)
        .collect();
    per_rule.sort();
    let tally: Vec<String> = per_rule
        .iter()
        .map(|(r, n)| format!("{} {n}", r.id()))
        .collect();
    let rate = stats.frames as f64 / took.as_secs_f64().max(1e-9);
    writeln!(
        out,
        "{}: {} violation(s){}; checked at {:.0} packets/s",
        if violations == 0 {
            "clean"
        } else {
            "NOT CONFORMANT"
        },
        violations,
        if tally.is_empty() {
            String::new()
        } else {
            format!(" ({})", tally.join(", "))
        },
        rate
    )?;
    Ok(Verdict {
        violations,
        file_error,
    })
}
