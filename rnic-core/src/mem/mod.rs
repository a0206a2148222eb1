//! Protection domains and memory regions: the memory the NIC may touch, and the
//! checks that decide whether it may touch it.
//!
//! A memory region covers memory the driver hands in (anything implementing
//! [`Region`]: a `Vec<u8>` in the simulator, mmap'd pages in the driver) at an
//! I/O virtual address chosen by the application. Its L_Key and R_Key are
//! `index << 8 | key`, as rdma_rxe makes them, but where rdma_rxe hands out
//! indices in order, rnic draws the 24-bit index at random (ChaCha20; a
//! window's has its top bit set), finds the entry through a table, and
//! does not hand a freed index out again until [`QUARANTINE`](crate::rng::QUARANTINE) more have
//! been freed; the 8-bit key is random too (a window's belongs to the
//! consumer once it is bound). A stale or guessed key finds nothing.

use core::fmt;

use crate::counters::Footprint;
use crate::rng::{Ids, SecretRng};
use crate::table::{free_slot, IdMap};

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
    /// IBV_ACCESS_MW_BIND: memory windows may be bound to the region.
    pub const MW_BIND: Access = Access(0x10);
    /// IBV_ACCESS_FLUSH_GLOBAL: an RDMA FLUSH may ask for global visibility.
    pub const FLUSH_GLOBAL: Access = Access(0x100);
    /// IBV_ACCESS_FLUSH_PERSISTENT: an RDMA FLUSH may ask for persistence
    /// (only on memory that can persist, see [`Region::persist`]).
    pub const FLUSH_PERSISTENT: Access = Access(0x200);
    const ALL: u32 = 0x31F;
    /// The rights a memory window can grant.
    const WINDOW: u32 = 0xE;

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
            (Access::MW_BIND, "MW_BIND"),
            (Access::FLUSH_GLOBAL, "FLUSH_GLOBAL"),
            (Access::FLUSH_PERSISTENT, "FLUSH_PERSISTENT"),
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
    /// Whether this memory can be made persistent (a file or persistent
    /// memory behind it): only then may it be registered with
    /// FLUSH_PERSISTENT.
    fn can_persist(&self) -> bool {
        false
    }
    /// Make `len` bytes at `offset` persistent (an RDMA FLUSH asking for
    /// persistence); false if that failed. Called only when
    /// [`Region::can_persist`] is true. Global visibility needs nothing: every
    /// write is visible once the engine has made it.
    fn persist(&mut self, offset: usize, len: usize) -> bool {
        let _ = (offset, len);
        false
    }
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
    /// FLUSH_PERSISTENT on memory that cannot persist.
    CannotPersist,
    /// The region has memory windows bound to it: it stays until they are
    /// invalidated or freed.
    WindowsBound(u32),
    /// A memory window operation that the window's state or the request forbids.
    BadWindow {
        /// The window's R_Key (or the key that named no window).
        key: u32,
        /// Why.
        reason: &'static str,
    },
    /// A type 2 memory window used through a QP it is not bound to.
    WrongQp {
        /// The key used.
        key: u32,
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
            MemError::CannotPersist => {
                f.write_str("FLUSH_PERSISTENT on memory that cannot be made persistent")
            }
            MemError::WindowsBound(k) => {
                write!(f, "memory region {k:#010x} still has memory windows bound")
            }
            MemError::BadWindow { key, reason } => {
                write!(f, "memory window {key:#010x}: {reason}")
            }
            MemError::WrongQp { key } => {
                write!(
                    f,
                    "memory window {key:#010x} is bound to another queue pair"
                )
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
    /// Memory windows bound to it.
    windows: u32,
}

/// A memory window: an R_Key for part of a region.
struct Mw {
    pd: PdHandle,
    key: u8,
    kind: MwType,
    bound: Option<Binding>,
}

/// The two kinds of memory window (IBTA 10.6.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MwType {
    /// Type 1 (`ibv_bind_mw`): opens its range to every QP of its domain;
    /// bound again at any time (the new binding replaces the old), closed
    /// by a bind of length 0, never by LOCAL_INV or SEND_WITH_INV.
    One,
    /// Type 2 (a BIND_MW work request): opens its range to the one QP that
    /// bound it; bound only while free, and freed by LOCAL_INV or by the
    /// peer's SEND_WITH_INV.
    Two,
}

