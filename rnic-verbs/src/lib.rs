//! The rnic driver and its verbs-shaped Rust API.
//!
//! A [`Device`] is a software RoCE v2 NIC on one local IP address: a UDP socket
//! on port 4791 and an engine thread running `rnic-core`. Everything else
//! follows verbs: protection domains, memory regions, completion queues, queue
//! pairs, work requests.
//!
//! ```no_run
//! use rnic_verbs::{Device, Access};
//! let dev = Device::open_loopback()?;
//! let pd = dev.alloc_pd()?;
//! let mr = pd.register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
//! # Ok::<(), rnic_verbs::Error>(())
//! ```
//!
//! Memory safety: registered memory is owned jointly by the application's
//! [`MemoryRegion`] and the engine, so it cannot be freed while the NIC may
//! still write it; it is made of atomic bytes, so the application and the
//! engine touching it at once is not a data race (see `memory`). The
//! `unsafe` in the crate is in four modules, `memory` (mapping, viewing and
//! unmapping the pages of a page-backed region), `udp` (recvmmsg and
//! sendmmsg), `frames` (packet sockets, BPF, getifaddrs) and `sched` (CPU
//! affinity and scheduling), in the registration of a program's own memory
//! (`register_foreign`, `rereg_foreign`), and in the engine's one call of
//! `atexit(3)`.

#![deny(unsafe_code)]

mod capture;
mod channel;
mod delivered;
mod engine;
pub mod impair;
// AF_PACKET, BPF and getifaddrs, which std and rustix do not wrap.
#[allow(unsafe_code)]
pub mod frames;
#[allow(unsafe_code)]
mod memory;
pub mod rendezvous;
#[allow(unsafe_code)]
pub mod udp;

use core::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;
use rnic_core::cq::CqHandle;
pub use rnic_core::mem::{Access, MwBind, MwType};
use rnic_core::mem::{MemError, PdHandle};
pub use rnic_core::qp::{AddressVector, AttrMask, QpAttr, QpState};
pub use rnic_core::qp::{Mtu, QpType};
pub use rnic_core::srq::AsyncEvent;
use rnic_core::srq::SrqHandle;
pub use rnic_core::wr::{
    sg_list, Completion, InlineData, RecvWr, SendOp, SendWr, SgList, Sge, UdDest, WcOpcode,
    WcStatus, GRH_LEN, MAX_INLINE_DATA,
};
pub use rnic_core::{DeviceAttr, QpCaps, VerbError, DEVICE_ATTR};

pub use engine::TapEvent;
pub use impair::{ImpairStats, Impairment};

/// Where a tap delivers the packets it sees.
pub type TapReceiver = crossbeam_channel::Receiver<TapEvent>;
pub use channel::{AsyncEventQueue, CompletionChannel};
use delivered::Delivered;
use engine::{Engine, EngineState};
pub use memory::{Backing, DmaBuf, Placement};

/// What went wrong.
#[derive(Debug)]
pub enum Error {
    /// The operating system refused (socket, thread).
    Io(io::Error),
    /// The NIC refused the verb.
    Verb(VerbError),
    /// No free loopback address with port 4791 available.
    NoFreeAddress,
    /// A wait ended without a completion.
    Timeout,
    /// A buffer handed in for registration is not 8-byte aligned (it comes
    /// back with the error).
    Unaligned(Vec<u8>),
    /// The region's memory is still held by the NIC (it was not given by the
    /// caller, or something still refers to it).
    NotReturnable,
    /// No entry at this index in the port's GID table ([`Device::gids`]).
    NoSuchGid(usize),
    /// An environment variable rnic reads has a value it cannot use.
    BadEnv {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
        /// What it should be.
        expected: &'static str,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "{e}"),
            Error::Verb(e) => write!(f, "{e}"),
            Error::NoFreeAddress => {
                f.write_str("no loopback address 127.0.0.1-127.0.0.254 has UDP port 4791 free")
            }
            Error::Timeout => f.write_str("timed out waiting for a completion"),
            Error::Unaligned(_) => f.write_str("the buffer is not 8-byte aligned"),
            Error::NotReturnable => {
                f.write_str("the region's memory was not the caller's, or is still in use")
            }
            Error::NoSuchGid(i) => write!(f, "the port has no GID {i}"),
            Error::BadEnv {
                var,
                value,
                expected,
            } => write!(f, "{var}={value:?}: expected {expected}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        Error::Io(e)
    }
}

impl From<VerbError> for Error {
    fn from(e: VerbError) -> Error {
        Error::Verb(e)
    }
}

/// The result of a verb.
pub type Result<T> = std::result::Result<T, Error>;

/// A software RoCE v2 NIC on one IP address.
#[derive(Clone)]
pub struct Device {
    pub(crate) engine: Arc<Engine>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("addr", &self.engine.addr)
            .finish()
    }
}

impl Device {
    /// Open a NIC on `addr` (IPv4 or IPv6): bind UDP port 4791 there and start
    /// its engine thread.
    pub fn open(addr: IpAddr) -> Result<Device> {
        Device::start(addr, None)
    }

    /// Start a NIC's engine on `addr`, on `iface` if given, recording to
    /// `RNIC_PCAP` if that is set, its egress impaired as `RNIC_IMPAIR`
    /// says if that is set.
    fn start(addr: IpAddr, iface: Option<&frames::Interface>) -> Result<Device> {
        let impair = match std::env::var("RNIC_IMPAIR") {
            Ok(v) => Some(v.parse::<Impairment>().map_err(|_| Error::BadEnv {
                var: "RNIC_IMPAIR".into(),
                value: v.clone(),
                expected: "loss=P,dup=P,reorder=P,corrupt=P,delay=D,seed=N (P as 5% or 0.05, D as 1ms or 200us)",
            })?),
            Err(_) => None,
        };
        let engine = Engine::start(addr, iface, secret()?, engine::sched::Priority::from_env()?)?;
        let dev = Device {
            engine: Arc::new(engine),
        };
        if let Some(path) = std::env::var_os("RNIC_PCAP") {
            dev.capture(std::path::Path::new(&path))?;
        }
        if let Some(i) = impair {
            dev.set_impairment(i)?;
        }
        Ok(dev)
    }

