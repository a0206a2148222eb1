//! `rnic perf`: every operation to completion, in one process and as a server
//! and a client process, reporting in JSON.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn rnic(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args(args)
        .output()
        .expect("run rnic")
}

fn check(what: &str, out: &Output, iterations: &str) {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("\"ok\":true") && text.contains(&format!("\"iterations\":{iterations}")),
        "{what}: {text}"
    );
}

#[test]
fn perf_json_for_every_operation() {
    for op in ["write", "read", "send", "atomic"] {
        let out = rnic(&["perf", op, "-s", "8192", "-n", "200", "--json"]);
        check(op, &out, "200");
    }
    let out = rnic(&["perf", "write", "-s", "64", "-n", "50", "--lat"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("t_p99[usec]"));
    // Many QPs, both directions: twice the messages.
    let out = rnic(&[
        "perf", "send", "-s", "4096", "-n", "400", "-q", "16", "--bidir", "--json",
    ]);
    check("send -q 16 --bidir", &out, "800");
}

/// Wait (bounded) for a child, killing it if it overstays.
fn finish(mut child: Child, within: Duration) -> Output {
    let deadline = Instant::now() + within;
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait_with_output().unwrap()
}

#[test]
fn server_and_client_processes_for_every_operation() {
    let base = 21_000 + (std::process::id() % 10_000) as u16 * 4;
    for (i, op) in ["write", "read", "send", "atomic"].iter().enumerate() {
        let port = (base + i as u16).to_string();
        let server = Command::new(env!("CARGO_BIN_EXE_rnic"))
            .args(["perf", op, "--server", "-p", &port, "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the server");
        let client = rnic(&[
            "perf",
            op,
            "--client",
            "127.0.0.1",
            "-p",
            &port,
            "-s",
            "16384",
            "-n",
            "300",
            "-q",
            "2",
            "--json",
        ]);
        let server = finish(server, Duration::from_secs(30));
        check(&format!("{op} client"), &client, "300");
        assert!(
            server.status.success(),
            "{op} server: {}{}",
            String::from_utf8_lossy(&server.stdout),
            String::from_utf8_lossy(&server.stderr)
        );
        let text = String::from_utf8_lossy(&client.stdout);
        assert!(text.contains("\"udp_baseline_gbps\""), "{text}");
    }
}
