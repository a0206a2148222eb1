//! Two NICs with a connected QP pair, driven by the fuzzer through
//! `rnic_core::fuzz::run`: forged packets, work requests good and bad, the
//! real traffic reordered, duplicated and dropped, timers and state changes.
//! Nothing may panic; every completion belongs to a posted work request and
//! completes once.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rnic_core::fuzz::run(data));
