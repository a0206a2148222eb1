//! Asynchronous events (`ibv_get_async_event`): the context's `async_fd` is
//! readable while one waits, and the call blocks unless the program made it
//! non-blocking.

use std::ffi::c_int;

use rnic_verbs::AsyncEvent;

use crate::device::Context;
use crate::ffi::{self, Object};
use crate::sys;

#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    ctx: *mut sys::ibv_context,
    event: *mut sys::ibv_async_event,
) -> c_int {
    ffi::minus_one_call(|| {
        // SAFETY: the program's pointers.
        let (c, out) = unsafe { (Context::from_c(ctx)?, ffi::out(event)?) };
        loop {
            // A read(2) of async_fd, as rdma-core's is: blocking unless the
            // program set O_NONBLOCK, ended by a signal without SA_RESTART.
            let e = match c.events.read_event() {
                Ok(e) => e,
                Err(rnic_verbs::Error::Timeout) => return Err(libc::EAGAIN),
                Err(e) => return Err(ffi::errno_of(&e)),
            };
            let objects = c.objects.lock();
            // An event for an object already destroyed is dropped.
            let (kind, element) = match e {
                AsyncEvent::SrqLimitReached(h) => match objects.srqs.get(&h.0) {
                    Some(&p) => (
                        sys::IBV_EVENT_SRQ_LIMIT_REACHED,
                        sys::ibv_async_event__bindgen_ty_1 { srq: p as *mut _ },
                    ),
                    None => continue,
                },
                AsyncEvent::SqDrained(qpn) => match objects.qps.get(&qpn) {
                    Some(&p) => (
                        sys::IBV_EVENT_SQ_DRAINED,
                        sys::ibv_async_event__bindgen_ty_1 { qp: p as *mut _ },
                    ),
                    None => continue,
                },
                AsyncEvent::QpFatal(qpn) => match objects.qps.get(&qpn) {
                    Some(&p) => (
                        sys::IBV_EVENT_QP_FATAL,
                        sys::ibv_async_event__bindgen_ty_1 { qp: p as *mut _ },
                    ),
                    None => continue,
                },
                AsyncEvent::CqError(h) => match objects.cqs.get(&h.0) {
                    Some(&p) => (
                        sys::IBV_EVENT_CQ_ERR,
                        sys::ibv_async_event__bindgen_ty_1 { cq: p as *mut _ },
                    ),
                    None => continue,
                },
            };
            out.event_type = kind;
            out.element = element;
            return Ok(0);
        }
    })
}

/// Events need no acknowledgement in rnic: destroying an object does not
/// wait for its events.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(_event: *mut sys::ibv_async_event) {}
