//! A requester whose peer is the input (ACKs, NAKs, READ responses, atomic
//! ACKs), interleaved with posts and timers, through
//! `rnic_core::fuzz::requester::run`. Completions come once and in order,
//! only READ and atomic targets are written, and once the peer falls silent
//! the send queue drains.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rnic_core::fuzz::requester::run(data));
