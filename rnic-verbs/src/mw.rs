//! Memory windows (type 1 and type 2): part of a region opened to peers,
//! bound and unbound through a queue pair.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::{Device, MwType, ProtectionDomain, Result};

impl ProtectionDomain {
    /// Allocate a type 2 memory window (`ibv_alloc_mw(IBV_MW_TYPE_2)`): it
    /// opens nothing until [`QueuePair::bind_mw`](crate::QueuePair::bind_mw) binds it, for that QP.
    pub fn alloc_mw(&self) -> Result<MemoryWindow> {
        self.alloc_mw_of(MwType::Two)
    }

    /// Allocate a type 1 memory window (`ibv_alloc_mw(IBV_MW_TYPE_1)`):
    /// once bound ([`QueuePair::bind_mw`](crate::QueuePair::bind_mw) through any QP of this domain) it
    /// opens its range to every QP of the domain; bound again, the new range
    /// replaces the old; bound with length 0 it closes.
    pub fn alloc_type1_mw(&self) -> Result<MemoryWindow> {
        self.alloc_mw_of(MwType::One)
    }

    fn alloc_mw_of(&self, kind: MwType) -> Result<MemoryWindow> {
        let pd = self.pd;
        let rkey = self.dev.call(move |st| st.nic.alloc_mw_of(pd, kind))??;
        Ok(MemoryWindow {
            kind,
            dev: self.dev.clone(),
            rkey: AtomicU32::new(rkey),
        })
    }
}

/// A memory window (type 1 or 2). Dropping it frees it (`ibv_dealloc_mw`).
#[derive(Debug)]
pub struct MemoryWindow {
    pub(crate) kind: MwType,
    pub(crate) dev: Device,
    pub(crate) rkey: AtomicU32,
}

impl MemoryWindow {
    /// Type 1 or type 2.
    pub fn kind(&self) -> MwType {
        self.kind
    }
    /// Its R_Key: the one the last [`QueuePair::bind_mw`](crate::QueuePair::bind_mw) gave it (what a
    /// peer needs), or its first, unbound one.
    pub fn rkey(&self) -> u32 {
        self.rkey.load(Ordering::Relaxed)
    }
    /// The R_Key a bind gives it next: the same index, the low byte moved
    /// on, as `ibv_inc_rkey` does.
    pub fn next_rkey(&self) -> u32 {
        let k = self.rkey();
        (k & !0xFF) | (k.wrapping_add(1) & 0xFF)
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        let rkey = self.rkey();
        let _ = self.dev.engine.call(move |st| {
            let _ = st.nic.dealloc_mw(rkey);
        });
    }
}
