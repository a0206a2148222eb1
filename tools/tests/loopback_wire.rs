//! What rnic's UDP transport puts on the wire, as the kernel carries it.
//!
//! The NICs' own receivers cannot check this: a UDP socket never sees the
//! IP header, so they verify every ICRC under the convention that the
//! IPv4 identification is 0 (`rnic_wire::icrc::for_udp`). A sender whose
//! kernel stamps other identifications (a connected socket numbers them
//! from a counter with a random start) passes every loopback test that
//! only looks at what the NICs accept, and fails against any peer that
//! reads the real header: a capture on the wire catches it here.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A network namespace of the test's own, the tcpdump capturing in it and
/// the capture file: all gone at the end, however the test ends (deleting
/// a namespace leaves the processes in it running).
struct Scratch {
    ns: String,
    pcap: PathBuf,
    capture: Option<Child>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(mut c) = self.capture.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
        let _ = std::fs::remove_file(&self.pcap);
    }
}

fn in_ns(ns: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]);
    c
}

/// Run `rnic ARGS` in `ns` with GSO off, bounded, and require success.
fn rnic(ns: &str, args: &[&str]) {
    let out = in_ns(ns)
        .args([
            "timeout",
            "60",
            "env",
            "RNIC_GSO=off",
            env!("CARGO_BIN_EXE_rnic"),
        ])
        .args(args)
        .output()
        .expect("run rnic");
    assert!(
        out.status.success(),
        "rnic {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Wait until the file stops growing (bounded: 20 s).
fn wait_until_settled(p: &Path) {
    let size = || std::fs::metadata(p).map_or(0, |m| m.len());
    let start = Instant::now();
    let mut last = size();
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = size();
        if now == last || start.elapsed() > Duration::from_secs(20) {
            return;
        }
        last = now;
    }
}

/// Every RoCE v2 packet two rnic NICs exchange over IPv4 loopback, captured
/// on `lo` by tcpdump, carries the ICRC of the IP header it went out with:
/// the demo's operations (SEND, WRITE, WRITE with immediate, READ, both
/// atomics), a stream of multi-packet WRITEs with their ACKs, and a
/// SEND ping-pong whose ACKs wait for the answer. GSO is off, so that
/// each datagram crosses `lo` on its own (loopback passes a GSO send
/// uncut; `rnic-verbs/tests/frames_veth.rs` checks the segments of a cut
/// one).
#[test]
fn every_packet_on_the_loopback_wire_carries_a_correct_icrc() {
    let id = std::process::id();
    let mut scratch = Scratch {
        ns: format!("rnic-lo-{id}"),
        pcap: std::env::temp_dir().join(format!("rnic-lo-{id}.pcap")),
        capture: None,
    };
    let made = Command::new("ip")
        .args(["netns", "add", &scratch.ns])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let tcpdump = Command::new("tcpdump")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !made || !tcpdump {
        eprintln!("SKIPPED: needs root (a network namespace) and tcpdump");
        assert!(
            std::env::var_os("RNIC_REQUIRE_TOOLS").is_none(),
            "root and tcpdump are required"
        );
        return;
    }
    let ns = scratch.ns.clone();
    let ns = ns.as_str();
    assert!(Command::new("ip")
        .args(["-n", ns, "link", "set", "lo", "up"])
        .status()
        .unwrap()
        .success());
    let capture = in_ns(ns)
        .args(["tcpdump", "-Z", "root", "--immediate-mode", "-U", "-n"])
        .args(["-B", "65536", "-s", "0", "-i", "lo", "-w"])
        .arg(&scratch.pcap)
        .args(["udp", "port", "4791"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("tcpdump");
    scratch.capture = Some(capture);
    let start = Instant::now();
    while !scratch.pcap.exists() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    rnic(ns, &["demo"]);
    rnic(
        ns,
        &["perf", "write", "-s", "65536", "-m", "1024", "-n", "50"],
    );
    rnic(ns, &["perf", "send", "--lat", "-s", "64", "-n", "200"]);
    wait_until_settled(&scratch.pcap);
    if let Some(mut capture) = scratch.capture.take() {
        let _ = Command::new("kill")
            .args(["-INT", &capture.id().to_string()])
            .status();
        let _ = capture.wait();
    }
    let check = Command::new(env!("CARGO_BIN_EXE_rnic"))
        .args(["dump", "--check", "-q"])
        .arg(&scratch.pcap)
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{summary}");
    // "N RoCE v2 packets, 0 ICRC failures": tcpdump may drop some of
    // the stream on loopback (2,800-4,100 captured in all), hardly any of
    // the demo's 16 and the ping-pong's 800.
    let packets: u64 = summary
        .split(" RoCE v2 packets, 0 ICRC failures")
        .next()
        .and_then(|head| head.split_whitespace().last())
        .and_then(|n| n.replace(',', "").parse().ok())
        .unwrap_or_else(|| panic!("no clean summary in {summary:?}"));
    assert!(packets >= 500, "{packets} packets captured:\n{summary}");
    for opcode in [
        "RC_SEND_ONLY",
        "RC_RDMA_WRITE_MIDDLE",
        "RC_RDMA_READ_RESPONSE_LAST",
        "RC_ATOMIC_ACKNOWLEDGE",
        "RC_ACKNOWLEDGE",
    ] {
        assert!(summary.contains(opcode), "no {opcode} in\n{summary}");
    }
}
