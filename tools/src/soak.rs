//! `rnic soak`: many RC connections between two NICs on loopback, both
//! ways at once, every operation mixed, on impaired links, for minutes.
//! Every byte and every atomic result is checked against a model as it
//! completes; connections are drained, checked whole, torn down and made
//! again all the time; a connection that makes no progress, resident
//! memory that grows, or NIC tables that grow end the run as a failure.
//!
//! The model is exact because each side keeps at most `depth` work
//! requests outstanding and work request `k` uses slot `k % depth`: a slot
//! is used again only after its last request completed, so the order in
//! which requests were posted is the order in which they touched it (RC
//! executes in order). Messages that consume a receive (SEND, SEND with
//! immediate, WRITE with immediate) take their kind, length and contents
//! from the message's number, so the receiver regenerates what it must
//! have received.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{Duration, Instant};

use rnic_core::rng::Rng;
use rnic_verbs::*;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// How long to post new work.
    pub duration: Duration,
    /// Connections (queue pairs on each NIC).
    pub qps: usize,
    /// Work requests outstanding per side of each connection.
    pub depth: usize,
    /// Largest message.
    pub max_size: usize,
    /// Path MTU.
    pub mtu: Mtu,
    /// Each NIC's egress.
    pub impair: Option<Impairment>,
    /// One connection drained, checked and made again this often (zero:
    /// never).
    pub churn: Duration,
    /// A connection with work outstanding and no completion for this long
    /// is stuck.
    pub stall: Duration,
    /// Seed of the workload (operations, sizes, contents).
    pub seed: u64,
    /// How often to print a line.
    pub report: Duration,
    /// Where to record every packet both NICs send.
    pub pcap: Option<std::path::PathBuf>,
}

/// The impairment `rnic soak` applies when none is given.
pub const DEFAULT_IMPAIR: &str = "loss=1%,dup=1%,reorder=2%,corrupt=0.1%";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Write,
    Read,
    FetchAdd,
    CmpSwap,
    /// Consumes one of the peer's receives.
    Send,
    SendImm,
    WriteImm,
}

#[derive(Debug)]
struct Pending {
    seq: u64,
    kind: Kind,
    slot: usize,
    len: usize,
    /// The value an atomic must return.
    old: u64,
}

/// The size of each part of a side's region, in slots of `max_size` bytes:
/// sources, READ and atomic destinations, the peer's targets, the atomic
/// counter, receive buffers.
#[derive(Debug, Clone, Copy)]
struct Layout {
    depth: usize,
    slot: usize,
}

impl Layout {
    fn recvs(&self) -> usize {
        2 * self.depth
    }
    fn src(&self, s: usize) -> usize {
        s * self.slot
    }
    fn dst(&self, s: usize) -> usize {
        (self.depth + s) * self.slot
    }
    fn target(&self, s: usize) -> usize {
        (2 * self.depth + s) * self.slot
    }
    fn counter(&self) -> usize {
        3 * self.depth * self.slot
    }
    fn recv(&self, r: usize) -> usize {
        self.counter() + 64 + r * self.slot
    }
    fn len(&self) -> usize {
        self.recv(self.recvs())
    }
}

/// One end of a connection.
struct Side {
    qp: QueuePair,
    mr: MemoryRegion,
    posted: u64,
    pending: VecDeque<Pending>,
    /// The peer's target slots as they must be.
    shadow: Vec<u8>,
    /// The peer's atomic counter as it must be.
    counter: u64,
    /// Messages sent to the peer (its receives consumed).
    msgs_sent: u64,
    /// Messages received, in order.
    msgs_rcvd: u64,
    recvs_posted: u64,
    last_progress: Instant,
    rng: Rng,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Draining,
}

struct Conn {
    gen: u8,
    state: State,
    sides: [Side; 2],
}

/// wr_id: connection (16 bits), generation (8), receive flag (1), number (39).
fn wr_id(conn: usize, gen: u8, recv: bool, seq: u64) -> u64 {
    ((conn as u64) << 48)
        | (u64::from(gen) << 40)
        | (u64::from(recv) << 39)
        | (seq & ((1 << 39) - 1))
}

fn split_wr_id(id: u64) -> (usize, u8, bool, u64) {
    (
        (id >> 48) as usize,
        (id >> 40) as u8,
        id >> 39 & 1 == 1,
        id & ((1 << 39) - 1),
    )
}

