//! The function tables programs call through, in one place: the context's
//! `ops` (the data path verbs.h inlines), the extended `verbs_context`
//! entries, and each QP's `ibv_qp_ex` builder.

use crate::{cq, device, dm, mr, mw, pd, qp, srq, sys};

/// Fill a fresh context: `ops`, the extended entries, and the marks that
/// tell verbs.h this is an extended context of our size.
pub(crate) fn fill(v: &mut sys::verbs_context) {
    let ops = &mut v.context.ops;
    ops.poll_cq = Some(cq::poll_cq);
    ops.req_notify_cq = Some(cq::req_notify_cq);
    ops.post_send = Some(qp::post_send);
    ops.post_recv = Some(qp::post_recv);
    ops.post_srq_recv = Some(srq::post_srq_recv);
    ops.alloc_mw = Some(mw::alloc_mw);
    ops.dealloc_mw = Some(mw::dealloc_mw);
    ops.bind_mw = Some(mw::bind_mw);

    v.query_port = Some(device::query_port);
    v.query_device_ex = Some(device::query_device_ex);
    v.query_rt_values = Some(device::query_rt_values);
    v.advise_mr = Some(mr::advise_mr);
    v.create_qp_ex = Some(qp::create_qp_ex);
    v.create_cq_ex = Some(cq::create_cq_ex);
    v.open_xrcd = Some(device::open_xrcd);
    v.alloc_parent_domain = Some(pd::alloc_parent_domain);
    v.alloc_dm = Some(dm::alloc_dm);
    v.free_dm = Some(dm::free_dm);
    v.reg_dm_mr = Some(dm::reg_dm_mr);
    v.sz = std::mem::size_of::<sys::verbs_context>();
    // __VERBS_ABI_IS_EXTENDED: verbs_get_ctx() then finds `v` before the context.
    v.context.abi_compat = usize::MAX as *mut std::ffi::c_void;
}

/// Fill a QP's `ibv_wr_*` entries.
pub(crate) fn fill_qp_ex(x: &mut sys::ibv_qp_ex) {
    x.wr_start = Some(qp::wr_start);
    x.wr_complete = Some(qp::wr_complete);
    x.wr_abort = Some(qp::wr_abort);
    x.wr_send = Some(qp::wr_send);
    x.wr_send_imm = Some(qp::wr_send_imm);
    x.wr_send_inv = Some(qp::wr_send_inv);
    x.wr_rdma_write = Some(qp::wr_rdma_write);
    x.wr_rdma_write_imm = Some(qp::wr_rdma_write_imm);
    x.wr_rdma_read = Some(qp::wr_rdma_read);
    x.wr_atomic_cmp_swp = Some(qp::wr_atomic_cmp_swp);
    x.wr_atomic_fetch_add = Some(qp::wr_atomic_fetch_add);
    x.wr_atomic_write = Some(qp::wr_atomic_write);
    x.wr_local_inv = Some(qp::wr_local_inv);
    x.wr_bind_mw = Some(qp::wr_bind_mw);
    x.wr_set_sge = Some(qp::wr_set_sge);
    x.wr_set_sge_list = Some(qp::wr_set_sge_list);
    x.wr_set_inline_data = Some(qp::wr_set_inline_data);
    x.wr_set_inline_data_list = Some(qp::wr_set_inline_data_list);
    x.wr_set_ud_addr = Some(qp::wr_set_ud_addr);
}
