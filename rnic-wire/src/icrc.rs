//! The invariant CRC (IBTA 9.7.3 and the RoCE v2 annex A17.3.3).
//!
//! CRC-32 (the Ethernet/zlib polynomial, reflected, init and final XOR all ones)
//! over a pseudo-packet: 8 bytes of 0xFF standing for the LRH that RoCE v2 does
//! not have, the IP header with its variant fields set to all ones (IPv4: TOS, TTL,
//! header checksum; IPv6: traffic class, flow label, hop limit), the UDP header
//! with its checksum set to all ones, the BTH with byte 4 (FECN, BECN, Resv6a)
//! set to all ones, then everything after the BTH up to the ICRC. Everything else
//! counts, the IPv4 identification, flags and total length included. The result
//! is stored little-endian (first byte on the wire = least significant byte).
//!
//! Allocation-free: the masked headers are copied into a small stack buffer and
//! the rest is hashed in place.

use std::net::IpAddr;

use crate::encap::{ipv4, ipv6};
use crate::{bth, Error, ErrorKind, Layer, Result};

/// Bytes of the ICRC at the end of every RoCE v2 packet.
pub const ICRC_LEN: usize = 4;

const UDP_LEN: usize = 8;
const LRH_PLACEHOLDER: usize = 8;
/// 8 bytes LRH placeholder + up to 60 bytes IPv4 header + UDP + BTH.
const PSEUDO_MAX: usize = LRH_PLACEHOLDER + 60 + UDP_LEN + bth::HEADER_LEN;

/// A fresh CRC-32 state. `Hasher::new` detects the CPU's features every time;
/// cloning a prototype does not, which matters at millions of packets a second.
fn hasher() -> crc32fast::Hasher {
    static PROTOTYPE: std::sync::OnceLock<crc32fast::Hasher> = std::sync::OnceLock::new();
    PROTOTYPE.get_or_init(crc32fast::Hasher::new).clone()
}

/// Set the variant fields of an IP header to ones.
fn mask_ip(ip: &mut [u8]) {
    match ip[0] >> 4 {
        4 => {
            ip[1] = 0xFF; // TOS (DSCP + ECN)
            ip[8] = 0xFF; // TTL
            ip[10] = 0xFF; // header checksum
            ip[11] = 0xFF;
        }
        _ => {
            ip[0] |= 0x0F; // traffic class, high nibble
            ip[1] = 0xFF; // traffic class low nibble, flow label
            ip[2] = 0xFF;
            ip[3] = 0xFF;
            ip[7] = 0xFF; // hop limit
        }
    }
}

/// The ICRC of a packet given as its three parts: `ip_header` (IPv4 with
/// options, or the fixed 40-byte IPv6 header), the 8-byte `udp_header`, and
/// `ib` = BTH through the last payload/pad byte (without the ICRC).
///
/// This is what a sender on a UDP socket uses: it computes the ICRC over the IP
/// and UDP headers the kernel will write, before the kernel writes them.
pub fn compute_parts(ip_header: &[u8], udp_header: &[u8], ib: &[u8]) -> Result<u32> {
    check_parts(ip_header, udp_header, ib)?;
    let mut pseudo = [0u8; PSEUDO_MAX];
    let n = write_pseudo(&mut pseudo, ip_header, udp_header, &ib[..bth::HEADER_LEN]);
    let mut h = hasher();
    h.update(&pseudo[..n]);
    h.update(&ib[bth::HEADER_LEN..]);
    Ok(h.finalize())
}

/// Bytes of headroom [`compute_in_place`] needs in front of the BTH: 8 + the IP
/// header + 8.
pub const fn headroom(ip_header_len: usize) -> usize {
    LRH_PLACEHOLDER + ip_header_len + UDP_LEN
}

