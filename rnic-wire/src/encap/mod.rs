//! Encapsulation of RoCE v2: link header (Ethernet II with an optional 802.1Q
//! tag, or the Linux cooked headers of captures), IPv4 or IPv6, UDP to port 4791.
//!
//! [`Frame::parse`] takes a whole captured frame apart and checks the ICRC;
//! [`FrameRepr::emit`] builds one, ICRC included.

pub mod ethernet;
pub mod ipv4;
pub mod ipv6;
pub mod udp;

use core::fmt;
use std::net::IpAddr;

use crate::field::get_u16;
use crate::ib::{IbPacket, IbRepr};
use crate::{icrc, Error, ErrorKind, Layer, Result};

/// How a captured frame begins (pcap LINKTYPE_ values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkType {
    /// LINKTYPE_ETHERNET (1).
    Ethernet,
    /// LINKTYPE_LINUX_SLL (113): Linux "any" device captures.
    LinuxSll,
    /// LINKTYPE_LINUX_SLL2 (276).
    LinuxSll2,
    /// LINKTYPE_RAW (101): the IP header first.
    RawIp,
    /// LINKTYPE_IPV4 (228).
    Ipv4,
    /// LINKTYPE_IPV6 (229).
    Ipv6,
}

impl LinkType {
    /// From a pcap link type number.
    pub const fn from_pcap(v: u32) -> Option<LinkType> {
        match v {
            1 => Some(LinkType::Ethernet),
            113 => Some(LinkType::LinuxSll),
            276 => Some(LinkType::LinuxSll2),
            101 => Some(LinkType::RawIp),
            228 => Some(LinkType::Ipv4),
            229 => Some(LinkType::Ipv6),
            _ => None,
        }
    }

    /// The pcap link type number.
    pub const fn to_pcap(self) -> u32 {
        match self {
            LinkType::Ethernet => 1,
            LinkType::LinuxSll => 113,
            LinkType::LinuxSll2 => 276,
            LinkType::RawIp => 101,
            LinkType::Ipv4 => 228,
            LinkType::Ipv6 => 229,
        }
    }
}

/// The IP header of a RoCE v2 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpRepr {
    /// IPv4.
    V4(ipv4::Repr),
    /// IPv6.
    V6(ipv6::Repr),
}

impl IpRepr {
    /// Source address.
    pub fn src_addr(&self) -> IpAddr {
        match self {
            IpRepr::V4(r) => r.src_addr.into(),
            IpRepr::V6(r) => r.src_addr.into(),
        }
    }
    /// Destination address.
    pub fn dst_addr(&self) -> IpAddr {
        match self {
            IpRepr::V4(r) => r.dst_addr.into(),
            IpRepr::V6(r) => r.dst_addr.into(),
        }
    }
    /// Header bytes [`IpRepr::emit`] writes.
    pub const fn header_len(&self) -> usize {
        match self {
            IpRepr::V4(_) => ipv4::MIN_HEADER_LEN,
            IpRepr::V6(_) => ipv6::HEADER_LEN,
        }
    }
    /// EtherType for this IP version.
    pub const fn ethertype(&self) -> u16 {
        match self {
            IpRepr::V4(_) => ethernet::ETHERTYPE_IPV4,
            IpRepr::V6(_) => ethernet::ETHERTYPE_IPV6,
        }
    }
    /// Write the header for `payload_len` bytes of UDP.
    pub fn emit(&self, buf: &mut [u8], payload_len: usize) -> Result<()> {
        match self {
            IpRepr::V4(r) => r.emit(buf, payload_len),
            IpRepr::V6(r) => r.emit(buf, payload_len),
        }
    }
}

impl fmt::Display for IpRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpRepr::V4(r) => r.fmt(f),
            IpRepr::V6(r) => r.fmt(f),
        }
    }
}

/// A parsed RoCE v2 frame: the headers as values, and a checked view of the IB
/// transport packet, borrowed from the frame.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    /// The Ethernet header, when the frame had one.
    pub ethernet: Option<ethernet::Repr>,
    /// The IP header.
    pub ip: IpRepr,
    /// The UDP header.
    pub udp: udp::Repr,
    /// Offset of the IP header in the frame.
    pub ip_offset: usize,
    /// Offset of the BTH in the frame.
    pub ib_offset: usize,
    /// The IP packet, from its header through the ICRC (without link padding).
    pub ip_packet: &'a [u8],
    /// The IB transport packet, BTH through ICRC.
    pub ib: IbPacket<&'a [u8]>,
    /// The ICRC computed over the frame (compare with `ib.icrc()`).
    pub computed_icrc: u32,
}

