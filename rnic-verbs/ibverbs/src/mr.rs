//! Memory regions: `ibv_reg_mr` registers the program's own memory, in
//! place. How rnic shares it with the program (the DMA contract, and what it
//! means for Rust's memory model) is said once, at `DmaBuf::foreign` in
//! rnic-verbs' `memory` module.

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;

use parking_lot::Mutex;
use rnic_verbs::{Access, MemoryRegion};

use crate::ffi::{self, object, Object};
use crate::pd::{next_handle, Pd};
use crate::sys;

#[repr(C)]
pub(crate) struct Mr {
    c: sys::ibv_mr,
    magic: u64,
    pub mr: Mutex<MemoryRegion>,
}
object!(Mr, sys::ibv_mr, b"rnic-mr\0");

impl Mr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.c.lkey
    }
}

/// Access flags from 0 up to IBV_ACCESS_OPTIONAL_FIRST must be understood;
/// optional ones above it (relaxed ordering) may be ignored, as verbs allows.
const OPTIONAL_FIRST: u32 = 1 << 20;

pub(crate) fn access_of(flags: u32) -> Result<Access, i32> {
    // IBV_ACCESS_ON_DEMAND asks for what rnic always does (it never pins).
    let required = flags & (OPTIONAL_FIRST - 1) & !sys::IBV_ACCESS_ON_DEMAND;
    Access::from_bits(required).ok_or(libc::EOPNOTSUPP)
}

unsafe fn reg(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> Result<*mut sys::ibv_mr, i32> {
    // SAFETY: the program's pointer.
    let pd = unsafe { Pd::from_c(pd)? };
    let access = access_of(access)?;
    if (addr as usize).checked_add(length).is_none() || iova.checked_add(length as u64).is_none() {
        return Err(libc::EINVAL);
    }
    if addr.is_null() && length != 0 {
        return Err(libc::EFAULT);
    }
    let ptr = NonNull::new(addr.cast::<u8>()).unwrap_or(NonNull::dangling());
    // SAFETY: verbs' contract: the program keeps the memory mapped until
    // ibv_dereg_mr, which deregisters before it returns.
    let mr = unsafe { pd.pd.register_foreign(ptr, length, iova, access) }
        .map_err(|e| ffi::errno_of(&e))?;
    let c = sys::ibv_mr {
        context: pd.ctx,
        pd: pd.as_c(),
        addr,
        length,
        handle: next_handle(),
        lkey: mr.lkey(),
        rkey: mr.rkey(),
    };
    Ok(Mr {
        c,
        magic: Mr::MAGIC,
        mr: Mutex::new(mr),
    }
    .into_c())
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut sys::ibv_mr {
    // SAFETY: the program's arguments, checked in `reg`.
    ffi::ptr_call(|| unsafe { reg(pd, addr, length, addr as u64, access as u32) })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut sys::ibv_mr {
    // SAFETY: as above.
    ffi::ptr_call(|| unsafe { reg(pd, addr, length, iova, access as u32) })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut sys::ibv_mr {
    // SAFETY: as above.
    ffi::ptr_call(|| unsafe { reg(pd, addr, length, iova, access) })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut sys::ibv_mr) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's pointer.
        let m = unsafe { Mr::from_c(mr)? };
        // Deregistered first: if windows are still bound it fails and the
        // region stays as it was.
        m.mr.lock().deregister().map_err(|e| ffi::errno_of(&e))?;
        // SAFETY: checked above; the program gives up the pointer.
        unsafe { ffi::free::<Mr>(mr) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    _mr: *mut sys::ibv_mr,
    _flags: c_int,
    _pd: *mut sys::ibv_pd,
    _addr: *mut c_void,
    _length: usize,
    _access: c_int,
) -> c_int {
    crate::unsupported("ibv_rereg_mr");
    libc::EOPNOTSUPP
}

/// IBV_ADVISE_MR_FLAG_FLUSH (ib_user_ioctl_verbs.h; an enum bindgen skips).
const ADVISE_MR_FLAG_FLUSH: u32 = 1;

/// `ibv_advise_mr`: prefetch advice. rnic never pins and never faults, so a
/// prefetch has nothing to do; the advice, flags and every SGE are checked
/// as a provider checks them (EINVAL), so a program's mistake still shows.
pub(crate) unsafe extern "C" fn advise_mr(
    pd: *mut sys::ibv_pd,
    advice: sys::ib_uverbs_advise_mr_advice,
    flags: u32,
    sg_list: *mut sys::ibv_sge,
    num_sges: u32,
) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's pointer.
        let p = unsafe { Pd::from_c(pd)? };
        let write = match advice {
            sys::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH
            | sys::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT => false,
            sys::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE => true,
            _ => return Err(libc::EINVAL),
        };
        if flags & !ADVISE_MR_FLAG_FLUSH != 0 || num_sges == 0 || sg_list.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program's array of `num_sges` entries, checked non-null.
        let sges = unsafe { std::slice::from_raw_parts(sg_list, num_sges as usize) };
        let access = if write {
            Access::LOCAL_WRITE
        } else {
            Access::NONE
        };
        for s in sges {
            p.pd.check_local(s.lkey, s.addr, u64::from(s.length), access)
                .map_err(|_| libc::EINVAL)?;
        }
        Ok(())
    })
}
