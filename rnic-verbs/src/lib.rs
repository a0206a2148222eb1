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
//! A whole program, `examples/hello.rs` (the README's):
//!
//! ```
#![doc = include_str!("../examples/hello.rs")]
//! ```
//!
//! # Where things are
//!
//! One module per verbs object, each constructor beside the type it
//! returns (as rdma-core's providers and the `sideway` bindings are laid
//! out):
//!
//! - `device`: [`Device`] (`ibv_context` and its port), [`PortAttr`];
//! - `pd`: [`ProtectionDomain`], parent domains, [`DomainHold`];
//! - `mr`: [`MemoryRegion`]; `mw`: [`MemoryWindow`];
//! - `cq`: [`CompletionQueue`], with [`CompletionChannel`] (`channel`);
//! - `srq`: [`SharedReceiveQueue`]; `ah`: [`AddressHandle`];
//! - `qp`: [`QueuePair`], [`QpBuilder`], [`Endpoint`], [`ConnectOptions`];
//! - `error`: [`Error`]; [`config`]: what the environment sets ([`Config`]).
//!
//! Under them: `engine` (the NIC's threads and sockets, see its module
//! documentation), `memory` (what registered memory is made of), [`udp`]
//! and [`frames`] (the two transports' system calls), [`impair`] (a bad
//! network on a NIC's egress), `capture` (pcap files) and [`rendezvous`]
//! (how two processes exchange endpoints).
//!
//! # Memory safety
//!
//! Registered memory is owned jointly by the application's
//! [`MemoryRegion`] and the engine, so it cannot be freed while the NIC may
//! still write it; it is made of atomic bytes, so the application and the
//! engine touching it at once is not a data race (see `memory`). The
//! `unsafe` in the crate is in four modules, `memory` (mapping, viewing and
//! unmapping the pages of a page-backed region), `udp` (recvmmsg and
//! sendmmsg), `frames` (packet sockets, BPF, getifaddrs) and
//! `engine::sched` (CPU affinity and scheduling), in taking over an address
//! claim inherited across `exec` (`engine::sockets`), in the registration of a
//! program's own memory (`ProtectionDomain::register_foreign`,
//! `MemoryRegion::rereg_foreign`, in `mr`), and in the engine's one call of
//! `atexit(3)` (`engine::exit`).

#![deny(unsafe_code)]

mod ah;
mod capture;
mod channel;
pub mod cm;
pub mod config;
mod cq;
mod delivered;
mod device;
mod engine;
mod error;
// AF_PACKET, BPF and getifaddrs, which std and rustix do not wrap.
#[allow(unsafe_code)]
pub mod frames;
pub mod impair;
#[allow(unsafe_code)]
mod memory;
mod mr;
mod mw;
mod pd;
mod qp;
pub mod rendezvous;
mod signals;
mod srq;
#[allow(unsafe_code)]
pub mod udp;

pub use ah::AddressHandle;
pub use channel::{AsyncEventQueue, CompletionChannel};
pub use config::Config;
pub use cq::CompletionQueue;
pub use device::{gid_of, loopback_addrs, parse_env_addr, Device, PortAttr, Sharing};
pub use engine::{nic_on, reserve_loopback, reserve_loopback_for_exec, TapEvent};
pub use error::{Error, Result};
pub use impair::{ImpairStats, Impairment};
pub use memory::{Backing, DmaBuf, Placement};
pub use mr::MemoryRegion;
pub use mw::MemoryWindow;
pub use pd::{DomainHold, ProtectionDomain};
pub use qp::{ConnectOptions, Endpoint, QpBuilder, QueuePair};
pub use srq::SharedReceiveQueue;

pub use rnic_core::mem::{Access, MwBind, MwType};
pub use rnic_core::qp::{AddressVector, AttrMask, Mtu, QpAttr, QpState, QpType};
pub use rnic_core::srq::AsyncEvent;
pub use rnic_core::wr::{
    sg_list, Completion, InlineData, NetworkHdr, RecvWr, SendOp, SendWr, SgList, Sge, UdDest,
    WcOpcode, WcStatus, GRH_LEN, MAX_INLINE_DATA,
};
pub use rnic_core::{DeviceAttr, QpCaps, VerbError, DEVICE_ATTR};

/// Where a tap delivers the packets it sees.
pub type TapReceiver = crossbeam_channel::Receiver<TapEvent>;
