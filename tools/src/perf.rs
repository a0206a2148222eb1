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

use std::io::{self, BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use rnic_verbs::rendezvous::{EndpointRecord, RemoteBuffer};
use rnic_verbs::*;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = std::result::Result<T, BoxError>;

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
    fn parse(s: &str) -> Option<Op> {
        [Op::Write, Op::Read, Op::Send, Op::Atomic]
            .into_iter()
            .find(|o| o.name() == s)
    }
    /// Whether its latency is a ping-pong (each side answers the other's
    /// message, as ib_write_lat and ib_send_lat do) rather than a
    /// request's round trip (ib_read_lat, ib_atomic_lat).
    fn ping_pong(self) -> bool {
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
    /// Print JSON lines instead of a table.
    pub json: bool,
    /// No progress bar (a caller that reports progress itself).
    pub quiet: bool,
    /// Impair each NIC's egress (loss, duplication, reordering, corruption).
    pub impair: Option<rnic_verbs::Impairment>,
    /// READs and atomics outstanding at once per queue pair, each way;
    /// `None`: the device's maximum, as perftest's `-o` defaults to.
    pub outs: Option<u8>,
}

impl Options {
    fn sizes(&self) -> Vec<u32> {
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
    fn buffer_len(&self) -> usize {
        2 * self.sizes().into_iter().max().unwrap_or(8).max(2048) as usize
    }
    /// The line the client sends: what the server must do too.
    fn to_line(&self) -> String {
        format!(
            "rnic-perf op={} size={} iters={} duration_ms={} qps={} depth={} lat={} bidir={} all={} mtu={} outs={}",
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
            self.outs.unwrap_or(0)
        )
    }
    /// The READs and atomics outstanding at once per QP on `dev`.
    fn outstanding(&self, dev: &Device) -> u8 {
        let a = dev.query_device();
        self.outs
            .unwrap_or(a.max_qp_init_rd_atom.min(a.max_qp_rd_atom))
    }
    fn adopt(&mut self, line: &str) -> Option<()> {
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
                _ => {}
            }
        }
        Some(())
    }
}

const T: Duration = Duration::from_secs(30);

/// One NIC's part: its memory, queues and queue pairs.
struct Local {
    dev: Device,
    _pd: ProtectionDomain,
    mr: MemoryRegion,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    qps: Vec<QueuePair>,
    /// Receives for the peer's SENDs have been posted.
    primed: AtomicBool,
}

impl Local {
    fn new(o: &Options) -> Res<Local> {
        let dev = Device::open_loopback()?;
        if let Some(i) = o.impair {
            dev.set_impairment(i)?;
        }
        let pd = dev.alloc_pd()?;
        let rights = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        let mr = pd.register_with(o.buffer_len(), rights, Backing::Pages)?;
        let scq = dev.create_cq(1 << 16)?;
        let rcq = dev.create_cq(1 << 16)?;
        let caps = QpCaps {
            max_send_wr: 4096,
            max_recv_wr: 4096,
            ..QpCaps::default()
        };
        let qps = (0..o.qps.max(1))
            .map(|_| pd.create_qp(QpType::Rc, &scq, &rcq, caps, None))
            .collect::<Result<Vec<_>>>()?;
        Ok(Local {
            dev,
            _pd: pd,
            mr,
            scq,
            rcq,
            qps,
            primed: AtomicBool::new(false),
        })
    }

    fn records(&self) -> Vec<EndpointRecord> {
        self.qps
            .iter()
            .map(|qp| EndpointRecord {
                endpoint: qp.endpoint(),
                buffer: Some(RemoteBuffer {
                    va: self.mr.addr(),
                    rkey: self.mr.rkey(),
                    len: self.mr.len() as u64,
                }),
            })
            .collect()
    }

    /// READs and atomics the first QP keeps outstanding (its
    /// max_rd_atomic, as the NIC has it).
    fn outstanding(&self) -> Res<u8> {
        Ok(self
            .qps
            .first()
            .map_or(Ok(0), |q| q.query().map(|a| a.max_rd_atomic))?)
    }

