//! IPv4 header (RFC 791).

use core::fmt;
use std::net::Ipv4Addr;

use crate::field::*;
use crate::{Error, ErrorKind, Layer, Result};

/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;

/// Bytes of an IPv4 header without options.
pub const MIN_HEADER_LEN: usize = 20;

crate::field::fixed_header_view!(
    /// A read/write view of an IPv4 header (the 20 fixed bytes; options follow
    /// when IHL > 5).
    layer = Layer::Ipv4, len = 20
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Version (4).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }
    /// Header length in bytes (IHL x 4).
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[0] & 0x0F) * 4
    }
    /// TOS byte: DSCP (6 bits) and ECN (2 bits).
    pub fn tos(&self) -> u8 {
        self.buffer.as_ref()[1]
    }
    /// Total length of header and payload.
    pub fn total_len(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 2)
    }
    /// Identification. Covered by the ICRC: a UDP-socket receiver cannot see it.
    pub fn ident(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 4)
    }
    /// DF: don't fragment.
    pub fn dont_frag(&self) -> bool {
        self.buffer.as_ref()[6] & 0x40 != 0
    }
    /// MF: more fragments.
    pub fn more_frags(&self) -> bool {
        self.buffer.as_ref()[6] & 0x20 != 0
    }
    /// Fragment offset in 8-byte units.
    pub fn frag_offset(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 6) & 0x1FFF
    }
    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[8]
    }
    /// Protocol.
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[9]
    }
    /// Header checksum.
    pub fn checksum(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 10)
    }
    /// Source address.
    pub fn src_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(get_u32(self.buffer.as_ref(), 12))
    }
    /// Destination address.
    pub fn dst_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(get_u32(self.buffer.as_ref(), 16))
    }
    /// Whether the header checksum is right (the buffer must hold the whole header).
    pub fn verify_checksum(&self) -> bool {
        let b = self.buffer.as_ref();
        let n = self.header_len().clamp(MIN_HEADER_LEN, b.len());
        checksum(&b[..n]) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set version 4 and the header length in bytes (a multiple of 4, 20-60).
    pub fn set_version_and_len(&mut self, header_len: usize) {
        self.buffer.as_mut()[0] = 0x40 | ((header_len / 4) as u8 & 0x0F);
    }
    /// Set the TOS byte.
    pub fn set_tos(&mut self, v: u8) {
        self.buffer.as_mut()[1] = v;
    }
    /// Set the total length.
    pub fn set_total_len(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 2, v);
    }
    /// Set the identification.
    pub fn set_ident(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 4, v);
    }
    /// Set flags (DF only; MF clear) and a zero fragment offset.
    pub fn set_dont_frag(&mut self, df: bool) {
        set_u16(self.buffer.as_mut(), 6, if df { 0x4000 } else { 0 });
    }
    /// Set TTL.
    pub fn set_ttl(&mut self, v: u8) {
        self.buffer.as_mut()[8] = v;
    }
    /// Set the protocol.
    pub fn set_protocol(&mut self, v: u8) {
        self.buffer.as_mut()[9] = v;
    }
    /// Set the source address.
    pub fn set_src_addr(&mut self, a: Ipv4Addr) {
        set_u32(self.buffer.as_mut(), 12, a.into());
    }
    /// Set the destination address.
    pub fn set_dst_addr(&mut self, a: Ipv4Addr) {
        set_u32(self.buffer.as_mut(), 16, a.into());
    }
    /// Compute and store the header checksum.
    pub fn fill_checksum(&mut self) {
        let n = self
            .header_len()
            .clamp(MIN_HEADER_LEN, self.buffer.as_ref().len());
        set_u16(self.buffer.as_mut(), 10, 0);
        let c = checksum(&self.buffer.as_ref()[..n]);
        set_u16(self.buffer.as_mut(), 10, c);
    }
}

/// The Internet checksum (RFC 1071) of `data`.
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

/// IPv4 header fields that matter to RoCE v2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Source address.
    pub src_addr: Ipv4Addr,
    /// Destination address.
    pub dst_addr: Ipv4Addr,
    /// TOS byte (DSCP and ECN).
    pub tos: u8,
    /// Identification.
    pub ident: u16,
    /// DF flag.
    pub dont_frag: bool,
    /// TTL.
    pub ttl: u8,
}

impl Repr {
    /// What Linux rdma_rxe and an unconnected `IP_PMTUDISC_DO` UDP socket send:
    /// TOS 0, ID 0, DF, TTL 64.
    pub const fn new(src_addr: Ipv4Addr, dst_addr: Ipv4Addr) -> Repr {
        Repr {
            src_addr,
            dst_addr,
            tos: 0,
            ident: 0,
            dont_frag: true,
            ttl: 64,
        }
    }

