//! Memory windows (`ibv_alloc_mw`): type 2, bound by a BIND_MW work request.

use std::cell::UnsafeCell;
use std::ffi::c_int;

use rnic_verbs::MemoryWindow;

use crate::ffi::{self, object, Object};
use crate::pd::{next_handle, Pd};
use crate::sys;

#[repr(C)]
pub(crate) struct Mw {
    /// rnic updates `rkey` when a bind is posted.
    c: UnsafeCell<sys::ibv_mw>,
    magic: u64,
    pub mw: MemoryWindow,
}
object!(Mw, sys::ibv_mw, b"rnic-mw\0");

// SAFETY: the C part's rkey is written when the program posts a bind, which
// it serialises with its own reads; the rest is Sync.
unsafe impl Sync for Mw {}
// SAFETY: as above.
unsafe impl Send for Mw {}

impl Mw {
    /// Record the R_Key a bind gave the window.
    pub fn set_rkey(&self, rkey: u32) {
        // SAFETY: see the Sync impl.
        unsafe { (*self.c.get()).rkey = rkey };
    }
}

pub(crate) unsafe extern "C" fn alloc_mw(
    pd: *mut sys::ibv_pd,
    kind: sys::ibv_mw_type,
) -> *mut sys::ibv_mw {
    ffi::ptr_call(|| {
        // SAFETY: the program's pointer.
        let p = unsafe { Pd::from_c(pd)? };
        if kind != sys::IBV_MW_TYPE_2 {
            return Err(libc::EOPNOTSUPP);
        }
        let mw = p.pd.alloc_mw().map_err(|e| ffi::errno_of(&e))?;
        let c = sys::ibv_mw {
            context: p.ctx,
            pd,
            rkey: mw.rkey(),
            handle: next_handle(),
            type_: kind,
        };
        Ok(Mw {
            c: UnsafeCell::new(c),
            magic: Mw::MAGIC,
            mw,
        }
        .into_c())
    })
}

pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut sys::ibv_mw) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's pointer.
        unsafe { ffi::free::<Mw>(mw) }.ok_or(libc::EINVAL)?;
        Ok(())
    })
}

/// Type 1 binds (`ibv_bind_mw`): rnic's windows are type 2.
pub(crate) unsafe extern "C" fn bind_mw(
    _qp: *mut sys::ibv_qp,
    _mw: *mut sys::ibv_mw,
    _bind: *mut sys::ibv_mw_bind,
) -> c_int {
    libc::EOPNOTSUPP
}
