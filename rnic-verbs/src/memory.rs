//! Registered memory shared by the application and the engine thread.
//!
//! On hardware the NIC writes registered memory by DMA while the CPU may read
//! it. Here the "NIC" is another thread of the same process, so the same
//! sharing would be a data race, which Rust forbids. Every byte of a region is
//! therefore an `AtomicU8`, read and written with relaxed ordering by both
//! sides: no undefined behaviour, and on x86-64 the same instructions as plain
//! loads and stores. Completions carry the ordering: the engine publishes a
//! completion through a channel after its writes, and the application reads
//! the memory after taking the completion.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use rnic_core::mem::Region;

/// Memory the NIC may read and write.
#[derive(Debug)]
pub struct DmaBuf {
    bytes: Box<[AtomicU8]>,
}

impl DmaBuf {
    /// `len` zeroed bytes.
    pub fn zeroed(len: usize) -> DmaBuf {
        DmaBuf {
            bytes: (0..len).map(|_| AtomicU8::new(0)).collect(),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The address of the first byte: the region's I/O virtual address, as
    /// verbs uses the buffer's address.
    pub fn addr(&self) -> u64 {
        self.bytes.as_ptr() as u64
    }

    /// Copy out `out.len()` bytes from `offset`; false if out of bounds.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        let Some(src) = offset
            .checked_add(out.len())
            .and_then(|end| self.bytes.get(offset..end))
        else {
            return false;
        };
        for (o, b) in out.iter_mut().zip(src) {
            *o = b.load(Ordering::Relaxed);
        }
        true
    }

    /// Copy `data` in at `offset`; false if out of bounds.
    pub fn write(&self, offset: usize, data: &[u8]) -> bool {
        let Some(dst) = offset
            .checked_add(data.len())
            .and_then(|end| self.bytes.get(offset..end))
        else {
            return false;
        };
        for (b, &v) in dst.iter().zip(data) {
            b.store(v, Ordering::Relaxed);
        }
        true
    }
}

/// The engine's handle on a region: it keeps the memory alive for as long as
/// the region is registered, whatever the application does with its handle.
pub(crate) struct Shared(pub Arc<DmaBuf>);

impl Region for Shared {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn read(&self, offset: usize, out: &mut [u8]) {
        self.0.read(offset, out);
    }
    fn write(&mut self, offset: usize, data: &[u8]) {
        self.0.write(offset, data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds() {
        let b = DmaBuf::zeroed(16);
        assert!(b.write(12, &[1, 2, 3, 4]));
        assert!(!b.write(13, &[1, 2, 3, 4]));
        assert!(!b.write(usize::MAX, &[1]));
        let mut out = [0u8; 5];
        assert!(b.read(11, &mut out));
        assert_eq!(out, [0, 1, 2, 3, 4]);
        assert!(!b.read(12, &mut out));
    }
}