/// The ICRC of the IB packet `buf[at..]` (BTH through ICRC, as a UDP socket
/// receives it), computed in one pass over contiguous memory: the masked
/// pseudo-header is written into the headroom `buf[at - headroom(ip)..at]`, which
/// is clobbered, and the BTH is masked and restored in place.
///
/// This is the receive and send path of a transport that keeps headroom in front
/// of each packet: hashing one contiguous run avoids a separate pass over the
/// 48-88-byte pseudo-header, which crc32fast cannot fold with PCLMULQDQ (it needs
/// 128 bytes). [`compute_parts`] gives the same value without touching the buffer.
pub fn compute_in_place(
    buf: &mut [u8],
    at: usize,
    ip_header: &[u8],
    udp_header: &[u8],
) -> Result<u32> {
    let ib = buf.get(at..).unwrap_or(&[]);
    if ib.len() < bth::HEADER_LEN + ICRC_LEN {
        return Err(Error::truncated(Layer::Bth, bth::HEADER_LEN + ICRC_LEN, ib.len()).at(at));
    }
    check_parts(ip_header, udp_header, ib)?;
    let end = buf.len() - ICRC_LEN;
    let room = headroom(ip_header.len());
    let start = at
        .checked_sub(room)
        .ok_or(Error::truncated(Layer::Icrc, room, at))?;
    let mut bth_copy = [0u8; bth::HEADER_LEN];
    bth_copy.copy_from_slice(&buf[at..at + bth::HEADER_LEN]);
    let (head, ib) = buf.split_at_mut(at);
    // `head[start..]` is exactly the headroom: the BTH stays where it is.
    write_pseudo(&mut head[start..], ip_header, udp_header, &bth_copy);
    let saved = ib[bth::RESV8A_OFFSET];
    ib[bth::RESV8A_OFFSET] = 0xFF;
    let mut h = hasher();
    h.update(&buf[start..end]);
    let crc = h.finalize();
    buf[at + bth::RESV8A_OFFSET] = saved;
    Ok(crc)
}

fn check_parts(ip_header: &[u8], udp_header: &[u8], ib: &[u8]) -> Result<()> {
    let ip_len = ip_header.len();
    let version = ip_header.first().map(|b| b >> 4);
    let ip_ok = match version {
        Some(4) => (20..=60).contains(&ip_len),
        Some(6) => ip_len == 40,
        _ => false,
    };
    if !ip_ok {
        let layer = if version == Some(6) {
            Layer::Ipv6
        } else {
            Layer::Ipv4
        };
        return Err(Error::new(
            layer,
            ErrorKind::BadLength {
                field: ip_len,
                actual: ip_len,
            },
        ));
    }
    if udp_header.len() != UDP_LEN {
        return Err(Error::truncated(Layer::Udp, UDP_LEN, udp_header.len()));
    }
    if ib.len() < bth::HEADER_LEN {
        return Err(Error::truncated(Layer::Bth, bth::HEADER_LEN, ib.len()));
    }
    Ok(())
}

/// Write 8 x 0xFF, the masked IP header, the masked UDP header and, when `out`
/// has room for it, the masked BTH; returns the bytes written.
fn write_pseudo(out: &mut [u8], ip_header: &[u8], udp_header: &[u8], bth: &[u8]) -> usize {
    let ip_len = ip_header.len();
    out[..LRH_PLACEHOLDER].fill(0xFF);
    let mut n = LRH_PLACEHOLDER;
    out[n..n + ip_len].copy_from_slice(ip_header);
    mask_ip(&mut out[n..n + ip_len]);
    n += ip_len;
    out[n..n + UDP_LEN].copy_from_slice(udp_header);
    out[n + 6] = 0xFF; // UDP checksum
    out[n + 7] = 0xFF;
    n += UDP_LEN;
    if out.len() >= n + bth::HEADER_LEN {
        out[n..n + bth::HEADER_LEN].copy_from_slice(&bth[..bth::HEADER_LEN]);
        out[n + bth::RESV8A_OFFSET] = 0xFF;
        n += bth::HEADER_LEN;
    }
    n
}

