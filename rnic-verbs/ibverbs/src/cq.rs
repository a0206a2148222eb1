//! Completion queues (`ibv_create_cq`, `ibv_create_cq_ex`), the data path's
//! `ibv_poll_cq` and `ibv_start_poll`/`ibv_next_poll`, and completion
//! channels (`ibv_create_comp_channel`, `ibv_get_cq_event`).
//!
//! Every CQ is made as an `ibv_cq_ex`, whose first fields are an `ibv_cq`,
//! so both interfaces work on any CQ.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsFd, AsRawFd};

use parking_lot::Mutex;
use rnic_verbs::{
    Completion, CompletionChannel, CompletionQueue, NetworkHdr, WcOpcode, WcStatus, DEVICE_ATTR,
};

use crate::device::{Context, COMP_VECTORS};
use crate::ffi::{self, obj, object, Object};
use crate::pd::{next_handle, Pd};
use crate::sys;

#[repr(C)]
pub(crate) struct Cq {
    /// Written by rnic (status, wr_id while polling) and read by the
    /// program; the program owns `cq_context`.
    c: UnsafeCell<sys::ibv_cq_ex>,
    magic: u64,
    pub cq: CompletionQueue,
    channel: *mut sys::ibv_comp_channel,
    ctx: *mut sys::ibv_context,
    /// The completion `ibv_start_poll`/`ibv_next_poll` made current, and
    /// when (its completion timestamp: the moment rnic handed it to the
    /// poller, on `clock_ns`).
    current: Mutex<Option<(Completion, u64)>>,
}
object!(Cq, sys::ibv_cq, b"rnic-cq\0");

// SAFETY: the C part is written only by the thread polling the CQ (verbs
// requires the program to serialise polls of one CQ); the rest is Sync.
unsafe impl Sync for Cq {}
// SAFETY: as above.
unsafe impl Send for Cq {}

impl Cq {
    fn ex(&self) -> *mut sys::ibv_cq_ex {
        self.c.get()
    }
}

/// The C opcode of a completion.
fn opcode(op: WcOpcode) -> sys::ibv_wc_opcode {
    match op {
        WcOpcode::Send => sys::IBV_WC_SEND,
        WcOpcode::RdmaWrite => sys::IBV_WC_RDMA_WRITE,
        WcOpcode::RdmaRead => sys::IBV_WC_RDMA_READ,
        WcOpcode::CompSwap => sys::IBV_WC_COMP_SWAP,
        WcOpcode::FetchAdd => sys::IBV_WC_FETCH_ADD,
        WcOpcode::BindMw => sys::IBV_WC_BIND_MW,
        WcOpcode::LocalInv => sys::IBV_WC_LOCAL_INV,
        // IBV_WC_FLUSH arrived after rdma-core 44 with this value.
        WcOpcode::Flush => 8,
        WcOpcode::AtomicWrite => sys::IBV_WC_ATOMIC_WRITE,
        WcOpcode::Recv => sys::IBV_WC_RECV,
        WcOpcode::RecvRdmaWithImm => sys::IBV_WC_RECV_RDMA_WITH_IMM,
    }
}

/// The C status of a completion.
pub(crate) fn status(s: WcStatus) -> sys::ibv_wc_status {
    match s {
        WcStatus::Success => sys::IBV_WC_SUCCESS,
        WcStatus::LocLenErr => sys::IBV_WC_LOC_LEN_ERR,
        WcStatus::LocQpOpErr => sys::IBV_WC_LOC_QP_OP_ERR,
        WcStatus::LocProtErr => sys::IBV_WC_LOC_PROT_ERR,
        WcStatus::WrFlushErr => sys::IBV_WC_WR_FLUSH_ERR,
        WcStatus::RemInvReqErr => sys::IBV_WC_REM_INV_REQ_ERR,
        WcStatus::RemAccessErr => sys::IBV_WC_REM_ACCESS_ERR,
        WcStatus::RemOpErr => sys::IBV_WC_REM_OP_ERR,
        WcStatus::RetryExcErr => sys::IBV_WC_RETRY_EXC_ERR,
        WcStatus::RnrRetryExcErr => sys::IBV_WC_RNR_RETRY_EXC_ERR,
        WcStatus::BadRespErr => sys::IBV_WC_BAD_RESP_ERR,
        WcStatus::MwBindErr => sys::IBV_WC_MW_BIND_ERR,
    }
}

