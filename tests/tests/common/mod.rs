//! Shared helpers: where the captures are, and whether external tools must be there.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory of real captures (see `tests/captures/README.md`).
pub fn captures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("captures")
}

/// Every `.pcap` in the captures directory, sorted.
pub fn captures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(captures_dir())
        .expect("tests/captures exists")
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    v.sort();
    assert!(v.len() >= 50, "expected the reference captures, found {}", v.len());
    v
}

/// Whether `program` runs (`program --version` or `-c` succeeds). When it does not
/// and `RNIC_REQUIRE_TOOLS=1` (as `.ci/run` sets), the calling test fails; otherwise
/// it prints why it did nothing and passes, so a plain `cargo test` works on a
/// machine without the tool.
pub fn tool_available(program: &str, probe: &[&str]) -> bool {
    let ok = Command::new(program)
        .args(probe)
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let required = std::env::var("RNIC_REQUIRE_TOOLS").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "{program} is required (RNIC_REQUIRE_TOOLS=1) but does not run; .ci/run installs it"
        );
        eprintln!("NOTE: {program} is not installed; this test checked nothing (set RNIC_REQUIRE_TOOLS=1 to make that a failure)");
    }
    ok
}

/// The Python interpreter to use for the Scapy tests.
pub fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string())
}
