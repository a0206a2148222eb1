//! Device memory (`ibv_alloc_dm`): memory of the NIC's own, which the
//! program never maps. It reaches it only by copying (`ibv_memcpy_to_dm`,
//! `ibv_memcpy_from_dm`, 4-byte aligned, as mlx5's MEMIC), and work
//! requests reach it through a zero-based region (`ibv_reg_dm_mr` with
//! IBV_ACCESS_ZERO_BASED: addresses are offsets into the registered part).
//! On a hardware NIC it saves the PCIe round trip to host memory; in rnic
//! it is host memory all the same, kept out of the program's address space,
//! so a program written for it runs unchanged. A device has
//! [`MAX_DM_SIZE`] bytes of it.

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rnic_verbs::DmaBuf;

use crate::device::Context;
use crate::ffi::{self, object, Object};
use crate::mr::{access_of, Mr};
use crate::pd::{next_handle, Pd};
use crate::sys;

/// Device memory per device (what `max_dm_size` reports): 256 KiB, as a
/// ConnectX-5's MEMIC.
pub(crate) const MAX_DM_SIZE: usize = 256 << 10;

/// The largest alignment `log_align_req` may ask for: a page.
const MAX_LOG_ALIGN: u32 = 12;

#[repr(C)]
pub(crate) struct Dm {
    c: sys::ibv_dm,
    magic: u64,
    buf: Arc<DmaBuf>,
    /// The device's count of allocated bytes, given back when freed.
    used: Arc<AtomicUsize>,
}
object!(Dm, sys::ibv_dm, b"rnic-dm\0");

/// Take `len` bytes of the `MAX_DM_SIZE` `used` counts, if there are.
fn reserve(used: &AtomicUsize, len: usize) -> bool {
    used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
        u.checked_add(len).filter(|&t| t <= MAX_DM_SIZE)
    })
    .is_ok()
}

/// `ibv_alloc_dm`. Allowed in a forked child on its parent's context too:
/// device memory needs nothing of the parent's engine (pyverbs' tests
/// allocate it from child processes).
pub(crate) unsafe extern "C" fn alloc_dm(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_alloc_dm_attr,
) -> *mut sys::ibv_dm {
    ffi::ptr_call(|| {
        // SAFETY: the program's pointers.
        let c = unsafe { ffi::obj_inherited::<Context>(ctx) }.ok_or(libc::EINVAL)?;
        // SAFETY: as above.
        let a = unsafe { ffi::input(attr)? };
        if a.comp_mask != 0 || a.length == 0 || a.log_align_req > MAX_LOG_ALIGN {
            return Err(libc::EINVAL);
        }
        if !reserve(&c.dm_used, a.length) {
            return Err(libc::ENOMEM);
        }
        Ok(Dm {
            c: sys::ibv_dm {
                context: ctx,
                memcpy_to_dm: Some(memcpy_to_dm),
                memcpy_from_dm: Some(memcpy_from_dm),
                comp_mask: 0,
                handle: next_handle(),
            },
            magic: Dm::MAGIC,
            buf: Arc::new(DmaBuf::zeroed(a.length)),
            used: c.dm_used.clone(),
        }
        .into_c())
    })
}

/// `ibv_free_dm`: EBUSY while a region is registered in it.
pub(crate) unsafe extern "C" fn free_dm(dm: *mut sys::ibv_dm) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's pointer.
        let d = unsafe { Dm::from_c(dm)? };
        if Arc::strong_count(&d.buf) > 1 {
            return Err(libc::EBUSY);
        }
        d.used.fetch_sub(d.buf.len(), Ordering::AcqRel);
        // SAFETY: checked above; the program gives up the pointer.
        unsafe { ffi::free::<Dm>(dm) };
        Ok(())
    })
}

