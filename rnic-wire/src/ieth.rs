//! Invalidate Extended Transport Header (IBTA 9.3.7): the R_Key a SEND_WITH_INVALIDATE
//! invalidates at the responder.

use core::fmt;

use crate::field::*;
use crate::{Layer, Result};

crate::field::fixed_header_view!(
    /// A read/write view of an IETH.
    layer = Layer::Ieth, len = 4
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// R_Key to invalidate.
    pub fn r_key(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the R_Key to invalidate.
    pub fn set_r_key(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), 0, v);
    }
}

/// IETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// R_Key to invalidate.
    pub r_key: u32,
}

impl Repr {
    /// Parse an IETH.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            r_key: packet.r_key(),
        })
    }
    /// Bytes [`Repr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Write the IETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_r_key(self.r_key);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IETH rkey={:#010x}", self.r_key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct() {
        let bytes = [0x00, 0x12, 0x34, 0x56];
        let repr = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr.r_key, 0x0012_3456);
        let mut buf = [0u8; 4];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
    }
}