fn wc_flags(c: &Completion) -> u32 {
    let mut f = 0;
    if c.src_qp.is_some() {
        // UD receives carry the sender's network header in the first 40 bytes.
        f |= sys::IBV_WC_GRH;
    }
    if c.imm_data.is_some() {
        f |= sys::IBV_WC_WITH_IMM;
    }
    if c.invalidated_rkey.is_some() {
        f |= sys::IBV_WC_WITH_INV;
    }
    f
}

/// `wc.sl` of a completion. Over RoCE a receive has no service level to
/// report, and for UD receives mlx5 puts the packet's type there instead
/// (bits 2:0: 0 a RoCE v1 GRH, 1 IPv6, 2 IPv4; bit 3: a UDP header, as
/// every RoCE v2 datagram has), the IBTA's "IPv4 or IPv6" of a UD
/// completion (Annex A17.4.5.1). Programs written for ConnectX read it to
/// find where the sender's address lies in the 40 bytes before the
/// payload (UCX's ud_verbs does); rdma_rxe leaves it 0, which such
/// programs take for a RoCE v1 GRH. Everything else reports 0.
fn sl(c: &Completion) -> u8 {
    const UDP: u8 = 1 << 3;
    match c.network {
        Some(NetworkHdr::Ipv6) => UDP | 1,
        Some(NetworkHdr::Ipv4) => UDP | 2,
        None => 0,
    }
}

/// `struct ibv_wc` for a completion. Immediate data is in network order, as
/// it travels.
fn wc_of(c: &Completion) -> sys::ibv_wc {
    // SAFETY: plain data.
    let mut wc: sys::ibv_wc = unsafe { std::mem::zeroed() };
    wc.wr_id = c.wr_id;
    wc.status = status(c.status);
    wc.opcode = opcode(c.opcode);
    wc.byte_len = c.byte_len;
    if let Some(imm) = c.imm_data {
        wc.__bindgen_anon_1.imm_data = imm.to_be();
    } else if let Some(rkey) = c.invalidated_rkey {
        wc.__bindgen_anon_1.invalidated_rkey = rkey;
    }
    wc.qp_num = c.qp_num;
    wc.src_qp = c.src_qp.unwrap_or(0);
    wc.wc_flags = wc_flags(c);
    wc.sl = sl(c);
    wc
}

pub(crate) unsafe extern "C" fn poll_cq(
    cq: *mut sys::ibv_cq,
    n: c_int,
    wc: *mut sys::ibv_wc,
) -> c_int {
    // SAFETY: the program's pointer.
    let Ok(cq) = (unsafe { Cq::from_c(cq) }) else {
        return -libc::EINVAL;
    };
    if n < 0 || (n > 0 && wc.is_null()) {
        return -libc::EINVAL;
    }
    let mut got = 0;
    while got < n {
        let Some(c) = cq.cq.try_next() else { break };
        // SAFETY: the program's array has room for n entries.
        unsafe { wc.add(got as usize).write(wc_of(&c)) };
        got += 1;
    }
    got
}

pub(crate) unsafe extern "C" fn req_notify_cq(
    cq: *mut sys::ibv_cq,
    _solicited_only: c_int,
) -> c_int {
    // SAFETY: the program's pointer.
    match unsafe { Cq::from_c(cq) } {
        // Solicited-only is served as "next completion": an event may come
        // earlier than asked, which verbs programs must allow for anyway.
        Ok(cq) => {
            cq.cq.req_notify();
            0
        }
        Err(e) => e,
    }
}

// ---- the extended CQ (ibv_cq_ex) ----

unsafe fn cq_ex<'a>(p: *mut sys::ibv_cq_ex) -> Option<&'a Cq> {
    // SAFETY: an ibv_cq_ex rnic made is its ibv_cq.
    unsafe { Cq::from_c(p.cast()) }.ok()
}

/// Make `c` current: its status and wr_id go in the C struct.
fn set_current(cq: &Cq, c: Option<Completion>) -> c_int {
    let Some(c) = c else {
        *cq.current.lock() = None;
        return libc::ENOENT;
    };
    // SAFETY: the polling thread alone writes these fields (see `Cq`).
    unsafe {
        (*cq.ex()).status = status(c.status);
        (*cq.ex()).wr_id = c.wr_id;
    }
    *cq.current.lock() = Some((c, crate::device::clock_ns()));
    0
}

