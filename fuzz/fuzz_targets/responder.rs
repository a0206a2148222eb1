//! A responder with live RC, UC and UD QPs and regions of every kind of
//! access, fed request packets aimed at and around every bound, through
//! `rnic_core::fuzz::responder::run`. Every byte the engine reads or writes
//! must be one a valid request was allowed to touch.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rnic_core::fuzz::responder::run(data));