fn fill(seed: u64, out: &mut [u8]) {
    let mut r = Rng::new(seed);
    for chunk in out.chunks_mut(8) {
        let w = r.next_u64().to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

fn mix(a: u64, b: u64) -> u64 {
    Rng::new(a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_u64()
}

/// A size: small, around the path MTU, or anything up to `max`.
fn size(r: &mut Rng, mtu: usize, max: usize) -> usize {
    match r.below(10) {
        0..=2 => r.below(65) as usize,
        3..=6 => r.below(3 * mtu as u64 + 1) as usize,
        _ => r.below(max as u64 + 1) as usize,
    }
    .min(max)
}

/// The run's identity of one direction of one generation of a connection:
/// what the messages of that direction are drawn from.
fn stream_key(seed: u64, conn: usize, gen: u8, from: usize) -> u64 {
    mix(
        seed,
        ((conn as u64) << 16) | (u64::from(gen) << 8) | from as u64,
    )
}

/// Message `k` of a stream: its kind, length and contents' seed.
fn message(key: u64, k: u64, mtu: usize, max: usize) -> (Kind, usize, u64) {
    let s = mix(key, k);
    let mut r = Rng::new(s);
    let kind = match r.below(3) {
        0 => Kind::Send,
        1 => Kind::SendImm,
        _ => Kind::WriteImm,
    };
    (kind, size(&mut r, mtu, max), s)
}

fn post_recv(lay: Layout, c: usize, conn: &mut Conn, d: usize) -> Result<()> {
    let s = &mut conn.sides[d];
    let r = (s.recvs_posted % lay.recvs() as u64) as usize;
    s.qp.post_recv(RecvWr {
        wr_id: wr_id(c, conn.gen, true, s.recvs_posted),
        sg_list: sg_list![s.mr.sge(lay.recv(r), lay.slot as u32)],
    })?;
    s.recvs_posted += 1;
    Ok(())
}

struct Run<'a> {
    o: &'a Options,
    devs: [Device; 2],
    pds: [ProtectionDomain; 2],
    scq: [CompletionQueue; 2],
    rcq: [CompletionQueue; 2],
    lay: Layout,
    conns: Vec<Conn>,
    errors: Vec<String>,
    ops: u64,
    bytes: u64,
    msgs: u64,
    remade: u64,
    stale: u64,
    wcs: Vec<Completion>,
}

impl<'a> Run<'a> {
    fn side(&self, d: usize, rng: Rng) -> Result<Side> {
        let rights = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        let mr = self.pds[d].register(self.lay.len(), rights)?;
        let caps = QpCaps {
            max_send_wr: self.lay.depth as u32,
            max_recv_wr: self.lay.recvs() as u32,
            ..QpCaps::default()
        };
        let qp = self.pds[d].create_rc_qp(&self.scq[d], &self.rcq[d], caps)?;
        Ok(Side {
            qp,
            mr,
            posted: 0,
            pending: VecDeque::new(),
            shadow: vec![0; self.lay.depth * self.lay.slot],
            counter: 0,
            msgs_sent: 0,
            msgs_rcvd: 0,
            recvs_posted: 0,
            last_progress: Instant::now(),
            rng,
        })
    }

    /// A new connection in slot `c` (generation `gen`), its receives posted.
    fn connect(&mut self, c: usize, gen: u8) -> Result<Conn> {
        let seed = mix(self.o.seed, (c as u64) << 8 | u64::from(gen));
        let sides = [
            self.side(0, Rng::new(mix(seed, 0)))?,
            self.side(1, Rng::new(mix(seed, 1)))?,
        ];
        // A 16.8 ms ACK timeout (exponent 12): losses are recovered often.
        let opts = ConnectOptions {
            mtu: self.o.mtu,
            timeout: 12,
            ..ConnectOptions::default()
        };
        sides[0].qp.connect(&sides[1].qp.endpoint(), &opts)?;
        sides[1].qp.connect(&sides[0].qp.endpoint(), &opts)?;
        let mut conn = Conn {
            gen,
            state: State::Running,
            sides,
        };
        for d in 0..2 {
            for _ in 0..self.lay.recvs() {
                post_recv(self.lay, c, &mut conn, d)?;
            }
        }
        Ok(conn)
    }

    /// Keep `depth` work requests outstanding on side `d` of connection `c`.
    fn post(&mut self, c: usize, d: usize) -> Result<bool> {
        let lay = self.lay;
        let (mtu, max) = (self.o.mtu.bytes(), self.o.max_size);
        let key = stream_key(self.o.seed, c, self.conns[c].gen, d);
        let gen = self.conns[c].gen;
        let [a, b] = &mut self.conns[c].sides;
        let (me, peer) = if d == 0 { (a, &*b) } else { (b, &*a) };
        let mut any = false;
        while me.pending.len() < lay.depth {
            let seq = me.posted;
            let slot = (seq % lay.depth as u64) as usize;
            let r = me.rng.below(100);
            let kind = match r {
                0..=29 => Kind::Write,
                30..=59 => Kind::Read,
                60..=67 => Kind::FetchAdd,
                68..=74 => Kind::CmpSwap,
                _ => Kind::Send,
            };
            let (kind, len, data_seed) = if kind == Kind::Send {
                message(key, me.msgs_sent, mtu, max)
            } else if matches!(kind, Kind::FetchAdd | Kind::CmpSwap) {
                (kind, 8, 0)
            } else {
                (kind, size(&mut me.rng, mtu, max), me.rng.next_u64())
            };
            let target = peer.mr.addr() + lay.target(slot) as u64;
            let counter = peer.mr.addr() + lay.counter() as u64;
            let rkey = peer.mr.rkey();
            let mut old = 0;
            let op = match kind {
                Kind::Write | Kind::WriteImm | Kind::Send | Kind::SendImm => {
                    let mut data = vec![0; len];
                    fill(data_seed, &mut data);
                    me.mr.write(lay.src(slot), &data);
                    if matches!(kind, Kind::Write | Kind::WriteImm) {
                        me.shadow[slot * lay.slot..][..len].copy_from_slice(&data);
                    }
                    let imm =
                        (kind != Kind::Write && kind != Kind::Send).then_some(me.msgs_sent as u32);
                    match kind {
                        Kind::Write | Kind::WriteImm => SendOp::Write {
                            remote_addr: target,
                            rkey,
                            imm,
                        },
                        _ => SendOp::Send { imm },
                    }
                }
                Kind::Read => SendOp::read(target, rkey),
                Kind::FetchAdd => {
                    let add = me.rng.next_u64() >> me.rng.below(64);
                    old = me.counter;
                    me.counter = me.counter.wrapping_add(add);
                    SendOp::fetch_add(counter, rkey, add)
                }
                Kind::CmpSwap => {
                    let hit = me.rng.chance(0.7);
                    let compare = if hit { me.counter } else { me.counter ^ 1 };
                    let swap = me.rng.next_u64();
                    old = me.counter;
                    if hit {
                        me.counter = swap;
                    }
                    SendOp::compare_swap(counter, rkey, compare, swap)
                }
            };
            if matches!(kind, Kind::Send | Kind::SendImm | Kind::WriteImm) {
                me.msgs_sent += 1;
            }
            let local = match kind {
                Kind::Read | Kind::FetchAdd | Kind::CmpSwap => lay.dst(slot),
                _ => lay.src(slot),
            };
            let sg_list = if len == 0 {
                SgList::new()
            } else {
                sg_list![me.mr.sge(local, len as u32)]
            };
            me.qp
                .post_send(SendWr::new(wr_id(c, gen, false, seq), op, sg_list))?;
            if me.pending.is_empty() {
                me.last_progress = Instant::now();
            }
            me.pending.push_back(Pending {
                seq,
                kind,
                slot,
                len,
                old,
            });
            me.posted += 1;
            any = true;
        }
        Ok(any)
    }

    fn fail(&mut self, msg: String) {
        if self.errors.len() < 100 {
            self.errors.push(msg);
        }
    }

    /// The parts of a completion's wr_id on NIC `d`, if it belongs to a
    /// live connection; a completion of a destroyed one must be a flush
    /// (counted), and one for no connection is a failure.
    fn current(&mut self, d: usize, wc: &Completion) -> Option<(usize, u8, bool, u64)> {
        let (c, gen, recv, seq) = split_wr_id(wc.wr_id);
        let Some(conn) = self.conns.get(c) else {
            self.fail(format!("NIC {d}: a completion for no connection: {wc:?}"));
            return None;
        };
        if gen != conn.gen {
            self.stale += 1;
            if wc.status != WcStatus::WrFlushErr {
                self.fail(format!("NIC {d}: a completion of a destroyed QP: {wc:?}"));
            }
            return None;
        }
        Some((c, gen, recv, seq))
    }

    /// A send-queue completion on NIC `d`.
    fn on_send(&mut self, d: usize, wc: Completion) {
        let Some((c, _, recv, seq)) = self.current(d, &wc) else {
            return;
        };
        let lay = self.lay;
        let [a, b] = &mut self.conns[c].sides;
        let (me, peer) = if d == 0 { (a, &*b) } else { (b, &*a) };
        let Some(p) = me.pending.pop_front() else {
            return self.fail(format!(
                "conn {c} NIC {d}: a completion nothing asked for: {wc:?}"
            ));
        };
        if recv || p.seq != seq {
            return self.fail(format!(
                "conn {c} NIC {d}: completion of wr {seq} where wr {} was next: {wc:?}",
                p.seq
            ));
        }
        if wc.status != WcStatus::Success {
            let msg = format!(
                "conn {c} NIC {d} qp {:#x}: {:?} of {} bytes: {}",
                me.qp.qpn(),
                p.kind,
                p.len,
                wc.status.name()
            );
            return self.fail(msg);
        }
        me.last_progress = Instant::now();
        let shadow = &me.shadow[p.slot * lay.slot..][..p.len];
        let mut got = vec![0; p.len];
        let bad = match p.kind {
            Kind::Write | Kind::WriteImm => {
                peer.mr.read(lay.target(p.slot), &mut got);
                (got != shadow).then_some("the peer's memory after a WRITE")
            }
            Kind::Read => {
                me.mr.read(lay.dst(p.slot), &mut got);
                (got != shadow).then_some("a READ's data")
            }
            Kind::FetchAdd | Kind::CmpSwap => {
                me.mr.read(lay.dst(p.slot), &mut got);
                let v = u64::from_ne_bytes(got[..8].try_into().unwrap_or_default());
                (v != p.old).then_some("an atomic's original value")
            }
            Kind::Send | Kind::SendImm => None,
        };
        if let Some(what) = bad {
            let msg = format!(
                "conn {c} NIC {d}: {what} differs (wr {seq}, {} bytes)",
                p.len
            );
            return self.fail(msg);
        }
        self.ops += 1;
        self.bytes += p.len as u64;
    }

    /// A receive completion on NIC `d`.
    fn on_recv(&mut self, d: usize, wc: Completion) {
        let Some((c, gen, recv, seq)) = self.current(d, &wc) else {
            return;
        };
        let lay = self.lay;
        let (mtu, max) = (self.o.mtu.bytes(), self.o.max_size);
        let conn = &mut self.conns[c];
        let key = stream_key(self.o.seed, c, gen, 1 - d);
        let me = &mut conn.sides[d];
        let k = me.msgs_rcvd;
        if !recv || seq != k {
            let msg = format!("conn {c} NIC {d}: receive {seq} completed where {k} was next");
            return self.fail(msg);
        }
        if wc.status != WcStatus::Success {
            // Used up all the same: the next receive completes next.
            me.msgs_rcvd += 1;
            let msg = format!("conn {c} NIC {d}: receive {k}: {}", wc.status.name());
            return self.fail(msg);
        }
        let (kind, len, data_seed) = message(key, k, mtu, max);
        let (opcode, imm) = match kind {
            Kind::Send => (WcOpcode::Recv, None),
            Kind::SendImm => (WcOpcode::Recv, Some(k as u32)),
            _ => (WcOpcode::RecvRdmaWithImm, Some(k as u32)),
        };
        if wc.opcode != opcode || wc.imm_data != imm || wc.byte_len as usize != len {
            let msg = format!(
                "conn {c} NIC {d}: message {k} should be {kind:?} of {len} bytes, imm {imm:?}: {wc:?}"
            );
            return self.fail(msg);
        }
        if kind != Kind::WriteImm {
            let mut want = vec![0; len];
            fill(data_seed, &mut want);
            let mut got = vec![0; len];
            let r = (seq % lay.recvs() as u64) as usize;
            me.mr.read(lay.recv(r), &mut got);
            if got != want {
                return self.fail(format!("conn {c} NIC {d}: message {k}'s data differs"));
            }
        }
        me.msgs_rcvd += 1;
        me.last_progress = Instant::now();
        self.msgs += 1;
        if let Err(e) = post_recv(lay, c, conn, d) {
            self.fail(format!("conn {c} NIC {d}: post_recv: {e}"));
        }
    }
}

impl Run<'_> {
    /// Nothing outstanding either way, every message received.
    fn drained(&self, c: usize) -> bool {
        let [a, b] = &self.conns[c].sides;
        a.pending.is_empty()
            && b.pending.is_empty()
            && a.msgs_rcvd == b.msgs_sent
            && b.msgs_rcvd == a.msgs_sent
    }

    /// Each side's targets and counter hold exactly what the model says.
    fn check_whole(&mut self, c: usize) {
        let lay = self.lay;
        let mut bad = Vec::new();
        for d in 0..2 {
            let me = &self.conns[c].sides[d];
            let peer = &self.conns[c].sides[1 - d];
            let mut got = vec![0; me.shadow.len()];
            peer.mr.read(lay.target(0), &mut got);
            if got != me.shadow {
                bad.push(format!(
                    "conn {c}: NIC {}'s targets differ from the model",
                    1 - d
                ));
            }
            let mut v = [0; 8];
            peer.mr.read(lay.counter(), &mut v);
            if u64::from_ne_bytes(v) != me.counter {
                bad.push(format!(
                    "conn {c}: NIC {}'s counter differs from the model",
                    1 - d
                ));
            }
        }
        for m in bad {
            self.fail(m);
        }
    }

    /// Connection `c`, drained: checked whole, destroyed, made again.
    fn remake(&mut self, c: usize) -> Result<()> {
        self.check_whole(c);
        let gen = self.conns[c].gen.wrapping_add(1);
        let fresh = self.connect(c, gen)?;
        // The old QPs and regions go when replaced.
        self.conns[c] = fresh;
        self.remade += 1;
        Ok(())
    }

    /// A side with work outstanding and no progress for the stall time.
    fn stuck(&self, now: Instant) -> Option<String> {
        for (c, conn) in self.conns.iter().enumerate() {
            for (d, s) in conn.sides.iter().enumerate() {
                let waiting = !s.pending.is_empty() || s.msgs_rcvd < conn.sides[1 - d].msgs_sent;
                if waiting && now.duration_since(s.last_progress) > self.o.stall {
                    let state = s.qp.query().map(|a| a.qp_state);
                    return Some(format!(
                        "conn {c} NIC {d} qp {:#x} ({:?}, {:?}): no progress for {:?}; {} requests outstanding (next {:?}), {} of the peer's {} messages received",
                        s.qp.qpn(),
                        conn.state,
                        state,
                        self.o.stall,
                        s.pending.len(),
                        s.pending.front(),
                        s.msgs_rcvd,
                        conn.sides[1 - d].msgs_sent,
                    ));
                }
            }
        }
        None
    }

    fn poll(&mut self) -> bool {
        let mut any = false;
        // One vector for every poll of the run (no allocation once warm).
        let mut wcs = std::mem::take(&mut self.wcs);
        for d in 0..2 {
            self.scq[d].poll_into(&mut wcs, 256);
            for wc in wcs.drain(..) {
                any = true;
                self.on_send(d, wc);
            }
            self.rcq[d].poll_into(&mut wcs, 256);
            for wc in wcs.drain(..) {
                any = true;
                self.on_recv(d, wc);
            }
        }
        self.wcs = wcs;
        any
    }
}

/// This process's resident memory (0 where /proc cannot tell).
fn rss() -> u64 {
    crate::bench::rss_bytes().unwrap_or(0)
}

const MIB: f64 = 1024.0 * 1024.0;

/// Run the soak; `Ok(true)` when every check held.
pub fn run(o: &Options) -> std::result::Result<bool, Box<dyn std::error::Error>> {
    if o.qps == 0 || o.qps > 1 << 16 || o.depth == 0 || o.depth > 1024 {
        return Err("1 to 65536 connections, a depth of 1 to 1024".into());
    }
    if o.max_size > 1 << 20 {
        return Err("messages up to 1 MiB".into());
    }
    let devs = [Device::open_loopback()?, Device::open_loopback()?];
    if let Some(path) = &o.pcap {
        for dev in &devs {
            dev.capture(path)?;
        }
    }
    let impair = o.impair.unwrap_or_default();
    for (i, dev) in devs.iter().enumerate() {
        if !impair.is_none() {
            dev.set_impairment(Impairment {
                seed: impair.seed ^ i as u64,
                ..impair
            })?;
        }
    }
    let pds = [devs[0].alloc_pd()?, devs[1].alloc_pd()?];
    let cq_depth = o.qps * o.depth * 4 + 64;
    let scq = [devs[0].create_cq(cq_depth)?, devs[1].create_cq(cq_depth)?];
    let rcq = [devs[0].create_cq(cq_depth)?, devs[1].create_cq(cq_depth)?];
    let lay = Layout {
        depth: o.depth,
        slot: o.max_size.max(8).next_multiple_of(64),
    };
    let mut run = Run {
        o,
        devs,
        pds,
        scq,
        rcq,
        lay,
        conns: Vec::new(),
        errors: Vec::new(),
        ops: 0,
        bytes: 0,
        msgs: 0,
        remade: 0,
        stale: 0,
        wcs: Vec::with_capacity(256),
    };
    for c in 0..o.qps {
        let conn = run.connect(c, 0)?;
        run.conns.push(conn);
    }
    println!(
        "rnic soak: {} RC connections between {} and {}, {} outstanding each way on each, messages 0 to {} B, path MTU {}, impairment {}, one connection remade every {:?}, for {:?}",
        o.qps,
        run.devs[0].addr(),
        run.devs[1].addr(),
        o.depth,
        o.max_size,
        o.mtu.bytes(),
        if impair.is_none() { "none".to_string() } else { format!("{impair:?}") },
        o.churn,
        o.duration,
    );
    let start = Instant::now();
    let warm = start + o.duration / 5;
    let mut next_report = start + o.report;
    let mut next_churn = start + o.churn;
    let mut churn_at = 0;
    let mut warm_rss = None::<u64>;
    let mut warm_footprint = None;
    let mut peak_rss = 0;
    let mut last = (start, 0u64, 0u64);
    let mut posting = true;
    let deadline_cap = o.duration + o.stall * 2;
    loop {
        let mut busy = run.poll();
        let now = Instant::now();
        if posting && now.duration_since(start) >= o.duration {
            posting = false;
            for conn in &mut run.conns {
                conn.state = State::Draining;
            }
        }
        for c in 0..run.conns.len() {
            if !run.errors.is_empty() {
                break;
            }
            match run.conns[c].state {
                State::Running => {
                    for d in 0..2 {
                        if let Err(e) = run.post(c, d).map(|p| busy |= p) {
                            run.fail(format!("conn {c} NIC {d}: post_send: {e}"));
                        }
                    }
                }
                State::Draining if posting && run.drained(c) => {
                    if let Err(e) = run.remake(c) {
                        run.fail(format!("conn {c}: remaking it: {e}"));
                    }
                }
                State::Draining => {}
            }
        }
        if posting && !o.churn.is_zero() && now >= next_churn {
            next_churn += o.churn;
            if run.conns[churn_at].state == State::Running {
                run.conns[churn_at].state = State::Draining;
            }
            churn_at = (churn_at + 1) % run.conns.len();
        }
        if now >= next_report {
            next_report += o.report;
            let r = rss();
            peak_rss = peak_rss.max(r);
            if now >= warm && warm_rss.is_none() {
                warm_rss = Some(r);
                warm_footprint = Some(run.devs.each_ref().map(|d| d.footprint().ok()));
            }
            let secs = now.duration_since(last.0).as_secs_f64();
            let rate = (run.ops - last.1) as f64 / secs;
            let gbps = (run.bytes - last.2) as f64 * 8.0 / secs / 1e9;
            last = (now, run.ops, run.bytes);
            let c = run.devs[0].counters()?;
            let i = run.devs[0].impairment_stats()?;
            println!(
                "{:>6.0} s  {:>9} ops {:>8.0}/s {:>6.2} Gb/s  {:>7} msgs  {:>5} remade  RSS {:>6.1} MiB  NIC 0: {} seq NAKs, {} RNR NAKs, {} dup requests; impaired {} lost {} dup {} corrupt {} reordered",
                now.duration_since(start).as_secs_f64(),
                run.ops,
                rate,
                gbps,
                run.msgs,
                run.remade,
                r as f64 / MIB,
                c.rcvd_seq_err,
                c.rcvd_rnr_err,
                c.duplicate_request,
                i.lost,
                i.duplicated,
                i.corrupted,
                i.reordered,
            );
            let _ = std::io::stdout().flush();
        }
        if run.errors.is_empty() {
            if let Some(s) = run.stuck(now) {
                run.fail(s);
            }
        }
        if !run.errors.is_empty() {
            break;
        }
        if !posting && (0..run.conns.len()).all(|c| run.drained(c)) {
            break;
        }
        if now.duration_since(start) > deadline_cap {
            run.fail("the run outlived its duration by twice the stall time".into());
            break;
        }
        if !busy {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    let elapsed = start.elapsed();
    if !run.errors.is_empty() {
        // A QP in error completes its two queues at once, but they reach
        // their completion queues one after the other: take in what the
        // first failure brought, so that its cause (a send's error, not the
        // flushed receives) is reported too.
        for _ in 0..20 {
            if !run.poll() {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    let end_rss = rss();
    peak_rss = peak_rss.max(end_rss);
    if run.errors.is_empty() {
        for c in 0..run.conns.len() {
            run.check_whole(c);
        }
    }
    let end_footprint = run.devs.each_ref().map(|d| d.footprint().ok());
    // RSS flat: at the end no more than 10% and 16 MiB above the sample
    // taken once warm (the first fifth of the run).
    let mut summary = String::new();
    if let Some(w) = warm_rss {
        let grown = end_rss.saturating_sub(w);
        let _ = write!(
            summary,
            "RSS {:.1} MiB once warm, {:.1} MiB at the end (peak {:.1} MiB)",
            w as f64 / MIB,
            end_rss as f64 / MIB,
            peak_rss as f64 / MIB
        );
        if grown as f64 > (w as f64 * 0.10).max(16.0 * MIB) {
            run.fail(format!(
                "resident memory grew by {:.1} MiB after warming up",
                grown as f64 / MIB
            ));
        }
    }
    if let Some(w) = warm_footprint {
        for (d, (a, b)) in w.iter().zip(&end_footprint).enumerate() {
            if let (Some((a, _)), Some((b, _))) = (a, b) {
                let grew = b.qps > a.qps
                    || b.cq_slots > a.cq_slots
                    || b.pd_slots > a.pd_slots
                    || b.key_slots > a.key_slots
                    || b.keys > a.keys
                    || b.regions > a.regions
                    || b.resting_ids > a.resting_ids.max(RESTING_MAX);
                if grew {
                    run.fail(format!("NIC {d}'s tables grew: {a:?} then {b:?}"));
                }
            }
        }
    }
    let secs = elapsed.as_secs_f64();
    println!(
        "{} work requests and {} messages in {:.0} s ({:.0}/s, {:.2} Gb/s of payload), {} connections remade, {} completions of destroyed QPs (flushed); {}",
        run.ops,
        run.msgs,
        secs,
        run.ops as f64 / secs,
        run.bytes as f64 * 8.0 / secs / 1e9,
        run.remade,
        run.stale,
        summary
    );
    for (d, f) in end_footprint.iter().enumerate() {
        if let Some((f, _)) = f {
            println!("NIC {d} at the end: {f:?}");
        }
    }
    for d in 0..2 {
        let c = run.devs[d].counters()?;
        println!(
            "NIC {d}: {} packets sent, {} received, {} ICRC errors, {} sequence NAKs received, {} RNR NAKs received, {} duplicate requests, {} retries exceeded",
            c.sent_pkts, c.rcvd_pkts, c.icrc_errors, c.rcvd_seq_err, c.rcvd_rnr_err, c.duplicate_request, c.retry_exceeded_err
        );
    }
    if run.ops == 0 {
        run.fail("no work request completed".into());
    }
    if run.errors.is_empty() {
        println!("rnic soak: every byte, atomic and completion as the model says; nothing stuck; memory flat");
        Ok(true)
    } else {
        // Causes first: flushed work requests only follow an error.
        let flushed = WcStatus::WrFlushErr.name();
        run.errors.sort_by_key(|e| e.contains(flushed));
        for e in run.errors.iter().take(20) {
            println!("FAILED: {e}");
        }
        Ok(false)
    }
}

/// Freed QP numbers and keys kept out of use, at most (each kind).
const RESTING_MAX: usize = 2 * rnic_core::rng::QUARANTINE;
