//! `rnic bench`: in one run, on loopback, rnic's bandwidth, round trips and
//! message rate next to what the kernel's TCP and UDP do between the same
//! two addresses with the same sizes ([`baseline`]), measured in the same
//! run so that the ratios mean something on a shared, noisy machine. It
//! prints a table, writes `bench.json` and draws `bench.png` ([`chart`]).
//!
//! Nothing here asserts a time: where rnic misses a goal, the table says by
//! how much.

mod baseline;
mod chart;

use std::io::{self, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rnic_verbs::{Access, Backing, ConnectOptions, Device, Mtu, QpCaps, QpType};

use crate::perf::{self, gbit, LoopbackRun};
use baseline::{PingPong, Udp};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = std::result::Result<T, BoxError>;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Each bandwidth figure runs this long.
    pub time: Duration,
    /// Round trips per latency figure.
    pub round_trips: usize,
    /// Message sizes of the bandwidth figures.
    pub sizes: Vec<u32>,
    /// rnic's path MTU, and the datagram size of the UDP baselines.
    pub mtu: Mtu,
    /// Queue pairs of the many-QP figure (0: skip it).
    pub many_qps: u32,
    /// Bytes of the registration figure (0: skip it).
    pub register_bytes: usize,
    /// Where bench.json and bench.png go.
    pub out: PathBuf,
}

impl Options {
    /// What `rnic bench` runs with no options: every size from 64 B to
    /// 1 MiB by fours, half a second each; about two minutes.
    pub fn full(out: PathBuf) -> Options {
        Options {
            time: Duration::from_millis(500),
            round_trips: 20_000,
            sizes: (0..8).map(|k| 64u32 << (2 * k)).collect(),
            mtu: Mtu::Mtu4096,
            many_qps: 1000,
            register_bytes: 1 << 30,
            out,
        }
    }

    /// The size the large-message goals are read at: 64 KiB, or the
    /// largest measured.
    fn big(&self) -> u32 {
        if self.sizes.contains(&65536) {
            65536
        } else {
            self.sizes.iter().copied().max().unwrap_or(64)
        }
    }

    /// A few seconds: every figure once, small (a smoke test of the bench).
    pub fn quick(out: PathBuf) -> Options {
        Options {
            time: Duration::from_millis(50),
            round_trips: 500,
            sizes: vec![64, 65536],
            many_qps: 64,
            register_bytes: 64 << 20,
            ..Options::full(out)
        }
    }
}

/// One line of the bandwidth chart: a transport at every size.
#[derive(Debug, Clone)]
pub struct Series {
    /// What it is, as the table and chart name it.
    pub name: String,
    /// Whether it is rnic (drawn solid) or a baseline (dashed).
    pub rnic: bool,
    /// (message bytes, Gb/s, million messages per second).
    pub points: Vec<(u32, f64, f64)>,
}

impl Series {
    fn at(&self, size: u32) -> Option<(f64, f64)> {
        self.points
            .iter()
            .find(|p| p.0 == size)
            .map(|&(_, g, m)| (g, m))
    }
}

/// Round trips of one transport: min, p50, p99 in microseconds.
#[derive(Debug, Clone)]
pub struct RoundTrip {
    /// What bounced.
    pub name: String,
    /// Whether it is rnic.
    pub rnic: bool,
    /// Fastest, median, 99th percentile (microseconds).
    pub us: [f64; 3],
}

/// A goal of the performance work and where this run stands.
#[derive(Debug, Clone)]
pub struct Goal {
    /// What is compared.
    pub what: String,
    /// The measured ratio.
    pub ratio: f64,
    /// The goal, and whether the ratio must be at least (true) or at most it.
    pub goal: f64,
    /// At least (bandwidth, rate) or at most (time, memory).
    pub at_least: bool,
}

impl Goal {
    /// The ratio must reach `goal` (bandwidth, rate).
    fn at_least(what: String, ratio: f64, goal: f64) -> Goal {
        Goal {
            what,
            ratio,
            goal,
            at_least: true,
        }
    }

    /// The ratio must stay within `goal` (time, memory).
    fn at_most(what: String, ratio: f64, goal: f64) -> Goal {
        Goal {
            at_least: false,
            ..Goal::at_least(what, ratio, goal)
        }
    }