#[derive(Clone, Copy)]
struct Binding {
    mr: usize,
    addr: u64,
    len: u64,
    access: Access,
    qpn: u32,
}

/// Window keys have this bit set in their index; region keys do not.
const MW_INDEX: usize = 1 << 23;

/// Key indices to slots.
type Slots = IdMap<usize>;

/// A BIND_MW work request's arguments (`ibv_mw_bind_info` and the new R_Key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MwBind {
    /// The window's current R_Key.
    pub mw_rkey: u32,
    /// Its R_Key after the bind: the same index, a new low byte (`ibv_inc_rkey`).
    pub new_rkey: u32,
    /// Local key of the region the window opens.
    pub mr_lkey: u32,
    /// Start address (inside the region).
    pub addr: u64,
    /// Length in bytes (not zero).
    pub length: u64,
    /// Remote rights granted (REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC).
    pub access: Access,
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

/// A protection domain: how many regions, windows, QPs and holds use it,
/// and whether its owner let go of it (it is freed with its last user).
#[derive(Debug, Clone, Copy)]
struct Pd {
    users: u32,
    released: bool,
}

/// Protection domains and memory regions of one NIC.
pub struct Memory {
    pds: Vec<Option<Pd>>,
    mrs: Vec<Option<Mr>>,
    mws: Vec<Option<Mw>>,
    /// The index part of each region's and window's keys, to its slot.
    mr_slots: Slots,
    mw_slots: Slots,
    mr_ids: Ids,
    mw_ids: Ids,
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
    /// An empty table whose keys follow from `seed` (reproducible, for
    /// tests and simulation).
    pub fn new(seed: u64) -> Memory {
        Memory::with_secret(SecretRng::from_u64(seed ^ 0x6D65_6D6B_6579_7321))
    }

    /// An empty table whose keys are drawn from `secret`.
    pub fn with_secret(mut secret: SecretRng) -> Memory {
        let windows = secret.split();
        let top = MW_INDEX as u32;
        Memory {
            pds: Vec::new(),
            mrs: Vec::new(),
            mws: Vec::new(),
            mr_slots: Slots::default(),
            mw_slots: Slots::default(),
            // Index 0 is left out: no key of rnic's is below 0x100.
            mr_ids: Ids::new(secret, 1, top - 1),
            mw_ids: Ids::new(windows, top, 2 * top - 1),
        }
    }

    /// The slot of the region whose keys have `key`'s index part (or
    /// `usize::MAX`, which finds nothing).
    fn mr_slot(&self, key: u32) -> usize {
        self.mr_slots
            .get(&(key >> 8))
            .copied()
            .unwrap_or(usize::MAX)
    }

    /// The same for windows.
    fn mw_slot(&self, key: u32) -> usize {
        self.mw_slots
            .get(&(key >> 8))
            .copied()
            .unwrap_or(usize::MAX)
    }

    /// What the tables hold: the memory part of a NIC's [`Footprint`]
    /// (PD, region and window slots, keys in use and resting).
    pub fn footprint(&self) -> Footprint {
        Footprint {
            pd_slots: self.pds.len(),
            key_slots: self.mrs.len() + self.mws.len(),
            keys: self.mr_slots.len() + self.mw_slots.len(),
            regions: self.mrs.iter().flatten().count() + self.mws.iter().flatten().count(),
            resting_ids: self.mr_ids.resting() + self.mw_ids.resting(),
            ..Footprint::default()
        }
    }

    /// Allocate a protection domain.
    pub fn alloc_pd(&mut self) -> PdHandle {
        let i = free_slot(&mut self.pds);
        self.pds[i] = Some(Pd {
            users: 0,
            released: false,
        });
        PdHandle(i as u32)
    }

    /// The live domain `pd` (not released by its owner).
    fn pd_mut(&mut self, pd: PdHandle) -> Result<&mut Pd, MemError> {
        match self.pds.get_mut(pd.0 as usize) {
            Some(Some(p)) if !p.released => Ok(p),
            _ => Err(MemError::NoSuchPd(pd)),
        }
    }

    /// Free a protection domain that nothing uses any more.
    pub fn dealloc_pd(&mut self, pd: PdHandle) -> Result<(), MemError> {
        if self.pd_mut(pd)?.users > 0 {
            return Err(MemError::PdBusy(pd));
        }
        self.pds[pd.0 as usize] = None;
        Ok(())
    }