    /// Impair this NIC's egress from now on (loss, duplication,
    /// reordering, corruption, delay: see [`impair`]); an impairment that
    /// does nothing turns it off. Datagrams held back when it is replaced
    /// are dropped.
    pub fn set_impairment(&self, i: Impairment) -> Result<()> {
        let imp = (!i.is_none()).then(|| impair::Impairer::new(i));
        self.engine.call(move |st| st.impair = imp)?;
        Ok(())
    }

    /// What the impairment has done to this NIC's egress so far.
    pub fn impairment_stats(&self) -> Result<ImpairStats> {
        Ok(self
            .engine
            .call(|st| st.impair.as_ref().map(|i| i.stats).unwrap_or_default())?)
    }

    /// Open a NIC on network interface `name`, at every address it has
    /// (its GID table, [`Device::gids`]; its own address is the first IPv4
    /// one), taking packets in as whole frames (see [`frames`]): the
    /// transport to talk to peers that put their own IPv4 identification
    /// in each packet, as rdma_rxe does, and the one for RoCE v2 over
    /// IPv6 on a link. Needs CAP_NET_RAW.
    pub fn open_on_interface(name: &str) -> Result<Device> {
        let iface = frames::Interface::find(name)?;
        Device::start(iface.addr(), Some(&iface))
    }

    /// Record every packet of this device in the pcap file at `path` (devices
    /// of one process share a file; `RNIC_PCAP` does this for every device).
    pub fn capture(&self, path: &std::path::Path) -> Result<()> {
        let c = capture::Capture::open(path)?;
        self.engine.call(move |st| st.capture = Some(c))?;
        Ok(())
    }

    /// Open a NIC on the first loopback address whose port 4791 is free
    /// (127.0.0.1, then 127.0.0.2, ...), or on the address in `RNIC_ADDR`
    /// (an error names the variable if it is not an IP address).
    pub fn open_loopback() -> Result<Device> {
        if let Some(a) = std::env::var_os("RNIC_ADDR") {
            return Device::open(parse_env_addr("RNIC_ADDR", &a.to_string_lossy())?);
        }
        for addr in loopback_addrs() {
            match Device::open(addr) {
                Ok(d) => return Ok(d),
                Err(Error::Io(e)) if e.kind() == io::ErrorKind::AddrInUse => continue,
                Err(e) => return Err(e),
            }
        }
        Err(Error::NoFreeAddress)
    }

    /// The NIC's IP address.
    pub fn addr(&self) -> IpAddr {
        self.engine.addr
    }

    /// The port's RoCE v2 GID of its own address: the IPv4-mapped IPv6
    /// address, or the IPv6 address.
    pub fn gid(&self) -> Ipv6Addr {
        gid_of(self.engine.addr)
    }

    /// The port's GID table: every address the NIC answers at, in the
    /// order a RoCE port lists them (on the frame transport the IPv6
    /// link-local address, the IPv4 addresses, the other IPv6 addresses;
    /// on loopback, the one address). An IPv4 address is the IPv4-mapped
    /// GID.
    pub fn gids(&self) -> &[IpAddr] {
        &self.engine.gids
    }

    /// What the device supports (`ibv_query_device`).
    pub fn query_device(&self) -> DeviceAttr {
        DEVICE_ATTR
    }

    /// Its one port (`ibv_query_port`): always active; the active MTU is the
    /// largest IB MTU whose packets fit the link (the interface's MTU on the
    /// frame transport; loopback carries 64 KiB; any other address is taken
    /// to be 1500-byte Ethernet).
    pub fn query_port(&self) -> PortAttr {
        let link_mtu = self.engine.link_mtu as usize;
        // IPv6 + UDP + BTH + the largest extension headers + ICRC.
        let overhead = 40 + 8 + 12 + 28 + 4;
        PortAttr {
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::for_link(link_mtu, overhead).unwrap_or(Mtu::Mtu256),
            gid_tbl_len: self.gids().len() as u32,
            gid: self.gid(),
        }
    }

    /// GID `index` of the port (`ibv_query_gid`): there is one, index 0.
    pub fn query_gid(&self, index: u32) -> Option<Ipv6Addr> {
        (index == 0).then(|| self.gid())
    }

    /// Receive every packet the NIC sends or receives from now on.
    pub fn tap(&self) -> Result<TapReceiver> {
        let (tx, rx) = crossbeam_channel::unbounded();
        self.engine.call(move |st| st.tap = Some(tx))?;
        Ok(rx)
    }

    /// Asynchronous events (`ibv_get_async_event`) from now on.
    pub fn async_events(&self) -> Result<Receiver<AsyncEvent>> {
        let (tx, rx) = crossbeam_channel::unbounded();
        self.engine.call(move |st| st.events = Some((tx, None)))?;
        Ok(rx)
    }

    /// Asynchronous events from now on, with a descriptor that is readable
    /// while one waits (`ibv_context.async_fd`).
    pub fn async_event_queue(&self) -> Result<AsyncEventQueue> {
        let (q, tx, signal) = AsyncEventQueue::new()?;
        self.engine
            .call(move |st| st.events = Some((tx, Some(signal))))?;
        Ok(q)
    }

    /// The NIC's counters.
    pub fn counters(&self) -> Result<rnic_core::Counters> {
        Ok(self.engine.call(|st| st.nic.counters())?)
    }

    /// What the NIC holds ([`rnic_core::Footprint`]), and how many CQs the
    /// driver delivers completions to.
    pub fn footprint(&self) -> Result<(rnic_core::Footprint, usize)> {
        Ok(self.engine.call(|st| (st.nic.footprint(), st.cqs.len()))?)
    }

