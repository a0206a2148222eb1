//! Seeded random number generators: the core takes no randomness from the
//! system, so that a simulation replays from its seed. [`Rng`] (SplitMix64)
//! drives the simulator; [`SecretRng`] (ChaCha20) draws what a peer must not
//! guess, and [`Ids`] the QP numbers and key indices from it.

use std::collections::{HashSet, VecDeque};

use chacha20::ChaCha20Rng;
use rand_core::{Rng as _, SeedableRng};

/// SplitMix64: fast, statistically sound for simulation and key generation, and
/// fully determined by its seed.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator that yields the same sequence for the same seed.
    pub const fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`n` > 0), without modulo bias worth noticing for n < 2^32.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        ((u128::from(self.next_u64()) * u128::from(n.max(1))) >> 64) as u64
    }

    /// True with probability `p` (0.0 ..= 1.0).
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next_u64() >> 11) as f64 / ((1u64 << 53) as f64)) < p
    }
}

/// A cryptographically secure generator (ChaCha20) for identifiers a peer
/// must not predict: QP numbers and the index part of L_Keys and R_Keys
/// (ReDMArk, USENIX Security 2021, guessed both on every NIC it tried). The
/// driver seeds it from the operating system; the simulator from its seed,
/// to replay.
pub struct SecretRng(ChaCha20Rng);

impl core::fmt::Debug for SecretRng {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("SecretRng { .. }")
    }
}

impl SecretRng {
    /// From 256 bits of seed.
    pub fn from_seed(seed: [u8; 32]) -> SecretRng {
        SecretRng(ChaCha20Rng::from_seed(seed))
    }

    /// From a 64-bit seed, stretched (for simulation, where replay matters
    /// and secrecy does not).
    pub fn from_u64(seed: u64) -> SecretRng {
        let mut s = Rng::new(seed);
        let mut bytes = [0u8; 32];
        for chunk in bytes.chunks_mut(8) {
            chunk.copy_from_slice(&s.next_u64().to_le_bytes());
        }
        SecretRng::from_seed(bytes)
    }

    /// A new generator whose stream is independent of this one's.
    pub fn split(&mut self) -> SecretRng {
        let mut bytes = [0u8; 32];
        self.0.fill_bytes(&mut bytes);
        SecretRng::from_seed(bytes)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A value in `0..n` (`n` > 0), without bias.
    pub fn below(&mut self, n: u64) -> u64 {
        let n = n.max(1);
        // Reject the top partial range (Lemire's method without division
        // on the fast path would do too; identifiers are drawn rarely).
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let v = self.next_u64();
            if v < zone {
                return v % n;
            }
        }
    }
}

/// How many freed identifiers of one kind stay out of use: a stale packet
/// for a destroyed QP or a deregistered key finds nothing until this many
/// more have been freed after it.
pub const QUARANTINE: usize = 4096;

/// Identifiers (QP numbers, key indices) drawn at random from a range,
/// never one in use and never one freed recently. Which are in use is the
/// owner's table; this keeps the ones resting.
#[derive(Debug)]
pub struct Ids {
    rng: SecretRng,
    /// The values drawn from: `lo..=hi`.
    lo: u32,
    hi: u32,
    recent: VecDeque<u32>,
    recent_set: HashSet<u32>,
}

impl Ids {
    /// Identifiers in `lo..=hi`, drawn with `rng`.
    pub fn new(rng: SecretRng, lo: u32, hi: u32) -> Ids {
        Ids {
            rng,
            lo,
            hi,
            recent: VecDeque::new(),
            recent_set: HashSet::new(),
        }
    }

    fn free(&self, v: u32, taken: &impl Fn(u32) -> bool) -> bool {
        !taken(v) && !self.recent_set.contains(&v)
    }

    /// A fresh identifier, neither `taken` (in use, by the owner's table)
    /// nor resting; `None` when there is none.
    pub fn draw(&mut self, taken: impl Fn(u32) -> bool) -> Option<u32> {
        let span = u64::from(self.hi - self.lo) + 1;
        // The range is large and mostly free: a few random tries find one.
        for _ in 0..64 {
            let v = self.lo + self.rng.below(span) as u32;
            if self.free(v, &taken) {
                return Some(v);
            }
        }
        // Nearly full: walk from a random point.
        let start = self.rng.below(span);
        (0..span)
            .map(|k| self.lo + ((start + k) % span) as u32)
            .find(|&v| self.free(v, &taken))
    }

    /// Draw from `lo..=hi` from now on.
    pub fn set_range(&mut self, lo: u32, hi: u32) {
        self.lo = lo;
        self.hi = hi;
    }

    /// Whether `v` itself may be used: in the range, not `taken`, not
    /// resting.
    pub fn claim(&self, v: u32, taken: impl Fn(u32) -> bool) -> bool {
        (self.lo..=self.hi).contains(&v) && self.free(v, &taken)
    }

