//! Protection domains and memory regions: the memory the NIC may touch, and the
//! checks that decide whether it may touch it.
//!
//! A memory region covers memory the driver hands in (anything implementing
//! [`Region`]: a `Vec<u8>` in the simulator, mmap'd pages in the driver) at an
//! I/O virtual address chosen by the application. Its L_Key and R_Key are
//! `index << 8 | key`, as rdma_rxe makes them: the index finds the entry, and
//! the 8-bit key, drawn anew from a seeded generator on every registration,
//! makes a stale or guessed key fail.

use core::fmt;

use crate::rng::Rng;

/// Memory access rights, with the values of `ibv_access_flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// No rights beyond local read (which every region has).
    pub const NONE: Access = Access(0);
    /// IBV_ACCESS_LOCAL_WRITE: the NIC may write here for local operations
    /// (receives, READ responses, atomic results).
    pub const LOCAL_WRITE: Access = Access(1);
    /// IBV_ACCESS_REMOTE_WRITE.
    pub const REMOTE_WRITE: Access = Access(2);
    /// IBV_ACCESS_REMOTE_READ.
    pub const REMOTE_READ: Access = Access(4);
    /// IBV_ACCESS_REMOTE_ATOMIC.
    pub const REMOTE_ATOMIC: Access = Access(8);
    const ALL: u32 = 0xF;

    /// From `ibv_access_flags` bits; `None` if any bit is one rnic does not support.
    pub const fn from_bits(bits: u32) -> Option<Access> {
        if bits & !Self::ALL == 0 {
            Some(Access(bits))
        } else {
            None
        }
    }
    /// The `ibv_access_flags` bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// Whether every right in `other` is in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Access::LOCAL_WRITE, "LOCAL_WRITE"),
            (Access::REMOTE_WRITE, "REMOTE_WRITE"),
            (Access::REMOTE_READ, "REMOTE_READ"),
            (Access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        ];
        let set: Vec<&str> = names
            .iter()
            .filter(|(a, _)| self.contains(*a))
            .map(|(_, n)| *n)
            .collect();
        if set.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&set.join("|"))
        }
    }
}

/// Memory the NIC reads and writes by offset: what a memory region stands on.
///
/// The engine is single-threaded; implementations for memory shared with the
/// application (the driver's) decide how plain reads and writes race with it,
/// as DMA on a real NIC does.
pub trait Region: Send {
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copy `out.len()` bytes from `offset` (in bounds: the caller checked).
    fn read(&self, offset: usize, out: &mut [u8]);
    /// Copy `data` to `offset` (in bounds: the caller checked).
    fn write(&mut self, offset: usize, data: &[u8]);
}

impl Region for Vec<u8> {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn read(&self, offset: usize, out: &mut [u8]) {
        out.copy_from_slice(&self[offset..offset + out.len()]);
    }
    fn write(&mut self, offset: usize, data: &[u8]) {
        self[offset..offset + data.len()].copy_from_slice(data);
    }
}

/// A protection domain handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdHandle(pub u32);

/// The keys of a registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrKeys {
    /// Local key, for scatter/gather entries of local work requests.
    pub lkey: u32,
    /// Remote key, for RETH and AtomicETH of remote requests.
    pub rkey: u32,
}

/// Why a memory operation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemError {
    /// No protection domain with this handle.
    NoSuchPd(PdHandle),
    /// The protection domain still has memory regions (or queue pairs).
    PdBusy(PdHandle),
    /// Access flags with bits rnic does not support.
    UnsupportedAccess(u32),
    /// REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE (ibv_reg_mr refuses it).
    RemoteWriteNeedsLocalWrite,
    /// The I/O virtual address range wraps around 2^64.
    AddressOverflow {
        /// Start address.
        iova: u64,
        /// Length.
        len: u64,
    },
    /// The key names no region, or a region registered under another key.
    InvalidKey(u32),
    /// The region belongs to another protection domain.
    WrongPd {
        /// The key used.
        key: u32,
    },
    /// The region lacks a right the operation needs.
    NoPermission {
        /// The key used.
        key: u32,
        /// What the operation needs.
        needed: Access,
        /// What the region grants.
        granted: Access,
    },
    /// The range is not inside the region.
    OutOfBounds {
        /// The key used.
        key: u32,
        /// Start address asked for.
        va: u64,
        /// Length asked for.
        len: u64,
    },
    /// An atomic operation on an address that is not 8-byte aligned.
    Misaligned {
        /// The address.
        va: u64,
    },
}

