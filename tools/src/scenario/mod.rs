//! `rnic demo --scenario NAME`: what RDMA does when things go wrong, told
//! packet by packet. Two NICs run on rnic-core's simulator (a virtual
//! clock, a seeded network, losses scripted by opcode and PSN), so every
//! run prints the same thing. Each packet is printed as it leaves, with
//! its fate; each arrival and each timer with the state that explains what
//! the NIC did (the requester's next and oldest unacknowledged PSN, its
//! retry counters, the responder's expected PSN and MSN) and a sentence
//! saying why. Every scenario then checks its outcome, memory and
//! completions: if the engine ever stops behaving as the narration says,
//! the scenario fails (exit status 1) instead of telling a story that is
//! no longer true.

mod cases;

use std::io::{self, Write};
use std::path::Path;
use std::time::Duration;

use rnic_core::cq::CqHandle;
use rnic_core::mem::{Access, MrKeys, PdHandle};
use rnic_core::qp::{AddressVector, Mtu, QpAttr, QpState, QpType, QpView};
use rnic_core::sim::{Cluster, DropRule, Fate, LinkConfig};
use rnic_core::time::Time;
use rnic_core::wr::{sg_list, Completion, RecvWr, SendOp, SendWr, Sge, UdDest};
use rnic_core::{Datagram, Mechanisms, QpCaps};
use rnic_wire::aeth::{rnr_timer_micros, NakCode, Syndrome};
use rnic_wire::opcode::Operation;
use rnic_wire::{IbPacket, Opcode, Psn};

/// A scenario: its name, what it shows, and the function that runs it.
pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    /// How its first part's QPs are made.
    setup: Setup,
    run: fn(&mut Story) -> io::Result<()>,
}

/// Every scenario, in the order `--list` shows them.
pub const SCENARIOS: &[Scenario] = cases::ALL;

/// The one-way delay of the simulated link.
const DELAY: Duration = Duration::from_micros(5);
/// Where each side's memory region starts.
const IOVA: [u64; 2] = [0x1_0000_0000, 0x2_0000_0000];
/// Its size.
const REGION: usize = 64 * 1024;
/// The Q_Key of the UD scenarios' QPs.
const QKEY: u32 = 0x1111_1111;
/// The bytes of a classic pcap file's header.
const PCAP_HEADER: usize = 24;

/// How a scenario's two QPs are made.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub qp_type: QpType,
    /// A's first PSN (B's is fixed).
    pub a_psn: u32,
    /// The local ACK timeout exponent (4.096 us x 2^timeout).
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    /// The RNR timer code B asks A to wait (see IBTA Table 45).
    pub min_rnr_timer: u8,
    pub mtu: Mtu,
}

impl Setup {
    /// RC, A from PSN 0x100, a 4.2 ms ACK timeout, 7 retries of each kind
    /// (7 RNR retries: for ever), a 640 us RNR timer, a 1024-byte MTU.
    pub const RC: Setup = Setup {
        qp_type: QpType::Rc,
        a_psn: 0x100,
        timeout: 10,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 12,
        mtu: Mtu::Mtu1024,
    };
}

/// One side: its PD, CQ, QP and region.
#[derive(Debug, Clone, Copy)]
pub struct Side {
    pd: PdHandle,
    cq: CqHandle,
    pub qpn: u32,
    pub mr: MrKeys,
}

/// A scenario being told: the simulation, where its words go, and what
/// went wrong.
pub struct Story<'w> {
    c: Cluster,
    pub side: [Side; 2],
    setup: Setup,
    mechanisms: Mechanisms,
    /// Parts begun (the first is part 1).
    parts: u64,
    out: &'w mut dyn Write,
    /// Trace events already looked at.
    traced: usize,
    /// Completions, per side, in the order they came.
    pub completed: [Vec<Completion>; 2],
    failures: Vec<String>,
    /// Packets sent, per side.
    pub sent: [Vec<Sent>; 2],
    pcap: Vec<u8>,
}