    fn met(&self) -> bool {
        if self.at_least {
            self.ratio >= self.goal
        } else {
            self.ratio <= self.goal
        }
    }
}

/// A figure with no size.
#[derive(Debug, Clone)]
pub struct Figure {
    /// What the goals and the JSON know it by.
    pub key: &'static str,
    /// What it is, in words.
    pub what: String,
    /// Its value, in `unit`.
    pub value: f64,
    /// Its unit.
    pub unit: &'static str,
}

/// Everything one run measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Date and machine.
    pub context: Vec<(String, String)>,
    /// Bandwidth at each size.
    pub series: Vec<Series>,
    /// 64-byte round trips.
    pub round_trips: Vec<RoundTrip>,
    /// Figures with no size: many QPs, memory per QP, registration.
    pub other: Vec<Figure>,
    /// The goals.
    pub goals: Vec<Goal>,
    /// Operations that failed (a correct run has none).
    pub failures: u64,
}

impl Report {
    /// Series `name` at `size`: (Gb/s, million messages per second).
    fn at(&self, name: &str, size: u32) -> Option<(f64, f64)> {
        self.series
            .iter()
            .find(|s| s.name == name)
            .and_then(|s| s.at(size))
    }

    /// The median round trip of `name` (us).
    fn p50(&self, name: &str) -> Option<f64> {
        self.round_trips
            .iter()
            .find(|x| x.name == name)
            .map(|x| x.us[1])
    }
}