    /// Parse an IPv4 header carrying UDP; returns the fields, the header length,
    /// and the total length from the header (checked against the buffer).
    pub fn parse(b: &[u8]) -> Result<(Repr, usize, usize)> {
        let p = Packet::new_checked(b)?;
        if p.version() != 4 {
            return Err(Error::new(Layer::Ipv4, ErrorKind::BadVersion(p.version())));
        }
        let hlen = p.header_len();
        let total = usize::from(p.total_len());
        if hlen < MIN_HEADER_LEN || total < hlen {
            return Err(Error::new(
                Layer::Ipv4,
                ErrorKind::BadLength {
                    field: hlen.max(total),
                    actual: b.len(),
                },
            ));
        }
        if total > b.len() {
            return Err(Error::truncated(Layer::Ipv4, total, b.len()));
        }
        if p.protocol() != PROTO_UDP {
            return Err(Error::new(
                Layer::Ipv4,
                ErrorKind::NotRoce(u16::from(p.protocol())),
            ));
        }
        if p.more_frags() || p.frag_offset() != 0 {
            return Err(Error::new(Layer::Ipv4, ErrorKind::Fragmented));
        }
        Ok((
            Repr {
                src_addr: p.src_addr(),
                dst_addr: p.dst_addr(),
                tos: p.tos(),
                ident: p.ident(),
                dont_frag: p.dont_frag(),
                ttl: p.ttl(),
            },
            hlen,
            total,
        ))
    }

    /// Write a 20-byte header for a UDP payload of `payload_len` bytes, checksum included.
    pub fn emit(&self, buf: &mut [u8], payload_len: usize) -> Result<()> {
        crate::error::need(Layer::Ipv4, buf, MIN_HEADER_LEN)?;
        let total = MIN_HEADER_LEN + payload_len;
        let total = u16::try_from(total).map_err(|_| {
            Error::new(
                Layer::Ipv4,
                ErrorKind::Oversized {
                    max: usize::from(u16::MAX),
                    actual: total,
                },
            )
        })?;
        let mut p = Packet::new_unchecked(&mut buf[..MIN_HEADER_LEN]);
        p.set_version_and_len(MIN_HEADER_LEN);
        p.set_tos(self.tos);
        p.set_total_len(total);
        p.set_ident(self.ident);
        p.set_dont_frag(self.dont_frag);
        p.set_ttl(self.ttl);
        p.set_protocol(PROTO_UDP);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
        p.fill_checksum();
        Ok(())
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "IPv4 {} > {} tos={:#04x} id={:#06x}{} ttl={}",
            self.src_addr,
            self.dst_addr,
            self.tos,
            self.ident,
            if self.dont_frag { " DF" } else { "" },
            self.ttl
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // rxe-rc_pingpong.pcap, the first ACK's IPv4 header.
    static HDR: [u8; 20] = [
        0x45, 0x00, 0x00, 0x30, 0x49, 0xb1, 0x40, 0x00, 0x40, 0x11, 0xdc, 0x6f, 0x0a, 0x4d, 0x00,
        0x02, 0x0a, 0x4d, 0x00, 0x01,
    ];

    #[test]
    fn deconstruct_construct() {
        let mut pkt = HDR.to_vec();
        pkt.resize(0x30, 0);
        let (repr, hlen, total) = Repr::parse(&pkt).unwrap();
        assert_eq!((hlen, total), (20, 0x30));
        assert_eq!(repr.src_addr, Ipv4Addr::new(10, 77, 0, 2));
        assert_eq!(repr.ident, 0x49b1);
        assert!(repr.dont_frag);
        assert!(Packet::new_unchecked(&HDR[..]).verify_checksum());
        let mut buf = [0u8; 20];
        repr.emit(&mut buf, 0x30 - 20).unwrap();
        assert_eq!(buf, HDR);
    }

    #[test]
    fn rejects() {
        let mut pkt = HDR.to_vec();
        assert!(matches!(
            Repr::parse(&pkt).unwrap_err().kind,
            ErrorKind::Truncated {
                needed: 48,
                available: 20
            }
        ));
        pkt.resize(0x30, 0);
        pkt[9] = 6;
        assert_eq!(Repr::parse(&pkt).unwrap_err().kind, ErrorKind::NotRoce(6));
        pkt[9] = 17;
        pkt[6] = 0x20;
        assert_eq!(Repr::parse(&pkt).unwrap_err().kind, ErrorKind::Fragmented);
    }
}
