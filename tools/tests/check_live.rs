//! `rnic check` on rnic's own traffic over real UDP sockets on loopback,
//! its egress impaired (loss, duplication, reordering): every packet as the
//! NIC sent it (`RNIC_PCAP` records before the impairment, which stands for
//! the network beyond the NIC) must break none of the transport's rules,
//! and, the capture missing nothing and holding nothing the network did,
//! draw no note either.

use std::process::Command;

fn run(op: &str, size: &str, seed: u32) {
    let pcap = std::env::temp_dir().join(format!(
        "rnic-check-live-{op}-{seed}-{}.pcap",
        std::process::id()
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args(["perf", op, "--loopback", "-s", size, "-n", "300"])
        .env("RNIC_PCAP", &pcap)
        .env(
            "RNIC_IMPAIR",
            format!("loss=2%,dup=1%,reorder=3%,seed={seed}"),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rnic perf {op}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let check = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .arg("check")
        .arg(&pcap)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&pcap);
    let report = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "rnic perf {op} (seed {seed}):\n{report}"
    );
    assert!(report.contains("1 RC"), "{report}");
    assert!(
        !report.contains("note:") && !report.contains("warning:"),
        "rnic perf {op} (seed {seed}):\n{report}"
    );
}

#[test]
fn rnic_s_impaired_traffic_on_loopback_is_conformant() {
    for seed in 1..=2 {
        run("write", "65536", seed);
        run("read", "16384", seed);
        run("send", "8192", seed);
    }
}

/// `rnic soak --pcap`: many connections both ways, every operation mixed,
/// connections remade all the time (their QP numbers drawn again), on
/// links that lose, copy and reorder: what the two NICs sent is
/// conformant and draws no warning.
#[test]
fn rnic_soak_s_capture_is_conformant() {
    let pcap = std::env::temp_dir().join(format!("rnic-soak-{}.pcap", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args([
            "soak",
            "-D",
            "2",
            "-q",
            "8",
            "--churn-ms",
            "50",
            "--report",
            "10",
        ])
        .args(["--impair", "loss=1%,dup=1%,reorder=2%,seed=7", "--pcap"])
        .arg(&pcap)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rnic soak: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let check = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .arg("check")
        .arg(&pcap)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&pcap);
    let report = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{report}");
    assert!(
        !report.contains("warning:") && !report.contains("note:"),
        "{report}"
    );
    // More connections than at any one time: the ones remade are told
    // from the ones they replaced.
    let rc: usize = report
        .lines()
        .next()
        .and_then(|l| l.split(" RC,").next()?.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(rc > 16, "{rc} RC connections: {report}");
}
