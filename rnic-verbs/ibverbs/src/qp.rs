//! Queue pairs: `ibv_create_qp`/`ibv_create_qp_ex`, `ibv_modify_qp`,
//! `ibv_query_qp`, the data path's `ibv_post_send`/`ibv_post_recv`, and the
//! `ibv_wr_*` builder of `struct ibv_qp_ex`.
//!
//! Every QP is made as an `ibv_qp_ex` (whose first field is its `ibv_qp`),
//! so both ways of posting work on any QP.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;

use parking_lot::Mutex;
use rnic_verbs::{
    sg_list, Access, AddressHandle, AddressVector, AttrMask, InlineData, Mtu, QpAttr, QpCaps,
    QpState, QpType, QueuePair, RecvWr, SendOp, SendWr, SgList, Sge, DEVICE_ATTR, MAX_INLINE_DATA,
};

use crate::ah::{dest_of, src_of, Ah};
use crate::cq::Cq;
use crate::device::Context;
use crate::ffi::{self, object, Object};
use crate::mr::Mr;
use crate::mw::Mw;
use crate::pd::{next_handle, Pd};
use crate::srq::Srq;
use crate::sys;

/// A work request being built with `ibv_wr_*`.
struct Pending {
    wr: SendWr,
    /// UD: where it goes (`ibv_wr_set_ud_addr`).
    ud: Option<(AddressHandle, u32, u32)>,
    /// A window bind: the window (its C pointer) and what to bind.
    bind: Option<(usize, u32, sys::ibv_mw_bind_info)>,
    /// An error found while building (inline data too long): the post fails.
    error: Option<i32>,
}

#[repr(C)]
pub(crate) struct Qp {
    /// Read and written by the program (`wr_id`, `wr_flags`, `qp_context`)
    /// and by rnic (`state`).
    c: UnsafeCell<sys::ibv_qp_ex>,
    magic: u64,
    pub qp: QueuePair,
    qp_type: QpType,
    sq_sig_all: bool,
    caps: sys::ibv_qp_cap,
    ctx: *mut sys::ibv_context,
    /// Work requests between `ibv_wr_start` and `ibv_wr_complete`.
    pending: Mutex<Vec<Pending>>,
}
object!(Qp, sys::ibv_qp, b"rnic-qp\0");

// SAFETY: the C part is written by rnic only in modify (state) and read by
// the program; the program serialises its own writes (wr_id, wr_flags) with
// its posts, as verbs requires. The rest is Sync.
unsafe impl Sync for Qp {}
// SAFETY: as above.
unsafe impl Send for Qp {}

impl Qp {
    fn ex(&self) -> *mut sys::ibv_qp_ex {
        self.c.get()
    }
    fn context(&self) -> Result<&Context, i32> {
        // SAFETY: the context outlives its objects.
        unsafe { Context::from_c(self.ctx) }
    }
}

fn qp_type_of(t: sys::ibv_qp_type) -> Result<QpType, i32> {
    match t {
        sys::IBV_QPT_RC => Ok(QpType::Rc),
        sys::IBV_QPT_UC => Ok(QpType::Uc),
        sys::IBV_QPT_UD => Ok(QpType::Ud),
        _ => {
            eprintln!("rnic: QP type {t} is not supported (RC, UC and UD are)");
            Err(libc::EOPNOTSUPP)
        }
    }
}

fn state_of(s: sys::ibv_qp_state) -> Result<QpState, i32> {
    Ok(match s {
        sys::IBV_QPS_RESET => QpState::Reset,
        sys::IBV_QPS_INIT => QpState::Init,
        sys::IBV_QPS_RTR => QpState::Rtr,
        sys::IBV_QPS_RTS => QpState::Rts,
        sys::IBV_QPS_SQD => QpState::Sqd,
        sys::IBV_QPS_SQE => QpState::Sqe,
        sys::IBV_QPS_ERR => QpState::Err,
        _ => return Err(libc::EINVAL),
    })
}

fn c_state(s: QpState) -> sys::ibv_qp_state {
    match s {
        QpState::Reset => sys::IBV_QPS_RESET,
        QpState::Init => sys::IBV_QPS_INIT,
        QpState::Rtr => sys::IBV_QPS_RTR,
        QpState::Rts => sys::IBV_QPS_RTS,
        QpState::Sqd => sys::IBV_QPS_SQD,
        QpState::Sqe => sys::IBV_QPS_SQE,
        QpState::Err => sys::IBV_QPS_ERR,
    }
}

