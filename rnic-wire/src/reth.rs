//! RDMA Extended Transport Header (IBTA 9.3.3): the remote buffer of a WRITE, READ or FLUSH.

use core::fmt;

use crate::field::*;
use crate::{Layer, Result};

mod field {
    use crate::field::Field;
    pub const VA: Field = 0..8;
    pub const R_KEY: Field = 8..12;
    pub const DMA_LENGTH: Field = 12..16;
}

crate::field::fixed_header_view!(
    /// A read/write view of a RETH.
    layer = Layer::Reth, len = 16
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Virtual Address.
    pub fn va(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::VA.start)
    }
    /// R_Key.
    pub fn r_key(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::R_KEY.start)
    }
    /// DMA Length: bytes of the whole message.
    pub fn dma_length(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::DMA_LENGTH.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the Virtual Address.
    pub fn set_va(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), field::VA.start, v);
    }
    /// Set R_Key.
    pub fn set_r_key(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::R_KEY.start, v);
    }
    /// Set DMA Length.
    pub fn set_dma_length(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::DMA_LENGTH.start, v);
    }
}

/// RETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// Virtual Address.
    pub va: u64,
    /// R_Key.
    pub r_key: u32,
    /// DMA Length.
    pub dma_length: u32,
}

impl Repr {
    /// Parse a RETH.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            va: packet.va(),
            r_key: packet.r_key(),
            dma_length: packet.dma_length(),
        })
    }
    /// Bytes [`Repr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Write the RETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_va(self.va);
        packet.set_r_key(self.r_key);
        packet.set_dma_length(self.dma_length);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RETH va={:#x} rkey={:#010x} len={}",
            self.va, self.r_key, self.dma_length
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // From rxe-write_bw.pcap (tshark: va 0x000055cacf62a000, r_key 0x00000eb5, dmalen 32).
    static BYTES: [u8; 16] = [
        0x00, 0x00, 0x55, 0xca, 0xcf, 0x62, 0xa0, 0x00, 0x00, 0x00, 0x0e, 0xb5, 0x00, 0x00, 0x00,
        0x20,
    ];

    #[test]
    fn deconstruct_construct() {
        let repr = Repr::parse(&Packet::new_checked(&BYTES[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            Repr {
                va: 0x0000_55ca_cf62_a000,
                r_key: 0x0eb5,
                dma_length: 32
            }
        );
        let mut buf = [0u8; 16];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }
}
