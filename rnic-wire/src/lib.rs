//! RoCE v2 packet formats, bit for bit.
//!
//! Every header RoCE v2 uses is a module with a zero-copy `Packet<T>` view (one
//! getter and one setter per IBTA field) and a plain `Repr` with `parse` and
//! `emit`, in the manner of smoltcp's `wire` module:
//!
//! | module | header |
//! |---|---|
//! | [`bth`] | Base Transport Header |
//! | [`reth`], [`aeth`], [`atomic_eth`], [`atomic_ack_eth`], [`immdt`], [`ieth`], [`deth`], [`feth`], [`xrceth`], [`cnp`] | extension headers |
//! | [`opcode`] | the opcode table, as data |
//! | [`ib`] | a whole IB transport packet: BTH, extension headers, payload, pad, ICRC |
//! | [`icrc`] | the invariant CRC |
//! | [`encap`] | Ethernet, IPv4, IPv6, UDP; whole frames |
//! | [`psn`] | 24-bit sequence numbers with modular comparison |
//! | [`mad`], [`cm`] | management datagrams on QP1, and the communication manager's messages in them (with rdma_cm's header and the kernel's derivations) |
//! | [`pcap`] | capture files |
//!
//! Nothing here does I/O or keeps state, and nothing panics on bad input: every
//! parse error is an [`Error`] naming the header, the byte offset and the reason.

#![forbid(unsafe_code)]

mod error;
mod field;

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod cm;
pub mod cnp;
pub mod deth;
pub mod encap;
pub mod feth;
pub mod ib;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod mad;
pub mod opcode;
pub mod pcap;
pub mod psn;
pub mod reth;
pub mod xrceth;

pub use encap::udp::ROCE_V2_PORT;
pub use encap::{Frame, FrameRepr, IpRepr, LinkType};
pub use error::{Error, ErrorKind, Layer, Result};
pub use ib::{IbPacket, IbRepr, MAX_PAYLOAD};
pub use icrc::ICRC_LEN;
pub use opcode::{ExtHeader, Opcode, OpcodeInfo, Operation, Position, Transport};
pub use psn::Psn;