    /// Allocate a protection domain.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        let pd = self.engine.call(|st| st.nic.alloc_pd())?;
        Ok(ProtectionDomain {
            dev: self.clone(),
            pd,
            parent: false,
            done: AtomicBool::new(false),
        })
    }

    /// Create a completion queue of `depth` entries.
    pub fn create_cq(&self, depth: usize) -> Result<CompletionQueue> {
        self.create_cq_inner(depth, None)
    }

    /// A completion channel (`ibv_create_comp_channel`), for
    /// [`Device::create_cq_with_channel`].
    pub fn create_comp_channel(&self) -> Result<CompletionChannel> {
        Ok(CompletionChannel::new()?)
    }

    /// Create a completion queue whose events, once armed with
    /// [`CompletionQueue::req_notify`], go to `channel`.
    pub fn create_cq_with_channel(
        &self,
        depth: usize,
        channel: &CompletionChannel,
    ) -> Result<CompletionQueue> {
        self.create_cq_inner(depth, Some(channel))
    }

    /// Change `cq`'s depth (`ibv_resize_cq`). Fails, changing nothing, when
    /// more completions are waiting to be polled than `depth`.
    pub fn resize_cq(&self, cq: &CompletionQueue, depth: usize) -> Result<()> {
        let (h, delivered) = (cq.cq, cq.delivered.clone());
        self.call(move |st| st.nic.resize_cq(h, depth, delivered.len()))?
            .map_err(Error::from)
    }

    fn create_cq_inner(
        &self,
        depth: usize,
        channel: Option<&CompletionChannel>,
    ) -> Result<CompletionQueue> {
        let delivered = Arc::new(Delivered::default());
        let armed = Arc::new(AtomicBool::new(false));
        let notify = channel.map(|c| channel::Notify {
            armed: armed.clone(),
            signal: c.signal.clone(),
        });
        let sink = engine::CqSink {
            delivered: delivered.clone(),
            notify,
        };
        let cq = self.engine.call(move |st| {
            let h = st.nic.create_cq(depth);
            st.cqs.insert(h, sink);
            h
        })?;
        Ok(CompletionQueue {
            cq,
            delivered,
            armed,
            dev: self.clone(),
            destroyed: AtomicBool::new(false),
        })
    }

    fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut EngineState) -> R + Send + 'static,
    ) -> Result<R> {
        Ok(self.engine.call(f)?)
    }

    /// `call` for a verb that posts work (see [`Engine::post`]).
    fn post<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut EngineState) -> R + Send + 'static,
    ) -> Result<R> {
        Ok(self.engine.post(f)?)
    }
}

/// `N` bytes from the operating system's random source (getrandom(2)).
fn os_random<const N: usize>() -> io::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    let mut filled = 0;
    while filled < N {
        match rustix::rand::getrandom(&mut bytes[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(bytes)
}

/// The seed of a NIC's QP numbers and keys: 256 bits from the system, so
/// that a peer cannot predict them.
fn secret() -> io::Result<rnic_core::rng::SecretRng> {
    Ok(rnic_core::rng::SecretRng::from_seed(os_random()?))
}

/// The loopback addresses a default device takes, in the order it tries
/// them: 127.0.0.1, 127.0.0.2, ... 127.0.0.254.
pub fn loopback_addrs() -> impl Iterator<Item = IpAddr> {
    (1..=254u8).map(|last| IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)))
}

/// `value`, the value of environment variable `var`, as an IP address.
pub fn parse_env_addr(var: &str, value: &str) -> Result<IpAddr> {
    value.trim().parse().map_err(|_| Error::BadEnv {
        var: var.to_string(),
        value: value.to_string(),
        expected: "an IPv4 or IPv6 address",
    })
}

/// The port's attributes (`ibv_port_attr`, what rnic has of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// The largest path MTU the port supports.
    pub max_mtu: Mtu,
    /// The largest path MTU that fits the link.
    pub active_mtu: Mtu,
    /// GIDs in the table.
    pub gid_tbl_len: u32,
    /// GID 0, RoCE v2.
    pub gid: Ipv6Addr,
}

/// A protection domain. Dropping it frees it in the NIC, at once or with
/// the last region, window or queue pair still in it; a parent domain
/// dropped lets go of the domain under it.
#[derive(Debug)]
pub struct ProtectionDomain {
    dev: Device,
    pd: PdHandle,
    /// A parent domain over `pd` (see [`ProtectionDomain::parent_domain`]).
    parent: bool,
    /// Freed already ([`ProtectionDomain::dealloc`]).
    done: AtomicBool,
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        if self.done.load(Ordering::Acquire) {
            return;
        }
        if self.parent {
            self.release();
        } else {
            let pd = self.pd;
            let _ = self.dev.engine.call(move |st| st.nic.release_pd(pd));
        }
    }
}

impl ProtectionDomain {
    /// Free the domain in the NIC (`ibv_dealloc_pd`). Refused while a
    /// region, window, queue pair or parent domain is still in it; after
    /// it, nothing can be made in this domain. A parent domain lets go of
    /// the domain under it.
    pub fn dealloc(&self) -> Result<()> {
        if self.done.load(Ordering::Acquire) {
            return Ok(());
        }
        if self.parent {
            self.release();
        } else {
            let pd = self.pd;
            self.dev.engine.call(move |st| st.nic.dealloc_pd(pd))??;
        }
        self.done.store(true, Ordering::Release);
        Ok(())
    }

    /// Count one more user of the domain that the NIC does not keep (a
    /// parent domain, an address handle): `dealloc` is refused until
    /// [`ProtectionDomain::release`].
    fn acquire(&self) -> Result<()> {
        let pd = self.pd;
        self.dev.engine.call(move |st| st.nic.pd_acquire(pd))??;
        Ok(())
    }

    /// One such user fewer.
    fn release(&self) {
        release_pd_user(&self.dev, self.pd);
    }

    /// A parent domain over this domain (`ibv_alloc_parent_domain`): what
    /// is made in it is in this domain, and this domain cannot be freed
    /// until the parent is ([`ProtectionDomain::dealloc`] on it).
    pub fn parent_domain(&self) -> Result<ProtectionDomain> {
        self.acquire()?;
        Ok(ProtectionDomain {
            dev: self.dev.clone(),
            pd: self.pd,
            parent: true,
            done: AtomicBool::new(false),
        })
    }

    /// Whether this is a parent domain.
    pub fn is_parent(&self) -> bool {
        self.parent
    }

    /// Hold the domain for an object the NIC does not keep itself (an
    /// address handle, whose address is all a UD send needs): it cannot be
    /// freed until the hold is dropped, as `ibv_dealloc_pd` is refused
    /// while address handles are in the domain.
    pub fn hold(&self) -> Result<DomainHold> {
        self.acquire()?;
        Ok(DomainHold {
            dev: self.dev.clone(),
            pd: self.pd,
        })
    }

    /// Check that `lkey`, a region of this domain, covers `len` bytes at
    /// `addr` with `access` (what `ibv_advise_mr` validates; rnic never
    /// pins or faults, so there is nothing to prefetch).
    pub fn check_local(&self, lkey: u32, addr: u64, len: u64, access: Access) -> Result<()> {
        let pd = self.pd;
        self.dev
            .engine
            .call(move |st| st.nic.check_local(pd, lkey, addr, len, access))??;
        Ok(())
    }