impl<'a> Frame<'a> {
    /// Parse a frame that starts with a `link` header. Errors carry the offset
    /// from the start of `frame`; [`Error::is_not_roce`] tells frames of other
    /// protocols from malformed RoCE v2.
    pub fn parse(link: LinkType, frame: &'a [u8]) -> Result<Frame<'a>> {
        let (ethernet, ethertype, ip_offset) = parse_link(link, frame)?;
        let ip_bytes = &frame[ip_offset..];
        let (ip, total) = match ethertype {
            ethernet::ETHERTYPE_IPV4 => {
                let (r, _, total) = ipv4::Repr::parse(ip_bytes).map_err(|e| e.at(ip_offset))?;
                (IpRepr::V4(r), total)
            }
            ethernet::ETHERTYPE_IPV6 => {
                let (r, total) = ipv6::Repr::parse(ip_bytes).map_err(|e| e.at(ip_offset))?;
                (IpRepr::V6(r), total)
            }
            t => return Err(Error::new(Layer::Ethernet, ErrorKind::NotRoce(t))),
        };
        let ip_packet = &ip_bytes[..total];
        let ip_hlen = match ip {
            IpRepr::V4(_) => usize::from(ip_packet[0] & 0x0F) * 4,
            IpRepr::V6(_) => ipv6::HEADER_LEN,
        };
        let udp_offset = ip_offset + ip_hlen;
        let udp_bytes = &ip_packet[ip_hlen..];
        let udp = udp::check_roce(udp_bytes).map_err(|e| e.at(udp_offset))?;
        let udp_len = usize::from(udp.len());
        if udp_len != udp_bytes.len() {
            return Err(Error::new(
                Layer::Udp,
                ErrorKind::BadLength {
                    field: udp_len,
                    actual: udp_bytes.len(),
                },
            )
            .at(udp_offset));
        }
        let udp_repr = udp::Repr {
            src_port: udp.src_port(),
            dst_port: udp.dst_port(),
        };
        let ib_offset = udp_offset + udp::HEADER_LEN;
        let ib =
            IbPacket::new_checked(&udp_bytes[udp::HEADER_LEN..]).map_err(|e| e.at(ib_offset))?;
        let computed_icrc = icrc::compute_parts(
            &ip_packet[..ip_hlen],
            &udp_bytes[..udp::HEADER_LEN],
            ib.covered(),
        )
        .map_err(|e| e.at(ip_offset))?;
        Ok(Frame {
            ethernet,
            ip,
            udp: udp_repr,
            ip_offset,
            ib_offset,
            ip_packet,
            ib,
            computed_icrc,
        })
    }

    /// Whether the stored ICRC is right.
    pub fn icrc_ok(&self) -> bool {
        self.computed_icrc == self.ib.icrc()
    }
}

fn parse_link(link: LinkType, frame: &[u8]) -> Result<(Option<ethernet::Repr>, u16, usize)> {
    match link {
        LinkType::Ethernet => {
            let eth = ethernet::Packet::new_checked(frame)?;
            let mut repr = ethernet::Repr {
                dst: eth.dst(),
                src: eth.src(),
                vlan_tci: None,
            };
            let mut ethertype = eth.ethertype();
            let mut off = ethernet::HEADER_LEN;
            if ethertype == ethernet::ETHERTYPE_VLAN {
                crate::error::need(Layer::Vlan, &frame[off..], 4).map_err(|e| e.at(off))?;
                repr.vlan_tci = Some(get_u16(frame, off));
                ethertype = get_u16(frame, off + 2);
                off += 4;
            }
            Ok((Some(repr), ethertype, off))
        }
        LinkType::LinuxSll => {
            // packet type, ARPHRD, address length, 8 address bytes, protocol.
            crate::error::need(Layer::LinuxSll, frame, 16)?;
            Ok((None, get_u16(frame, 14), 16))
        }
        LinkType::LinuxSll2 => {
            // protocol, reserved, ifindex, ARPHRD, packet type, address length, 8 address bytes.
            crate::error::need(Layer::LinuxSll2, frame, 20)?;
            Ok((None, get_u16(frame, 0), 20))
        }
        LinkType::RawIp | LinkType::Ipv4 | LinkType::Ipv6 => {
            let version = frame.first().map(|b| b >> 4);
            let ethertype = match version {
                Some(4) => ethernet::ETHERTYPE_IPV4,
                Some(6) => ethernet::ETHERTYPE_IPV6,
                Some(v) => return Err(Error::new(Layer::Ipv4, ErrorKind::BadVersion(v))),
                None => return Err(Error::truncated(Layer::Ipv4, 20, 0)),
            };
            Ok((None, ethertype, 0))
        }
    }
}

/// Write the IP and UDP headers of a RoCE v2 packet whose IB transport
/// packet (BTH through ICRC) is `ib_len` bytes, from `src_port` to 4791,
/// into the start of `buf`; returns their length. The UDP checksum is 0, as
/// rdma_rxe sends it over IPv4 (over IPv6 the caller fills it in if its
/// receiver needs one).
pub fn emit_ip_udp(ip: &IpRepr, src_port: u16, ib_len: usize, buf: &mut [u8]) -> Result<usize> {
    let len = ip.header_len() + udp::HEADER_LEN;
    crate::error::need(Layer::Udp, buf, len)?;
    let udp_len = udp::HEADER_LEN + ib_len;
    ip.emit(buf, udp_len)?;
    let mut u = udp::Packet::new_unchecked(&mut buf[ip.header_len()..len]);
    u.set_src_port(src_port);
    u.set_dst_port(udp::ROCE_V2_PORT);
    u.set_len(udp_len as u16); // fits: the IP header's emit checked the total
    u.set_checksum(0);
    Ok(len)
}

/// A whole RoCE v2 frame to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameRepr {
    /// The Ethernet header, or `None` to start at the IP header.
    pub ethernet: Option<ethernet::Repr>,
    /// The IP header.
    pub ip: IpRepr,
    /// UDP source port (the destination is 4791).
    pub src_port: u16,
    /// The IB transport headers and payload length.
    pub ib: IbRepr,
}

