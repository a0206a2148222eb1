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
mod sched;
#[allow(unsafe_code)]
pub mod udp;
mod watch;

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
    engine: Arc<Engine>,
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
        let engine = Engine::start(addr, iface, secret()?, sched::Priority::from_env()?)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A device whose recv CQ `a` reports to a channel, connected to `b`.
    struct Pair {
        a: Device,
        chan: CompletionChannel,
        a_rcq: CompletionQueue,
        a_scq: CompletionQueue,
        _a_qp: QueuePair,
        a_mr: MemoryRegion,
        /// Where b's WRITEs land.
        a_target: MemoryRegion,
        b_scq: CompletionQueue,
        b_qp: QueuePair,
        b_mr: MemoryRegion,
        a_pd: ProtectionDomain,
        b_pd: ProtectionDomain,
    }

    fn pair() -> Pair {
        let (a, b) = (
            Device::open_loopback().unwrap(),
            Device::open_loopback().unwrap(),
        );
        let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let chan = a.create_comp_channel().unwrap();
        let a_rcq = a.create_cq_with_channel(64, &chan).unwrap();
        let a_scq = a.create_cq(64).unwrap();
        let b_scq = b.create_cq(64).unwrap();
        let a_qp = pa.create_rc_qp(&a_scq, &a_rcq, QpCaps::default()).unwrap();
        let b_qp = pb.create_rc_qp(&b_scq, &b_scq, QpCaps::default()).unwrap();
        let o = ConnectOptions::default();
        a_qp.connect(&b_qp.endpoint(), &o).unwrap();
        b_qp.connect(&a_qp.endpoint(), &o).unwrap();
        Pair {
            a_mr: pa.register(64, Access::LOCAL_WRITE).unwrap(),
            a_target: pa
                .register(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                .unwrap(),
            b_mr: pb.register(64, Access::LOCAL_WRITE).unwrap(),
            a,
            chan,
            a_rcq,
            a_scq,
            _a_qp: a_qp,
            b_scq,
            b_qp,
            a_pd: pa,
            b_pd: pb,
        }
    }

    /// A receive (`ids.0`) posted on `to`'s QP over its region's first 64
    /// bytes, then a SEND (`ids.1`) of `from`'s region's first 8 into it.
    fn send_one(
        from: (&QueuePair, &MemoryRegion),
        to: (&QueuePair, &MemoryRegion),
        ids: (u64, u64),
        signaled: bool,
    ) {
        to.0.post_recv(RecvWr {
            wr_id: ids.0,
            sg_list: sg_list![to.1.sge(0, 64)],
        })
        .unwrap();
        from.0
            .post_send(SendWr {
                wr_id: ids.1,
                op: SendOp::Send { imm: None },
                sg_list: sg_list![from.1.sge(0, 8)],
                signaled,
                solicited: false,
                fence: false,
                inline: None,
            })
            .unwrap();
    }

    impl Pair {
        /// A program that only posts: receives posted on a's QP every
        /// 100 us (a full receive queue refuses them: posts all the same),
        /// never a poll, until `stop` (at most 100,000).
        fn post_receives_until(&self, stop: &AtomicBool) {
            for i in 0..100_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let _ = self._a_qp.post_recv(RecvWr {
                    wr_id: 1000 + i,
                    sg_list: sg_list![self.a_mr.sge(0, 64)],
                });
                std::thread::sleep(Duration::from_micros(100));
            }
        }

        fn post(&self) {
            send_one(
                (&self.b_qp, &self.b_mr),
                (&self._a_qp, &self.a_mr),
                (1, 2),
                true,
            );
        }

        /// One WRITE from b into `a_target`.
        fn write(&self) {
            self.b_qp
                .post_send(SendWr {
                    wr_id: 3,
                    op: SendOp::Write {
                        remote_addr: self.a_target.addr(),
                        rkey: self.a_target.rkey(),
                        imm: None,
                    },
                    sg_list: sg_list![self.b_mr.sge(0, 8)],
                    signaled: true,
                    solicited: false,
                    fence: false,
                    inline: None,
                })
                .unwrap();
        }

        /// One SEND from a to b, both sides' completions spun for (bounded).
        fn send_polled(&self, i: u64) {
            send_one(
                (&self._a_qp, &self.a_mr),
                (&self.b_qp, &self.b_mr),
                (i, i),
                true,
            );
            let c = self.a_scq.spin(Duration::from_secs(10)).unwrap();
            assert_eq!((c.wr_id, c.status), (i, WcStatus::Success));
            let c = self.b_scq.spin(Duration::from_secs(10)).unwrap();
            assert_eq!((c.wr_id, c.status), (i, WcStatus::Success));
        }

        fn sent(&self) {
            let c = self.b_scq.wait(Duration::from_secs(10)).unwrap();
            assert_eq!(
                c.status,
                WcStatus::Success,
                "away {}",
                self.a.engine.is_away()
            );
        }

        /// One SEND from b into a receive posted on a, which `take` waits
        /// for: posted from another thread once this one is waiting.
        fn send_later(&self, take: impl FnOnce(&CompletionQueue) -> Result<Completion>) {
            std::thread::scope(|s| {
                s.spawn(|| {
                    std::thread::sleep(Duration::from_millis(50));
                    self.post();
                    self.sent();
                });
                let c = take(&self.a_rcq).expect("the SEND arrives");
                assert_eq!(c.status, WcStatus::Success);
            });
        }

        /// SENDs from another thread, taken here by polling without a
        /// pause, until a's engine thread leaves the socket to the poller
        /// (bounded).
        fn until_away(&self) {
            let stop = AtomicBool::new(false);
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            // Completions taken here: the sender keeps fewer than a's
            // receive CQ holds outstanding, even if this thread is held up.
            let taken_here = std::sync::atomic::AtomicU64::new(0);
            let mut taken = 0;
            let posted = std::thread::scope(|s| {
                let sender = s.spawn(|| {
                    let mut n = 0;
                    while n < 5000 && !stop.load(Ordering::Relaxed) {
                        if n - taken_here.load(Ordering::Relaxed) >= 32 {
                            std::thread::yield_now();
                            continue;
                        }
                        self.post();
                        self.sent();
                        n += 1;
                    }
                    n
                });
                // Polling on until the last SEND is acknowledged: the
                // engine, once away, leaves its packets to this thread.
                while !sender.is_finished() {
                    if let Some(c) = self.a_rcq.try_next() {
                        assert_eq!(c.status, WcStatus::Success);
                        taken += 1;
                        taken_here.store(taken, Ordering::Relaxed);
                    }
                    if self.a.engine.is_away() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    assert!(std::time::Instant::now() < deadline, "bounded");
                }
                sender.join().unwrap()
            });
            assert!(
                stop.load(Ordering::Relaxed),
                "the engine thread kept watching a socket a poller served ({posted} SENDs)"
            );
            while taken < posted {
                let c = self.a_rcq.spin(Duration::from_secs(10)).unwrap();
                assert_eq!(c.status, WcStatus::Success);
                taken += 1;
            }
        }
    }

    // The engine thread would come back on its own only after a minute: a
    // sleeper is served because it said it would sleep.

    #[test]
    fn poll_into_takes_at_most_max_oldest_first_into_the_callers_vector() {
        let p = pair();
        for _ in 0..3 {
            p.write();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while p.b_scq.len() < 3 && std::time::Instant::now() < deadline {
            let _ = p.b_scq.poll_into(&mut Vec::new(), 0);
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut out = Vec::with_capacity(8);
        let mark = Completion {
            wr_id: 99,
            ..p.b_scq.delivered.pop().unwrap()
        };
        out.push(mark);
        assert_eq!(p.b_scq.poll_into(&mut out, 1), 1);
        assert_eq!(p.b_scq.poll_into(&mut out, 5), 1);
        assert_eq!(p.b_scq.poll_into(&mut out, 5), 0);
        assert_eq!(out.len(), 3, "appended after what was there: {out:?}");
        assert_eq!(out[0].wr_id, 99);
        assert!(out[1..]
            .iter()
            .all(|c| c.wr_id == 3 && c.status == WcStatus::Success));
        assert_eq!(out.capacity(), 8, "the caller's room was used");
    }

    #[test]
    fn a_thread_that_waits_on_a_queue_brings_the_engine_back() {
        let p = pair();
        p.a.engine.set_away_max(60_000_000_000);
        p.until_away();
        p.send_later(|cq| cq.wait(Duration::from_secs(10)));
    }

    /// While a thread polls without a break, the engine thread, away from
    /// the socket, looks at it ever less often: after AWAY_MAX, then twice
    /// that, ..., up to AWAY_LONGEST. Each look preempts a spinning program.
    #[test]
    fn a_thread_that_keeps_polling_wakes_the_engine_ever_less_often() {
        let p = pair();
        p.until_away();
        let before = p.a.engine.away_sleeps();
        let start = std::time::Instant::now();
        let spell = Duration::from_millis(200);
        while start.elapsed() < spell {
            assert!(p.a_rcq.try_next().is_none());
        }
        let sleeps = p.a.engine.away_sleeps() - before;
        // A look every AWAY_MAX would be 200; doubling to AWAY_LONGEST, a
        // few to get there and 25 after. A thread held up for a millisecond
        // brings the engine back and starts it again from AWAY_MAX.
        let every_ms = (spell.as_nanos() / u128::from(crate::watch::AWAY_MAX)) as u64;
        assert!(sleeps < every_ms / 3, "{sleeps} looks in {spell:?}");
        assert!(sleeps > 0, "it looked");
    }

    // Away, the engine thread comes back to the socket TEST_AWAY after the
    // last poll or post: long enough that a test thread held up by a busy
    // machine does not let it come back before the packet it sends.
    const TEST_AWAY: u64 = 50_000_000;

    /// A path that refuses UDP GSO sends (here a socket without UDP
    /// checksums; the kernel says EINVAL) loses the first run sent as one,
    /// and from then on the NIC sends one datagram per message: a 64 KiB
    /// WRITE completes after one retransmission, where every resent run,
    /// refused alike, would spend the retries.
    #[test]
    fn a_nic_whose_gso_sends_are_refused_sends_datagrams_one_by_one() {
        let (a, b) = (
            Device::open_loopback().unwrap(),
            Device::open_loopback().unwrap(),
        );
        let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let (a_cq, b_cq) = (a.create_cq(8).unwrap(), b.create_cq(8).unwrap());
        let a_qp = pa.create_rc_qp(&a_cq, &a_cq, QpCaps::default()).unwrap();
        let b_qp = pb.create_rc_qp(&b_cq, &b_cq, QpCaps::default()).unwrap();
        let o = ConnectOptions {
            timeout: 10, // 4.2 ms
            ..ConnectOptions::default()
        };
        a_qp.connect(&b_qp.endpoint(), &o).unwrap();
        b_qp.connect(&a_qp.endpoint(), &o).unwrap();
        const LEN: usize = 64 * 1024;
        let target = pa
            .register(LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let source = pb.register(LEN, Access::LOCAL_WRITE).unwrap();
        let data: Vec<u8> = (0..LEN as u32).map(|i| (i * 7 + 1) as u8).collect();
        assert!(source.write(0, &data));
        assert!(b.engine.gso(), "GSO is on by default on loopback");
        b.engine.send_without_checksums();
        b_qp.post_send(SendWr {
            wr_id: 1,
            op: SendOp::Write {
                remote_addr: target.addr(),
                rkey: target.rkey(),
                imm: None,
            },
            sg_list: sg_list![source.sge(0, LEN as u32)],
            signaled: true,
            solicited: false,
            fence: false,
            inline: None,
        })
        .unwrap();
        let c = b_cq.wait(Duration::from_secs(10)).unwrap();
        assert_eq!(c.status, WcStatus::Success);
        assert!(!b.engine.gso(), "GSO is off after the refusal");
        let mut got = vec![0u8; LEN];
        assert!(target.read(0, &mut got));
        assert!(got == data, "the WRITE landed whole");
        let retries = b.counters().unwrap().completer_retry_err;
        assert!(retries <= 2, "{retries} retransmissions");
    }

    /// A pair whose a's engine thread has left the socket to this thread,
    /// coming back TEST_AWAY after the last poll or post.
    fn pair_away() -> Pair {
        let p = pair();
        p.a.engine.set_away_max(TEST_AWAY);
        p.until_away();
        p
    }

    /// A poll after one that found nothing asks for one message (what a
    /// ping-pong's poller finds); the next asks for a batch.
    #[test]
    fn a_poll_after_a_dry_one_takes_one_message_in() {
        let p = pair_away();
        let to = std::net::SocketAddr::new(p.a.engine.addr, crate::engine::ROCE_PORT);
        let peer = std::net::UdpSocket::bind((to.ip(), 0)).unwrap();
        // The engine thread comes back TEST_AWAY after the last poll: a
        // test thread held up that long tries again.
        for _ in 0..5 {
            assert!(p.a_rcq.try_next().is_none(), "a dry poll");
            let (engine, polled) = (p.a.engine.engine_packets(), p.a.engine.polled_packets());
            // Three datagrams, three messages (not RoCE: each is counted
            // as malformed, and as a packet taken in).
            for b in [1u8, 2, 3] {
                peer.send_to(&[b], to).unwrap();
            }
            p.a.engine.progress();
            let first = p.a.engine.polled_packets() - polled;
            p.a.engine.progress();
            let second = p.a.engine.polled_packets() - polled - first;
            if p.a.engine.engine_packets() != engine {
                continue;
            }
            assert_eq!((first, second), (1, 2));
            return;
        }
        panic!("the engine thread took the datagrams in every time");
    }

    /// A WRITE of `len` bytes from a to b (at PMTU 1024, more packets
    /// than one pump builds: PUMP_BURSTS bursts of at most 32 requests):
    /// a's source and b's target regions, the source filled.
    fn long_write(p: &Pair, len: usize) -> (SendWr, MemoryRegion, MemoryRegion, Vec<u8>) {
        let src = p.a_pd.register(len, Access::LOCAL_WRITE).unwrap();
        let dst = p
            .b_pd
            .register(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        assert!(src.write(0, &data));
        let wr = SendWr {
            wr_id: 7,
            op: SendOp::Write {
                remote_addr: dst.addr(),
                rkey: dst.rkey(),
                imm: None,
            },
            sg_list: sg_list![src.sge(0, len as u32)],
            signaled: true,
            solicited: false,
            fence: false,
            inline: None,
        };
        (wr, src, dst, data)
    }

    /// `data` lands in `dst` (bounded: the last packets of a UC WRITE may
    /// still be on their way when the sender's completion comes).
    fn lands(dst: &MemoryRegion, data: &[u8], what: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut got = vec![0u8; data.len()];
        while !(dst.read(0, &mut got) && got == data) {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: the WRITE's bytes land"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// While a's engine thread leaves the socket to a poller, what a post
    /// left a's NIC to build is built by the poller's next polls, each
    /// after taking in what arrived: the engine thread is not woken for it
    /// (woken, it took the lock from the poller for a pump, and was woken
    /// again for the rest).
    ///
    /// On RC the ACKs that come back find the rest built as they are taken
    /// in; on UC nothing comes back, and the polls that find nothing build
    /// it.
    #[test]
    fn what_a_post_left_to_build_waits_for_the_next_poll_while_a_thread_polls() {
        let p = pair_away();
        // One window, 1,024 packets: more than the post's pump and the
        // next poll's build, so the polls after it find more left.
        let (wr, _src, dst, data) = long_write(&p, 1 << 20);
        let uc = |pd: &ProtectionDomain, cq: &CompletionQueue| {
            pd.create_qp(QpType::Uc, cq, cq, QpCaps::default(), None)
                .unwrap()
        };
        let (a_uc, b_uc) = (uc(&p.a_pd, &p.a_scq), uc(&p.b_pd, &p.b_scq));
        let o = ConnectOptions::default();
        a_uc.connect(&b_uc.endpoint(), &o).unwrap();
        b_uc.connect(&a_uc.endpoint(), &o).unwrap();
        for (qp, what) in [(&p._a_qp, "RC"), (&a_uc, "UC")] {
            assert!(dst.write(0, &vec![0; data.len()]));
            // The engine thread comes back TEST_AWAY after the last poll:
            // a test thread held up that long tries again.
            let quiet = (0..5).any(|_| {
                let sleeps = p.a.engine.away_sleeps();
                qp.post_send(wr.clone()).unwrap();
                let c = p.a_scq.spin(Duration::from_secs(10)).unwrap();
                assert_eq!((c.wr_id, c.status), (7, WcStatus::Success), "{what}");
                p.a.engine.away_sleeps() == sleeps
            });
            assert!(
                quiet,
                "{what}: a's engine thread was woken for what the poller's polls build, every time"
            );
            lands(&dst, &data, what);
        }
    }

    /// The engine thread away, looking at what is due with more left to
    /// build than its pump built, looks again at the next timer or its
    /// bound, not at once (taking the lock from the poller for each pump
    /// while the poller builds the same).
    #[test]
    fn the_engine_thread_away_leaves_what_is_left_to_build_to_the_poller() {
        let p = pair_away();
        let (wr, _src, _dst, _data) = long_write(&p, 256 << 10);
        for _ in 0..5 {
            p._a_qp.post_send(wr.clone()).unwrap();
            let (left, until, now) = p.a.engine.away_until(u64::MAX);
            if left {
                assert!(
                    until > now,
                    "the engine thread looks again at once ({until} against {now})"
                );
                let c = p.a_scq.spin(Duration::from_secs(10)).unwrap();
                assert_eq!((c.wr_id, c.status), (7, WcStatus::Success));
                return;
            }
            // The engine thread came back and built it: again.
            let c = p.a_scq.spin(Duration::from_secs(10)).unwrap();
            assert_eq!((c.wr_id, c.status), (7, WcStatus::Success));
        }
        panic!("the post never left the NIC more to build");
    }

    /// The same WRITE, and no poll comes after the post: the engine
    /// thread builds the rest when it looks again.
    #[test]
    fn what_a_post_left_to_build_is_built_by_the_engine_thread_if_no_poll_comes() {
        let p = pair_away();
        let (wr, _src, dst, data) = long_write(&p, 1 << 20);
        p._a_qp.post_send(wr).unwrap();
        // Not a poll: the completions delivered so far, counted.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while p.a_scq.is_empty() {
            assert!(std::time::Instant::now() < deadline, "the WRITE completes");
            std::thread::sleep(Duration::from_millis(1));
        }
        let c = p.a_scq.try_next().unwrap();
        assert_eq!((c.wr_id, c.status), (7, WcStatus::Success));
        lands(&dst, &data, "RC");
        assert_eq!(
            p.a.counters().unwrap().completer_retry_err,
            0,
            "sent, not left to the retransmission timer"
        );
    }

    /// While a's engine thread leaves the socket to a poller, a's posts
    /// wait for a's next poll, which sends them; if no poll comes, the
    /// engine thread sends them when it looks again.
    #[test]
    fn posts_wait_for_the_next_poll_while_a_thread_polls() {
        fn send(p: &Pair, wr_id: u64) {
            send_one(
                (&p._a_qp, &p.a_mr),
                (&p.b_qp, &p.b_mr),
                (wr_id, wr_id),
                false,
            );
        }
        fn received(p: &Pair, wr_id: u64) {
            let c = p.b_scq.wait(Duration::from_secs(10)).unwrap();
            assert_eq!(
                (c.wr_id, c.status, c.opcode),
                (wr_id, WcStatus::Success, WcOpcode::Recv)
            );
        }
        let p = pair_away();
        send(&p, 10);
        assert!(
            p.a.engine.holding(),
            "a post while a thread polls waits for the poll"
        );
        assert!(p.a_rcq.try_next().is_none());
        assert!(
            !p.a.engine.holding(),
            "a poll that found nothing sends what waited"
        );
        received(&p, 10);
        // Posted, and nobody on a polls again: the engine thread sends it.
        let p = pair_away();
        send(&p, 11);
        assert!(p.a.engine.holding());
        received(&p, 11);
        assert!(!p.a.engine.holding());
        assert_eq!(
            p.a.counters().unwrap().completer_retry_err,
            0,
            "sent, not left to the retransmission timer"
        );
    }

    /// While a's engine thread leaves the socket to a poller, the ACK of a
    /// SEND a poll took in waits for a's next poll (which sends it with
    /// whatever the program posted meanwhile); if no poll comes, the engine
    /// thread sends it when it looks again.
    #[test]
    fn the_ack_of_a_polled_send_waits_for_the_next_poll() {
        /// Poll a's receive queue until b's SEND arrives (bounded).
        fn take(p: &Pair) {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                if let Some(c) = p.a_rcq.try_next() {
                    assert_eq!((c.status, c.opcode), (WcStatus::Success, WcOpcode::Recv));
                    return;
                }
                assert!(std::time::Instant::now() < deadline, "the SEND came");
            }
        }
        let p = pair_away();
        p.post();
        take(&p);
        assert!(
            p.a.engine.holding(),
            "the ACK of the SEND a poll took in waits for the next poll"
        );
        assert!(p.a_rcq.try_next().is_none());
        assert!(!p.a.engine.holding(), "the next poll sent it");
        p.sent();
        // Taken in, and nobody on a polls again: the engine thread sends it.
        let p = pair_away();
        p.post();
        take(&p);
        assert!(p.a.engine.holding());
        p.sent();
        assert!(!p.a.engine.holding());
        let b = p.b_qp.dev.counters().unwrap();
        assert_eq!(
            b.completer_retry_err, 0,
            "acknowledged, not left to b's retransmission timer"
        );
    }

    /// A WRITE from b with `tag` in its every byte, polled for on a until
    /// it landed (bounded), as a ping-pong waits: memory first, then a
    /// poll. No completion shows on a.
    fn write_polled_in(p: &Pair, tag: u8) {
        assert!(p.b_mr.write(0, &[tag; 8]));
        p.write();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut landed = [0u8; 8];
        loop {
            assert!(p.a_target.read(0, &mut landed));
            if landed == [tag; 8] {
                return;
            }
            assert!(p.a_scq.try_next().is_none());
            assert!(std::time::Instant::now() < deadline, "the WRITE landed");
        }
    }

    /// a's answer: a SEND to b (unsignaled), into a receive posted on b.
    fn answer(p: &Pair) {
        send_one((&p._a_qp, &p.a_mr), (&p.b_qp, &p.b_mr), (4, 5), false);
    }

    /// a's answer, then a's next poll, which sends it with the ACKs it
    /// took along, and b's completions of both.
    fn answer_polled(p: &Pair) {
        answer(p);
        assert!(p.a_scq.try_next().is_none());
        assert!(!p.a.engine.holding(), "the answer took them along");
        answered(p);
    }

    /// b's completions of its WRITE and of the receive a's answer filled,
    /// in either order.
    fn answered(p: &Pair) {
        let mut ids = [0u64; 2];
        for id in &mut ids {
            let c = p.b_scq.wait(Duration::from_secs(10)).unwrap();
            assert_eq!(c.status, WcStatus::Success);
            *id = c.wr_id;
        }
        ids.sort();
        assert_eq!(ids, [3, 4]);
    }

    /// A program that takes long to answer (a slow CPU: an emulated one
    /// answers fifty times slower) has its ACKs wait ANSWER_SLACK times
    /// its usual answer time, up to ANSWER_WAIT_MAX, before they leave
    /// alone; a new NIC waits ANSWER_WAIT.
    #[test]
    fn a_slow_program_s_acks_wait_longer_for_its_answer() {
        let p = pair_away();
        assert_eq!(p.a.engine.answer_wait(), engine::ANSWER_WAIT);
        for tag in 1..=4 {
            write_polled_in(&p, tag);
            // Taken in; the program answers 2 ms later.
            std::thread::sleep(Duration::from_millis(2));
            answer_polled(&p);
        }
        assert!(p.a.engine.answer().1, "the program answers");
        assert_eq!(p.a.engine.answer_wait(), engine::ANSWER_WAIT_MAX);
    }

    /// A program that exits with the ACK of the last request it took in
    /// held for its answer (a ping-pong's last message) still has it
    /// sent: the process's exit sends what its engines hold.
    #[test]
    fn a_program_s_exit_sends_the_acks_held_for_its_answer() {
        let p = pair_away();
        p.a.engine.set_answer_wait(60_000_000_000);
        write_polled_in(&p, 1);
        answer_polled(&p);
        write_polled_in(&p, 2);
        assert_eq!(p.a.engine.answer(), (true, true), "the ACK waits");
        assert!(
            p.b_scq.wait(Duration::from_millis(20)).is_err(),
            "not acknowledged before the exit"
        );
        p.a.engine.flush_as_at_exit();
        assert!(!p.a.engine.holding());
        let c = p.b_scq.wait(Duration::from_secs(10)).unwrap();
        assert_eq!((c.wr_id, c.status), (3, WcStatus::Success));
    }

    /// Once a's program has answered a request a poll took in (posted
    /// something to send soon after), the ACKs of the next requests its
    /// polls take in wait for its answer, not for its next poll, and
    /// leave with it. Answers after an empty poll still take them along
    /// but count down to leaving them alone; an answer that does not come
    /// in the answer wait leaves them to go alone, and the engine
    /// unlearns at once.
    #[test]
    fn the_ack_of_a_request_waits_for_the_program_s_answer() {
        const LONG: u64 = 60_000_000_000;
        let p = pair_away();
        p.a.engine.set_answer_wait(LONG);
        // Nothing learned: the ACK leaves at once.
        write_polled_in(&p, 1);
        assert_eq!(p.a.engine.answer(), (false, false));
        answer_polled(&p);
        assert_eq!(p.a.engine.answer(), (false, true), "the program answers");
        // Learned: the next ACK waits for the answer.
        write_polled_in(&p, 2);
        assert_eq!(p.a.engine.answer(), (true, true), "the ACK waits");
        answer_polled(&p);
        // Polls do not send it; an answer after them (the program
        // answering something else) still takes it along, but counts
        // down: after two quick answers, two such, and the next ACK leaves
        // at once.
        write_polled_in(&p, 3);
        assert_eq!(p.a.engine.answer(), (true, true), "the ACK waits");
        for _ in 0..1000 {
            assert!(p.a_scq.try_next().is_none());
        }
        assert!(p.a.engine.answer().0, "a poll does not send it");
        assert!(
            p.b_scq.wait(Duration::from_millis(20)).is_err(),
            "b's WRITE is not acknowledged before the answer"
        );
        answer_polled(&p);
        write_polled_in(&p, 4);
        assert_eq!(p.a.engine.answer(), (true, true), "one count left");
        assert!(p.a_scq.try_next().is_none());
        answer_polled(&p);
        write_polled_in(&p, 5);
        assert_eq!(p.a.engine.answer(), (false, false), "counted down");
        // A receive posted sends nothing: no answer.
        p._a_qp
            .post_recv(RecvWr {
                wr_id: 6,
                sg_list: sg_list![p.a_mr.sge(0, 64)],
            })
            .unwrap();
        assert_eq!(
            p.a.engine.answer(),
            (false, false),
            "a receive is no answer"
        );
        p.sent();
        // Learned again; then no answer: the ACK leaves on its own after
        // the wait, and the next one leaves at once.
        p.a.engine.set_answer_wait(5_000_000);
        write_polled_in(&p, 6);
        answer_polled(&p);
        write_polled_in(&p, 7);
        assert_eq!(p.a.engine.answer(), (true, true));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while p.a.engine.holding() {
            assert!(p.a_scq.try_next().is_none());
            assert!(std::time::Instant::now() < deadline, "bounded");
        }
        p.sent();
        assert_eq!(p.a.engine.answer(), (false, false), "unlearned");
        write_polled_in(&p, 8);
        assert!(!p.a.engine.holding(), "the ACK left at once");
        p.sent();
        assert_eq!(p.b_qp.dev.counters().unwrap().completer_retry_err, 0);
    }

    /// Without GSO too, ACKs held for the answer leave behind it: the
    /// peer, polling for the ACK, has taken the answer in by the time the
    /// ACK hands it its completion (ahead of it, the peer stopped polling
    /// with the answer still on its way).
    #[test]
    fn without_gso_the_answer_leaves_before_the_ack() {
        let p = pair_away();
        p.a.engine.set_gso(false);
        p.a.engine.set_answer_wait(60_000_000_000);
        write_polled_in(&p, 1);
        answer_polled(&p);
        let tap = p.a.tap().unwrap();
        write_polled_in(&p, 2);
        assert_eq!(p.a.engine.answer(), (true, true), "the ACK waits");
        answer_polled(&p);
        let sent: Vec<u8> = tap
            .try_iter()
            .filter(|e| e.sent)
            .filter_map(|e| e.datagram.payload.first().copied())
            .collect();
        assert_eq!(
            sent,
            [
                rnic_wire::Opcode::RC_SEND_ONLY.0,
                rnic_wire::Opcode::RC_ACKNOWLEDGE.0
            ],
            "the answer, then the ACK"
        );
    }

    /// A new NIC has learned nothing: a request taken in while its
    /// program polls is acknowledged at once. And one the engine thread
    /// takes in while no thread of the program polls or posts is
    /// acknowledged at once, though the program answered before: nobody
    /// is there to answer now.
    #[test]
    fn the_ack_waits_for_no_answer_while_nobody_polls() {
        let p = pair();
        p.a.engine.set_answer_wait(60_000_000_000);
        write_polled_in(&p, 1);
        assert_eq!(p.a.engine.answer(), (false, false), "nothing learned");
        answer(&p);
        assert_eq!(p.a.engine.answer(), (false, true), "the program answers");
        answered(&p);
        // Longer than a poller counts as about (watch::AWAY_MAX).
        std::thread::sleep(Duration::from_millis(5));
        for _ in 0..3 {
            p.write();
            p.sent();
        }
        assert_eq!(p.a.engine.answer(), (false, true));
    }

    /// Steering RC responses apart is off unless asked for
    /// (`RNIC_RESPONSE_SOCKET=on`): while a's engine thread watches for
    /// requests and a thread polls, the responses stay on the one socket.
    #[test]
    fn responses_are_not_steered_apart_by_default() {
        if std::env::var_os("RNIC_RESPONSE_SOCKET").is_some() {
            return;
        }
        let p = pair_away();
        let stays = p.a.engine.stays();
        p.write();
        p.sent();
        assert_eq!(
            p.a.engine.stays(),
            stays + 1,
            "the WRITE kept a's engine watching"
        );
        for i in 0..30 {
            p.send_polled(i);
            assert!(!p.a.engine.steering(), "steered at round trip {i}");
        }
    }

    /// While a's engine thread watches for requests (a WRITE waited for it:
    /// a program spinning on memory) and a thread polls, the ACKs of a's
    /// SENDs reach the polling thread without waking the engine thread
    /// (see `engine::response_socket`).
    #[test]
    fn responses_are_left_to_pollers_while_the_engine_watches_for_requests() {
        let p = pair_away();
        p.a.engine.steer_when_staying(true);
        let mut tries = 0;
        loop {
            tries += 1;
            // A WRITE that waits for a's engine thread: it comes back,
            // finds it, and stays to watch for requests.
            let stays = p.a.engine.stays();
            p.write();
            p.sent();
            assert_eq!(
                p.a.engine.stays(),
                stays + 1,
                "the WRITE kept a's engine watching"
            );
            // It sees this thread poll when it next wakes (for the first
            // ACK, say), and then leaves the responses to it.
            for _ in 0..30 {
                if p.a.engine.steering() || p.a.engine.is_away() {
                    break;
                }
                p.send_polled(0);
            }
            let engine_took = p.a.engine.engine_packets();
            for i in 1..=20 {
                p.send_polled(i);
            }
            let away = p.a.engine.is_away();
            if away && tries < 5 {
                // The stay ended before or during the round trips (a slow
                // machine): not what this test looks at. Again, with a
                // longer stay.
                continue;
            }
            assert!(!away, "a's engine thread watched throughout");
            assert_eq!(
                p.a.engine.engine_packets(),
                engine_took,
                "a's engine thread took in none of the ACKs"
            );
            break;
        }
    }

    /// Steering starting and stopping does not let a response overtake
    /// an older one: what waited on the first socket from before the start
    /// is taken in before what was steered to the second, and at the stop
    /// what the second holds before anything newer on the first.
    #[test]
    fn responses_keep_their_order_when_steering_starts_and_stops() {
        // An engine thread away from the socket: what arrives waits for
        // this thread's polls.
        let p = pair_away();
        let d = &p.a;
        let addr = d.addr();
        let tap = d.tap().unwrap();
        let peer = std::net::UdpSocket::bind((IpAddr::from([127, 0, 33, 3]), 0)).unwrap();
        let to = std::net::SocketAddr::new(addr, engine::ROCE_PORT);
        // Ghost ACKs for a QP that does not exist, numbered by their PSN:
        // received (and shown to the tap), then dropped.
        let send = |psns: std::ops::Range<u32>| {
            for p in psns {
                let mut ack = [0u8; 20];
                ack[0] = 0x11; // RC ACKNOWLEDGE
                ack[7] = 0x99; // destination QP 0x000099
                ack[9..12].copy_from_slice(&p.to_be_bytes()[1..]);
                peer.send_to(&ack, to).unwrap();
            }
        };
        let mut seen = Vec::new();
        let mut take = |n: usize| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while seen.len() < n {
                d.engine.progress();
                while let Ok(e) = tap.try_recv() {
                    if !e.sent {
                        let b = &e.datagram.payload;
                        seen.push(u32::from_be_bytes([0, b[9], b[10], b[11]]));
                    }
                }
                assert!(std::time::Instant::now() < deadline, "bounded");
            }
        };
        // 40 on the first socket, then steering, then 40 on the second.
        d.engine.pin_steering(Some(false));
        send(0..40);
        d.engine.pin_steering(Some(true));
        send(40..80);
        take(80);
        // 40 on the second, steering stops, 40 on the first.
        send(80..120);
        d.engine.pin_steering(Some(false));
        send(120..160);
        take(160);
        // Started and stopped before a poll: the first socket's first.
        send(160..200);
        d.engine.pin_steering(Some(true));
        send(200..240);
        d.engine.pin_steering(Some(false));
        send(240..280);
        take(280);
        assert_eq!(seen, (0..280).collect::<Vec<u32>>());
    }

    /// A NIC's port 4791 is its own while it lives, though its two sockets
    /// let sockets that ask for SO_REUSEPORT join them: another NIC on the
    /// address is refused (the claim), as is a plain socket (the kernel).
    #[test]
    fn a_nic_s_address_is_its_own_while_it_lives() {
        // Outside the range `open_loopback` takes from, so that no test
        // running beside this one takes the address while it is free.
        let addr = IpAddr::from([127, 0, 33, 1]);
        let d = Device::open(addr).unwrap();
        match Device::open(addr) {
            Err(Error::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}"),
            other => panic!("a second NIC on {addr}: {:?}", other.map(|d| d.addr())),
        }
        let port = std::net::SocketAddr::new(addr, engine::ROCE_PORT);
        assert_eq!(
            std::net::UdpSocket::bind(port).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
        drop(d);
        let again = Device::open(addr).expect("free once the NIC is gone");
        assert_eq!(again.addr(), addr);
    }

    #[test]
    fn a_send_that_waited_for_the_engine_does_not_keep_it_watching() {
        let p = pair_away();
        let stays = p.a.engine.stays();
        // Nobody on a polls (a poller held up, say): the engine thread comes
        // back for the SEND, and a's next poll would have shown it anyway.
        p.post();
        p.sent();
        assert_eq!(p.a.engine.stays(), stays, "a SEND kept the engine watching");
        let c = p.a_rcq.spin(Duration::from_secs(10)).unwrap();
        assert_eq!(c.status, WcStatus::Success);
    }

    /// While a's engine thread has left the socket to a polling thread,
    /// timers still fire on time: on its looks at the pollers the engine
    /// thread reads the deadline that whoever armed it published, and
    /// takes the lock only then. Three ways to arm one: a poll that sends
    /// a request a post held (its ACK timeout), a post that sends a
    /// request too long to hold, and a poll that takes in a receiver-not-
    /// ready NAK (its RNR timer, long before the ACK timeout). The peer
    /// never answers (its QP is gone), or has no receive posted; after the
    /// one retry allowed the request fails.
    #[test]
    fn timers_fire_while_the_engine_leaves_the_socket_to_pollers() {
        let cases = [
            (8, false, WcStatus::RetryExcErr),
            (64 * 1024, false, WcStatus::RetryExcErr),
            (8, true, WcStatus::RnrRetryExcErr),
        ];
        for (len, rnr, status) in cases {
            let p = pair();
            let pd = p.a.alloc_pd().unwrap();
            let cq = p.a.create_cq(8).unwrap();
            let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
            let c = Device::open_loopback().unwrap();
            let (pc, c_cq) = (c.alloc_pd().unwrap(), c.create_cq(8).unwrap());
            let peer = pc.create_rc_qp(&c_cq, &c_cq, QpCaps::default()).unwrap();
            let o = ConnectOptions {
                // 1 ms; 4.3 s where the RNR timer (0.64 ms) must fire.
                timeout: if rnr { 20 } else { 8 },
                retry_cnt: 1,
                rnr_retry: 1,
                ..ConnectOptions::default()
            };
            qp.connect(&peer.endpoint(), &o).unwrap();
            peer.connect(&qp.endpoint(), &o).unwrap();
            if !rnr {
                drop(peer);
            }
            let mr = pd.register(len, Access::LOCAL_WRITE).unwrap();
            // Away for as long as this thread polls, and for 10 s after:
            // nothing but the deadline brings the engine thread back in
            // time (a look at the pollers at a shorter bound may run a
            // timer it missed, late).
            p.a.engine.set_away_max(10_000_000_000);
            p.until_away();
            assert!(p.a.engine.is_away());
            let op = if rnr {
                SendOp::Send { imm: None }
            } else {
                SendOp::Write {
                    remote_addr: 0x1000,
                    rkey: 1,
                    imm: None,
                }
            };
            qp.post_send(SendWr {
                wr_id: 9,
                op,
                sg_list: sg_list![mr.sge(0, len as u32)],
                signaled: true,
                solicited: false,
                fence: false,
                inline: None,
            })
            .unwrap();
            // Polling without pause: the engine thread stays away, and a
            // poll runs no timer the engine thread is not late for. The
            // retries take milliseconds; a deadline the engine thread
            // missed comes seconds late, if at all.
            let done = cq.spin(Duration::from_secs(2)).unwrap();
            assert_eq!((done.wr_id, done.status), (9, status), "{len} B, RNR {rnr}");
        }
    }

    /// A program that keeps posting but takes nothing in (it polls only
    /// now and then, or only finds completions waiting) leaves the engine
    /// thread away, and nobody took in what came meanwhile: a WRITE to it
    /// waited for the program's next poll of an empty queue, past the
    /// peer's ACK timeout (`rnic soak`: 1% loss, 16.8 ms timeouts,
    /// requests failed with RETRY_EXC_ERR within seconds). The engine
    /// thread takes it in at its next look, at most a time away later.
    #[test]
    fn what_arrives_while_the_program_only_posts_is_taken_in_at_the_next_look() {
        let p = pair();
        p.until_away();
        assert!(p.a.engine.is_away());
        let stop = AtomicBool::new(false);
        let c = std::thread::scope(|s| {
            s.spawn(|| p.post_receives_until(&stop));
            p.write();
            let c = p.b_scq.wait(Duration::from_secs(5));
            stop.store(true, Ordering::Relaxed);
            c
        });
        let c = c.expect("the WRITE completes");
        assert_eq!((c.wr_id, c.status), (3, WcStatus::Success));
    }

    /// The CPU time a thread of this process has used, in clock ticks.
    fn cpu_ticks(tid: i32) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
        // After the command's closing parenthesis: state is field 3, utime
        // and stime fields 14 and 15.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    }

    /// A responder whose program never polls (the server of ib_read_lat)
    /// has only its engine thread: requests that follow each other closely
    /// find it lingering on the socket, in the normal class, instead of
    /// asleep (nearly all of them on an idle machine, a third beside two
    /// threads that spin; none without lingering). The requester's engine,
    /// whose program polls, never lingers; and once the requests stop, the
    /// responder's engine sleeps again, in real time where it started
    /// there.
    #[test]
    fn a_responder_nobody_polls_lingers_while_requests_follow_closely() {
        let p = pair();
        let (tid, requests) = (p.a.engine.engine_tid(), 3000);
        let started_realtime = crate::sched::is_realtime(tid);
        let mut seen_normal = false;
        for i in 0..requests {
            p.write();
            let c = p.b_scq.spin(Duration::from_secs(10)).unwrap();
            assert_eq!(c.status, WcStatus::Success);
            if i % 16 == 0 && !crate::sched::is_realtime(tid) {
                seen_normal = true;
            }
        }
        let lingered = p.a.engine.lingered_packets();
        assert!(
            lingered * 10 >= requests,
            "{lingered} of {requests} requests found a's engine lingering"
        );
        assert_eq!(p.b_pd.dev.engine.lingered_packets(), 0, "b's program polls");
        if started_realtime {
            assert!(seen_normal, "a's engine lingered in real time");
        }
        // Asleep again within a few windows (bounded).
        let asleep = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(1));
            crate::sched::is_realtime(tid) == started_realtime
        });
        assert!(asleep, "a's engine did not go back to real time");
        let before = cpu_ticks(tid);
        std::thread::sleep(Duration::from_millis(300));
        let used = cpu_ticks(tid) - before;
        // Clock ticks are 10 ms: lingering on would be about 30.
        assert!(used <= 5, "a's engine used {used} ticks in 300 ms of quiet");
    }

    /// A program that posts receives now and then but never polls takes
    /// nothing in: the engine thread, away because a thread posts, finds
    /// WRITEs waiting at its look with nothing taken by pollers since the
    /// look before, and comes back to watch the socket. Before, every
    /// WRITE waited a look (up to 8 ms).
    #[test]
    fn requests_to_a_program_that_only_posts_wait_for_one_look_at_most() {
        let p = pair_away();
        let (looked_before, stays_before) = (p.a.engine.looked_packets(), p.a.engine.stays());
        let polled_before = p.a.engine.polled_packets();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| p.post_receives_until(&stop));
            for _ in 0..300 {
                p.write();
                let c = p.b_scq.spin(Duration::from_secs(10)).unwrap();
                assert_eq!(c.status, WcStatus::Success);
            }
            stop.store(true, Ordering::Relaxed);
        });
        let looked = p.a.engine.looked_packets() - looked_before;
        let stays = p.a.engine.stays() - stays_before;
        assert!(stays >= 1, "a's engine never came back");
        assert!(
            looked <= 30,
            "{looked} of 300 WRITEs waited for a look ({stays} stays)"
        );
        assert_eq!(p.a.engine.polled_packets(), polled_before);
    }

    #[test]
    fn a_write_that_waited_for_the_engine_keeps_it_watching() {
        let p = pair_away();
        let stays = p.a.engine.stays();
        // A WRITE shows in no completion queue of a's: a program waiting for
        // it spins on memory, and needs the engine thread.
        p.write();
        p.sent();
        assert_eq!(p.a.engine.stays(), stays + 1);
        let mut landed = [0u8; 8];
        assert!(p.a_target.read(0, &mut landed));
        let mut sent = [0u8; 8];
        assert!(p.b_mr.read(0, &mut sent));
        assert_eq!(landed, sent);
    }

    #[test]
    fn a_thread_that_posts_keeps_the_engine_away() {
        let p = pair_away();
        // Receives posted for four times TEST_AWAY, no poll.
        for i in 0..200 {
            p._a_qp
                .post_recv(RecvWr {
                    wr_id: 100 + i,
                    sg_list: sg_list![p.a_mr.sge(0, 64)],
                })
                .unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        // It may be between two sleeps away: look a few times.
        let away = (0..200).any(|_| {
            std::thread::sleep(Duration::from_micros(10));
            p.a.engine.is_away()
        });
        assert!(away, "the engine thread came back while a thread posted");
    }

    /// A real-time engine thread runs on the core of the thread that
    /// polls, follows it to another, and may run anywhere again once
    /// nobody polls (`sched::Follow`). In the normal class it stays free.
    #[test]
    fn the_engine_thread_runs_where_its_program_polls() {
        use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
        let d = Device::open_loopback().unwrap();
        let cq = d.create_cq(4).unwrap();
        let realtime = sched::is_realtime(d.engine.engine_tid());
        let allowed = sched_getaffinity(None).unwrap();
        assert_eq!(d.engine.engine_cpus(), allowed);
        let cores: Vec<usize> = (0..CpuSet::MAX_CPU)
            .filter(|&c| allowed.is_set(c))
            .collect();
        // Last core first, so the first move is away from where the engine
        // thread most likely started.
        for &core in cores.iter().rev().take(2) {
            let followed = std::thread::scope(|s| {
                s.spawn(|| {
                    sched_setaffinity(None, &sched::one_core(core)).unwrap();
                    let limit = Duration::from_millis(if realtime { 5000 } else { 100 });
                    let t = std::time::Instant::now();
                    while t.elapsed() < limit {
                        assert!(cq.try_next().is_none());
                        if d.engine.engine_cpus() == sched::one_core(core) {
                            return true;
                        }
                    }
                    false
                })
                .join()
                .unwrap()
            });
            assert_eq!(followed, realtime, "core {core}, real time: {realtime}");
        }
        // Nobody polls: the engine thread may run anywhere again.
        let t = std::time::Instant::now();
        while d.engine.engine_cpus() != allowed && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(d.engine.engine_cpus(), allowed);
    }

    #[test]
    fn arming_a_queue_for_an_event_brings_the_engine_back() {
        let p = pair();
        p.a.engine.set_away_max(60_000_000_000);
        p.until_away();
        p.send_later(|cq| {
            cq.req_notify();
            let id = p.chan.get_cq_event(Duration::from_secs(10))?;
            assert_eq!(id, cq.id());
            cq.try_next().ok_or(Error::Timeout)
        });
    }
}