/// What `ibv_create_qp_ex` accepts: a PD, and `ibv_wr_*` send operations
/// that rnic performs.
const SEND_OPS: u64 = (sys::IBV_QP_EX_WITH_RDMA_WRITE
    | sys::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | sys::IBV_QP_EX_WITH_SEND
    | sys::IBV_QP_EX_WITH_SEND_WITH_IMM
    | sys::IBV_QP_EX_WITH_RDMA_READ
    | sys::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | sys::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | sys::IBV_QP_EX_WITH_LOCAL_INV
    | sys::IBV_QP_EX_WITH_BIND_MW
    | sys::IBV_QP_EX_WITH_SEND_WITH_INV
    | sys::IBV_QP_EX_WITH_ATOMIC_WRITE) as u64;

unsafe fn create(
    pd: *mut sys::ibv_pd,
    a: &mut sys::ibv_qp_init_attr_ex,
) -> Result<*mut sys::ibv_qp, i32> {
    // SAFETY: the program's pointers.
    let pd = unsafe { Pd::from_c(pd)? };
    // SAFETY: as above.
    let (scq, rcq) = unsafe { (Cq::from_c(a.send_cq)?, Cq::from_c(a.recv_cq)?) };
    let srq = if a.srq.is_null() {
        None
    } else {
        // SAFETY: as above.
        Some(unsafe { Srq::from_c(a.srq)? })
    };
    let qp_type = qp_type_of(a.qp_type)?;
    let d = DEVICE_ATTR;
    if a.cap.max_inline_data > d.max_inline_data {
        return Err(libc::EINVAL);
    }
    let caps = QpCaps {
        max_send_wr: a.cap.max_send_wr.max(1),
        max_recv_wr: if srq.is_some() {
            1
        } else {
            a.cap.max_recv_wr.max(1)
        },
        max_send_sge: a.cap.max_send_sge.max(1),
        max_recv_sge: a.cap.max_recv_sge.max(1),
    };
    let qp = pd
        .pd
        .create_qp(qp_type, &scq.cq, &rcq.cq, caps, srq.map(|s| &s.srq))
        .map_err(|e| ffi::errno_of(&e))?;
    // What the QP got, reported back as verbs does.
    a.cap.max_inline_data = d.max_inline_data;
    if srq.is_some() {
        a.cap.max_recv_wr = 0;
        a.cap.max_recv_sge = 0;
    }
    // SAFETY: plain data, null pointers and None function pointers.
    let mut ex: sys::ibv_qp_ex = unsafe { std::mem::zeroed() };
    let b = &mut ex.qp_base;
    b.context = pd.ctx;
    b.qp_context = a.qp_context;
    b.pd = pd.as_c();
    b.send_cq = a.send_cq;
    b.recv_cq = a.recv_cq;
    b.srq = a.srq;
    b.handle = next_handle();
    b.qp_num = qp.qpn();
    b.state = sys::IBV_QPS_RESET;
    b.qp_type = a.qp_type;
    crate::ops::fill_qp_ex(&mut ex);
    let qpn = qp.qpn();
    let p = Qp {
        c: UnsafeCell::new(ex),
        magic: Qp::MAGIC,
        qp,
        qp_type,
        sq_sig_all: a.sq_sig_all != 0,
        caps: a.cap,
        ctx: pd.ctx,
        pending: Mutex::new(Vec::new()),
    }
    .into_c();
    pd.context().objects.lock().qps.insert(qpn, p as usize);
    Ok(p)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_qp_init_attr,
) -> *mut sys::ibv_qp {
    ffi::ptr_call(|| {
        // SAFETY: the program's pointer.
        let a = unsafe { ffi::out(attr)? };
        let mut ex = init_attr_ex(a, pd);
        // SAFETY: the program's pd, checked in `create`.
        let p = unsafe { create(pd, &mut ex)? };
        a.cap = ex.cap;
        Ok(p)
    })
}

/// `ibv_qp_init_attr` as the extended attributes, on `pd`.
pub(crate) fn init_attr_ex(
    a: &sys::ibv_qp_init_attr,
    pd: *mut sys::ibv_pd,
) -> sys::ibv_qp_init_attr_ex {
    // SAFETY: plain data.
    let mut ex: sys::ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
    ex.qp_context = a.qp_context;
    ex.send_cq = a.send_cq;
    ex.recv_cq = a.recv_cq;
    ex.srq = a.srq;
    ex.cap = a.cap;
    ex.qp_type = a.qp_type;
    ex.sq_sig_all = a.sq_sig_all;
    ex.pd = pd;
    ex
}