    /// Allocate `len` zeroed bytes on the heap and register them with `access`.
    pub fn register(&self, len: usize, access: Access) -> Result<MemoryRegion> {
        self.register_with(len, access, Backing::Heap)
    }

    /// Allocate `len` zeroed bytes from `backing` (heap, pages of their own,
    /// huge pages) and register them with `access`.
    pub fn register_with(
        &self,
        len: usize,
        access: Access,
        backing: Backing,
    ) -> Result<MemoryRegion> {
        self.register_buf(DmaBuf::new(len, backing)?, access)
    }

    /// Register the caller's own buffer, in place: the NIC reads and writes
    /// these very bytes (through [`MemoryRegion::read`] and `write` meanwhile),
    /// and [`MemoryRegion::into_vec`] gives them back once the NIC has let go.
    /// The buffer must be 8-byte aligned, as the system allocator makes any
    /// `Vec<u8>` here; if not, it comes back in [`Error::Unaligned`].
    pub fn register_vec(&self, buf: Vec<u8>, access: Access) -> Result<MemoryRegion> {
        let buf = DmaBuf::from_vec(buf).map_err(Error::Unaligned)?;
        self.register_buf(buf, access)
    }

    /// Register `len` bytes at `addr`, memory rnic does not own (a C
    /// program's buffer, for `ibv_reg_mr`), in place, with `iova` as the
    /// address peers name it by. See `DmaBuf::foreign` for how rnic shares it.
    ///
    /// # Safety
    /// `addr..addr+len` must stay mapped, readable and writable, until the
    /// region is deregistered ([`MemoryRegion::deregister`] returns `Ok`, or
    /// it is dropped).
    #[allow(unsafe_code)]
    pub unsafe fn register_foreign(
        &self,
        addr: std::ptr::NonNull<u8>,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MemoryRegion> {
        // SAFETY: the caller's promise, passed on.
        let buf = unsafe { DmaBuf::foreign(addr, len) };
        self.register_at(buf, iova, access)
    }

    fn register_buf(&self, buf: DmaBuf, access: Access) -> Result<MemoryRegion> {
        let iova = buf.addr();
        self.register_at(buf, iova, access)
    }

    fn register_at(&self, buf: DmaBuf, iova: u64, access: Access) -> Result<MemoryRegion> {
        let buf = Arc::new(buf);
        let shared = memory::Shared(buf.clone());
        let pd = self.pd;
        let keys = self
            .dev
            .call(move |st| st.nic.reg_mr(pd, iova, Box::new(shared), access))??;
        Ok(MemoryRegion {
            dev: self.dev.clone(),
            buf,
            lkey: keys.lkey,
            rkey: keys.rkey,
            registered: true,
        })
    }

    /// A builder for a queue pair on `send_cq` and `recv_cq`, in the manner
    /// of `ibv_qp_init_attr`: RC with default capacities unless told
    /// otherwise.
    pub fn qp_builder<'a>(
        &'a self,
        send_cq: &'a CompletionQueue,
        recv_cq: &'a CompletionQueue,
    ) -> QpBuilder<'a> {
        QpBuilder {
            pd: self,
            send_cq,
            recv_cq,
            qp_type: QpType::Rc,
            caps: QpCaps::default(),
            srq: None,
        }
    }

    /// Create a reliable connected queue pair.
    pub fn create_rc_qp(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        caps: QpCaps,
    ) -> Result<QueuePair> {
        self.create_qp(QpType::Rc, send_cq, recv_cq, caps, None)
    }

    /// Create a queue pair of any type (`ibv_create_qp`), taking its receives
    /// from `srq` if one is given.
    pub fn create_qp(
        &self,
        qp_type: QpType,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        caps: QpCaps,
        srq: Option<&SharedReceiveQueue>,
    ) -> Result<QueuePair> {
        let (pd, s, r) = (self.pd, send_cq.cq, recv_cq.cq);
        let srq = srq.map(|q| q.srq);
        let qpn = self
            .dev
            .call(move |st| -> std::result::Result<u32, VerbError> {
                let qpn = st.nic.create_qp(pd, qp_type, s, r, caps)?;
                if let Some(h) = srq {
                    st.nic.attach_srq(qpn, h)?;
                }
                let span = tracing::debug_span!(
                    parent: &st.span,
                    "qp",
                    qpn = format_args!("{qpn:#x}"),
                    ?qp_type
                );
                st.qp_spans.insert(qpn, span);
                Ok(qpn)
            })??;
        tracing::debug!(device = %self.dev.addr(), qpn, ?qp_type, "queue pair created");
        Ok(QueuePair {
            dev: self.dev.clone(),
            qpn,
            sq_psn: rand_psn()?,
            src: None,
        })
    }

    /// A shared receive queue of `max_wr` receives of up to `max_sge`
    /// entries, in this domain (which it holds until it is destroyed).
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<SharedReceiveQueue> {
        let pd = self.pd;
        let srq = self
            .dev
            .call(move |st| st.nic.create_srq(pd, max_wr, max_sge))??;
        Ok(SharedReceiveQueue {
            dev: self.dev.clone(),
            srq,
            destroyed: AtomicBool::new(false),
        })
    }

    /// Allocate a type 2 memory window (`ibv_alloc_mw(IBV_MW_TYPE_2)`): it
    /// opens nothing until [`QueuePair::bind_mw`] binds it, for that QP.
    pub fn alloc_mw(&self) -> Result<MemoryWindow> {
        self.alloc_mw_of(MwType::Two)
    }

    /// Allocate a type 1 memory window (`ibv_alloc_mw(IBV_MW_TYPE_1)`):
    /// once bound ([`QueuePair::bind_mw`] through any QP of this domain) it
    /// opens its range to every QP of the domain; bound again, the new range
    /// replaces the old; bound with length 0 it closes.
    pub fn alloc_type1_mw(&self) -> Result<MemoryWindow> {
        self.alloc_mw_of(MwType::One)
    }

    fn alloc_mw_of(&self, kind: MwType) -> Result<MemoryWindow> {
        let pd = self.pd;
        let rkey = self.dev.call(move |st| st.nic.alloc_mw_of(pd, kind))??;
        Ok(MemoryWindow {
            kind,
            dev: self.dev.clone(),
            rkey: AtomicU32::new(rkey),
        })
    }

    /// An address handle for UD sends to `dest` (`ibv_create_ah`), from
    /// the address the NIC chooses ([`rnic_core::Nic::source_for`]).
    pub fn create_ah(&self, dest: IpAddr) -> AddressHandle {
        AddressHandle { dest, src: None }
    }

    /// An address handle for UD sends to `dest` from GID `sgid_index` of
    /// the port's table ([`Device::gids`]), which must be of `dest`'s
    /// family (IPv4 or IPv6).
    pub fn create_ah_from(&self, dest: IpAddr, sgid_index: usize) -> Result<AddressHandle> {
        let src = *self
            .dev
            .gids()
            .get(sgid_index)
            .ok_or(Error::NoSuchGid(sgid_index))?;
        if src.is_ipv4() != dest.is_ipv4() {
            return Err(Error::Verb(VerbError::Modify(
                rnic_core::qp::ModifyError::InvalidValue {
                    attr: AttrMask::AV,
                    value: sgid_index as u64,
                    rule: "the source GID must be of the destination's family",
                },
            )));
        }
        Ok(AddressHandle {
            dest,
            src: Some(src),
        })
    }
}

