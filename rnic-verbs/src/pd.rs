//! Protection domains, parent domains, and holds on a domain for objects
//! the NIC does not keep (address handles).

use std::sync::atomic::{AtomicBool, Ordering};

use rnic_core::mem::PdHandle;

use crate::{Access, Device, Result};

impl Device {
    /// Allocate a protection domain.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        let pd = self.engine.call(|st| st.nic.alloc_pd())?;
        Ok(ProtectionDomain {
            dev: self.clone(),
            pd,
            parent: false,
            done: AtomicBool::new(false),
        })
    }
}

/// A protection domain. Dropping it frees it in the NIC, at once or with
/// the last region, window or queue pair still in it; a parent domain
/// dropped lets go of the domain under it.
#[derive(Debug)]
pub struct ProtectionDomain {
    pub(crate) dev: Device,
    pub(crate) pd: PdHandle,
    /// A parent domain over `pd` (see [`ProtectionDomain::parent_domain`]).
    pub(crate) parent: bool,
    /// Freed already ([`ProtectionDomain::dealloc`]).
    pub(crate) done: AtomicBool,
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        if self.done.load(Ordering::Acquire) {
            return;
        }
        if self.parent {
            self.release();
        } else {
            let pd = self.pd;
            let _ = self.dev.engine.call(move |st| st.nic.release_pd(pd));
        }
    }
}

impl ProtectionDomain {
    /// Free the domain in the NIC (`ibv_dealloc_pd`). Refused while a
    /// region, window, queue pair or parent domain is still in it; after
    /// it, nothing can be made in this domain. A parent domain lets go of
    /// the domain under it.
    pub fn dealloc(&self) -> Result<()> {
        if self.done.load(Ordering::Acquire) {
            return Ok(());
        }
        if self.parent {
            self.release();
        } else {
            let pd = self.pd;
            self.dev.engine.call(move |st| st.nic.dealloc_pd(pd))??;
        }
        self.done.store(true, Ordering::Release);
        Ok(())
    }

    /// Count one more user of the domain that the NIC does not keep (a
    /// parent domain, an address handle): `dealloc` is refused until
    /// [`ProtectionDomain::release`].
    pub(crate) fn acquire(&self) -> Result<()> {
        let pd = self.pd;
        self.dev.engine.call(move |st| st.nic.pd_acquire(pd))??;
        Ok(())
    }

    /// One such user fewer.
    pub(crate) fn release(&self) {
        release_pd_user(&self.dev, self.pd);
    }

    /// A parent domain over this domain (`ibv_alloc_parent_domain`): what
    /// is made in it is in this domain, and this domain cannot be freed
    /// until the parent is ([`ProtectionDomain::dealloc`] on it).
    pub fn parent_domain(&self) -> Result<ProtectionDomain> {
        self.acquire()?;
        Ok(ProtectionDomain {
            dev: self.dev.clone(),
            pd: self.pd,
            parent: true,
            done: AtomicBool::new(false),
        })
    }

    /// Whether this is a parent domain.
    pub fn is_parent(&self) -> bool {
        self.parent
    }

    /// Hold the domain for an object the NIC does not keep itself (an
    /// address handle, whose address is all a UD send needs): it cannot be
    /// freed until the hold is dropped, as `ibv_dealloc_pd` is refused
    /// while address handles are in the domain.
    pub fn hold(&self) -> Result<DomainHold> {
        self.acquire()?;
        Ok(DomainHold {
            dev: self.dev.clone(),
            pd: self.pd,
        })
    }

    /// Check that `lkey`, a region of this domain, covers `len` bytes at
    /// `addr` with `access` (what `ibv_advise_mr` validates; rnic never
    /// pins or faults, so there is nothing to prefetch).
    pub fn check_local(&self, lkey: u32, addr: u64, len: u64, access: Access) -> Result<()> {
        let pd = self.pd;
        self.dev
            .engine
            .call(move |st| st.nic.check_local(pd, lkey, addr, len, access))??;
        Ok(())
    }
}

/// A hold on a protection domain ([`ProtectionDomain::hold`]); dropping it
/// lets go.
#[derive(Debug)]
pub struct DomainHold {
    pub(crate) dev: Device,
    pub(crate) pd: PdHandle,
}

impl Drop for DomainHold {
    fn drop(&mut self) {
        release_pd_user(&self.dev, self.pd);
    }
}

/// One user (a parent domain, a hold) of domain `pd` fewer; a domain its
/// owner released goes with its last user.
fn release_pd_user(dev: &Device, pd: PdHandle) {
    let _ = dev.engine.call(move |st| st.nic.pd_release(pd));
}
