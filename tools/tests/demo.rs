//! `rnic demo`, the README's first command, end to end over loopback UDP.

use std::process::Command;

#[test]
fn demo_runs_every_operation_and_its_capture_checks() {
    let pcap = std::env::temp_dir().join(format!("rnic-demo-{}.pcap", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args(["demo", "--pcap"])
        .arg(&pcap)
        .output()
        .expect("run rnic demo");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "rnic demo failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for step in [
        "1. SEND",
        "2. RDMA WRITE",
        "3. RDMA WRITE WITH IMMEDIATE",
        "4. RDMA READ",
        "5. CMP_AND_SWP",
        "6. FETCH_AND_ADD",
    ] {
        assert!(text.contains(step), "missing {step}");
    }
    assert!(text.contains("memory verified: every operation did what it should"));
    assert!(text.contains("ICRC errors 0"));
    assert!(text.contains("RC_RDMA_READ_RESPONSE_LAST"));
    // The capture is whole frames that verify.
    let check = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args(["dump", "--check", "-q"])
        .arg(&pcap)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&pcap);
    let summary = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{summary}");
    assert!(
        summary.contains("16 RoCE v2 packets, 0 ICRC failures"),
        "{summary}"
    );
}

/// `rnic demo --ladder`: the demo's packets as a ladder diagram, drawn
/// from a capture of its own that it leaves behind nowhere.
#[test]
fn demo_draws_its_ladder() {
    let dir = std::env::temp_dir().join(format!("rnic-demo-ladder-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("demo.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args(["demo", "--ladder"])
        .arg(&svg)
        .env("TMPDIR", &dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("ladder diagram written to"), "{text}");
    assert!(!text.contains("capture written to"), "{text}");
    let drawn = std::fs::read_to_string(&svg).unwrap();
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(drawn.starts_with("<svg"), "{drawn}");
    assert!(drawn.contains("16 packets"), "{drawn}");
    assert!(drawn.contains("RC_RDMA_READ_RESPONSE_LAST"), "{drawn}");
    assert_eq!(left, ["demo.svg"]);
}

#[test]
fn devinfo_describes_the_device() {
    let out = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .arg("devinfo")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for field in [
        "hca_id:\trnic_127.0.0.",
        "max_qp_wr:\t\t\t32768",
        "active_mtu:\t\t4096 (5)",
        "RoCE v2",
        "link_layer:\t\tEthernet",
    ] {
        assert!(text.contains(field), "missing {field:?} in\n{text}");
    }
}

#[test]
fn rnic_pcap_records_every_device() {
    let pcap = std::env::temp_dir().join(format!("rnic-env-{}.pcap", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .arg("demo")
        .env("RNIC_PCAP", &pcap)
        .output()
        .unwrap();
    assert!(out.status.success());
    let check = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args(["dump", "--check", "-q"])
        .arg(&pcap)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&pcap);
    let summary = String::from_utf8_lossy(&check.stdout);
    // Both devices recorded into one file, each packet once.
    assert!(
        summary.contains("16 RoCE v2 packets, 0 ICRC failures"),
        "{summary}"
    );
}

#[test]
fn devinfo_on_an_interface_lists_its_addresses_as_gids() {
    // In a network namespace of its own, whose `lo` has 127.0.0.1 and ::1.
    let ns = format!("rnic-devinfo-{}", std::process::id());
    let made = Command::new("ip")
        .args(["netns", "add", &ns])
        .status()
        .is_ok_and(|s| s.success());
    if !made {
        eprintln!("SKIPPED: cannot make a network namespace (not root?)");
        assert!(std::env::var_os("RNIC_REQUIRE_TOOLS").is_none());
        return;
    }
    let out = Command::new("ip")
        .args(["-n", &ns, "link", "set", "lo", "up"])
        .status()
        .and_then(|_| {
            Command::new("ip")
                .args(["netns", "exec", &ns, env!("CARGO_BIN_EXE_rnic")])
                .args(["devinfo", "--iface", "lo"])
                .output()
        });
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    let out = out.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "GID[  0]:\t\t::ffff:127.0.0.1, RoCE v2",
        "GID[  1]:\t\t::1, RoCE v2",
        "frames on lo (AF_PACKET)",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}