/// What is being measured, on one line of a terminal.
fn progress(what: &str) {
    use std::io::IsTerminal;
    if io::stderr().is_terminal() {
        // An empty `what` clears the line.
        let sep = if what.is_empty() { "" } else { " bench: " };
        eprint!("\r\x1b[K{sep}{what}");
        let _ = io::stderr().flush();
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn perf_options(op: perf::Op, qps: u32, o: &Options) -> perf::Options {
    perf::Options {
        op,
        mode: perf::Mode::Loopback,
        port: 0,
        size: 64,
        iterations: o.round_trips as u64,
        duration: Some(o.time),
        qps,
        tx_depth: 128,
        latency: false,
        bidir: false,
        all_sizes: false,
        mtu: o.mtu,
        mtu_of_port: false,
        json: false,
        quiet: true,
        impair: None,
        outs: None,
        cm: false,
    }
}

/// Run everything; false if an rnic operation failed.
pub fn run(o: &Options) -> Res<bool> {
    let r = measure(o)?;
    progress("");
    let stdout = io::stdout();
    let mut out = stdout.lock();
    print(&r, o, &mut out)?;
    std::fs::create_dir_all(&o.out)?;
    let json = o.out.join("bench.json");
    std::fs::write(&json, to_json(&r).to_string() + "\n")?;
    writeln!(out, "\n wrote {}", json.display())?;
    let png = o.out.join("bench.png");
    match chart::draw(&r, &png) {
        Ok(()) => writeln!(out, " wrote {}", png.display())?,
        Err(e) => writeln!(out, " no chart: {e}")?,
    }
    Ok(r.failures == 0)
}

fn measure(o: &Options) -> Res<Report> {
    let mut r = Report {
        context: context(o),
        ..Report::default()
    };
    // Every rnic configuration is set up first, so that each size's figures
    // (baselines and rnic) are measured one right after the other.
    let configs = [
        (perf::Op::Write, 1),
        (perf::Op::Read, 1),
        (perf::Op::Send, 1),
        (perf::Op::Write, 8),
        (perf::Op::Read, 8),
        (perf::Op::Send, 8),
    ];
    if o.many_qps > 0 {
        idle_qp_memory(o.many_qps, &mut r)?;
    }
    progress("setting up");
    let mut rnic = Vec::new();
    for (op, qps) in configs {
        let po = perf::Options {
            size: o.sizes.iter().copied().max().unwrap_or(64),
            ..perf_options(op, qps, o)
        };
        let run = LoopbackRun::new(&po)?;
        let name = format!("rnic {} {qps} QP", op.name().to_uppercase());
        rnic.push((
            po,
            run,
            Series {
                name,
                rnic: true,
                points: Vec::new(),
            },
        ));
    }
    let (a, b) = rnic[0].1.addrs();
    let dgram = |size: u32| (size as usize).min(o.mtu.bytes());
    let mut base: Vec<Series> = [
        "TCP stream",
        "UDP",
        "UDP sendmmsg",
        "UDP GSO/GRO",
        WRITE_SHAPED,
    ]
    .iter()
    .map(|n| Series {
        name: n.to_string(),
        rnic: false,
        points: Vec::new(),
    })
    .collect();
    for &size in &o.sizes {
        progress(&format!("{size} B: TCP"));
        let tcp = baseline::tcp_stream(a, b, size as usize, o.time)?;
        base[0]
            .points
            .push((size, gbit(tcp), tcp / f64::from(size) / 1e6));
        for (i, how) in [Udp::PerCall, Udp::Batched, Udp::Segmented]
            .into_iter()
            .enumerate()
        {
            progress(&format!("{size} B: UDP {how:?}"));
            let (bps, pps) = baseline::udp_stream(a, b, dgram(size), how, o.time)?;
            // Messages of `size` per second, a message being size/dgram datagrams.
            let msgs = pps * dgram(size) as f64 / f64::from(size);
            base[i + 1].points.push((size, gbit(bps), msgs / 1e6));
        }
        progress(&format!("{size} B: UDP WRITE-shaped"));
        let (bps, mps) = baseline::udp_write_shaped(a, b, size as usize, o.mtu.bytes(), o.time)?;
        base[4].points.push((size, gbit(bps), mps / 1e6));
        for (po, run, s) in &mut rnic {
            progress(&format!("{size} B: {}", s.name));
            let row = run.measure(po, size)?;
            r.failures += row.failures;
            if let Some(bw) = row.bw {
                s.points
                    .push((size, gbit(bw.bytes_per_sec()), bw.messages_per_sec() / 1e6));
            }
        }
    }
    let mut retries = 0;
    for (_, run, _) in &rnic {
        retries += run.retries()?;
    }
    r.other.push(Figure {
        key: "retransmissions",
        what: "rnic retransmissions in the bandwidth runs (timeouts, sequence NAKs)".into(),
        value: retries as f64,
        unit: "requests",
    });
    r.series = base;
    r.series.extend(rnic.into_iter().map(|(_, _, s)| s));

    progress("round trips: UDP, TCP");
    for (name, over) in [
        ("UDP ping-pong", PingPong::Udp),
        ("TCP ping-pong", PingPong::Tcp),
        (PING_PONG_SHAPED, PingPong::WriteShaped),
    ] {
        let rtts = baseline::ping_pong(a, b, 64, o.round_trips, over)?;
        r.round_trips.push(RoundTrip {
            name: name.into(),
            rnic: false,
            us: quantiles(&rtts, 1.0),
        });
    }
    // perf reports half of a ping-pong's round trip, as perftest does, and
    // a READ's whole (post to completion, nothing polling on the
    // responder's side: its engine thread answers).
    for (op, whole) in [
        (perf::Op::Write, 2.0),
        (perf::Op::Send, 2.0),
        (perf::Op::Read, 1.0),
    ] {
        progress(&format!("round trips: rnic {}", op.name().to_uppercase()));
        let po = perf::Options {
            latency: true,
            duration: None,
            ..perf_options(op, 1, o)
        };
        let run = LoopbackRun::new(&po)?;
        let row = run.measure(&po, 64)?;
        r.failures += row.failures;
        let lat = row.lat.unwrap_or_default();
        r.round_trips.push(RoundTrip {
            name: format!("rnic {}", op.name().to_uppercase()),
            rnic: true,
            us: quantiles(&lat, whole),
        });
    }

    if o.many_qps > 0 {
        many_qps(o, &mut r)?;
    }
    if o.register_bytes > 0 {
        progress("registering");
        let dev = Device::open_loopback()?;
        let pd = dev.alloc_pd()?;
        let t = Instant::now();
        let mr = pd.register_with(o.register_bytes, Access::LOCAL_WRITE, Backing::Pages)?;
        let secs = t.elapsed().as_secs_f64();
        drop(mr);
        r.other.push(Figure {
            key: "register_ms",
            what: format!("registering {} MiB (page-backed)", o.register_bytes >> 20),
            value: secs * 1e3,
            unit: "ms",
        });
    }
    r.goals = goals(&r, o);
    let floor = against_the_floor(&r, o);
    r.other.extend(floor);
    Ok(r)
}

/// The bandwidth series of the kernel sending a WRITE's datagrams.
const WRITE_SHAPED: &str = "UDP GSO/GRO, WRITE-shaped";
/// The ping-pong of a WRITE's datagrams.
const PING_PONG_SHAPED: &str = "UDP ping-pong, WRITE-shaped";

/// How far RoCE's shape of traffic alone sets the kernel back, and how far
/// rnic's own work then does: the goals' ratios split in two. No goal of
/// their own.
fn against_the_floor(r: &Report, o: &Options) -> Vec<Figure> {
    let big = o.big();
    let gbps = |name: &str| r.at(name, big).map(|x| x.0);
    let p50 = |name: &str| r.p50(name);
    let mut f = Vec::new();
    let mut ratio = |key, what: String, x: Option<f64>, base: Option<f64>| {
        if let (Some(x), Some(base)) = (x, base) {
            f.push(Figure {
                key,
                what,
                value: x / base,
                unit: "x",
            });
        }
    };
    let size = size_label(big);
    ratio(
        "shaped_vs_gso",
        format!("{size}: {WRITE_SHAPED} / UDP GSO/GRO"),
        gbps(WRITE_SHAPED),
        gbps("UDP GSO/GRO"),
    );
    ratio(
        "write_vs_shaped",
        format!("{size}: rnic WRITE 1 QP / {WRITE_SHAPED}"),
        gbps("rnic WRITE 1 QP"),
        gbps(WRITE_SHAPED),
    );
    ratio(
        "shaped_vs_ping_pong",
        format!("64 B round trip p50: {PING_PONG_SHAPED} / UDP ping-pong"),
        p50(PING_PONG_SHAPED),
        p50("UDP ping-pong"),
    );
    ratio(
        "write_rt_vs_shaped",
        format!("64 B round trip p50: rnic WRITE / {PING_PONG_SHAPED}"),
        p50("rnic WRITE"),
        p50(PING_PONG_SHAPED),
    );
    f
}

/// min, p50, p99 of sorted durations, times `scale`, in microseconds.
fn quantiles(sorted: &[Duration], scale: f64) -> [f64; 3] {
    [
        us(sorted.first().copied().unwrap_or_default()) * scale,
        us(perf::percentile(sorted, 0.5)) * scale,
        us(perf::percentile(sorted, 0.99)) * scale,
    ]
}

/// Resident memory per idle connected QP: `n` pairs of QPs between two
/// NICs, created and connected with the default capacities. Measured before
/// anything else, so that the heap has no freed memory to reuse.
fn idle_qp_memory(n: u32, r: &mut Report) -> Res<()> {
    progress(&format!("{n} idle QPs"));
    let (a, b) = (Device::open_loopback()?, Device::open_loopback()?);
    let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
    let (ca, cb) = (a.create_cq(1024)?, b.create_cq(1024)?);
    let before = rss_bytes();
    let mut qps = Vec::new();
    for _ in 0..n {
        let x = pa.create_qp(QpType::Rc, &ca, &ca, QpCaps::default(), None)?;
        let y = pb.create_qp(QpType::Rc, &cb, &cb, QpCaps::default(), None)?;
        x.connect(&y.endpoint(), &ConnectOptions::default())?;
        y.connect(&x.endpoint(), &ConnectOptions::default())?;
        qps.push((x, y));
    }
    // Let the engines settle before reading.
    std::thread::sleep(Duration::from_millis(50));
    let after = rss_bytes();
    if let (Some(b0), Some(b1)) = (before, after) {
        let per = b1.saturating_sub(b0) as f64 / f64::from(2 * n);
        r.other.push(Figure {
            key: "idle_qp_kib",
            what: format!(
                "memory per idle connected RC QP ({} QPs, default caps)",
                2 * n
            ),
            value: per / 1024.0,
            unit: "KiB",
        });
    }
    Ok(())
}

/// The aggregate WRITE bandwidth of many QPs all active.
fn many_qps(o: &Options, r: &mut Report) -> Res<()> {
    let n = o.many_qps;
    progress(&format!("WRITE 64 KiB on {n} QPs"));
    let po = perf::Options {
        tx_depth: 2,
        size: 65536,
        ..perf_options(perf::Op::Write, n, o)
    };
    let run = LoopbackRun::new(&po)?;
    let row = run.measure(&po, 65536)?;
    r.failures += row.failures;
    if let Some(bw) = row.bw {
        r.other.push(Figure {
            key: "many_qps_gbps",
            what: format!("rnic WRITE 64 KiB, {n} QPs (2 in flight each)"),
            value: gbit(bw.bytes_per_sec()),
            unit: "Gb/s",
        });
    }
    Ok(())
}

/// This process's resident memory, from /proc.
pub(crate) fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * rustix::param::page_size() as u64)
}

