//! rdma_cm (`librdmacm.so.1`): connecting queue pairs by IP address and
//! port, for programs written against rdma-core's librdmacm (rping,
//! perftest's `-R`, UCX, libfabric, SPDK...).
//!
//! rdma-core's librdmacm is a thin layer over the kernel's rdma_cm, which
//! owns QP1 and the port spaces. Here the same layer sits over rnic's own
//! CM ([`rnic_verbs::cm`]): every NIC runs one on its QP1, the port spaces
//! are claims every process on the host shares, and an event channel is
//! a [`CmChannel`] (its descriptor readable while events wait, as the
//! kernel's is). What librdmacm does between the kernel's events, this
//! does between the CM's: the QP moved through INIT, RTR and RTS when the
//! REQ and REP are known (`rnic_verbs::cm::QpSetup`, the kernel's
//! `cm_init_qp_*_attr`), a REP answered by the RTU and reported as
//! ESTABLISHED, the rdma_cm header in front of a REQ's private data.
//!
//! The objects programs read (`struct rdma_cm_id`, `rdma_cm_event`,
//! `rdma_event_channel`, `rdma_addrinfo`) are laid out as `<rdma/rdma_cma.h>`
//! says (`cma_sys`, with compile-time checks). `id->verbs`, `id->pd` and
//! `id->qp` are this library's own verbs objects: one device context per
//! device for every id, as librdmacm opens each device once.
//!
//! The address part of rdma_cm stays small: an id takes the device that
//! owns the address it binds, or the device whose address of the peer's
//! family it sends from; on loopback an address no rnic NIC holds cannot
//! be reached, and resolving it ends in ADDR_ERROR.

#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use rnic_core::cm::sidr_status;
use rnic_verbs::cm::{
    AcceptParams, CmChannel, CmEvent, CmId, CmNotice, ConnectParams, Notice, PortClaim, PortSpace,
    QpSetup,
};
use rnic_verbs::QpState;
use rnic_wire::cm::{reason, CmaHeader, Rep, Req, CMA_HEADER_LEN};

use crate::cma_sys as cs;
use crate::device::Context;
use crate::ffi::{self, object, Object};
use crate::sys;

// ---- errors: -1 and errno, librdmacm's convention ----

/// Run `f`, catching a panic: 0, or -1 with errno set.
fn call(f: impl FnOnce() -> Result<(), i32>) -> c_int {
    ffi::minus_one_call(|| f().map(|()| 0))
}

fn errno_of(e: &rnic_verbs::Error) -> i32 {
    ffi::errno_of(e)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// ---- the devices every id shares ----

/// One context per device, opened on first use and kept (librdmacm's
/// `cma_dev->verbs`), each with the protection domain an id gets when the
/// program gives none (`cma_dev->pd`).
struct CmaDevice {
    ctx: *mut sys::ibv_context,
    pd: *mut sys::ibv_pd,
}

// SAFETY: pointers to objects this library owns and never frees.
unsafe impl Send for CmaDevice {}

fn cma_devices() -> Result<MutexGuard<'static, Vec<CmaDevice>>, i32> {
    static DEVICES: Mutex<Vec<CmaDevice>> = Mutex::new(Vec::new());
    let mut d = lock(&DEVICES);
    if d.is_empty() {
        let mut n: c_int = 0;
        // SAFETY: our own function; the list is freed below.
        let list = unsafe { crate::device::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(libc::ENODEV);
        }
        for i in 0..n.max(0) as usize {
            // SAFETY: `n` entries.
            let dev = unsafe { *list.add(i) };
            // SAFETY: a device of the list.
            let ctx = unsafe { crate::device::ibv_open_device(dev) };
            if ctx.is_null() {
                continue;
            }
            // SAFETY: the context just opened.
            let pd = unsafe { crate::pd::ibv_alloc_pd(ctx) };
            d.push(CmaDevice { ctx, pd });
        }
        // SAFETY: the list from ibv_get_device_list.
        unsafe { crate::device::ibv_free_device_list(list) };
        if d.is_empty() {
            return Err(libc::ENODEV);
        }
    }
    Ok(d)
}

fn context(ctx: *mut sys::ibv_context) -> Result<&'static Context, i32> {
    // SAFETY: a context of `cma_devices`, never freed.
    unsafe { Context::from_c(ctx) }
}

/// The device that owns `addr`, and its default PD.
fn device_of(addr: IpAddr) -> Result<(*mut sys::ibv_context, *mut sys::ibv_pd), i32> {
    let d = cma_devices()?;
    d.iter()
        .find(|d| context(d.ctx).is_ok_and(|c| c.nic.gids().contains(&addr)))
        .map(|d| (d.ctx, d.pd))
        .ok_or(libc::EADDRNOTAVAIL)
}

/// The device and address to reach `dest` from: the first device with an
/// address of its family (of its scope, for a link-local one).
fn route_to(dest: IpAddr) -> Result<(*mut sys::ibv_context, *mut sys::ibv_pd, IpAddr), i32> {
    let d = cma_devices()?;
    let link_local = |a: &IpAddr| matches!(a, IpAddr::V6(v) if v.segments()[0] & 0xFFC0 == 0xFE80);
    for dev in d.iter() {
        let Ok(c) = context(dev.ctx) else { continue };
        let same: Vec<IpAddr> = c
            .nic
            .gids()
            .iter()
            .copied()
            .filter(|a| a.is_ipv4() == dest.is_ipv4())
            .collect();
        let pick = same
            .iter()
            .find(|a| link_local(a) == link_local(&dest))
            .or(same.first());
        if let Some(&src) = pick {
            return Ok((dev.ctx, dev.pd, src));
        }
    }
    Err(libc::ENETUNREACH)
}

/// Every device's context (for a listener on the wildcard address).
fn all_devices() -> Result<Vec<(*mut sys::ibv_context, *mut sys::ibv_pd)>, i32> {
    Ok(cma_devices()?.iter().map(|d| (d.ctx, d.pd)).collect())
}

// ---- socket addresses ----

/// The address and port at `sa` (null, or a sockaddr of its family).
///
/// # Safety
/// `sa` is null or readable for the size its family says.
unsafe fn read_sockaddr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller's promise.
    match i32::from(unsafe { (*sa).sa_family }) {
        libc::AF_INET => {
            // SAFETY: AF_INET: a sockaddr_in.
            let v4 = unsafe { &*sa.cast::<libc::sockaddr_in>() };
            Some(SocketAddr::new(
                Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr)).into(),
                u16::from_be(v4.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: AF_INET6: a sockaddr_in6.
            let v6 = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::new(
                Ipv6Addr::from(v6.sin6_addr.s6_addr).into(),
                u16::from_be(v6.sin6_port),
            ))
        }
        _ => None,
    }
}

/// Write `a` at `out`, which has room for a `sockaddr_storage`.
///
/// # Safety
/// `out` is writable for 128 bytes.
unsafe fn write_sockaddr(out: *mut c_void, a: SocketAddr) {
    // SAFETY: the caller's promise: room for a sockaddr_storage.
    unsafe { std::ptr::write_bytes(out.cast::<u8>(), 0, 128) };
    match a {
        SocketAddr::V4(v4) => {
            // SAFETY: as above; a sockaddr_in fits.
            let s = unsafe { &mut *out.cast::<libc::sockaddr_in>() };
            s.sin_family = libc::AF_INET as u16;
            s.sin_port = v4.port().to_be();
            s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above; a sockaddr_in6 fits.
            let s = unsafe { &mut *out.cast::<libc::sockaddr_in6>() };
            s.sin6_family = libc::AF_INET6 as u16;
            s.sin6_port = v6.port().to_be();
            s.sin6_addr.s6_addr = v6.ip().octets();
            s.sin6_scope_id = v6.scope_id();
        }
    }
}

fn unspecified(a: IpAddr) -> bool {
    a.is_unspecified()
}

/// Whether an id bound to `a` is bound to no device: the wildcard address,
/// or, as the kernel's rdma_cm has it, a loopback address that none of
/// this process's devices holds. The kernel binds 127.0.0.1 on a host
/// whose RDMA devices are on other interfaces with no device, and a listen
/// there listens on every device, for requests to any of their addresses
/// (libfabric's verbs provider listens on "localhost" when given no
/// address).
fn deviceless(a: IpAddr) -> bool {
    a.is_unspecified() || (a.is_loopback() && device_of(a).is_err())
}

// ---- event channels ----

/// `struct rdma_event_channel`: its `fd` is the channel's descriptor.
#[repr(C)]
pub(crate) struct Channel {
    c: cs::rdma_event_channel,
    magic: u64,
    ch: Arc<CmChannel>,
}
object!(Channel, cs::rdma_event_channel, b"rnic-ech");

fn new_channel() -> Result<*mut cs::rdma_event_channel, i32> {
    let ch = CmChannel::new().map_err(|e| errno_of(&e))?;
    Ok(Channel {
        c: cs::rdma_event_channel {
            fd: ch.as_fd().as_raw_fd(),
        },
        magic: 0,
        ch: Arc::new(ch),
    }
    .into_c())
}

#[no_mangle]
pub extern "C" fn rdma_create_event_channel() -> *mut cs::rdma_event_channel {
    ffi::ptr_call(new_channel)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut cs::rdma_event_channel) {
    // SAFETY: the program's channel; nothing uses it afterwards.
    let _ = unsafe { ffi::free::<Channel>(channel) };
}

// ---- ids ----

static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

