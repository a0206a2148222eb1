//! UDP header (RFC 768).

use core::fmt;

use crate::field::*;
use crate::{Layer, Result};

/// The RoCE v2 UDP destination port (IANA).
pub const ROCE_V2_PORT: u16 = 4791;

crate::field::fixed_header_view!(
    /// A read/write view of a UDP header.
    layer = Layer::Udp, len = 8
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Source port (RoCE v2: flow entropy).
    pub fn src_port(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 0)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 2)
    }
    /// Length of header and payload.
    pub fn len(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 4)
    }
    /// True when the length field is zero (never valid).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Checksum (rdma_rxe sends 0 over IPv4).
    pub fn checksum(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 6)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the source port.
    pub fn set_src_port(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 0, v);
    }
    /// Set the destination port.
    pub fn set_dst_port(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 2, v);
    }
    /// Set the length.
    pub fn set_len(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 4, v);
    }
    /// Set the checksum.
    pub fn set_checksum(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 6, v);
    }
}

/// UDP header fields that are not derived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UDP {} > {}", self.src_port, self.dst_port)
    }
}

/// The UDP source port rdma_rxe uses for an RC/UC QP pair, the kernel's
/// `rdma_get_udp_sport` with no flow label: both QPNs multiplied, folded to
/// a 20-bit flow label (`rdma_calc_flow_label`), folded again to 14 bits,
/// in 0xC000..=0xFFFF (the same at both ends).
pub fn rxe_src_port(local_qpn: u32, remote_qpn: u32) -> u16 {
    let mut v = u64::from(local_qpn) * u64::from(remote_qpn);
    v ^= v >> 20;
    v ^= v >> 40;
    flow_label_src_port((v & 0x000F_FFFF) as u32)
}

/// The UDP source port of a 20-bit IPv6 flow label, folded to 14 bits in
/// 0xC000..=0xFFFF (the kernel's `rdma_flow_label_to_udp_sport`): what
/// rdma_rxe sends from when the address vector carries a flow label.
pub fn flow_label_src_port(flow_label: u32) -> u16 {
    let fl = flow_label & 0x000F_FFFF;
    0xC000 | (((fl & 0x3FFF) ^ (fl >> 14)) as u16 & 0x3FFF)
}

/// Check a UDP header in front of a RoCE v2 packet; `Ok` carries the header view.
pub(crate) fn check_roce(b: &[u8]) -> Result<Packet<&[u8]>> {
    let p = Packet::new_checked(b)?;
    if p.dst_port() != ROCE_V2_PORT {
        return Err(crate::Error::new(
            Layer::Udp,
            crate::ErrorKind::WrongPort(p.dst_port()),
        ));
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rxe_source_ports_from_captures() {
        // Two fresh rxe devices both number their first QP 0x11; rxe-rc_pingpong.pcap
        // shows port 49441 both ways, rxe-send_bw_2qp.pcap 49552 and 49593 for QP
        // pairs 0x14/0x14 and 0x15/0x15.
        assert_eq!(rxe_src_port(0x11, 0x11), 49441);
        assert_eq!(rxe_src_port(0x14, 0x14), 49552);
        assert_eq!(rxe_src_port(0x15, 0x15), 49593);
        // Products past 20 bits fold: rdma_rxe (Linux 6.1, live in
        // interop/'s VM) sent from these ports to rnic's random QPNs.
        assert_eq!(rxe_src_port(0x11, 0xBA_1BC7), 55517);
        assert_eq!(rxe_src_port(0x12, 0xFA_BB8F), 61712);
        assert_eq!(rxe_src_port(0x11, 0x2345), rxe_src_port(0x2345, 0x11));
        assert_eq!(rxe_src_port(0xFF_FFFF, 0xFF_FFFF) & 0xC000, 0xC000);
    }

    /// The kernel's `rdma_flow_label_to_udp_sport`: the label's low 14 bits
    /// XOR its top 6, in 0xC000..=0xFFFF; bits above the 20 of a label
    /// do not count.
    #[test]
    fn flow_label_source_ports() {
        // 0x12345: low 14 bits 0x2345, top 6 bits 0b000100 -> 0x2341.
        assert_eq!(flow_label_src_port(0x1_2345), 0xE341);
        assert_eq!(flow_label_src_port(0xF_FFFF), 0xC000 | (0x3FFF ^ 0x3F));
        assert_eq!(flow_label_src_port(0x3FFF), 0xFFFF);
        assert_eq!(flow_label_src_port(0x10_0001), flow_label_src_port(1));
    }
}
