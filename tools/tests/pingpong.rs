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
    use rnic_verbs::*;

    // The server is a real `rnic pingpong` process; the client is this test,
    // through the library, so that it can post a SEND after the kill: RC
    // notices a dead peer only through something it sent.
    let port: u16 = 40_000 + (std::process::id() % 20_000) as u16;
    let mut server = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args([
            "pingpong",
            "-p",
            &port.to_string(),
            "-n",
            "100000000",
            "-s",
            "64",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the server");
    let dev = Device::open_loopback().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let mr = pd.register(4096, Access::LOCAL_WRITE).unwrap();
    let cq = dev.create_cq(64).unwrap();
    let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    let remote =
        rendezvous::connect_pingpong("127.0.0.1", port, &qp.endpoint(), Duration::from_secs(20));
    let remote = match remote {
        Ok(r) => r,
        Err(e) => {
            let _ = server.kill();
            panic!("no exchange with the server: {e}");
        }
    };
    qp.connect(&remote, &ConnectOptions::default()).unwrap();
    server.kill().unwrap();
    let _ = server.wait();
    let posted = Instant::now();
    qp.post_send(send_64(&mr, 1)).unwrap();
    let c = cq
        .wait(Duration::from_secs(10))
        .expect("a completion, not silence");
    let elapsed = posted.elapsed();
    assert_eq!(c.status, WcStatus::RetryExcErr);
    // timeout 14 (67.1 ms) x (retry_cnt 7 + 1) = 537 ms.
    assert!(
        elapsed >= Duration::from_millis(536),
        "gave up after {elapsed:?}, before 8 timeouts"
    );
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
}

#[test]
fn the_server_leaves_only_after_its_last_send_is_acknowledged() {
    use rnic_verbs::*;

    // The client is this test, through the library. It has no receive
    // posted for the server's last reply, so its responder answers that
    // SEND with RNR NAKs (and the server, rnr_retry 7, retries for ever):
    // the server has received every message and posted every reply, but
    // must not leave until the reply is acknowledged. Gone, it would leave
    // its peer retransmitting to a closed NIC.
    let port: u16 = 30_000 + (std::process::id() % 10_000) as u16;
    let mut server = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args(["pingpong", "-p", &port.to_string(), "-n", "2", "-s", "64"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let dev = Device::open_loopback().unwrap();
        let pd = dev.alloc_pd().unwrap();
        let mr = pd.register(4096, Access::LOCAL_WRITE).unwrap();
        let cq = dev.create_cq(64).unwrap();
        let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
        let recv = |id| {
            qp.post_recv(RecvWr {
                wr_id: id,
                sg_list: sg_list![mr.sge(64, 64)],
            })
            .unwrap();
        };
        let send = |id| qp.post_send(send_64(&mr, id)).unwrap();
        let wait = |opcode| {
            let c = cq.wait(Duration::from_secs(10)).unwrap();
            assert_eq!((c.opcode, c.status), (opcode, WcStatus::Success));
        };
        let remote = rendezvous::connect_pingpong(
            "127.0.0.1",
            port,
            &qp.endpoint(),
            Duration::from_secs(20),
        )
        .expect("the exchange with the server");
        qp.connect(&remote, &ConnectOptions::default()).unwrap();
        recv(100);
        send(1);
        // Our SEND's completion and the reply, in either order.
        let mut two: Vec<_> = (0..2)
            .map(|_| cq.wait(Duration::from_secs(10)).unwrap())
            .map(|c| (c.status, c.opcode == WcOpcode::Send))
            .collect();
        two.sort_by_key(|&(_, is_send)| is_send);
        assert_eq!(two, [(WcStatus::Success, false), (WcStatus::Success, true)]);
        send(2);
        wait(WcOpcode::Send);
        // The server has had our last message; its reply meets no receive.
        std::thread::sleep(Duration::from_millis(500));
        let early = server.try_wait().unwrap();
        assert!(
            early.is_none(),
            "the server left before its last SEND was acknowledged: {early:?}"
        );
        recv(101);
        wait(WcOpcode::Recv);
    }));
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = server.kill();
    let out = server.wait_with_output().unwrap();
    if let Err(e) = outcome {
        std::panic::resume_unwind(e);
    }
    assert!(
        out.status.success(),
        "server: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 iters in"));
}

/// A signaled SEND of the first 64 bytes of `mr`.
fn send_64(mr: &rnic_verbs::MemoryRegion, wr_id: u64) -> rnic_verbs::SendWr {
    use rnic_verbs::*;
    SendWr::new(wr_id, SendOp::send(), sg_list![mr.sge(0, 64)])
}

/// `rnic pingpong --cm`: the client connects to the server's address and
/// rdma_cm port through the CM (no TCP exchange), and the messages cross.
#[test]
fn connected_through_the_cm() {
    use std::io::{BufRead, BufReader};
    let port = (40_000 + std::process::id() % 20_000).to_string();
    let mut server = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args(["pingpong", "--cm", "-p", &port, "-n", "300", "-s", "2000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    // Its address is the first free loopback one: it says which.
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let listening = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("listening on"))
        .expect("the server listens");
    let at = listening.split_whitespace().nth(2).unwrap().to_string();
    let addr = at.rsplit_once(':').unwrap().0.to_string();
    let client = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args([
            "pingpong", "--cm", &addr, "-p", &port, "-n", "300", "-s", "2000",
        ])
        .output()
        .expect("run the client");
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
    let server_text: Vec<String> = lines.map_while(Result::ok).collect();
    let client_text = String::from_utf8_lossy(&client.stdout);
    assert!(
        client.status.success(),
        "client: {client_text}{}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(
        status.is_some_and(|s| s.success()),
        "server: {server_text:?}"
    );
    assert!(
        client_text.contains("connected through the CM"),
        "{client_text}"
    );
    assert!(client_text.contains("300 iters in"), "{client_text}");
    assert!(
        server_text.iter().any(|l| l.contains("300 iters in")),
        "{server_text:?}"
    );
}