pub(crate) unsafe extern "C" fn create_qp_ex(
    _ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_qp_init_attr_ex,
) -> *mut sys::ibv_qp {
    ffi::ptr_call(|| {
        // SAFETY: the program's pointer.
        let a = unsafe { ffi::out(attr)? };
        // CREATE_FLAGS is understood: every flag in it is refused below.
        let known = sys::IBV_QP_INIT_ATTR_PD
            | sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
            | sys::IBV_QP_INIT_ATTR_CREATE_FLAGS;
        if a.comp_mask & !known != 0 || a.comp_mask & sys::IBV_QP_INIT_ATTR_PD == 0 {
            return Err(libc::EOPNOTSUPP);
        }
        if a.comp_mask & sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0
            && a.send_ops_flags & !SEND_OPS != 0
        {
            return Err(libc::EOPNOTSUPP);
        }
        if a.comp_mask & sys::IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let pd = a.pd;
        // SAFETY: the program's pd, checked in `create`.
        unsafe { create(pd, a) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut sys::ibv_qp) -> *mut sys::ibv_qp_ex {
    // SAFETY: the program's pointer.
    match unsafe { Qp::from_c(qp) } {
        Ok(q) => q.ex(),
        Err(_) => std::ptr::null_mut(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut sys::ibv_qp) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's pointer.
        let q = unsafe { Qp::from_c(qp)? };
        if let Ok(c) = q.context() {
            c.objects.lock().qps.remove(&q.qp.qpn());
        }
        // SAFETY: checked above; dropping the QueuePair destroys the QP.
        unsafe { ffi::free::<Qp>(qp) };
        Ok(())
    })
}

/// An attribute the mask names must be valid (not quietly replaced); one
/// it does not name is not looked at, so `default` stands in for it.
fn masked<T>(mask: AttrMask, bit: AttrMask, value: Option<T>, default: T) -> Result<T, i32> {
    match value {
        Some(v) => Ok(v),
        None if mask.contains(bit) => Err(libc::EINVAL),
        None => Ok(default),
    }
}

fn av_of(ctx: &Context, ah: &sys::ibv_ah_attr) -> Result<AddressVector, i32> {
    Ok(AddressVector {
        dest: dest_of(ctx, ah)?,
        src: src_of(ctx, ah)?,
        traffic_class: ah.grh.traffic_class,
        hop_limit: if ah.is_global != 0 {
            ah.grh.hop_limit
        } else {
            64
        },
        flow_label: ah.grh.flow_label,
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut sys::ibv_qp,
    attr: *mut sys::ibv_qp_attr,
    mask: c_int,
) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's pointers.
        let (q, a) = unsafe { (Qp::from_c(qp)?, ffi::input(attr)?) };
        let mask = AttrMask(mask as u32);
        let r = QpAttr {
            qp_state: masked(
                mask,
                AttrMask::STATE,
                state_of(a.qp_state).ok(),
                QpState::Reset,
            )?,
            cur_qp_state: masked(
                mask,
                AttrMask::CUR_STATE,
                state_of(a.cur_qp_state).ok(),
                QpState::Reset,
            )?,
            en_sqd_async_notify: a.en_sqd_async_notify != 0,
            qp_access_flags: masked(
                mask,
                AttrMask::ACCESS_FLAGS,
                // The QP's remote rights; bits that only mean something to a
                // region (LOCAL_WRITE, ON_DEMAND) are taken as rdma_rxe takes them.
                crate::mr::access_of(a.qp_access_flags).ok(),
                Access::NONE,
            )?,
            pkey_index: a.pkey_index,
            port_num: a.port_num,
            qkey: a.qkey,
            ah_attr: if mask.contains(AttrMask::AV) {
                Some(av_of(q.context()?, &a.ah_attr)?)
            } else {
                None
            },
            path_mtu: masked(
                mask,
                AttrMask::PATH_MTU,
                Mtu::from_ibv(a.path_mtu),
                Mtu::Mtu1024,
            )?,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            rq_psn: a.rq_psn,
            sq_psn: a.sq_psn,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            dest_qp_num: a.dest_qp_num,
        };
        q.qp.modify(&r, mask).map_err(|e| {
            if std::env::var_os("RNIC_LOG").is_some() {
                eprintln!("rnic: ibv_modify_qp on QP {:#x}: {e}", q.qp.qpn());
            }
            ffi::errno_of(&e)
        })?;
        if mask.contains(AttrMask::STATE) {
            // The modify succeeded, so the QP is in the state asked for.
            // SAFETY: rnic's own field of the C part (see `Qp`).
            unsafe { (*q.ex()).qp_base.state = c_state(r.qp_state) };
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut sys::ibv_qp,
    attr: *mut sys::ibv_qp_attr,
    _mask: c_int,
    init_attr: *mut sys::ibv_qp_init_attr,
) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's pointers.
        let (q, out) = unsafe { (Qp::from_c(qp)?, ffi::out(attr)?) };
        let a = q.qp.query().map_err(|e| ffi::errno_of(&e))?;
        *out = c_qp_attr(q.context().ok(), &a);
        out.cap = q.caps;
        if !init_attr.is_null() {
            // SAFETY: the program's pointer, checked non-null.
            let i = unsafe { ffi::out(init_attr)? };
            // SAFETY: rnic's C part, read.
            let base = unsafe { &(*q.ex()).qp_base };
            i.qp_context = base.qp_context;
            i.send_cq = base.send_cq;
            i.recv_cq = base.recv_cq;
            i.srq = base.srq;
            i.cap = q.caps;
            i.qp_type = base.qp_type;
            i.sq_sig_all = c_int::from(q.sq_sig_all);
        }
        Ok(())
    })
}

/// `a` as `struct ibv_qp_attr` (what `ibv_query_qp` and rdma_cm's
/// `rdma_init_qp_attr` hand out), the source GID named by its index in
/// `ctx`'s table.
pub(crate) fn c_qp_attr(ctx: Option<&Context>, a: &QpAttr) -> sys::ibv_qp_attr {
    // SAFETY: plain data.
    let mut out: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
    out.qp_state = c_state(a.qp_state);
    out.cur_qp_state = c_state(a.qp_state);
    out.path_mtu = a.path_mtu as u32 + 1;
    out.qkey = a.qkey;
    out.rq_psn = a.rq_psn;
    out.sq_psn = a.sq_psn;
    out.dest_qp_num = a.dest_qp_num;
    out.qp_access_flags = a.qp_access_flags.bits();
    if let Some(av) = a.ah_attr {
        out.ah_attr = c_ah_attr(ctx, &av);
    }
    out.pkey_index = a.pkey_index;
    out.en_sqd_async_notify = u8::from(a.en_sqd_async_notify);
    out.max_rd_atomic = a.max_rd_atomic;
    out.max_dest_rd_atomic = a.max_dest_rd_atomic;
    out.min_rnr_timer = a.min_rnr_timer;
    out.port_num = a.port_num;
    out.timeout = a.timeout;
    out.retry_cnt = a.retry_cnt;
    out.rnr_retry = a.rnr_retry;
    out
}

/// An address vector as `struct ibv_ah_attr`: global, port 1, the source
/// GID by its index in `ctx`'s table.
pub(crate) fn c_ah_attr(ctx: Option<&Context>, av: &AddressVector) -> sys::ibv_ah_attr {
    // SAFETY: plain data.
    let mut out: sys::ibv_ah_attr = unsafe { std::mem::zeroed() };
    out.is_global = 1;
    out.port_num = 1;
    out.grh.dgid.raw = rnic_verbs::gid_of(av.dest).octets();
    if let (Some(src), Some(ctx)) = (av.src, ctx) {
        let index = ctx.nic.gids().iter().position(|&g| g == src);
        out.grh.sgid_index = index.unwrap_or(0) as u8;
    }
    out.grh.hop_limit = av.hop_limit;
    out.grh.traffic_class = av.traffic_class;
    out.grh.flow_label = av.flow_label;
    out
}

// ---- the data path: ibv_post_send, ibv_post_recv ----

/// A work request's scatter/gather list.
///
/// # Safety
/// `sg` must point to `n` entries (or `n` be 0).
unsafe fn sges(sg: *const sys::ibv_sge, n: c_int) -> Result<SgList, i32> {
    if n < 0 || (n > 0 && sg.is_null()) {
        return Err(libc::EINVAL);
    }
    if n == 0 {
        return Ok(SgList::new());
    }
    // SAFETY: the caller's promise.
    let list = unsafe { std::slice::from_raw_parts(sg, n as usize) };
    Ok(list
        .iter()
        .map(|s| Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        })
        .collect())
}

