//! Shared receive queues (`ibv_create_srq`, `ibv_post_srq_recv`).

use std::ffi::c_int;

use rnic_verbs::SharedReceiveQueue;

use crate::ffi::{self, object, Object};
use crate::pd::{next_handle, Pd};
use crate::sys;

#[repr(C)]
pub(crate) struct Srq {
    c: sys::ibv_srq,
    magic: u64,
    pub srq: SharedReceiveQueue,
    attr: parking_lot::Mutex<sys::ibv_srq_attr>,
    ctx: *mut sys::ibv_context,
}
object!(Srq, sys::ibv_srq, b"rnic-srq");

// SAFETY: the C part is written only at creation; the rest is Sync.
unsafe impl Sync for Srq {}
// SAFETY: as above.
unsafe impl Send for Srq {}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_srq_init_attr,
) -> *mut sys::ibv_srq {
    ffi::ptr_call(|| {
        // SAFETY: the program's pointers.
        let (p, a) = unsafe { (Pd::from_c(pd)?, ffi::out(attr)?) };
        let d = rnic_verbs::DEVICE_ATTR;
        if a.attr.max_wr == 0 || a.attr.max_wr > d.max_qp_wr || a.attr.max_sge > d.max_sge {
            return Err(libc::EINVAL);
        }
        let srq =
            p.pd.create_srq(a.attr.max_wr, a.attr.max_sge.max(1))
                .map_err(|e| ffi::errno_of(&e))?;
        if a.attr.srq_limit > 0 {
            srq.arm(a.attr.srq_limit).map_err(|e| ffi::errno_of(&e))?;
        }
        let id = srq.id();
        let ptr = Srq {
            c: sys::ibv_srq {
                context: p.ctx,
                srq_context: a.srq_context,
                pd,
                handle: next_handle(),
                // SAFETY: an all-zero pthread mutex and condition variable are
                // their static initialisers on glibc.
                mutex: unsafe { std::mem::zeroed() },
                // SAFETY: as above.
                cond: unsafe { std::mem::zeroed() },
                events_completed: 0,
            },
            magic: Srq::MAGIC,
            srq,
            attr: parking_lot::Mutex::new(a.attr),
            ctx: p.ctx,
        }
        .into_c();
        p.context().objects.lock().srqs.insert(id, ptr as usize);
        Ok(ptr)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut sys::ibv_srq,
    attr: *mut sys::ibv_srq_attr,
    mask: c_int,
) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's pointers.
        let (s, a) = unsafe { (Srq::from_c(srq)?, ffi::input(attr)?) };
        let mask = mask as u32;
        if mask & sys::IBV_SRQ_MAX_WR != 0 {
            // Resizing is not offered (no IBV_DEVICE_SRQ_RESIZE).
            return Err(libc::EINVAL);
        }
        if mask & sys::IBV_SRQ_LIMIT != 0 {
            s.srq.arm(a.srq_limit).map_err(|e| ffi::errno_of(&e))?;
            s.attr.lock().srq_limit = a.srq_limit;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(
    srq: *mut sys::ibv_srq,
    attr: *mut sys::ibv_srq_attr,
) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's pointers.
        let (s, a) = unsafe { (Srq::from_c(srq)?, ffi::out(attr)?) };
        *a = *s.attr.lock();
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut sys::ibv_srq) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's pointer.
        let s = unsafe { Srq::from_c(srq)? };
        // EBUSY while queue pairs use it, as rdma-core.
        s.srq.destroy_now().map_err(|e| ffi::errno_of(&e))?;
        // SAFETY: the context outlives its objects.
        if let Ok(c) = unsafe { crate::device::Context::from_c(s.ctx) } {
            c.objects.lock().srqs.remove(&s.srq.id());
        }
        // SAFETY: checked above.
        unsafe { ffi::free::<Srq>(srq) };
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut sys::ibv_srq,
    wr: *mut sys::ibv_recv_wr,
    bad_wr: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    // SAFETY: the program's SRQ and list of work requests.
    unsafe {
        ffi::post_list(Srq::from_c(srq), wr, bad_wr, |s, w| {
            s.srq
                .post_recv(crate::qp::recv_wr(w)?)
                .map_err(|e| ffi::errno_of(&e))
        })
    }
}
