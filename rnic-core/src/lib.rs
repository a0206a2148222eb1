//! The NIC itself, without I/O: memory regions, queue pairs, requester,
//! responder, completer, and a deterministic network simulator.
//!
//! Not written yet: this crate holds only its place in the workspace. See the
//! README for what is planned and what exists.