/// IBV_SEND_INLINE: the bytes are taken now, from the program's buffers.
///
/// # Safety
/// Each entry must name readable memory, as verbs requires of inline sends.
unsafe fn inline_bytes(
    list: impl Iterator<Item = (u64, usize)> + Clone,
) -> Result<InlineData, i32> {
    let total = list
        .clone()
        .try_fold(0usize, |t, (_, len)| t.checked_add(len))
        .ok_or(libc::EINVAL)?;
    if total > MAX_INLINE_DATA {
        return Err(libc::EINVAL);
    }
    let mut v = InlineData::new();
    for (addr, len) in list {
        if len == 0 {
            continue;
        }
        if addr == 0 {
            return Err(libc::EFAULT);
        }
        // SAFETY: the caller's promise.
        v.extend_from_slice(unsafe { std::slice::from_raw_parts(addr as *const u8, len) });
    }
    Ok(v)
}

/// Signaled, solicited, fenced: what `send_flags` (and the QP) ask.
pub(crate) fn flags(qp: &Qp, send_flags: u32) -> (bool, bool, bool) {
    (
        qp.sq_sig_all || send_flags & sys::IBV_SEND_SIGNALED != 0,
        send_flags & sys::IBV_SEND_SOLICITED != 0,
        send_flags & sys::IBV_SEND_FENCE != 0,
    )
}