impl FrameRepr {
    /// Bytes of the whole frame.
    pub fn buffer_len(&self) -> usize {
        self.ethernet.map_or(0, |e| e.buffer_len())
            + self.ip.header_len()
            + udp::HEADER_LEN
            + self.ib.buffer_len()
    }

    /// Write the frame into `buf`, letting `fill` write the payload, then the
    /// IPv4 checksum and the ICRC. The UDP checksum is 0, as rdma_rxe sends it.
    /// Returns the frame length.
    pub fn emit_with(&self, buf: &mut [u8], fill: impl FnOnce(&mut [u8])) -> Result<usize> {
        let len = self.buffer_len();
        crate::error::need(Layer::Ethernet, buf, len)?;
        let buf = &mut buf[..len];
        let mut off = 0;
        if let Some(eth) = self.ethernet {
            eth.emit(buf, self.ip.ethertype())?;
            off = eth.buffer_len();
        }
        let ip_offset = off;
        off += emit_ip_udp(
            &self.ip,
            self.src_port,
            self.ib.buffer_len(),
            &mut buf[off..],
        )?;
        self.ib.emit_with(&mut buf[off..], fill)?;
        icrc::fill(&mut buf[ip_offset..])?;
        Ok(len)
    }

    /// [`FrameRepr::emit_with`], copying `payload` (exactly `ib.payload_len` bytes).
    pub fn emit(&self, buf: &mut [u8], payload: &[u8]) -> Result<usize> {
        if payload.len() != self.ib.payload_len {
            return Err(Error::new(
                Layer::Payload,
                ErrorKind::BadLength {
                    field: self.ib.payload_len,
                    actual: payload.len(),
                },
            ));
        }
        self.emit_with(buf, |b| b.copy_from_slice(payload))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{bth, Opcode, Psn};
    use std::net::Ipv4Addr;

    /// The first ACK of rxe-rc_pingpong.pcap, from the IP header on.
    const ACK_IP: [u8; 48] = [
        0x45, 0x00, 0x00, 0x30, 0x49, 0xb1, 0x40, 0x00, 0x40, 0x11, 0xdc, 0x6f, 0x0a, 0x4d, 0x00,
        0x02, 0x0a, 0x4d, 0x00, 0x01, 0xc1, 0x21, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00, 0x11, 0x00,
        0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x74, 0xe0, 0x70, 0x1f, 0x00, 0x00, 0x01, 0x52,
        0xf1, 0xd5, 0x81,
    ];

    fn check(link: LinkType, frame: &[u8], ip_offset: usize) {
        let f = Frame::parse(link, frame).unwrap();
        assert_eq!(f.ip_offset, ip_offset);
        assert_eq!(f.ib_offset, ip_offset + 28);
        assert!(f.icrc_ok());
        assert_eq!(f.ib.info().opcode, Opcode::RC_ACKNOWLEDGE);
        assert_eq!(f.ip.src_addr(), IpAddr::from(Ipv4Addr::new(10, 77, 0, 2)));
        assert_eq!(f.udp.src_port, 0xc121);
    }

    #[test]
    fn every_link_type() {
        let mut eth = vec![2, 0, 0, 0, 0, 0xa, 2, 0, 0, 0, 0, 0xb, 0x08, 0x00];
        eth.extend_from_slice(&ACK_IP);
        eth.extend_from_slice(&[0; 12]); // Ethernet padding is not part of the packet
        check(LinkType::Ethernet, &eth, 14);

        let mut vlan = vec![
            2, 0, 0, 0, 0, 0xa, 2, 0, 0, 0, 0, 0xb, 0x81, 0x00, 0x60, 0x07, 0x08, 0x00,
        ];
        vlan.extend_from_slice(&ACK_IP);
        check(LinkType::Ethernet, &vlan, 18);
        let f = Frame::parse(LinkType::Ethernet, &vlan).unwrap();
        assert_eq!(f.ethernet.unwrap().vlan_tci, Some(0x6007));

        // SLL: packet type, ARPHRD_ETHER, address length 6, address + 2 pad, protocol.
        let mut sll = vec![0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 0xa, 0, 0, 0x08, 0x00];
        sll.extend_from_slice(&ACK_IP);
        check(LinkType::LinuxSll, &sll, 16);

        // SLL2: protocol, reserved, interface index, ARPHRD_ETHER, packet type, address length, address.
        let mut sll2 = vec![
            0x08, 0x00, 0, 0, 0, 0, 0, 2, 0, 1, 0, 6, 2, 0, 0, 0, 0, 0xa, 0, 0,
        ];
        sll2.extend_from_slice(&ACK_IP);
        check(LinkType::LinuxSll2, &sll2, 20);

        check(LinkType::RawIp, &ACK_IP, 0);
    }

    #[test]
    fn errors_carry_frame_offsets() {
        let mut eth = vec![0u8; 12];
        eth.extend_from_slice(&[0x08, 0x06]); // ARP
        eth.extend_from_slice(&[0; 28]);
        let e = Frame::parse(LinkType::Ethernet, &eth).unwrap_err();
        assert!(e.is_not_roce());

        let mut other_port = ACK_IP;
        other_port[22..24].copy_from_slice(&53u16.to_be_bytes());
        let e = Frame::parse(LinkType::RawIp, &other_port).unwrap_err();
        assert_eq!(
            (e.layer, e.offset, e.kind),
            (Layer::Udp, 20, ErrorKind::WrongPort(53))
        );
        assert!(e.is_not_roce());

        let mut short_udp = ACK_IP;
        short_udp[25] = 0x1b; // UDP length one less than present
        let e = Frame::parse(LinkType::RawIp, &short_udp).unwrap_err();
        assert_eq!((e.layer, e.offset), (Layer::Udp, 20));

        let e = Frame::parse(LinkType::RawIp, &ACK_IP[..40]).unwrap_err();
        assert_eq!((e.layer, e.offset), (Layer::Ipv4, 0));
        assert!(!e.is_not_roce());

        let mut bad_opcode = ACK_IP;
        bad_opcode[28] = 0x40; // RD: not supported
        let e = Frame::parse(LinkType::RawIp, &bad_opcode).unwrap_err();
        assert_eq!(
            (e.layer, e.offset, e.kind),
            (Layer::Bth, 28, ErrorKind::UnknownOpcode(0x40))
        );
    }

    #[test]
    fn builds_what_rxe_sent() {
        // Rebuild the rdma_rxe ACK from values: same bytes, same ICRC.
        let mut ip = ipv4::Repr::new(Ipv4Addr::new(10, 77, 0, 2), Ipv4Addr::new(10, 77, 0, 1));
        ip.ident = 0x49b1;
        let mut ib = IbRepr::new(bth::Repr::new(
            Opcode::RC_ACKNOWLEDGE,
            0x11,
            Psn::new(0x74e070),
        ));
        ib.aeth = Some(crate::aeth::Repr {
            syndrome: crate::aeth::Syndrome::ACK_NO_CREDITS,
            msn: 1,
        });
        let repr = FrameRepr {
            ethernet: None,
            ip: IpRepr::V4(ip),
            src_port: 0xc121,
            ib,
        };
        let mut buf = [0u8; 48];
        assert_eq!(repr.emit(&mut buf, &[]), Ok(48));
        assert_eq!(buf, ACK_IP);
        assert!(repr.emit(&mut buf[..47], &[]).is_err());
    }
}
