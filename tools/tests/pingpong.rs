//! `rnic pingpong` as two processes, like ibv_rc_pingpong's server and client.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn server_and_client_processes() {
    let port = (20_000 + std::process::id() % 20_000).to_string();
    let mut server = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args(["pingpong", "-p", &port, "-n", "300", "-s", "2000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    let client = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args([
            "pingpong",
            "127.0.0.1",
            "-p",
            &port,
            "-n",
            "300",
            "-s",
            "2000",
        ])
        .output()
        .expect("run the client");
    // Bounded wait for the server, then make sure it is gone.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = server.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = server.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let server_out = server.wait_with_output().unwrap();
    let client_text = String::from_utf8_lossy(&client.stdout);
    let server_text = String::from_utf8_lossy(&server_out.stdout);
    assert!(
        client.status.success(),
        "client: {client_text}{}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(status.is_some_and(|s| s.success()), "server: {server_text}");
    for text in [&client_text, &server_text] {
        assert!(text.contains("300 iters in"), "{text}");
        assert!(text.contains("1200000 bytes in"), "{text}");
    }
}

#[test]
fn killed_peer_ends_in_retry_exceeded_within_the_bound() {
    let port = (40_000 + std::process::id() % 20_000).to_string();
    let mut server = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args(["pingpong", "-p", &port, "-n", "100000000", "-s", "64"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the server");
    let mut client = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args([
            "pingpong",
            "127.0.0.1",
            "-p",
            &port,
            "-n",
            "100000000",
            "-s",
            "64",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the client");
    std::thread::sleep(Duration::from_millis(700));
    server.kill().unwrap();
    let _ = server.wait();
    let killed = Instant::now();
    // timeout 14 (67.1 ms) x (retry_cnt 7 + 1) = 537 ms, plus scheduling.
    let deadline = killed + Duration::from_secs(5);
    let status = loop {
        if let Some(s) = client.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = client.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let elapsed = killed.elapsed();
    let out = client.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        status.is_some_and(|s| !s.success()),
        "the client should fail, not hang: {err}"
    );
    assert!(err.contains("IBV_WC_RETRY_EXC_ERR"), "{err}");
    assert!(
        elapsed >= Duration::from_millis(500),
        "gave up after {elapsed:?}, before 8 timeouts"
    );
}