/// One `ibv_send_wr`, posted.
///
/// # Safety
/// `w` must be a valid work request (its lists, AH and MW pointers too).
unsafe fn post_one(q: &Qp, w: &sys::ibv_send_wr) -> Result<(), i32> {
    // SAFETY: the caller's promise.
    let sg_list = unsafe { sges(w.sg_list, w.num_sge)? };
    let (signaled, solicited, fence) = flags(q, w.send_flags);
    // SAFETY: the union member each opcode uses (as verbs defines them).
    let (rdma, atomic, ud, imm) =
        unsafe { (w.wr.rdma, w.wr.atomic, w.wr.ud, w.__bindgen_anon_1.imm_data) };
    let op = match w.opcode {
        sys::IBV_WR_SEND => SendOp::send(),
        sys::IBV_WR_SEND_WITH_IMM => SendOp::send_imm(u32::from_be(imm)),
        // SAFETY: as above.
        sys::IBV_WR_SEND_WITH_INV => SendOp::SendWithInv {
            invalidate_rkey: unsafe { w.__bindgen_anon_1.invalidate_rkey },
        },
        sys::IBV_WR_RDMA_WRITE => SendOp::write(rdma.remote_addr, rdma.rkey),
        sys::IBV_WR_RDMA_WRITE_WITH_IMM => {
            SendOp::write_imm(rdma.remote_addr, rdma.rkey, u32::from_be(imm))
        }
        sys::IBV_WR_RDMA_READ => SendOp::read(rdma.remote_addr, rdma.rkey),
        sys::IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::compare_swap(
            atomic.remote_addr,
            atomic.rkey,
            atomic.compare_add,
            atomic.swap,
        ),
        sys::IBV_WR_ATOMIC_FETCH_AND_ADD => {
            SendOp::fetch_add(atomic.remote_addr, atomic.rkey, atomic.compare_add)
        }
        sys::IBV_WR_ATOMIC_WRITE => {
            // "Atomically write 64 bits from given sg_list" (verbs.h): one
            // 8-byte entry, read when posted, as inline data is.
            let [s] = sg_list.as_slice() else {
                return Err(libc::EINVAL);
            };
            if s.length != 8 {
                return Err(libc::EINVAL);
            }
            // SAFETY: the program's buffer, as verbs requires.
            let bytes = unsafe { inline_bytes(std::iter::once((s.addr, 8)))? };
            let mut data = [0u8; 8];
            data.copy_from_slice(&bytes);
            SendOp::AtomicWrite {
                remote_addr: rdma.remote_addr,
                rkey: rdma.rkey,
                data,
            }
        }
        // SAFETY: as above.
        sys::IBV_WR_LOCAL_INV => SendOp::LocalInv {
            rkey: unsafe { w.__bindgen_anon_1.invalidate_rkey },
        },
        sys::IBV_WR_BIND_MW => {
            // SAFETY: as above.
            let b = unsafe { w.__bindgen_anon_2.bind_mw };
            // SAFETY: the program's window.
            return unsafe { bind(q, w.wr_id, b.mw, b.rkey, &b.bind_info, signaled) };
        }
        _ => return Err(libc::EINVAL),
    };
    let inline = if w.send_flags & sys::IBV_SEND_INLINE != 0 && op.takes_inline() {
        let list = sg_list.iter().map(|s| (s.addr, s.length as usize));
        // SAFETY: the program's buffers, as verbs requires for inline sends.
        Some(unsafe { inline_bytes(list)? })
    } else {
        None
    };
    // ATOMIC WRITE carried its bytes in the request: no local buffer.
    let sg_list = if matches!(op, SendOp::AtomicWrite { .. }) {
        SgList::new()
    } else {
        sg_list
    };
    let wr = SendWr::new(w.wr_id, op, sg_list)
        .signaled(signaled)
        .solicited(solicited)
        .fence(fence)
        .inline(inline);
    let r = if q.qp_type == QpType::Ud {
        // SAFETY: the program's AH.
        let ah = unsafe { Ah::from_c(ud.ah)? };
        q.qp.post_send_ud(wr, &ah.ah, ud.remote_qpn, ud.remote_qkey)
    } else {
        q.qp.post_send(wr)
    };
    r.map_err(|e| ffi::errno_of(&e))
}

