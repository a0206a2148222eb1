//! Datagram Extended Transport Header (IBTA 9.3.2): Q_Key and source QP of a UD packet.

use core::fmt;

use crate::field::*;
use crate::{Layer, Result};

mod field {
    use crate::field::Field;
    pub const Q_KEY: Field = 0..4;
    pub const RESV8: usize = 4;
    pub const SRC_QP: Field = 5..8;
}

crate::field::fixed_header_view!(
    /// A read/write view of a DETH.
    layer = Layer::Deth, len = 8
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Q_Key.
    pub fn q_key(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::Q_KEY.start)
    }
    /// Reserved byte.
    pub fn resv8(&self) -> u8 {
        self.buffer.as_ref()[field::RESV8]
    }
    /// SrcQP: source queue pair number (24 bits).
    pub fn src_qp(&self) -> u32 {
        get_u24(self.buffer.as_ref(), field::SRC_QP.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set Q_Key.
    pub fn set_q_key(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::Q_KEY.start, v);
    }
    /// Set the reserved byte.
    pub fn set_resv8(&mut self, v: u8) {
        self.buffer.as_mut()[field::RESV8] = v;
    }
    /// Set SrcQP (low 24 bits).
    pub fn set_src_qp(&mut self, v: u32) {
        set_u24(self.buffer.as_mut(), field::SRC_QP.start, v);
    }
}

/// DETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// Q_Key.
    pub q_key: u32,
    /// SrcQP.
    pub src_qp: u32,
}

impl Repr {
    /// Parse a DETH.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            q_key: packet.q_key(),
            src_qp: packet.src_qp(),
        })
    }
    /// Bytes [`Repr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Write the DETH (reserved byte zero).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_q_key(self.q_key);
        packet.set_resv8(0);
        packet.set_src_qp(self.src_qp);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DETH qkey={:#010x} srcqp={:#08x}",
            self.q_key, self.src_qp
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct() {
        // rxe-ud_pingpong.pcap: Q_Key 0x11111111 from QP 0x14.
        let bytes = [0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x00, 0x14];
        let repr = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            Repr {
                q_key: 0x1111_1111,
                src_qp: 0x14
            }
        );
        let mut buf = [0xFFu8; 8];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
    }
}
