//! Atomic Acknowledge Extended Transport Header (IBTA 9.5.3): the value an atomic found.

use core::fmt;

use crate::field::*;
use crate::{Layer, Result};

crate::field::fixed_header_view!(
    /// A read/write view of an AtomicAckETH.
    layer = Layer::AtomicAckEth, len = 8
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// OrigRemDt: the original remote data, before the atomic operation.
    pub fn orig_rem_dt(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set OrigRemDt.
    pub fn set_orig_rem_dt(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), 0, v);
    }
}

/// AtomicAckETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// OrigRemDt.
    pub orig_rem_dt: u64,
}

impl Repr {
    /// Parse an AtomicAckETH.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            orig_rem_dt: packet.orig_rem_dt(),
        })
    }
    /// Bytes [`Repr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Write the AtomicAckETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_orig_rem_dt(self.orig_rem_dt);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AtomicAckETH orig={:#x}", self.orig_rem_dt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct() {
        // rxe-ops_atomic.pcap: the CmpSwap found 0x1111111111111111.
        let bytes = [0x11u8; 8];
        let repr = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr.orig_rem_dt, 0x1111_1111_1111_1111);
        let mut buf = [0u8; 8];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
    }
}
