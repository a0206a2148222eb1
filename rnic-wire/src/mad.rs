//! Management datagrams (IBTA 13.4): the 256-byte messages that travel on
//! QP1 (the General Services Interface) as UD SEND_ONLY packets with the
//! Q_Key [`GSI_QKEY`] and P_Key 0xFFFF. Every MAD starts with the 24-byte
//! common header here; what follows depends on the management class
//! ([`crate::cm`] for the communication manager's).

use core::fmt;

use crate::field::*;
use crate::{Layer, Result};

/// Bytes of every MAD (header and data).
pub const MAD_LEN: usize = 256;
/// Bytes after the common header.
pub const DATA_LEN: usize = MAD_LEN - HEADER_LEN;
/// The queue pair MADs of the General Services Interface go to.
pub const GSI_QPN: u32 = 1;
/// The Q_Key of QP1 (IBTA 13.5.1): a well-known, privileged Q_Key.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The UDP source port of every QP1 packet the Linux kernel sends over
/// RoCE v2, whatever the peer (the captures show no other): QP1 has no
/// connection whose numbers a port could be derived from.
pub const GSI_UDP_SOURCE_PORT: u16 = 55410;
/// Base version of every MAD.
pub const BASE_VERSION: u8 = 1;
/// Management class of the communication manager (IBTA 13.4.4).
pub const CLASS_CM: u8 = 0x07;
/// Class version of the communication manager's MADs.
pub const CM_CLASS_VERSION: u8 = 2;
/// Method Send (IBTA 13.4.5): how every CM message travels.
pub const METHOD_SEND: u8 = 0x03;
/// Method Get (IBTA 13.4.5): a request for an attribute.
pub const METHOD_GET: u8 = 0x01;
/// Method Set: a request to change an attribute.
pub const METHOD_SET: u8 = 0x02;
/// Method GetResp: the answer to a Get or a Set.
pub const METHOD_GET_RESP: u8 = 0x81;
/// Management class of LID-routed subnet management (QP 0's, never QP 1's).
pub const CLASS_SUBN_LID_ROUTED: u8 = 0x01;
/// Management class of directed-route subnet management (QP 0's).
pub const CLASS_SUBN_DIRECTED_ROUTE: u8 = 0x81;
/// AttributeID ClassPortInfo, which every class defines (IBTA 13.4.8.1).
pub const ATTR_CLASS_PORT_INFO: u16 = 0x0001;
/// MAD status (IBTA Table 111): the method or the method/attribute
/// combination is not supported (bits 2-4 = 3, "unsupported method/attribute
/// combination").
pub const STATUS_UNSUPPORTED_METHOD_ATTRIBUTE: u16 = 0x000C;

mod field {
    use crate::field::Field;
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: Field = 4..6;
    pub const CLASS_SPECIFIC: Field = 6..8;
    pub const TRANSACTION_ID: Field = 8..16;
    pub const ATTRIBUTE_ID: Field = 16..18;
    pub const RESV16: Field = 18..20;
    pub const ATTRIBUTE_MODIFIER: Field = 20..24;
}