unsafe extern "C" fn start_poll(
    p: *mut sys::ibv_cq_ex,
    _attr: *mut sys::ibv_poll_cq_attr,
) -> c_int {
    // SAFETY: passed on; starting a poll takes the next completion too.
    unsafe { next_poll(p) }
}

unsafe extern "C" fn next_poll(p: *mut sys::ibv_cq_ex) -> c_int {
    // SAFETY: the program's pointer.
    match unsafe { cq_ex(p) } {
        Some(cq) => set_current(cq, cq.cq.try_next()),
        None => libc::EINVAL,
    }
}

unsafe extern "C" fn end_poll(p: *mut sys::ibv_cq_ex) {
    // SAFETY: the program's pointer.
    if let Some(cq) = unsafe { cq_ex(p) } {
        *cq.current.lock() = None;
    }
}

/// A field of the current completion (zero if there is none).
unsafe fn read<T: Default>(p: *mut sys::ibv_cq_ex, f: impl FnOnce(&Completion) -> T) -> T {
    // SAFETY: the program's pointer.
    unsafe { cq_ex(p) }
        .and_then(|cq| cq.current.lock().as_ref().map(|(c, _)| f(c)))
        .unwrap_or_default()
}

unsafe extern "C" fn read_opcode(p: *mut sys::ibv_cq_ex) -> sys::ibv_wc_opcode {
    // SAFETY: passed on.
    unsafe { read(p, |c| opcode(c.opcode)) }
}
unsafe extern "C" fn read_vendor_err(_p: *mut sys::ibv_cq_ex) -> u32 {
    0
}
unsafe extern "C" fn read_byte_len(p: *mut sys::ibv_cq_ex) -> u32 {
    // SAFETY: passed on.
    unsafe { read(p, |c| c.byte_len) }
}
unsafe extern "C" fn read_imm_data(p: *mut sys::ibv_cq_ex) -> u32 {
    // SAFETY: passed on.
    unsafe {
        read(p, |c| {
            c.imm_data
                .map_or(c.invalidated_rkey.unwrap_or(0), u32::to_be)
        })
    }
}
unsafe extern "C" fn read_qp_num(p: *mut sys::ibv_cq_ex) -> u32 {
    // SAFETY: passed on.
    unsafe { read(p, |c| c.qp_num) }
}
unsafe extern "C" fn read_src_qp(p: *mut sys::ibv_cq_ex) -> u32 {
    // SAFETY: passed on.
    unsafe { read(p, |c| c.src_qp.unwrap_or(0)) }
}
unsafe extern "C" fn read_wc_flags(p: *mut sys::ibv_cq_ex) -> u32 {
    // SAFETY: passed on.
    unsafe { read(p, wc_flags) }
}
unsafe extern "C" fn read_completion_ts(p: *mut sys::ibv_cq_ex) -> u64 {
    // SAFETY: the program's pointer.
    unsafe { cq_ex(p) }
        .and_then(|cq| cq.current.lock().as_ref().map(|&(_, t)| t))
        .unwrap_or(0)
}
unsafe extern "C" fn read_slid(_p: *mut sys::ibv_cq_ex) -> u32 {
    0
}
unsafe extern "C" fn read_sl(p: *mut sys::ibv_cq_ex) -> u8 {
    // SAFETY: passed on.
    unsafe { read(p, sl) }
}
unsafe extern "C" fn read_dlid_path_bits(_p: *mut sys::ibv_cq_ex) -> u8 {
    0
}

/// What `ibv_create_cq_ex` can give: no timestamps, VLANs, flow tags or
/// tag matching.
const SUPPORTED_WC_FLAGS: u64 = sys::IBV_WC_EX_WITH_BYTE_LEN as u64
    | sys::IBV_WC_EX_WITH_IMM as u64
    | sys::IBV_WC_EX_WITH_QP_NUM as u64
    | sys::IBV_WC_EX_WITH_SRC_QP as u64
    | sys::IBV_WC_EX_WITH_SLID as u64
    | sys::IBV_WC_EX_WITH_SL as u64
    | sys::IBV_WC_EX_WITH_DLID_PATH_BITS as u64
    | sys::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP as u64;

