//! Devices and contexts: the device list (`RNIC_DEVICES`), `ibv_open_device`
//! and the queries (`ibv_query_device`, `ibv_query_port`, `ibv_query_gid`).
//!
//! By default a process sees one device, `rnic0`, which opens on the first
//! free loopback address (or `RNIC_ADDR`), or with `RNIC_IFACE=IF` on that
//! network interface's IPv4 address with the frame transport (to talk to
//! rdma_rxe or a hardware NIC). `RNIC_DEVICES=NAME=ADDR,...`
//! names the devices instead, in order. A device's NIC (its engine and UDP
//! socket) starts at its first `ibv_open_device` and is shared by every
//! context opened on it, so two QPs of one device connect to each other.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicPtr, Ordering};

use parking_lot::Mutex;
use rnic_verbs::{AsyncEventQueue, Device, Mtu, DEVICE_ATTR};

use crate::ffi::{self, object, Object};
use crate::sys;

/// The port's link: what `ibv_query_port` reports and sysfs shows.
pub struct PortLink {
    /// `active_width`: 2 is 4X.
    pub width: u8,
    /// `active_speed`: 32 is EDR, 25 Gb/s per lane.
    pub speed: u8,
    /// The same, as `/sys/class/infiniband/*/ports/1/rate` reads.
    pub rate: &'static str,
}

/// 4X EDR, as rdma_rxe reports.
pub const PORT_LINK: PortLink = PortLink {
    width: 2,
    speed: 32,
    rate: "100 Gb/sec (4X EDR)",
};

/// One entry of `RNIC_DEVICES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// The device's name (`ibv_get_device_name`).
    pub name: String,
    /// Its address; `None` for the default device (first free loopback
    /// address, or `RNIC_ADDR`).
    pub addr: Option<IpAddr>,
}

/// Parse `RNIC_DEVICES`: `NAME=ADDR` entries separated by commas. The error
/// names the variable and the bad part.
pub fn parse_devices(value: &str) -> Result<Vec<DeviceSpec>, String> {
    let bad = |why: String| format!("RNIC_DEVICES={value:?}: {why}");
    let mut out: Vec<DeviceSpec> = Vec::new();
    for entry in value.split(',') {
        let entry = entry.trim();
        let Some((name, addr)) = entry.split_once('=') else {
            return Err(bad(format!("{entry:?} is not NAME=ADDR")));
        };
        let name = name.trim();
        if name.is_empty()
            || name.len() > 63
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        {
            return Err(bad(format!(
                "{name:?} is not a device name (1-63 letters, digits, '_', '-', '.')"
            )));
        }
        let addr: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| bad(format!("{:?} is not an IPv4 or IPv6 address", addr.trim())))?;
        if out.iter().any(|d| d.name == name) {
            return Err(bad(format!("{name:?} is named twice")));
        }
        out.push(DeviceSpec {
            name: name.to_string(),
            addr: Some(addr),
        });
    }
    Ok(out)
}

/// A device of the list: the `ibv_device` programs see, and its NIC once
/// opened.
#[repr(C)]
pub(crate) struct Slot {
    c: sys::ibv_device,
    pub spec: DeviceSpec,
    pub index: usize,
    nic: Mutex<Option<Device>>,
}

// SAFETY: the C struct holds only plain data (names and paths); the rest is
// Send + Sync on its own.
unsafe impl Sync for Slot {}
// SAFETY: as above.
unsafe impl Send for Slot {}

fn copy_str(dst: &mut [c_char], s: &str) {
    let room = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
        *d = b as c_char;
    }
}

impl Slot {
    fn new(spec: DeviceSpec, index: usize) -> Slot {
        // SAFETY: ibv_device is plain data; all zeros is a valid value.
        let mut c: sys::ibv_device = unsafe { std::mem::zeroed() };
        c.node_type = sys::IBV_NODE_CA;
        c.transport_type = sys::IBV_TRANSPORT_IB;
        copy_str(&mut c.name, &spec.name);
        copy_str(&mut c.dev_name, &format!("uverbs{index}"));
        copy_str(
            &mut c.dev_path,
            &format!("/sys/class/infiniband_verbs/uverbs{index}"),
        );
        copy_str(
            &mut c.ibdev_path,
            &format!("/sys/class/infiniband/{}", spec.name),
        );
        Slot {
            c,
            spec,
            index,
            nic: Mutex::new(None),
        }
    }