/// Live ids by serial number (the token their events carry).
fn registry() -> MutexGuard<'static, HashMap<u64, usize>> {
    static IDS: std::sync::LazyLock<Mutex<HashMap<u64, usize>>> =
        std::sync::LazyLock::new(Default::default);
    lock(&IDS)
}

/// A connection's first PSN: random, as the kernel's CM draws it.
fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: a buffer of 4 bytes. Short or failed: the bytes left are 0.
    unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    u32::from_ne_bytes(b) & 0xFF_FFFF
}

/// `struct rdma_cm_id`, which the program reads and writes (`context`).
#[repr(C)]
pub(crate) struct Id {
    c: UnsafeCell<cs::rdma_cm_id>,
    magic: u64,
    serial: u64,
    st: Mutex<IdState>,
    /// Events handed to the program and events it acknowledged:
    /// `rdma_destroy_id` waits until they are equal.
    events: Mutex<(u64, u64)>,
    acked: Condvar,
}
object!(Id, cs::rdma_cm_id, b"rnic-cmi");

// SAFETY: the C part is written by the program (its `context`) and by this
// library in the calls the program makes on the id, as with librdmacm; the
// rest is behind locks.
unsafe impl Sync for Id {}
// SAFETY: as above.
unsafe impl Send for Id {}

#[derive(Default)]
struct IdState {
    channel: Option<Arc<CmChannel>>,
    /// The channel this library made for a synchronous id (one made
    /// without a channel): destroyed with it.
    own_channel: Option<usize>,
    ps: Option<PortSpace>,
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
    claim: Option<PortClaim>,
    /// Services listened on, by device, with their backlogs.
    listening: Vec<(usize, u64, usize)>,
    /// The connection, and the device it is on.
    conn: Option<CmId>,
    ctx: usize,
    /// Active side: the REQ it sent.
    req: Option<ConnectParams>,
    /// Passive side: the REQ it took, and where from.
    incoming: Option<(Box<Req>, IpAddr)>,
    responder_resources: u8,
    initiator_depth: u8,
    setup: Option<QpSetup>,
    /// The PSN this side's QP starts at (random, as the kernel's).
    psn: u32,
    ack_timeout: Option<u8>,
    established: bool,
    /// Sync listeners: the QP each request gets (`rdma_create_ep`).
    qp_init_attr: Option<Box<sys::ibv_qp_init_attr>>,
    /// What `rdma_create_qp` made for the id and destroys with the QP.
    made: Made,
    path: Option<Box<cs::ibv_sa_path_rec>>,
}

#[derive(Default)]
struct Made {
    send_cq: usize,
    recv_cq: usize,
    send_channel: usize,
    recv_channel: usize,
}

impl Id {
    fn c(&self) -> *mut cs::rdma_cm_id {
        self.c.get()
    }
    fn state(&self) -> MutexGuard<'_, IdState> {
        lock(&self.st)
    }
    fn channel(&self) -> Result<Arc<CmChannel>, i32> {
        self.state().channel.clone().ok_or(libc::EINVAL)
    }
    fn ctx(&self) -> Result<&'static Context, i32> {
        // SAFETY: our C part.
        let v = unsafe { (*self.c()).verbs };
        if v.is_null() {
            return Err(libc::EINVAL);
        }
        context(v)
    }
    fn sync(&self) -> bool {
        self.state().own_channel.is_some()
    }
}

/// The id behind the program's pointer.
fn id_of<'a>(id: *mut cs::rdma_cm_id) -> Result<&'a Id, i32> {
    // SAFETY: `from_c` checks the pointer is one of ours.
    unsafe { Id::from_c(id) }
}

fn create_id(
    channel: *mut cs::rdma_event_channel,
    context: *mut c_void,
    ps: u32,
    qp_type: u32,
) -> Result<*mut cs::rdma_cm_id, i32> {
    let space = match ps {
        cs::RDMA_PS_TCP => PortSpace::Tcp,
        cs::RDMA_PS_UDP => PortSpace::Udp,
        cs::RDMA_PS_IB => PortSpace::Ib,
        cs::RDMA_PS_IPOIB => PortSpace::Ipoib,
        _ => return Err(libc::EINVAL),
    };
    let (c, own) = if channel.is_null() {
        let c = new_channel()?;
        (c, Some(c as usize))
    } else {
        (channel, None)
    };
    // SAFETY: the program's channel, or ours.
    let ch = unsafe { Channel::from_c(c)? }.ch.clone();
    // SAFETY: plain data.
    let mut cid: cs::rdma_cm_id = unsafe { std::mem::zeroed() };
    cid.channel = c;
    cid.context = context;
    cid.ps = ps;
    cid.qp_type = qp_type;
    let serial = NEXT_SERIAL.fetch_add(1, Ordering::Relaxed);
    let st = IdState {
        channel: Some(ch),
        own_channel: own,
        ps: Some(space),
        psn: random_psn(),
        ..IdState::default()
    };
    let p = Id {
        c: UnsafeCell::new(cid),
        magic: 0,
        serial,
        st: Mutex::new(st),
        events: Mutex::new((0, 0)),
        acked: Condvar::new(),
    }
    .into_c();
    registry().insert(serial, p as usize);
    Ok(p)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut cs::rdma_event_channel,
    id: *mut *mut cs::rdma_cm_id,
    context: *mut c_void,
    ps: cs::rdma_port_space,
) -> c_int {
    call(|| {
        let qp_type = if ps == cs::RDMA_PS_UDP || ps == cs::RDMA_PS_IPOIB {
            sys::IBV_QPT_UD
        } else {
            sys::IBV_QPT_RC
        };
        // SAFETY: the program's out-parameter.
        let out = unsafe { ffi::out(id)? };
        *out = create_id(channel, context, ps, qp_type)?;
        Ok(())
    })
}

/// Point the id at `ctx` (its device) and its default PD, port 1.
fn set_device(i: &Id, ctx: *mut sys::ibv_context, pd: *mut sys::ibv_pd) {
    // SAFETY: our C part, written in the program's call.
    let c = unsafe { &mut *i.c() };
    c.verbs = ctx;
    c.port_num = 1;
    if c.pd.is_null() {
        c.pd = pd;
    }
    i.state().ctx = ctx as usize;
}

fn set_route_addrs(i: &Id, local: Option<SocketAddr>, remote: Option<SocketAddr>) {
    // SAFETY: our C part; the route's unions have room for a
    // sockaddr_storage each.
    unsafe {
        let c = &mut *i.c();
        let addr = &mut c.route.addr;
        if let Some(l) = local {
            write_sockaddr(std::ptr::addr_of_mut!(addr.__bindgen_anon_1).cast(), l);
            addr.addr.ibaddr.as_mut().sgid.raw = rnic_verbs::gid_of(l.ip()).octets();
        }
        if let Some(r) = remote {
            write_sockaddr(std::ptr::addr_of_mut!(addr.__bindgen_anon_2).cast(), r);
            addr.addr.ibaddr.as_mut().dgid.raw = rnic_verbs::gid_of(r.ip()).octets();
        }
        addr.addr.ibaddr.as_mut().pkey = 0xFFFFu16.to_be();
    }
    let mut st = i.state();
    if local.is_some() {
        st.local = local;
    }
    if remote.is_some() {
        st.remote = remote;
    }
}

fn bind(i: &Id, at: SocketAddr) -> Result<(), i32> {
    let ps = i.state().ps.ok_or(libc::EINVAL)?;
    if i.state().claim.is_some() {
        return Err(libc::EINVAL);
    }
    // The addresses the id will be reached at: the one it names, or bound
    // to no device (the wildcard address, see `deviceless`), every address
    // of this process's devices of its family (of both, for IPv6's, as the
    // kernel's dual-stack port space has it).
    let addrs: Vec<IpAddr> = if deviceless(at.ip()) {
        let mut v = Vec::new();
        for (ctx, _) in all_devices()? {
            let c = context(ctx)?;
            v.extend(c.nic.gids().iter().filter(|a| at.is_ipv6() || a.is_ipv4()));
        }
        v
    } else {
        let (ctx, pd) = device_of(at.ip())?;
        set_device(i, ctx, pd);
        vec![at.ip()]
    };
    let claim = PortClaim::claim(ps, &addrs, at.port()).map_err(|e| errno_of(&e))?;
    let local = SocketAddr::new(at.ip(), claim.port);
    i.state().claim = Some(claim);
    set_route_addrs(i, Some(local), None);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut cs::rdma_cm_id, addr: *mut cs::sockaddr) -> c_int {
    call(|| {
        let i = id_of(id)?;
        // SAFETY: the program's address.
        let at = unsafe { read_sockaddr(addr.cast()) }.ok_or(libc::EINVAL)?;
        bind(i, at)
    })
}

// Notices an id posts itself: the event, and its status in the low half.
const OWN_ADDR_RESOLVED: u64 = (cs::RDMA_CM_EVENT_ADDR_RESOLVED as u64) << 32;
const OWN_ROUTE_RESOLVED: u64 = (cs::RDMA_CM_EVENT_ROUTE_RESOLVED as u64) << 32;

