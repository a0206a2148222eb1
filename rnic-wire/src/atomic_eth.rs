//! Atomic Extended Transport Header (IBTA 9.3.4): CmpSwap and FetchAdd requests.

use core::fmt;

use crate::field::*;
use crate::{Layer, Result};

mod field {
    use crate::field::Field;
    pub const VA: Field = 0..8;
    pub const R_KEY: Field = 8..12;
    pub const SWAP_OR_ADD_DATA: Field = 12..20;
    pub const COMPARE_DATA: Field = 20..28;
}

crate::field::fixed_header_view!(
    /// A read/write view of an AtomicETH.
    layer = Layer::AtomicEth, len = 28
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Virtual Address (must be 8-byte aligned at the responder).
    pub fn va(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::VA.start)
    }
    /// R_Key.
    pub fn r_key(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::R_KEY.start)
    }
    /// Swap (CmpSwap) or Add (FetchAdd) Data.
    pub fn swap_or_add_data(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::SWAP_OR_ADD_DATA.start)
    }
    /// Compare Data (CmpSwap only).
    pub fn compare_data(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::COMPARE_DATA.start)
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
    /// Set Swap or Add Data.
    pub fn set_swap_or_add_data(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), field::SWAP_OR_ADD_DATA.start, v);
    }
    /// Set Compare Data.
    pub fn set_compare_data(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), field::COMPARE_DATA.start, v);
    }
}

/// AtomicETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// Virtual Address.
    pub va: u64,
    /// R_Key.
    pub r_key: u32,
    /// Swap or Add Data.
    pub swap_or_add_data: u64,
    /// Compare Data.
    pub compare_data: u64,
}

impl Repr {
    /// Parse an AtomicETH.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            va: packet.va(),
            r_key: packet.r_key(),
            swap_or_add_data: packet.swap_or_add_data(),
            compare_data: packet.compare_data(),
        })
    }
    /// Bytes [`Repr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Write the AtomicETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_va(self.va);
        packet.set_r_key(self.r_key);
        packet.set_swap_or_add_data(self.swap_or_add_data);
        packet.set_compare_data(self.compare_data);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "AtomicETH va={:#x} rkey={:#010x} swap/add={:#x} compare={:#x}",
            self.va, self.r_key, self.swap_or_add_data, self.compare_data
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // rxe-ops_atomic.pcap, first CmpSwap: va 0x0000562636c88800, rkey 0x0c3c,
    // swap 0x2222222222222222, compare 0x1111111111111111.
    static BYTES: [u8; 28] = [
        0x00, 0x00, 0x56, 0x26, 0x36, 0xc8, 0x88, 0x00, 0x00, 0x00, 0x0c, 0x3c, 0x22, 0x22, 0x22,
        0x22, 0x22, 0x22, 0x22, 0x22, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11,
    ];

    #[test]
    fn deconstruct_construct() {
        let repr = Repr::parse(&Packet::new_checked(&BYTES[..]).unwrap()).unwrap();
        assert_eq!(repr.va, 0x0000_5626_36c8_8800);
        assert_eq!(repr.r_key, 0x0c3c);
        assert_eq!(repr.swap_or_add_data, 0x2222_2222_2222_2222);
        assert_eq!(repr.compare_data, 0x1111_1111_1111_1111);
        let mut buf = [0u8; 28];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }
}