/// A random first PSN, from the system: a connection's PSNs are what an
/// off-path attacker must guess to inject into it.
fn rand_psn() -> io::Result<u32> {
    Ok(u32::from_ne_bytes(os_random()?) & 0xFF_FFFF)
}

/// Builds a queue pair (`ProtectionDomain::qp_builder`).
#[derive(Debug)]
pub struct QpBuilder<'a> {
    pd: &'a ProtectionDomain,
    send_cq: &'a CompletionQueue,
    recv_cq: &'a CompletionQueue,
    qp_type: QpType,
    caps: QpCaps,
    srq: Option<&'a SharedReceiveQueue>,
}

impl<'a> QpBuilder<'a> {
    /// RC (the default), UC or UD.
    pub fn qp_type(mut self, t: QpType) -> Self {
        self.qp_type = t;
        self
    }
    /// All capacities at once.
    pub fn caps(mut self, caps: QpCaps) -> Self {
        self.caps = caps;
        self
    }
    /// Send queue depth.
    pub fn max_send_wr(mut self, n: u32) -> Self {
        self.caps.max_send_wr = n;
        self
    }
    /// Receive queue depth.
    pub fn max_recv_wr(mut self, n: u32) -> Self {
        self.caps.max_recv_wr = n;
        self
    }
    /// Scatter/gather entries per send.
    pub fn max_send_sge(mut self, n: u32) -> Self {
        self.caps.max_send_sge = n;
        self
    }
    /// Scatter/gather entries per receive.
    pub fn max_recv_sge(mut self, n: u32) -> Self {
        self.caps.max_recv_sge = n;
        self
    }
    /// Take receives from a shared receive queue.
    pub fn srq(mut self, srq: &'a SharedReceiveQueue) -> Self {
        self.srq = Some(srq);
        self
    }
    /// Create it (in RESET: [`QueuePair::modify`] or `connect` takes it on).
    pub fn build(self) -> Result<QueuePair> {
        self.pd.create_qp(
            self.qp_type,
            self.send_cq,
            self.recv_cq,
            self.caps,
            self.srq,
        )
    }
}

/// Registered memory. Dropping it deregisters it; the memory itself lives on
/// until the NIC has let go of it too.
pub struct MemoryRegion {
    dev: Device,
    buf: Arc<DmaBuf>,
    lkey: u32,
    rkey: u32,
    registered: bool,
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .finish()
    }
}

impl MemoryRegion {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
    /// The address of the first byte (what a peer puts in a RETH).
    pub fn addr(&self) -> u64 {
        self.buf.addr()
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    /// Where its memory came from.
    pub fn placement(&self) -> Placement {
        self.buf.placement()
    }
    /// A scatter/gather entry for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge {
            addr: self.addr() + offset as u64,
            length: len,
            lkey: self.lkey,
        }
    }
    /// Deregister now and hand back the buffer given to
    /// [`ProtectionDomain::register_vec`], once the NIC holds it no more.
    /// Fails if its memory was allocated by rnic, or if memory windows are
    /// bound to it (the region is then dropped as usual: the NIC keeps the
    /// memory until it can let go).
    pub fn into_vec(mut self) -> Result<Vec<u8>> {
        if self.placement() != Placement::Caller {
            return Err(Error::NotReturnable);
        }
        // When this returns, the engine has dropped its handle on the memory.
        self.deregister()?;
        let buf = std::mem::replace(&mut self.buf, Arc::new(DmaBuf::zeroed(0)));
        Arc::try_unwrap(buf)
            .ok()
            .and_then(DmaBuf::into_vec)
            .ok_or(Error::NotReturnable)
    }
    /// Deregister now (`ibv_dereg_mr`): when this returns `Ok`, the NIC will
    /// not touch the memory again. Fails, leaving the region registered, if
    /// memory windows are bound to it.
    pub fn deregister(&mut self) -> Result<()> {
        if self.registered {
            let lkey = self.lkey;
            self.dev.call(move |st| st.nic.dereg_mr(lkey).map(drop))??;
            self.registered = false;
        }
        Ok(())
    }
    /// Change the region in place (`ibv_rereg_mr`), keeping its keys: move
    /// it to protection domain `pd` (of the same device), give it rights
    /// `access`, or both. On an error nothing changed. Refused while memory
    /// windows are bound to it.
    pub fn rereg(&mut self, pd: Option<&ProtectionDomain>, access: Option<Access>) -> Result<()> {
        self.rereg_inner(pd, access, None)
    }

    /// [`MemoryRegion::rereg`], and also (if `memory` is given) cover other
    /// memory: `len` bytes at `addr`, at I/O virtual address `iova` (the
    /// `IBV_REREG_MR_CHANGE_TRANSLATION` of `ibv_rereg_mr`). Operations in
    /// flight that name the old addresses then fail their checks; the old
    /// memory is the caller's again when this returns.
    ///
    /// # Safety
    /// As [`ProtectionDomain::register_foreign`]: the new memory must stay
    /// valid until the region is deregistered or changed again.
    #[allow(unsafe_code)]
    pub unsafe fn rereg_foreign(
        &mut self,
        pd: Option<&ProtectionDomain>,
        access: Option<Access>,
        memory: Option<(std::ptr::NonNull<u8>, usize, u64)>,
    ) -> Result<()> {
        let memory = memory.map(|(addr, len, iova)| {
            // SAFETY: the caller's promise, passed on.
            (unsafe { DmaBuf::foreign(addr, len) }, iova)
        });
        self.rereg_inner(pd, access, memory)
    }

    fn rereg_inner(
        &mut self,
        pd: Option<&ProtectionDomain>,
        access: Option<Access>,
        memory: Option<(DmaBuf, u64)>,
    ) -> Result<()> {
        if !self.registered {
            return Err(VerbError::Mem(MemError::InvalidKey(self.lkey)).into());
        }
        let pd = match pd {
            // A domain's handle means nothing to another device's NIC.
            Some(p) if !Arc::ptr_eq(&p.dev.engine, &self.dev.engine) => {
                return Err(VerbError::Mem(MemError::NoSuchPd(p.pd)).into())
            }
            Some(p) => Some(p.pd),
            None => None,
        };
        let memory = memory.map(|(buf, iova)| (Arc::new(buf), iova));
        let translation = memory.as_ref().map(|(buf, iova)| {
            (
                *iova,
                Box::new(memory::Shared(buf.clone())) as Box<dyn rnic_core::mem::Region>,
            )
        });
        let lkey = self.lkey;
        // The old memory's handle is dropped in the engine, after which the
        // NIC cannot reach it.
        self.dev
            .call(move |st| st.nic.rereg_mr(lkey, pd, access, translation).map(drop))??;
        if let Some((buf, _)) = memory {
            self.buf = buf;
        }
        Ok(())
    }

    /// Copy `data` into the region at `offset`; false if it does not fit.
    pub fn write(&self, offset: usize, data: &[u8]) -> bool {
        self.buf.write(offset, data)
    }
    /// Copy out of the region from `offset`; false if out of bounds.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        self.buf.read(offset, out)
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // Refused while windows are bound: the NIC then keeps the memory
        // until it can let go (see `into_vec`).
        let _ = self.deregister();
    }
}

