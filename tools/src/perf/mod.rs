//! `rnic perf`: perftest-like bandwidth and latency of RDMA operations
//! between two rnic NICs, in one process on loopback (`--loopback`, the
//! default) or in two processes (`--server` and `--client HOST`, which meet
//! over TCP as perftest's tools do), next to a raw UDP baseline measured in
//! the same run over the same addresses.
//!
//! The two processes exchange one line of options (the server takes the
//! client's), one `rnic1` endpoint record per queue pair (with the buffer
//! the peer may access), then "ready", and at the end "done"; the UDP
//! baseline is a second exchange on the same TCP connection.
//!
//! The parts: `loops` (one NIC's side, and the bandwidth, latency and
//! ping-pong loops that measure) and `report` (the UDP baseline of the same
//! run, and the table or JSON lines printed).

mod loops;
mod report;

use std::io::{self, BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use rnic_verbs::rendezvous::{EndpointRecord, RemoteBuffer};
use rnic_verbs::*;

use loops::{measure, Local, Roles};
pub(crate) use loops::{percentile, Row};
pub(crate) use report::gbit;
use report::{
    baseline_plan, print_baseline, print_header, print_row, udp_baseline_local, udp_receive,
    udp_send,
};

pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub(super) type Res<T> = std::result::Result<T, BoxError>;

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Op {
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// SEND into posted receives.
    Send,
    /// FETCH_AND_ADD on 8 bytes (as ib_atomic_bw does by default).
    Atomic,
}

impl Op {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
            Op::Send => "send",
            Op::Atomic => "atomic",
        }
    }
    pub(super) fn parse(s: &str) -> Option<Op> {
        [Op::Write, Op::Read, Op::Send, Op::Atomic]
            .into_iter()
            .find(|o| o.name() == s)
    }
    /// Whether its latency is a ping-pong (each side answers the other's
    /// message, as ib_write_lat and ib_send_lat do) rather than a
    /// request's round trip (ib_read_lat, ib_atomic_lat).
    pub(super) fn ping_pong(self) -> bool {
        matches!(self, Op::Write | Op::Send)
    }
}

/// Which side of the measurement this process is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Both NICs in this process.
    Loopback,
    /// Wait for a client on the TCP port.
    Server,
    /// Connect to a server.
    Client(String),
}

/// Options, as perftest spells them where it can.
#[derive(Debug, Clone)]
pub struct Options {
    /// The operation.
    pub op: Op,
    /// Loopback, server or client.
    pub mode: Mode,
    /// TCP port of the exchange.
    pub port: u16,
    /// Message size in bytes (8 for atomics).
    pub size: u32,
    /// Messages per size and direction.
    pub iterations: u64,
    /// Run this long instead of a number of messages.
    pub duration: Option<Duration>,
    /// Queue pairs.
    pub qps: u32,
    /// Work requests outstanding at once per queue pair (bandwidth mode).
    pub tx_depth: u32,
    /// Latency mode: one message at a time.
    pub latency: bool,
    /// Both directions at once.
    pub bidir: bool,
    /// Every power of two from 2 bytes to 8 MiB.
    pub all_sizes: bool,
    /// Path MTU.
    pub mtu: Mtu,
    /// `-m` was not given: a client takes the active MTU of the port it
    /// opens (where the server reaches it), and tells the server.
    pub mtu_of_port: bool,
    /// Print JSON lines instead of a table.
    pub json: bool,
    /// No progress bar (a caller that reports progress itself).
    pub quiet: bool,
    /// Impair each NIC's egress (loss, duplication, reordering, corruption).
    pub impair: Option<rnic_verbs::Impairment>,
    /// READs and atomics outstanding at once per queue pair, each way;
    /// `None`: the device's maximum, as perftest's `-o` defaults to.
    pub outs: Option<u8>,
    /// Connect the queue pairs through the connection manager (as
    /// perftest's `-R`), the rdma_cm port the TCP port's number, rather
    /// than by endpoint records over TCP.
    pub cm: bool,
}