impl fmt::Display for MemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            MemError::NoSuchPd(pd) => write!(f, "no protection domain {}", pd.0),
            MemError::PdBusy(pd) => {
                write!(f, "protection domain {} still has resources", pd.0)
            }
            MemError::UnsupportedAccess(b) => write!(f, "unsupported access flags {b:#x}"),
            MemError::RemoteWriteNeedsLocalWrite => {
                f.write_str("REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE")
            }
            MemError::AddressOverflow { iova, len } => {
                write!(f, "range {iova:#x} + {len} wraps around the address space")
            }
            MemError::InvalidKey(k) => write!(f, "no memory region with key {k:#010x}"),
            MemError::WrongPd { key } => {
                write!(
                    f,
                    "memory region {key:#010x} is in another protection domain"
                )
            }
            MemError::NoPermission {
                key,
                needed,
                granted,
            } => write!(
                f,
                "memory region {key:#010x} grants {granted}, the operation needs {needed}"
            ),
            MemError::OutOfBounds { key, va, len } => write!(
                f,
                "{len} bytes at {va:#x} are outside memory region {key:#010x}"
            ),
            MemError::Misaligned { va } => {
                write!(f, "atomic operation on {va:#x}, not 8-byte aligned")
            }
        }
    }
}

impl std::error::Error for MemError {}

struct Mr {
    pd: PdHandle,
    iova: u64,
    access: Access,
    key: u8,
    region: Box<dyn Region>,
}

/// Where a checked access landed: a region and an offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    index: usize,
    offset: usize,
    len: usize,
}

impl Span {
    /// Bytes in the span.
    pub const fn len(&self) -> usize {
        self.len
    }
    /// Whether the span is empty.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Protection domains and memory regions of one NIC.
pub struct Memory {
    pds: Vec<Option<u32>>, // per PD: how many MRs and QPs use it
    mrs: Vec<Option<Mr>>,
    last_key: Vec<u8>, // per MR index, the key of its last registration
    rng: Rng,
}

impl fmt::Debug for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Memory")
            .field("pds", &self.pds.iter().filter(|p| p.is_some()).count())
            .field("mrs", &self.mrs.iter().filter(|m| m.is_some()).count())
            .finish()
    }
}

impl Memory {
    /// An empty table; `seed` makes the keys unpredictable to peers yet
    /// reproducible in simulation.
    pub fn new(seed: u64) -> Memory {
        Memory {
            pds: Vec::new(),
            mrs: Vec::new(),
            last_key: Vec::new(),
            rng: Rng::new(seed ^ 0x6D65_6D6B_6579_7321),
        }
    }