unsafe fn create(
    ctx: *mut sys::ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut sys::ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut sys::ibv_cq_ex, i32> {
    // SAFETY: the program's pointer.
    let c = unsafe { Context::from_c(ctx)? };
    if cqe < 1 || cqe as u32 > DEVICE_ATTR.max_cqe {
        return Err(libc::EINVAL);
    }
    // One completion vector, as `num_comp_vectors` says.
    if !(0..COMP_VECTORS).contains(&comp_vector) {
        return Err(libc::EINVAL);
    }
    let ch = if channel.is_null() {
        None
    } else {
        // SAFETY: the program's pointer.
        Some(unsafe { Channel::from_c(channel)? })
    };
    let cq = match ch {
        Some(ch) => c.nic.create_cq_with_channel(cqe as usize, &ch.ch),
        None => c.nic.create_cq(cqe as usize),
    }
    .map_err(|e| ffi::errno_of(&e))?;
    // SAFETY: plain data, null pointers and None function pointers.
    let mut ex: sys::ibv_cq_ex = unsafe { std::mem::zeroed() };
    ex.context = ctx;
    ex.channel = channel;
    ex.cq_context = cq_context;
    ex.handle = next_handle();
    ex.cqe = cqe;
    ex.start_poll = Some(start_poll);
    ex.next_poll = Some(next_poll);
    ex.end_poll = Some(end_poll);
    ex.read_opcode = Some(read_opcode);
    ex.read_vendor_err = Some(read_vendor_err);
    ex.read_byte_len = Some(read_byte_len);
    ex.read_imm_data = Some(read_imm_data);
    ex.read_qp_num = Some(read_qp_num);
    ex.read_src_qp = Some(read_src_qp);
    ex.read_wc_flags = Some(read_wc_flags);
    ex.read_slid = Some(read_slid);
    ex.read_sl = Some(read_sl);
    ex.read_dlid_path_bits = Some(read_dlid_path_bits);
    ex.read_completion_ts = Some(read_completion_ts);
    let id = cq.id();
    let p = Cq {
        c: UnsafeCell::new(ex),
        magic: Cq::MAGIC,
        cq,
        channel,
        ctx,
        current: Mutex::new(None),
    }
    .into_c();
    if let Some(ch) = ch {
        ch.cqs.lock().insert(id, p as usize);
    }
    c.objects.lock().cqs.insert(id, p as usize);
    Ok(p.cast())
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut sys::ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut sys::ibv_comp_channel,
    comp_vector: c_int,
) -> *mut sys::ibv_cq {
    // SAFETY: the program's arguments, checked in `create`.
    ffi::ptr_call(|| {
        unsafe { create(ctx, cqe, cq_context, channel, comp_vector) }.map(|p| p.cast())
    })
}

pub(crate) unsafe extern "C" fn create_cq_ex(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_cq_init_attr_ex,
) -> *mut sys::ibv_cq_ex {
    ffi::ptr_call(|| {
        // SAFETY: the program's pointer.
        let a = unsafe { ffi::input(attr)? };
        if a.wc_flags & !SUPPORTED_WC_FLAGS != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let known = sys::IBV_CQ_INIT_ATTR_MASK_FLAGS | sys::IBV_CQ_INIT_ATTR_MASK_PD;
        if a.comp_mask & !known != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        if a.comp_mask & sys::IBV_CQ_INIT_ATTR_MASK_PD != 0 {
            // A parent domain of this context, as mlx5 requires; the queue
            // itself lives in rnic's memory, so it changes nothing else.
            // SAFETY: the program's pointer.
            let pd = unsafe { Pd::from_c(a.parent_domain)? };
            if !pd.pd.is_parent() || pd.ctx != ctx {
                return Err(libc::EINVAL);
            }
        }
        let cqe = c_int::try_from(a.cqe).map_err(|_| libc::EINVAL)?;
        let vector = c_int::try_from(a.comp_vector).map_err(|_| libc::EINVAL)?;
        // SAFETY: as in ibv_create_cq.
        unsafe { create(ctx, cqe, a.cq_context, a.channel, vector) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut sys::ibv_cq) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's pointer.
        let q = unsafe { Cq::from_c(cq)? };
        // EBUSY while a QP completes into it, as the kernel refuses.
        q.cq.destroy_now().map_err(|e| ffi::errno_of(&e))?;
        let id = q.cq.id();
        if !q.channel.is_null() {
            // SAFETY: a channel outlives the CQs on it (destroying it first fails).
            if let Some(ch) = unsafe { obj::<Channel>(q.channel) } {
                ch.cqs.lock().remove(&id);
            }
        }
        // SAFETY: the context outlives its objects.
        if let Ok(c) = unsafe { Context::from_c(q.ctx) } {
            c.objects.lock().cqs.remove(&id);
        }
        // SAFETY: checked above.
        unsafe { ffi::free::<Cq>(cq) };
        Ok(())
    })
}

/// A new depth for the CQ: at least `cqe`, and no fewer than the completions
/// waiting in it (EINVAL otherwise, as rdma-core's providers say).
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut sys::ibv_cq, cqe: c_int) -> c_int {
    ffi::errno_call(|| {
        let depth = usize::try_from(cqe).map_err(|_| libc::EINVAL)?;
        // SAFETY: the program's pointer.
        let q = unsafe { Cq::from_c(cq)? };
        // SAFETY: the context outlives its objects.
        let c = unsafe { Context::from_c(q.ctx)? };
        c.nic
            .resize_cq(&q.cq, depth)
            .map_err(|e| ffi::errno_of(&e))?;
        // SAFETY: the shared part sits in an UnsafeCell; the program reads
        // `cqe` and only rnic writes it.
        unsafe { (*q.c.get()).cqe = cqe };
        Ok(())
    })
}

