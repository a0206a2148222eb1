//! Base Transport Header (IBTA 9.2): 12 bytes at the start of every IB transport packet.

use core::fmt;

use crate::field::*;
use crate::opcode::Opcode;
use crate::{Error, ErrorKind, Layer, Psn, Result};

mod field {
    use crate::field::Field;
    pub const OPCODE: usize = 0;
    /// SE (bit 7), M (bit 6), PadCnt (bits 5-4), TVer (bits 3-0).
    pub const FLAGS: usize = 1;
    pub const P_KEY: Field = 2..4;
    /// FECN (bit 7), BECN (bit 6), Resv6a (bits 5-0). The whole byte is
    /// "resv8a" to the ICRC, which masks it.
    pub const RESV8A: usize = 4;
    pub const DEST_QP: Field = 5..8;
    /// AckReq (bit 7), Resv7 (bits 6-0).
    pub const ACK_REQ: usize = 8;
    pub const PSN: Field = 9..12;
}

/// Offset of the byte the ICRC masks (FECN, BECN and Resv6a).
pub const RESV8A_OFFSET: usize = field::RESV8A;

/// The only transport header version IBTA defines; receivers drop other versions.
pub const TVER: u8 = 0;

/// The default partition key (full member of the default partition).
pub const DEFAULT_P_KEY: u16 = 0xFFFF;

crate::field::fixed_header_view!(
    /// A read/write view of a Base Transport Header.
    layer = Layer::Bth, len = 12
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// OpCode.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buffer.as_ref()[field::OPCODE])
    }
    /// SE: Solicited Event.
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & 0x80 != 0
    }
    /// M: MigReq.
    pub fn mig_req(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & 0x40 != 0
    }
    /// PadCnt: pad bytes (0-3) after the payload.
    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] >> 4) & 0x3
    }
    /// TVer: transport header version.
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & 0x0F
    }
    /// P_Key: partition key.
    pub fn p_key(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::P_KEY.start)
    }
    /// FECN: forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::RESV8A] & 0x80 != 0
    }
    /// BECN: backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::RESV8A] & 0x40 != 0
    }
    /// Resv6a: six reserved bits.
    pub fn resv6a(&self) -> u8 {
        self.buffer.as_ref()[field::RESV8A] & 0x3F
    }
    /// DestQP: destination queue pair number (24 bits).
    pub fn dest_qp(&self) -> u32 {
        get_u24(self.buffer.as_ref(), field::DEST_QP.start)
    }
    /// A: acknowledge request.
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK_REQ] & 0x80 != 0
    }
    /// Resv7: seven reserved bits.
    pub fn resv7(&self) -> u8 {
        self.buffer.as_ref()[field::ACK_REQ] & 0x7F
    }
    /// PSN: packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(get_u24(self.buffer.as_ref(), field::PSN.start))
    }
}

fn set_bit(byte: &mut u8, mask: u8, on: bool) {
    if on {
        *byte |= mask;
    } else {
        *byte &= !mask;
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set OpCode.
    pub fn set_opcode(&mut self, v: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = v.0;
    }
    /// Set SE.
    pub fn set_solicited(&mut self, v: bool) {
        set_bit(&mut self.buffer.as_mut()[field::FLAGS], 0x80, v);
    }
    /// Set M (MigReq).
    pub fn set_mig_req(&mut self, v: bool) {
        set_bit(&mut self.buffer.as_mut()[field::FLAGS], 0x40, v);
    }
    /// Set PadCnt (the low two bits of `v`).
    pub fn set_pad_count(&mut self, v: u8) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        *b = (*b & !0x30) | ((v & 0x3) << 4);
    }
    /// Set TVer (the low four bits of `v`).
    pub fn set_tver(&mut self, v: u8) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        *b = (*b & !0x0F) | (v & 0x0F);
    }
    /// Set P_Key.
    pub fn set_p_key(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::P_KEY.start, v);
    }
    /// Set FECN.
    pub fn set_fecn(&mut self, v: bool) {
        set_bit(&mut self.buffer.as_mut()[field::RESV8A], 0x80, v);
    }
    /// Set BECN.
    pub fn set_becn(&mut self, v: bool) {
        set_bit(&mut self.buffer.as_mut()[field::RESV8A], 0x40, v);
    }
    /// Set Resv6a (the low six bits of `v`).
    pub fn set_resv6a(&mut self, v: u8) {
        let b = &mut self.buffer.as_mut()[field::RESV8A];
        *b = (*b & 0xC0) | (v & 0x3F);
    }
    /// Set DestQP (the low 24 bits of `v`).
    pub fn set_dest_qp(&mut self, v: u32) {
        set_u24(self.buffer.as_mut(), field::DEST_QP.start, v);
    }
    /// Set A (AckReq).
    pub fn set_ack_req(&mut self, v: bool) {
        set_bit(&mut self.buffer.as_mut()[field::ACK_REQ], 0x80, v);
    }
    /// Set Resv7 (the low seven bits of `v`).
    pub fn set_resv7(&mut self, v: u8) {
        let b = &mut self.buffer.as_mut()[field::ACK_REQ];
        *b = (*b & 0x80) | (v & 0x7F);
    }
    /// Set PSN.
    pub fn set_psn(&mut self, v: Psn) {
        set_u24(self.buffer.as_mut(), field::PSN.start, v.value());
    }
}

