//! Protection domains (`ibv_alloc_pd`).

use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, Ordering};

use rnic_verbs::ProtectionDomain;

use crate::device::Context;
use crate::ffi::{self, object, Object};
use crate::sys;

#[repr(C)]
pub(crate) struct Pd {
    c: sys::ibv_pd,
    magic: u64,
    pub pd: ProtectionDomain,
    /// The context's address, for the objects made in this domain.
    pub ctx: *mut sys::ibv_context,
}
object!(Pd, sys::ibv_pd, b"rnic-pd\0");

/// Handles for the C structs' `handle` fields: unique per process.
pub(crate) fn next_handle() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Pd {
    /// The context this domain belongs to.
    pub fn context(&self) -> &Context {
        // SAFETY: the context outlives its objects (a program that closes
        // a device before destroying what it made breaks verbs' rules).
        unsafe { Context::from_c(self.ctx) }.expect("a domain's context is alive")
    }
    /// The pointer the program knows it by.
    pub fn as_c(&self) -> *mut sys::ibv_pd {
        (&self.c as *const sys::ibv_pd).cast_mut()
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut sys::ibv_context) -> *mut sys::ibv_pd {
    ffi::ptr_call(|| {
        // SAFETY: the program's context.
        let c = unsafe { Context::from_c(ctx)? };
        let pd = c.nic.alloc_pd().map_err(|e| ffi::errno_of(&e))?;
        Ok(Pd {
            c: sys::ibv_pd {
                context: c.as_c(),
                handle: next_handle(),
            },
            magic: Pd::MAGIC,
            pd,
            ctx: c.as_c(),
        }
        .into_c())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut sys::ibv_pd) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's pointer.
        let p = unsafe { Pd::from_c(pd)? };
        p.pd.dealloc().map_err(|e| ffi::errno_of(&e))?;
        // SAFETY: checked above.
        unsafe { ffi::free::<Pd>(pd) };
        Ok(())
    })
}
