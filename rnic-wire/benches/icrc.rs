//! ICRC throughput next to memcpy of the same bytes, and the CRC-32 crates side by
//! side. A report, not a test: it prints figures and ratios measured in one run.
//!
//! `cargo bench -p rnic-wire --bench icrc`

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use rnic_wire::encap::ipv4;
use rnic_wire::{bth, icrc, FrameRepr, IbRepr, IpRepr, Opcode, Psn};

/// Throughput (bytes/s) of one round of `f` lasting about 50 ms.
fn round(bytes_per_call: usize, f: &mut impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < Duration::from_millis(50) {
        for _ in 0..64 {
            f();
        }
        calls += 64;
    }
    (calls as f64 * bytes_per_call as f64) / start.elapsed().as_secs_f64()
}

/// Best throughputs of `a`, `b` and `c`, their rounds interleaved so that all
/// see the same machine (these machines are shared and noisy).
fn measure_three(
    bytes_per_call: usize,
    mut a: impl FnMut(),
    mut b: impl FnMut(),
    mut c: impl FnMut(),
) -> (f64, f64, f64) {
    let mut best = (0.0f64, 0.0f64, 0.0f64);
    for _ in 0..15 {
        best.0 = best.0.max(round(bytes_per_call, &mut a));
        best.1 = best.1.max(round(bytes_per_call, &mut b));
        best.2 = best.2.max(round(bytes_per_call, &mut c));
    }
    best
}

fn gbs(rate: f64) -> String {
    format!("{:.2} GB/s", rate / 1e9)
}

fn main() {
    println!("ICRC over a whole RC SEND packet (IPv4), against memcpy of the same bytes");
    println!("  parts:    icrc::compute, the pseudo-header hashed apart from the packet");
    println!("  in place: icrc::compute_in_place, pseudo-header written into headroom, one pass");
    println!(
        "{:>8}  {:>15}  {:>15}  {:>12}  {:>7}  {:>8}",
        "packet", "ICRC parts", "ICRC in place", "memcpy", "ratio", "in place"
    );
    let mut ratios = Vec::new();
    for size in [64usize, 1024, 4096] {
        // A packet whose IP packet (IP header through ICRC) is `size` bytes.
        let payload_len = size - 20 - 8 - 12 - 4;
        let mut ib = IbRepr::new(bth::Repr::new(Opcode::RC_SEND_ONLY, 0x11, Psn::new(0)));
        ib.payload_len = payload_len;
        let frame = FrameRepr {
            ethernet: None,
            ip: IpRepr::V4(ipv4::Repr::new(
                Ipv4Addr::new(127, 0, 0, 1),
                Ipv4Addr::new(127, 0, 0, 2),
            )),
            src_port: 0xC121,
            ib,
        };
        let mut pkt = vec![0u8; frame.buffer_len()];
        let payload: Vec<u8> = (0..payload_len).map(|i| i as u8).collect();
        frame.emit(&mut pkt, &payload).expect("bench packet");
        assert_eq!(pkt.len(), size);
        let mut dst = vec![0u8; size];
        let at = icrc::headroom(20);
        let mut roomy = vec![0u8; at];
        roomy.extend_from_slice(&pkt[28..]);
        let (ip_hdr, udp_hdr) = (pkt[..20].to_vec(), pkt[20..28].to_vec());
        assert_eq!(
            icrc::compute_in_place(&mut roomy, at, &ip_hdr, &udp_hdr),
            icrc::compute(&pkt)
        );
        let (parts, in_place, copy) = measure_three(
            size,
            || {
                black_box(icrc::compute(black_box(&pkt)).ok());
            },
            || {
                black_box(
                    icrc::compute_in_place(black_box(&mut roomy), at, &ip_hdr, &udp_hdr).ok(),
                );
            },
            || {
                dst.copy_from_slice(black_box(&pkt));
                black_box(&mut dst);
            },
        );
        println!(
            "{:>6} B  {:>15}  {:>15}  {:>12}  {:7.3}  {:7.3}",
            size,
            gbs(parts),
            gbs(in_place),
            gbs(copy),
            parts / copy,
            in_place / copy
        );
        ratios.push((size, parts / copy, in_place / copy));
    }
    for (size, parts, in_place) in &ratios {
        println!("ratio ICRC/memcpy at {size} B: parts {parts:.3}, in place {in_place:.3}");
    }
    if let Some((_, _, in_place)) = ratios.iter().find(|r| r.0 == 4096) {
        println!(
            "goal: ICRC at least 0.25 x memcpy on 4 KiB packets: {} ({in_place:.3})",
            if *in_place >= 0.25 {
                "met"
            } else {
                "NOT met on this machine"
            }
        );
    }

    println!();
    println!("CRC-32 candidates on plain buffers");
    println!(
        "{:>8}  {:>12}  {:>12}  {:>12}",
        "bytes", "crc32fast", "crc-fast", "crc (tab16)"
    );
    const TABLE16: crc::Crc<u32, crc::Table<16>> =
        crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISO_HDLC);
    for size in [64usize, 1024, 4096] {
        let buf: Vec<u8> = (0..size).map(|i| (i * 7) as u8).collect();
        let a = crc32fast::hash(&buf);
        let b = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32IsoHdlc, &buf) as u32;
        let c = TABLE16.checksum(&buf);
        assert!(a == b && b == c, "the candidates disagree");
        let (fast, simd, table) = measure_three(
            size,
            || {
                black_box(crc32fast::hash(black_box(&buf)));
            },
            || {
                black_box(crc_fast::checksum(
                    crc_fast::CrcAlgorithm::Crc32IsoHdlc,
                    black_box(&buf),
                ));
            },
            || {
                black_box(TABLE16.checksum(black_box(&buf)));
            },
        );
        println!(
            "{:>6} B  {}  {}  {}",
            size,
            gbs(fast),
            gbs(simd),
            gbs(table)
        );
    }
}
