//! Two NICs' communication managers on QP 1, driven by the fuzzer through
//! `rnic_core::fuzz::cm::run`: the real REQ/REP/RTU/DREQ exchange dropped,
//! duplicated and reordered among forged MADs, with timers and the
//! applications' answers. Nothing may panic; the listener is never
//! connected to what it did not accept and holds no more than its backlog.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rnic_core::fuzz::cm::run(data));