impl Options {
    pub(super) fn sizes(&self) -> Vec<u32> {
        if self.op == Op::Atomic {
            vec![8]
        } else if self.all_sizes {
            (1..=23).map(|k| 1u32 << k).collect()
        } else {
            vec![self.size]
        }
    }
    /// Room for the largest message twice: a ping-pong sends from the
    /// first half and takes the peer's messages in the second.
    pub(super) fn buffer_len(&self) -> usize {
        2 * self.sizes().into_iter().max().unwrap_or(8).max(2048) as usize
    }
    /// The line the client sends: what the server must do too.
    pub(super) fn to_line(&self) -> String {
        format!(
            "rnic-perf op={} size={} iters={} duration_ms={} qps={} depth={} lat={} bidir={} all={} mtu={} outs={} cm={}",
            self.op.name(),
            self.size,
            self.iterations,
            self.duration.map_or(0, |d| d.as_millis()),
            self.qps,
            self.tx_depth,
            u8::from(self.latency),
            u8::from(self.bidir),
            u8::from(self.all_sizes),
            self.mtu.bytes(),
            self.outs.unwrap_or(0),
            u8::from(self.cm)
        )
    }
    /// The READs and atomics outstanding at once per QP on `dev`.
    pub(super) fn outstanding(&self, dev: &Device) -> u8 {
        let a = dev.query_device();
        self.outs
            .unwrap_or(a.max_qp_init_rd_atom.min(a.max_qp_rd_atom))
    }
    pub(super) fn adopt(&mut self, line: &str) -> Option<()> {
        let mut it = line.split_whitespace();
        if it.next()? != "rnic-perf" {
            return None;
        }
        for kv in it {
            let (k, v) = kv.split_once('=')?;
            match k {
                "op" => self.op = Op::parse(v)?,
                "size" => self.size = v.parse().ok()?,
                "iters" => self.iterations = v.parse().ok()?,
                "duration_ms" => {
                    let ms: u64 = v.parse().ok()?;
                    self.duration = (ms > 0).then(|| Duration::from_millis(ms));
                }
                "qps" => self.qps = v.parse().ok()?,
                "depth" => self.tx_depth = v.parse().ok()?,
                "lat" => self.latency = v == "1",
                "bidir" => self.bidir = v == "1",
                "all" => self.all_sizes = v == "1",
                "mtu" => self.mtu = Mtu::from_bytes(v.parse().ok()?)?,
                "outs" => self.outs = Some(v.parse().ok()?).filter(|&n: &u8| n > 0),
                "cm" => self.cm = v == "1",
                _ => {}
            }
        }
        Some(())
    }
}

pub(super) const T: Duration = Duration::from_secs(30);

/// Run; false if any operation failed.
/// The active MTU of a loopback port, where `rnic perf` runs in one
/// process: its path MTU unless `-m` says otherwise (perftest's default
/// too). A client takes its own port's instead (`Options::mtu_of_port`).
pub fn port_mtu() -> Res<Mtu> {
    Ok(rnic_verbs::Device::open_loopback()?.query_port().active_mtu)
}

pub fn run(o: &Options) -> Res<bool> {
    match o.mode.clone() {
        Mode::Loopback => run_loopback(o),
        Mode::Server => run_server(o.clone()),
        Mode::Client(host) => run_client(o, &host),
    }
}

/// Two NICs in this process, connected by `o.qps` queue pairs, the first
/// sending to the second, one size at a time.
pub(crate) struct LoopbackRun {
    a: Local,
    b: Local,
    to_a: Vec<RemoteBuffer>,
    to_b: Vec<RemoteBuffer>,
    /// The connections the CM made (`--cm`).
    _conns: Vec<rnic_verbs::cm::Connection>,
}

impl LoopbackRun {
    pub(crate) fn new(o: &Options) -> Res<LoopbackRun> {
        let (a, b) = (Local::new(o, None)?, Local::new(o, None)?);
        if o.cm {
            let l = b.dev.listen(0)?;
            let to = SocketAddr::new(b.dev.addr(), l.port());
            let (ca, cb) = std::thread::scope(|s| {
                let client = s.spawn(|| a.connect_cm(to));
                let server = b.accept_cm(&l);
                (client.join().expect("the connecting thread"), server)
            });
            let (ca, cb) = (ca?, cb?);
            let mut conns = ca.conns;
            conns.extend(cb.conns);
            return Ok(LoopbackRun {
                to_b: ca.buffers,
                to_a: cb.buffers,
                a,
                b,
                _conns: conns,
            });
        }
        let to_b = a.connect(o, &b.records())?;
        let to_a = b.connect(o, &a.records())?;
        Ok(LoopbackRun {
            a,
            b,
            to_a,
            to_b,
            _conns: Vec::new(),
        })
    }

    /// Measure one size, the first NIC sending.
    pub(crate) fn measure(&self, o: &Options, size: u32) -> Res<Row> {
        let roles = Roles {
            sends: true,
            peer: Some((&self.b, &self.to_a)),
            receives_here: o.bidir,
        };
        measure(o, size, &self.a, &self.to_b, roles, || Ok(()))
    }