    /// The device's NIC, started on first use.
    pub fn nic(&self) -> Result<Device, i32> {
        let mut nic = self.nic.lock();
        if let Some(d) = &*nic {
            return Ok(d.clone());
        }
        // The default device runs on RNIC_IFACE with the frame transport,
        // if set (see rnic_verbs::frames), else on a loopback address.
        let d = rnic_verbs::Config::from_env()
            .and_then(|config| match (self.spec.addr, &config.iface) {
                (Some(a), _) => Device::open_with(a, &config),
                (None, Some(i)) => Device::open_on_interface_with(i, &config),
                (None, None) => Device::open_loopback_with(&config),
            })
            .map_err(|e| {
                eprintln!("rnic: cannot open {}: {e}", self.spec.name);
                ffi::errno_of(&e)
            })?;
        *nic = Some(d.clone());
        Ok(d)
    }

    /// The node GUID (see [`guid_of`]) of the address the NIC has or will
    /// have: one value for the device's life, whether asked before or
    /// after it opens. Only a default device with no address to be had
    /// (every loopback address taken, or an interface that is gone) has
    /// one made from its index, and cannot open.
    fn guid(&self) -> u64 {
        let addr = self
            .nic
            .lock()
            .as_ref()
            .map(Device::addr)
            .or(self.spec.addr)
            .or_else(|| {
                let iface = rnic_verbs::Config::from_env().ok()?.iface?;
                Some(rnic_verbs::frames::Interface::find(&iface).ok()?.addr())
            });
        match addr {
            Some(a) => guid_of(a),
            None => u64::from_ne_bytes([0x02, 0, 0, 0xFF, 0xFE, 0, 0, self.index as u8 + 1]),
        }
    }
}

/// The LID of a port on `addr`. RoCE has none on the wire; rnic gives
/// loopback devices 127.0.0.x the LID x so that programs which address a
/// peer by LID alone (ibv_rc_pingpong without -g) work on one host; any
/// other address has LID 0, as a RoCE port does.
pub fn lid_of(addr: IpAddr) -> u16 {
    match addr {
        IpAddr::V4(a) if a.octets()[..3] == [127, 0, 0] => u16::from(a.octets()[3]),
        _ => 0,
    }
}

/// The port capability flags (`port_cap_flags`, sysfs's `cap_mask`): a
/// connection manager and IP-based GIDs, as a RoCE port of rdma_rxe.
pub const PORT_CAP_FLAGS: u32 = sys::IBV_PORT_CM_SUP | sys::IBV_PORT_IP_BASED_GIDS;

/// The node GUID of a device on `addr`: the address in EUI-64 form, as a RoCE
/// NIC derives it from its MAC address (network byte order).
pub fn guid_of(addr: IpAddr) -> u64 {
    u64::from_ne_bytes(rnic_core::device::node_guid_bytes(addr))
}

