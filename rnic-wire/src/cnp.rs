//! Congestion Notification Packet body (RoCE v2 annex A17.9.3): BTH opcode 0x81,
//! BECN set, then 16 reserved bytes, then the ICRC.

use crate::Layer;

crate::field::fixed_header_view!(
    /// A view of the 16 reserved bytes that follow a CNP's BTH.
    layer = Layer::Cnp, len = 16
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The reserved bytes (sent as zero, ignored on receipt).
    pub fn reserved(&self) -> &[u8] {
        &self.buffer.as_ref()[..HEADER_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Zero the reserved bytes.
    pub fn clear(&mut self) {
        self.buffer.as_mut()[..HEADER_LEN].fill(0);
    }
}