fn goals(r: &Report, o: &Options) -> Vec<Goal> {
    let mut g = Vec::new();
    let big = o.big();
    let small = o.sizes.iter().copied().min().unwrap_or(64);
    let at = |name: &str, size: u32| r.at(name, size);
    if let (Some(w), Some(t), Some(u)) = (
        at("rnic WRITE 1 QP", big),
        at("TCP stream", big),
        at("UDP GSO/GRO", big),
    ) {
        let what = |base: &str| format!("WRITE {big} B, 1 QP / {base}");
        g.push(Goal::at_least(what("TCP stream"), w.0 / t.0, 1.0));
        g.push(Goal::at_least(what("UDP GSO/GRO"), w.0 / u.0, 0.8));
    }
    let p50 = |name: &str| r.p50(name);
    if let Some(udp) = p50("UDP ping-pong") {
        for op in ["WRITE", "SEND"] {
            if let Some(x) = p50(&format!("rnic {op}")) {
                let what = format!("{op} 64 B round trip p50 / UDP ping-pong");
                g.push(Goal::at_most(what, x / udp, 1.25));
            }
        }
    }
    if let (Some(w), Some(u)) = (at("rnic WRITE 1 QP", small), at("UDP sendmmsg", small)) {
        let what = format!("WRITE {small} B message rate / UDP sendmmsg datagrams");
        g.push(Goal::at_least(what, w.1 / u.1, 0.7));
    }
    let figure = |key: &str| r.other.iter().find(|f| f.key == key).map(|f| f.value);
    if let (Some(many), Some(one)) = (figure("many_qps_gbps"), at("rnic WRITE 1 QP", 65536)) {
        let what = format!("WRITE 64 KiB, {} QPs / 1 QP", o.many_qps);
        g.push(Goal::at_least(what, many / one.0, 0.8));
    }
    if let Some(kib) = figure("idle_qp_kib") {
        g.push(Goal::at_most(
            "KiB per idle QP / 16 KiB".into(),
            kib / 16.0,
            1.0,
        ));
    }
    g
}