/// The ICRC of an IB packet `ib` (BTH through the last pad byte) that travels
/// in a UDP datagram from `src`:`src_port` to `dst`:4791, under the convention
/// of a sender on an unconnected UDP socket with `IP_PMTUDISC_DO`: IPv4 with
/// identification 0 and DF set (TOS and TTL are masked), or IPv6 (traffic
/// class, flow label and hop limit are masked). A receiver on a UDP socket,
/// which cannot see the IP header, verifies under the same convention.
pub fn for_udp(src: IpAddr, dst: IpAddr, src_port: u16, ib: &[u8]) -> Result<u32> {
    let udp_len = 8 + ib.len() + ICRC_LEN;
    let mut ip = [0u8; 40];
    let ip_len = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            // Only what the ICRC covers: TOS, TTL and the checksum are masked.
            let total = u16::try_from(ipv4::MIN_HEADER_LEN + udp_len).map_err(|_| {
                Error::new(
                    Layer::Ipv4,
                    ErrorKind::Oversized {
                        max: usize::from(u16::MAX),
                        actual: ipv4::MIN_HEADER_LEN + udp_len,
                    },
                )
            })?;
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&total.to_be_bytes());
            ip[6] = 0x40; // DF, identification 0
            ip[9] = ipv4::PROTO_UDP;
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            ipv4::MIN_HEADER_LEN
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            ipv6::Repr::new(s, d).emit(&mut ip, udp_len)?;
            ipv6::HEADER_LEN
        }
        _ => {
            return Err(Error::new(
                Layer::Ipv4,
                ErrorKind::BadVersion(if src.is_ipv4() { 6 } else { 4 }),
            ))
        }
    };
    let mut udp = [0u8; UDP_LEN];
    udp[..2].copy_from_slice(&src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&crate::ROCE_V2_PORT.to_be_bytes());
    udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    compute_parts(&ip[..ip_len], &udp, ib)
}

/// How many IPv4 identifications a receiver on a UDP socket accepts, from 0:
/// one per segment of a UDP GSO send (see [`ipv4_id_delta`]).
pub const UDP_GSO_IDS: u16 = 64;

/// The reflected CRC-32 polynomial.
const POLY: u32 = 0xEDB8_8320;

/// `a * b` modulo the CRC polynomial, in the CRC's reflected representation
/// (bit 31 is the coefficient of x^0).
const fn gf_mul(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut i = 0;
    while i < 32 {
        if a & (1 << (31 - i)) != 0 {
            product ^= b;
        }
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        i += 1;
    }
    product
}

/// x^(8 * bytes) modulo the polynomial: what `bytes` zero bytes do to a CRC
/// register.
fn zeros(mut bytes: usize) -> u32 {
    let mut power = 1 << 31; // x^0
    let mut square = 1 << (31 - 8); // x^8
    while bytes != 0 {
        if bytes & 1 != 0 {
            power = gf_mul(power, square);
        }
        square = gf_mul(square, square);
        bytes >>= 1;
    }
    power
}

/// The CRC register after the two bytes of `id` (big-endian), from zero.
const fn raw_id(id: u16) -> u32 {
    let mut crc = 0u32;
    let bytes = id.to_be_bytes();
    let mut i = 0;
    while i < 2 {
        crc ^= bytes[i] as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
            bit += 1;
        }
        i += 1;
    }
    crc
}

/// How the ICRC of a RoCE v2 packet in IPv4 changes when its IPv4
/// identification is `id` instead of 0: `ICRC(id) = ICRC(0) ^ delta`, for an
/// IB part (BTH through the last pad byte) of `ib_len` bytes.
///
/// A CRC is linear: two messages of one length that differ only in the
/// identification have CRCs that differ by the CRC, from zero, of that
/// difference followed by the bytes after it (14 of the IPv4 header, the UDP
/// header, the IB part), which is `raw(id) * x^(8 * bytes after)`.
///
/// Linux gives the datagrams it cuts from one UDP GSO send (`UDP_SEGMENT`)
/// on an unconnected socket with `IP_PMTUDISC_DO` the identifications 0, 1,
/// 2, ...: a sender that prepares segment `i`'s ICRC for identification `i`
/// sends correct packets, and a receiver on a UDP socket, which never sees
/// the identification, accepts identifications below [`UDP_GSO_IDS`].
pub fn ipv4_id_delta(id: u16, ib_len: usize) -> u32 {
    IdDeltas::new(ib_len).get(id)
}

