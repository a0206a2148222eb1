//! Ethernet II header, with an optional IEEE 802.1Q tag.

use core::fmt;

use crate::field::*;
use crate::{Layer, Result};

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86DD;
/// EtherType (TPID) of an 802.1Q tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;

/// A MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

crate::field::fixed_header_view!(
    /// A read/write view of an untagged Ethernet II header (14 bytes).
    layer = Layer::Ethernet, len = 14
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Destination MAC.
    pub fn dst(&self) -> MacAddr {
        let mut m = [0u8; 6];
        m.copy_from_slice(&self.buffer.as_ref()[0..6]);
        MacAddr(m)
    }
    /// Source MAC.
    pub fn src(&self) -> MacAddr {
        let mut m = [0u8; 6];
        m.copy_from_slice(&self.buffer.as_ref()[6..12]);
        MacAddr(m)
    }
    /// EtherType (0x8100 when a VLAN tag follows).
    pub fn ethertype(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 12)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the destination MAC.
    pub fn set_dst(&mut self, m: MacAddr) {
        self.buffer.as_mut()[0..6].copy_from_slice(&m.0);
    }
    /// Set the source MAC.
    pub fn set_src(&mut self, m: MacAddr) {
        self.buffer.as_mut()[6..12].copy_from_slice(&m.0);
    }
    /// Set the EtherType.
    pub fn set_ethertype(&mut self, t: u16) {
        set_u16(self.buffer.as_mut(), 12, t);
    }
}

/// Ethernet header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// Destination MAC.
    pub dst: MacAddr,
    /// Source MAC.
    pub src: MacAddr,
    /// 802.1Q tag control information (PCP, DEI, VLAN ID), if tagged.
    pub vlan_tci: Option<u16>,
}

impl Repr {
    /// Bytes of the header: 14, or 18 with a VLAN tag.
    pub const fn buffer_len(&self) -> usize {
        if self.vlan_tci.is_some() {
            18
        } else {
            14
        }
    }

    /// Write the header with `ethertype` for what follows; `buf` must hold
    /// [`Repr::buffer_len`] bytes.
    pub fn emit(&self, buf: &mut [u8], ethertype: u16) -> Result<()> {
        crate::error::need(Layer::Ethernet, buf, self.buffer_len())?;
        let mut p = Packet::new_unchecked(&mut *buf);
        p.set_dst(self.dst);
        p.set_src(self.src);
        match self.vlan_tci {
            Some(tci) => {
                p.set_ethertype(ETHERTYPE_VLAN);
                set_u16(buf, 14, tci);
                set_u16(buf, 16, ethertype);
            }
            None => p.set_ethertype(ethertype),
        }
        Ok(())
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ethernet {} > {}", self.src, self.dst)?;
        if let Some(tci) = self.vlan_tci {
            write!(f, " vlan={} pcp={}", tci & 0x0FFF, tci >> 13)?;
        }
        Ok(())
    }
}