    fn connect(&self, o: &Options, remote: &[EndpointRecord]) -> Res<Vec<RemoteBuffer>> {
        if remote.len() != self.qps.len() {
            return Err(format!(
                "the peer has {} queue pairs, this side {}",
                remote.len(),
                self.qps.len()
            )
            .into());
        }
        let c = ConnectOptions {
            mtu: o.mtu,
            max_rd_atomic: o.outstanding(&self.dev),
            ..ConnectOptions::default()
        };
        let mut bufs = Vec::new();
        for (qp, r) in self.qps.iter().zip(remote) {
            qp.connect(&r.endpoint, &c)?;
            bufs.push(r.buffer.ok_or("the peer's record names no buffer")?);
        }
        Ok(bufs)
    }
}

/// What one direction measured.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Bw {
    pub(crate) messages: u64,
    pub(crate) bytes: u64,
    pub(crate) secs: f64,
    peak: f64,
    failures: u64,
}

impl Bw {
    /// Average payload bytes per second.
    pub(crate) fn bytes_per_sec(&self) -> f64 {
        self.bytes as f64 / self.secs
    }

    /// Average messages per second.
    pub(crate) fn messages_per_sec(&self) -> f64 {
        self.messages as f64 / self.secs
    }
}

fn wr(op: Op, local: &MemoryRegion, remote: &RemoteBuffer, id: u64, size: u32) -> SendWr {
    let op = match op {
        Op::Write => SendOp::write(remote.va, remote.rkey),
        Op::Read => SendOp::read(remote.va, remote.rkey),
        Op::Send => SendOp::send(),
        Op::Atomic => SendOp::fetch_add(remote.va, remote.rkey, 1),
    };
    SendWr::new(id, op, sg_list![local.sge(0, size)])
}

/// How long a run goes.
#[derive(Debug, Clone, Copy)]
enum Limit {
    Messages(u64),
    Time(Duration),
}

fn progress(limit: Limit, label: String) -> ProgressBar {
    let bar = match limit {
        Limit::Messages(n) => ProgressBar::new(n),
        Limit::Time(d) => ProgressBar::new(d.as_millis() as u64),
    };
    let style = match limit {
        Limit::Messages(_) => "{prefix} [{bar:40}] {pos}/{len} messages, {per_sec}",
        Limit::Time(_) => "{prefix} [{bar:40}] {elapsed} of {duration}",
    };
    if let Ok(s) = ProgressStyle::with_template(style) {
        bar.set_style(s.progress_chars("=> "));
    }
    bar.set_prefix(label);
    bar
}