    /// The two NICs' addresses.
    pub(crate) fn addrs(&self) -> (IpAddr, IpAddr) {
        (self.a.dev.addr(), self.b.dev.addr())
    }

    /// Requests retransmitted by either NIC (after timeouts or sequence NAKs).
    pub(crate) fn retries(&self) -> Res<u64> {
        Ok(self.a.dev.counters()?.completer_retry_err + self.b.dev.counters()?.completer_retry_err)
    }
}

fn run_loopback(o: &Options) -> Res<bool> {
    let run = LoopbackRun::new(o)?;
    let stdout = io::stdout();
    let mut out = stdout.lock();
    print_header(o, run.a.outstanding()?, &mut out)?;
    let mut rows = Vec::new();
    for size in o.sizes() {
        let row = run.measure(o, size)?;
        print_row(o, &row, &mut out)?;
        rows.push(row);
    }
    let ok = rows.iter().all(|r| r.failures == 0);
    if !o.latency {
        let (n, chunk) = baseline_plan(o, &rows);
        let (from, to) = run.addrs();
        let base = udp_baseline_local(from, to, n, chunk)?;
        print_baseline(o, &rows, base, chunk, &mut out)?;
        let retries = run.retries()?;
        if !o.json {
            writeln!(out, " retransmissions (timeouts, sequence NAKs): {retries}")?;
        }
    }
    Ok(ok)
}

/// A line-based control connection.
struct Control {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Control {
    fn new(s: TcpStream) -> io::Result<Control> {
        s.set_nodelay(true)?;
        Ok(Control {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }
    fn send(&mut self, line: &str) -> io::Result<()> {
        self.w.write_all(format!("{line}\n").as_bytes())
    }
    fn recv(&mut self) -> io::Result<String> {
        let mut line = String::new();
        if self.r.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the connection",
            ));
        }
        Ok(line.trim().to_string())
    }
    fn expect(&mut self, word: &str) -> Res<String> {
        let line = self.recv()?;
        if line.split_whitespace().next() != Some(word) {
            return Err(format!("expected '{word}' from the peer, got '{line}'").into());
        }
        Ok(line)
    }
    fn send_records(&mut self, rs: &[EndpointRecord]) -> io::Result<()> {
        for r in rs {
            self.send(&r.to_line())?;
        }
        Ok(())
    }
    fn recv_records(&mut self, n: usize) -> Res<Vec<EndpointRecord>> {
        (0..n)
            .map(|_| {
                let line = self.recv()?;
                EndpointRecord::from_line(&line)
                    .ok_or_else(|| format!("malformed endpoint record '{line}'").into())
            })
            .collect()
    }
}

fn run_server(mut o: Options) -> Res<bool> {
    let listener = TcpListener::bind(("0.0.0.0", o.port))?;
    if !o.json {
        eprintln!(" waiting for a client on TCP port {}", o.port);
    }
    let (s, peer) = listener.accept()?;
    let here = s.local_addr()?.ip();
    let mut c = Control::new(s)?;
    let line = c.recv()?;
    o.adopt(&line)
        .ok_or_else(|| format!("malformed options '{line}' from {peer}"))?;
    o.mode = Mode::Server;
    let me = Local::new(&o, Some(here))?;
    let (to_client, _conns) = if o.cm {
        // The rdma_cm port is the TCP port's number.
        let l = me.dev.listen(o.port)?;
        c.send(&format!("listening {}", me.dev.addr()))?;
        let got = me.accept_cm(&l)?;
        (got.buffers, got.conns)
    } else {
        c.send_records(&me.records())?;
        let theirs = c.recv_records(me.qps.len())?;
        (me.connect(&o, &theirs)?, Vec::new())
    };
    c.send("ready")?;
    let stdout = io::stdout();
    let mut out = stdout.lock();
    print_header(&o, me.outstanding()?, &mut out)?;
    let mut ok = true;
    for size in o.sizes() {
        c.expect("size")?;
        // The server sends only in a bidirectional run; otherwise it keeps
        // receives posted for SENDs, and its CPU does nothing else.
        let roles = Roles {
            sends: o.bidir,
            peer: None,
            receives_here: true,
        };
        let row = measure(&o, size, &me, &to_client, roles, || {
            c.expect("done").map(|_| ())
        })?;
        print_row(&o, &row, &mut out)?;
        ok &= row.failures == 0;
        c.send(&format!("failures {}", row.failures))?;
    }
    // The UDP baseline: count what the client sends to our address.
    if let Ok(line) = c.recv() {
        if let Some(n) = line.strip_prefix("udp ") {
            let (n, chunk): (u64, usize) = match n.split_once(' ') {
                Some((a, b)) => (a.parse()?, b.parse()?),
                None => return Err("malformed udp request".into()),
            };
            let rx = UdpSocket::bind(SocketAddr::new(me.dev.addr(), 0))?;
            let _ = rustix::net::sockopt::set_socket_recv_buffer_size(&rx, 4 << 20);
            c.send(&format!("udp-port {}", rx.local_addr()?.port()))?;
            let rate = udp_receive(&rx, n, chunk).unwrap_or(0.0);
            c.send(&format!("udp-rate {rate}"))?;
        }
    }
    Ok(ok)
}