    /// Allocate a protection domain.
    pub fn alloc_pd(&mut self) -> PdHandle {
        let i = match self.pds.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.pds.push(None);
                self.pds.len() - 1
            }
        };
        self.pds[i] = Some(0);
        PdHandle(i as u32)
    }

    /// Free a protection domain that nothing uses any more.
    pub fn dealloc_pd(&mut self, pd: PdHandle) -> Result<(), MemError> {
        match self.pds.get_mut(pd.0 as usize) {
            Some(slot @ Some(0)) => {
                *slot = None;
                Ok(())
            }
            Some(Some(_)) => Err(MemError::PdBusy(pd)),
            _ => Err(MemError::NoSuchPd(pd)),
        }
    }

    /// Count one more user (a QP) of `pd`.
    pub fn pd_acquire(&mut self, pd: PdHandle) -> Result<(), MemError> {
        match self.pds.get_mut(pd.0 as usize) {
            Some(Some(n)) => {
                *n += 1;
                Ok(())
            }
            _ => Err(MemError::NoSuchPd(pd)),
        }
    }

    /// Count one user fewer of `pd`.
    pub fn pd_release(&mut self, pd: PdHandle) {
        if let Some(Some(n)) = self.pds.get_mut(pd.0 as usize) {
            *n = n.saturating_sub(1);
        }
    }

    /// Register `region` at I/O virtual address `iova` in `pd` with `access`.
    pub fn register(
        &mut self,
        pd: PdHandle,
        iova: u64,
        region: Box<dyn Region>,
        access: Access,
    ) -> Result<MrKeys, MemError> {
        if !matches!(self.pds.get(pd.0 as usize), Some(Some(_))) {
            return Err(MemError::NoSuchPd(pd));
        }
        if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err(MemError::RemoteWriteNeedsLocalWrite);
        }
        let len = region.len() as u64;
        if iova.checked_add(len).is_none() {
            return Err(MemError::AddressOverflow { iova, len });
        }
        let index = match self.mrs.iter().position(Option::is_none) {
            Some(i) => i,
            None if self.mrs.len() < (1 << 24) => {
                self.mrs.push(None);
                self.last_key.push(0);
                self.mrs.len() - 1
            }
            None => return Err(MemError::InvalidKey(u32::MAX)),
        };
        // A key different from this slot's previous one, so a stale key never
        // matches the region registered after it.
        let key = self.last_key[index].wrapping_add(1 + self.rng.below(255) as u8);
        self.last_key[index] = key;
        self.mrs[index] = Some(Mr {
            pd,
            iova,
            access,
            key,
            region,
        });
        if let Some(Some(n)) = self.pds.get_mut(pd.0 as usize) {
            *n += 1;
        }
        let k = (index as u32) << 8 | u32::from(key);
        Ok(MrKeys { lkey: k, rkey: k })
    }

    /// Deregister the region with local key `lkey` and hand its memory back.
    /// After this no key of it is valid: operations still in flight that name
    /// it fail their checks, and none can reach the memory.
    pub fn deregister(&mut self, lkey: u32) -> Result<Box<dyn Region>, MemError> {
        let index = (lkey >> 8) as usize;
        match self.mrs.get(index) {
            Some(Some(mr)) if mr.key == lkey as u8 => {}
            _ => return Err(MemError::InvalidKey(lkey)),
        }
        let mr = self.mrs[index].take().ok_or(MemError::InvalidKey(lkey))?;
        self.pd_release(mr.pd);
        Ok(mr.region)
    }

    /// Check that `len` bytes at `va` may be accessed with `key` from `pd` with
    /// rights `needed`. Overflow-safe: a range that wraps is out of bounds.
    pub fn check(
        &self,
        key: u32,
        pd: PdHandle,
        va: u64,
        len: u64,
        needed: Access,
    ) -> Result<Span, MemError> {
        let index = (key >> 8) as usize;
        let mr = match self.mrs.get(index) {
            Some(Some(mr)) if mr.key == key as u8 => mr,
            _ => return Err(MemError::InvalidKey(key)),
        };
        if mr.pd != pd {
            return Err(MemError::WrongPd { key });
        }
        if !mr.access.contains(needed) {
            return Err(MemError::NoPermission {
                key,
                needed,
                granted: mr.access,
            });
        }
        let out = MemError::OutOfBounds { key, va, len };
        let offset = va.checked_sub(mr.iova).ok_or(out)?;
        let end = offset.checked_add(len).ok_or(out)?;
        if end > mr.region.len() as u64 {
            return Err(out);
        }
        Ok(Span {
            index,
            offset: offset as usize,
            len: len as usize,
        })
    }

    /// As [`Memory::check`], for an 8-byte atomic, which must also be aligned.
    pub fn check_atomic(&self, key: u32, pd: PdHandle, va: u64) -> Result<Span, MemError> {
        let span = self.check(key, pd, va, 8, Access::REMOTE_ATOMIC)?;
        if va % 8 != 0 {
            return Err(MemError::Misaligned { va });
        }
        Ok(span)
    }

    /// Copy from a checked span. `out` must be `span.len()` bytes.
    pub fn read(&self, span: Span, out: &mut [u8]) {
        if let Some(Some(mr)) = self.mrs.get(span.index) {
            let n = out.len().min(span.len);
            mr.region.read(span.offset, &mut out[..n]);
        }
    }

    /// Copy into a checked span. `data` must be `span.len()` bytes.
    pub fn write(&mut self, span: Span, data: &[u8]) {
        if let Some(Some(mr)) = self.mrs.get_mut(span.index) {
            let n = data.len().min(span.len);
            mr.region.write(span.offset, &data[..n]);
        }
    }

    /// The 64-bit value (host byte order, as IB atomics see memory) at a checked span.
    pub fn read_u64(&self, span: Span) -> u64 {
        let mut b = [0u8; 8];
        self.read(span, &mut b);
        u64::from_ne_bytes(b)
    }

    /// Store a 64-bit value (host byte order) at a checked span.
    pub fn write_u64(&mut self, span: Span, v: u64) {
        self.write(span, &v.to_ne_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn setup() -> (Memory, PdHandle, MrKeys) {
        let mut m = Memory::new(1);
        let pd = m.alloc_pd();
        let keys = m
            .register(
                pd,
                0x1000,
                Box::new(vec![0u8; 256]),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
        (m, pd, keys)
    }

    #[test]
    fn read_write_in_bounds() {
        let (mut m, pd, k) = setup();
        let s = m
            .check(k.rkey, pd, 0x1010, 4, Access::REMOTE_WRITE)
            .unwrap();
        m.write(s, &[1, 2, 3, 4]);
        let mut out = [0u8; 6];
        let s = m.check(k.lkey, pd, 0x100f, 6, Access::NONE).unwrap();
        m.read(s, &mut out);
        assert_eq!(out, [0, 1, 2, 3, 4, 0]);
        // The last byte, and an empty range at the end, are in bounds.
        assert!(m.check(k.rkey, pd, 0x10ff, 1, Access::REMOTE_READ).is_ok());
        assert!(m.check(k.rkey, pd, 0x1100, 0, Access::REMOTE_READ).is_ok());
    }

    #[test]
    fn refusals() {
        let (mut m, pd, k) = setup();
        let other_pd = m.alloc_pd();
        assert_eq!(
            m.check(k.rkey, pd, 0x1100, 1, Access::REMOTE_READ),
            Err(MemError::OutOfBounds {
                key: k.rkey,
                va: 0x1100,
                len: 1
            })
        );
        assert!(matches!(
            m.check(k.rkey, pd, 0xfff, 1, Access::NONE),
            Err(MemError::OutOfBounds { .. })
        ));
        assert!(matches!(
            m.check(k.rkey, pd, 0x1000, u64::MAX, Access::NONE),
            Err(MemError::OutOfBounds { .. })
        ));
        assert!(matches!(
            m.check(k.rkey, pd, u64::MAX, 2, Access::NONE),
            Err(MemError::OutOfBounds { .. })
        ));
        assert_eq!(
            m.check(k.rkey, other_pd, 0x1000, 1, Access::NONE),
            Err(MemError::WrongPd { key: k.rkey })
        );
        assert!(matches!(
            m.check(k.rkey, pd, 0x1000, 8, Access::REMOTE_ATOMIC),
            Err(MemError::NoPermission { .. })
        ));
        assert_eq!(
            m.check(k.rkey ^ 1, pd, 0x1000, 1, Access::NONE),
            Err(MemError::InvalidKey(k.rkey ^ 1))
        );
        assert_eq!(
            m.check(0xFFFF_FF00, pd, 0x1000, 1, Access::NONE),
            Err(MemError::InvalidKey(0xFFFF_FF00))
        );
        assert_eq!(
            m.register(pd, 0, Box::new(vec![0u8; 8]), Access::REMOTE_WRITE)
                .unwrap_err(),
            MemError::RemoteWriteNeedsLocalWrite
        );
        assert_eq!(
            m.register(pd, u64::MAX - 3, Box::new(vec![0u8; 8]), Access::NONE)
                .unwrap_err(),
            MemError::AddressOverflow {
                iova: u64::MAX - 3,
                len: 8
            }
        );
        assert_eq!(m.dealloc_pd(pd), Err(MemError::PdBusy(pd)));
    }

    #[test]
    fn atomics_need_alignment_and_right() {
        let mut m = Memory::new(2);
        let pd = m.alloc_pd();
        let k = m
            .register(
                pd,
                0x2000,
                Box::new(vec![0u8; 64]),
                Access::LOCAL_WRITE | Access::REMOTE_ATOMIC,
            )
            .unwrap();
        let s = m.check_atomic(k.rkey, pd, 0x2008).unwrap();
        m.write_u64(s, 0x1122_3344_5566_7788);
        assert_eq!(m.read_u64(s), 0x1122_3344_5566_7788);
        assert_eq!(
            m.check_atomic(k.rkey, pd, 0x2004),
            Err(MemError::Misaligned { va: 0x2004 })
        );
        assert!(matches!(
            m.check_atomic(k.rkey, pd, 0x2040),
            Err(MemError::OutOfBounds { .. })
        ));
    }

    #[test]
    fn stale_keys_fail_after_reregistration() {
        let (mut m, pd, k) = setup();
        let region = m.deregister(k.lkey).unwrap();
        assert_eq!(region.len(), 256);
        assert_eq!(
            m.check(k.rkey, pd, 0x1000, 1, Access::NONE),
            Err(MemError::InvalidKey(k.rkey))
        );
        assert!(m.deregister(k.lkey).is_err());
        let k2 = m.register(pd, 0x1000, region, Access::LOCAL_WRITE).unwrap();
        assert_eq!(k2.lkey >> 8, k.lkey >> 8, "the slot is reused");
        assert_ne!(k2.lkey, k.lkey, "with a new key");
        assert!(m.check(k.rkey, pd, 0x1000, 1, Access::NONE).is_err());
        m.deregister(k2.lkey).unwrap();
        assert_eq!(m.dealloc_pd(pd), Ok(()));
        assert_eq!(m.dealloc_pd(pd), Err(MemError::NoSuchPd(pd)));
    }

    #[test]
    fn keys_differ_between_nics_and_registrations() {
        let keys = |seed| {
            let mut m = Memory::new(seed);
            let pd = m.alloc_pd();
            (0..4)
                .map(|_| {
                    m.register(pd, 0, Box::new(vec![0u8; 1]), Access::NONE)
                        .unwrap()
                        .rkey
                })
                .collect::<Vec<_>>()
        };
        assert_ne!(keys(1), keys(2));
        assert_eq!(keys(3), keys(3));
    }

    proptest! {
        /// check() accepts exactly the ranges inside the region, for any inputs.
        #[test]
        fn bounds_are_exact(iova in any::<u64>(), size in 0usize..4096, va in any::<u64>(), len in any::<u64>()) {
            let mut m = Memory::new(9);
            let pd = m.alloc_pd();
            let Ok(k) = m.register(pd, iova, Box::new(vec![0u8; size]), Access::NONE) else {
                prop_assert!(iova.checked_add(size as u64).is_none());
                return Ok(());
            };
            let inside = va >= iova
                && (va as u128) + (len as u128) <= (iova as u128) + (size as u128);
            prop_assert_eq!(m.check(k.lkey, pd, va, len, Access::NONE).is_ok(), inside);
        }
    }
}
