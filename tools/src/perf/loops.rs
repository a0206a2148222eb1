//! One NIC's side of a measurement, and the loops that measure: a
//! bandwidth stream, a request's round trip, a ping-pong.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use rnic_verbs::rendezvous::{EndpointRecord, RemoteBuffer};
use rnic_verbs::*;

use super::{Mode, Op, Options, Res, T};

/// One NIC's part: its memory, queues and queue pairs.
pub(super) struct Local {
    pub(super) dev: Device,
    pub(super) _pd: ProtectionDomain,
    pub(super) mr: MemoryRegion,
    pub(super) scq: CompletionQueue,
    pub(super) rcq: CompletionQueue,
    pub(super) qps: Vec<QueuePair>,
    /// Receives for the peer's SENDs have been posted.
    pub(super) primed: AtomicBool,
}

impl Local {
    /// A NIC, its region, queues and QPs: on `RNIC_IFACE`'s interface or
    /// `RNIC_ADDR` if set, else on `at` (the address the peer reaches this
    /// process at) unless that is a loopback address, where the first
    /// free one is taken (the peer, on loopback too, holds another).
    pub(super) fn new(o: &Options, at: Option<IpAddr>) -> Res<Local> {
        let config = rnic_verbs::Config::from_env()?;
        let dev = match (&config.iface, config.addr, at) {
            (Some(i), _, _) => Device::open_on_interface_with(i, &config)?,
            (None, None, Some(a)) if !a.is_loopback() => Device::open_with(a, &config)?,
            _ => Device::open_loopback_with(&config)?,
        };
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

    pub(super) fn records(&self) -> Vec<EndpointRecord> {
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

    /// What this side grants its peer through the CM: its buffer's
    /// address, R_Key and length, in a connection's private data.
    fn grant(&self) -> Vec<u8> {
        let mut g = self.mr.addr().to_be_bytes().to_vec();
        g.extend_from_slice(&self.mr.rkey().to_be_bytes());
        g.extend_from_slice(&(self.mr.len() as u64).to_be_bytes());
        g
    }

    /// Connect this side's QPs, one after another, to the listener at
    /// `to` through the connection manager (REQ, REP, RTU), each handing
    /// over this side's buffer and taking the peer's.
    pub(super) fn connect_cm(&self, to: std::net::SocketAddr) -> Res<Connected> {
        let mut c = Connected::default();
        for qp in &self.qps {
            let conn = self.dev.connect(qp, to, &self.grant(), T)?;
            c.buffers.push(granted(conn.private_data())?);
            c.conns.push(conn);
        }
        Ok(c)
    }

    /// Accept one request at `l` for each of this side's QPs, in order
    /// (the peer's [`Local::connect_cm`]).
    pub(super) fn accept_cm(&self, l: &rnic_verbs::cm::Listener) -> Res<Connected> {
        let mut c = Connected::default();
        for qp in &self.qps {
            let incoming = l.next(T)?;
            c.buffers.push(granted(incoming.private_data())?);
            c.conns.push(incoming.accept(qp, &self.grant(), T)?);
        }
        Ok(c)
    }

    /// READs and atomics the first QP keeps outstanding (its
    /// max_rd_atomic, as the NIC has it).
    pub(super) fn outstanding(&self) -> Res<u8> {
        Ok(self
            .qps
            .first()
            .map_or(Ok(0), |q| q.query().map(|a| a.max_rd_atomic))?)
    }

    pub(super) fn connect(&self, o: &Options, remote: &[EndpointRecord]) -> Res<Vec<RemoteBuffer>> {
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

/// QPs connected through the CM: the peer's buffer of each, and the
/// connections (kept while the QPs are used).
#[derive(Debug, Default)]
pub(super) struct Connected {
    pub(super) buffers: Vec<RemoteBuffer>,
    pub(super) conns: Vec<rnic_verbs::cm::Connection>,
}

/// The buffer a peer granted in its private data ([`Local::grant`]).
fn granted(b: &[u8]) -> Res<RemoteBuffer> {
    let field = |r: std::ops::Range<usize>| b.get(r).ok_or("the peer granted no buffer");
    Ok(RemoteBuffer {
        va: u64::from_be_bytes(field(0..8)?.try_into()?),
        rkey: u32::from_be_bytes(field(8..12)?.try_into()?),
        len: u64::from_be_bytes(field(12..20)?.try_into()?),
    })
}

/// What one direction measured.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Bw {
    pub(crate) messages: u64,
    pub(crate) bytes: u64,
    pub(crate) secs: f64,
    pub(super) peak: f64,
    pub(super) failures: u64,
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

pub(super) fn wr(
    op: Op,
    local: &MemoryRegion,
    remote: &RemoteBuffer,
    id: u64,
    size: u32,
) -> SendWr {
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
pub(super) enum Limit {
    Messages(u64),
    Time(Duration),
}

pub(super) fn progress(limit: Limit, label: String) -> ProgressBar {
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
pub(super) fn bandwidth(
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
pub(super) fn latency(
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
pub(super) fn ping_pong(
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
pub(super) fn refill_receives(l: &Local, stop: &AtomicBool, failed: &AtomicU64) -> Res<()> {
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
pub(super) struct Roles<'a> {
    /// This process sends (requests from `me`).
    pub(super) sends: bool,
    /// The other NIC, in loopback mode, with what it may access of `me`: it
    /// also sends if bidirectional, and keeps receives posted for SENDs.
    pub(super) peer: Option<(&'a Local, &'a [RemoteBuffer])>,
    /// `me` keeps receives posted for the peer's SENDs.
    pub(super) receives_here: bool,
}

/// The measurement of one size. `finish` runs after this side's own
/// requests have completed and before the receive threads stop: the server
/// waits there for the client's "done".
pub(super) fn measure(
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
