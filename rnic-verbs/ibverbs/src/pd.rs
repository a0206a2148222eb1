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
    /// Hand `pd`, made on context `c`, to the program.
    fn hand_out(c: &Context, pd: ProtectionDomain) -> *mut sys::ibv_pd {
        Pd {
            c: sys::ibv_pd {
                context: c.as_c(),
                handle: next_handle(),
            },
            magic: Pd::MAGIC,
            pd,
            ctx: c.as_c(),
        }
        .into_c()
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
        Ok(Pd::hand_out(c, pd))
    })
}

/// `ibv_alloc_parent_domain`: a domain over `attr.pd` for the objects made
/// in it. rnic's queues live in its own memory, never in the program's, so
/// the allocators a program may give (IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS)
/// have nothing to allocate and are not called, as with a provider whose
/// queues the hardware keeps; thread domains do not exist here (`td` must
/// be null).
pub(crate) unsafe extern "C" fn alloc_parent_domain(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_parent_domain_init_attr,
) -> *mut sys::ibv_pd {
    ffi::ptr_call(|| {
        // SAFETY: the program's pointers.
        let (c, a) = unsafe { (Context::from_c(ctx)?, ffi::input(attr)?) };
        let known = sys::IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS
            | sys::IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
        if a.comp_mask & !known != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        if !a.td.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program's pointer.
        let inner = unsafe { Pd::from_c(a.pd)? };
        if inner.ctx != c.as_c() || inner.pd.is_parent() {
            return Err(libc::EINVAL);
        }
        let pd = inner.pd.parent_domain().map_err(|e| ffi::errno_of(&e))?;
        Ok(Pd::hand_out(c, pd))
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