// ---- completion channels ----

#[repr(C)]
pub(crate) struct Channel {
    c: sys::ibv_comp_channel,
    magic: u64,
    ch: CompletionChannel,
    /// The CQs on this channel, by number.
    cqs: Mutex<HashMap<u32, usize>>,
}
object!(Channel, sys::ibv_comp_channel, b"rnic-ch\0");

#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(
    ctx: *mut sys::ibv_context,
) -> *mut sys::ibv_comp_channel {
    ffi::ptr_call(|| {
        // SAFETY: the program's pointer.
        let c = unsafe { Context::from_c(ctx)? };
        let ch = c.nic.create_comp_channel().map_err(|e| ffi::errno_of(&e))?;
        Ok(Channel {
            c: sys::ibv_comp_channel {
                context: ctx,
                fd: ch.as_fd().as_raw_fd(),
                refcnt: 0,
            },
            magic: Channel::MAGIC,
            ch,
            cqs: Mutex::new(HashMap::new()),
        }
        .into_c())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut sys::ibv_comp_channel) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's pointer.
        let ch = unsafe { Channel::from_c(channel)? };
        if !ch.cqs.lock().is_empty() {
            return Err(libc::EBUSY);
        }
        // SAFETY: checked above.
        unsafe { ffi::free::<Channel>(channel) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut sys::ibv_comp_channel,
    cq: *mut *mut sys::ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    ffi::minus_one_call(|| {
        // SAFETY: the program's pointers.
        let (ch, cq_out, ctx_out) = unsafe {
            (
                Channel::from_c(channel)?,
                ffi::out(cq)?,
                ffi::out(cq_context)?,
            )
        };
        let (p, q) = loop {
            // A read(2) of the channel's descriptor, as rdma-core's is:
            // blocking unless the program set O_NONBLOCK (then EAGAIN), and
            // ended with EINTR by a signal whose handler lacks SA_RESTART.
            let id = match ch.ch.read_cq_event() {
                Ok(id) => id,
                Err(e) => return Err(ffi::errno_of(&e)),
            };
            let Some(&p) = ch.cqs.lock().get(&id) else {
                continue; // the CQ was destroyed since
            };
            let p = p as *mut sys::ibv_cq;
            // SAFETY: a CQ on the channel is alive (destroying it unlists it).
            let q = unsafe { Cq::from_c(p)? };
            // An event whose completion the program already polled (it
            // arrived between arming and polling) would wake it to an empty
            // CQ, which programs such as ibv_rc_pingpong -t take for an
            // error. Such an event is kept back and the CQ stays armed, so
            // the next completion raises it again.
            if q.cq.is_empty() {
                q.cq.req_notify();
                if q.cq.is_empty() {
                    continue;
                }
            }
            break (p, q);
        };
        *cq_out = p;
        // SAFETY: the C part's cq_context, set by the program.
        *ctx_out = unsafe { (*q.ex()).cq_context };
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut sys::ibv_cq, nevents: u32) {
    // SAFETY: the program's pointer.
    if let Ok(q) = unsafe { Cq::from_c(cq) } {
        // SAFETY: the program serialises acks with destroy, as verbs requires.
        unsafe { (*q.ex()).comp_events_completed += nevents };
    }
}
