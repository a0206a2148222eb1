//! The NIC itself, without I/O: memory regions and protection domains, queue
//! pairs and their state machine, and (in [`sim`]) a deterministic lossy network
//! for simulation.
//!
//! Nothing here touches a socket, a thread or the clock: time comes in as a
//! value, randomness from a seed. The same code runs under the driver and under
//! the simulator.

#![forbid(unsafe_code)]

pub mod mem;
pub mod qp;
pub mod rng;
pub mod sim;
pub mod time;
