//! Memory regions: memory the NIC may read and write, with the keys that
//! name it.

use core::fmt;
use std::sync::Arc;

use rnic_core::mem::MemError;

use crate::memory::{self, Backing, DmaBuf, Placement};
use crate::{Access, Device, Error, ProtectionDomain, Result, Sge, VerbError};

impl ProtectionDomain {
    /// Allocate `len` zeroed bytes on the heap and register them with `access`.
    pub fn register(&self, len: usize, access: Access) -> Result<MemoryRegion> {
        self.register_with(len, access, Backing::Heap)
    }

    /// Allocate `len` zeroed bytes from `backing` (heap, pages of their own,
    /// huge pages) and register them with `access`.
    pub fn register_with(
        &self,
        len: usize,
        access: Access,
        backing: Backing,
    ) -> Result<MemoryRegion> {
        self.register_buf(DmaBuf::new(len, backing)?, access)
    }

    /// Register the caller's own buffer, in place: the NIC reads and writes
    /// these very bytes (through [`MemoryRegion::read`] and `write` meanwhile),
    /// and [`MemoryRegion::into_vec`] gives them back once the NIC has let go.
    /// The buffer must be 8-byte aligned, as the system allocator makes any
    /// `Vec<u8>` here; if not, it comes back in [`Error::Unaligned`].
    pub fn register_vec(&self, buf: Vec<u8>, access: Access) -> Result<MemoryRegion> {
        let buf = DmaBuf::from_vec(buf).map_err(Error::Unaligned)?;
        self.register_buf(buf, access)
    }

    /// Register `len` bytes at `addr`, memory rnic does not own (a C
    /// program's buffer, for `ibv_reg_mr`), in place, with `iova` as the
    /// address peers name it by. See `DmaBuf::foreign` for how rnic shares it.
    ///
    /// # Safety
    /// `addr..addr+len` must stay mapped, readable and writable, until the
    /// region is deregistered ([`MemoryRegion::deregister`] returns `Ok`, or
    /// it is dropped).
    #[allow(unsafe_code)]
    pub unsafe fn register_foreign(
        &self,
        addr: std::ptr::NonNull<u8>,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MemoryRegion> {
        // SAFETY: the caller's promise, passed on.
        let buf = unsafe { DmaBuf::foreign(addr, len) };
        self.register_at(buf, iova, access)
    }

    fn register_buf(&self, buf: DmaBuf, access: Access) -> Result<MemoryRegion> {
        let iova = buf.addr();
        self.register_at(buf, iova, access)
    }

    fn register_at(&self, buf: DmaBuf, iova: u64, access: Access) -> Result<MemoryRegion> {
        let buf = Arc::new(buf);
        let shared = memory::Shared(buf.clone());
        let pd = self.pd;
        let keys = self
            .dev
            .call(move |st| st.nic.reg_mr(pd, iova, Box::new(shared), access))??;
        Ok(MemoryRegion {
            dev: self.dev.clone(),
            buf,
            lkey: keys.lkey,
            rkey: keys.rkey,
            registered: true,
        })
    }
}

/// Registered memory. Dropping it deregisters it; the memory itself lives on
/// until the NIC has let go of it too.
pub struct MemoryRegion {
    pub(crate) dev: Device,
    pub(crate) buf: Arc<DmaBuf>,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    pub(crate) registered: bool,
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .finish()
    }
}