fn own(event: cs::rdma_cm_event_type, status: i32) -> u64 {
    (u64::from(event) << 32) | u64::from(status as u32)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut cs::rdma_cm_id,
    src_addr: *mut cs::sockaddr,
    dst_addr: *mut cs::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    call(|| {
        let i = id_of(id)?;
        // SAFETY: the program's addresses.
        let (src, dst) = unsafe {
            (
                read_sockaddr(src_addr.cast()),
                read_sockaddr(dst_addr.cast()),
            )
        };
        let dst = dst.ok_or(libc::EINVAL)?;
        // The program turned from its QPs to the CM: the ACKs that wait for
        // its answer on them go now (a peer waiting for them may be about
        // to listen for this very connection).
        for (ctx, _) in all_devices()? {
            let _ = context(ctx)?.nic.send_held();
        }
        if i.state().claim.is_none() {
            let local_ip = match src.map(|s| s.ip()).filter(|a| !unspecified(*a)) {
                Some(a) => a,
                None => route_to(dst.ip())?.2,
            };
            bind(i, SocketAddr::new(local_ip, src.map_or(0, |s| s.port())))?;
        }
        let local = i.state().local.ok_or(libc::EINVAL)?;
        if deviceless(local.ip()) {
            // Bound to no device: the device that reaches dst.
            let (ctx, pd, ip) = route_to(dst.ip())?;
            set_device(i, ctx, pd);
            set_route_addrs(i, Some(SocketAddr::new(ip, local.port())), None);
        }
        set_route_addrs(i, None, Some(dst));
        // On loopback, a peer is a NIC of this host: an address none
        // holds cannot answer (the kernel's ARP would time out).
        let reachable = !dst.ip().is_loopback() || rnic_verbs::nic_on(dst.ip());
        let status = if reachable { 0 } else { -libc::EHOSTUNREACH };
        let what = if reachable {
            OWN_ADDR_RESOLVED
        } else {
            own(cs::RDMA_CM_EVENT_ADDR_ERROR, status)
        };
        i.channel()?.post(i.serial, what);
        complete(i)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut cs::rdma_cm_id, _timeout_ms: c_int) -> c_int {
    call(|| {
        let i = id_of(id)?;
        let (local, remote) = {
            let st = i.state();
            (st.local, st.remote)
        };
        let (Some(local), Some(remote)) = (local, remote) else {
            return Err(libc::EINVAL);
        };
        let mtu = i.ctx()?.nic.query_port().active_mtu;
        // SAFETY: plain data.
        let mut p: cs::ibv_sa_path_rec = unsafe { std::mem::zeroed() };
        p.sgid.raw = rnic_verbs::gid_of(local.ip()).octets();
        p.dgid.raw = rnic_verbs::gid_of(remote.ip()).octets();
        p.pkey = 0xFFFFu16.to_be();
        p.hop_limit = 64;
        p.flow_label = rnic_wire::cm::rdma_cm_flow_label(local.port(), remote.port()).to_be();
        p.mtu = rnic_verbs::cm::mtu_code(mtu);
        p.mtu_selector = 2;
        p.packet_life_time = rnic_verbs::cm::ACK_TIMEOUT - 1;
        p.packet_life_time_selector = 2;
        p.reversible = 1;
        p.numb_path = 1;
        let mut b = Box::new(p);
        {
            // SAFETY: our C part; the box lives in the id's state.
            let c = unsafe { &mut *i.c() };
            c.route.path_rec = &mut *b;
            c.route.num_paths = 1;
        }
        i.state().path = Some(b);
        i.channel()?.post(i.serial, OWN_ROUTE_RESOLVED);
        complete(i)
    })
}

/// A synchronous id's next event, from its own channel, the event a call
/// left on it acknowledged first (librdmacm keeps one there at a time).
fn next_own_event(i: &Id) -> Result<*mut cs::rdma_cm_event, i32> {
    // SAFETY: our C part.
    let c = unsafe { &mut *i.c() };
    if !c.event.is_null() {
        // SAFETY: the event handed to the id before.
        unsafe { rdma_ack_cm_event(c.event) };
        c.event = std::ptr::null_mut();
    }
    let mut e: *mut cs::rdma_cm_event = std::ptr::null_mut();
    // SAFETY: the id's own channel.
    if unsafe { rdma_get_cm_event(c.channel, &mut e) } != 0 {
        return Err(ffi::errno());
    }
    Ok(e)
}

/// For a synchronous id: wait for the event the call led to and fail as
/// it says (librdmacm's `ucma_complete`).
fn complete(i: &Id) -> Result<(), i32> {
    if !i.sync() {
        return Ok(());
    }
    let e = next_own_event(i)?;
    // SAFETY: our C part.
    unsafe { (*i.c()).event = e };
    // SAFETY: the event just taken.
    let ev = unsafe { &*e };
    match ev.status {
        0 => Ok(()),
        _ if ev.event == cs::RDMA_CM_EVENT_REJECTED => Err(libc::ECONNREFUSED),
        s if s < 0 => Err(-s),
        s => Err(s),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut cs::rdma_cm_id, backlog: c_int) -> c_int {
    call(|| {
        let i = id_of(id)?;
        if i.state().claim.is_none() {
            bind(i, SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0))?;
        }
        let (local, ps) = {
            let st = i.state();
            (st.local.ok_or(libc::EINVAL)?, st.ps.ok_or(libc::EINVAL)?)
        };
        let service = rnic_wire::cm::service_id(ps, local.port());
        let devices = if deviceless(local.ip()) {
            all_devices()?
        } else {
            vec![device_of(local.ip())?]
        };
        // As the kernel's rdma_ucm: the program's, up to its most (also
        // when it gives none).
        let most = rnic_core::cm::DEFAULT_BACKLOG;
        let backlog = usize::try_from(backlog)
            .ok()
            .filter(|&b| b > 0 && b < most)
            .unwrap_or(most);
        let ch = i.channel()?;
        for (ctx, _) in devices {
            let c = context(ctx)?;
            c.nic
                .cm_listen(service, backlog, &ch, i.serial)
                .map_err(|e| errno_of(&e))?;
            i.state().listening.push((ctx as usize, service, backlog));
        }
        Ok(())
    })
}

/// Stop everything an id has under way in the CM.
fn release(i: &Id) {
    let (listening, conn, ctx) = {
        let mut st = i.state();
        (std::mem::take(&mut st.listening), st.conn.take(), st.ctx)
    };
    for (ctx, service, _) in listening {
        if let Ok(c) = context(ctx as *mut sys::ibv_context) {
            let _ = c.nic.cm_unlisten(service);
        }
    }
    if let (Some(conn), Ok(c)) = (conn, context(ctx as *mut sys::ibv_context)) {
        let _ = c.nic.cm_release(conn);
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut cs::rdma_cm_id) -> c_int {
    call(|| {
        let i = id_of(id)?;
        release(i);
        registry().remove(&i.serial);
        // SAFETY: our C part.
        let c = unsafe { &mut *i.c() };
        if !c.event.is_null() {
            // SAFETY: the event a synchronous call left on the id.
            unsafe { rdma_ack_cm_event(c.event) };
            c.event = std::ptr::null_mut();
        }
        // Events handed out must be acknowledged first (they point here).
        let mut ev = lock(&i.events);
        while ev.1 < ev.0 {
            ev = i.acked.wait(ev).unwrap_or_else(|e| e.into_inner());
        }
        drop(ev);
        let own_channel = i.state().own_channel;
        // SAFETY: the program's id, not used afterwards.
        let _ = unsafe { ffi::free::<Id>(id) };
        if let Some(ch) = own_channel {
            // SAFETY: the channel made for this id.
            unsafe { rdma_destroy_event_channel(ch as *mut cs::rdma_event_channel) };
        }
        Ok(())
    })
}

// ---- queue pairs ----

fn modify(
    qp: *mut sys::ibv_qp,
    ctx: &Context,
    (attr, mask): (rnic_verbs::QpAttr, rnic_verbs::AttrMask),
) -> Result<(), i32> {
    let mut a = crate::qp::c_qp_attr(Some(ctx), &attr);
    // SAFETY: the id's QP and an attribute struct of ours.
    match unsafe { crate::qp::ibv_modify_qp(qp, &mut a, mask.0 as c_int) } {
        0 => Ok(()),
        e => Err(e),
    }
}

fn qp_state(qp: *mut sys::ibv_qp) -> Result<QpState, i32> {
    // SAFETY: the id's QP.
    let q = unsafe { crate::qp::Qp::from_c(qp)? };
    q.qp.state().map_err(|e| errno_of(&e))
}

/// Take the id's QP (if it has one) to RTS as `setup` says.
fn connect_qp(i: &Id, setup: &QpSetup) -> Result<(), i32> {
    // SAFETY: our C part.
    let qp = unsafe { (*i.c()).qp };
    if qp.is_null() {
        return Ok(());
    }
    let ctx = i.ctx()?;
    if matches!(qp_state(qp)?, QpState::Reset | QpState::Init) {
        modify(qp, ctx, setup.init_attr())?;
    }
    modify(qp, ctx, setup.rtr_attr())?;
    modify(qp, ctx, setup.rts_attr())
}

/// The QP to the error state (librdmacm's `ucma_modify_qp_err`).
fn qp_to_error(i: &Id) {
    // SAFETY: our C part.
    let qp = unsafe { (*i.c()).qp };
    if qp.is_null() {
        return;
    }
    if let Ok(ctx) = i.ctx() {
        let attr = rnic_verbs::QpAttr {
            qp_state: QpState::Err,
            ..Default::default()
        };
        let _ = modify(qp, ctx, (attr, rnic_verbs::AttrMask::STATE));
    }
}

/// A new QP on the id's device, at INIT (RC: no remote rights until it is
/// connected; UD: the rdma_cm Q_Key, and on to RTS), with CQs and
/// completion channels made for it if the program gave none.
fn create_qp(i: &Id, attr: &mut sys::ibv_qp_init_attr_ex) -> Result<(), i32> {
    // SAFETY: our C part.
    let c = unsafe { &mut *i.c() };
    if !c.qp.is_null() || c.verbs.is_null() {
        return Err(libc::EINVAL);
    }
    if attr.pd.is_null() {
        attr.pd = c.pd;
    }
    attr.comp_mask |= sys::IBV_QP_INIT_ATTR_PD;
    let ctx = c.verbs;
    let mut made = Made::default();
    let cq_for = |given: *mut sys::ibv_cq, depth: u32, chan: &mut usize, cq: &mut usize| {
        if !given.is_null() {
            return Ok(given);
        }
        // SAFETY: our own functions, on the id's context.
        let ch = unsafe { crate::cq::ibv_create_comp_channel(ctx) };
        if ch.is_null() {
            return Err(ffi::errno());
        }
        // SAFETY: as above.
        let q = unsafe {
            crate::cq::ibv_create_cq(ctx, depth.max(1) as c_int, std::ptr::null_mut(), ch, 0)
        };
        if q.is_null() {
            // SAFETY: the channel just made.
            unsafe { crate::cq::ibv_destroy_comp_channel(ch) };
            return Err(ffi::errno());
        }
        *chan = ch as usize;
        *cq = q as usize;
        Ok(q)
    };
    attr.send_cq = cq_for(
        if attr.send_cq.is_null() {
            c.send_cq
        } else {
            attr.send_cq
        },
        attr.cap.max_send_wr,
        &mut made.send_channel,
        &mut made.send_cq,
    )?;
    attr.recv_cq = cq_for(
        if attr.recv_cq.is_null() {
            c.recv_cq
        } else {
            attr.recv_cq
        },
        attr.cap.max_recv_wr,
        &mut made.recv_channel,
        &mut made.recv_cq,
    )?;
    if attr.srq.is_null() {
        attr.srq = c.srq;
    }
    // SAFETY: our own function; the attributes are the program's, filled in.
    let qp = unsafe { crate::qp::create_qp_ex(ctx, attr) };
    if qp.is_null() {
        let e = ffi::errno();
        destroy_made(&made);
        return Err(e);
    }
    let cx = context(ctx)?;
    let init = if attr.qp_type == sys::IBV_QPT_UD {
        let a = rnic_verbs::QpAttr {
            qp_state: QpState::Init,
            qkey: cs::RDMA_UDP_QKEY,
            ..Default::default()
        };
        use rnic_verbs::AttrMask as M;
        modify(qp, cx, (a, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)).and_then(|()| {
            let rtr = rnic_verbs::QpAttr {
                qp_state: QpState::Rtr,
                ..Default::default()
            };
            modify(qp, cx, (rtr, M::STATE))?;
            let rts = rnic_verbs::QpAttr {
                qp_state: QpState::Rts,
                sq_psn: 0,
                ..Default::default()
            };
            modify(qp, cx, (rts, M::STATE | M::SQ_PSN))
        })
    } else {
        let a = rnic_verbs::QpAttr {
            qp_state: QpState::Init,
            ..Default::default()
        };
        use rnic_verbs::AttrMask as M;
        modify(
            qp,
            cx,
            (a, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
        )
    };
    if let Err(e) = init {
        // SAFETY: the QP just made.
        unsafe { crate::qp::ibv_destroy_qp(qp) };
        destroy_made(&made);
        return Err(e);
    }
    c.qp = qp;
    c.pd = attr.pd;
    if made.send_cq != 0 {
        c.send_cq = made.send_cq as *mut sys::ibv_cq;
        c.send_cq_channel = made.send_channel as *mut sys::ibv_comp_channel;
    }
    if made.recv_cq != 0 {
        c.recv_cq = made.recv_cq as *mut sys::ibv_cq;
        c.recv_cq_channel = made.recv_channel as *mut sys::ibv_comp_channel;
    }
    i.state().made = made;
    Ok(())
}

fn destroy_made(m: &Made) {
    // SAFETY: objects this library made for an id, destroyed once.
    unsafe {
        for cq in [m.send_cq, m.recv_cq] {
            if cq != 0 {
                crate::cq::ibv_destroy_cq(cq as *mut sys::ibv_cq);
            }
        }
        for ch in [m.send_channel, m.recv_channel] {
            if ch != 0 {
                crate::cq::ibv_destroy_comp_channel(ch as *mut sys::ibv_comp_channel);
            }
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut cs::rdma_cm_id,
    pd: *mut sys::ibv_pd,
    qp_init_attr: *mut sys::ibv_qp_init_attr,
) -> c_int {
    call(|| {
        let i = id_of(id)?;
        // SAFETY: the program's attributes.
        let a = unsafe { ffi::out(qp_init_attr)? };
        let mut ex = crate::qp::init_attr_ex(a, pd);
        create_qp(i, &mut ex)?;
        a.cap = ex.cap;
        a.send_cq = ex.send_cq;
        a.recv_cq = ex.recv_cq;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut cs::rdma_cm_id,
    attr: *mut sys::ibv_qp_init_attr_ex,
) -> c_int {
    call(|| {
        let i = id_of(id)?;
        // SAFETY: the program's attributes.
        let a = unsafe { ffi::out(attr)? };
        if a.comp_mask & sys::IBV_QP_INIT_ATTR_PD == 0 {
            a.pd = std::ptr::null_mut();
        }
        create_qp(i, a)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut cs::rdma_cm_id) {
    let Ok(i) = id_of(id) else { return };
    // SAFETY: our C part.
    let c = unsafe { &mut *i.c() };
    if !c.qp.is_null() {
        // SAFETY: the id's QP.
        unsafe { crate::qp::ibv_destroy_qp(c.qp) };
        c.qp = std::ptr::null_mut();
    }
    let made = std::mem::take(&mut i.state().made);
    if made.send_cq != 0 {
        c.send_cq = std::ptr::null_mut();
        c.send_cq_channel = std::ptr::null_mut();
    }
    if made.recv_cq != 0 {
        c.recv_cq = std::ptr::null_mut();
        c.recv_cq_channel = std::ptr::null_mut();
    }
    destroy_made(&made);
}

// ---- connecting ----

/// The QP a connection is for: the id's, or the one the program names.
fn qp_num_of(i: &Id, p: Option<&cs::rdma_conn_param>) -> Result<u32, i32> {
    // SAFETY: our C part.
    let qp = unsafe { (*i.c()).qp };
    if qp.is_null() {
        Ok(p.ok_or(libc::EINVAL)?.qp_num)
    } else {
        // SAFETY: the id's QP.
        Ok(unsafe { (*qp).qp_num })
    }
}

/// `len` bytes at `data` (none for a null pointer).
///
/// # Safety
/// `data` is null or readable for `len` bytes.
unsafe fn bytes<'a>(data: *const c_void, len: u8) -> &'a [u8] {
    if data.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: the caller's promise.
    unsafe { std::slice::from_raw_parts(data.cast(), usize::from(len)) }
}

/// The private data of the program's connection parameters.
fn private_of(p: Option<&cs::rdma_conn_param>) -> &[u8] {
    // SAFETY: the program's private data, of the length it says.
    p.map_or(&[], |p| unsafe {
        bytes(p.private_data, p.private_data_len)
    })
}

/// The READs and atomics an id sends and answers at once when the program
/// leaves it to the library (`RDMA_MAX_*`): the device's most.
fn device_rd_atomic() -> u8 {
    rnic_verbs::DEVICE_ATTR.max_qp_rd_atom
}

#[no_mangle]
pub unsafe extern "C" fn rdma_connect(
    id: *mut cs::rdma_cm_id,
    conn_param: *mut cs::rdma_conn_param,
) -> c_int {
    call(|| {
        let i = id_of(id)?;
        // SAFETY: the program's parameters (or null).
        let p = unsafe { conn_param.as_ref() };
        let qpn = qp_num_of(i, p)?;
        let pick = |v: Option<u8>, max: u32| match v {
            Some(v) if u32::from(v) != max => v,
            _ => device_rd_atomic(),
        };
        let initiator_depth = pick(p.map(|p| p.initiator_depth), cs::RDMA_MAX_INIT_DEPTH);
        let responder_resources = pick(p.map(|p| p.responder_resources), cs::RDMA_MAX_RESP_RES);
        let private = private_of(p);
        let ctx = i.ctx()?;
        let (local, remote, ps, psn, ack_timeout) = {
            let st = i.state();
            (
                st.local.ok_or(libc::EINVAL)?,
                st.remote.ok_or(libc::EINVAL)?,
                st.ps.ok_or(libc::EINVAL)?,
                st.psn,
                st.ack_timeout,
            )
        };
        if ps == PortSpace::Udp || ps == PortSpace::Ipoib {
            return sidr_connect(i, ctx, local, remote, ps, private);
        }
        let mtu = ctx.nic.query_port().active_mtu;
        let mut req = rnic_verbs::cm::request(
            if ps == PortSpace::Ib {
                PortSpace::Ib
            } else {
                PortSpace::Tcp
            },
            local,
            remote,
            qpn,
            psn,
            mtu,
            responder_resources,
            initiator_depth,
            p.map_or(7, |p| p.retry_count),
            p.map_or(7, |p| p.rnr_retry_count),
            private,
        )
        .map_err(|e| errno_of(&e))?;
        if let Some(t) = ack_timeout {
            req.path.local_ack_timeout = t;
        }
        let ch = i.channel()?;
        // The id's state is held from before the REQ leaves until what its
        // answer needs is stored: another thread may read that answer
        // first (rping's CM thread waits in rdma_get_cm_event while its
        // main thread connects), and it must find the connection.
        let mut st = i.state();
        let conn = ctx
            .nic
            .cm_connect(remote.ip(), &req, &ch, i.serial)
            .map_err(|e| errno_of(&e))?;
        st.conn = Some(conn);
        st.req = Some(req);
        st.responder_resources = responder_resources;
        st.initiator_depth = initiator_depth;
        drop(st);
        complete(i)
    })
}

/// A UD id's `rdma_connect`: a SIDR_REQ for the peer's UD QP, the rdma_cm
/// header in front of the program's private data.
fn sidr_connect(
    i: &Id,
    ctx: &Context,
    local: SocketAddr,
    remote: SocketAddr,
    ps: PortSpace,
    private: &[u8],
) -> Result<(), i32> {
    let room = rnic_wire::cm::private_len::SIDR_REQ - CMA_HEADER_LEN;
    if private.len() > room {
        return Err(libc::EINVAL);
    }
    let mut data = vec![0u8; CMA_HEADER_LEN + private.len()];
    CmaHeader {
        version: 0,
        src_port: local.port(),
        src: local.ip(),
        dst: remote.ip(),
    }
    .emit(&mut data);
    data[CMA_HEADER_LEN..].copy_from_slice(private);
    let service = rnic_wire::cm::service_id(ps, remote.port());
    let ch = i.channel()?;
    // Held until the connection is stored, as in `rdma_connect`.
    let mut st = i.state();
    let conn = ctx
        .nic
        .cm_sidr_request(remote.ip(), service, &data, &ch, i.serial)
        .map_err(|e| errno_of(&e))?;
    st.conn = Some(conn);
    drop(st);
    complete(i)
}

fn is_ud(i: &Id) -> bool {
    // SAFETY: our C part.
    unsafe { (*i.c()).qp_type == sys::IBV_QPT_UD }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_accept(
    id: *mut cs::rdma_cm_id,
    conn_param: *mut cs::rdma_conn_param,
) -> c_int {
    call(|| {
        let i = id_of(id)?;
        // SAFETY: the program's parameters (or null).
        let p = unsafe { conn_param.as_ref() };
        let qpn = qp_num_of(i, p)?;
        let ctx = i.ctx()?;
        if is_ud(i) {
            let conn = i.state().conn.ok_or(libc::EINVAL)?;
            let private = private_of(p);
            // The SIDR_REP names the QP and the rdma_cm Q_Key; nothing
            // more comes for a UD id (no ESTABLISHED on this side).
            ctx.nic
                .cm_sidr_reply(conn, sidr_status::VALID, qpn, cs::RDMA_UDP_QKEY, private)
                .map_err(|e| errno_of(&e))?;
            let c = i.c();
            // SAFETY: our C part; a synchronous id's request event is done with.
            unsafe {
                if i.sync() && !(*c).event.is_null() {
                    rdma_ack_cm_event((*c).event);
                    (*c).event = std::ptr::null_mut();
                }
            }
            return Ok(());
        }
        let (conn, incoming, rr, id_depth, psn, local) = {
            let st = i.state();
            (
                st.conn.ok_or(libc::EINVAL)?,
                st.incoming.clone().ok_or(libc::EINVAL)?,
                st.responder_resources,
                st.initiator_depth,
                st.psn,
                st.local.ok_or(libc::EINVAL)?,
            )
        };
        let pick = |v: Option<u8>, max: u32, asked: u8| match v {
            Some(v) if u32::from(v) != max => v,
            _ => asked.min(device_rd_atomic()),
        };
        let private = private_of(p).to_vec();
        let params = AcceptParams {
            qpn,
            starting_psn: psn,
            responder_resources: pick(p.map(|p| p.responder_resources), cs::RDMA_MAX_RESP_RES, rr),
            initiator_depth: pick(
                p.map(|p| p.initiator_depth),
                cs::RDMA_MAX_INIT_DEPTH,
                id_depth,
            ),
            rnr_retry_count: p.map_or(7, |p| p.rnr_retry_count.min(7)),
            private_data: private,
        };
        let setup = passive_setup(ctx, &incoming, local.ip(), &params);
        i.state().setup = Some(setup);
        if let Err(e) = connect_qp(i, &setup) {
            qp_to_error(i);
            return Err(e);
        }
        let ch = i.channel()?;
        ctx.nic
            .cm_accept(conn, &params, &ch, i.serial)
            .map_err(|e| errno_of(&e))?;
        complete(i)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_reject(
    id: *mut cs::rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    call(|| {
        let i = id_of(id)?;
        // SAFETY: the program's data, of the length it says.
        let data = unsafe { bytes(private_data, private_data_len) };
        let conn = i.state().conn.ok_or(libc::EINVAL)?;
        let nic = &i.ctx()?.nic;
        if is_ud(i) {
            return nic
                .cm_sidr_reply(conn, sidr_status::REJECTED, 0, 0, data)
                .map_err(|e| errno_of(&e));
        }
        nic.cm_reject(conn, reason::CONSUMER_DEFINED, data)
            .map_err(|e| errno_of(&e))
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut cs::rdma_cm_id) -> c_int {
    call(|| {
        let i = id_of(id)?;
        // SAFETY: our C part.
        if !unsafe { (*i.c()).qp }.is_null() {
            return Err(libc::EINVAL);
        }
        let conn = i.state().conn.ok_or(libc::EINVAL)?;
        // Marked before the RTU goes: the CM's ESTABLISHED for it may be
        // read by another thread at once, and the kernel reports none to
        // an active side that establishes itself (rping -q waits for its
        // ping's answer and would take one for it).
        i.state().established = true;
        if let Err(e) = i.ctx()?.nic.cm_ready(conn) {
            i.state().established = false;
            return Err(errno_of(&e));
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_notify(id: *mut cs::rdma_cm_id, event: sys::ibv_event_type) -> c_int {
    call(|| {
        let i = id_of(id)?;
        if event != sys::IBV_EVENT_COMM_EST {
            return Ok(());
        }
        let conn = i.state().conn.ok_or(libc::EINVAL)?;
        i.ctx()?.nic.cm_established(conn).map_err(|e| errno_of(&e))
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut cs::rdma_cm_id) -> c_int {
    call(|| {
        let i = id_of(id)?;
        qp_to_error(i);
        let conn = i.state().conn.ok_or(libc::EINVAL)?;
        match i.ctx()?.nic.cm_disconnect(conn) {
            Ok(()) => complete(i),
            // Disconnected already (the peer's DREQ was answered).
            Err(_) => Ok(()),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut cs::rdma_cm_id,
    qp_attr: *mut sys::ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    call(|| {
        let i = id_of(id)?;
        // SAFETY: the program's pointers.
        let (a, m) = unsafe { (ffi::out(qp_attr)?, ffi::out(qp_attr_mask)?) };
        let setup = setup_of(i)?;
        let ctx = i.ctx()?;
        let (attr, mask) = match (a.qp_state, setup) {
            (sys::IBV_QPS_INIT, Some(s)) => s.init_attr(),
            (sys::IBV_QPS_INIT, None) => {
                use rnic_verbs::AttrMask as M;
                let a = rnic_verbs::QpAttr {
                    qp_state: QpState::Init,
                    ..Default::default()
                };
                (a, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
            }
            (sys::IBV_QPS_RTR, Some(s)) => s.rtr_attr(),
            (sys::IBV_QPS_RTS, Some(s)) => s.rts_attr(),
            _ => return Err(libc::EINVAL),
        };
        *a = crate::qp::c_qp_attr(Some(ctx), &attr);
        *m = mask.0 as c_int;
        Ok(())
    })
}

// ---- events ----

/// `struct rdma_cm_event`, with room for the private data it points to.
#[repr(C)]
pub(crate) struct Event {
    c: cs::rdma_cm_event,
    magic: u64,
    private: [u8; 256],
    /// The id whose acknowledgement count it is.
    owner: usize,
}
object!(Event, cs::rdma_cm_event, b"rnic-cme");

fn live(serial: u64) -> Option<&'static Id> {
    let p = *registry().get(&serial)?;
    // SAFETY: registered ids are alive until rdma_destroy_id takes them out.
    unsafe { Id::from_c(p as *mut cs::rdma_cm_id) }.ok()
}

/// What a notice means for the program, if anything: the event to hand it.
fn translate(n: CmNotice) -> Option<Box<Event>> {
    let i = live(n.token)?;
    // SAFETY: plain data.
    let mut e: Box<Event> = Box::new(unsafe { std::mem::zeroed() });
    e.owner = i as *const Id as usize;
    e.c.id = i.c();
    let conn_param =
        |e: &mut Event, data: &[u8], rr: u8, depth: u8, retry: u8, rnr: u8, srq: bool, qpn: u32| {
            let n = data.len().min(e.private.len());
            e.private[..n].copy_from_slice(&data[..n]);
            // SAFETY: the union's conn member, plain data.
            let p = unsafe { &mut *e.c.param.conn.as_mut() };
            p.private_data = e.private.as_ptr().cast();
            p.private_data_len = n as u8;
            p.responder_resources = rr;
            p.initiator_depth = depth;
            p.retry_count = retry;
            p.rnr_retry_count = rnr;
            p.srq = u8::from(srq);
            p.qp_num = qpn;
        };
    match n.what {
        Notice::Own(w) => {
            e.c.event = (w >> 32) as u32;
            e.c.status = w as u32 as i32;
        }
        Notice::Cm(CmEvent::Request { id, from, req }) => {
            let child = accept_request(i, id, from, &req)?;
            e.c.listen_id = i.c();
            e.c.id = child.c();
            e.owner = child as *const Id as usize;
            e.c.event = cs::RDMA_CM_EVENT_CONNECT_REQUEST;
            let data = req.private_data.get(CMA_HEADER_LEN..).unwrap_or(&[]);
            conn_param(
                &mut e,
                data,
                req.initiator_depth,
                req.responder_resources,
                req.retry_count,
                req.rnr_retry_count,
                req.srq,
                req.local_qpn,
            );
        }
        Notice::Cm(CmEvent::Reply { id: _, rep }) => {
            let status = reply(i, &rep);
            // SAFETY: our C part.
            let has_qp = !unsafe { (*i.c()).qp }.is_null();
            e.c.event = match (has_qp, status) {
                (false, _) => cs::RDMA_CM_EVENT_CONNECT_RESPONSE,
                (true, Ok(())) => cs::RDMA_CM_EVENT_ESTABLISHED,
                (true, Err(_)) => cs::RDMA_CM_EVENT_CONNECT_ERROR,
            };
            e.c.status = status.err().map_or(0, |s| -s);
            conn_param(
                &mut e,
                &rep.private_data,
                rep.initiator_depth,
                rep.responder_resources,
                0,
                rep.rnr_retry_count,
                rep.srq,
                rep.local_qpn,
            );
        }
        Notice::Cm(CmEvent::Established { .. }) => {
            let mut st = i.state();
            if st.established {
                // The active side's: reported with the REP.
                return None;
            }
            st.established = true;
            e.c.event = cs::RDMA_CM_EVENT_ESTABLISHED;
        }
        Notice::Cm(CmEvent::Rejected {
            reason,
            private_data,
            ..
        }) => {
            qp_to_error(i);
            e.c.event = cs::RDMA_CM_EVENT_REJECTED;
            e.c.status = i32::from(reason);
            conn_param(&mut e, &private_data[..], 0, 0, 0, 0, false, 0);
        }
        Notice::Cm(CmEvent::Unreachable { .. }) => {
            qp_to_error(i);
            e.c.event = cs::RDMA_CM_EVENT_UNREACHABLE;
            e.c.status = -libc::ETIMEDOUT;
        }
        Notice::Cm(CmEvent::DisconnectRequest { .. } | CmEvent::Disconnected { .. }) => {
            e.c.event = cs::RDMA_CM_EVENT_DISCONNECTED;
        }
        Notice::Cm(CmEvent::SidrRequest { id, from, req }) => {
            let header = CmaHeader::parse(&req.private_data);
            let child = new_child(i, id, from, header, None)?;
            e.c.listen_id = i.c();
            e.c.id = child.c();
            e.owner = child as *const Id as usize;
            e.c.event = cs::RDMA_CM_EVENT_CONNECT_REQUEST;
            let data = req.private_data.get(CMA_HEADER_LEN..).unwrap_or(&[]);
            let peer = child.state().remote.map(|r| r.ip());
            ud_param(&mut e, child, data, peer, 0, 0);
        }
        Notice::Cm(CmEvent::SidrReply { rep, .. }) => {
            let ok = rep.status == sidr_status::VALID && rep.qkey == cs::RDMA_UDP_QKEY;
            if ok {
                e.c.event = cs::RDMA_CM_EVENT_ESTABLISHED;
            } else {
                e.c.event = cs::RDMA_CM_EVENT_UNREACHABLE;
                e.c.status = if rep.status != sidr_status::VALID {
                    i32::from(rep.status)
                } else {
                    -libc::EINVAL
                };
            }
            let peer = i.state().remote.map(|r| r.ip());
            ud_param(&mut e, i, &rep.private_data, peer, rep.qpn, rep.qkey);
        }
    }
    Some(e)
}

/// The passive side's QP setup for the REQ it took, answered with `params`.
fn passive_setup(
    ctx: &Context,
    (req, from): &(Box<Req>, IpAddr),
    local: IpAddr,
    params: &AcceptParams,
) -> QpSetup {
    let mtu = ctx.nic.query_port().active_mtu;
    QpSetup::passive(req, *from, local, params, mtu)
}

/// What `rdma_init_qp_attr` answers from: the setup the REQ and REP (or
/// the accept) settled, or on the passive side before the accept, the one
/// the REQ and the id's defaults give (the kernel's CM computes it from
/// the REQ alone, and a program may move its QP before accepting).
fn setup_of(i: &Id) -> Result<Option<QpSetup>, i32> {
    let st = i.state();
    if let Some(s) = st.setup {
        return Ok(Some(s));
    }
    let (Some(incoming), Some(local)) = (st.incoming.as_ref(), st.local) else {
        return Ok(None);
    };
    let params = AcceptParams {
        qpn: 0,
        starting_psn: st.psn,
        responder_resources: st.responder_resources.min(device_rd_atomic()),
        initiator_depth: st.initiator_depth.min(device_rd_atomic()),
        rnr_retry_count: 7,
        private_data: Vec::new(),
    };
    let ctx = context(st.ctx as *mut sys::ibv_context)?;
    Ok(Some(passive_setup(ctx, incoming, local.ip(), &params)))
}

/// Fill an event's UD parameters: private data, the address handle
/// attributes to reach `peer` from the id's address, its QP and Q_Key.
fn ud_param(e: &mut Event, i: &Id, data: &[u8], peer: Option<IpAddr>, qpn: u32, qkey: u32) {
    let n = data.len().min(e.private.len());
    e.private[..n].copy_from_slice(&data[..n]);
    let local = i.state().local.map(|l| l.ip());
    let ctx = i.ctx().ok();
    // SAFETY: the union's ud member, plain data.
    let p = unsafe { &mut *e.c.param.ud.as_mut() };
    p.private_data = e.private.as_ptr().cast();
    p.private_data_len = n as u8;
    if let Some(dest) = peer {
        let av = rnic_verbs::AddressVector {
            dest,
            src: local,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
        };
        p.ah_attr = crate::qp::c_ah_attr(ctx, &av);
    }
    p.qp_num = qpn;
    p.qkey = qkey;
}

/// Active side: the REP came. With a QP, take it to RTS and send the RTU
/// (librdmacm's `ucma_process_conn_resp`); without, leave both to the
/// program (`rdma_init_qp_attr`, `rdma_establish`).
fn reply(i: &Id, rep: &Rep) -> Result<(), i32> {
    let (req, local, remote, conn) = {
        let st = i.state();
        (
            st.req.clone().ok_or(libc::EINVAL)?,
            st.local.ok_or(libc::EINVAL)?,
            st.remote.ok_or(libc::EINVAL)?,
            st.conn.ok_or(libc::EINVAL)?,
        )
    };
    let setup = QpSetup::active(&req, rep, local.ip(), remote.ip());
    i.state().setup = Some(setup);
    // SAFETY: our C part.
    if unsafe { (*i.c()).qp }.is_null() {
        return Ok(());
    }
    let ctx = i.ctx()?;
    if let Err(e) = connect_qp(i, &setup) {
        qp_to_error(i);
        let _ = ctx.nic.cm_reject(conn, reason::CONSUMER_DEFINED, &[]);
        return Err(e);
    }
    // Marked before the RTU goes (see `rdma_establish`): this REP is
    // reported as ESTABLISHED, the CM's own ESTABLISHED for it is not.
    i.state().established = true;
    if let Err(e) = ctx.nic.cm_ready(conn) {
        i.state().established = false;
        return Err(errno_of(&e));
    }
    Ok(())
}

/// Passive side: a new id for a request (REQ or SIDR_REQ) that listener
/// `l` took, on the device it came to, its addresses from the rdma_cm
/// header (`local`, where given, from the REQ's path). A request that is
/// not rdma_cm's is refused.
fn new_child(
    l: &Id,
    conn: CmId,
    from: IpAddr,
    header: Option<CmaHeader>,
    local: Option<IpAddr>,
) -> Option<&'static Id> {
    let local_ip = header.map(|h| h.dst).or(local)?;
    let (ctx, pd) = device_of(local_ip).ok()?;
    let Some(h) = header else {
        // Not an rdma_cm request: nobody here can take it.
        if let Ok(c) = context(ctx) {
            let _ = c.nic.cm_reject(conn, reason::CONSUMER_DEFINED, &[]);
        }
        return None;
    };
    let (port, sync) = {
        let st = l.state();
        (st.local.map_or(0, |a| a.port()), st.own_channel.is_some())
    };
    // SAFETY: the listener's C part.
    let lc = unsafe { &*l.c() };
    let channel = if sync {
        std::ptr::null_mut()
    } else {
        lc.channel
    };
    let p = create_id(channel, lc.context, lc.ps, lc.qp_type).ok()?;
    let child = id_of(p).ok()?;
    set_device(child, ctx, pd);
    set_route_addrs(
        child,
        Some(SocketAddr::new(local_ip, port)),
        Some(SocketAddr::new(from, h.src_port)),
    );
    {
        let mut st = child.state();
        st.conn = Some(conn);
        st.ctx = ctx as usize;
    }
    Some(child)
}

/// Passive side: a REQ for listener `l`: a new id for it (see
/// [`new_child`]), with a QP if the listener was made with QP attributes.
fn accept_request(l: &Id, conn: CmId, from: IpAddr, req: &Req) -> Option<&'static Id> {
    let g = req.primary.remote_gid;
    let path_local = g.to_ipv4_mapped().map_or(IpAddr::V6(g), IpAddr::V4);
    let header = CmaHeader::parse(&req.private_data);
    let child = new_child(l, conn, from, header, Some(path_local))?;
    let qp_init = l.state().qp_init_attr.clone();
    {
        let mut st = child.state();
        st.incoming = Some((Box::new(*req), from));
        // As the kernel sees it from this side.
        st.responder_resources = req.initiator_depth;
        st.initiator_depth = req.responder_resources;
    }
    if let Some(attr) = qp_init {
        // SAFETY: the listener's C part.
        let mut ex = crate::qp::init_attr_ex(&attr, unsafe { (*l.c()).pd });
        if create_qp(child, &mut ex).is_err() {
            if let Ok(c) = child.ctx() {
                let _ = c.nic.cm_reject(conn, reason::CONSUMER_DEFINED, &[]);
            }
            return None;
        }
    }
    Some(child)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut cs::rdma_event_channel,
    event: *mut *mut cs::rdma_cm_event,
) -> c_int {
    call(|| {
        // SAFETY: the program's channel and out-parameter.
        let (ch, out) = unsafe { (Channel::from_c(channel)?, ffi::out(event)?) };
        loop {
            let n = match ch.ch.read() {
                Ok(n) => n,
                Err(rnic_verbs::Error::Timeout) => return Err(libc::EAGAIN),
                Err(e) => return Err(errno_of(&e)),
            };
            let Some(e) = translate(n) else { continue };
            let owner = e.owner;
            // SAFETY: the event's id is alive (it was registered, and
            // rdma_destroy_id waits for this event's acknowledgement).
            let id = unsafe { &*(owner as *const Id) };
            lock(&id.events).0 += 1;
            let mut e = *e;
            e.magic = 0;
            *out = e.into_c();
            return Ok(());
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut cs::rdma_cm_event) -> c_int {
    call(|| {
        // SAFETY: the program's event, not used afterwards.
        let e = unsafe { ffi::free::<Event>(event) }.ok_or(libc::EINVAL)?;
        // SAFETY: the owner waits for this acknowledgement before it goes.
        let id = unsafe { &*(e.owner as *const Id) };
        lock(&id.events).1 += 1;
        id.acked.notify_all();
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_event_str(event: cs::rdma_cm_event_type) -> *const c_char {
    let s: &'static CStr = match event {
        cs::RDMA_CM_EVENT_ADDR_RESOLVED => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        cs::RDMA_CM_EVENT_ADDR_ERROR => c"RDMA_CM_EVENT_ADDR_ERROR",
        cs::RDMA_CM_EVENT_ROUTE_RESOLVED => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        cs::RDMA_CM_EVENT_ROUTE_ERROR => c"RDMA_CM_EVENT_ROUTE_ERROR",
        cs::RDMA_CM_EVENT_CONNECT_REQUEST => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        cs::RDMA_CM_EVENT_CONNECT_RESPONSE => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        cs::RDMA_CM_EVENT_CONNECT_ERROR => c"RDMA_CM_EVENT_CONNECT_ERROR",
        cs::RDMA_CM_EVENT_UNREACHABLE => c"RDMA_CM_EVENT_UNREACHABLE",
        cs::RDMA_CM_EVENT_REJECTED => c"RDMA_CM_EVENT_REJECTED",
        cs::RDMA_CM_EVENT_ESTABLISHED => c"RDMA_CM_EVENT_ESTABLISHED",
        cs::RDMA_CM_EVENT_DISCONNECTED => c"RDMA_CM_EVENT_DISCONNECTED",
        cs::RDMA_CM_EVENT_DEVICE_REMOVAL => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        cs::RDMA_CM_EVENT_MULTICAST_JOIN => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        cs::RDMA_CM_EVENT_MULTICAST_ERROR => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        cs::RDMA_CM_EVENT_ADDR_CHANGE => c"RDMA_CM_EVENT_ADDR_CHANGE",
        cs::RDMA_CM_EVENT_TIMEWAIT_EXIT => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut cs::rdma_cm_id,
    channel: *mut cs::rdma_event_channel,
) -> c_int {
    call(|| {
        let i = id_of(id)?;
        let (c, own) = if channel.is_null() {
            let c = new_channel()?;
            (c, Some(c as usize))
        } else {
            (channel, None)
        };
        // SAFETY: the program's channel, or ours.
        let ch = unsafe { Channel::from_c(c)? }.ch.clone();
        // A synchronous id holds the event its last call waited for (see
        // `complete`): it goes now, as librdmacm's does, or the wait below
        // would never end (libfabric's verbs provider migrates the id it
        // resolved synchronously).
        if i.sync() {
            // SAFETY: our C part.
            let c = unsafe { &mut *i.c() };
            if !c.event.is_null() {
                // SAFETY: the event handed to the id before.
                unsafe { rdma_ack_cm_event(c.event) };
                c.event = std::ptr::null_mut();
            }
        }
        // Events of the old channel handed out must be acknowledged first.
        let mut ev = lock(&i.events);
        while ev.1 < ev.0 {
            ev = i.acked.wait(ev).unwrap_or_else(|e| e.into_inner());
        }
        drop(ev);
        let (conn, listening, ctx, old_own) = {
            let mut st = i.state();
            st.channel = Some(ch.clone());
            let old = std::mem::replace(&mut st.own_channel, own);
            (st.conn, st.listening.clone(), st.ctx, old)
        };
        if let (Some(conn), Ok(cx)) = (conn, context(ctx as *mut sys::ibv_context)) {
            cx.nic
                .cm_reroute(conn, &ch, i.serial)
                .map_err(|e| errno_of(&e))?;
        }
        for (ctx, service, backlog) in listening {
            let cx = context(ctx as *mut sys::ibv_context)?;
            let _ = cx.nic.cm_unlisten(service);
            cx.nic
                .cm_listen(service, backlog, &ch, i.serial)
                .map_err(|e| errno_of(&e))?;
        }
        // SAFETY: our C part.
        unsafe { (*i.c()).channel = c };
        if let Some(old) = old_own {
            // SAFETY: the channel this library made for the id.
            unsafe { rdma_destroy_event_channel(old as *mut cs::rdma_event_channel) };
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut cs::rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    call(|| {
        let i = id_of(id)?;
        if optval.is_null() {
            return Err(libc::EINVAL);
        }
        const OPTION_ID: c_int = 0;
        const OPTION_IB: c_int = 1;
        const ID_TOS: c_int = 0;
        const ID_REUSEADDR: c_int = 1;
        const ID_AFONLY: c_int = 2;
        const ID_ACK_TIMEOUT: c_int = 3;
        match (level, optname) {
            (OPTION_ID, ID_TOS | ID_REUSEADDR | ID_AFONLY) => Ok(()),
            (OPTION_ID, ID_ACK_TIMEOUT) if optlen >= 1 => {
                // SAFETY: the program's value, at least a byte.
                let t = unsafe { *optval.cast::<u8>() };
                i.state().ack_timeout = Some(t.min(31));
                Ok(())
            }
            (OPTION_IB, _) => Ok(()),
            _ => Err(libc::ENOSYS),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut cs::rdma_cm_id) -> u16 {
    id_of(id)
        .ok()
        .and_then(|i| i.state().local)
        .map_or(0, |a| a.port().to_be())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut cs::rdma_cm_id) -> u16 {
    id_of(id)
        .ok()
        .and_then(|i| i.state().remote)
        .map_or(0, |a| a.port().to_be())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut sys::ibv_context {
    ffi::ptr_call(|| {
        let d = all_devices()?;
        // SAFETY: calloc of n+1 pointers; freed by rdma_free_devices.
        let list = unsafe { libc::calloc(d.len() + 1, std::mem::size_of::<usize>()) }
            .cast::<*mut sys::ibv_context>();
        if list.is_null() {
            return Err(libc::ENOMEM);
        }
        for (k, (ctx, _)) in d.iter().enumerate() {
            // SAFETY: k < n+1.
            unsafe { *list.add(k) = *ctx };
        }
        if !num_devices.is_null() {
            // SAFETY: the program's out-parameter.
            unsafe { *num_devices = d.len() as c_int };
        }
        Ok(list)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut sys::ibv_context) {
    // SAFETY: from rdma_get_devices (calloc), or null.
    unsafe { libc::free(list.cast()) };
}

// ---- rdma_getaddrinfo and the endpoint calls built on it ----

/// `malloc`ed copy of `len` bytes at `p` (freed by `rdma_freeaddrinfo`).
///
/// # Safety
/// `p` is readable for `len` bytes.
unsafe fn copy_out(p: *const c_void, len: usize) -> Result<*mut c_void, i32> {
    // SAFETY: a fresh allocation of `len` bytes, filled from `p`.
    unsafe {
        let q = libc::malloc(len.max(1));
        if q.is_null() {
            return Err(libc::ENOMEM);
        }
        std::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), len);
        Ok(q)
    }
}

/// As rdma-core's: the name service's first answer for `node` and
/// `service`, as an rdma_cm address (a passive one, `RAI_PASSIVE`, is
/// where to listen), its QP type and port space from the hints or the
/// socket type and protocol. Errors are getaddrinfo's (`EAI_*`), as
/// rdma-core returns them.
#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const cs::rdma_addrinfo,
    res: *mut *mut cs::rdma_addrinfo,
) -> c_int {
    // SAFETY: the program's hints, or null.
    let h: cs::rdma_addrinfo = unsafe { hints.as_ref() }.copied().unwrap_or_default();
    if (node.is_null() && service.is_null() && hints.is_null()) || res.is_null() {
        ffi::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: plain data.
    let rai = unsafe { libc::calloc(1, std::mem::size_of::<cs::rdma_addrinfo>()) }
        .cast::<cs::rdma_addrinfo>();
    if rai.is_null() {
        ffi::set_errno(libc::ENOMEM);
        return -1;
    }
    // SAFETY: the zeroed struct just allocated.
    let r = unsafe { &mut *rai };
    if node.is_null() && service.is_null() {
        r.ai_flags = h.ai_flags;
        r.ai_family = h.ai_family;
        r.ai_qp_type = h.ai_qp_type;
        r.ai_port_space = h.ai_port_space;
        if h.ai_dst_len > 0 && !h.ai_dst_addr.is_null() {
            // SAFETY: the hints' address, of the length they say.
            match unsafe { copy_out(h.ai_dst_addr.cast(), h.ai_dst_len as usize) } {
                Ok(p) => {
                    r.ai_dst_addr = p.cast();
                    r.ai_dst_len = h.ai_dst_len;
                }
                Err(e) => {
                    // SAFETY: ours.
                    unsafe { rdma_freeaddrinfo(rai) };
                    ffi::set_errno(e);
                    return -1;
                }
            }
        }
    } else {
        // SAFETY: plain data.
        let mut ai_hints: libc::addrinfo = unsafe { std::mem::zeroed() };
        if h.ai_flags & cs::RAI_PASSIVE as c_int != 0 {
            ai_hints.ai_flags = libc::AI_PASSIVE;
        }
        if h.ai_flags & cs::RAI_NUMERICHOST as c_int != 0 {
            ai_hints.ai_flags |= libc::AI_NUMERICHOST;
        }
        ai_hints.ai_family = h.ai_family;
        ai_hints.ai_socktype = match h.ai_qp_type as u32 {
            sys::IBV_QPT_UD => libc::SOCK_DGRAM,
            0 => 0,
            _ => libc::SOCK_STREAM,
        };
        ai_hints.ai_protocol = match h.ai_port_space as u32 {
            cs::RDMA_PS_TCP => libc::IPPROTO_TCP,
            cs::RDMA_PS_UDP | cs::RDMA_PS_IPOIB => libc::IPPROTO_UDP,
            _ => 0,
        };
        let mut ai: *mut libc::addrinfo = std::ptr::null_mut();
        let use_hints = if hints.is_null() {
            std::ptr::null()
        } else {
            &ai_hints as *const libc::addrinfo
        };
        // SAFETY: the program's strings (or null) and our hints.
        let ret = unsafe { libc::getaddrinfo(node, service, use_hints, &mut ai) };
        if ret != 0 {
            // SAFETY: ours.
            unsafe { rdma_freeaddrinfo(rai) };
            return ret;
        }
        // SAFETY: getaddrinfo's first answer.
        let a = unsafe { &*ai };
        r.ai_qp_type = if h.ai_qp_type != 0 {
            h.ai_qp_type
        } else if a.ai_socktype == libc::SOCK_DGRAM {
            sys::IBV_QPT_UD as c_int
        } else {
            sys::IBV_QPT_RC as c_int
        };
        r.ai_port_space = if h.ai_port_space != 0 {
            h.ai_port_space
        } else if a.ai_protocol == libc::IPPROTO_UDP {
            cs::RDMA_PS_UDP as c_int
        } else {
            cs::RDMA_PS_TCP as c_int
        };
        r.ai_family = a.ai_family;
        // SAFETY: getaddrinfo's address, of the length it says.
        let copied = unsafe { copy_out(a.ai_addr.cast(), a.ai_addrlen as usize) };
        let passive = a.ai_flags & libc::AI_PASSIVE != 0;
        // SAFETY: getaddrinfo's list, freed once.
        unsafe { libc::freeaddrinfo(ai) };
        match copied {
            Ok(p) if passive => {
                r.ai_flags = cs::RAI_PASSIVE as c_int;
                r.ai_src_addr = p.cast();
                r.ai_src_len = a.ai_addrlen;
            }
            Ok(p) => {
                r.ai_dst_addr = p.cast();
                r.ai_dst_len = a.ai_addrlen;
            }
            Err(e) => {
                // SAFETY: ours.
                unsafe { rdma_freeaddrinfo(rai) };
                ffi::set_errno(e);
                return -1;
            }
        }
    }
    if r.ai_src_len == 0 && h.ai_src_len > 0 && !h.ai_src_addr.is_null() {
        // SAFETY: the hints' address, of the length they say.
        if let Ok(p) = unsafe { copy_out(h.ai_src_addr.cast(), h.ai_src_len as usize) } {
            r.ai_src_addr = p.cast();
            r.ai_src_len = h.ai_src_len;
        }
    }
    // SAFETY: the program's out-parameter, checked non-null.
    unsafe { *res = rai };
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut cs::rdma_addrinfo) {
    let mut next = res;
    while !next.is_null() {
        // SAFETY: a list rdma_getaddrinfo made with malloc and calloc.
        unsafe {
            let r = &*next;
            let after = r.ai_next;
            for p in [
                r.ai_connect,
                r.ai_route,
                r.ai_src_canonname.cast(),
                r.ai_dst_canonname.cast(),
                r.ai_src_addr.cast(),
                r.ai_dst_addr.cast(),
            ] {
                libc::free(p);
            }
            libc::free(next.cast());
            next = after;
        }
    }
}

/// As rdma-core's: a synchronous id for `res`, bound for a passive one,
/// resolved (address and route) for an active one, with a QP if
/// `qp_init_attr` is given (for a passive one, each request's id gets one
/// in `rdma_get_request`).
#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut cs::rdma_cm_id,
    res: *mut cs::rdma_addrinfo,
    pd: *mut sys::ibv_pd,
    qp_init_attr: *mut sys::ibv_qp_init_attr,
) -> c_int {
    call(|| {
        // SAFETY: the program's pointers.
        let (out, r) = unsafe { (ffi::out(id)?, ffi::input(res)?) };
        let ps = match r.ai_port_space {
            0 => cs::RDMA_PS_TCP,
            p => p as u32,
        };
        let qp_type = match r.ai_qp_type {
            0 => sys::IBV_QPT_RC,
            t => t as u32,
        };
        let p = create_id(std::ptr::null_mut(), std::ptr::null_mut(), ps, qp_type)?;
        let i = id_of(p)?;
        let undo = |e: i32| {
            // SAFETY: the id just made.
            unsafe { rdma_destroy_id(p) };
            e
        };
        if r.ai_flags & cs::RAI_PASSIVE as c_int != 0 {
            // SAFETY: the program's address.
            let at = unsafe { read_sockaddr(r.ai_src_addr.cast()) }.ok_or(libc::EINVAL);
            at.and_then(|at| bind(i, at)).map_err(undo)?;
            if !qp_init_attr.is_null() {
                // SAFETY: the program's attributes.
                let mut a = unsafe { *qp_init_attr };
                a.qp_type = qp_type;
                i.state().qp_init_attr = Some(Box::new(a));
            }
            if !pd.is_null() {
                // SAFETY: our C part.
                unsafe { (*i.c()).pd = pd };
            }
        } else {
            // SAFETY: the addresses of the program's rdma_addrinfo.
            let ret = unsafe {
                let r2 = rdma_resolve_addr(p, r.ai_src_addr, r.ai_dst_addr, 2000);
                if r2 == 0 {
                    rdma_resolve_route(p, 2000)
                } else {
                    r2
                }
            };
            if ret != 0 {
                return Err(undo(ffi::errno()));
            }
            if !pd.is_null() {
                // SAFETY: our C part.
                unsafe { (*i.c()).pd = pd };
            }
            if !qp_init_attr.is_null() {
                // SAFETY: the program's attributes.
                let ret = unsafe {
                    (*qp_init_attr).qp_type = qp_type;
                    rdma_create_qp(p, pd, qp_init_attr)
                };
                if ret != 0 {
                    return Err(undo(ffi::errno()));
                }
            }
        }
        *out = p;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut cs::rdma_cm_id) {
    // SAFETY: the program's id.
    unsafe {
        rdma_destroy_qp(id);
        rdma_destroy_id(id);
    }
}

/// As rdma-core's: on a synchronous listener, wait for the next connection
/// request and hand out its id (with a QP if the listener was made with
/// QP attributes).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut cs::rdma_cm_id,
    id: *mut *mut cs::rdma_cm_id,
) -> c_int {
    call(|| {
        let l = id_of(listen)?;
        // SAFETY: the program's out-parameter.
        let out = unsafe { ffi::out(id)? };
        if !l.sync() {
            return Err(libc::EINVAL);
        }
        let e = next_own_event(l)?;
        // SAFETY: our C part.
        let lc = unsafe { &mut *l.c() };
        // SAFETY: the event just taken.
        let ev = unsafe { &*e };
        if ev.event != cs::RDMA_CM_EVENT_CONNECT_REQUEST || ev.status != 0 {
            lc.event = e;
            return Err(match (ev.event, ev.status) {
                (cs::RDMA_CM_EVENT_REJECTED, _) => libc::ECONNREFUSED,
                (_, s) if s < 0 => -s,
                (_, 0) => libc::EINVAL,
                (_, s) => s,
            });
        }
        // SAFETY: the new id, made for the request.
        unsafe { (*ev.id).event = e };
        *out = ev.id;
        Ok(())
    })
}
