//! Properties of rnic-wire over random packets and random bytes.

mod common;

use std::net::{Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use rnic_wire::encap::{ethernet, ipv4, ipv6};
use rnic_wire::opcode::OPCODES;
use rnic_wire::pcap::PcapReader;
use rnic_wire::{icrc, Frame, FrameRepr, IbPacket, IbRepr, IpRepr, LinkType, MAX_PAYLOAD};

/// A random valid frame: any opcode, its headers filled from `seed`.
fn frame(
    op: usize,
    seed: u64,
    payload_len: usize,
    v6: bool,
    vlan: Option<u16>,
) -> (FrameRepr, Vec<u8>) {
    let mut next = common::rng(seed);
    let info = &OPCODES[op % OPCODES.len()];
    let ib = common::ib_repr_for(info, payload_len, &mut next);
    let ip = if v6 {
        let mut r = ipv6::Repr::new(
            Ipv6Addr::from(next() as u128),
            Ipv6Addr::from(next() as u128),
        );
        r.traffic_class = next() as u8;
        r.flow_label = next() as u32 & 0xF_FFFF;
        r.hop_limit = next() as u8;
        IpRepr::V6(r)
    } else {
        let mut r = ipv4::Repr::new(Ipv4Addr::from(next() as u32), Ipv4Addr::from(next() as u32));
        r.tos = next() as u8;
        r.ttl = next() as u8;
        r.ident = next() as u16;
        r.dont_frag = next() & 1 == 1;
        IpRepr::V4(r)
    };
    let repr = FrameRepr {
        ethernet: Some(ethernet::Repr {
            dst: ethernet::MacAddr([2, 0, 0, 0, 0, 1]),
            src: ethernet::MacAddr([2, 0, 0, 0, 0, 2]),
            vlan_tci: vlan,
        }),
        ip,
        src_port: next() as u16,
        ib,
    };
    let payload: Vec<u8> = (0..ib.payload_len).map(|_| next() as u8).collect();
    let mut buf = vec![0u8; repr.buffer_len()];
    let n = repr.emit(&mut buf, &payload).expect("a valid repr emits");
    assert_eq!(n, buf.len());
    (repr, buf)
}

/// Bit positions (byte, mask) the ICRC does not cover, in a frame with `l2` link
/// header bytes.
fn masked(repr: &FrameRepr, l2: usize, byte: usize, bit: u8) -> bool {
    let Some(off) = byte.checked_sub(l2) else {
        return true; // the link header is not covered either
    };
    let (ip_len, ip_masked) = match repr.ip {
        IpRepr::V4(_) => (20, matches!(off, 1 | 8 | 10 | 11)),
        IpRepr::V6(_) => (
            40,
            (off == 0 && bit & 0x0F != 0) || matches!(off, 1..=3 | 7),
        ),
    };
    ip_masked || off == ip_len + 6 || off == ip_len + 7 || off == ip_len + 8 + 4
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// emit -> parse gives back every field, for every opcode and header combination.
    #[test]
    fn emit_parse_round_trip(
        op in 0..OPCODES.len(),
        seed in any::<u64>(),
        payload_len in prop_oneof![0..=16usize, 0..=MAX_PAYLOAD],
        v6 in any::<bool>(),
        vlan in proptest::option::of(any::<u16>()),
    ) {
        let (repr, buf) = frame(op, seed, payload_len, v6, vlan);
        let f = Frame::parse(LinkType::Ethernet, &buf).expect("own frame parses");
        prop_assert!(f.icrc_ok());
        prop_assert_eq!(f.ip, repr.ip);
        prop_assert_eq!(f.udp.src_port, repr.src_port);
        prop_assert_eq!(f.ethernet, repr.ethernet);
        let ib = IbRepr::parse(&f.ib).expect("own headers parse");
        prop_assert_eq!(ib, repr.ib);
        prop_assert_eq!(f.ib.payload().len(), repr.ib.payload_len);
        // The in-place ICRC over headroom gives the same value and leaves the packet as it was.
        let ip_len = f.ib_offset - 8 - f.ip_offset;
        let at = icrc::headroom(ip_len);
        let mut roomy = vec![0u8; at];
        roomy.extend_from_slice(f.ib.as_bytes());
        let udp_hdr = &buf[f.ib_offset - 8..f.ib_offset];
        let ip_hdr = &buf[f.ip_offset..f.ip_offset + ip_len];
        prop_assert_eq!(icrc::compute_in_place(&mut roomy, at, ip_hdr, udp_hdr), Ok(f.computed_icrc));
        prop_assert_eq!(&roomy[at..], f.ib.as_bytes());
        // And the IB part alone re-emits to the same bytes.
        let mut again = vec![0u8; ib.buffer_len()];
        ib.emit(&mut again, f.ib.payload()).unwrap();
        let n = again.len();
        prop_assert_eq!(&again[..n - 4], &f.ib.as_bytes()[..n - 4]);
    }

    /// Any single bit flipped where the ICRC looks makes the packet fail (to parse,
    /// or to verify); flipped in a masked field, the packet still verifies.
    #[test]
    fn single_bit_flips(
        op in 0..OPCODES.len(),
        seed in any::<u64>(),
        payload_len in 0..=64usize,
        v6 in any::<bool>(),
    ) {
        let (repr, buf) = frame(op, seed, payload_len, v6, None);
        let l2 = 14;
        let mut covered_flips = 0;
        for byte in l2..buf.len() {
            for bit in 0..8 {
                let mask = 1u8 << bit;
                let mut b = buf.clone();
                b[byte] ^= mask;
                let verified = Frame::parse(LinkType::Ethernet, &b).map(|f| f.icrc_ok());
                if masked(&repr, l2, byte, mask) {
                    prop_assert_eq!(verified, Ok(true), "masked bit {:#x} of byte {} broke the packet", mask, byte);
                } else {
                    prop_assert!(verified != Ok(true), "flipping bit {:#x} of byte {} went unnoticed", mask, byte);
                    covered_flips += 1;
                }
            }
        }
        // The smallest packet (IPv4, no extension header, no payload) has 37 covered bytes.
        prop_assert!(covered_flips >= 8 * 37);
    }

    /// Parsers never panic, whatever the bytes.
    #[test]
    fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        for link in [LinkType::Ethernet, LinkType::LinuxSll, LinkType::LinuxSll2, LinkType::RawIp] {
            if let Ok(f) = Frame::parse(link, &bytes) {
                let _ = IbRepr::parse(&f.ib);
                let _ = f.icrc_ok();
            }
        }
        if let Ok(p) = IbPacket::new_checked(&bytes[..]) {
            let _ = IbRepr::parse(&p);
            let _ = p.payload();
        }
        let _ = icrc::compute(&bytes);
        if let Ok(r) = PcapReader::new(&bytes) {
            for rec in r.take(64) {
                let _ = rec;
            }
        }
    }

    /// Nor on valid frames with a few bytes changed, truncated or extended, which
    /// reach deeper than random bytes do.
    #[test]
    fn parse_never_panics_on_damaged_frames(
        op in 0..OPCODES.len(),
        seed in any::<u64>(),
        payload_len in 0..=300usize,
        v6 in any::<bool>(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in any::<prop::sample::Index>(),
        extra in proptest::collection::vec(any::<u8>(), 0..8),
    ) {
        let (_, mut buf) = frame(op, seed, payload_len, v6, None);
        for (at, v) in edits {
            let i = at.index(buf.len());
            buf[i] = v;
        }
        let n = cut.index(buf.len() + 1);
        buf.truncate(n);
        buf.extend_from_slice(&extra);
        if let Ok(f) = Frame::parse(LinkType::Ethernet, &buf) {
            let _ = IbRepr::parse(&f.ib);
        }
    }
}