/// [`ipv4_id_delta`] for one IB length and every identification, at the
/// cost of one power for the length: a GSO send's segments share theirs.
#[derive(Debug, Clone, Copy)]
pub struct IdDeltas {
    ib_len: usize,
    shift: u32,
    /// The deltas of the identifications with one bit set, below
    /// [`UDP_GSO_IDS`].
    basis: [u32; GSO_ID_BITS],
}

/// Bits of an identification below [`UDP_GSO_IDS`].
const GSO_ID_BITS: usize = UDP_GSO_IDS.trailing_zeros() as usize;

impl IdDeltas {
    /// The deltas for IB parts of `ib_len` bytes.
    pub fn new(ib_len: usize) -> IdDeltas {
        // After the identification: IPv4 bytes 6..20, the UDP header, the IB part.
        let shift = zeros(14 + UDP_LEN + ib_len);
        let mut basis = [0; GSO_ID_BITS];
        for (b, d) in basis.iter_mut().enumerate() {
            *d = gf_mul(raw_id(1 << b), shift);
        }
        IdDeltas {
            ib_len,
            shift,
            basis,
        }
    }

    /// The IB length these deltas are for.
    pub fn ib_len(&self) -> usize {
        self.ib_len
    }

    /// The deltas for IB parts of `ib_len` bytes, from `cache` if they are
    /// the ones it holds, else made and kept there: the segments of one GSO
    /// send, and most packets of a stream, share one length.
    pub fn cached(cache: &mut Option<IdDeltas>, ib_len: usize) -> IdDeltas {
        match cache {
            Some(d) if d.ib_len == ib_len => *d,
            _ => *cache.insert(IdDeltas::new(ib_len)),
        }
    }

    /// The delta for identification `id`.
    pub fn get(&self, id: u16) -> u32 {
        if id < UDP_GSO_IDS {
            // The XOR of its bits' deltas: no multiplication.
            let mut delta = 0;
            for (b, d) in self.basis.iter().enumerate() {
                if id & (1 << b) != 0 {
                    delta ^= d;
                }
            }
            return delta;
        }
        gf_mul(raw_id(id), self.shift)
    }

    /// The identification below [`UDP_GSO_IDS`] whose delta is `delta`, if
    /// any (0 for no change).
    pub fn find(&self, delta: u32) -> Option<u16> {
        // Linear in the identification: build each delta from the deltas of
        // single bits, in Gray-code order (one XOR per step).
        let mut acc = 0u32;
        for step in 0..UDP_GSO_IDS {
            if step != 0 {
                acc ^= self.basis[step.trailing_zeros() as usize];
            }
            if acc == delta {
                return Some(step ^ (step >> 1));
            }
        }
        None
    }
}

/// Whether `icrc` is the ICRC of `ib` sent from `src`:`src_port` to
/// `dst`:4791 on a UDP socket, under [`for_udp`]'s convention or, in IPv4,
/// as one of the first [`UDP_GSO_IDS`] segments of a GSO send (whose
/// identification is its index), and if so under which identification (0
/// for IPv6, whose ICRC has none): what the packet carried on the wire.
/// `None` if it does not verify. `deltas` caches the deltas for one length
/// between calls.
pub fn udp_ident(
    src: IpAddr,
    dst: IpAddr,
    src_port: u16,
    ib: &[u8],
    icrc: u32,
    deltas: &mut Option<IdDeltas>,
) -> Result<Option<u16>> {
    let expected = for_udp(src, dst, src_port, ib)?;
    if expected == icrc {
        return Ok(Some(0));
    }
    if !src.is_ipv4() {
        return Ok(None);
    }
    Ok(IdDeltas::cached(deltas, ib.len()).find(expected ^ icrc))
}

