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
    /// The device memory a region registered by `ibv_reg_dm_mr` lies in,
    /// kept while the region is.
    dm: Option<std::sync::Arc<rnic_verbs::DmaBuf>>,
}
object!(Mr, sys::ibv_mr, b"rnic-mr\0");

impl Mr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.c.lkey
    }

    /// Hand `mr`, registered in `pd` over `length` bytes the program knows
    /// at `addr`, to the program (`dm`: the device memory it lies in).
    pub fn hand_out(
        pd: &Pd,
        mr: MemoryRegion,
        addr: *mut c_void,
        length: usize,
        dm: Option<std::sync::Arc<rnic_verbs::DmaBuf>>,
    ) -> *mut sys::ibv_mr {
        let c = sys::ibv_mr {
            context: pd.ctx,
            pd: pd.as_c(),
            addr,
            length,
            handle: next_handle(),
            lkey: mr.lkey(),
            rkey: mr.rkey(),
        };
        Mr {
            c,
            magic: Mr::MAGIC,
            mr: Mutex::new(mr),
            dm,
        }
        .into_c()
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
    Ok(Mr::hand_out(pd, mr, addr, length, None))
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

/// `ibv_rereg_mr`: change a region in place, keeping its keys (as
/// rdma_rxe keeps them). Returns 0, or with errno set
/// IBV_REREG_MR_ERR_INPUT for arguments rdma-core refuses before asking
/// the device, IBV_REREG_MR_ERR_CMD for what the device refuses (a domain
/// or rights it does not take, windows bound: then nothing changed). A new
/// translation covers `length` bytes at `addr`, at I/O virtual address
/// `addr`; rnic never pins, so there is no fork protection to move.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut sys::ibv_mr,
    flags: c_int,
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let result = ffi::errno_call(|| {
        // SAFETY: the program's arguments, each checked here.
        match unsafe { rereg(mr, flags, pd, addr, length, access) } {
            Ok(()) => Ok(()),
            Err((code, errno)) => {
                ffi::set_errno(errno);
                Err(code)
            }
        }
    });
    if result == libc::EIO {
        // A panic caught at the boundary: errno is EIO already.
        return sys::IBV_REREG_MR_ERR_CMD;
    }
    result
}

type ReregError = (c_int, i32);

unsafe fn rereg(
    mr: *mut sys::ibv_mr,
    flags: c_int,
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> Result<(), ReregError> {
    let input = |e| Err((sys::IBV_REREG_MR_ERR_INPUT, e));
    let flags = flags as u32;
    if flags & !sys::IBV_REREG_MR_FLAGS_SUPPORTED != 0 {
        return input(libc::EINVAL);
    }
    let translation = flags & sys::IBV_REREG_MR_CHANGE_TRANSLATION != 0;
    if translation && (length == 0 || addr.is_null()) {
        return input(libc::EINVAL);
    }
    if access != 0 && flags & sys::IBV_REREG_MR_CHANGE_ACCESS == 0 {
        return input(libc::EINVAL);
    }
    let cmd = |e| (sys::IBV_REREG_MR_ERR_CMD, e);
    // SAFETY: the program's pointers.
    let m = unsafe { Mr::from_c(mr) }.map_err(|e| (sys::IBV_REREG_MR_ERR_INPUT, e))?;
    let new_pd = if flags & sys::IBV_REREG_MR_CHANGE_PD != 0 {
        // SAFETY: as above.
        Some(unsafe { Pd::from_c(pd) }.map_err(cmd)?)
    } else {
        None
    };
    let new_access = if flags & sys::IBV_REREG_MR_CHANGE_ACCESS != 0 {
        Some(access_of(access as u32).map_err(cmd)?)
    } else {
        None
    };
    let memory = if translation {
        if (addr as usize).checked_add(length).is_none() {
            return Err(cmd(libc::EINVAL));
        }
        let ptr = NonNull::new(addr.cast::<u8>()).ok_or(cmd(libc::EFAULT))?;
        Some((ptr, length, addr as u64))
    } else {
        None
    };
    // SAFETY: verbs' contract, as for ibv_reg_mr: the program keeps the new
    // memory mapped until ibv_dereg_mr or the next ibv_rereg_mr.
    unsafe {
        m.mr.lock()
            .rereg_foreign(new_pd.map(|p| &p.pd), new_access, memory)
    }
    .map_err(|e| cmd(ffi::errno_of(&e)))?;
    // The program reads these fields itself: they follow the change.
    // SAFETY: `mr` was checked to be one of ours above.
    unsafe {
        if let Some(p) = new_pd {
            (*mr).pd = p.as_c();
        }
        if translation {
            (*mr).addr = addr;
            (*mr).length = length;
        }
    }
    Ok(())
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