/// The network interface `addr` is on (its name and index): the one holding
/// an address whose prefix covers it, as the kernel would route a RoCE
/// packet from it. `None` if no interface does.
pub fn netdev_of(addr: IpAddr) -> Option<(String, u32)> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list`, freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut found = None;
    let mut p = list;
    while !p.is_null() && found.is_none() {
        // SAFETY: an entry of the list getifaddrs made.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        // SAFETY: null or a sockaddr of the family it names.
        let (Some(a), Some(m)) = (unsafe { sockaddr_ip(ifa.ifa_addr) }, unsafe {
            sockaddr_ip(ifa.ifa_netmask)
        }) else {
            continue;
        };
        let covers = match (a, m, addr) {
            (IpAddr::V4(a), IpAddr::V4(m), IpAddr::V4(x)) => {
                u32::from(a) & u32::from(m) == u32::from(x) & u32::from(m)
            }
            (IpAddr::V6(a), IpAddr::V6(m), IpAddr::V6(x)) => {
                u128::from(a) & u128::from(m) == u128::from(x) & u128::from(m)
            }
            _ => false,
        };
        if covers {
            // SAFETY: the interface's NUL-terminated name.
            let name = unsafe { CStr::from_ptr(ifa.ifa_name) };
            // SAFETY: as above.
            let index = unsafe { libc::if_nametoindex(ifa.ifa_name) };
            found = Some((name.to_string_lossy().into_owned(), index));
        }
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(list) };
    found
}

/// # Safety
/// `sa` is null or points to a socket address of the family it names.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller's promise; the family says which struct it is.
    match i32::from(unsafe { (*sa).sa_family }) {
        libc::AF_INET => {
            // SAFETY: AF_INET: a sockaddr_in.
            let v4 = unsafe { &*sa.cast::<libc::sockaddr_in>() };
            Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr))))
        }
        libc::AF_INET6 => {
            // SAFETY: AF_INET6: a sockaddr_in6.
            let v6 = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
            Some(IpAddr::V6(std::net::Ipv6Addr::from(v6.sin6_addr.s6_addr)))
        }
        _ => None,
    }
}

/// `RNIC_LOG` (a tracing filter, as for the `rnic` tool: `rnic_verbs=debug`
/// says what the engine decides, `=trace` every packet) for a C program:
/// printed to its stderr. Set up once, before the first device; left alone
/// if the process has a subscriber already (a Rust program using this
/// library).
fn log_to_stderr() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("RNIC_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .try_init();
        }
    });
}

/// The process's devices, read from the environment once.
fn devices() -> Result<&'static [Slot], String> {
    ffi::watch_forks();
    log_to_stderr();
    type Table = (u64, Result<Vec<Slot>, String>);
    // The table of this fork generation. A forked child builds its own (the
    // parent's NICs have no engine threads in it) and leaves the parent's
    // in place, unused, for the inherited objects that point into it.
    static DEVICES: AtomicPtr<Table> = AtomicPtr::new(std::ptr::null_mut());
    let generation = ffi::generation();
    let mut current = DEVICES.load(Ordering::Acquire);
    // SAFETY: a non-null pointer here came from Box::leak below and is
    // never freed.
    if current.is_null() || unsafe { (*current).0 } != generation {
        let table: &'static mut Table = Box::leak(Box::new((generation, read_devices())));
        match DEVICES.compare_exchange(current, table, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => current = table,
            // Another thread built it first: use that one (ours stays
            // leaked; this happens at most once per thread and generation).
            Err(theirs) => current = theirs,
        }
    }
    // SAFETY: as above.
    let table: &'static Table = unsafe { &*current };
    table.1.as_deref().map_err(Clone::clone)
}

fn read_devices() -> Result<Vec<Slot>, String> {
    let specs = match std::env::var("RNIC_DEVICES") {
        Ok(v) => parse_devices(&v)?,
        Err(std::env::VarError::NotUnicode(v)) => {
            return Err(format!("RNIC_DEVICES={v:?}: not UTF-8"))
        }
        Err(std::env::VarError::NotPresent) => {
            let config = rnic_verbs::Config::from_env().map_err(|e| e.to_string())?;
            // The default device's address is settled now, as a real
            // port's is before anything opens it, so that its GUID and GID
            // never change: RNIC_ADDR, a loopback address claimed for it
            // (the NIC takes the claim over when it opens), or, on
            // RNIC_IFACE, the interface's (see Slot::guid).
            let addr = match (config.addr, &config.iface) {
                (Some(a), _) => Some(a),
                (None, Some(_)) => None,
                (None, None) => rnic_verbs::reserve_loopback().ok(),
            };
            vec![DeviceSpec {
                name: "rnic0".into(),
                addr,
            }]
        }
    };
    Ok(specs
        .into_iter()
        .enumerate()
        .map(|(i, s)| Slot::new(s, i))
        .collect())
}

fn slot_of(dev: *mut sys::ibv_device) -> Option<&'static Slot> {
    devices()
        .ok()?
        .iter()
        .find(|s| std::ptr::eq(&s.c, dev.cast_const()))
}

/// Completion vectors per device: rnic's engine is one.
pub(crate) const COMP_VECTORS: c_int = 1;

/// An open device (`struct ibv_context`, inside its `struct verbs_context`).
#[repr(C)]
pub(crate) struct Context {
    v: sys::verbs_context,
    magic: u64,
    pub nic: Device,
    pub slot: &'static Slot,
    pub events: AsyncEventQueue,
    /// `cmd_fd`: a real descriptor (programs dup it to share a context with
    /// another process, which rnic does not offer: `ibv_import_device`
    /// says so), closed with the context.
    cmd: OwnedFd,
    /// C objects by the numbers asynchronous events carry.
    pub objects: Mutex<Objects>,
    /// Bytes of device memory allocated (`ibv_alloc_dm`), out of
    /// `dm::MAX_DM_SIZE`.
    pub dm_used: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// What `ibv_get_async_event` needs to name an event's object.
#[derive(Default)]
pub(crate) struct Objects {
    pub qps: HashMap<u32, usize>,
    pub srqs: HashMap<u32, usize>,
    pub cqs: HashMap<u32, usize>,
}

object!(
    Context,
    sys::ibv_context,
    b"rnic-ctx",
    std::mem::offset_of!(sys::verbs_context, context),
    v
);

// SAFETY: the C part is only read by the program and written at creation;
// the Rust parts are Sync.
unsafe impl Sync for Context {}
// SAFETY: as above.
unsafe impl Send for Context {}

impl Context {
    /// The pointer the program knows it by.
    pub fn as_c(&self) -> *mut sys::ibv_context {
        (&self.v.context as *const sys::ibv_context).cast_mut()
    }

    /// The port's LID (see [`lid_of`]).
    pub fn lid(&self) -> u16 {
        lid_of(self.nic.addr())
    }

    /// The address behind a LID (see `lid`).
    pub fn addr_of_lid(&self, lid: u16) -> Option<IpAddr> {
        (self.lid() != 0 && (1..=254).contains(&lid))
            .then(|| IpAddr::V4(Ipv4Addr::new(127, 0, 0, lid as u8)))
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut sys::ibv_device {
    ffi::ptr_call(|| {
        let devs = devices().map_err(|e| {
            eprintln!("rnic: {e}");
            libc::EINVAL
        })?;
        // SAFETY: calloc of n+1 pointers; freed by ibv_free_device_list.
        let list =
            unsafe { libc::calloc(devs.len() + 1, std::mem::size_of::<*mut sys::ibv_device>()) }
                .cast::<*mut sys::ibv_device>();
        if list.is_null() {
            return Err(libc::ENOMEM);
        }
        for (i, s) in devs.iter().enumerate() {
            // SAFETY: i < n+1 entries allocated.
            unsafe { *list.add(i) = (&s.c as *const sys::ibv_device).cast_mut() };
        }
        if !num_devices.is_null() {
            // SAFETY: the program's out-parameter.
            unsafe { *num_devices = devs.len() as c_int };
        }
        Ok(list)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut sys::ibv_device) {
    // SAFETY: allocated by ibv_get_device_list with calloc (or null).
    unsafe { libc::free(list.cast()) };
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut sys::ibv_device) -> *const c_char {
    match slot_of(dev) {
        Some(s) => s.c.name.as_ptr(),
        None => std::ptr::null(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(dev: *mut sys::ibv_device) -> u64 {
    slot_of(dev).map_or(0, Slot::guid)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(dev: *mut sys::ibv_device) -> c_int {
    slot_of(dev).map_or(-1, |s| s.index as c_int)
}

/// The context operations: the data path's function pointers.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(dev: *mut sys::ibv_device) -> *mut sys::ibv_context {
    ffi::ptr_call(|| {
        let slot = slot_of(dev).ok_or(libc::ENODEV)?;
        let nic = slot.nic()?;
        let events = nic.async_event_queue().map_err(|e| ffi::errno_of(&e))?;
        // SAFETY: a C string literal and flags; the result is checked.
        let fd = unsafe { libc::memfd_create(c"rnic-context".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EMFILE));
        }
        // SAFETY: a descriptor just opened, owned by nothing else.
        let cmd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: verbs_context is plain data and function pointers, all
        // of which may be zero (null / None).
        let mut v: sys::verbs_context = unsafe { std::mem::zeroed() };
        crate::ops::fill(&mut v);
        v.context.device = dev;
        v.context.cmd_fd = cmd.as_raw_fd();
        v.context.async_fd = events.as_fd().as_raw_fd();
        v.context.num_comp_vectors = COMP_VECTORS;
        Ok(Context {
            v,
            magic: <Context as Object>::MAGIC,
            nic,
            slot,
            events,
            cmd,
            objects: Mutex::new(Objects::default()),
            dm_used: Default::default(),
        }
        .into_c())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut sys::ibv_context) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's context pointer.
        unsafe { ffi::free::<Context>(ctx) }.ok_or(libc::EINVAL)?;
        Ok(())
    })
}

fn device_attr(ctx: &Context) -> sys::ibv_device_attr {
    let a = DEVICE_ATTR;
    // SAFETY: plain data.
    let mut d: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
    copy_str(&mut d.fw_ver, env!("CARGO_PKG_VERSION"));
    // From the open device's address, without the slot's lock: a forked
    // child may query its parent's context (see query_device_ex).
    d.node_guid = guid_of(ctx.nic.addr());
    d.sys_image_guid = d.node_guid;
    d.max_mr_size = u64::MAX;
    d.page_size_cap = 0xFFFF_F000;
    d.vendor_id = 0xFFFFFF;
    d.vendor_part_id = 0x7269; // "ri"
    d.max_qp = a.max_qp as c_int;
    d.max_qp_wr = a.max_qp_wr as c_int;
    d.device_cap_flags = sys::IBV_DEVICE_RC_RNR_NAK_GEN
        | sys::IBV_DEVICE_MEM_WINDOW
        | sys::IBV_DEVICE_MEM_WINDOW_TYPE_2B
        | sys::IBV_DEVICE_SYS_IMAGE_GUID;
    d.max_sge = a.max_sge as c_int;
    d.max_sge_rd = a.max_sge as c_int;
    d.max_cq = 1 << 16;
    d.max_cqe = a.max_cqe as c_int;
    d.max_mr = 1 << 20;
    d.max_pd = 1 << 16;
    d.max_qp_rd_atom = c_int::from(a.max_qp_rd_atom);
    d.max_res_rd_atom = c_int::from(a.max_qp_rd_atom) * 1024;
    d.max_qp_init_rd_atom = c_int::from(a.max_qp_init_rd_atom);
    d.atomic_cap = sys::IBV_ATOMIC_HCA;
    d.max_mw = 1 << 16;
    d.max_ah = 1 << 16;
    d.max_srq = 1 << 16;
    d.max_srq_wr = a.max_qp_wr as c_int;
    d.max_srq_sge = a.max_sge as c_int;
    d.max_pkeys = 1;
    d.local_ca_ack_delay = 15;
    d.phys_port_cnt = 1;
    d
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_device_attr,
) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's pointers.
        let (ctx, attr) = unsafe { (Context::from_c(ctx)?, ffi::out(attr)?) };
        *attr = device_attr(ctx);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn query_device_ex(
    ctx: *mut sys::ibv_context,
    input: *const sys::ibv_query_device_ex_input,
    attr: *mut sys::ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    ffi::errno_call(|| {
        // The attributes are constants of the device: a forked child may ask
        // them of its parent's context (pyverbs' DM does, before allocating
        // device memory there).
        // SAFETY: the program's context.
        let ctx = unsafe { ffi::obj_inherited::<Context>(ctx) }.ok_or(libc::EINVAL)?;
        // SAFETY: the program's input, if any.
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return Err(libc::EINVAL);
        }
        if attr.is_null() || attr_size < std::mem::size_of::<sys::ibv_device_attr>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: plain data.
        let mut ex: sys::ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        ex.orig_attr = device_attr(ctx);
        ex.phys_port_cnt_ex = 1;
        ex.max_dm_size = crate::dm::MAX_DM_SIZE as u64;
        // rnic never pins: it reads and writes the program's memory where it
        // is, when a packet needs it. That is on-demand paging; the implicit
        // kind (the whole address space open to peers) is not offered.
        ex.odp_caps.general_caps = u64::from(sys::IBV_ODP_SUPPORT);
        let rc = sys::IBV_ODP_SUPPORT_SEND
            | sys::IBV_ODP_SUPPORT_RECV
            | sys::IBV_ODP_SUPPORT_WRITE
            | sys::IBV_ODP_SUPPORT_READ
            | sys::IBV_ODP_SUPPORT_ATOMIC
            | sys::IBV_ODP_SUPPORT_SRQ_RECV;
        ex.odp_caps.per_transport_caps.rc_odp_caps = rc;
        ex.odp_caps.per_transport_caps.uc_odp_caps =
            sys::IBV_ODP_SUPPORT_SEND | sys::IBV_ODP_SUPPORT_RECV | sys::IBV_ODP_SUPPORT_WRITE;
        ex.odp_caps.per_transport_caps.ud_odp_caps =
            sys::IBV_ODP_SUPPORT_SEND | sys::IBV_ODP_SUPPORT_RECV;
        // Completion timestamps in nanoseconds (a 1 GHz clock): when rnic
        // handed the completion to the poller (see cq.rs).
        ex.completion_timestamp_mask = u64::MAX;
        ex.hca_core_clock = 1_000_000; // kHz
                                       // SAFETY: the program has room for attr_size bytes.
        unsafe { ffi::copy_prefix(&ex, attr, attr_size) };
        Ok(())
    })
}

/// The clock completion timestamps are read on: nanoseconds of
/// CLOCK_MONOTONIC.
pub(crate) fn clock_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub(crate) unsafe extern "C" fn query_rt_values(
    ctx: *mut sys::ibv_context,
    values: *mut sys::ibv_values_ex,
) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's pointers.
        let (_, v) = unsafe { (Context::from_c(ctx)?, ffi::out(values)?) };
        if v.comp_mask & !sys::IBV_VALUES_MASK_RAW_CLOCK != 0 {
            return Err(libc::EINVAL);
        }
        let ns = clock_ns();
        v.raw_clock.tv_sec = (ns / 1_000_000_000) as _;
        v.raw_clock.tv_nsec = (ns % 1_000_000_000) as _;
        Ok(())
    })
}

/// XRC is not offered: say so, rather than leave a bare errno.
pub(crate) unsafe extern "C" fn open_xrcd(
    _ctx: *mut sys::ibv_context,
    _attr: *mut sys::ibv_xrcd_init_attr,
) -> *mut sys::ibv_xrcd {
    eprintln!("rnic: XRC is not supported (RC, UC and UD are)");
    ffi::set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

fn port_attr(ctx: &Context) -> sys::ibv_port_attr {
    let p = ctx.nic.query_port();
    // SAFETY: plain data.
    let mut a: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
    let code = |m: Mtu| m as u32 + 1;
    a.state = sys::IBV_PORT_ACTIVE;
    a.max_mtu = code(p.max_mtu);
    a.active_mtu = code(p.active_mtu);
    a.gid_tbl_len = p.gid_tbl_len as c_int;
    a.port_cap_flags = PORT_CAP_FLAGS;
    a.max_msg_sz = DEVICE_ATTR.max_msg_sz;
    a.pkey_tbl_len = 1;
    a.lid = ctx.lid();
    a.max_vl_num = 1;
    a.active_width = PORT_LINK.width;
    a.active_speed = PORT_LINK.speed;
    a.phys_state = 5; // LinkUp
    a.link_layer = sys::IBV_LINK_LAYER_ETHERNET as u8;
    a
}

pub(crate) unsafe extern "C" fn query_port(
    ctx: *mut sys::ibv_context,
    port_num: u8,
    attr: *mut sys::ibv_port_attr,
    attr_size: usize,
) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's context.
        let ctx = unsafe { Context::from_c(ctx)? };
        if port_num != 1 || attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program has room for attr_size bytes.
        unsafe { ffi::copy_prefix(&port_attr(ctx), attr, attr_size) };
        Ok(())
    })
}

/// The exported `ibv_query_port` takes the older, shorter struct (verbs.h's
/// inline wrapper calls it only when the context has no `query_port`).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    ctx: *mut sys::ibv_context,
    port_num: u8,
    attr: *mut sys::_compat_ibv_port_attr,
) -> c_int {
    // SAFETY: passed on; the compat struct is a prefix of ibv_port_attr.
    unsafe {
        query_port(
            ctx,
            port_num,
            attr.cast(),
            std::mem::size_of::<sys::_compat_ibv_port_attr>(),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    ctx: *mut sys::ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut sys::ibv_gid,
) -> c_int {
    // -1 with errno on failure, as rdma-core returns it.
    ffi::minus_one_call(|| {
        // SAFETY: the program's pointers.
        let (ctx, gid) = unsafe { (Context::from_c(ctx)?, ffi::out(gid)?) };
        if port_num != 1 {
            return Err(libc::EINVAL);
        }
        gid.raw = gid_at(ctx, index)?.octets();
        Ok(0)
    })
}

/// The GID's type for sysfs: RoCE v2 (`ibv_query_gid_type`, rdma-core
/// private; ibv_devinfo and pyverbs use it).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    ctx: *mut sys::ibv_context,
    port_num: u8,
    index: u32,
    gid_type: *mut u32,
) -> c_int {
    // -1 with errno on failure, as rdma-core returns it.
    ffi::minus_one_call(|| {
        // SAFETY: the program's pointers.
        let (ctx, t) = unsafe { (Context::from_c(ctx)?, ffi::out(gid_type)?) };
        if port_num != 1 {
            return Err(libc::EINVAL);
        }
        gid_at(ctx, index.try_into().unwrap_or(c_int::MAX))?;
        *t = 1; // IBV_GID_TYPE_SYSFS_ROCE_V2
        Ok(0)
    })
}

/// GID `index` of the port's table: EINVAL past its end, as rdma-core
/// answers for an index beyond `gid_tbl_len`.
pub(crate) fn gid_at(ctx: &Context, index: c_int) -> Result<std::net::Ipv6Addr, i32> {
    let i = usize::try_from(index).map_err(|_| libc::EINVAL)?;
    let addr = ctx.nic.gids().get(i).ok_or(libc::EINVAL)?;
    Ok(rnic_verbs::gid_of(*addr))
}

/// The GID table's entry `index` (RoCE v2, on the interface that has the
/// address), if there is one.
fn gid_entry(ctx: &Context, index: usize) -> Option<sys::ibv_gid_entry> {
    let addr = *ctx.nic.gids().get(index)?;
    // SAFETY: plain data.
    let mut e: sys::ibv_gid_entry = unsafe { std::mem::zeroed() };
    e.gid.raw = rnic_verbs::gid_of(addr).octets();
    e.gid_index = index as u32;
    e.port_num = 1;
    e.gid_type = sys::IBV_GID_TYPE_ROCE_V2;
    e.ndev_ifindex = netdev_of(addr).map_or(0, |(_, i)| i);
    Some(e)
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    ctx: *mut sys::ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut sys::ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    ffi::errno_call(|| {
        // SAFETY: the program's context.
        let ctx = unsafe { Context::from_c(ctx)? };
        if flags != 0 || entry.is_null() || entry_size < std::mem::size_of::<sys::ibv_gid_entry>() {
            return Err(libc::EINVAL);
        }
        if port_num != 1 {
            return Err(libc::ENODATA);
        }
        let e = gid_entry(ctx, gid_index as usize).ok_or(libc::ENODATA)?;
        // SAFETY: the program's entry, of at least our size.
        unsafe { *entry = e };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    ctx: *mut sys::ibv_context,
    entries: *mut sys::ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    // SAFETY: the program's context.
    let Ok(ctx) = (unsafe { Context::from_c(ctx) }) else {
        return -(libc::EINVAL as isize);
    };
    if flags != 0 || entries.is_null() || entry_size < std::mem::size_of::<sys::ibv_gid_entry>() {
        return -(libc::EINVAL as isize);
    }
    let n = ctx.nic.gids().len();
    if max_entries < n {
        return -(libc::EINVAL as isize);
    }
    for i in 0..n {
        let Some(e) = gid_entry(ctx, i) else { break };
        // SAFETY: room for `max_entries` entries of `entry_size` bytes
        // each, at least ours, and i < n <= max_entries.
        unsafe {
            entries
                .cast::<u8>()
                .add(i * entry_size)
                .cast::<sys::ibv_gid_entry>()
                .write_unaligned(e)
        };
    }
    n as isize
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    ctx: *mut sys::ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    // -1 with errno on failure, as rdma-core returns it.
    ffi::minus_one_call(|| {
        // SAFETY: the program's pointers.
        let (_, pkey) = unsafe { (Context::from_c(ctx)?, ffi::out(pkey)?) };
        if port_num != 1 || index != 0 {
            return Err(libc::EINVAL);
        }
        *pkey = 0xFFFFu16.to_be();
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(
    ctx: *mut sys::ibv_context,
    port_num: u8,
    pkey: u16,
) -> c_int {
    // SAFETY: the program's context.
    match unsafe { Context::from_c(ctx) } {
        Ok(_) if port_num == 1 && u16::from_be(pkey) & 0x7FFF == 0x7FFF => 0,
        _ => -1,
    }
}

/// rnic has no sysfs files of its own: every read finds nothing (ibv_devinfo
/// then leaves out the board id).
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    -1
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// Provider libraries (libmlx5, libefa, which perftest links) register
/// themselves from their constructors. rnic is the only device here and
/// loads no provider, so a registration is accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn verbs_register_driver_34(_ops: *const c_void) {}

/// Fork support: rnic's memory is the program's own and its NIC a thread of
/// the process, so there is nothing to protect from copy-on-write.
#[no_mangle]
pub unsafe extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `IBV_FORK_UNNEEDED`: a child sees its parent's registered memory as any
/// copy-on-write memory; nothing of rnic's breaks.
#[no_mangle]
pub unsafe extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// The device's name, for messages.
pub(crate) fn name_of(ctx: &Context) -> &str {
    // SAFETY: copy_str always leaves a NUL terminator.
    unsafe { CStr::from_ptr(ctx.slot.c.name.as_ptr()) }
        .to_str()
        .unwrap_or("rnic")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rnic_devices_parses_and_names_what_is_wrong() {
        let d = parse_devices("rxe0=127.0.0.1, rxe1=::1").unwrap();
        assert_eq!(d[0].name, "rxe0");
        assert_eq!(d[1].addr, Some("::1".parse().unwrap()));
        for (bad, says) in [
            ("rxe0", "is not NAME=ADDR"),
            ("rxe0=garbage", "\"garbage\" is not an IPv4 or IPv6 address"),
            ("=127.0.0.1", "is not a device name"),
            ("a b=127.0.0.1", "is not a device name"),
            ("x=127.0.0.1,x=127.0.0.2", "named twice"),
            ("", "is not NAME=ADDR"),
        ] {
            let e = parse_devices(bad).unwrap_err();
            assert!(e.starts_with("RNIC_DEVICES="), "{e}");
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }
}