/// Make the ICRC of `packet` (a RoCE v2 packet in IPv4, BTH through ICRC),
/// computed for IPv4 identification 0 as [`for_udp`] computes it, the ICRC
/// for identification `id`: what segment `id` of a UDP GSO send must carry
/// (see [`ipv4_id_delta`]). `deltas` caches the work for one length between
/// calls. An error if `packet` is too short to hold an ICRC.
pub fn set_ipv4_id(packet: &mut [u8], id: u16, deltas: &mut Option<IdDeltas>) -> Result<()> {
    let ib_len = packet.len().checked_sub(ICRC_LEN).ok_or(Error::truncated(
        Layer::Icrc,
        ICRC_LEN,
        packet.len(),
    ))?;
    let delta = IdDeltas::cached(deltas, ib_len).get(id).to_le_bytes();
    for (b, x) in packet[ib_len..].iter_mut().zip(delta) {
        *b ^= x;
    }
    Ok(())
}

/// Split an IP packet (IP header through ICRC) into IP header, UDP header, and
/// the IB part without the ICRC.
fn split(ip_packet: &[u8]) -> Result<(&[u8], &[u8], &[u8])> {
    let first = *ip_packet
        .first()
        .ok_or(Error::truncated(Layer::Ipv4, 20, 0))?;
    let (layer, ip_len) = match first >> 4 {
        4 => (Layer::Ipv4, usize::from(first & 0x0F) * 4),
        6 => (Layer::Ipv6, 40),
        v => return Err(Error::new(Layer::Ipv4, ErrorKind::BadVersion(v))),
    };
    if ip_len < 20 {
        return Err(Error::new(
            layer,
            ErrorKind::BadLength {
                field: ip_len,
                actual: ip_packet.len(),
            },
        ));
    }
    let needed = ip_len + UDP_LEN + bth::HEADER_LEN + ICRC_LEN;
    if ip_packet.len() < needed {
        return Err(Error::truncated(layer, needed, ip_packet.len()));
    }
    let (ip, rest) = ip_packet.split_at(ip_len);
    let (udp, ib) = rest.split_at(UDP_LEN);
    Ok((ip, udp, &ib[..ib.len() - ICRC_LEN]))
}

/// The ICRC of `ip_packet`: an IPv4 or IPv6 packet from the first IP header byte
/// through the ICRC (whose own 4 bytes are not covered). Lengths come from the
/// slice, not from the IP header: callers trim Ethernet padding first.
pub fn compute(ip_packet: &[u8]) -> Result<u32> {
    let (ip, udp, ib) = split(ip_packet)?;
    compute_parts(ip, udp, ib)
}

/// The ICRC stored at the end of `ip_packet`.
pub fn stored(ip_packet: &[u8]) -> Result<u32> {
    split(ip_packet)?;
    let n = ip_packet.len();
    Ok(u32::from_le_bytes([
        ip_packet[n - 4],
        ip_packet[n - 3],
        ip_packet[n - 2],
        ip_packet[n - 1],
    ]))
}

/// Whether the ICRC at the end of `ip_packet` is right.
pub fn verify(ip_packet: &[u8]) -> Result<bool> {
    Ok(compute(ip_packet)? == stored(ip_packet)?)
}

/// Compute and store the ICRC at the end of `ip_packet`.
pub fn fill(ip_packet: &mut [u8]) -> Result<u32> {
    let icrc = compute(ip_packet)?;
    let n = ip_packet.len();
    ip_packet[n - 4..].copy_from_slice(&icrc.to_le_bytes());
    Ok(icrc)
}

#[cfg(test)]
mod tests {
    use super::*;

