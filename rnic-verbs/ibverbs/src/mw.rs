//! Memory windows (`ibv_alloc_mw`): type 2, bound by a BIND_MW work request;
//! type 1, bound by `ibv_bind_mw`, which posts that work request for the
//! program (as rdma_rxe's provider does).

use std::cell::UnsafeCell;
use std::ffi::c_int;

use rnic_verbs::{MemoryWindow, MwType};

use crate::ffi::{self, object, Object};
use crate::pd::{next_handle, Pd};
use crate::qp::Qp;
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
        let mw = match kind {
            sys::IBV_MW_TYPE_1 => p.pd.alloc_type1_mw(),
            sys::IBV_MW_TYPE_2 => p.pd.alloc_mw(),
            _ => return Err(libc::EOPNOTSUPP),
        }
        .map_err(|e| ffi::errno_of(&e))?;
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

/// `ibv_bind_mw`, for a type 1 window (verbs.h has checked the type, and
/// that the region is in the window's domain): a BIND_MW work request on
/// `qp` with the window's next key (`ibv_inc_rkey`), which the window takes
/// at once, as the program reads it after the call.
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut sys::ibv_qp,
    mw: *mut sys::ibv_mw,
    bind: *mut sys::ibv_mw_bind,
) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's pointers.
        let (q, m) = unsafe { (Qp::from_c(qp)?, Mw::from_c(mw)?) };
        // SAFETY: as above; null is refused.
        let b = unsafe { bind.as_ref() }.ok_or(libc::EINVAL)?;
        if m.mw.kind() != MwType::One {
            return Err(libc::EINVAL);
        }
        let (signaled, _, _) = crate::qp::flags(q, b.send_flags);
        // SAFETY: `mw` is checked; `bind_info.mr` is the program's.
        unsafe { crate::qp::bind(q, b.wr_id, mw, m.mw.next_rkey(), &b.bind_info, signaled) }
    })
}
