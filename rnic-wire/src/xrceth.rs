//! XRC Extended Transport Header (IBTA Annex A14): the XRC SRQ a request targets.

use core::fmt;

use crate::field::*;
use crate::{Layer, Result};

crate::field::fixed_header_view!(
    /// A read/write view of an XRCETH.
    layer = Layer::XrcEth, len = 4
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// XRCSRQ: the XRC shared receive queue number (24 bits).
    pub fn xrc_srq(&self) -> u32 {
        get_u24(self.buffer.as_ref(), 1)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set XRCSRQ (low 24 bits) and clear the reserved byte.
    pub fn set_xrc_srq(&mut self, v: u32) {
        self.buffer.as_mut()[0] = 0;
        set_u24(self.buffer.as_mut(), 1, v);
    }
}

/// XRCETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// XRCSRQ.
    pub xrc_srq: u32,
}

impl Repr {
    /// Parse an XRCETH.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            xrc_srq: packet.xrc_srq(),
        })
    }
    /// Bytes [`Repr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Write the XRCETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_xrc_srq(self.xrc_srq);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "XRCETH srq={:#08x}", self.xrc_srq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct() {
        let bytes = [0x00, 0x00, 0x01, 0x23];
        let repr = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr.xrc_srq, 0x123);
        let mut buf = [0xFFu8; 4];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
    }
}