    /// `v` is no longer in use: it rests until [`QUARANTINE`] more have
    /// been freed.
    pub fn release(&mut self, v: u32) {
        self.recent.push_back(v);
        self.recent_set.insert(v);
        if self.recent.len() > QUARANTINE {
            if let Some(old) = self.recent.pop_front() {
                self.recent_set.remove(&old);
            }
        }
    }

    /// How many freed identifiers are resting (at most [`QUARANTINE`]).
    pub fn resting(&self) -> usize {
        self.recent.len()
    }

    /// Random bits from the same secret stream (a key's low byte, say).
    pub fn next_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// A generator of its own, split from this one's stream.
    pub fn split(&mut self) -> SecretRng {
        self.rng.split()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unpredictable_unique_and_rest_after_release() {
        // The owner's table: what is in use.
        struct Table {
            ids: Ids,
            used: HashSet<u32>,
        }
        impl Table {
            fn new(seed: u64, lo: u32, hi: u32) -> Table {
                Table {
                    ids: Ids::new(SecretRng::from_u64(seed), lo, hi),
                    used: HashSet::new(),
                }
            }
            fn draw(&mut self) -> Option<u32> {
                let used = &self.used;
                let v = self.ids.draw(|v| used.contains(&v))?;
                self.used.insert(v);
                Some(v)
            }
            fn claim(&self, v: u32) -> bool {
                self.ids.claim(v, |v| self.used.contains(&v))
            }
            fn release(&mut self, v: u32) {
                self.used.remove(&v);
                self.ids.release(v);
            }
        }
        let mut ids = Table::new(5, 0x11, 0xFF_FFFE);
        let first: Vec<u32> = (0..1000).map(|_| ids.draw().unwrap()).collect();
        let unique: HashSet<u32> = first.iter().copied().collect();
        assert_eq!(unique.len(), 1000);
        assert!(first.iter().all(|v| (0x11..=0xFF_FFFE).contains(v)));
        // Not handed out in order: consecutive draws are far apart.
        let steps_of_one = first.windows(2).filter(|w| w[1] == w[0] + 1).count();
        assert_eq!(steps_of_one, 0);
        // Spread over the whole range.
        assert!(first.iter().any(|&v| v < 0x40_0000) && first.iter().any(|&v| v > 0xC0_0000));
        // A freed value is not drawn again while it rests.
        let mut small = Table::new(6, 1, 8);
        let all: Vec<u32> = (0..8).map(|_| small.draw().unwrap()).collect();
        assert_eq!(small.draw(), None, "all in use");
        small.release(all[3]);
        assert_eq!(small.draw(), None, "a freed value rests first");
        assert!(!small.claim(all[3]), "even when asked for by name");
        assert!(!small.claim(all[4]), "in use");
        assert!(!small.claim(9), "out of range");
        // After QUARANTINE more releases it is free again.
        let mut big = Table::new(7, 1, QUARANTINE as u32 + 1);
        let v = big.draw().unwrap();
        big.release(v);
        let others: Vec<u32> = (0..QUARANTINE).map(|_| big.draw().unwrap()).collect();
        assert!(!others.contains(&v));
        assert_eq!(big.draw(), None);
        for o in others {
            big.release(o);
        }
        assert_eq!(big.draw(), Some(v), "rested long enough");
        // The same seed replays; another seed does not.
        let a: Vec<u32> = {
            let mut i = Table::new(9, 0, 0xFF_FFFF);
            (0..8).map(|_| i.draw().unwrap()).collect()
        };
        let b: Vec<u32> = {
            let mut i = Table::new(9, 0, 0xFF_FFFF);
            (0..8).map(|_| i.draw().unwrap()).collect()
        };
        let c: Vec<u32> = {
            let mut i = Table::new(10, 0, 0xFF_FFFF);
            (0..8).map(|_| i.draw().unwrap()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn replays_from_seed() {
        let a: Vec<u64> = (0..8)
            .scan(Rng::new(7), |r, _| Some(r.next_u64()))
            .collect();
        let b: Vec<u64> = (0..8)
            .scan(Rng::new(7), |r, _| Some(r.next_u64()))
            .collect();
        assert_eq!(a, b);
        assert_ne!(a[0], Rng::new(8).next_u64());
    }

    #[test]
    fn chance_and_below_are_roughly_fair() {
        let mut r = Rng::new(1);
        let hits = (0..100_000).filter(|_| r.chance(0.3)).count();
        assert!((28_000..32_000).contains(&hits), "{hits}");
        assert!(!(0..1000).any(|_| r.chance(0.0)));
        assert!((0..1000).all(|_| r.chance(1.0)));
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[r.below(10) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
    }
}
