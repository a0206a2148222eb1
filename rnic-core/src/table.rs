//! The NIC's tables of objects: slots in a vector for the handles it
//! numbers itself (protection domains, CQs, SRQs, regions), and maps for the
//! identifiers it draws at random (QP numbers, key indices).

use core::hash::{BuildHasherDefault, Hasher};
use std::collections::HashMap;

/// A map from a random 32-bit identifier (a QP number, a key index).
pub(crate) type IdMap<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

/// Hashes a 32-bit identifier by one multiplication (Fibonacci hashing):
/// the identifiers are random already, and the NIC, not the peer, picks
/// them.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = u64::from(v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A free slot in the table `v` (the first, so the table stays as long as
/// the most objects alive at once), made if need be.
pub(crate) fn free_slot<T>(v: &mut Vec<Option<T>>) -> usize {
    match v.iter().position(Option::is_none) {
        Some(i) => i,
        None => {
            v.push(None);
            v.len() - 1
        }
    }
}
