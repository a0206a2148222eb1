//! The NIC itself, without I/O: memory regions and protection domains, queue
//! pairs and their state machine, the RC transport (requester, responder,
//! completer), completion queues, and (in [`sim`]) a deterministic lossy
//! network and a harness that runs NICs over it.
//!
//! Nothing here touches a socket, a thread or the clock: time comes in as a
//! value, randomness from a seed. The same code runs under the driver and under
//! the simulator.

#![forbid(unsafe_code)]

mod comp;
pub mod cq;
pub mod fuzz;
pub mod mem;
pub mod nic;
pub mod qp;
mod rc;
mod req;
mod resp;
pub mod rng;
pub mod sim;
pub mod srq;
pub mod time;
mod txq;
mod ud;
pub mod wr;

pub use nic::{Counters, DeviceAttr, Footprint, Mechanisms, Nic, VerbError, DEVICE_ATTR};
pub use rc::{ExecKind, Execution, QpCaps};
