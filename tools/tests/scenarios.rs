//! `rnic demo --scenario`: every scenario holds its checks, tells the same
//! story on every run (the simulator and its losses are scripted), and
//! writes a capture whose every packet verifies and which `rnic check`
//! finds conformant.

use std::process::Command;

fn rnic(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args(args)
        .output()
        .expect("run rnic");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn every_scenario_holds_tells_the_same_story_twice_and_captures_clean_packets() {
    let (ok, list) = rnic(&["demo", "--list"]);
    assert!(ok, "{list}");
    let names: Vec<&str> = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for want in [
        "loss", "rnr", "access", "read", "uc", "ud", "credits", "wrap",
    ] {
        assert!(names.contains(&want), "--list lacks {want}: {list}");
    }
    for name in names {
        let pcap =
            std::env::temp_dir().join(format!("rnic-scenario-{name}-{}.pcap", std::process::id()));
        let p = pcap.to_str().unwrap();
        let (ok, first) = rnic(&["demo", "--scenario", name, "--pcap", p]);
        assert!(ok, "{name}:\n{first}");
        assert!(first.contains("Checked: the packets, memory and completions are as told."));
        let (ok, again) = rnic(&["demo", "--scenario", name, "--pcap", p]);
        assert!(ok, "{name}:\n{again}");
        assert_eq!(
            first, again,
            "{name} told a different story the second time"
        );
        let (ok, verdict) = rnic(&["check", p]);
        assert!(
            ok,
            "{name}: rnic check finds rnic's own traffic at fault:\n{verdict}"
        );
        assert!(
            verdict.contains("\nclean: 0 violation(s)") && !verdict.contains("warning:"),
            "{name}: {verdict}"
        );
        let (ok, check) = rnic(&["dump", "--check", "-q", p]);
        let _ = std::fs::remove_file(&pcap);
        assert!(ok, "{name}: {check}");
        assert!(check.contains(" 0 ICRC failures"), "{name}: {check}");
        // Every packet the story printed is in the capture, lost ones too
        // (it is taken on the sender's side).
        let printed = first
            .lines()
            .filter(|l| l.contains(" -> B ") || l.contains(" <- B "))
            .count();
        assert!(
            check.contains(&format!("{printed} RoCE v2 packets")),
            "{name}: {printed} packets told, capture: {check}"
        );
    }
}

#[test]
fn an_unknown_scenario_is_refused_with_the_way_to_the_list() {
    let (ok, text) = rnic(&["demo", "--scenario", "nosuch"]);
    assert!(!ok);
    assert!(text.contains("rnic demo --list"), "{text}");
}
