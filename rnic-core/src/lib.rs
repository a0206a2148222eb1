//! The NIC itself, without I/O: memory regions and protection domains, queue
//! pairs and their state machine, the RC transport (requester, responder,
//! completer), completion queues, and (in [`sim`]) a deterministic lossy
//! network and a harness that runs NICs over it.
//!
//! Nothing here touches a socket, a thread or the clock: time comes in as a
//! value, randomness from a seed. The same code runs under the driver and under
//! the simulator.

#![forbid(unsafe_code)]

pub mod check;
pub mod cm;
mod comp;
pub mod counters;
pub mod cq;
pub mod datagram;
pub mod device;
pub mod error;
#[cfg(feature = "fuzz")]
pub mod fuzz;
pub mod mem;
pub mod nic;
pub mod pool;
pub mod qp;
mod rc;
mod req;
mod resp;
pub mod rng;
pub mod sim;
pub mod srq;
mod table;
pub mod time;
mod txq;
mod ud;
pub mod wr;

pub use counters::{Counters, Footprint};
pub use datagram::{Arrival, Datagram, Header, Kind};
pub use device::{DeviceAttr, DEVICE_ATTR};
pub use error::VerbError;
pub use nic::Nic;
pub use rc::{ExecKind, Execution, Mechanisms, QpCaps};