/// A window bind (`IBV_WR_BIND_MW`, `ibv_wr_bind_mw`, `ibv_bind_mw`).
///
/// # Safety
/// `mw` and `info.mr` must be null or the program's objects.
pub(crate) unsafe fn bind(
    q: &Qp,
    wr_id: u64,
    mw: *mut sys::ibv_mw,
    rkey: u32,
    info: &sys::ibv_mw_bind_info,
    signaled: bool,
) -> Result<(), i32> {
    // SAFETY: the caller's promise.
    let mw = unsafe { Mw::from_c(mw)? };
    let lkey = if info.mr.is_null() {
        0
    } else {
        // SAFETY: the caller's promise.
        unsafe { Mr::from_c(info.mr)? }.lkey()
    };
    let access = Access::from_bits(info.mw_access_flags).ok_or(libc::EINVAL)?;
    q.qp.post_bind_mw(
        wr_id,
        &mw.mw,
        lkey,
        info.addr,
        info.length,
        access,
        rkey,
        signaled,
    )
    .map_err(|e| ffi::errno_of(&e))?;
    mw.set_rkey(rkey);
    Ok(())
}

pub(crate) unsafe extern "C" fn post_send(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_send_wr,
    bad_wr: *mut *mut sys::ibv_send_wr,
) -> c_int {
    // SAFETY: the program's QP and list of work requests.
    unsafe { ffi::post_list(Qp::from_c(qp), wr, bad_wr, |q, w| post_one(q, w)) }
}

/// A receive work request from C.
///
/// # Safety
/// `w`'s scatter/gather list must hold `num_sge` entries.
pub(crate) unsafe fn recv_wr(w: &sys::ibv_recv_wr) -> Result<RecvWr, i32> {
    Ok(RecvWr {
        wr_id: w.wr_id,
        // SAFETY: the caller's promise.
        sg_list: unsafe { sges(w.sg_list, w.num_sge)? },
    })
}

pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_recv_wr,
    bad_wr: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    // SAFETY: the program's QP and list of work requests.
    unsafe {
        ffi::post_list(Qp::from_c(qp), wr, bad_wr, |q, w| {
            q.qp.post_recv(recv_wr(w)?).map_err(|e| ffi::errno_of(&e))
        })
    }
}

// ---- ibv_qp_ex: ibv_wr_start ... ibv_wr_complete ----

unsafe fn qx<'a>(p: *mut sys::ibv_qp_ex) -> Option<&'a Qp> {
    // SAFETY: an ibv_qp_ex rnic made is its ibv_qp.
    unsafe { Qp::from_c(p.cast()) }.ok()
}

/// Start a new work request with the QP's current `wr_id` and `wr_flags`.
unsafe fn begin(p: *mut sys::ibv_qp_ex, op: SendOp) {
    // SAFETY: the program's pointer.
    let Some(q) = (unsafe { qx(p) }) else { return };
    // SAFETY: the program's fields, read.
    let (wr_id, wr_flags) = unsafe { ((*p).wr_id, (*p).wr_flags) };
    let (signaled, solicited, fence) = flags(q, wr_flags);
    q.pending.lock().push(Pending {
        wr: SendWr::new(wr_id, op, SgList::new())
            .signaled(signaled)
            .solicited(solicited)
            .fence(fence),
        ud: None,
        bind: None,
        error: None,
    });
}