fn run_client(o: &Options, host: &str) -> Res<bool> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let s = loop {
        match TcpStream::connect((host, o.port)) {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => return Err(e.into()),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let here = s.local_addr()?.ip();
    let mut c = Control::new(s)?;
    let me = Local::new(o, Some(here))?;
    let mut o = o.clone();
    if o.mtu_of_port {
        o.mtu = me.dev.query_port().active_mtu;
    }
    let o = &o;
    c.send(&o.to_line())?;
    let (to_server, server_addr, _conns) = if o.cm {
        let line = c.expect("listening")?;
        let addr: IpAddr = line
            .split_whitespace()
            .nth(1)
            .and_then(|a| a.parse().ok())
            .ok_or("malformed 'listening'")?;
        let got = me.connect_cm(SocketAddr::new(addr, o.port))?;
        (got.buffers, addr, got.conns)
    } else {
        let theirs = c.recv_records(me.qps.len())?;
        c.send_records(&me.records())?;
        let to = me.connect(o, &theirs)?;
        (to, theirs[0].endpoint.addr, Vec::new())
    };
    c.expect("ready")?;
    let stdout = io::stdout();
    let mut out = stdout.lock();
    print_header(o, me.outstanding()?, &mut out)?;
    let mut rows = Vec::new();
    for size in o.sizes() {
        c.send(&format!("size {size}"))?;
        // Every SEND completed here was received there (RC acknowledges
        // after execution), so "done" can follow the last completion.
        let roles = Roles {
            sends: true,
            peer: None,
            receives_here: o.bidir,
        };
        // Receives here (bidirectional SENDs) stay posted until the server's
        // own direction is over too: it answers "done" only then.
        let mut line = String::new();
        let row = measure(o, size, &me, &to_server, roles, || {
            c.send("done")?;
            line = c.expect("failures")?;
            Ok(())
        })?;
        let theirs: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let row = Row {
            failures: row.failures + theirs,
            ..row
        };
        print_row(o, &row, &mut out)?;
        rows.push(row);
    }
    let ok = rows.iter().all(|r| r.failures == 0);
    if !o.latency {
        let (n, chunk) = baseline_plan(o, &rows);
        c.send(&format!("udp {n} {chunk}"))?;
        let port: u16 = c
            .expect("udp-port")?
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .ok_or("malformed udp-port")?;
        udp_send(me.dev.addr(), SocketAddr::new(server_addr, port), n, chunk)?;
        let rate: f64 = c
            .expect("udp-rate")?
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .ok_or("malformed udp-rate")?;
        print_baseline(o, &rows, rate, chunk, &mut out)?;
        if !o.json {
            let retries = me.dev.counters()?.completer_retry_err;
            writeln!(out, " retransmissions (timeouts, sequence NAKs): {retries}")?;
        }
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_line_round_trips() {
        let o = Options {
            op: Op::Atomic,
            mode: Mode::Client("x".into()),
            port: 1,
            size: 8,
            iterations: 77,
            duration: Some(Duration::from_millis(1500)),
            qps: 3,
            tx_depth: 9,
            latency: true,
            bidir: true,
            all_sizes: false,
            mtu: Mtu::Mtu4096,
            mtu_of_port: false,
            json: false,
            quiet: false,
            impair: None,
            outs: Some(5),
            cm: true,
        };
        let mut p = Options {
            op: Op::Write,
            mode: Mode::Server,
            iterations: 0,
            duration: None,
            qps: 1,
            latency: false,
            bidir: false,
            mtu: Mtu::Mtu1024,
            outs: None,
            cm: false,
            ..o.clone()
        };
        p.adopt(&o.to_line()).unwrap();
        assert_eq!(p.to_line(), o.to_line());
        // The device's maximum goes as 0, and comes back as the default.
        let dflt = Options {
            outs: None,
            ..o.clone()
        };
        p.adopt(&dflt.to_line()).unwrap();
        assert_eq!(p.outs, None);
        assert!(p.adopt("other op=write").is_none());
        assert!(p.adopt("rnic-perf op=nope").is_none());
    }
}
