//! `rnic check`'s conformance checker, driven by the fuzzer through
//! `rnic_core::fuzz::check::run`: real captures' frames (the seeds), mutated,
//! as a run of frames and as a capture file. Nothing may panic, and every
//! finding names packets that were fed.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rnic_core::fuzz::check::run(data));
