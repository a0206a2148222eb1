//! The device: a software RoCE v2 NIC on one IP address (or on every
//! address of an interface), its port and GID table, and what it shows of
//! itself (counters, taps, asynchronous events).

use core::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use crossbeam_channel::Receiver;

use crate::engine::{Engine, EngineState, EventSink};
use crate::{
    capture, frames, impair, AsyncEvent, AsyncEventQueue, Config, DeviceAttr, Error, ImpairStats,
    Impairment, Mtu, Result, TapReceiver, DEVICE_ATTR,
};

/// A NIC's part in sharing its address or interface ([`Device::sharing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sharing {
    /// Its slot: the top [`frames::SLOT_BITS`] bits of its QP numbers and
    /// of its connection manager's IDs.
    pub slot: u32,
    /// Packets it received for another slot's NIC and handed on.
    pub relayed: u64,
    /// Packets it received for another slot's NIC that could take no more
    /// (its inbox full): dropped, as a full receive queue drops them. A
    /// packet for a slot no NIC holds is this NIC's to count, as one for a
    /// QP it does not have.
    pub undeliverable: u64,
}

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
    /// its engine thread, configured by the environment ([`Config`]). If
    /// another NIC (of this process or another) holds the address, the new
    /// one shares it, as a host's processes share its addresses: the first
    /// hands on the packets that are the new one's (see
    /// [`Device::sharing`]).
    pub fn open(addr: IpAddr) -> Result<Device> {
        Device::open_with(addr, &Config::from_env()?)
    }

    /// [`Device::open`] configured by `config` rather than the environment.
    pub fn open_with(addr: IpAddr, config: &Config) -> Result<Device> {
        Device::start(addr, None, config, true)
    }

    /// Start a NIC's engine on `addr`, on `iface` if given, recording to
    /// `config.pcap` if it names a file, its egress impaired as
    /// `config.impair` says.
    pub(crate) fn start(
        addr: IpAddr,
        iface: Option<&frames::Interface>,
        config: &Config,
        share: bool,
    ) -> Result<Device> {
        let engine = Engine::start(addr, iface, secret()?, config, share)?;
        let dev = Device {
            engine: Arc::new(engine),
        };
        if let Some(path) = &config.pcap {
            dev.capture(path)?;
        }
        if let Some(i) = config.impair {
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
        Device::open_on_interface_with(name, &Config::from_env()?)
    }

    /// [`Device::open_on_interface`] configured by `config` rather than the
    /// environment.
    pub fn open_on_interface_with(name: &str, config: &Config) -> Result<Device> {
        let iface = frames::Interface::find(name)?;
        Device::start(iface.addr(), Some(&iface), config, true)
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
        Device::open_loopback_with(&Config::from_env()?)
    }

    /// [`Device::open_loopback`] configured by `config` (its `addr`, if
    /// any, rather than the first free loopback address).
    pub fn open_loopback_with(config: &Config) -> Result<Device> {
        if let Some(a) = config.addr {
            return Device::open_with(a, config);
        }
        for addr in loopback_addrs() {
            match Device::start(addr, None, config, false) {
                Ok(d) => return Ok(d),
                Err(Error::Io(e)) if e.kind() == io::ErrorKind::AddrInUse => continue,
                Err(e) => return Err(e),
            }
        }
        Err(Error::NoFreeAddress)
    }

    /// This NIC's part in sharing its address (on the UDP transport) or
    /// interface (on the frame transport) with other NICs, of this process
    /// or others, as a host's processes share its addresses.
    pub fn sharing(&self) -> Result<Sharing> {
        Ok(self.engine.call(|st| Sharing {
            slot: st.relay.own.slot,
            relayed: st.relay.relayed,
            undeliverable: st.relay.undeliverable,
        })?)
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
        self.engine
            .call(move |st| st.events = Some(EventSink::Channel(tx)))?;
        Ok(rx)
    }

    /// Asynchronous events from now on, with a descriptor that is readable
    /// while one waits (`ibv_context.async_fd`).
    pub fn async_event_queue(&self) -> Result<AsyncEventQueue> {
        let (q, raise) = AsyncEventQueue::new()?;
        self.engine
            .call(move |st| st.events = Some(EventSink::Queue(raise)))?;
        Ok(q)
    }

    /// The NIC's counters.
    pub fn counters(&self) -> Result<rnic_core::Counters> {
        Ok(self.engine.call(|st| st.nic.counters())?)
    }

    /// Datagrams the NIC has sent past the kernel's IP and UDP layers, ever:
    /// through a raw packet socket, on loopback to NICs that read it
    /// through receive rings, on an interface to neighbours the kernel has
    /// resolved (IPv4; see docs/configuration.md, `RNIC_RING`). The rest
    /// went through its UDP sockets.
    pub fn sent_past_ip(&self) -> Result<u64> {
        Ok(self.engine.call(|st| st.frames_sent)?)
    }

    /// What the NIC holds ([`rnic_core::Footprint`]), and how many CQs the
    /// driver delivers completions to.
    pub fn footprint(&self) -> Result<(rnic_core::Footprint, usize)> {
        Ok(self.engine.call(|st| (st.nic.footprint(), st.cqs.len()))?)
    }

    pub(crate) fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut EngineState) -> R + Send + 'static,
    ) -> Result<R> {
        Ok(self.engine.call(f)?)
    }

    /// `call` for a verb that posts work (see [`Engine::post`]).
    pub(crate) fn post<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut EngineState) -> R + Send + 'static,
    ) -> Result<R> {
        Ok(self.engine.post(f)?)
    }
}

/// `N` bytes from the operating system's random source (getrandom(2)).
pub(crate) fn os_random<const N: usize>() -> io::Result<[u8; N]> {
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

/// The RoCE v2 GID of an address: the IPv4-mapped IPv6 address, or the
/// IPv6 address.
pub fn gid_of(addr: IpAddr) -> Ipv6Addr {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}
