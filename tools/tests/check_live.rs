//! `rnic check` on rnic's own traffic over real UDP sockets on loopback,
//! its egress impaired (loss, duplication, reordering): every packet as the
//! NIC sent it (`RNIC_PCAP` records before the impairment, which stands for
//! the network beyond the NIC) must break none of the transport's rules,
//! and, the capture missing nothing and holding nothing the network did,
//! draw no note or warning either.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Run `rnic ARGS` with the environment `env`, recording into a capture
/// of its own named `name`, and return `rnic check`'s report on it: the
/// run must succeed and the capture be clean, without note or warning.
fn run_and_check(name: &str, args: &[&str], env: &[(&str, &str)], pcap_flag: bool) -> String {
    let pcap: PathBuf = std::env::temp_dir().join(format!(
        "rnic-check-live-{name}-{}.pcap",
        std::process::id()
    ));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rnic"));
    cmd.args(args).envs(env.iter().copied());
    if pcap_flag {
        cmd.arg("--pcap").arg(&pcap);
    } else {
        cmd.env("RNIC_PCAP", &pcap);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "rnic {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report = check(&pcap);
    let _ = std::fs::remove_file(&pcap);
    report
}

fn check(pcap: &Path) -> String {
    let check = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .arg("check")
        .arg(pcap)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&check.stdout).into_owned();
    assert!(check.status.success(), "{report}");
    assert!(
        !report.contains("note:") && !report.contains("warning:"),
        "{report}"
    );
    report
}

#[test]
fn rnic_s_impaired_traffic_on_loopback_is_conformant() {
    for seed in 1..=2 {
        let impair = format!("loss=2%,dup=1%,reorder=3%,seed={seed}");
        for (op, size) in [("write", "65536"), ("read", "16384"), ("send", "8192")] {
            let report = run_and_check(
                &format!("{op}-{seed}"),
                &["perf", op, "--loopback", "-s", size, "-n", "300"],
                &[("RNIC_IMPAIR", &impair)],
                false,
            );
            assert!(report.contains("1 RC"), "{op} (seed {seed}): {report}");
        }
    }
}

/// `rnic soak --pcap`: many connections both ways, every operation mixed,
/// connections remade all the time (their QP numbers drawn again), on
/// links that lose, copy, reorder and damage.
#[test]
fn rnic_soak_s_capture_is_conformant() {
    let report = run_and_check(
        "soak",
        &[
            "soak",
            "-D",
            "2",
            "-q",
            "8",
            "--churn-ms",
            "50",
            "--report",
            "10",
            "--impair",
            "loss=1%,dup=1%,reorder=2%,corrupt=0.1%,seed=7",
        ],
        &[],
        true,
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
