//! Packet sequence numbers: 24 bits that wrap, compared modulo 2^24.

use core::fmt;

/// A 24-bit packet sequence number.
///
/// PSNs wrap from 0xFFFFFF to 0, so they are not totally ordered: `a` is before
/// `b` when `b - a` (mod 2^24) lies in the forward half of the space (IBTA 9.7.1:
/// the valid window is half the PSN space).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The largest PSN.
    pub const MAX: Psn = Psn(0x00FF_FFFF);
    /// Mask of the 24 PSN bits.
    pub const MASK: u32 = 0x00FF_FFFF;
    /// Half the PSN space: the largest forward distance that still means "after".
    pub const HALF: u32 = 1 << 23;

    /// A PSN from the low 24 bits of `value` (the upper 8 bits are dropped, as on the wire).
    #[inline]
    pub const fn new(value: u32) -> Psn {
        Psn(value & Self::MASK)
    }

    /// A PSN from `value`, or `None` when it does not fit in 24 bits.
    #[inline]
    pub const fn try_new(value: u32) -> Option<Psn> {
        if value <= Self::MASK {
            Some(Psn(value))
        } else {
            None
        }
    }

    /// The 24-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n`, wrapping at 2^24.
    #[inline]
    #[must_use]
    pub const fn add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & Self::MASK)
    }

    /// `self - n`, wrapping at 2^24.
    #[inline]
    #[must_use]
    pub const fn sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & Self::MASK)
    }

    /// The next PSN.
    #[inline]
    #[must_use]
    pub const fn next(self) -> Psn {
        self.add(1)
    }

    /// The forward distance from `other` to `self`, modulo 2^24 (0 ..= 2^24 - 1).
    #[inline]
    pub const fn forward_from(self, other: Psn) -> u32 {
        self.0.wrapping_sub(other.0) & Self::MASK
    }

    /// The signed distance `self - other` in `-2^23 ..= 2^23 - 1`.
    #[inline]
    pub const fn diff(self, other: Psn) -> i32 {
        // Sign-extend the 24-bit difference.
        ((self.forward_from(other) << 8) as i32) >> 8
    }

    /// True when `self` comes strictly before `other` (modular).
    #[inline]
    pub const fn is_before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }

    /// True when `self` comes strictly after `other` (modular).
    #[inline]
    pub const fn is_after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }

    /// The modular ordering of `self` relative to `other`.
    #[inline]
    pub fn modular_cmp(self, other: Psn) -> core::cmp::Ordering {
        self.diff(other).cmp(&0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

impl From<Psn> for u32 {
    fn from(p: Psn) -> u32 {
        p.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps() {
        assert_eq!(Psn::MAX.next(), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), Psn::MAX);
        assert_eq!(Psn::new(0x0100_0005), Psn::new(5));
        assert_eq!(Psn::try_new(0x0100_0000), None);
    }

    #[test]
    fn compares_across_the_wrap() {
        let a = Psn::new(0xFF_FFFE);
        let b = Psn::new(3);
        assert!(a.is_before(b));
        assert!(b.is_after(a));
        assert_eq!(b.diff(a), 5);
        assert_eq!(a.diff(b), -5);
        assert_eq!(b.forward_from(a), 5);
    }

    #[test]
    fn half_window_edges() {
        let z = Psn::new(0);
        assert_eq!(z.add(Psn::HALF - 1).diff(z), (Psn::HALF - 1) as i32);
        // Exactly half the space away reads as "before": 2^23 is not representable forward.
        assert_eq!(z.add(Psn::HALF).diff(z), -(Psn::HALF as i32));
    }

    proptest! {
        #[test]
        fn add_then_diff(a in 0u32..=Psn::MASK, n in 0u32..Psn::HALF) {
            let a = Psn::new(a);
            let b = a.add(n);
            prop_assert_eq!(b.diff(a), n as i32);
            prop_assert_eq!(a.diff(b), -(n as i32));
            prop_assert_eq!(b.sub(n), a);
            prop_assert_eq!(n > 0, b.is_after(a));
        }
    }
}