    /// The owner of `pd` is done with it: freed now if nothing uses it,
    /// else with its last user. Nothing new can be made in it either way.
    pub fn release_pd(&mut self, pd: PdHandle) -> Result<(), MemError> {
        let p = self.pd_mut(pd)?;
        if p.users == 0 {
            self.pds[pd.0 as usize] = None;
        } else {
            p.released = true;
        }
        Ok(())
    }

    /// Count one more user (a QP) of `pd`.
    pub fn pd_acquire(&mut self, pd: PdHandle) -> Result<(), MemError> {
        self.pd_mut(pd)?.users += 1;
        Ok(())
    }

    /// Count one user fewer of `pd`; a released domain goes with its last.
    pub fn pd_release(&mut self, pd: PdHandle) {
        let i = pd.0 as usize;
        let last = match self.pds.get_mut(i) {
            Some(Some(p)) => {
                p.users = p.users.saturating_sub(1);
                p.users == 0 && p.released
            }
            _ => false,
        };
        if last {
            self.pds[i] = None;
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
        self.check_registration(pd, iova, region.as_ref(), access)?;
        let slots = &self.mr_slots;
        let id = self
            .mr_ids
            .draw(|v| slots.contains_key(&v))
            .ok_or(MemError::InvalidKey(u32::MAX))?;
        let key = self.mr_ids.next_u64() as u8;
        let index = free_slot(&mut self.mrs);
        self.mr_slots.insert(id, index);
        self.mrs[index] = Some(Mr {
            pd,
            iova,
            access,
            key,
            region,
            windows: 0,
        });
        // The domain was checked above.
        let _ = self.pd_acquire(pd);
        let k = id << 8 | u32::from(key);
        Ok(MrKeys { lkey: k, rkey: k })
    }

    /// Change a registered region in place (`ibv_rereg_mr`): its protection
    /// domain, its access rights, or the memory it covers and where
    /// (`translation`: the I/O virtual address and the new memory). Its keys
    /// stay the same. Everything is checked before anything changes: on an
    /// error the region is as it was. Returns the memory a new translation
    /// replaced. Refused while memory windows are bound to it: their bounds
    /// were checked against what it covers.
    pub fn reregister(
        &mut self,
        lkey: u32,
        pd: Option<PdHandle>,
        access: Option<Access>,
        translation: Option<(u64, Box<dyn Region>)>,
    ) -> Result<Option<Box<dyn Region>>, MemError> {
        let index = self.mr_slot(lkey);
        let mr = match self.mrs.get(index) {
            Some(Some(mr)) if mr.key == lkey as u8 => mr,
            _ => return Err(MemError::InvalidKey(lkey)),
        };
        if mr.windows > 0 {
            return Err(MemError::WindowsBound(lkey));
        }
        // The region as it would be, checked as a registration is.
        let new_access = access.unwrap_or(mr.access);
        let (iova, region) = match &translation {
            Some((iova, region)) => (*iova, region.as_ref()),
            None => (mr.iova, mr.region.as_ref()),
        };
        self.check_registration(pd.unwrap_or(mr.pd), iova, region, new_access)?;
        let old_pd = mr.pd;
        if let Some(pd) = pd {
            self.pd_release(old_pd);
            // Checked above: the domain exists.
            let _ = self.pd_acquire(pd);
        }
        let Some(Some(mr)) = self.mrs.get_mut(index) else {
            return Err(MemError::InvalidKey(lkey));
        };
        if let Some(pd) = pd {
            mr.pd = pd;
        }
        mr.access = new_access;
        Ok(translation.map(|(iova, region)| {
            mr.iova = iova;
            std::mem::replace(&mut mr.region, region)
        }))
    }

    /// What a region must be to be registered (or re-registered so): in a
    /// domain that exists, with rights `ibv_reg_mr` allows, persistent if it
    /// asks for FLUSH_PERSISTENT, and at addresses that do not wrap.
    fn check_registration(
        &self,
        pd: PdHandle,
        iova: u64,
        region: &dyn Region,
        access: Access,
    ) -> Result<(), MemError> {
        if !matches!(self.pds.get(pd.0 as usize), Some(Some(p)) if !p.released) {
            return Err(MemError::NoSuchPd(pd));
        }
        if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err(MemError::RemoteWriteNeedsLocalWrite);
        }
        if access.contains(Access::FLUSH_PERSISTENT) && !region.can_persist() {
            return Err(MemError::CannotPersist);
        }
        let len = region.len() as u64;
        if iova.checked_add(len).is_none() {
            return Err(MemError::AddressOverflow { iova, len });
        }
        Ok(())
    }