/// A packet as it left, as far as the checks care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    pub opcode: Opcode,
    pub psn: u32,
    pub syndrome: Option<Syndrome>,
    pub lost: bool,
}

const NAMES: [&str; 2] = ["A", "B"];

/// Two NICs on a new simulated network at time `now`, each with a QP, a
/// CQ and a region, the QPs connected as `setup` says, the transport's
/// mechanisms as `mechanisms` says (all on, but in the tests that switch
/// one off to see a scenario fail).
fn build(setup: Setup, now: Time, mechanisms: Mechanisms, part: u64) -> (Cluster, [Side; 2]) {
    // Each part's NICs draw other QP numbers: its QPs are new ones, and a
    // capture of the whole scenario shows new connections, not one
    // connection starting again.
    let mut c = Cluster::new(part, LinkConfig::perfect(DELAY), 2);
    c.now = now;
    for nic in &mut c.nics {
        nic.set_mechanisms(mechanisms);
    }
    c.net.record_trace();
    c.net.record_pcap();
    let side = [0, 1].map(|i| {
        let nic = &mut c.nics[i];
        let pd = nic.alloc_pd();
        let cq = nic.create_cq(256);
        let qpn = nic
            .create_qp(pd, setup.qp_type, cq, cq, QpCaps::default())
            .expect("a QP on a new NIC");
        // A's region holds a pattern to send; B's starts zeroed.
        let fill: Vec<u8> = (0..REGION)
            .map(|k| if i == 0 { (k % 251) as u8 } else { 0 })
            .collect();
        let access = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        let mr = nic
            .reg_mr(pd, IOVA[i], Box::new(fill), access)
            .expect("a region on a new NIC");
        Side { pd, cq, qpn, mr }
    });
    let psn = [setup.a_psn, 0x00_b000];
    for i in 0..2 {
        if setup.qp_type == QpType::Ud {
            let attr = QpAttr {
                qkey: QKEY,
                sq_psn: psn[i],
                ..QpAttr::default()
            };
            c.nics[i]
                .to_rts(now, side[i].qpn, &attr)
                .expect("a new QP goes to RTS");
            continue;
        }
        let attr = QpAttr {
            qp_access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            ah_attr: Some(AddressVector {
                dest: c.nics[1 - i].addr(),
                src: None,
                traffic_class: 0,
                hop_limit: 64,
                flow_label: 0,
            }),
            path_mtu: setup.mtu,
            dest_qp_num: side[1 - i].qpn,
            rq_psn: psn[1 - i],
            max_dest_rd_atomic: 16,
            min_rnr_timer: setup.min_rnr_timer,
            sq_psn: psn[i],
            timeout: setup.timeout,
            retry_cnt: setup.retry_cnt,
            rnr_retry: setup.rnr_retry,
            max_rd_atomic: 16,
            ..QpAttr::default()
        };
        c.nics[i]
            .to_rts(now, side[i].qpn, &attr)
            .expect("a new QP goes to RTS");
    }
    (c, side)
}

