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

/// Without `-m`, the path MTU is the port's active MTU (4096 on loopback),
/// as perftest's; `-m` still chooses.
#[test]
fn perf_takes_the_port_s_mtu_unless_told() {
    let out = rnic(&["perf", "write", "-s", "64", "-n", "20"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("PMTU 4096"), "{text}");
    let out = rnic(&["perf", "write", "-s", "64", "-n", "20", "-m", "1024"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("PMTU 1024"), "{text}");
}

/// `rnic perf ARGS` started as a server, its output piped.
fn server(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_rnic"))
        .arg("perf")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server")
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
        let server = server(&[op, "--server", "-p", &port, "--json"]);
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

/// READs and atomics outstanding: the device's maximum unless `-o` says
/// otherwise (as perftest's `-o`), and a client's `-o` holds for the
/// server too. The header gives what the QP was set to, read back from it.
#[test]
fn outstanding_reads_default_to_the_device_maximum() {
    let out = rnic(&["perf", "read", "-s", "64", "-n", "200"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("128 READs outstanding per QP"), "{text}");
    let out = rnic(&["perf", "atomic", "-n", "200", "-o", "4"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(", 4 atomics outstanding per QP"), "{text}");
    // More than the device takes: a clear error, before anything runs.
    let out = rnic(&["perf", "read", "-n", "10", "-o", "129"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("max_qp_rd_atom"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let port = (20_000 + (std::process::id() % 1_000) as u16).to_string();
    let server = server(&["read", "--server", "-p", &port]);
    let client = rnic(&[
        "perf",
        "read",
        "--client",
        "127.0.0.1",
        "-p",
        &port,
        "-s",
        "64",
        "-n",
        "200",
        "-o",
        "3",
    ]);
    let server = finish(server, Duration::from_secs(30));
    for (who, out) in [("client", &client), ("server", &server)] {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{who}: {text}");
        assert!(
            text.contains(", 3 READs outstanding per QP"),
            "{who}: {text}"
        );
    }
}

/// Every size in one run: a receive posted for an earlier, smaller size must
/// never meet a later, larger SEND (each failed with a length error once).
#[test]
fn perf_send_at_every_size_in_one_run() {
    let out = rnic(&["perf", "send", "-a", "-n", "20", "-m", "4096", "--json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = text
        .lines()
        .filter(|l| l.contains("\"iterations\":20"))
        .count();
    assert_eq!(rows, 23, "{text}");
    assert!(!text.contains("\"ok\":false"), "{text}");
}

/// `rnic bench --quick`: every figure, the JSON and the chart.
#[test]
fn bench_quick_measures_everything() {
    let dir = std::env::temp_dir().join(format!("rnic-bench-{}", std::process::id()));
    let out = rnic(&["bench", "--quick", "--out", dir.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("bench.json")).unwrap()).unwrap();
    assert_eq!(json["failures"], 0, "{json}");
    let series = json["bandwidth"].as_array().unwrap();
    let names: Vec<&str> = series.iter().map(|s| s["name"].as_str().unwrap()).collect();
    for want in [
        "TCP stream",
        "UDP",
        "UDP sendmmsg",
        "UDP GSO/GRO",
        "UDP GSO/GRO, WRITE-shaped",
        "rnic WRITE 1 QP",
        "rnic READ 8 QP",
        "rnic SEND 8 QP",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    for s in series {
        let points = s["points"].as_array().unwrap();
        assert_eq!(points.len(), 2, "{s}");
        assert!(
            points.iter().all(|p| p["gbps"].as_f64().unwrap() > 0.0),
            "{s}"
        );
    }
    let rtts = json["round_trips_us"].as_array().unwrap();
    assert_eq!(rtts.len(), 6, "{json}");
    for x in rtts {
        let (min, p50, p99) = (
            x["min"].as_f64().unwrap(),
            x["p50"].as_f64().unwrap(),
            x["p99"].as_f64().unwrap(),
        );
        assert!(0.0 < min && min <= p50 && p50 <= p99, "{x}");
    }
    let goals = json["goals"].as_array().unwrap();
    assert_eq!(goals.len(), 7, "{json}");
    // The chart, when a font for its labels is installed (tools/run-tests
    // installs one, and requires it).
    let font = std::path::Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").exists();
    if font || std::env::var_os("RNIC_REQUIRE_TOOLS").is_some() {
        let png = std::fs::read(dir.join("bench.png")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--cm`: the queue pairs connect through the connection manager, each
/// side's buffer in the private data, in one process and as a server and
/// a client process (the rdma_cm port the TCP port's number; the server
/// takes `--cm` from the client's options, as every other option).
#[test]
fn perf_through_the_connection_manager() {
    for op in ["write", "read", "send", "atomic"] {
        let out = rnic(&[
            "perf", op, "--cm", "-s", "8192", "-n", "200", "-q", "2", "--json",
        ]);
        check(&format!("{op} --cm"), &out, "200");
    }
    let port = (25_000 + (std::process::id() % 10_000) as u16 * 2).to_string();
    let server = server(&["write", "--server", "-p", &port]);
    let client = rnic(&[
        "perf",
        "write",
        "--client",
        "127.0.0.1",
        "-p",
        &port,
        "--cm",
        "-q",
        "2",
        "-n",
        "300",
        "--json",
    ]);
    let server = finish(server, Duration::from_secs(30));
    check("write --cm client", &client, "300");
    let text = String::from_utf8_lossy(&server.stdout);
    assert!(
        server.status.success() && text.contains("connected through the CM"),
        "server: {text}{}",
        String::from_utf8_lossy(&server.stderr)
    );
}

/// Two network namespaces joined by a veth, deleted (with the veth) when
/// this drops, however the test ends.
struct Namespaces([String; 2]);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Between two hosts (here two network namespaces on a veth), server and
/// client open their NICs on the address the other reaches them at, with
/// no RNIC_ADDR: on loopback addresses, as `rnic perf` once did, each
/// would have sent its packets to itself. With `RNIC_IFACE`, on the frame
/// transport of the interface.
#[test]
fn server_and_client_on_two_hosts() {
    let id = std::process::id();
    let ns = Namespaces([format!("rnic-pa-{id}"), format!("rnic-pb-{id}")]);
    let (a, b) = (ns.0[0].as_str(), ns.0[1].as_str());
    let (va, vb) = (
        format!("rpa{}", id % 100_000),
        format!("rpb{}", id % 100_000),
    );
    // No duplicate address detection: the frame transport binds the
    // interface's IPv6 link-local address too, at once.
    let no_dad = |ns: &str| {
        Command::new("ip")
            .args(["netns", "exec", ns, "sysctl", "-qw"])
            .args([
                "net.ipv6.conf.all.accept_dad=0",
                "net.ipv6.conf.default.accept_dad=0",
            ])
            .status()
            .is_ok_and(|s| s.success())
    };
    let made = ip(&["netns", "add", a])
        && ip(&["netns", "add", b])
        && no_dad(a)
        && no_dad(b)
        && ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])
        && ip(&["link", "set", &va, "netns", a])
        && ip(&["link", "set", &vb, "netns", b])
        && ip(&["-n", a, "addr", "add", "10.79.3.1/24", "dev", &va])
        && ip(&["-n", b, "addr", "add", "10.79.3.2/24", "dev", &vb])
        && ip(&["-n", a, "link", "set", &va, "up"])
        && ip(&["-n", b, "link", "set", &vb, "up"])
        && ip(&["-n", a, "link", "set", "lo", "up"])
        && ip(&["-n", b, "link", "set", "lo", "up"]);
    if !made {
        eprintln!("SKIPPED: needs root (network namespaces and a veth)");
        assert!(
            std::env::var_os("RNIC_REQUIRE_TOOLS").is_none(),
            "root is required"
        );
        return;
    }
    let run = |ns: &str, iface: Option<&str>, args: &[&str]| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, "timeout", "30", "env"]);
        if let Some(i) = iface {
            c.arg(format!("RNIC_IFACE={i}"));
        }
        c.arg(env!("CARGO_BIN_EXE_rnic")).arg("perf").args(args);
        c
    };
    for (iface_a, iface_b) in [(None, None), (Some(va.as_str()), Some(vb.as_str()))] {
        let server = run(a, iface_a, &["write", "--server", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the server");
        let client = run(
            b,
            iface_b,
            &[
                "write",
                "--client",
                "10.79.3.1",
                "-s",
                "16384",
                "-n",
                "300",
                "--json",
            ],
        )
        .output()
        .expect("run the client");
        let server = finish(server, Duration::from_secs(30));
        check(&format!("client, RNIC_IFACE {iface_b:?}"), &client, "300");
        assert!(
            server.status.success(),
            "server, RNIC_IFACE {iface_a:?}: {}{}",
            String::from_utf8_lossy(&server.stdout),
            String::from_utf8_lossy(&server.stderr)
        );
    }
}