/// Today's date (UTC) and the machine's shape.
fn context(o: &Options) -> Vec<(String, String)> {
    let mut c = Vec::new();
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400) as i64;
    let (y, m, d) = civil(days);
    c.push(("date".into(), format!("{y:04}-{m:02}-{d:02}")));
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    c.push(("cpus".into(), format!("{cpus} x {model}")));
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let kb: u64 = s.lines().next()?.split_whitespace().nth(1)?.parse().ok()?;
            Some(format!("{:.0} GiB", kb as f64 / (1u64 << 20) as f64))
        })
        .unwrap_or_default();
    c.push(("memory".into(), mem));
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    c.push(("kernel".into(), kernel.trim().to_string()));
    c.push((
        "settings".into(),
        format!(
            "{} ms per bandwidth figure, {} round trips, PMTU {}, UDP datagrams of min(size, PMTU)",
            o.time.as_millis(),
            o.round_trips,
            o.mtu.bytes()
        ),
    ));
    c
}

/// Year, month, day of a count of days since 1970-01-01 (the proleptic
/// Gregorian calendar; H. Hinnant's days-to-civil).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn size_label(b: u32) -> String {
    match b {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn print(r: &Report, o: &Options, out: &mut impl Write) -> io::Result<()> {
    writeln!(out, " rnic bench, loopback, one run")?;
    for (k, v) in &r.context {
        writeln!(out, "   {k}: {v}")?;
    }
    writeln!(
        out,
        "\n Bandwidth, Gb/s (messages of each size, as many in flight as the transport allows)"
    )?;
    write!(out, " {:<28}", "")?;
    for &s in &o.sizes {
        write!(out, "{:>9}", size_label(s))?;
    }
    writeln!(out)?;
    for s in &r.series {
        write!(out, " {:<28}", s.name)?;
        for &size in &o.sizes {
            match s.at(size) {
                Some((g, _)) => write!(out, "{g:>9.2}")?,
                None => write!(out, "{:>9}", "-")?,
            }
        }
        writeln!(out)?;
    }
    writeln!(out, "\n Message rate, millions per second")?;
    for s in &r.series {
        write!(out, " {:<28}", s.name)?;
        for &size in &o.sizes {
            match s.at(size) {
                Some((_, m)) => write!(out, "{m:>9.3}")?,
                None => write!(out, "{:>9}", "-")?,
            }
        }
        writeln!(out)?;
    }
    writeln!(
        out,
        "\n 64 B round trips, polling, us                   min      p50      p99"
    )?;
    for x in &r.round_trips {
        writeln!(
            out,
            " {:<44} {:>8.2} {:>8.2} {:>8.2}",
            x.name, x.us[0], x.us[1], x.us[2]
        )?;
    }
    if r.round_trips.iter().any(|x| x.name == "rnic READ") {
        writeln!(
            out,
            " (a READ: post to completion; nothing polls on the responder's side)"
        )?;
    }
    // Ratios (unit "x") come after the goals they split.
    let (ratios, figures): (Vec<&Figure>, Vec<&Figure>) =
        r.other.iter().partition(|f| f.unit == "x");
    if !figures.is_empty() {
        writeln!(out)?;
        for f in figures {
            writeln!(out, " {}: {:.2} {}", f.what, f.value, f.unit)?;
        }
    }
    writeln!(
        out,
        "\n Goals                                                   ratio     goal"
    )?;
    for g in &r.goals {
        writeln!(
            out,
            " {:<54} {:>7.2}  {} {:<5} {}",
            g.what,
            g.ratio,
            if g.at_least { ">=" } else { "<=" },
            g.goal,
            if g.met() { "met" } else { "MISSED" }
        )?;
    }
    if !ratios.is_empty() {
        writeln!(
            out,
            "\n The same ratios split in two: the kernel sending RoCE's datagrams with no\n NIC's work, against its own figure; then rnic against that"
        )?;
        for f in ratios {
            writeln!(out, " {:<70} {:>7.2}", f.what, f.value)?;
        }
    }
    if r.failures > 0 {
        writeln!(out, "\n {} rnic operations FAILED", r.failures)?;
    }
    Ok(())
}

fn to_json(r: &Report) -> serde_json::Value {
    use serde_json::json;
    json!({
        "context": r.context.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "bandwidth": r.series.iter().map(|s| json!({
            "name": s.name,
            "rnic": s.rnic,
            "points": s.points.iter().map(|&(b, g, m)| json!({"bytes": b, "gbps": g, "mmsgs_per_sec": m})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "round_trips_us": r.round_trips.iter().map(|x| json!({
            "name": x.name, "rnic": x.rnic, "min": x.us[0], "p50": x.us[1], "p99": x.us[2],
        })).collect::<Vec<_>>(),
        "other": r.other.iter().map(|f| json!({"key": f.key, "what": f.what, "value": f.value, "unit": f.unit})).collect::<Vec<_>>(),
        "goals": r.goals.iter().map(|g| json!({
            "what": g.what, "ratio": g.ratio, "goal": g.goal,
            "at_least": g.at_least, "met": g.met(),
        })).collect::<Vec<_>>(),
        "failures": r.failures,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(11_016), (2000, 2, 29));
        assert_eq!(civil(20_780), (2026, 11, 23));
    }
}