/// A memory window (type 1 or 2). Dropping it frees it (`ibv_dealloc_mw`).
#[derive(Debug)]
pub struct MemoryWindow {
    kind: MwType,
    dev: Device,
    rkey: AtomicU32,
}

impl MemoryWindow {
    /// Type 1 or type 2.
    pub fn kind(&self) -> MwType {
        self.kind
    }
    /// Its R_Key: the one the last [`QueuePair::bind_mw`] gave it (what a
    /// peer needs), or its first, unbound one.
    pub fn rkey(&self) -> u32 {
        self.rkey.load(Ordering::Relaxed)
    }
    /// The R_Key a bind gives it next: the same index, the low byte moved
    /// on, as `ibv_inc_rkey` does.
    pub fn next_rkey(&self) -> u32 {
        let k = self.rkey();
        (k & !0xFF) | (k.wrapping_add(1) & 0xFF)
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        let rkey = self.rkey();
        let _ = self.dev.engine.call(move |st| {
            let _ = st.nic.dealloc_mw(rkey);
        });
    }
}

/// A hold on a protection domain ([`ProtectionDomain::hold`]); dropping it
/// lets go.
#[derive(Debug)]
pub struct DomainHold {
    dev: Device,
    pd: PdHandle,
}

impl Drop for DomainHold {
    fn drop(&mut self) {
        release_pd_user(&self.dev, self.pd);
    }
}

/// One user (a parent domain, a hold) of domain `pd` fewer; a domain its
/// owner released goes with its last user.
fn release_pd_user(dev: &Device, pd: PdHandle) {
    let _ = dev.engine.call(move |st| st.nic.pd_release(pd));
}

/// A shared receive queue.
#[derive(Debug)]
pub struct SharedReceiveQueue {
    dev: Device,
    srq: SrqHandle,
    /// Destroyed in the NIC already: the drop must not destroy the SRQ
    /// made in the same slot since.
    destroyed: AtomicBool,
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        let _ = self.destroy_now();
    }
}

impl SharedReceiveQueue {
    /// Destroy it now (`ibv_destroy_srq`; dropping it does the same, or
    /// leaves it to the NIC if it cannot). Refused while queue pairs take
    /// their receives from it; the receives still posted go without a
    /// completion.
    pub fn destroy_now(&self) -> Result<()> {
        if self.destroyed.load(Ordering::Acquire) {
            return Ok(());
        }
        let srq = self.srq;
        self.dev.call(move |st| st.nic.destroy_srq(srq))??;
        self.destroyed.store(true, Ordering::Release);
        Ok(())
    }
    /// Its number, as `AsyncEvent::SrqLimitReached` reports it.
    pub fn id(&self) -> u32 {
        self.srq.0
    }
    /// Post a receive (`ibv_post_srq_recv`).
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        let srq = self.srq;
        self.dev.post(move |st| st.nic.post_srq_recv(srq, wr))??;
        Ok(())
    }
    /// Raise `AsyncEvent::SrqLimitReached` once, when fewer than `limit`
    /// receives remain (`ibv_modify_srq` with IBV_SRQ_LIMIT).
    pub fn arm(&self, limit: u32) -> Result<()> {
        let srq = self.srq;
        self.dev.call(move |st| st.nic.arm_srq(srq, limit))??;
        Ok(())
    }
}

/// Where UD sends go: a peer's address (`ibv_ah`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressHandle {
    /// The peer's IP address (its GID).
    pub dest: IpAddr,
    /// The address to send from; `None`: the NIC chooses.
    pub src: Option<IpAddr>,
}

/// A completion queue. Dropping it destroys it, at once or, if queue pairs
/// still complete into it, with the last of them.
#[derive(Debug)]
pub struct CompletionQueue {
    cq: CqHandle,
    delivered: Arc<Delivered>,
    armed: Arc<AtomicBool>,
    /// For run-to-completion: a poll that finds the queue empty takes in
    /// what has arrived itself.
    dev: Device,
    /// Destroyed in the NIC already: the drop must not destroy the CQ
    /// made in the same slot since.
    destroyed: AtomicBool,
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        if !self.destroyed.load(Ordering::Acquire) {
            let cq = self.cq;
            let _ = self.dev.call(move |st| st.release_cq(cq));
        }
    }
}