    // rxe-rc_pingpong.pcap, the first ACK (10.77.0.2 -> 10.77.0.1), from the IP
    // header through the ICRC 52 f1 d5 81.
    const ACK: &str = "4500003049b140004011dc6f0a4d00020a4d0001c12112b7001c0000\
                       1100ffff000000110074e0701f00000152f1d581";

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len() / 2)
            .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn masks_only_variant_fields() {
        let pkt = hex(ACK);
        assert!(verify(&pkt).unwrap());
        let icrc = stored(&pkt).unwrap();
        assert_eq!(icrc, 0x81d5_f152);
        let mut refilled = pkt.clone();
        refilled[pkt.len() - 4..].fill(0);
        assert_eq!(fill(&mut refilled).unwrap(), icrc);
        assert_eq!(refilled, pkt);
        // In place, with headroom in front of the BTH: same value, packet untouched.
        let mut room = vec![0xEEu8; headroom(20)];
        room.extend_from_slice(&pkt[28..]);
        let at = headroom(20);
        let before = room[at..].to_vec();
        assert_eq!(
            compute_in_place(&mut room, at, &pkt[..20], &pkt[20..28]),
            Ok(icrc)
        );
        assert_eq!(room[at..], before[..]);
        assert!(compute_in_place(&mut room, at - 1, &pkt[..20], &pkt[20..28]).is_err());
        // TOS, TTL, IP checksum, UDP checksum, BTH byte 4: masked.
        for at in [1usize, 8, 10, 11, 20 + 6, 20 + 7, 28 + 4] {
            let mut p = pkt.clone();
            p[at] ^= 0xA5;
            assert_eq!(compute(&p).unwrap(), icrc, "byte {at} should be masked");
        }
        // The IPv4 ID and flags, and every other byte: covered.
        for at in (0..pkt.len() - 4).filter(|a| ![1, 8, 10, 11, 26, 27, 32].contains(a)) {
            let mut p = pkt.clone();
            p[at] ^= 0x01;
            // Byte 0 holds the IHL: a flip there may make the header unparsable.
            assert_ne!(compute(&p).ok(), Some(icrc), "byte {at} should be covered");
        }
    }

    #[test]
    fn udp_convention_matches_a_frame_with_id_0() {
        // The same packet as a whole frame with IPv4 ID 0 and DF: same ICRC.
        let mut pkt = hex(ACK);
        pkt[4] = 0;
        pkt[5] = 0;
        let expected = compute(&pkt).unwrap();
        let ib = &pkt[28..pkt.len() - 4];
        let src = IpAddr::from([10, 77, 0, 2]);
        let dst = IpAddr::from([10, 77, 0, 1]);
        assert_eq!(for_udp(src, dst, 0xc121, ib), Ok(expected));
        assert!(for_udp(src, IpAddr::from([0u16; 8]), 1, ib).is_err());
    }

    #[test]
    fn rejects_short_and_odd_input() {
        assert!(compute(&[]).is_err());
        assert!(compute(&[0x45; 30]).is_err());
        assert_eq!(
            compute(&[0x75; 80]).unwrap_err().kind,
            ErrorKind::BadVersion(7)
        );
        assert!(compute(&[0x41; 80]).is_err()); // IHL 1
        assert!(compute_parts(&[0x45; 20], &[0; 7], &[0; 12]).is_err());
        assert!(compute_parts(&[0x60; 39], &[0; 8], &[0; 12]).is_err());
    }

    /// rdma_rxe numbers its IPv4 packets: the ACK above carries 0x49b1. Its
    /// ICRC is the one for identification 0, changed by the delta.
    #[test]
    fn a_real_packet_s_identification_is_a_delta() {
        let pkt = hex(ACK);
        let ib = &pkt[28..pkt.len() - 4];
        let src = IpAddr::from([10, 77, 0, 2]);
        let dst = IpAddr::from([10, 77, 0, 1]);
        let at_0 = for_udp(src, dst, 0xc121, ib).unwrap();
        assert_eq!(at_0 ^ ipv4_id_delta(0x49b1, ib.len()), 0x81d5_f152);
        assert_eq!(ipv4_id_delta(0, ib.len()), 0);
        // Outside the GSO window: a UDP receiver still refuses it.
        let mut cache = None;
        assert_eq!(
            udp_ident(src, dst, 0xc121, ib, 0x81d5_f152, &mut cache).unwrap(),
            None
        );
    }

    /// A packet whose ICRC was made for identification 0, renumbered to
    /// rdma_rxe's 0x49b1, carries the ICRC rdma_rxe put on the wire; the
    /// cache serves a second packet of the same length.
    #[test]
    fn renumbering_a_packet_gives_the_icrc_of_its_new_identification() {
        let pkt = hex(ACK);
        let (ib, wire_icrc) = pkt[28..].split_at(pkt.len() - 28 - ICRC_LEN);
        let src = IpAddr::from([10, 77, 0, 2]);
        let dst = IpAddr::from([10, 77, 0, 1]);
        let mut packet = ib.to_vec();
        let at_0 = for_udp(src, dst, 0xc121, ib).unwrap();
        packet.extend_from_slice(&at_0.to_le_bytes());
        let mut cache = None;
        let mut again = packet.clone();
        set_ipv4_id(&mut packet, 0x49b1, &mut cache).unwrap();
        assert_eq!(&packet[ib.len()..], wire_icrc);
        assert_eq!(cache.map(|c| c.ib_len()), Some(ib.len()));
        set_ipv4_id(&mut again, 0x49b1, &mut cache).unwrap();
        assert_eq!(again, packet);
        let mut first = ib.to_vec();
        first.extend_from_slice(&at_0.to_le_bytes());
        set_ipv4_id(&mut first, 0, &mut cache).unwrap();
        assert_eq!(
            &first[ib.len()..],
            &at_0.to_le_bytes(),
            "identification 0 changes nothing"
        );
        assert!(set_ipv4_id(&mut [0; 3], 1, &mut cache).is_err());
    }

    proptest::proptest! {
        /// For any packet and identification, a frame carrying that
        /// identification has the ICRC that the delta predicts, and a UDP
        /// receiver accepts it exactly when the identification is in the
        /// GSO window.
        #[test]
        fn deltas_match_frames_with_that_identification(
            ib_len in 12usize..4200,
            fill in proptest::num::u8::ANY,
            id in proptest::num::u16::ANY,
            small in 0u16..UDP_GSO_IDS,
        ) {
            let src = IpAddr::from([10, 0, 0, 1]);
            let dst = IpAddr::from([10, 0, 0, 2]);
            let mut ib: Vec<u8> = (0..ib_len).map(|i| (i as u8).wrapping_mul(fill)).collect();
            ib[0] = 0x04; // an RC SEND_ONLY BTH is enough for the CRC
            for id in [id, small] {
                let mut frame = vec![0u8; 28];
                let total = (28 + ib_len + ICRC_LEN) as u16;
                frame[0] = 0x45;
                frame[2..4].copy_from_slice(&total.to_be_bytes());
                frame[4..6].copy_from_slice(&id.to_be_bytes());
                frame[6] = 0x40;
                frame[8] = 64;
                frame[9] = ipv4::PROTO_UDP;
                frame[12..16].copy_from_slice(&[10, 0, 0, 1]);
                frame[16..20].copy_from_slice(&[10, 0, 0, 2]);
                frame[20..22].copy_from_slice(&0xc000u16.to_be_bytes());
                frame[22..24].copy_from_slice(&crate::ROCE_V2_PORT.to_be_bytes());
                frame[24..26].copy_from_slice(&((8 + ib_len + ICRC_LEN) as u16).to_be_bytes());
                frame.extend_from_slice(&ib);
                frame.extend_from_slice(&[0; ICRC_LEN]);
                let real = fill_frame(&mut frame);
                let at_0 = for_udp(src, dst, 0xc000, &ib).unwrap();
                proptest::prop_assert_eq!(at_0 ^ ipv4_id_delta(id, ib_len), real);
                let deltas = IdDeltas::new(ib_len);
                let found = deltas.find(at_0 ^ real);
                proptest::prop_assert_eq!(found, (id < UDP_GSO_IDS).then_some(id));
                let mut cache = None;
                proptest::prop_assert_eq!(
                    udp_ident(src, dst, 0xc000, &ib, real, &mut cache).unwrap(),
                    (id < UDP_GSO_IDS).then_some(id)
                );
            }
        }
    }

    fn fill_frame(frame: &mut [u8]) -> u32 {
        fill(frame).unwrap()
    }
}
