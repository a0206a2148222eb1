//! Every saved input of the session fuzz targets (`fuzz/seeds/TARGET`),
//! replayed through the same session under `cargo test`: a case the fuzzer
//! or a review once found stays a test. And a few thousand inputs from a
//! seeded generator through each, so that the oracles run on every
//! `cargo test`, fuzzer or not.

use std::fs;
use std::path::Path;

fn replay(target: &str, run: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/seeds")
        .join(target);
    let mut n = 0;
    for entry in fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let data = fs::read(&path).unwrap();
        let name = path.display().to_string();
        let outcome = std::panic::catch_unwind(|| run(&data));
        assert!(outcome.is_ok(), "{name} failed");
        n += 1;
    }
    assert!(n > 0, "no saved cases in {}", dir.display());
}

/// `n` inputs of 64 to 1,600 bytes from a seeded xorshift generator.
fn random_inputs(n: usize, run: fn(&[u8])) {
    let mut x = 0x9E37_79B9_7F4A_7C15_u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..n {
        let len = 64 + (next() % 1536) as usize;
        let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        run(&data);
    }
}

#[test]
fn every_saved_nic_packets_case_replays_clean() {
    replay("nic_packets", rnic_core::fuzz::run);
}

#[test]
fn every_saved_responder_case_replays_clean() {
    replay("responder", rnic_core::fuzz::responder::run);
}

#[test]
fn every_saved_requester_case_replays_clean() {
    replay("requester", rnic_core::fuzz::requester::run);
}

#[test]
fn random_two_nic_sessions_keep_every_invariant() {
    random_inputs(40_000, rnic_core::fuzz::run);
}

#[test]
fn random_requests_touch_only_what_they_may() {
    random_inputs(40_000, rnic_core::fuzz::responder::run);
}

#[test]
fn random_responses_leave_no_requester_stuck() {
    random_inputs(40_000, rnic_core::fuzz::requester::run);
}

#[test]
fn every_saved_cm_case_replays_clean() {
    replay("cm", rnic_core::fuzz::cm::run);
}

#[test]
fn random_cm_sessions_never_connect_what_was_not_accepted() {
    random_inputs(20_000, rnic_core::fuzz::cm::run);
}

#[test]
fn every_saved_check_case_replays_clean() {
    replay("check", rnic_core::fuzz::check::run);
}

#[test]
fn random_frames_never_trouble_the_checker() {
    random_inputs(20_000, rnic_core::fuzz::check::run);
}
