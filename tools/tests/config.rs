//! `rnic config`: the environment variables, from the one list rnic-verbs
//! keeps; the README's table is that list.

use std::process::Command;

/// The README shows the table `rnic config --markdown` prints, between its
/// markers: regenerate it with that command when a variable changes.
#[test]
fn the_readme_s_table_is_the_list_of_variables() {
    let out = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args(["config", "--markdown"])
        .output()
        .expect("run rnic config");
    assert!(out.status.success());
    let table = String::from_utf8(out.stdout).unwrap();
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("the README");
    let (begin, end) = ("<!-- rnic config --markdown -->\n", "<!-- end -->");
    let start = readme.find(begin).expect("the README marks its table") + begin.len();
    let stop = start + readme[start..].find(end).expect("the table's end marker");
    assert_eq!(
        &readme[start..stop],
        table,
        "the README's table is not `rnic config --markdown`"
    );
    for v in rnic_verbs::config::VARIABLES {
        assert!(table.contains(v.name), "{}", v.name);
    }
}

/// A value a device cannot use is reported, naming the variable, before any
/// program meets it; a good one is shown.
#[test]
fn a_bad_value_is_named_and_a_good_one_shown() {
    let run = |var: &str, value: &str| {
        Command::new(env!("CARGO_BIN_EXE_rnic"))
            .arg("config")
            .env(var, value)
            .env_remove("RNIC_PCAP")
            .output()
            .expect("run rnic config")
    };
    let bad = run("RNIC_GSO", "maybe");
    assert_eq!(bad.status.code(), Some(2));
    let e = String::from_utf8_lossy(&bad.stderr);
    assert!(e.contains("RNIC_GSO=\"maybe\": expected on or off"), "{e}");
    let good = run("RNIC_BUSY_POLL_US", "0");
    assert!(good.status.success());
    let o = String::from_utf8_lossy(&good.stdout);
    assert!(o.contains("RNIC_BUSY_POLL_US=\"0\""), "{o}");
    assert!(o.contains("RNIC_PCAP (unset: no capture)"), "{o}");
}