impl<'w> Story<'w> {
    fn new(out: &'w mut dyn Write, setup: Setup, mechanisms: Mechanisms) -> Story<'w> {
        let (c, side) = build(setup, Time::ZERO, mechanisms, 1);
        Story {
            c,
            side,
            setup,
            mechanisms,
            parts: 1,
            out,
            traced: 0,
            completed: [Vec::new(), Vec::new()],
            failures: Vec::new(),
            sent: [Vec::new(), Vec::new()],
            pcap: Vec::new(),
        }
    }

    /// Start a new part of the scenario, on new NICs made as `setup` says,
    /// its clock going on from where the last part ended. The capture
    /// keeps the packets of every part, one after the other.
    pub fn part(&mut self, setup: Setup, title: &str) -> io::Result<()> {
        self.keep_capture();
        self.parts += 1;
        let (c, side) = build(setup, self.c.now, self.mechanisms, self.parts);
        self.c = c;
        self.side = side;
        self.setup = setup;
        self.traced = 0;
        self.completed = [Vec::new(), Vec::new()];
        self.sent = [Vec::new(), Vec::new()];
        self.say(title)
    }

    /// Move this network's capture to the scenario's (one pcap header).
    fn keep_capture(&mut self) {
        let mut net = self.c.net.pcap();
        if !self.pcap.is_empty() && net.len() >= PCAP_HEADER {
            net.drain(..PCAP_HEADER);
        }
        self.pcap.extend(net);
    }

    /// Say something.
    pub fn say(&mut self, text: &str) -> io::Result<()> {
        writeln!(self.out)?;
        for line in text.trim_matches('\n').lines() {
            writeln!(self.out, "{line}")?;
        }
        writeln!(self.out)
    }

    /// A's address in B's region at `offset`: where A's requests point.
    pub fn at_b(&self, offset: u64) -> u64 {
        IOVA[1] + offset
    }

    /// A gather list of `len` bytes of side `i`'s region at `offset`.
    pub fn sge(&self, i: usize, offset: u64, len: u32) -> Sge {
        Sge {
            addr: IOVA[i] + offset,
            length: len,
            lkey: self.side[i].mr.lkey,
        }
    }

    /// Side `i` posts `op` (signaled) from or into `sge`.
    pub fn post(&mut self, i: usize, wr_id: u64, op: SendOp, sge: Sge) -> io::Result<()> {
        let now = self.c.now;
        let qpn = self.side[i].qpn;
        let r = self.c.nics[i].post_send(now, qpn, SendWr::new(wr_id, op, sg_list![sge]));
        self.verb(i, "post_send", r)
    }

    /// Side `i` posts a UD SEND of `sge` to the other side's QP.
    pub fn post_ud(&mut self, i: usize, wr_id: u64, sge: Sge) -> io::Result<()> {
        let now = self.c.now;
        let qpn = self.side[i].qpn;
        let to = UdDest {
            dest: self.c.nics[1 - i].addr(),
            src: None,
            qpn: self.side[1 - i].qpn,
            qkey: QKEY,
        };
        let wr = SendWr::new(wr_id, SendOp::send(), sg_list![sge]);
        let r = self.c.nics[i].post_send_ud(now, qpn, wr, to);
        self.verb(i, "post_send", r)
    }

    /// Side `i` posts a receive into `sge`.
    pub fn post_recv(&mut self, i: usize, wr_id: u64, sge: Sge) -> io::Result<()> {
        let now = self.c.now;
        let qpn = self.side[i].qpn;
        let r = self.c.nics[i].post_recv(
            now,
            qpn,
            RecvWr {
                wr_id,
                sg_list: sg_list![sge],
            },
        );
        self.verb(i, "post_recv", r)
    }

    fn verb(
        &mut self,
        i: usize,
        what: &str,
        r: Result<(), rnic_core::VerbError>,
    ) -> io::Result<()> {
        if let Err(e) = r {
            self.fail(format!("{}'s {what} was refused: {e}", NAMES[i]));
        }
        Ok(())
    }

    /// Lose the next `times` packets from side `i` with `opcode` (any,
    /// where `None`) and PSN `psn` (any, where `None`).
    pub fn lose(&mut self, i: usize, opcode: Option<Opcode>, psn: Option<u32>, times: u32) {
        let src = self.c.nics[i].addr();
        self.c.net.drop_rule(DropRule {
            src: Some(src),
            opcode,
            psn: psn.map(Psn::new),
            times,
        });
    }

    /// Side `i`'s QP, as it is now.
    pub fn view(&self, i: usize) -> QpView {
        self.c.nics[i]
            .qp_view(self.side[i].qpn)
            .expect("the scenario's QP exists")
    }

    /// Side `i`'s region: `len` bytes at `offset`.
    pub fn memory(&self, i: usize, offset: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        let s = self.side[i];
        if self.c.nics[i]
            .read_mr(s.pd, s.mr.lkey, IOVA[i] + offset, &mut v)
            .is_err()
        {
            v.clear();
        }
        v
    }

    /// What A's region held at the start, at `offset`.
    pub fn pattern(offset: u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|k| ((offset as usize + k) % 251) as u8)
            .collect()
    }

