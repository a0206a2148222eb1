//! `Nic::handle_frame`: what a transport that sees whole frames hands the
//! NIC, checked against rdma_rxe's own frames (the reference captures in
//! tests/captures). rxe puts a new IPv4 identification in every packet, so
//! its ICRCs verify only over the header they came with, never under the
//! UDP socket's convention (identification 0).

use std::net::IpAddr;

use rnic_core::time::Time;
use rnic_core::Nic;
use rnic_wire::encap::{Frame, IpRepr, LinkType};
use rnic_wire::pcap::PcapReader;

/// The Ethernet frames of a reference capture.
fn frames(name: &str) -> Vec<Vec<u8>> {
    let path = format!("{}/../tests/captures/{name}", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let reader = PcapReader::new(&bytes).unwrap();
    assert_eq!(reader.link_type(), Some(1), "{name}: Ethernet");
    reader.map(|r| r.unwrap().data.to_vec()).collect()
}

fn parse(frame: &[u8]) -> Frame<'_> {
    Frame::parse(LinkType::Ethernet, frame).unwrap()
}

/// Each frame to a NIC at its destination address, with no QPs: every
/// frame that passes the checks is then counted as for an unknown QP.
fn to_nics(frames: &[Vec<u8>]) -> Vec<Nic> {
    let mut nics: Vec<Nic> = Vec::new();
    for f in frames {
        let dst = parse(f).ip.dst_addr();
        if !nics.iter().any(|n| n.addr() == dst) {
            nics.push(Nic::new(dst, 1));
        }
        let nic = nics.iter_mut().find(|n| n.addr() == dst).unwrap();
        nic.handle_frame(Time::ZERO, LinkType::Ethernet, f);
    }
    nics
}

#[test]
fn rxe_frames_verify_over_their_own_ip_headers() {
    for name in [
        "rxe-rc_pingpong.pcap",
        "rxe-write_bw.pcap",
        "rxe-v6_rc_pingpong.pcap",
    ] {
        let frames = frames(name);
        let nics = to_nics(&frames);
        let c = nics.iter().fold((0, 0, 0, 0), |a, n| {
            let c = n.counters();
            (
                a.0 + c.icrc_errors,
                a.1 + c.malformed,
                a.2 + c.foreign_frames,
                a.3 + c.unknown_qp,
            )
        });
        assert_eq!(c, (0, 0, 0, frames.len() as u64), "{name}");
    }
}

#[test]
fn a_udp_socket_cannot_verify_rxe_over_ipv4() {
    let frames = frames("rxe-rc_pingpong.pcap");
    let mut with_ident = 0;
    let mut nic = Nic::new(parse(&frames[0]).ip.dst_addr(), 1);
    for f in &frames {
        let p = parse(f);
        let IpRepr::V4(ip) = p.ip else { panic!("IPv4") };
        if ip.ident != 0 {
            with_ident += 1;
        }
        if p.ip.dst_addr() != nic.addr() {
            continue;
        }
        // What a UDP socket would hand over: addresses, source port, payload.
        let src: IpAddr = p.ip.src_addr();
        let payload = &p.ip_packet[p.ib_offset - p.ip_offset..];
        nic.handle_udp(Time::ZERO, src, nic.addr(), p.udp.src_port, payload);
    }
    assert_eq!(
        with_ident,
        frames.len(),
        "rxe sets an identification in every packet"
    );
    let c = nic.counters();
    assert!(c.icrc_errors > 0);
    assert_eq!(c.unknown_qp, 0, "none verified");
}

/// A UDP socket sees a GSO send's segments with identifications 0, 1, 2, ...
/// and cannot see which: the NIC accepts an ICRC made for any
/// identification below `UDP_GSO_IDS`, and no other. rxe's frames, their
/// identification rewritten and their ICRC filled for it over the whole
/// header, are the packets.
#[test]
fn a_udp_socket_takes_the_identifications_of_gso_segments() {
    let frames = frames("rxe-rc_pingpong.pcap");
    let dst = parse(&frames[0]).ip.dst_addr();
    for (id, verifies) in [
        (0u16, true),
        (1, true),
        (37, true),
        (63, true),
        (64, false),
        (0x49b1, false),
    ] {
        let mut nic = Nic::new(dst, 1);
        let mut sent = 0;
        for f in &frames {
            let mut f = f.clone();
            let p = parse(&f);
            if p.ip.dst_addr() != dst {
                continue;
            }
            let (ip_at, src, src_port) = (p.ip_offset, p.ip.src_addr(), p.udp.src_port);
            let ib_at = p.ib_offset;
            let end = ip_at + p.ip_packet.len();
            f[ip_at + 4..ip_at + 6].copy_from_slice(&id.to_be_bytes());
            rnic_wire::icrc::fill(&mut f[ip_at..end]).unwrap();
            nic.handle_udp(Time::ZERO, src, dst, src_port, &f[ib_at..end]);
            sent += 1;
        }
        let c = nic.counters();
        let (verified, failed) = if verifies { (sent, 0) } else { (0, sent) };
        assert_eq!(
            (c.unknown_qp, c.icrc_errors),
            (verified, failed),
            "identification {id}"
        );
    }
}

#[test]
fn the_ipv4_identification_is_covered() {
    let mut f = frames("rxe-rc_pingpong.pcap").swap_remove(0);
    let p = parse(&f);
    let (ip_at, dst) = (p.ip_offset, p.ip.dst_addr());
    // Identification (bytes 4-5 of the IPv4 header), and the header checksum
    // mended (not covered by the ICRC, and checked by no one here).
    f[ip_at + 5] ^= 1;
    f[ip_at + 11] ^= 1;
    let mut nic = Nic::new(dst, 1);
    nic.handle_frame(Time::ZERO, LinkType::Ethernet, &f);
    assert_eq!(nic.counters().icrc_errors, 1);
    assert_eq!(nic.counters().unknown_qp, 0);
}

#[test]
fn frames_not_roce_to_this_nic_are_foreign() {
    let f = frames("rxe-rc_pingpong.pcap").swap_remove(0);
    let p = parse(&f);
    let (ip_at, udp_at, dst) = (p.ip_offset, p.ib_offset - 8, p.ip.dst_addr());
    let mut nic = Nic::new("10.77.0.99".parse().unwrap(), 1);
    nic.handle_frame(Time::ZERO, LinkType::Ethernet, &f);
    assert_eq!(nic.counters().foreign_frames, 1, "another destination");

    let mut nic = Nic::new(dst, 1);
    let mut port = f.clone();
    port[udp_at + 3] ^= 1; // destination port 4790
    nic.handle_frame(Time::ZERO, LinkType::Ethernet, &port);
    let mut arp = f.clone();
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    nic.handle_frame(Time::ZERO, LinkType::Ethernet, &arp);
    assert_eq!(
        nic.counters().foreign_frames,
        2,
        "another port, another protocol"
    );

    let mut short = f.clone();
    short.truncate(ip_at + 20 + 8 + 6);
    nic.handle_frame(Time::ZERO, LinkType::Ethernet, &short);
    assert_eq!(nic.counters().malformed, 1, "a RoCE v2 frame cut short");
    assert_eq!(nic.counters().unknown_qp, 0);
}