impl CompletionQueue {
    /// Destroy it now (`ibv_destroy_cq`). Refused while queue pairs
    /// complete into it ([`VerbError::CqBusy`]); the completions still in
    /// it go with it.
    pub fn destroy_now(&self) -> Result<()> {
        if self.destroyed.load(Ordering::Acquire) {
            return Ok(());
        }
        let cq = self.cq;
        self.dev.call(move |st| st.destroy_cq(cq))??;
        self.destroyed.store(true, Ordering::Release);
        Ok(())
    }
    /// Its number, as [`CompletionChannel::get_cq_event`] reports it.
    pub fn id(&self) -> u32 {
        self.cq.0
    }
    /// Ask for one event on the queue's completion channel at its next
    /// completion (`ibv_req_notify_cq` with solicited_only 0). Completions
    /// already waiting do not count: arm, poll, then wait for the event.
    pub fn req_notify(&self) {
        self.armed.store(true, Ordering::Release);
        self.dev.engine.expect_sleeper();
    }
    /// Take the completions waiting (none is an empty vector). If none
    /// is, first take in what the NIC has received, on this thread.
    pub fn poll(&self) -> Vec<Completion> {
        let mut out = Vec::new();
        self.poll_into(&mut out, usize::MAX);
        out
    }
    /// Move up to `max` of the completions waiting onto the end of `out`,
    /// oldest first, and say how many (`ibv_poll_cq` into the caller's
    /// array: once `out` has the room, nothing is allocated). If none is
    /// waiting, first take in what the NIC has received, on this thread.
    pub fn poll_into(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        if self.is_empty() {
            self.dev.engine.progress();
        }
        self.delivered.take_into(out, max)
    }

    /// Take the next completion waiting, if any (no allocation). If none
    /// is, first take in what the NIC has received, on this thread.
    pub fn try_next(&self) -> Option<Completion> {
        if let Some(c) = self.delivered.pop() {
            return Some(c);
        }
        self.dev.engine.progress();
        self.delivered.pop()
    }
    /// Poll until a completion arrives or `timeout` passes, never sleeping:
    /// the latency mode of perftest and of `rnic perf --lat`. It keeps a
    /// core busy, and the packets it waits for are taken in on this thread.
    pub fn spin(&self, timeout: Duration) -> Result<Completion> {
        let start = std::time::Instant::now();
        loop {
            if let Some(c) = self.try_next() {
                return Ok(c);
            }
            if start.elapsed() >= timeout {
                return Err(Error::Timeout);
            }
            std::hint::spin_loop();
        }
    }
    /// How many completions are waiting.
    pub fn len(&self) -> usize {
        self.delivered.len()
    }
    /// Whether none is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Wait up to `timeout` for one completion, sleeping while none comes
    /// (the engine thread takes in packets meanwhile).
    pub fn wait(&self, timeout: Duration) -> Result<Completion> {
        if let Some(c) = self.try_next() {
            return Ok(c);
        }
        let deadline = std::time::Instant::now() + timeout;
        self.dev.engine.expect_sleeper();
        self.delivered.wait_until(deadline).ok_or(Error::Timeout)
    }
}

/// What a peer needs to connect to a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// The NIC's address (its GID).
    pub addr: IpAddr,
    /// Queue pair number.
    pub qpn: u32,
    /// First PSN the queue pair sends.
    pub psn: u32,
}

/// How to connect.
#[derive(Debug, Clone, Copy)]
pub struct ConnectOptions {
    /// Path MTU.
    pub mtu: Mtu,
    /// Local ACK timeout exponent (4.096 us x 2^timeout).
    pub timeout: u8,
    /// Retries after a timeout or sequence error.
    pub retry_cnt: u8,
    /// Retries after an RNR NAK (7 = forever).
    pub rnr_retry: u8,
    /// Remote access allowed to this QP.
    pub access: Access,
    /// Outstanding READs/atomics, each way (max_rd_atomic and
    /// max_dest_rd_atomic). The default, 16, is what a ConnectX responder
    /// takes; between rnic NICs up to [`DEVICE_ATTR`]`.max_qp_rd_atom` (128,
    /// as rdma_rxe) keeps a READ stream of small messages going three
    /// times faster (`rnic perf read -o`).
    pub max_rd_atomic: u8,
}

impl Default for ConnectOptions {
    fn default() -> ConnectOptions {
        ConnectOptions {
            mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            max_rd_atomic: 16,
        }
    }
}

/// The RoCE v2 GID of an address: the IPv4-mapped IPv6 address, or the
/// IPv6 address.
pub fn gid_of(addr: IpAddr) -> Ipv6Addr {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// A queue pair. Dropping it destroys it.
#[derive(Debug)]
pub struct QueuePair {
    dev: Device,
    qpn: u32,
    sq_psn: u32,
    /// The address it sends from, if chosen ([`QueuePair::use_gid`]).
    src: Option<IpAddr>,
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        let _ = self.destroy_now();
    }
}