    /// Note a check that failed.
    pub fn fail(&mut self, what: String) {
        self.failures.push(what);
    }

    /// Check `ok`, noting `what` if it is false.
    pub fn check(&mut self, ok: bool, what: &str) {
        if !ok {
            self.fail(what.to_string());
        }
    }

    /// Run until nothing is left to happen (bounded: a minute of virtual
    /// time, 100,000 events).
    pub fn run(&mut self) -> io::Result<()> {
        let limit = self.c.now + Duration::from_secs(60);
        self.run_until(limit)
    }

    /// Run until nothing is left to happen or the clock would pass `limit`.
    pub fn run_until(&mut self, limit: Time) -> io::Result<()> {
        for _ in 0..100_000 {
            self.transmit()?;
            let Some(t) = self.c.next_event() else {
                return Ok(());
            };
            if t > limit {
                self.c.now = limit;
                return Ok(());
            }
            self.c.now = self.c.now.max(t);
            let now = self.c.now;
            while let Some((_, d)) = self.c.net.pop_due(now) {
                let i = usize::from(d.dst != self.c.nics[0].addr());
                let before = self.view(i);
                self.c.nics[i].handle_datagram(now, &d);
                self.arrived(i, &d, before)?;
            }
            for i in 0..2 {
                if self.c.nics[i].next_deadline().is_some_and(|d| d <= now) {
                    let before = self.view(i);
                    self.c.nics[i].handle_timeout(now);
                    self.timer(i, before)?;
                }
            }
            self.completions()?;
        }
        self.fail("the simulation did not settle".into());
        Ok(())
    }

    /// Run for `d` of virtual time.
    pub fn run_for(&mut self, d: Duration) -> io::Result<()> {
        let limit = self.c.now + d;
        self.run_until(limit)
    }

    fn stamp(&self) -> String {
        format!("{:>9.1} us", self.c.now.as_nanos() as f64 / 1000.0)
    }

    /// Put what the NICs built on the wire, printing each packet and its fate.
    fn transmit(&mut self) -> io::Result<()> {
        for i in 0..2 {
            while let Some(d) = self.c.nics[i].poll_transmit() {
                let now = self.c.now;
                self.c.net.send(now, d.clone());
                let trace = self.c.net.trace();
                let lost = trace[self.traced..]
                    .iter()
                    .any(|e| matches!(e.fate, Fate::Lost | Fate::Partitioned));
                self.traced = trace.len();
                let Ok(p) = IbPacket::new_checked(&d.payload[..]) else {
                    continue;
                };
                self.sent[i].push(Sent {
                    opcode: p.bth().opcode(),
                    psn: p.bth().psn().value(),
                    syndrome: p.aeth().map(|a| Syndrome::from_byte(a.syndrome())),
                    lost,
                });
                let arrow = if i == 0 { "A -> B" } else { "A <- B" };
                let fate = if lost { "   LOST on the wire" } else { "" };
                writeln!(
                    self.out,
                    "{}  {arrow}  {}{fate}",
                    self.stamp(),
                    describe(&p)
                )?;
            }
        }
        Ok(())
    }

    /// Explain an arrival at side `i`, and show the state it left.
    fn arrived(&mut self, i: usize, d: &Datagram, before: QpView) -> io::Result<()> {
        let Ok(p) = IbPacket::new_checked(&d.payload[..]) else {
            return Ok(());
        };
        let after = self.view(i);
        let why = explain(self.setup.qp_type, NAMES[i], &p, &before, &after);
        let text = format!("{} takes it in: {why}", NAMES[i]);
        writeln!(self.out, "{}  {}", self.stamp(), wrap(&text))?;
        self.state(i)
    }