crate::field::fixed_header_view!(
    /// A read/write view of a MAD's common header.
    layer = Layer::Mad, len = 24
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// BaseVersion.
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[field::BASE_VERSION]
    }
    /// MgmtClass.
    pub fn mgmt_class(&self) -> u8 {
        self.buffer.as_ref()[field::MGMT_CLASS]
    }
    /// ClassVersion.
    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[field::CLASS_VERSION]
    }
    /// R (the response bit) and Method, as one byte.
    pub fn method(&self) -> u8 {
        self.buffer.as_ref()[field::METHOD]
    }
    /// Status.
    pub fn status(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::STATUS.start)
    }
    /// ClassSpecific.
    pub fn class_specific(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::CLASS_SPECIFIC.start)
    }
    /// TransactionID.
    pub fn transaction_id(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::TRANSACTION_ID.start)
    }
    /// AttributeID.
    pub fn attribute_id(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::ATTRIBUTE_ID.start)
    }
    /// The reserved 16 bits after AttributeID.
    pub fn resv16(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::RESV16.start)
    }
    /// AttributeModifier.
    pub fn attribute_modifier(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::ATTRIBUTE_MODIFIER.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set BaseVersion.
    pub fn set_base_version(&mut self, v: u8) {
        self.buffer.as_mut()[field::BASE_VERSION] = v;
    }
    /// Set MgmtClass.
    pub fn set_mgmt_class(&mut self, v: u8) {
        self.buffer.as_mut()[field::MGMT_CLASS] = v;
    }
    /// Set ClassVersion.
    pub fn set_class_version(&mut self, v: u8) {
        self.buffer.as_mut()[field::CLASS_VERSION] = v;
    }
    /// Set R and Method.
    pub fn set_method(&mut self, v: u8) {
        self.buffer.as_mut()[field::METHOD] = v;
    }
    /// Set Status.
    pub fn set_status(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::STATUS.start, v);
    }
    /// Set ClassSpecific.
    pub fn set_class_specific(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::CLASS_SPECIFIC.start, v);
    }
    /// Set TransactionID.
    pub fn set_transaction_id(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), field::TRANSACTION_ID.start, v);
    }
    /// Set AttributeID.
    pub fn set_attribute_id(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::ATTRIBUTE_ID.start, v);
    }
    /// Set the reserved 16 bits.
    pub fn set_resv16(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::RESV16.start, v);
    }
    /// Set AttributeModifier.
    pub fn set_attribute_modifier(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::ATTRIBUTE_MODIFIER.start, v);
    }
}

/// A MAD's common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// BaseVersion (1).
    pub base_version: u8,
    /// MgmtClass.
    pub mgmt_class: u8,
    /// ClassVersion.
    pub class_version: u8,
    /// R bit and Method.
    pub method: u8,
    /// Status.
    pub status: u16,
    /// ClassSpecific.
    pub class_specific: u16,
    /// TransactionID.
    pub transaction_id: u64,
    /// AttributeID: which message of the class.
    pub attribute_id: u16,
    /// AttributeModifier.
    pub attribute_modifier: u32,
}

impl Repr {
    /// The header of a CM message `attribute_id` in transaction `tid`, as
    /// every CM MAD has it: method Send, status 0.
    pub const fn cm(attribute_id: u16, transaction_id: u64) -> Repr {
        Repr {
            base_version: BASE_VERSION,
            mgmt_class: CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id,
            attribute_modifier: 0,
        }
    }

    /// Parse a MAD's common header.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            base_version: packet.base_version(),
            mgmt_class: packet.mgmt_class(),
            class_version: packet.class_version(),
            method: packet.method(),
            status: packet.status(),
            class_specific: packet.class_specific(),
            transaction_id: packet.transaction_id(),
            attribute_id: packet.attribute_id(),
            attribute_modifier: packet.attribute_modifier(),
        })
    }

    /// Bytes [`Repr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the header (reserved bits zero).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_base_version(self.base_version);
        packet.set_mgmt_class(self.mgmt_class);
        packet.set_class_version(self.class_version);
        packet.set_method(self.method);
        packet.set_status(self.status);
        packet.set_class_specific(self.class_specific);
        packet.set_transaction_id(self.transaction_id);
        packet.set_attribute_id(self.attribute_id);
        packet.set_resv16(0);
        packet.set_attribute_modifier(self.attribute_modifier);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MAD class={:#04x} v{} method={:#04x} status={:#06x} tid={:#018x} attr={:#06x}",
            self.mgmt_class,
            self.class_version,
            self.method,
            self.status,
            self.transaction_id,
            self.attribute_id
        )?;
        if self.attribute_modifier != 0 {
            write!(f, " attr_mod={:#010x}", self.attribute_modifier)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct() {
        // cm-rping.pcap, frame 1: the REQ's header.
        let bytes = [
            0x01, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0xde, 0x6a,
            0xdb, 0xc3, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        ];
        let repr = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr, Repr::cm(0x0010, 0x0000_0002_de6a_dbc3));
        let mut buf = [0xFFu8; 24];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
        assert!(Packet::new_checked(&bytes[..23]).is_err());
    }
}
