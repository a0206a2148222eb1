//! FLUSH Extended Transport Header (IBTA 1.5 memory placement extensions):
//! which memory a FLUSH makes persistent or visible.

use core::fmt;

use crate::field::*;
use crate::{Layer, Result};

const PLT_MASK: u32 = 0x0000_000F;
const SEL_MASK: u32 = 0x0000_0030;
const SEL_SHIFT: u32 = 4;

crate::field::fixed_header_view!(
    /// A read/write view of a FETH.
    layer = Layer::Feth, len = 4
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The raw 32 bits.
    pub fn bits(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }
    /// SEL (bits 5-4): selectivity, 0 = the memory region range, 1 = the whole MR.
    pub fn sel(&self) -> u8 {
        ((self.bits() & SEL_MASK) >> SEL_SHIFT) as u8
    }
    /// PLT (bits 3-0): placement type, bit 0 = global visibility, bit 1 = persistence.
    pub fn plt(&self) -> u8 {
        (self.bits() & PLT_MASK) as u8
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the raw 32 bits.
    pub fn set_bits(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), 0, v);
    }
}

/// FETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// SEL (2 bits).
    pub sel: u8,
    /// PLT (4 bits).
    pub plt: u8,
}

impl Repr {
    /// Parse a FETH.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            sel: packet.sel(),
            plt: packet.plt(),
        })
    }
    /// Bytes [`Repr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Write the FETH (reserved bits zero).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        let bits =
            ((u32::from(self.sel) << SEL_SHIFT) & SEL_MASK) | (u32::from(self.plt) & PLT_MASK);
        packet.set_bits(bits);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FETH sel={} plt={:#x}", self.sel, self.plt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct() {
        let bytes = [0x00, 0x00, 0x00, 0x13];
        let repr = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr, Repr { sel: 1, plt: 3 });
        let mut buf = [0xFFu8; 4];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
    }
}
