//! Immediate Data Extended Transport Header (IBTA 9.3.6): 32 bits delivered with
//! the completion at the receiver. rnic keeps the wire's byte order (big-endian),
//! as `ibv_wc.imm_data` does.

use core::fmt;

use crate::field::*;
use crate::{Layer, Result};

crate::field::fixed_header_view!(
    /// A read/write view of an ImmDt header.
    layer = Layer::ImmDt, len = 4
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Immediate Data.
    pub fn immediate(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set Immediate Data.
    pub fn set_immediate(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), 0, v);
    }
}

/// ImmDt fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// Immediate Data.
    pub immediate: u32,
}

impl Repr {
    /// Parse an ImmDt header.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            immediate: packet.immediate(),
        })
    }
    /// Bytes [`Repr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Write the ImmDt header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_immediate(self.immediate);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ImmDt {:#010x}", self.immediate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct() {
        let bytes = [0x00, 0x00, 0x00, 0x01];
        let repr = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr.immediate, 1);
        let mut buf = [0u8; 4];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
    }
}