impl MemoryRegion {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
    /// The address of the first byte (what a peer puts in a RETH).
    pub fn addr(&self) -> u64 {
        self.buf.addr()
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    /// Where its memory came from.
    pub fn placement(&self) -> Placement {
        self.buf.placement()
    }
    /// A scatter/gather entry for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge {
            addr: self.addr() + offset as u64,
            length: len,
            lkey: self.lkey,
        }
    }
    /// Deregister now and hand back the buffer given to
    /// [`ProtectionDomain::register_vec`], once the NIC holds it no more.
    /// Fails if its memory was allocated by rnic, or if memory windows are
    /// bound to it (the region is then dropped as usual: the NIC keeps the
    /// memory until it can let go).
    pub fn into_vec(mut self) -> Result<Vec<u8>> {
        if self.placement() != Placement::Caller {
            return Err(Error::NotReturnable);
        }
        // When this returns, the engine has dropped its handle on the memory.
        self.deregister()?;
        let buf = std::mem::replace(&mut self.buf, Arc::new(DmaBuf::zeroed(0)));
        Arc::try_unwrap(buf)
            .ok()
            .and_then(DmaBuf::into_vec)
            .ok_or(Error::NotReturnable)
    }
    /// Deregister now (`ibv_dereg_mr`): when this returns `Ok`, the NIC will
    /// not touch the memory again. Fails, leaving the region registered, if
    /// memory windows are bound to it.
    pub fn deregister(&mut self) -> Result<()> {
        if self.registered {
            let lkey = self.lkey;
            self.dev.call(move |st| st.nic.dereg_mr(lkey).map(drop))??;
            self.registered = false;
        }
        Ok(())
    }
    /// Change the region in place (`ibv_rereg_mr`), keeping its keys: move
    /// it to protection domain `pd` (of the same device), give it rights
    /// `access`, or both. On an error nothing changed. Refused while memory
    /// windows are bound to it.
    pub fn rereg(&mut self, pd: Option<&ProtectionDomain>, access: Option<Access>) -> Result<()> {
        self.rereg_inner(pd, access, None)
    }

    /// [`MemoryRegion::rereg`], and also (if `memory` is given) cover other
    /// memory: `len` bytes at `addr`, at I/O virtual address `iova` (the
    /// `IBV_REREG_MR_CHANGE_TRANSLATION` of `ibv_rereg_mr`). Operations in
    /// flight that name the old addresses then fail their checks; the old
    /// memory is the caller's again when this returns.
    ///
    /// # Safety
    /// As [`ProtectionDomain::register_foreign`]: the new memory must stay
    /// valid until the region is deregistered or changed again.
    #[allow(unsafe_code)]
    pub unsafe fn rereg_foreign(
        &mut self,
        pd: Option<&ProtectionDomain>,
        access: Option<Access>,
        memory: Option<(std::ptr::NonNull<u8>, usize, u64)>,
    ) -> Result<()> {
        let memory = memory.map(|(addr, len, iova)| {
            // SAFETY: the caller's promise, passed on.
            (unsafe { DmaBuf::foreign(addr, len) }, iova)
        });
        self.rereg_inner(pd, access, memory)
    }

    fn rereg_inner(
        &mut self,
        pd: Option<&ProtectionDomain>,
        access: Option<Access>,
        memory: Option<(DmaBuf, u64)>,
    ) -> Result<()> {
        if !self.registered {
            return Err(VerbError::Mem(MemError::InvalidKey(self.lkey)).into());
        }
        let pd = match pd {
            // A domain's handle means nothing to another device's NIC.
            Some(p) if !Arc::ptr_eq(&p.dev.engine, &self.dev.engine) => {
                return Err(VerbError::Mem(MemError::NoSuchPd(p.pd)).into())
            }
            Some(p) => Some(p.pd),
            None => None,
        };
        let memory = memory.map(|(buf, iova)| (Arc::new(buf), iova));
        let translation = memory.as_ref().map(|(buf, iova)| {
            (
                *iova,
                Box::new(memory::Shared(buf.clone())) as Box<dyn rnic_core::mem::Region>,
            )
        });
        let lkey = self.lkey;
        // The old memory's handle is dropped in the engine, after which the
        // NIC cannot reach it.
        self.dev
            .call(move |st| st.nic.rereg_mr(lkey, pd, access, translation).map(drop))??;
        if let Some((buf, _)) = memory {
            self.buf = buf;
        }
        Ok(())
    }

    /// Copy `data` into the region at `offset`; false if it does not fit.
    pub fn write(&self, offset: usize, data: &[u8]) -> bool {
        self.buf.write(offset, data)
    }
    /// Copy out of the region from `offset`; false if out of bounds.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        self.buf.read(offset, out)
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // Refused while windows are bound: the NIC then keeps the memory
        // until it can let go (see `into_vec`).
        let _ = self.deregister();
    }
}