/// Change the last work request begun.
unsafe fn last(p: *mut sys::ibv_qp_ex, f: impl FnOnce(&mut Pending)) {
    // SAFETY: the program's pointer.
    if let Some(q) = unsafe { qx(p) } {
        if let Some(w) = q.pending.lock().last_mut() {
            f(w);
        }
    }
}

pub(crate) unsafe extern "C" fn wr_start(p: *mut sys::ibv_qp_ex) {
    // SAFETY: the program's pointer.
    if let Some(q) = unsafe { qx(p) } {
        q.pending.lock().clear();
    }
}

pub(crate) unsafe extern "C" fn wr_complete(p: *mut sys::ibv_qp_ex) -> c_int {
    // SAFETY: the program's pointer.
    let Some(q) = (unsafe { qx(p) }) else {
        return libc::EINVAL;
    };
    // Drained in place, so the list keeps its room for the next batch.
    let mut pending = q.pending.lock();
    // A batch with a request that could not be built posts nothing, as a
    // NIC's doorbell is never rung for it.
    if let Some(e) = pending.iter().find_map(|w| w.error) {
        pending.clear();
        return e;
    }
    ffi::errno_call(|| {
        for w in pending.drain(..) {
            if let Some((mw, rkey, info)) = w.bind {
                // SAFETY: the window and region the program named.
                unsafe {
                    bind(
                        q,
                        w.wr.wr_id,
                        mw as *mut sys::ibv_mw,
                        rkey,
                        &info,
                        w.wr.signaled,
                    )?
                };
                continue;
            }
            let r = match w.ud {
                Some((ah, qpn, qkey)) => q.qp.post_send_ud(w.wr, &ah, qpn, qkey),
                None => q.qp.post_send(w.wr),
            };
            r.map_err(|e| ffi::errno_of(&e))?;
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn wr_abort(p: *mut sys::ibv_qp_ex) {
    // SAFETY: the program's pointer.
    unsafe { wr_start(p) }
}

pub(crate) unsafe extern "C" fn wr_send(p: *mut sys::ibv_qp_ex) {
    // SAFETY: passed on.
    unsafe { begin(p, SendOp::send()) }
}
pub(crate) unsafe extern "C" fn wr_send_imm(p: *mut sys::ibv_qp_ex, imm: u32) {
    // SAFETY: passed on.
    unsafe { begin(p, SendOp::send_imm(u32::from_be(imm))) }
}
pub(crate) unsafe extern "C" fn wr_send_inv(p: *mut sys::ibv_qp_ex, rkey: u32) {
    // SAFETY: passed on.
    unsafe {
        begin(
            p,
            SendOp::SendWithInv {
                invalidate_rkey: rkey,
            },
        )
    }
}
pub(crate) unsafe extern "C" fn wr_rdma_write(p: *mut sys::ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: passed on.
    unsafe { begin(p, SendOp::write(remote_addr, rkey)) }
}
pub(crate) unsafe extern "C" fn wr_rdma_write_imm(
    p: *mut sys::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm: u32,
) {
    let imm = Some(u32::from_be(imm));
    // SAFETY: passed on.
    unsafe {
        begin(
            p,
            SendOp::Write {
                remote_addr,
                rkey,
                imm,
            },
        )
    }
}
pub(crate) unsafe extern "C" fn wr_rdma_read(p: *mut sys::ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: passed on.
    unsafe { begin(p, SendOp::read(remote_addr, rkey)) }
}
pub(crate) unsafe extern "C" fn wr_atomic_cmp_swp(
    p: *mut sys::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    // SAFETY: passed on.
    unsafe { begin(p, SendOp::compare_swap(remote_addr, rkey, compare, swap)) }
}
pub(crate) unsafe extern "C" fn wr_atomic_fetch_add(
    p: *mut sys::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    // SAFETY: passed on.
    unsafe { begin(p, SendOp::fetch_add(remote_addr, rkey, add)) }
}
/// `ibv_wr_atomic_write`: the 8 bytes at `data`, stored at once.
pub(crate) unsafe extern "C" fn wr_atomic_write(
    p: *mut sys::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    data: *const c_void,
) {
    let bytes = match NonNull::new(data.cast_mut().cast::<[u8; 8]>()) {
        // SAFETY: verbs' contract: 8 readable bytes at `data`.
        Some(d) => unsafe { d.as_ptr().read_unaligned() },
        None => {
            // SAFETY: passed on; the request fails at ibv_wr_complete.
            unsafe {
                begin(
                    p,
                    SendOp::AtomicWrite {
                        remote_addr,
                        rkey,
                        data: [0; 8],
                    },
                );
                last(p, |w| w.error = Some(libc::EFAULT));
            }
            return;
        }
    };
    // SAFETY: passed on.
    unsafe {
        begin(
            p,
            SendOp::AtomicWrite {
                remote_addr,
                rkey,
                data: bytes,
            },
        )
    }
}
pub(crate) unsafe extern "C" fn wr_local_inv(p: *mut sys::ibv_qp_ex, rkey: u32) {
    // SAFETY: passed on.
    unsafe { begin(p, SendOp::LocalInv { rkey }) }
}
pub(crate) unsafe extern "C" fn wr_bind_mw(
    p: *mut sys::ibv_qp_ex,
    mw: *mut sys::ibv_mw,
    rkey: u32,
    info: *const sys::ibv_mw_bind_info,
) {
    if info.is_null() {
        // Not dropped in silence: the batch fails at ibv_wr_complete.
        // SAFETY: passed on.
        unsafe {
            begin(p, SendOp::LocalInv { rkey: 0 });
            last(p, |w| w.error = Some(libc::EINVAL));
        }
        return;
    }
    // SAFETY: the program's bind info, copied.
    let info = unsafe { *info };
    // SAFETY: passed on; the op is replaced by the bind at completion.
    unsafe {
        begin(p, SendOp::LocalInv { rkey: 0 });
        last(p, |w| w.bind = Some((mw as usize, rkey, info)));
    }
}
pub(crate) unsafe extern "C" fn wr_set_sge(
    p: *mut sys::ibv_qp_ex,
    lkey: u32,
    addr: u64,
    length: u32,
) {
    // SAFETY: passed on.
    unsafe { last(p, |w| w.wr.sg_list = sg_list![Sge { addr, length, lkey }]) }
}
pub(crate) unsafe extern "C" fn wr_set_sge_list(
    p: *mut sys::ibv_qp_ex,
    n: usize,
    list: *const sys::ibv_sge,
) {
    let Ok(n) = c_int::try_from(n) else { return };
    // SAFETY: the program's list of n entries.
    let Ok(sg) = (unsafe { sges(list, n) }) else {
        return;
    };
    // SAFETY: passed on.
    unsafe { last(p, |w| w.wr.sg_list = sg) }
}
/// Inline bytes for the work request, or the error its post will fail with.
fn set_inline(w: &mut Pending, data: Result<InlineData, i32>) {
    match data {
        Ok(d) => w.wr.inline = Some(d),
        Err(e) => w.error = Some(e),
    }
}

pub(crate) unsafe extern "C" fn wr_set_inline_data(
    p: *mut sys::ibv_qp_ex,
    addr: *mut c_void,
    length: usize,
) {
    // SAFETY: the program's buffer.
    let data = unsafe { inline_bytes(std::iter::once((addr as u64, length))) };
    // SAFETY: passed on.
    unsafe { last(p, |w| set_inline(w, data)) }
}
pub(crate) unsafe extern "C" fn wr_set_inline_data_list(
    p: *mut sys::ibv_qp_ex,
    n: usize,
    list: *const sys::ibv_data_buf,
) {
    if n > 0 && list.is_null() {
        return;
    }
    let bufs = if n == 0 {
        &[][..]
    } else {
        // SAFETY: the program's list of n buffers.
        unsafe { std::slice::from_raw_parts(list, n) }
    };
    let l = bufs.iter().map(|b| (b.addr as u64, b.length));
    // SAFETY: the program's buffers.
    let data = unsafe { inline_bytes(l) };
    // SAFETY: passed on.
    unsafe { last(p, |w| set_inline(w, data)) }
}
pub(crate) unsafe extern "C" fn wr_set_ud_addr(
    p: *mut sys::ibv_qp_ex,
    ah: *mut sys::ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    // SAFETY: the program's AH.
    let Ok(ah) = (unsafe { Ah::from_c(ah) }) else {
        return;
    };
    let a = ah.ah;
    // SAFETY: passed on.
    unsafe { last(p, |w| w.ud = Some((a, remote_qpn, remote_qkey))) }
}