    /// Explain a timer of side `i` going off, if it changed anything.
    fn timer(&mut self, i: usize, before: QpView) -> io::Result<()> {
        let after = self.view(i);
        let who = NAMES[i];
        let why = if before.rnr_wait && !after.rnr_wait {
            format!("{who}'s RNR timer is over: it sends the request again")
        } else if after.state == QpState::Err && before.state != QpState::Err {
            format!(
                "{who}'s ACK timer went off with no retries left: the request fails, and {who}'s QP goes to the error state"
            )
        } else if after.retries_left < before.retries_left {
            format!(
                "{who}'s ACK timer went off: nothing acknowledged PSN {:#08x} in time. {who} sends again from there ({} retries left)",
                before.oldest_unacked.value(),
                after.retries_left
            )
        } else {
            return Ok(());
        };
        writeln!(self.out, "{}  {}", self.stamp(), wrap(&why))?;
        self.state(i)
    }

    /// Side `i`'s transport state: A's as requester, B's as responder.
    fn state(&mut self, i: usize) -> io::Result<()> {
        let v = self.view(i);
        let mut line = if self.setup.qp_type == QpType::Ud {
            format!(
                "{}: {} send(s) outstanding, {} receive(s) posted",
                NAMES[i], v.outstanding, v.receives
            )
        } else if i == 0 {
            let mut req = format!(
                "A: next PSN {:#08x}, oldest unacked {:#08x}, {} WR outstanding, retries {}, RNR retries {}",
                v.next_psn.value(),
                v.oldest_unacked.value(),
                v.outstanding,
                v.retries_left,
                v.rnr_retries_left
            );
            if let Some(c) = v.credits {
                req.push_str(&format!(", credits {c}"));
            }
            if v.rnr_wait {
                req.push_str(", waiting out an RNR NAK");
            }
            req
        } else {
            let mut resp = format!(
                "B: expects PSN {:#08x}, MSN {}, {} receive(s) posted",
                v.expected_psn.value(),
                v.msn,
                v.receives
            );
            if v.rd_atomic > 0 {
                resp.push_str(&format!(", {} READ/atomic held", v.rd_atomic));
            }
            if v.nak_sent {
                resp.push_str(", has NAKed");
            }
            resp
        };
        if v.state != QpState::Rts {
            line.push_str(&format!(", QP in {:?}", v.state));
        }
        writeln!(self.out, "{:>12}    [{line}]", "")
    }

    fn completions(&mut self) -> io::Result<()> {
        for (i, name) in NAMES.iter().enumerate() {
            let cq = self.side[i].cq;
            let got = self.c.nics[i].poll_cq(cq, usize::MAX).unwrap_or_default();
            for c in got {
                writeln!(
                    self.out,
                    "{}  {name}'s CQ: wr {} {} {}{}",
                    self.stamp(),
                    c.wr_id,
                    c.opcode,
                    c.status,
                    if c.byte_len > 0 {
                        format!(", {} bytes", c.byte_len)
                    } else {
                        String::new()
                    }
                )?;
                self.completed[i].push(c);
            }
        }
        Ok(())
    }

    /// Packets side `i` sent that matched `f`.
    pub fn count(&self, i: usize, f: impl Fn(&Sent) -> bool) -> usize {
        self.sent[i].iter().filter(|s| f(s)).count()
    }
}

/// `text` in lines of at most [`WIDTH`] columns after the time stamp,
/// each after the first indented under the first.
fn wrap(text: &str) -> String {
    let indent = format!("\n{:>14}", "");
    let mut out = String::new();
    let mut col = 0;
    for word in text.split(' ') {
        if col > 0 && col + 1 + word.len() > WIDTH {
            out.push_str(&indent);
            col = 0;
        } else if col > 0 {
            out.push(' ');
            col += 1;
        }
        out.push_str(word);
        col += word.len();
    }
    out
}

