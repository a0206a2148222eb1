//! IPv6 fixed header (RFC 8200). RoCE v2 packets carry no extension headers.

use core::fmt;
use std::net::Ipv6Addr;

use crate::field::*;
use crate::{Error, ErrorKind, Layer, Result};

use super::ipv4::PROTO_UDP;

crate::field::fixed_header_view!(
    /// A read/write view of an IPv6 header.
    layer = Layer::Ipv6, len = 40
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Version (6).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }
    /// Traffic class (DSCP and ECN).
    pub fn traffic_class(&self) -> u8 {
        ((get_u16(self.buffer.as_ref(), 0) >> 4) & 0xFF) as u8
    }
    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0) & 0x000F_FFFF
    }
    /// Payload length.
    pub fn payload_len(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 4)
    }
    /// Next header.
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[6]
    }
    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[7]
    }
    /// Source address.
    pub fn src_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[8..24]);
        Ipv6Addr::from(a)
    }
    /// Destination address.
    pub fn dst_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[24..40]);
        Ipv6Addr::from(a)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set version 6, traffic class and flow label.
    pub fn set_version_tc_flow(&mut self, traffic_class: u8, flow_label: u32) {
        let v = (6u32 << 28) | (u32::from(traffic_class) << 20) | (flow_label & 0x000F_FFFF);
        set_u32(self.buffer.as_mut(), 0, v);
    }
    /// Set the payload length.
    pub fn set_payload_len(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 4, v);
    }
    /// Set the next header.
    pub fn set_next_header(&mut self, v: u8) {
        self.buffer.as_mut()[6] = v;
    }
    /// Set the hop limit.
    pub fn set_hop_limit(&mut self, v: u8) {
        self.buffer.as_mut()[7] = v;
    }
    /// Set the source address.
    pub fn set_src_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[8..24].copy_from_slice(&a.octets());
    }
    /// Set the destination address.
    pub fn set_dst_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[24..40].copy_from_slice(&a.octets());
    }
}

/// IPv6 header fields that matter to RoCE v2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Source address.
    pub src_addr: Ipv6Addr,
    /// Destination address.
    pub dst_addr: Ipv6Addr,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label.
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
}

impl Repr {
    /// Traffic class 0, flow label 0, hop limit 64.
    pub const fn new(src_addr: Ipv6Addr, dst_addr: Ipv6Addr) -> Repr {
        Repr {
            src_addr,
            dst_addr,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        }
    }

    /// Parse an IPv6 header carrying UDP; returns the fields and the packet's
    /// total length (40 + payload length, checked against the buffer).
    pub fn parse(b: &[u8]) -> Result<(Repr, usize)> {
        let p = Packet::new_checked(b)?;
        if p.version() != 6 {
            return Err(Error::new(Layer::Ipv6, ErrorKind::BadVersion(p.version())));
        }
        let total = HEADER_LEN + usize::from(p.payload_len());
        if total > b.len() {
            return Err(Error::truncated(Layer::Ipv6, total, b.len()));
        }
        if p.next_header() != PROTO_UDP {
            return Err(Error::new(
                Layer::Ipv6,
                ErrorKind::NotRoce(u16::from(p.next_header())),
            ));
        }
        Ok((
            Repr {
                src_addr: p.src_addr(),
                dst_addr: p.dst_addr(),
                traffic_class: p.traffic_class(),
                flow_label: p.flow_label(),
                hop_limit: p.hop_limit(),
            },
            total,
        ))
    }

    /// Write the header for a UDP payload of `payload_len` bytes.
    pub fn emit(&self, buf: &mut [u8], payload_len: usize) -> Result<()> {
        crate::error::need(Layer::Ipv6, buf, HEADER_LEN)?;
        let len = u16::try_from(payload_len).map_err(|_| {
            Error::new(
                Layer::Ipv6,
                ErrorKind::Oversized {
                    max: usize::from(u16::MAX),
                    actual: payload_len,
                },
            )
        })?;
        let mut p = Packet::new_unchecked(&mut buf[..HEADER_LEN]);
        p.set_version_tc_flow(self.traffic_class, self.flow_label);
        p.set_payload_len(len);
        p.set_next_header(PROTO_UDP);
        p.set_hop_limit(self.hop_limit);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
        Ok(())
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "IPv6 {} > {} tc={:#04x} flow={:#07x} hlim={}",
            self.src_addr, self.dst_addr, self.traffic_class, self.flow_label, self.hop_limit
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut repr = Repr::new("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        repr.traffic_class = 0xB8;
        repr.flow_label = 0x12345;
        let mut buf = vec![0u8; 40 + 28];
        repr.emit(&mut buf, 28).unwrap();
        assert_eq!(&buf[..8], &[0x6B, 0x81, 0x23, 0x45, 0x00, 0x1c, 17, 64]);
        assert_eq!(Repr::parse(&buf).unwrap(), (repr, 68));
        buf[6] = 58;
        assert_eq!(Repr::parse(&buf).unwrap_err().kind, ErrorKind::NotRoce(58));
    }
}
