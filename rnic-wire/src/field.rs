//! Big-endian field access and the boilerplate every fixed-size header view shares.

/// A byte range inside a header.
pub(crate) type Field = core::ops::Range<usize>;

#[inline]
pub(crate) fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[inline]
pub(crate) fn get_u24(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}

#[inline]
pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
pub(crate) fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

#[inline]
pub(crate) fn set_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn set_u24(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}

#[inline]
pub(crate) fn set_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn set_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

/// Defines `Packet<T>`, a zero-copy view of a fixed-size header, with its
/// constructors; each header module adds its own field getters and setters.
macro_rules! fixed_header_view {
    ($(#[$doc:meta])* layer = $layer:expr, len = $len:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct Packet<T: AsRef<[u8]>> {
            buffer: T,
        }

        /// Length of the header in bytes.
        pub const HEADER_LEN: usize = $len;

        impl<T: AsRef<[u8]>> Packet<T> {
            /// Wrap a buffer without checking its length: a getter on a short
            /// buffer panics, so use this only on buffers known to be long enough.
            pub const fn new_unchecked(buffer: T) -> Packet<T> {
                Packet { buffer }
            }

            /// Wrap a buffer, checking that it holds the whole header.
            pub fn new_checked(buffer: T) -> $crate::Result<Packet<T>> {
                let packet = Packet::new_unchecked(buffer);
                packet.check_len()?;
                Ok(packet)
            }

            /// Check that the buffer holds the whole header.
            pub fn check_len(&self) -> $crate::Result<()> {
                $crate::error::need($layer, self.buffer.as_ref(), HEADER_LEN)
            }

            /// The buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// The header's own bytes.
            pub fn header(&self) -> &[u8] {
                &self.buffer.as_ref()[..HEADER_LEN]
            }
        }
    };
}
pub(crate) use fixed_header_view;