/// How wide an explanation runs, after its time stamp.
const WIDTH: usize = 86;

/// One line for a packet: opcode, PSN, AckReq, the headers that matter.
fn describe(p: &IbPacket<&[u8]>) -> String {
    let bth = p.bth();
    let mut s = format!("{:<28} PSN {:#08x}", p.info().name, bth.psn().value());
    if bth.ack_req() {
        s.push_str(" AckReq");
    }
    if let Some(r) = p.reth() {
        s.push_str(&format!(" RETH va={:#x} len={}", r.va(), r.dma_length()));
    }
    if let Some(a) = p.atomic_eth() {
        s.push_str(&format!(" AtomicETH add/swap={}", a.swap_or_add_data()));
    }
    if let Some(a) = p.aeth() {
        s.push_str(&format!(
            " AETH {} MSN {}",
            Syndrome::from_byte(a.syndrome()),
            a.msn()
        ));
    }
    if let Some(a) = p.atomic_ack_eth() {
        s.push_str(&format!(" original={}", a.orig_rem_dt()));
    }
    if p.info().has_payload && !p.payload().is_empty() {
        s.push_str(&format!(" {} bytes", p.payload().len()));
    }
    s
}

fn is_read_response(p: &IbPacket<&[u8]>) -> bool {
    p.info().operation == Operation::RdmaReadResponse
}

/// Why side `who` did what it did with `p`, from its state before and after.
fn explain(
    qp_type: QpType,
    who: &str,
    p: &IbPacket<&[u8]>,
    before: &QpView,
    after: &QpView,
) -> String {
    let op = p.bth().opcode();
    let psn = p.bth().psn().value();
    let name = p.info().name;
    if is_read_response(p) || p.aeth().is_some() {
        return explain_response(who, p, before, after);
    }
    // A request, at the responder.
    if qp_type == QpType::Ud {
        return if after.receives < before.receives {
            format!(
                "a datagram: {who} puts it in its next posted receive (the receive's first 40 bytes get the packet's network header), and sends nothing back: UD has no acknowledgements"
            )
        } else {
            format!(
                "a datagram, and no receive posted: {who} drops it. UD has no RNR NAK; the sender never learns"
            )
        };
    }
    if before.state == QpState::Err {
        return format!("{who}'s QP is in the error state: it drops the packet");
    }
    if after.state == QpState::Err {
        return format!(
            "{who} refuses it: the request is not one its QP may carry out (here the R_Key names no region of {who}'s, or the range or the rights do not fit). It writes nothing, answers with a NAK, and moves its own QP to the error state too: for the responder as for the requester this class of error ends the connection (IBTA 9.9.3.1.3)"
        );
    }
    let expected = before.expected_psn.value();
    let off = p.bth().psn().diff(before.expected_psn);
    if off > 0 {
        if qp_type == QpType::Uc {
            return format!(
                "{who} expected PSN {expected:#08x}: the packets before {psn:#08x} were lost. UC has no NAK and no retransmission: {who} drops the message it was in and waits for the next one to begin"
            );
        }
        return if before.nak_sent {
            format!(
                "still not PSN {expected:#08x}: dropped. {who} NAKed the gap once and waits for the retransmission"
            )
        } else {
            format!(
                "{who} expected PSN {expected:#08x}, so {off} packet(s) before this one were lost. {who} drops it and NAKs once (PSN sequence error), naming the PSN it expects"
            )
        };
    }
    if off < 0 {
        return match op {
            Opcode::RC_RDMA_READ_REQUEST => format!(
                "a READ for PSNs {who} has answered already: it reads the memory again and answers from the PSN asked (a READ changes nothing, so doing it twice is safe)"
            ),
            Opcode::RC_FETCH_ADD | Opcode::RC_COMPARE_SWAP => format!(
                "a repeated atomic: doing it again would add twice. {who} answers from the result it saved the first time (what its responder resources are for), without executing it"
            ),
            _ => format!(
                "a duplicate: {who} executed PSN {psn:#08x} already. It does not execute it again, only acknowledges it again"
            ),
        };
    }
    let continues = matches!(
        p.info().position,
        rnic_wire::Position::Middle | rnic_wire::Position::Last
    );
    if continues && !before.in_message {
        return format!(
            "in sequence, but {who} is in no message: the one this packet continues was dropped. {who} drops it too"
        );
    }
    if after.expected_psn == before.expected_psn {
        if name.contains("SEND") && before.receives == 0 {
            return format!(
                "in order, but no receive is posted for the SEND: {who} cannot take it, and answers RNR NAK"
            );
        }
        return format!("{who} did not take it in");
    }
    let what = match op {
        Opcode::RC_RDMA_READ_REQUEST => "a READ: it will answer with the data".to_string(),
        Opcode::RC_FETCH_ADD | Opcode::RC_COMPARE_SWAP => {
            "an atomic: it executes it and saves the result".to_string()
        }
        _ if name.contains("SEND") => {
            format!("{} bytes into the posted receive", p.payload().len())
        }
        _ => format!("{} bytes placed in its memory", p.payload().len()),
    };
    format!("in order (PSN {psn:#08x} expected): {what}")
}

