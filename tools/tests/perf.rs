//! `rnic perf` runs every operation to completion and reports in JSON.

use std::process::Command;

#[test]
fn perf_json_for_every_operation() {
    for op in ["write", "read", "send"] {
        let out = Command::new(env!("CARGO_BIN_EXE_rnic"))
            .args(["perf", op, "-s", "8192", "-n", "200", "--json"])
            .output()
            .expect("run rnic perf");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{op}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains("\"ok\":true") && text.contains("\"iterations\":200"),
            "{op}: {text}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args(["perf", "write", "-s", "64", "-n", "50", "--lat"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("t_p99[usec]"));
}