/// Keep `depth` requests outstanding on every QP until the limit; count
/// completions and the best 100 ms window.
fn bandwidth(
    l: &Local,
    remote: &[RemoteBuffer],
    op: Op,
    size: u32,
    limit: Limit,
    depth: u32,
    bar: &ProgressBar,
) -> Res<Bw> {
    let n = l.qps.len();
    let mut outstanding = vec![0u32; n];
    // The tool's own work per completion must not grow with the number of
    // QPs (the 1,000-QP figure would measure it): a map from QP number to
    // index, and only the QPs a completion freed are looked at again.
    let index: std::collections::HashMap<u32, usize> = l
        .qps
        .iter()
        .enumerate()
        .map(|(i, q)| (q.qpn(), i))
        .collect();
    let mut refill: Vec<usize> = (0..n).collect();
    let (mut posted, mut done, mut failures) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    let mut window = (start, 0u64);
    let mut peak = 0.0f64;
    let more = |posted: u64, start: Instant| match limit {
        Limit::Messages(m) => posted < m,
        Limit::Time(d) => start.elapsed() < d,
    };
    loop {
        for i in refill.drain(..) {
            while outstanding[i] < depth && more(posted, start) && failures == 0 {
                l.qps[i].post_send(wr(op, &l.mr, &remote[i], posted, size))?;
                outstanding[i] += 1;
                posted += 1;
            }
        }
        if posted == done {
            break;
        }
        // Polling, as perftest does: completions and the packets behind
        // them are taken in on this thread.
        let first = l.scq.spin(T)?;
        for c in std::iter::once(first).chain(l.scq.poll()) {
            done += 1;
            if c.status != WcStatus::Success {
                if failures == 0 {
                    eprintln!(
                        " request {} on QP {:#x} failed: {}",
                        c.wr_id, c.qp_num, c.status
                    );
                }
                failures += 1;
            }
            if let Some(&i) = index.get(&c.qp_num) {
                outstanding[i] = outstanding[i].saturating_sub(1);
                refill.push(i);
            }
        }
        match limit {
            Limit::Messages(_) => bar.set_position(done),
            Limit::Time(_) => bar.set_position(start.elapsed().as_millis() as u64),
        }
        if window.0.elapsed() >= Duration::from_millis(100) {
            let bytes = (done - window.1) as f64 * f64::from(size);
            peak = peak.max(bytes / window.0.elapsed().as_secs_f64());
            window = (Instant::now(), done);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let bytes = done * u64::from(size);
    Ok(Bw {
        messages: done,
        bytes,
        secs,
        peak: peak.max(bytes as f64 / secs),
        failures,
    })
}

/// Latency of `iterations` requests posted one at a time on the first QP.
fn latency(
    l: &Local,
    remote: &[RemoteBuffer],
    op: Op,
    size: u32,
    iterations: u64,
    bar: &ProgressBar,
) -> Res<(Vec<Duration>, u64)> {
    let mut lat = Vec::with_capacity(iterations as usize);
    let mut failures = 0;
    for i in 0..iterations {
        let t = Instant::now();
        l.qps[0].post_send(wr(op, &l.mr, &remote[0], i, size))?;
        // Polling, never sleeping, as perftest's latency tests do.
        let c = l.scq.spin(T)?;
        lat.push(t.elapsed());
        if c.status != WcStatus::Success {
            failures += 1;
            break;
        }
        bar.set_position(i + 1);
    }
    lat.sort();
    Ok((lat, failures))
}

/// One side of a ping-pong on the first QP, as perftest's ib_write_lat and
/// ib_send_lat run it: each side sends its n-th message when the peer's
/// n-th has arrived; the side that `leads` sends first and times each
/// round trip, reporting half of it (what perftest reports). A WRITE lands
/// in the second half of the peer's buffer, which the peer watches, never
/// polling a completion queue for it; a SEND is taken from the receive
/// queue's completions. Both spin, never sleep.
fn ping_pong(
    l: &Local,
    remote: &RemoteBuffer,
    op: Op,
    size: u32,
    iterations: u64,
    leads: bool,
    bar: &ProgressBar,
) -> Res<(Vec<Duration>, u64)> {
    let half = l.mr.len() / 2;
    if (size as usize) > half || remote.len < 2 * half as u64 {
        return Err(format!("a {size}-byte ping-pong does not fit the buffers").into());
    }
    if op == Op::Write && size == 0 {
        return Err("a WRITE ping-pong needs at least one byte to watch".into());
    }
    let qp = &l.qps[0];
    let receive = || {
        qp.post_recv(RecvWr {
            wr_id: 0,
            sg_list: sg_list![l.mr.sge(half, half as u32)],
        })
    };
    if op == Op::Send {
        // One receive is enough: the peer's next SEND follows ours.
        receive()?;
    }
    let mut wr = wr(op, &l.mr, remote, 0, size);
    if let SendOp::Write { remote_addr, .. } = &mut wr.op {
        *remote_addr += half as u64;
    }
    // The last byte of each message counts the iterations, never 0 (the
    // buffer's first value), so every message differs from the one before.
    let last = size.saturating_sub(1) as usize;
    let tag = |i: u64| (i % 255) as u8 + 1;
    // The peer's `i`-th message, by its last byte or its completion.
    let arrived = |i: u64| -> Res<()> {
        if op == Op::Send {
            let c = l.rcq.spin(T)?;
            if c.status != WcStatus::Success {
                return Err(format!("a receive failed: {}", c.status).into());
            }
            return Ok(receive()?);
        }
        let start = Instant::now();
        let mut b = [0u8];
        for spins in 0u64.. {
            l.mr.read(half + last, &mut b);
            if b[0] == tag(i) {
                return Ok(());
            }
            if spins % 4096 == 0 && start.elapsed() > T {
                break;
            }
            std::hint::spin_loop();
        }
        Err(format!("the peer's WRITE {i} did not arrive in {T:?}").into())
    };
    let mut lat = Vec::with_capacity(if leads { iterations as usize } else { 0 });
    for i in 0..iterations {
        if !leads {
            arrived(i)?;
        }
        let t = Instant::now();
        l.mr.write(last, &[tag(i)]);
        qp.post_send(wr.clone())?;
        let c = l.scq.spin(T)?;
        if c.status != WcStatus::Success {
            return Ok((lat, 1));
        }
        if leads {
            arrived(i)?;
            lat.push(t.elapsed() / 2);
            bar.set_position(i + 1);
        }
    }
    lat.sort();
    Ok((lat, 0))
}

/// Keep receives posted on every QP of `l` (for SENDs from the peer) until
/// `stop`; count the failed ones. Every receive takes the largest message
/// of the run (the first half of the region), and the first call posts
/// them: a later size's run reposts what the earlier ones consumed, so that
/// the queue never holds receives too small for the next size, nor fills up.
fn refill_receives(l: &Local, stop: &AtomicBool, failed: &AtomicU64) -> Res<()> {
    let per_qp = 512;
    let len = (l.mr.len() / 2) as u32;
    if !l.primed.swap(true, Ordering::AcqRel) {
        for qp in &l.qps {
            for i in 0..per_qp {
                qp.post_recv(RecvWr {
                    wr_id: i,
                    sg_list: sg_list![l.mr.sge(0, len)],
                })?;
            }
        }
    }
    while !stop.load(Ordering::Acquire) {
        let Ok(first) = l.rcq.wait(Duration::from_millis(20)) else {
            continue;
        };
        for c in std::iter::once(first).chain(l.rcq.poll()) {
            if c.status != WcStatus::Success {
                if failed.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!(" a receive on QP {:#x} failed: {}", c.qp_num, c.status);
                }
                continue;
            }
            if let Some(qp) = l.qps.iter().find(|q| q.qpn() == c.qp_num) {
                qp.post_recv(RecvWr {
                    wr_id: c.wr_id,
                    sg_list: sg_list![l.mr.sge(0, len)],
                })?;
            }
        }
    }
    Ok(())
}

/// The result of one size.
pub(crate) struct Row {
    pub(crate) size: u32,
    pub(crate) bw: Option<Bw>,
    /// Sorted; for a ping-pong, half of each round trip.
    pub(crate) lat: Option<Vec<Duration>>,
    pub(crate) failures: u64,
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Who does what in one measurement.
struct Roles<'a> {
    /// This process sends (requests from `me`).
    sends: bool,
    /// The other NIC, in loopback mode, with what it may access of `me`: it
    /// also sends if bidirectional, and keeps receives posted for SENDs.
    peer: Option<(&'a Local, &'a [RemoteBuffer])>,
    /// `me` keeps receives posted for the peer's SENDs.
    receives_here: bool,
}

/// The measurement of one size. `finish` runs after this side's own
/// requests have completed and before the receive threads stop: the server
/// waits there for the client's "done".
fn measure(
    o: &Options,
    size: u32,
    me: &Local,
    my_remote: &[RemoteBuffer],
    roles: Roles<'_>,
    finish: impl FnOnce() -> Res<()>,
) -> Res<Row> {
    let Roles {
        sends,
        peer,
        receives_here,
    } = roles;
    let limit = match o.duration {
        Some(d) => Limit::Time(d),
        None => Limit::Messages(o.iterations),
    };
    let label = format!("{} {} B", o.op.name(), size);
    let bar = if o.json || o.quiet {
        ProgressBar::hidden()
    } else {
        progress(limit, label)
    };
    let stop = AtomicBool::new(false);
    let failed_recvs = AtomicU64::new(0);
    let row = std::thread::scope(|s| -> Res<Row> {
        // Receives for SENDs: on the peer (loopback), and here if the peer
        // also sends to us.
        let mut refills = Vec::new();
        let pings = o.latency && o.op.ping_pong();
        if o.op == Op::Send && !pings {
            if let Some((p, _)) = peer {
                refills.push(s.spawn(|| refill_receives(p, &stop, &failed_recvs)));
            }
            if receives_here {
                refills.push(s.spawn(|| refill_receives(me, &stop, &failed_recvs)));
            }
        }
        if o.op == Op::Send {
            // Let the receives be posted before the first SEND arrives.
            std::thread::sleep(Duration::from_millis(50));
        }
        let result = (|| -> Res<Row> {
            if o.latency {
                let n = match limit {
                    Limit::Messages(n) => n,
                    Limit::Time(d) => (d.as_micros() / 50).max(1) as u64,
                };
                let (lat, failures) = if pings {
                    // The client (or this process's first NIC) leads; the
                    // server, or the second NIC on a thread here, answers.
                    let answer = peer.map(|(p, r)| {
                        s.spawn(move || {
                            ping_pong(p, &r[0], o.op, size, n, false, &ProgressBar::hidden())
                        })
                    });
                    let leads = o.mode != Mode::Server;
                    let mine = ping_pong(me, &my_remote[0], o.op, size, n, leads, &bar);
                    let theirs = match answer {
                        Some(h) => h.join().map_err(|_| "the answering side panicked")?,
                        None => Ok((Vec::new(), 0)),
                    };
                    let (lat, failures) = mine?;
                    (lat, failures + theirs?.1)
                } else if sends {
                    latency(me, my_remote, o.op, size, n, &bar)?
                } else {
                    (Vec::new(), 0)
                };
                return Ok(Row {
                    size,
                    bw: None,
                    lat: sends.then_some(lat),
                    failures,
                });
            }
            let reverse = match (peer, o.bidir) {
                (Some((p, r)), true) => {
                    let bar = ProgressBar::hidden();
                    Some(s.spawn(move || bandwidth(p, r, o.op, size, limit, o.tx_depth, &bar)))
                }
                _ => None,
            };
            let mine = if sends {
                Some(bandwidth(
                    me, my_remote, o.op, size, limit, o.tx_depth, &bar,
                )?)
            } else {
                None
            };
            let theirs = match reverse {
                Some(h) => Some(h.join().map_err(|_| "the reverse direction panicked")??),
                None => None,
            };
            let bw = match (mine, theirs) {
                (Some(a), Some(b)) => Some(Bw {
                    messages: a.messages + b.messages,
                    bytes: a.bytes + b.bytes,
                    secs: a.secs.max(b.secs),
                    peak: a.peak + b.peak,
                    failures: a.failures + b.failures,
                }),
                (a, b) => a.or(b),
            };
            Ok(Row {
                size,
                failures: bw.map_or(0, |b| b.failures),
                bw,
                lat: None,
            })
        })();
        let finished = finish();
        stop.store(true, Ordering::Release);
        for r in refills {
            r.join().map_err(|_| "a receive thread panicked")??;
        }
        finished?;
        result
    })?;
    bar.finish_and_clear();
    Ok(Row {
        failures: row.failures + failed_recvs.load(Ordering::Relaxed),
        ..row
    })
}

/// Raw UDP between the same two addresses: `n` datagrams of `chunk` bytes,
/// sent by one thread and received by another.
fn udp_baseline_local(from: IpAddr, to: IpAddr, n: u64, chunk: usize) -> io::Result<f64> {
    let rx = UdpSocket::bind(SocketAddr::new(to, 0))?;
    let dest = rx.local_addr()?;
    let _ = rustix::net::sockopt::set_socket_recv_buffer_size(&rx, 4 << 20);
    let sender = std::thread::spawn(move || udp_send(from, dest, n, chunk));
    let got = udp_receive(&rx, n, chunk)?;
    let _ = sender.join();
    Ok(got)
}

fn udp_send(from: IpAddr, to: SocketAddr, n: u64, chunk: usize) -> io::Result<()> {
    let tx = UdpSocket::bind(SocketAddr::new(from, 0))?;
    let buf = vec![0x5Au8; chunk];
    for _ in 0..n {
        // Loopback drops when the receiver lags; pace by yielding on error.
        while tx.send_to(&buf, to).is_err() {
            std::thread::yield_now();
        }
    }
    Ok(())
}

/// Receive up to `n` datagrams; payload bytes per second from the first to the last.
fn udp_receive(rx: &UdpSocket, n: u64, chunk: usize) -> io::Result<f64> {
    rx.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut buf = vec![0u8; 65536];
    rx.recv(&mut buf)?;
    rx.set_read_timeout(Some(Duration::from_millis(200)))?;
    let start = Instant::now();
    let (mut got, mut last) = (1u64, start);
    while got < n {
        match rx.recv(&mut buf) {
            Ok(_) => {
                got += 1;
                last = Instant::now();
            }
            Err(_) => break, // the rest were dropped by the kernel
        }
    }
    let secs = (last - start).as_secs_f64().max(1e-9);
    Ok((got - 1) as f64 * chunk as f64 / secs)
}

/// The raw UDP transfer to compare with: datagrams of one message (at most
/// one PMTU) each, as many as the largest size's run moved (at least 1000).
fn baseline_plan(o: &Options, rows: &[Row]) -> (u64, usize) {
    let size = rows.iter().map(|r| r.size).max().unwrap_or(8) as usize;
    let chunk = size.clamp(1, o.mtu.bytes());
    let bytes = rows
        .iter()
        .filter(|r| r.size as usize == size)
        .filter_map(|r| r.bw.map(|b| b.bytes))
        .max()
        .unwrap_or(0);
    (bytes.div_ceil(chunk as u64).max(1000), chunk)
}

pub(crate) fn gbit(bytes_per_sec: f64) -> f64 {
    bytes_per_sec * 8.0 / 1e9
}

/// `outstanding`: READs and atomics outstanding per QP, as the first QP
/// has it (see [`Local::outstanding`]).
fn print_header(o: &Options, outstanding: u8, out: &mut impl Write) -> io::Result<()> {
    if o.json {
        return Ok(());
    }
    let how = match &o.mode {
        Mode::Loopback => "two rnic NICs in this process".to_string(),
        Mode::Server => "server side".to_string(),
        Mode::Client(h) => format!("client of {h}"),
    };
    let outs = match o.op {
        Op::Read => format!(", {outstanding} READs outstanding per QP"),
        Op::Atomic => format!(", {outstanding} atomics outstanding per QP"),
        Op::Write | Op::Send => String::new(),
    };
    writeln!(
        out,
        " RDMA {} {}{}, {} QP(s), PMTU {}{}, {}",
        o.op.name().to_uppercase(),
        match (o.latency, o.op.ping_pong()) {
            (false, _) => "bandwidth",
            (true, true) => "latency (half a ping-pong's round trip, as perftest)",
            (true, false) => "latency (post to completion, as perftest)",
        },
        match (o.bidir, &o.mode) {
            (false, _) => "",
            (true, Mode::Loopback) => " (both directions, summed)",
            (true, _) => " (both directions; this side's requests)",
        },
        o.qps.max(1),
        o.mtu.bytes(),
        outs,
        how
    )?;
    if o.latency {
        writeln!(
            out,
            " #bytes     #iterations    t_min[usec]    t_p50[usec]    t_p99[usec]    t_max[usec]"
        )
    } else {
        writeln!(
            out,
            " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
        )
    }
}

fn print_row(o: &Options, r: &Row, out: &mut impl Write) -> io::Result<()> {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    if let Some(lat) = &r.lat {
        if lat.is_empty() {
            return Ok(());
        }
        let (min, p50, p99, max) = (
            us(lat[0]),
            us(percentile(lat, 0.5)),
            us(percentile(lat, 0.99)),
            us(lat[lat.len() - 1]),
        );
        if o.json {
            writeln!(
                out,
                "{{\"op\":\"{}\",\"bytes\":{},\"iterations\":{},\"lat_min_us\":{min:.2},\"lat_p50_us\":{p50:.2},\"lat_p99_us\":{p99:.2},\"lat_max_us\":{max:.2},\"ok\":{}}}",
                o.op.name(), r.size, lat.len(), r.failures == 0
            )
        } else {
            writeln!(
                out,
                " {:<10} {:<14} {min:<14.2} {p50:<14.2} {p99:<14.2} {max:.2}",
                r.size,
                lat.len()
            )
        }
    } else if let Some(b) = r.bw {
        let avg = b.bytes_per_sec();
        let mpps = b.messages_per_sec() / 1e6;
        if o.json {
            writeln!(
                out,
                "{{\"op\":\"{}\",\"bytes\":{},\"iterations\":{},\"qps\":{},\"bidir\":{},\"bw_peak_gbps\":{:.3},\"bw_avg_gbps\":{:.3},\"msg_rate_mpps\":{mpps:.4},\"ok\":{}}}",
                o.op.name(), r.size, b.messages, o.qps.max(1), o.bidir, gbit(b.peak), gbit(avg), r.failures == 0
            )
        } else {
            writeln!(
                out,
                " {:<10} {:<14} {:<18.3} {:<20.3} {mpps:.4}",
                r.size,
                b.messages,
                gbit(b.peak),
                gbit(avg)
            )
        }
    } else {
        Ok(())
    }
}

fn print_baseline(
    o: &Options,
    rows: &[Row],
    base: f64,
    chunk: usize,
    out: &mut impl Write,
) -> io::Result<()> {
    // The largest size's bandwidth, against datagrams of its size.
    let size = rows.iter().map(|r| r.size).max().unwrap_or(0);
    let best = rows
        .iter()
        .filter(|r| r.size == size)
        .filter_map(|r| r.bw.map(|b| b.bytes_per_sec()))
        .fold(0.0f64, f64::max);
    let ratio = if base > 0.0 { best / base } else { 0.0 };
    if o.json {
        writeln!(
            out,
            "{{\"udp_baseline_gbps\":{:.3},\"udp_datagram_bytes\":{chunk},\"bytes\":{size},\"bw_avg_gbps\":{:.3},\"ratio_to_udp\":{ratio:.3}}}",
            gbit(base),
            gbit(best)
        )
    } else {
        writeln!(
            out,
            " baseline: raw UDP between the same addresses, {chunk}-byte datagrams: {:.3} Gb/s; rnic {size} B / raw UDP = {ratio:.3}",
            gbit(base)
        )
    }
}

/// Run; false if any operation failed.
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
}

impl LoopbackRun {
    pub(crate) fn new(o: &Options) -> Res<LoopbackRun> {
        let (a, b) = (Local::new(o)?, Local::new(o)?);
        let to_b = a.connect(o, &b.records())?;
        let to_a = b.connect(o, &a.records())?;
        Ok(LoopbackRun { a, b, to_a, to_b })
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
    let mut c = Control::new(s)?;
    let line = c.recv()?;
    o.adopt(&line)
        .ok_or_else(|| format!("malformed options '{line}' from {peer}"))?;
    o.mode = Mode::Server;
    let me = Local::new(&o)?;
    c.send_records(&me.records())?;
    let theirs = c.recv_records(me.qps.len())?;
    let to_client = me.connect(&o, &theirs)?;
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
    let mut c = Control::new(s)?;
    c.send(&o.to_line())?;
    let me = Local::new(o)?;
    let theirs = c.recv_records(me.qps.len())?;
    c.send_records(&me.records())?;
    let to_server = me.connect(o, &theirs)?;
    c.expect("ready")?;
    let server_addr = theirs[0].endpoint.addr;
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
            json: false,
            quiet: false,
            impair: None,
            outs: Some(5),
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