/// A copy between `dm` at `offset` and the program's `length` bytes at
/// `host`: `copy` gets the device memory, the offset in it and the host
/// address, once both are checked (4-byte aligned offset and length, as
/// mlx5 requires, inside the device memory; a non-null host address unless
/// there is nothing to copy).
///
/// # Safety
/// `dm` must be null or the program's pointer.
unsafe fn copy(
    dm: *mut sys::ibv_dm,
    offset: u64,
    host: *mut c_void,
    length: usize,
    copy: impl FnOnce(&DmaBuf, usize, NonNull<u8>) -> bool,
) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the caller's promise.
        let d = unsafe { Dm::from_c(dm)? };
        let offset = usize::try_from(offset).map_err(|_| libc::EINVAL)?;
        let fits = offset
            .checked_add(length)
            .is_some_and(|end| end <= d.buf.len());
        if offset % 4 != 0 || length % 4 != 0 || !fits {
            return Err(libc::EINVAL);
        }
        if length == 0 {
            return Ok(());
        }
        let host = NonNull::new(host.cast::<u8>()).ok_or(libc::EFAULT)?;
        copy(&d.buf, offset, host).then_some(()).ok_or(libc::EINVAL)
    })
}

unsafe extern "C" fn memcpy_to_dm(
    dm: *mut sys::ibv_dm,
    dm_offset: u64,
    host_addr: *const c_void,
    length: usize,
) -> c_int {
    // SAFETY: the program's pointer.
    unsafe {
        copy(
            dm,
            dm_offset,
            host_addr.cast_mut(),
            length,
            |buf, at, src| {
                // SAFETY: verbs' contract: `length` readable bytes at `host_addr`.
                buf.write(at, std::slice::from_raw_parts(src.as_ptr(), length))
            },
        )
    }
}

unsafe extern "C" fn memcpy_from_dm(
    host_addr: *mut c_void,
    dm: *mut sys::ibv_dm,
    dm_offset: u64,
    length: usize,
) -> c_int {
    // SAFETY: the program's pointer.
    unsafe {
        copy(dm, dm_offset, host_addr, length, |buf, at, dst| {
            // SAFETY: verbs' contract: `length` writable bytes at `host_addr`.
            buf.read(at, std::slice::from_raw_parts_mut(dst.as_ptr(), length))
        })
    }
}

/// `ibv_reg_dm_mr`: `length` bytes of `dm` from `dm_offset`, zero-based
/// (the access must say IBV_ACCESS_ZERO_BASED): work requests address them
/// from 0.
pub(crate) unsafe extern "C" fn reg_dm_mr(
    pd: *mut sys::ibv_pd,
    dm: *mut sys::ibv_dm,
    dm_offset: u64,
    length: usize,
    access: u32,
) -> *mut sys::ibv_mr {
    ffi::ptr_call(|| {
        // SAFETY: the program's pointers.
        let (p, d) = unsafe { (Pd::from_c(pd)?, Dm::from_c(dm)?) };
        if access & sys::IBV_ACCESS_ZERO_BASED == 0 || d.c.context != p.ctx {
            return Err(libc::EINVAL);
        }
        let access = access_of(access & !sys::IBV_ACCESS_ZERO_BASED)?;
        let fits = usize::try_from(dm_offset)
            .ok()
            .and_then(|o| o.checked_add(length))
            .is_some_and(|end| end <= d.buf.len());
        if !fits {
            return Err(libc::EINVAL);
        }
        let start = d.buf.addr() + dm_offset;
        let ptr = NonNull::new(start as *mut u8).ok_or(libc::EINVAL)?;
        // SAFETY: the range lies inside `d.buf`, which the region keeps
        // alive (`Mr::dm`), and free_dm refuses while it does.
        let mr = unsafe { p.pd.register_foreign(ptr, length, 0, access) }
            .map_err(|e| ffi::errno_of(&e))?;
        Ok(Mr::hand_out(
            p,
            mr,
            dm_offset as usize as *mut c_void,
            length,
            Some(d.buf.clone()),
        ))
    })
}