/// Why the requester did what it did with response `p`.
fn explain_response(who: &str, p: &IbPacket<&[u8]>, before: &QpView, after: &QpView) -> String {
    let psn = p.bth().psn().value();
    let syndrome = p.aeth().map(|a| Syndrome::from_byte(a.syndrome()));
    match syndrome {
        Some(Syndrome::Nak(NakCode::PsnSeqError)) => {
            return format!(
                "a NAK: the responder expects PSN {psn:#08x}, so everything before it arrived and everything from it must come again. {who} goes back to PSN {psn:#08x} and resends from there (go-back-N)"
            )
        }
        Some(Syndrome::RnrNak { timer }) => {
            return if after.state == QpState::Err {
                format!(
                    "receiver not ready again, and no RNR retries are left: {who}'s SEND fails with RNR_RETRY_EXC_ERR and its QP goes to the error state"
                )
            } else {
                let left = match after.rnr_retries_left {
                    7 => "RNR retry count 7: it retries for ever".to_string(),
                    n => format!("{n} RNR retries left"),
                };
                format!(
                    "receiver not ready: the responder had no receive posted for the SEND. {who} waits {} us and sends it again ({left})",
                    rnr_timer_micros(timer)
                )
            };
        }
        Some(Syndrome::Nak(NakCode::RemoteAccessError)) => {
            return format!(
                "remote access error: the responder refused the request and wrote nothing. The error is final: {who}'s request fails, its QP goes to the error state, and what was posted behind it is flushed"
            )
        }
        Some(Syndrome::Nak(code)) => return format!("a NAK ({code:?}): the request fails"),
        _ => {}
    }
    if p.bth().psn().diff(before.oldest_unacked) < 0 {
        return format!(
            "a response for PSN {psn:#08x}, which {who} has had answered already: nothing to do"
        );
    }
    if is_read_response(p) {
        return if after.oldest_unacked == before.oldest_unacked {
            format!(
                "READ data for PSN {psn:#08x}, but {who} still waits for PSN {:#08x}: that one may only be late (a network may reorder), so {who} drops this one and waits. If the missing response never comes, the ACK timer will say so",
                before.oldest_unacked.value()
            )
        } else {
            format!("READ data for PSN {psn:#08x}: {who} places it in its own memory")
        };
    }
    if let Some(a) = p.atomic_ack_eth() {
        return format!(
            "the atomic's answer: {}, what the responder's memory held before the atomic. {who} writes it into its own memory",
            a.orig_rem_dt()
        );
    }
    let credits = match syndrome {
        Some(Syndrome::Ack { credits }) => match rnic_wire::aeth::decode_credits(credits) {
            Some(n) => {
                format!(", and the responder says it has {n} receive(s) posted (its credits)")
            }
            None => String::new(),
        },
        _ => String::new(),
    };
    format!("an ACK of every PSN up to {psn:#08x}: {who} completes the requests it covers{credits}")
}