/// The meaningful BTH fields. PadCnt is not here: it follows from the payload
/// length, and [`crate::IbRepr`] sets it. Reserved bits are emitted as zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// OpCode.
    pub opcode: Opcode,
    /// SE.
    pub solicited: bool,
    /// M (MigReq). rdma_rxe sends 0; the hardware capture shows 1.
    pub mig_req: bool,
    /// P_Key.
    pub p_key: u16,
    /// FECN.
    pub fecn: bool,
    /// BECN (set on CNPs).
    pub becn: bool,
    /// DestQP (24 bits).
    pub dest_qp: u32,
    /// A (AckReq).
    pub ack_req: bool,
    /// PSN.
    pub psn: Psn,
}

impl Repr {
    /// A BTH for `opcode` to `dest_qp` at `psn`, with every flag clear and the default P_Key.
    pub const fn new(opcode: Opcode, dest_qp: u32, psn: Psn) -> Repr {
        Repr {
            opcode,
            solicited: false,
            mig_req: false,
            p_key: DEFAULT_P_KEY,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Parse a BTH. Fails on a TVer other than 0: IBTA 9.2 has receivers drop such packets.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        if packet.tver() != TVER {
            return Err(Error::new(Layer::Bth, ErrorKind::BadVersion(packet.tver())));
        }
        Ok(Repr {
            opcode: packet.opcode(),
            solicited: packet.solicited(),
            mig_req: packet.mig_req(),
            p_key: packet.p_key(),
            fecn: packet.fecn(),
            becn: packet.becn(),
            dest_qp: packet.dest_qp(),
            ack_req: packet.ack_req(),
            psn: packet.psn(),
        })
    }

    /// Bytes [`Repr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the BTH with `pad_count` pad bytes; reserved bits are zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>, pad_count: u8) {
        packet.set_opcode(self.opcode);
        packet.buffer.as_mut()[field::FLAGS] = 0;
        packet.set_solicited(self.solicited);
        packet.set_mig_req(self.mig_req);
        packet.set_pad_count(pad_count);
        packet.set_tver(TVER);
        packet.set_p_key(self.p_key);
        packet.buffer.as_mut()[field::RESV8A] = 0;
        packet.set_fecn(self.fecn);
        packet.set_becn(self.becn);
        packet.set_dest_qp(self.dest_qp);
        packet.buffer.as_mut()[field::ACK_REQ] = 0;
        packet.set_ack_req(self.ack_req);
        packet.set_psn(self.psn);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BTH {} qp={:#08x} psn={} pkey={:#06x}",
            self.opcode, self.dest_qp, self.psn, self.p_key
        )?;
        for (on, name) in [
            (self.solicited, " SE"),
            (self.mig_req, " M"),
            (self.ack_req, " A"),
            (self.fecn, " FECN"),
            (self.becn, " BECN"),
        ] {
            if on {
                f.write_str(name)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // RC_SEND_ONLY_WITH_IMMEDIATE from the hardware capture (hw-rc-send-imm.pcap):
    // M=1, P_Key 0xFFFF, DestQP 0x48, PSN 0.
    static BYTES: [u8; 12] = [
        0x05, 0x40, 0xff, 0xff, 0x00, 0x00, 0x00, 0x48, 0x80, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::RC_SEND_ONLY_WITH_IMMEDIATE);
        assert!(!p.solicited());
        assert!(p.mig_req());
        assert_eq!(p.pad_count(), 0);
        assert_eq!(p.tver(), 0);
        assert_eq!(p.p_key(), 0xFFFF);
        assert!(!p.fecn() && !p.becn());
        assert_eq!(p.dest_qp(), 0x48);
        assert!(p.ack_req());
        assert_eq!(p.psn(), Psn::new(0));
    }

    #[test]
    fn construct() {
        let mut buf = [0xAAu8; 12];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        let mut repr = Repr::new(Opcode::RC_SEND_ONLY_WITH_IMMEDIATE, 0x48, Psn::new(0));
        repr.mig_req = true;
        repr.ack_req = true;
        repr.emit(&mut p, 0);
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn round_trip() {
        let p = Packet::new_unchecked(&BYTES[..]);
        let repr = Repr::parse(&p).unwrap();
        let mut buf = [0u8; 12];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]), 0);
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn rejects_truncated_and_bad_tver() {
        let err = Packet::new_checked(&BYTES[..11]).unwrap_err();
        assert_eq!(
            err.kind,
            ErrorKind::Truncated {
                needed: 12,
                available: 11
            }
        );
        let mut bad = BYTES;
        bad[1] |= 0x01;
        let err = Repr::parse(&Packet::new_unchecked(&bad[..])).unwrap_err();
        assert_eq!(err.kind, ErrorKind::BadVersion(1));
    }
}
