//! Registered memory shared by the application and the engine thread.
//!
//! On hardware the NIC writes registered memory by DMA while the CPU may read
//! it. Here the "NIC" is another thread of the same process, so the same
//! sharing would be a data race, which Rust forbids. Every byte of a region is
//! therefore part of an `AtomicU64`, read and written with relaxed ordering
//! by both sides, always as whole words: no undefined behaviour, and on x86-64
//! the same instructions as plain loads and stores. Completions carry the ordering: the engine publishes a
//! completion through a channel after its writes, and the application reads
//! the memory after taking the completion.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rnic_core::mem::Region;

/// Memory the NIC may read and write: 64-bit atomic words, every access to
/// them atomic and of the same size, copied a word at a time.
#[derive(Debug)]
pub struct DmaBuf {
    words: Box<[AtomicU64]>,
    len: usize,
}

/// Byte `i` of a word, in memory order.
fn byte_of(word: u64, i: usize) -> u8 {
    word.to_ne_bytes()[i]
}

/// A mask selecting bytes `from..to` of a word, in memory order.
fn mask(from: usize, to: usize) -> u64 {
    let mut m = [0u8; 8];
    m[from..to].fill(0xFF);
    u64::from_ne_bytes(m)
}

impl DmaBuf {
    /// `len` zeroed bytes.
    pub fn zeroed(len: usize) -> DmaBuf {
        DmaBuf {
            words: (0..len.div_ceil(8)).map(|_| AtomicU64::new(0)).collect(),
            len,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the first byte: the region's I/O virtual address, as
    /// verbs uses the buffer's address.
    pub fn addr(&self) -> u64 {
        self.words.as_ptr() as u64
    }

    fn in_bounds(&self, offset: usize, n: usize) -> bool {
        offset.checked_add(n).is_some_and(|end| end <= self.len)
    }

    /// Copy out `out.len()` bytes from `offset`; false if out of bounds.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        if !self.in_bounds(offset, out.len()) {
            return false;
        }
        let mut pos = offset;
        let mut done = 0;
        while done < out.len() {
            let (w, b) = (pos / 8, pos % 8);
            let word = self.words[w].load(Ordering::Relaxed);
            if b == 0 && out.len() - done >= 8 {
                out[done..done + 8].copy_from_slice(&word.to_ne_bytes());
                done += 8;
                pos += 8;
            } else {
                let take = (8 - b).min(out.len() - done);
                for i in 0..take {
                    out[done + i] = byte_of(word, b + i);
                }
                done += take;
                pos += take;
            }
        }
        true
    }

    /// Copy `data` in at `offset`; false if it does not fit.
    pub fn write(&self, offset: usize, data: &[u8]) -> bool {
        if !self.in_bounds(offset, data.len()) {
            return false;
        }
        let mut pos = offset;
        let mut done = 0;
        while done < data.len() {
            let (w, b) = (pos / 8, pos % 8);
            if b == 0 && data.len() - done >= 8 {
                let mut v = [0u8; 8];
                v.copy_from_slice(&data[done..done + 8]);
                self.words[w].store(u64::from_ne_bytes(v), Ordering::Relaxed);
                done += 8;
                pos += 8;
            } else {
                // Part of a word: clear those bytes, then set them.
                let take = (8 - b).min(data.len() - done);
                let mut v = [0u8; 8];
                v[b..b + take].copy_from_slice(&data[done..done + take]);
                let m = mask(b, b + take);
                self.words[w].fetch_and(!m, Ordering::Relaxed);
                self.words[w].fetch_or(u64::from_ne_bytes(v) & m, Ordering::Relaxed);
                done += take;
                pos += take;
            }
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
    fn every_alignment_round_trips() {
        let b = DmaBuf::zeroed(64);
        for offset in 0..20 {
            for len in 0..30 {
                let data: Vec<u8> = (0..len as u8)
                    .map(|i| i.wrapping_mul(37).wrapping_add(offset as u8 + 1))
                    .collect();
                let before = {
                    let mut v = vec![0u8; 64];
                    b.read(0, &mut v);
                    v
                };
                assert!(b.write(offset, &data));
                let mut after = vec![0u8; 64];
                assert!(b.read(0, &mut after));
                let mut want = before.clone();
                want[offset..offset + len].copy_from_slice(&data);
                assert_eq!(after, want, "offset {offset} len {len}");
            }
        }
        assert_eq!(DmaBuf::zeroed(13).len(), 13);
        assert!(!DmaBuf::zeroed(13).write(10, &[0; 4]));
    }

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
