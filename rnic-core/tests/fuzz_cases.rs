//! Every saved input of the `nic_packets` fuzz target (`fuzz/seeds/nic_packets`),
//! replayed through the same session under `cargo test`: a case the fuzzer
//! or a review once found stays a test.

use std::fs;
use std::path::Path;

#[test]
fn every_saved_nic_packets_case_replays_clean() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/nic_packets");
    let mut n = 0;
    for entry in fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let data = fs::read(&path).unwrap();
        let name = path.display().to_string();
        let outcome = std::panic::catch_unwind(|| rnic_core::fuzz::run(&data));
        assert!(outcome.is_ok(), "{name} failed");
        n += 1;
    }
    assert!(n > 0, "no saved cases in {}", dir.display());
}