/// `rnic demo --list`.
pub fn list(out: &mut impl Write) -> io::Result<()> {
    for s in SCENARIOS {
        writeln!(out, "{:<10} {}", s.name, s.about)?;
    }
    Ok(())
}

/// Run scenario `name`: whether every check held. Writes the packets to
/// `pcap` if given, and their ladder diagram (SVG or HTML) to `ladder`.
pub fn run(
    name: &str,
    pcap: Option<&Path>,
    ladder: Option<&Path>,
    out: &mut dyn Write,
) -> io::Result<bool> {
    let Some(s) = SCENARIOS.iter().find(|s| s.name == name) else {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no scenario {name:?} (rnic demo --list shows them)"),
        ));
    };
    let (ok, capture) = tell(s, out)?;
    if let Some(p) = pcap {
        std::fs::write(p, &capture)?;
        writeln!(
            out,
            "capture written to {} (rnic dump {})",
            p.display(),
            p.display()
        )?;
    }
    if let Some(l) = ladder {
        let title = format!("rnic demo --scenario {name}");
        crate::ladder::write(&capture[..], &title, &crate::ladder::Options::default(), l)?;
        writeln!(out, "ladder diagram written to {}", l.display())?;
    }
    Ok(ok)
}

/// Tell scenario `s` to `out`: whether its checks held, and its capture.
pub fn tell(s: &Scenario, out: &mut dyn Write) -> io::Result<(bool, Vec<u8>)> {
    tell_with(s, out, Mechanisms::default())
}

/// [`tell`], the NICs' transport mechanisms as `mechanisms` says.
fn tell_with(
    s: &Scenario,
    out: &mut dyn Write,
    mechanisms: Mechanisms,
) -> io::Result<(bool, Vec<u8>)> {
    writeln!(out, "Scenario {}: {}", s.name, s.about)?;
    let mut story = Story::new(out, s.setup, mechanisms);
    (s.run)(&mut story)?;
    story.keep_capture();
    let failures = std::mem::take(&mut story.failures);
    let capture = std::mem::take(&mut story.pcap);
    let out = story.out;
    if failures.is_empty() {
        writeln!(
            out,
            "\nChecked: the packets, memory and completions are as told."
        )?;
    } else {
        writeln!(out, "\nFAILED: the engine did not do what this story says:")?;
        for f in &failures {
            writeln!(out, "  - {f}")?;
        }
    }
    Ok((failures.is_empty(), capture))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(name: &str, m: Mechanisms) -> (bool, String) {
        let s = SCENARIOS.iter().find(|s| s.name == name).unwrap();
        let mut out = Vec::new();
        let (ok, _) = tell_with(s, &mut out, m).unwrap();
        (ok, String::from_utf8(out).unwrap())
    }

    /// A scenario fails loudly when the engine stops doing what it tells:
    /// here with the mechanism it explains switched off.
    #[test]
    fn a_scenario_fails_when_the_engine_stops_doing_what_it_tells() {
        let no_replay = Mechanisms {
            atomic_replay_cache: false,
            ..Mechanisms::default()
        };
        let (ok, text) = outcome("read", no_replay);
        assert!(!ok, "{text}");
        assert!(
            text.contains("B's counter is 5: the atomic ran once"),
            "{text}"
        );
        let no_duplicates = Mechanisms {
            duplicate_detection: false,
            ..Mechanisms::default()
        };
        let (ok, text) = outcome("loss", no_duplicates);
        assert!(!ok, "{text}");
        assert!(text.contains("B counts one message, not two"), "{text}");
        for s in SCENARIOS {
            let (ok, text) = outcome(s.name, Mechanisms::default());
            assert!(ok, "{text}");
        }
    }
}
