//! What a Rust program needs to call the drop-in library as a C program
//! does: the entry points it links against, and RC queue pairs connected on
//! one device. Shared by the integration tests and the `c_abi` fuzz target
//! (`fuzz/fuzz_targets/c_abi.rs` includes this file).

#![allow(dead_code)]

use std::ffi::c_int;

use ibverbs::sys;

extern "C" {
    pub fn ibv_get_device_list(n: *mut c_int) -> *mut *mut sys::ibv_device;
    pub fn ibv_free_device_list(l: *mut *mut sys::ibv_device);
    pub fn ibv_open_device(d: *mut sys::ibv_device) -> *mut sys::ibv_context;
    pub fn ibv_alloc_pd(c: *mut sys::ibv_context) -> *mut sys::ibv_pd;
    pub fn ibv_create_cq(
        c: *mut sys::ibv_context,
        cqe: c_int,
        ctx: *mut std::ffi::c_void,
        ch: *mut sys::ibv_comp_channel,
        v: c_int,
    ) -> *mut sys::ibv_cq;
    pub fn ibv_reg_mr(
        pd: *mut sys::ibv_pd,
        addr: *mut std::ffi::c_void,
        len: usize,
        access: c_int,
    ) -> *mut sys::ibv_mr;
    pub fn ibv_create_qp(pd: *mut sys::ibv_pd, a: *mut sys::ibv_qp_init_attr) -> *mut sys::ibv_qp;
    pub fn ibv_destroy_qp(qp: *mut sys::ibv_qp) -> c_int;
    pub fn ibv_qp_to_qp_ex(qp: *mut sys::ibv_qp) -> *mut sys::ibv_qp_ex;
    pub fn ibv_modify_qp(qp: *mut sys::ibv_qp, a: *mut sys::ibv_qp_attr, mask: c_int) -> c_int;
    pub fn ibv_query_qp(
        qp: *mut sys::ibv_qp,
        a: *mut sys::ibv_qp_attr,
        mask: c_int,
        init: *mut sys::ibv_qp_init_attr,
    ) -> c_int;
    pub fn ibv_query_gid(
        c: *mut sys::ibv_context,
        port: u8,
        i: c_int,
        g: *mut sys::ibv_gid,
    ) -> c_int;
}

/// A queue pair of `qp_type` with `caps`, both queues completing into `cq`
/// (null if the library refused).
///
/// # Safety
/// `pd` and `cq` must be the library's, of one context.
pub unsafe fn create_qp(
    pd: *mut sys::ibv_pd,
    cq: *mut sys::ibv_cq,
    caps: sys::ibv_qp_cap,
    qp_type: u32,
) -> *mut sys::ibv_qp {
    // SAFETY: plain data.
    let mut ia: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = qp_type;
    ia.cap = caps;
    // SAFETY: the caller's objects.
    unsafe { ibv_create_qp(pd, &mut ia) }
}

/// How a connected queue pair behaves.
#[derive(Clone, Copy)]
pub struct Connect {
    /// What the peer may do to this QP's regions (IBV_ACCESS_*).
    pub access: u32,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Retries after a timeout, and after an RNR NAK.
    pub retry: u8,
}

/// Move `qp` through INIT, RTR and RTS to QP `dest` on the port whose GID
/// is `gid`; whether each step succeeded.
///
/// # Safety
/// `qp` must be the library's.
pub unsafe fn connect(qp: *mut sys::ibv_qp, dest: u32, gid: sys::ibv_gid, how: Connect) -> bool {
    // SAFETY: plain data, and the caller's QP.
    unsafe {
        let mut a: sys::ibv_qp_attr = std::mem::zeroed();
        a.qp_state = sys::IBV_QPS_INIT;
        a.port_num = 1;
        a.qp_access_flags = how.access;
        let m = sys::IBV_QP_STATE
            | sys::IBV_QP_PKEY_INDEX
            | sys::IBV_QP_PORT
            | sys::IBV_QP_ACCESS_FLAGS;
        if ibv_modify_qp(qp, &mut a, m as c_int) != 0 {
            return false;
        }
        a.qp_state = sys::IBV_QPS_RTR;
        a.path_mtu = sys::IBV_MTU_1024;
        a.dest_qp_num = dest;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 1;
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = 1;
        a.ah_attr.grh.dgid = gid;
        a.ah_attr.grh.hop_limit = 64;
        let m = sys::IBV_QP_STATE
            | sys::IBV_QP_AV
            | sys::IBV_QP_PATH_MTU
            | sys::IBV_QP_DEST_QPN
            | sys::IBV_QP_RQ_PSN
            | sys::IBV_QP_MAX_DEST_RD_ATOMIC
            | sys::IBV_QP_MIN_RNR_TIMER;
        if ibv_modify_qp(qp, &mut a, m as c_int) != 0 {
            return false;
        }
        a.qp_state = sys::IBV_QPS_RTS;
        a.timeout = how.timeout;
        a.retry_cnt = how.retry;
        a.rnr_retry = how.retry;
        a.max_rd_atomic = 1;
        let m = sys::IBV_QP_STATE
            | sys::IBV_QP_TIMEOUT
            | sys::IBV_QP_RETRY_CNT
            | sys::IBV_QP_RNR_RETRY
            | sys::IBV_QP_SQ_PSN
            | sys::IBV_QP_MAX_QP_RD_ATOMIC;
        ibv_modify_qp(qp, &mut a, m as c_int) == 0
    }
}