impl QueuePair {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// What the peer needs to connect to this QP.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            addr: self.src.unwrap_or_else(|| self.dev.addr()),
            qpn: self.qpn,
            psn: self.sq_psn,
        }
    }

    /// Start this QP's send queue at `psn` instead of the random PSN it was
    /// given (a verbs program chooses `sq_psn` itself): to make a transfer
    /// cross the 24-bit wrap, say. Before [`QueuePair::endpoint`] is handed
    /// to the peer and before [`QueuePair::connect`].
    pub fn set_psn(&mut self, psn: rnic_wire::Psn) {
        self.sq_psn = psn.value();
    }

    /// Send from, and be reached at, GID `index` of the port's table
    /// ([`Device::gids`]) rather than the device's own address (`-g` of
    /// ibv_rc_pingpong): an IPv6 address, say. Before
    /// [`QueuePair::endpoint`] is handed to the peer.
    pub fn use_gid(&mut self, index: usize) -> Result<()> {
        let addr = *self.dev.gids().get(index).ok_or(Error::NoSuchGid(index))?;
        self.src = Some(addr);
        Ok(())
    }

    /// Take the QP through INIT, RTR and RTS to `remote`, as ibv_rc_pingpong does.
    pub fn connect(&self, remote: &Endpoint, o: &ConnectOptions) -> Result<()> {
        let qpn = self.qpn;
        let attr = QpAttr {
            qp_access_flags: o.access,
            ah_attr: Some(AddressVector {
                dest: remote.addr,
                src: self.src,
                traffic_class: 0,
                hop_limit: 64,
                flow_label: 0,
            }),
            path_mtu: o.mtu,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: o.max_rd_atomic,
            min_rnr_timer: 12,
            sq_psn: self.sq_psn,
            timeout: o.timeout,
            retry_cnt: o.retry_cnt,
            rnr_retry: o.rnr_retry,
            max_rd_atomic: o.max_rd_atomic,
            ..QpAttr::default()
        };
        let port = self.dev.call(move |st| {
            let now = st.now();
            st.nic.to_rts(now, qpn, &attr)?;
            st.give_source_port(qpn)
        })??;
        tracing::debug!(device = %self.dev.addr(), qpn, remote = %remote.addr, remote_qpn = remote.qpn, udp_source_port = port, "queue pair connected");
        Ok(())
    }

    /// Bring a UD QP to RTS with Q_Key `qkey`, as ibv_ud_pingpong does.
    pub fn ready_ud(&self, qkey: u32) -> Result<()> {
        let qpn = self.qpn;
        let attr = QpAttr {
            qkey,
            sq_psn: self.sq_psn,
            ..QpAttr::default()
        };
        self.dev.call(move |st| {
            let now = st.now();
            st.nic.to_rts(now, qpn, &attr)
        })??;
        Ok(())
    }

    /// Post a UD send to QP `remote_qpn` with Q_Key `remote_qkey` at `ah`.
    pub fn post_send_ud(
        &self,
        wr: SendWr,
        ah: &AddressHandle,
        remote_qpn: u32,
        remote_qkey: u32,
    ) -> Result<()> {
        let qpn = self.qpn;
        let to = UdDest {
            dest: ah.dest,
            src: ah.src,
            qpn: remote_qpn,
            qkey: remote_qkey,
        };
        self.dev.post(move |st| {
            let now = st.now();
            st.nic.post_send_ud(now, qpn, wr, to)
        })??;
        Ok(())
    }

    /// Post a send work request.
    pub fn post_send(&self, wr: SendWr) -> Result<()> {
        let qpn = self.qpn;
        self.dev.post(move |st| {
            let now = st.now();
            let _in_qp = st.qp_span(qpn).entered();
            tracing::trace!(wr_id = wr.wr_id, op = ?wr.op, sges = wr.sg_list.len(), "post_send");
            st.nic.post_send(now, qpn, wr)
        })??;
        Ok(())
    }

    /// Bind `mw` to `len` bytes of `mr` at `offset`, for this QP, with remote
    /// rights `access` (a BIND_MW work request, `ibv_bind_mw` for a type 2
    /// window). Returns the window's new R_Key (its low byte moved on, as
    /// `ibv_inc_rkey` does), valid for this QP's peer once the bind
    /// completes, in send-queue order, as IBV_WC_BIND_MW.
    pub fn bind_mw(
        &self,
        wr_id: u64,
        mw: &MemoryWindow,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<u32> {
        let new_rkey = mw.next_rkey();
        self.post_bind_mw(
            wr_id,
            mw,
            mr.lkey(),
            mr.addr().wrapping_add(offset as u64),
            len as u64,
            access,
            new_rkey,
            true,
        )?;
        Ok(new_rkey)
    }

    /// Bind `mw` to `length` bytes at `addr` of the region with local key
    /// `mr_lkey`, giving it `new_rkey` (a BIND_MW work request as
    /// `ibv_post_send` and `ibv_wr_bind_mw` take it: the caller chose the
    /// key, normally with `ibv_inc_rkey`).
    #[allow(clippy::too_many_arguments)]
    pub fn post_bind_mw(
        &self,
        wr_id: u64,
        mw: &MemoryWindow,
        mr_lkey: u32,
        addr: u64,
        length: u64,
        access: Access,
        new_rkey: u32,
        signaled: bool,
    ) -> Result<()> {
        self.post_send(SendWr {
            wr_id,
            op: SendOp::BindMw(MwBind {
                mw_rkey: mw.rkey(),
                new_rkey,
                mr_lkey,
                addr,
                length,
                access,
            }),
            sg_list: SgList::new(),
            signaled,
            solicited: false,
            fence: false,
            inline: None,
        })?;
        mw.rkey.store(new_rkey, Ordering::Relaxed);
        Ok(())
    }

    /// Post a receive work request.
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        let qpn = self.qpn;
        self.dev.post(move |st| {
            let now = st.now();
            let _in_qp = st.qp_span(qpn).entered();
            tracing::trace!(wr_id = wr.wr_id, sges = wr.sg_list.len(), "post_recv");
            st.nic.post_recv(now, qpn, wr)
        })??;
        Ok(())
    }

    /// `ibv_modify_qp`: the attributes in `mask` from `attr`, with the
    /// required and optional attributes of the transition checked as Linux
    /// checks them.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        let (qpn, attr) = (self.qpn, *attr);
        self.dev.call(move |st| {
            let now = st.now();
            let _in_qp = st.qp_span(qpn).entered();
            tracing::debug!(?mask, state = %attr.qp_state, "modify_qp");
            st.nic.modify_qp(now, qpn, &attr, mask)?;
            if mask.contains(AttrMask::STATE) && attr.qp_state == QpState::Reset {
                st.remove_delivered(qpn, st.nic.qp_cqs(qpn));
            }
            // A new path (only RC and UC QPs take one): a UDP source port
            // for it, as rdma_rxe gives it.
            if mask.contains(AttrMask::AV) {
                st.give_source_port(qpn)?;
            }
            Ok::<(), VerbError>(())
        })??;
        Ok(())
    }

    /// `ibv_query_qp`: every attribute.
    pub fn query(&self) -> Result<QpAttr> {
        let qpn = self.qpn;
        Ok(self.dev.call(move |st| st.nic.query_qp(qpn))??)
    }

    /// Destroy the QP now (`ibv_destroy_qp`; dropping it does the same).
    pub fn destroy(mut self) -> Result<()> {
        self.destroy_now()
    }

    /// Destroy the QP in the engine; the drop that follows finds nothing to
    /// destroy (QP 0 is never one rnic creates).
    fn destroy_now(&mut self) -> Result<()> {
        let qpn = std::mem::replace(&mut self.qpn, 0);
        self.dev.call(move |st| st.destroy_qp(qpn))??;
        Ok(())
    }

    /// The QP's state.
    pub fn state(&self) -> Result<QpState> {
        let qpn = self.qpn;
        Ok(self
            .dev
            .call(move |st| st.nic.query_qp(qpn).map(|a| a.qp_state))??)
    }
}