    /// Deregister the region with local key `lkey` and hand its memory back.
    /// After this no key of it is valid: operations still in flight that name
    /// it fail their checks, and none can reach the memory.
    pub fn deregister(&mut self, lkey: u32) -> Result<Box<dyn Region>, MemError> {
        let index = self.mr_slot(lkey);
        match self.mrs.get(index) {
            Some(Some(mr)) if mr.key == lkey as u8 && mr.windows > 0 => {
                return Err(MemError::WindowsBound(lkey))
            }
            Some(Some(mr)) if mr.key == lkey as u8 => {}
            _ => return Err(MemError::InvalidKey(lkey)),
        }
        let mr = self.mrs[index].take().ok_or(MemError::InvalidKey(lkey))?;
        self.mr_slots.remove(&(lkey >> 8));
        self.mr_ids.release(lkey >> 8);
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
        let index = self.mr_slot(key);
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

    /// Check a remote access: `key` is an R_Key from the wire naming a region
    /// or a memory window, `pd` and `qpn` are those of the QP it arrived on.
    pub fn check_remote(
        &self,
        key: u32,
        pd: PdHandle,
        qpn: u32,
        va: u64,
        len: u64,
        needed: Access,
    ) -> Result<Span, MemError> {
        if (key >> 8) as usize & MW_INDEX == 0 {
            return self.check(key, pd, va, len, needed);
        }
        let b = self.binding(key, pd, qpn)?;
        if !b.access.contains(needed) {
            return Err(MemError::NoPermission {
                key,
                needed,
                granted: b.access,
            });
        }
        let out = MemError::OutOfBounds { key, va, len };
        let offset = va.checked_sub(b.addr).ok_or(out)?;
        if offset.checked_add(len).ok_or(out)? > b.len {
            return Err(out);
        }
        let mr = self.mrs.get(b.mr).and_then(Option::as_ref).ok_or(out)?;
        Ok(Span {
            index: b.mr,
            offset: (va - mr.iova) as usize,
            len: len as usize,
        })
    }

    /// As [`Memory::check_remote`], for an 8-byte atomic (or ATOMIC_WRITE,
    /// with `needed` REMOTE_WRITE), which must also be aligned.
    pub fn check_atomic(
        &self,
        key: u32,
        pd: PdHandle,
        qpn: u32,
        va: u64,
        needed: Access,
    ) -> Result<Span, MemError> {
        let span = self.check_remote(key, pd, qpn, va, 8, needed)?;
        if va % 8 != 0 {
            return Err(MemError::Misaligned { va });
        }
        Ok(span)
    }

    /// The whole range an R_Key opens, as (start address, length): what a
    /// FLUSH of a whole region covers.
    pub fn extent(&self, key: u32, pd: PdHandle, qpn: u32) -> Result<(u64, u64), MemError> {
        if (key >> 8) as usize & MW_INDEX != 0 {
            let b = self.binding(key, pd, qpn)?;
            return Ok((b.addr, b.len));
        }
        match self.mrs.get(self.mr_slot(key)) {
            Some(Some(mr)) if mr.key == key as u8 => Ok((mr.iova, mr.region.len() as u64)),
            _ => Err(MemError::InvalidKey(key)),
        }
    }

    /// Make a checked span persistent; false if the memory could not.
    pub fn persist(&mut self, span: Span) -> bool {
        match self.mrs.get_mut(span.index) {
            Some(Some(mr)) if mr.region.can_persist() => mr.region.persist(span.offset, span.len),
            _ => false,
        }
    }

    fn binding(&self, key: u32, pd: PdHandle, qpn: u32) -> Result<Binding, MemError> {
        let mw = match self.mws.get(self.mw_slot(key)) {
            Some(Some(mw)) if mw.key == key as u8 => mw,
            _ => return Err(MemError::InvalidKey(key)),
        };
        let b = mw.bound.ok_or(MemError::InvalidKey(key))?;
        if mw.pd != pd {
            return Err(MemError::WrongPd { key });
        }
        if mw.kind == MwType::Two && b.qpn != qpn {
            return Err(MemError::WrongQp { key });
        }
        Ok(b)
    }

    /// Allocate a type 2 memory window in `pd`; returns its R_Key, valid only
    /// once a BIND_MW has bound it.
    pub fn alloc_mw(&mut self, pd: PdHandle) -> Result<u32, MemError> {
        self.alloc_mw_of(pd, MwType::Two)
    }

    /// Allocate a memory window of type `kind` in `pd`; returns its R_Key,
    /// which opens nothing until a bind.
    pub fn alloc_mw_of(&mut self, pd: PdHandle, kind: MwType) -> Result<u32, MemError> {
        let slots = &self.mw_slots;
        let id = self
            .mw_ids
            .draw(|v| slots.contains_key(&v))
            .ok_or(MemError::InvalidKey(u32::MAX))?;
        self.pd_acquire(pd)?;
        let key = self.mw_ids.next_u64() as u8;
        let index = free_slot(&mut self.mws);
        self.mw_slots.insert(id, index);
        self.mws[index] = Some(Mw {
            pd,
            key,
            kind,
            bound: None,
        });
        Ok(id << 8 | u32::from(key))
    }

    /// Free a memory window (`ibv_dealloc_mw`); its key stops working at once.
    /// The window is named by the index part of `rkey`: the key byte is not
    /// checked, so a handle that kept an older key of the window (binds
    /// change it) still frees it.
    pub fn dealloc_mw(&mut self, rkey: u32) -> Result<(), MemError> {
        if (rkey >> 8) as usize & MW_INDEX == 0 {
            return Err(MemError::InvalidKey(rkey));
        }
        let slot = self.mw_slot(rkey);
        if !matches!(self.mws.get(slot), Some(Some(_))) {
            return Err(MemError::InvalidKey(rkey));
        }
        let mw = self.mws[slot].take().ok_or(MemError::InvalidKey(rkey))?;
        self.mw_slots.remove(&(rkey >> 8));
        self.mw_ids.release(rkey >> 8);
        self.unbind(&mw);
        self.pd_release(mw.pd);
        Ok(())
    }

    fn unbind(&mut self, mw: &Mw) {
        if let Some(b) = mw.bound {
            if let Some(Some(mr)) = self.mrs.get_mut(b.mr) {
                mr.windows = mr.windows.saturating_sub(1);
            }
        }
    }

    /// Bind a window to part of a region through QP `qpn` in `pd` (a BIND_MW
    /// work request, IBTA 10.6.7): a free type 2 window, for that QP; a type
    /// 1 window, bound or not, for every QP of the domain, or closed by a
    /// length of 0. Returns the window's new R_Key. Refused, changing
    /// nothing, if any check fails.
    pub fn bind_mw(&mut self, pd: PdHandle, qpn: u32, b: &MwBind) -> Result<u32, MemError> {
        let key = b.mw_rkey;
        let bad = |reason| MemError::BadWindow { key, reason };
        let index = (key >> 8) as usize;
        if index & MW_INDEX == 0 || (b.new_rkey >> 8) != (key >> 8) {
            return Err(bad("the new R_Key must keep the window's index"));
        }
        let mw = match self.mws.get(self.mw_slot(key)) {
            Some(Some(mw)) if mw.key == key as u8 => mw,
            _ => return Err(MemError::InvalidKey(key)),
        };
        let kind = mw.kind;
        if kind == MwType::Two && mw.bound.is_some() {
            return Err(bad(
                "a type 2 window must be invalidated before it is bound again",
            ));
        }
        if mw.pd != pd {
            return Err(MemError::WrongPd { key });
        }
        if b.length == 0 && kind == MwType::Two {
            return Err(bad("a type 2 window cannot be bound with length 0"));
        }
        if b.length == 0 {
            // Type 1 closed: it opens nothing, under a new key.
            self.set_binding(key, b.new_rkey as u8, None);
            return Ok(b.new_rkey);
        }
        // LOCAL_WRITE means nothing to a window, which only grants remote
        // rights; rdma_rxe and mlx5 accept it in a bind, and so does rnic.
        if b.access.bits() & !(Access::WINDOW | Access::LOCAL_WRITE.bits()) != 0 {
            return Err(MemError::UnsupportedAccess(b.access.bits()));
        }
        let access = Access(b.access.bits() & Access::WINDOW);
        let mr_index = self.mr_slot(b.mr_lkey);
        let mr = match self.mrs.get(mr_index) {
            Some(Some(mr)) if mr.key == b.mr_lkey as u8 => mr,
            _ => return Err(MemError::InvalidKey(b.mr_lkey)),
        };
        if mr.pd != pd {
            return Err(MemError::WrongPd { key: b.mr_lkey });
        }
        if !mr.access.contains(Access::MW_BIND) {
            return Err(MemError::NoPermission {
                key: b.mr_lkey,
                needed: Access::MW_BIND,
                granted: mr.access,
            });
        }
        let writable =
            b.access.contains(Access::REMOTE_WRITE) || b.access.contains(Access::REMOTE_ATOMIC);
        if writable && !mr.access.contains(Access::LOCAL_WRITE) {
            return Err(MemError::RemoteWriteNeedsLocalWrite);
        }
        let out = MemError::OutOfBounds {
            key: b.mr_lkey,
            va: b.addr,
            len: b.length,
        };
        let offset = b.addr.checked_sub(mr.iova).ok_or(out)?;
        if offset.checked_add(b.length).ok_or(out)? > mr.region.len() as u64 {
            return Err(out);
        }
        let binding = Binding {
            mr: mr_index,
            addr: b.addr,
            len: b.length,
            access,
            qpn,
        };
        self.set_binding(key, b.new_rkey as u8, Some(binding));
        Ok(b.new_rkey)
    }

    /// Give the window whose keys have `window_key`'s index part the key
    /// byte `key` and binding `bound`, moving the count of windows from the
    /// region it was bound to, if any, to the new one.
    fn set_binding(&mut self, window_key: u32, key: u8, bound: Option<Binding>) {
        let slot = self.mw_slot(window_key);
        let Some(Some(mw)) = self.mws.get_mut(slot) else {
            return;
        };
        let old = std::mem::replace(&mut mw.bound, bound);
        mw.key = key;
        if let Some(Some(mr)) = old.and_then(|o| self.mrs.get_mut(o.mr)) {
            mr.windows = mr.windows.saturating_sub(1);
        }
        if let Some(Some(mr)) = bound.and_then(|n| self.mrs.get_mut(n.mr)) {
            mr.windows += 1;
        }
    }

    /// Invalidate the window with R_Key `rkey`: LOCAL_INV on a QP in `pd`
    /// (`remote_qpn` None), or the peer's SEND_WITH_INV arriving on QP
    /// `remote_qpn`, which must be the one the window is bound to. Afterwards
    /// the key opens nothing and the window is free to be bound again.
    /// Regions registered by `ibv_reg_mr` cannot be invalidated.
    pub fn invalidate(
        &mut self,
        rkey: u32,
        pd: PdHandle,
        remote_qpn: Option<u32>,
    ) -> Result<(), MemError> {
        if (rkey >> 8) as usize & MW_INDEX == 0 {
            return Err(MemError::BadWindow {
                key: rkey,
                reason: "a memory region registered by reg_mr cannot be invalidated",
            });
        }
        let slot = self.mw_slot(rkey);
        let mw = match self.mws.get(slot) {
            Some(Some(mw)) if mw.key == rkey as u8 => mw,
            _ => return Err(MemError::InvalidKey(rkey)),
        };
        if mw.kind == MwType::One {
            return Err(MemError::BadWindow {
                key: rkey,
                reason: "a type 1 window is closed by a bind of length 0, not invalidated",
            });
        }
        let Some(b) = mw.bound else {
            return Err(MemError::BadWindow {
                key: rkey,
                reason: "not bound",
            });
        };
        if mw.pd != pd {
            return Err(MemError::WrongPd { key: rkey });
        }
        if remote_qpn.is_some_and(|q| q != b.qpn) {
            return Err(MemError::WrongQp { key: rkey });
        }
        if let Some(Some(mr)) = self.mrs.get_mut(b.mr) {
            mr.windows = mr.windows.saturating_sub(1);
        }
        if let Some(Some(mw)) = self.mws.get_mut(slot) {
            mw.bound = None;
        }
        Ok(())
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
mod tests;
