//! The engine: the `Nic` and its UDP sockets behind one lock. A verb runs on
//! the application's own thread: it takes the lock, calls rnic-core, sends
//! what that produced and hands out completions, so posting a request costs
//! no thread switch. The engine thread does the rest: it sleeps in poll(2)
//! until a datagram arrives or a timer is due, then takes the lock and runs
//! it through rnic-core. Completions reach the application through lock-free
//! queues.
//!
//! What the ICRC check covers on this path: a UDP socket cannot see the IP
//! header, so the ICRC of a received packet is verified under the convention
//! of `rnic_wire::icrc::for_udp`: IPv4 identification 0 and DF set (IPv6: no
//! convention needed, every variant field is masked). rnic's own sockets send
//! exactly that (`IP_PMTUDISC_DO` on an unconnected socket), so rnic-to-rnic
//! traffic verifies end to end, the IPv4 identification included; segment i
//! of a UDP GSO send carries identification i, and its ICRC is made for it
//! (see [`segment`]; a receiver accepts 0 to 63). A peer that
//! puts its own IDs in IPv4 (rdma_rxe does) fails this check: talking to such
//! a peer needs the frame transport (`frames`), which reads the whole IP
//! header.

use rustc_hash::FxHashMap as HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use parking_lot::Mutex;
use rnic_core::cq::CqHandle;
use rnic_core::time::Time;
use rnic_core::Datagram;
use rnic_core::Nic;
use rnic_wire::encap::LinkType;
use rnic_wire::icrc::IdDeltas;
use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};
use rustix::net::sockopt::{
    set_ip_mtu_discover, set_socket_recv_buffer_size, set_socket_recv_buffer_size_force,
    set_socket_send_buffer_size, set_socket_send_buffer_size_force, Ipv4PathMtuDiscovery,
};

use crate::sched::Idle;
use crate::watch::Watch;

/// Socket buffer size asked for, each way.
const SOCKET_BUFFER: usize = 4 << 20;

/// Bursts of packets one pump has the NIC build at most
/// ([`Nic::generate_burst`]: a QP's READ responses and requests).
const PUMP_BURSTS: usize = 4;

/// A packet seen by the engine, for taps (the demo, captures).
#[derive(Debug, Clone)]
pub struct TapEvent {
    /// Sent (true) or received.
    pub sent: bool,
    /// When, since the engine started.
    pub at: Duration,
    /// The datagram.
    pub datagram: Datagram,
}

/// Where a completion queue's completions go.
pub(crate) struct CqSink {
    pub delivered: Arc<crate::delivered::Delivered>,
    pub notify: Option<crate::channel::Notify>,
}

/// What the engine's lock guards.
pub(crate) struct EngineState {
    pub nic: Nic,
    pub start: Instant,
    pub cqs: HashMap<CqHandle, CqSink>,
    /// CQs their owner let go of while queue pairs still completed into
    /// them: destroyed with the last such queue pair.
    released_cqs: Vec<CqHandle>,
    /// The CQs [`EngineState::deliver`] looks at, reused.
    pending_cqs: Vec<CqHandle>,
    pub tap: Option<Sender<TapEvent>>,
    /// Where asynchronous events go, and a descriptor to make readable.
    pub events: Option<(
        Sender<rnic_core::srq::AsyncEvent>,
        Option<Arc<crate::channel::Bell>>,
    )>,
    pub capture: Option<crate::capture::Capture>,
    /// A tracing span per queue pair: received packets and the verbs on a
    /// QP run inside it.
    pub qp_spans: HashMap<u32, tracing::Span>,
    /// Sockets that send from an address and UDP source port: a queue
    /// pair's own port, and port 4791 of each address but the NIC's own
    /// (the socket on the NIC's own address and 4791 receives everything
    /// on the UDP transport and sends the rest).
    pub send_sockets: HashMap<(IpAddr, u16), UdpSocket>,
    /// The interface index a link-local IPv6 address is scoped to (0
    /// without the frame transport).
    scope: u32,
    /// The device's span: queue pairs' spans are its children, whichever
    /// thread runs them.
    pub span: tracing::Span,
    /// Datagrams waiting to be sent, reused.
    tx: Vec<Datagram>,
    /// The impairment of this NIC's egress, if any (`impair`).
    pub impair: Option<crate::impair::Impairer>,
    /// Receive buffers, used by whichever thread holds the lock: receiving
    /// and handling a batch is one step, so datagrams are handled in the
    /// order they arrived.
    rx: crate::udp::RecvBatch,
    /// Whether runs of datagrams go out as UDP GSO sends (see [`segment`]).
    pub gso: bool,
    /// Datagrams per message of the run being sent, reused.
    groups: Vec<usize>,
    /// The ICRC deltas for the last segment length sent.
    gso_deltas: Option<IdDeltas>,
    /// Since when datagrams a post, or a poll that took in a completion,
    /// produced wait for the next poll (see [`Engine::post`] and
    /// [`Engine::progress`]), or ACKs for the program's answer.
    held_since: Option<Time>,
    /// What is held is plain ACKs alone, waiting for the program's answer
    /// (see [`EngineState::hold_for_answer`]).
    held_for_answer: bool,
    /// How well the program answers the requests it takes in (0 to
    /// [`ANSWER_SCORE`]): up by one for each post that sends after a
    /// batch left ACKs to send and before the program polled an empty
    /// queue since (what a ping-pong does: it answers what it was handed,
    /// on any CPU, however fast), down by one for a later one that took held
    /// ACKs along, to 0 when held ACKs waited in vain. ACKs wait for an
    /// answer while it is above 0.
    answers: u8,
    /// Polls that found nothing to take in and nothing to send, ever.
    empty_polls: u64,
    /// The last poll (`Engine::progress`) took nothing in: the next asks
    /// for one message.
    polled_dry: bool,
    /// `empty_polls` when a batch taken in last left ACKs to send, until
    /// a post counted it.
    acked_after: Option<u64>,
    /// When that batch was taken in.
    acked_at: Time,
    /// How long the program takes to answer (ns): a moving average of
    /// the time from a batch that left ACKs to the post that answered it.
    answer_time: u64,
    /// The shortest wait for an answer: [`ANSWER_WAIT`], or another in a
    /// test (see [`EngineState::answer_wait`]).
    answer_wait: u64,
}

/// The longest ACKs wait for the program's answer (ns): a ping-pong's
/// answer held up by the scheduler still takes them along, and a program
/// that stops answering delays one ACK by this much, no more than the
/// engine thread's first time away delays what its posts left for its
/// next poll (`watch::AWAY_MAX`). A
/// requester's ACK timeout is milliseconds (4.096 us x 2^timeout, 14 to
/// 19 being the usual settings).
pub const ANSWER_WAIT: u64 = crate::watch::AWAY_MAX;
/// How many times its usual answer time ACKs wait for a program's answer
/// (if that is longer than [`ANSWER_WAIT`]).
const ANSWER_SLACK: u64 = 16;
/// The longest ACKs wait for an answer however slow the program (ns):
/// well inside the usual requesters' ACK timeouts (67 ms and up).
pub const ANSWER_WAIT_MAX: u64 = 8_000_000;
/// The most [`EngineState::answers`] counts up to: a program that has
/// answered quickly for a while keeps its ACKs waiting through a few slow
/// answers.
const ANSWER_SCORE: u8 = 8;

impl EngineState {
    /// Destroy CQ `h` and its delivery (`ibv_destroy_cq`); refused while
    /// queue pairs complete into it.
    pub fn destroy_cq(&mut self, h: CqHandle) -> Result<(), rnic_core::VerbError> {
        self.nic.destroy_cq(h)?;
        self.cqs.remove(&h);
        Ok(())
    }

    /// CQ `h`'s owner is done with it: destroy it now, or with the last
    /// queue pair that completes into it.
    pub fn release_cq(&mut self, h: CqHandle) {
        if let Err(rnic_core::VerbError::CqBusy(_)) = self.destroy_cq(h) {
            self.released_cqs.push(h);
        }
    }

    /// Destroy QP `qpn` (`ibv_destroy_qp`) with its completions not yet
    /// polled, and the CQs released while it used them.
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), rnic_core::VerbError> {
        self.qp_spans.remove(&qpn);
        let cqs = self.nic.qp_cqs(qpn);
        self.nic.destroy_qp(qpn)?;
        self.remove_delivered(qpn, cqs);
        let mut released = std::mem::take(&mut self.released_cqs);
        released.retain(|&h| matches!(self.destroy_cq(h), Err(rnic_core::VerbError::CqBusy(_))));
        self.released_cqs = released;
        Ok(())
    }

    /// The span of QP `qpn` (disabled if it has none, or tracing is off).
    pub fn qp_span(&self, qpn: u32) -> tracing::Span {
        self.qp_spans
            .get(&qpn)
            .cloned()
            .unwrap_or_else(tracing::Span::none)
    }

    /// A UDP source port for a queue pair: `preferred` (rdma_rxe's hash of
    /// the two QP numbers, in 0xC000-0xFFFF) or the next free one after it,
    /// with a socket bound there to send from. Queue pairs whose ports
    /// coincide share the socket. `None` if none of 64 ports could be bound.
    pub fn source_port(&mut self, addr: IpAddr, preferred: u16) -> Option<u16> {
        let scope = self.scope_of(addr);
        for i in 0..64u16 {
            let port = 0xC000 | (preferred.wrapping_add(i) & 0x3FFF);
            if self.send_sockets.contains_key(&(addr, port)) {
                return Some(port);
            }
            if let Ok(s) = open_socket(addr, port, scope) {
                self.send_sockets.insert((addr, port), s);
                return Some(port);
            }
        }
        None
    }

    /// Give RC or UC QP `qpn` the UDP source port rdma_rxe would, for flow
    /// entropy (ECMP spreads connections by it): from its address vector's
    /// flow label if it has one, else from both QP numbers, as the kernel's
    /// `rdma_get_udp_sport`; sent from a socket of its own (see
    /// [`EngineState::source_port`]). 4791 if no port could be bound, or
    /// the QP has no address vector yet. Returns the port.
    pub fn give_source_port(&mut self, qpn: u32) -> Result<u16, rnic_core::VerbError> {
        let attr = self.nic.query_qp(qpn)?;
        let Some(av) = attr.ah_attr else {
            return Ok(ROCE_PORT);
        };
        let preferred = if av.flow_label != 0 {
            rnic_wire::encap::udp::flow_label_src_port(av.flow_label)
        } else {
            rnic_wire::encap::udp::rxe_src_port(qpn, attr.dest_qp_num)
        };
        match av.src.and_then(|src| self.source_port(src, preferred)) {
            Some(p) => self.nic.set_qp_source_port(qpn, p).map(|()| p),
            None => Ok(ROCE_PORT),
        }
    }

    /// The scope a socket address needs for `addr`: the interface's index
    /// for a link-local IPv6 address on the frame transport, else 0.
    fn scope_of(&self, addr: IpAddr) -> u32 {
        if crate::frames::link_local(addr) {
            self.scope
        } else {
            0
        }
    }

    /// After anything that may have produced packets, completions or events:
    /// send the packets, deliver the rest.
    ///
    /// What the NIC builds is paced: a pump has it build at most
    /// [`PUMP_BURSTS`] bursts of READ responses and requests, and the
    /// engine comes back for the rest after taking in what arrived (the
    /// engine thread, or while it leaves the socket to polling threads,
    /// their next poll), so a READ of 64 MiB does not hold up the ACKs and
    /// requests of every other connection while it is answered.
    fn pump(&mut self, socket: &UdpSocket) {
        let now = self.now();
        if self.held_for_answer && self.held_due().is_some_and(|t| t <= now) {
            // No answer came: the next ACKs leave at once.
            self.answers = 0;
            tracing::debug!("ACKs waited for an answer in vain: they leave at once from now on");
        }
        self.held_since = None;
        self.held_for_answer = false;
        let mut bursts = 0;
        loop {
            let mut tx = std::mem::take(&mut self.tx);
            tx.clear();
            while tx.len() < crate::udp::BATCH {
                match self.nic.poll_built() {
                    Some(d) => tx.push(d),
                    None if bursts < PUMP_BURSTS && self.nic.generate_burst() => bursts += 1,
                    None => break,
                }
            }
            acks_last(&mut tx);
            if let Some(imp) = &mut self.impair {
                // What was held and is due leaves first, then what the NIC
                // sent now, as the impairment decides.
                let mut out = Vec::with_capacity(tx.len());
                let mut spent = Vec::new();
                imp.release(now, &mut out);
                for d in tx.drain(..) {
                    imp.offer(now, d, &mut out, &mut spent);
                }
                for b in spent {
                    self.nic.recycle(b);
                }
                tx = out;
            }
            if tx.is_empty() {
                self.tx = tx;
                break;
            }
            // Each run of datagrams from one address and source port goes
            // out of the socket bound to them (the ICRC covers both).
            let own = self.nic.addr();
            let mut at = 0;
            while let Some(first) = tx.get(at) {
                let source = (first.src, first.src_port);
                let run = tx[at..]
                    .iter()
                    .take_while(|d| (d.src, d.src_port) == source)
                    .count();
                if self.gso {
                    segment(
                        &mut tx[at..at + run],
                        &mut self.groups,
                        &mut self.gso_deltas,
                    );
                }
                // As they leave: with the ICRC each segment carries.
                for d in &tx[at..at + run] {
                    self.observe(true, now, d);
                }
                let rest = &tx[at..];
                at += run;
                let from = self
                    .send_sockets
                    .get(&source)
                    .or((source.0 == own).then_some(socket));
                // Datagrams the socket buffer refused are lost, as on a
                // full link (and there is a socket for every address and
                // port the NIC sends from).
                if let Some(from) = from {
                    if self.gso {
                        let refused = crate::udp::send_groups(from.as_fd(), &self.groups, |j| {
                            let to = rest[j].dst;
                            (to_socket_addr(to, self.scope_of(to)), &rest[j].payload[..])
                        })
                        .is_ok_and(|s| s.gso_refused);
                        if refused {
                            tracing::info!("the kernel refused a UDP GSO send: one datagram per message from now on");
                            self.gso = false;
                        }
                    } else {
                        let _ = crate::udp::send(from.as_fd(), run, |j| {
                            let to = rest[j].dst;
                            (to_socket_addr(to, self.scope_of(to)), &rest[j].payload[..])
                        });
                    }
                }
            }
            for d in tx.drain(..) {
                self.nic.recycle(d.payload);
            }
            self.tx = tx;
        }
        self.deliver();
    }

    /// Hand completions to their queues and events to their channel;
    /// how many completions went.
    fn deliver(&mut self) -> usize {
        let mut total = 0;
        // Only the CQs a completion went to since the last time: none, most
        // times this is called (a batch of ACKs, a post), and never every
        // CQ of the NIC.
        let mut pending = std::mem::take(&mut self.pending_cqs);
        self.nic.take_pending_cqs(&mut pending);
        for h in pending.drain(..) {
            let Some(sink) = self.cqs.get(&h) else {
                continue;
            };
            // The program's unpolled completions count against the depth.
            let delivered = sink
                .delivered
                .deliver(|unpolled, put| self.nic.deliver_cq(h, unpolled, put));
            if let Ok(n) = delivered {
                total += n;
            }
            if let (Ok(1..), Some(n)) = (delivered, &sink.notify) {
                n.completed(h);
            }
        }
        self.pending_cqs = pending;
        while let Some(e) = self.nic.poll_async_event() {
            if let Some((tx, signal)) = &self.events {
                let _ = tx.send(e);
                if let Some(s) = signal {
                    s.ring();
                }
            }
        }
        total
    }

    /// Receive one batch from `rx` and run each packet through the NIC in
    /// arrival order, straight from the receive buffer. Then deliver
    /// completions and send what that produced (from `socket` and the other
    /// UDP sockets), or hold it: if it is ACKs alone, the program polls or
    /// posts (`program_active`) and answers requests, for its next post
    /// (see [`EngineState::hold_for_answer`]); else, with `may_hold` (a
    /// poller's call while the engine thread is away) when it delivered a
    /// completion, for the poller's next call (see [`Engine::progress`]).
    fn receive(
        &mut self,
        rx: Rx<'_>,
        socket: &UdpSocket,
        may_hold: bool,
        program_active: bool,
    ) -> Received {
        self.receive_at_most(rx, socket, may_hold, program_active, crate::udp::BATCH)
    }

    /// [`EngineState::receive`], of at most `most` messages (see
    /// [`crate::udp::RecvBatch::recv_at_most`]).
    fn receive_at_most(
        &mut self,
        rx: Rx<'_>,
        socket: &UdpSocket,
        may_hold: bool,
        program_active: bool,
        most: usize,
    ) -> Received {
        // ICMP errors from earlier sends (port unreachable) surface here as
        // errors: nothing to receive this round.
        let n = self.rx.recv_at_most(rx.fd(), most).unwrap_or_default();
        let mut got = Received {
            packets: 0,
            unpolled: 0,
        };
        if n == 0 {
            return got;
        }
        let dst = self.nic.addr();
        let now = self.now();
        for i in 0..n {
            // The IB packets (BTH onwards; more than one where GRO joined
            // datagrams), and where they came from.
            let (packets, source) = match rx {
                Rx::Udp(_) => match self.rx.get(i) {
                    Some((p, from)) => (p, Source::Udp(from)),
                    None => {
                        got.packets += 1;
                        self.nic.count_malformed();
                        continue;
                    }
                },
                Rx::Frames(_) => match self.rx.frame(i) {
                    Some(f) => {
                        let p = crate::frames::ib_packet(f);
                        if p.is_empty() {
                            // Not RoCE: the NIC says what it is, and counts it.
                            got.packets += 1;
                            self.nic.handle_frame(now, LinkType::RawIp, f);
                            continue;
                        }
                        (p.chunks(p.len()), Source::Frame(f))
                    }
                    None => {
                        got.packets += 1;
                        self.nic.count_malformed();
                        continue;
                    }
                },
            };
            for payload in packets {
                got.packets += 1;
                // What the NIC read of the packet, and the addresses it
                // carried (a frame's own).
                let (header, addrs) = match source {
                    Source::Udp(from) => (
                        self.nic
                            .handle_udp(now, from.ip(), dst, from.port(), payload),
                        Some((from.ip(), dst, from.port())),
                    ),
                    Source::Frame(frame) => {
                        match self.nic.handle_frame(now, LinkType::RawIp, frame) {
                            Some(a) => (Some(a.header), Some((a.src, a.dst, a.src_port))),
                            None => (None, None),
                        }
                    }
                };
                if header.is_some_and(|h| h.ends_without_responder_completion()) {
                    got.unpolled += 1;
                }
                if let Some((src, dst, src_port)) = addrs.filter(|_| self.observed()) {
                    let span = match header {
                        Some(h) if !self.qp_spans.is_empty() => self.qp_span(h.dest_qp),
                        _ => tracing::Span::none(),
                    };
                    let _in_qp = span.enter();
                    let d = Datagram {
                        src,
                        dst,
                        src_port,
                        payload: payload.to_vec(),
                        header,
                    };
                    self.observe(false, now, &d);
                }
            }
        }
        let acks = self.only_acks_queued();
        if acks {
            self.acked_after = Some(self.empty_polls);
            self.acked_at = now;
        }
        if acks && program_active && self.answers > 0 {
            self.deliver();
            self.hold_for_answer();
        } else if may_hold && self.may_hold() && self.deliver() > 0 {
            self.hold();
        } else {
            self.pump(socket);
        }
        got
    }

    /// Whether what the NIC has queued is plain ACKs alone, few enough to
    /// hold (see [`EngineState::may_hold`]).
    fn only_acks_queued(&self) -> bool {
        self.may_hold()
            && self.nic.queued_datagrams() != Some(0)
            && self.nic.queued().all(Datagram::is_plain_ack)
    }

    /// Hold the queued ACKs for the program's answer: its next post that
    /// sends something sends them behind it, in one system call; a poll
    /// does not, and they leave on their own `answer_wait` after they
    /// were held (and the engine unlearns that the program answers).
    ///
    /// Why: a program that spins on memory for the peer's WRITE (a
    /// ping-pong such as ib_write_lat) polls its completion queue only
    /// for its own WRITE's ACK. Sent at once, the ACK of the peer's
    /// request arrives alone, the peer stops polling, and its next
    /// request lands in a socket nobody polls: an engine thread must wake
    /// for it, on each side, every round trip. Behind the answer, it
    /// arrives with the next request, which the peer's poll for that ACK
    /// takes in: a round trip runs on the two polling threads alone.
    /// TCP's delayed ACK does the same, for the same reason. Nothing is
    /// lost: the requester's ACK timeout is milliseconds, and a later ACK
    /// carries what an earlier one did.
    fn hold_for_answer(&mut self) {
        if self.held_since.is_none() {
            self.held_since = Some(self.now());
            self.held_for_answer = true;
        }
    }

    /// A post that sends something came: score it, by whether the
    /// program polled an empty queue since the last batch that left ACKs
    /// to send (see `answers`).
    fn posted(&mut self) {
        let Some(acked) = self.acked_after.take() else {
            return;
        };
        let was = self.answers;
        if acked == self.empty_polls {
            self.answers = (self.answers + 1).min(ANSWER_SCORE);
            // One answer held up (the program descheduled, or busy with
            // something else) moves the average by an eighth of at most
            // what the longest wait allows for.
            let took = self
                .now()
                .0
                .saturating_sub(self.acked_at.0)
                .min(ANSWER_WAIT_MAX / ANSWER_SLACK);
            self.answer_time = if self.answer_time == 0 {
                took
            } else {
                (self.answer_time * 7 + took) / 8
            };
        } else if self.held_for_answer {
            self.answers = self.answers.saturating_sub(1);
        }
        if was == 0 && self.answers > 0 {
            tracing::debug!("the program answers requests: their ACKs wait for the answer");
        }
    }

    /// When what is held is due: at once, or, for ACKs held for an
    /// answer, [`EngineState::answer_wait`] after they were held.
    fn held_due(&self) -> Option<Time> {
        let t = self.held_since?;
        Some(if self.held_for_answer {
            Time(t.0.saturating_add(self.answer_wait()))
        } else {
            t
        })
    }

    /// How long ACKs wait for an answer: [`ANSWER_WAIT`], or
    /// [`ANSWER_SLACK`] times as long as the program takes to answer, up
    /// to [`ANSWER_WAIT_MAX`]. A CPU fifty times slower (an emulated one)
    /// is held up fifty times as long: inside the rxe VM a ping-pong's
    /// answers take 150-400 us, and a fixed millisecond expired every few
    /// hundred round trips; each time the ACK left alone, the peer stopped
    /// polling before the answer came, and its engine thread had to come
    /// back for it.
    fn answer_wait(&self) -> u64 {
        self.answer_wait.max(
            self.answer_time
                .saturating_mul(ANSWER_SLACK)
                .min(ANSWER_WAIT_MAX),
        )
    }

    /// Whether what the NIC has queued may wait for a poller's next call
    /// (the engine thread has left the socket to pollers: `away`): a few
    /// datagrams, with nothing left to build and no impairment to time.
    fn may_hold(&self) -> bool {
        self.impair.is_none()
            && self
                .nic
                .queued_datagrams()
                .is_some_and(|n| n < crate::udp::BATCH)
    }

    /// Leave what the NIC has queued for the next poll (the caller
    /// delivers the completions).
    fn hold(&mut self) {
        if self.held_since.is_none() && self.nic.queued_datagrams() != Some(0) {
            self.held_since = Some(self.now());
        }
        self.held_for_answer &= self.only_acks_queued();
    }

    /// Run the timers that are due, then send what they produced; whether
    /// any was.
    fn run_due_timers(&mut self, socket: &UdpSocket) -> bool {
        let now = self.now();
        if self.next_deadline().is_none_or(|d| d > now) {
            return false;
        }
        self.nic.handle_timeout(now);
        self.pump(socket);
        true
    }

    /// When the engine must next run: a NIC timer, or a held datagram's
    /// release.
    pub fn next_deadline(&self) -> Option<Time> {
        // Datagrams posts held back are due at once, whenever the engine
        // thread looks; ACKs held for an answer at the end of the wait.
        [self.timer_deadline(), self.held_due()]
            .into_iter()
            .flatten()
            .min()
    }

    /// [`EngineState::next_deadline`] but for what posts held back: the
    /// deadlines worth waking the engine thread for while it watches the
    /// socket.
    fn timer_deadline(&self) -> Option<Time> {
        // What a pump left for the NIC to build (see `pump`): already due.
        let paced = self.nic.more_to_build().then_some(Time(0));
        [self.wake_deadline(), paced].into_iter().flatten().min()
    }

    /// The deadlines worth waking the engine thread for while it leaves the
    /// socket to polling threads: the NIC's timers and the release of
    /// datagrams an impairment holds. Not what posts held back, nor what
    /// a pump left the NIC to build: the pollers' next poll sends those
    /// (`Engine::progress`), as it takes in what arrives, and the engine
    /// thread does when it next looks. Woken for what is left to build,
    /// it took the lock from the poller for a pump, went back to sleep
    /// with more left, and was woken again: with 1,000 QPs streaming
    /// (`rnic perf write -q 1000 -t 2`), a hundred thousand times a second.
    fn wake_deadline(&self) -> Option<Time> {
        let held = self.impair.as_ref().and_then(|i| i.next_release());
        [self.nic.next_deadline(), held].into_iter().flatten().min()
    }

    /// When the engine thread, away from the socket, looks next after
    /// running what was due: at the first timer, and at the latest at
    /// `bound`. Not at once for what is still to be built while threads
    /// poll or post (`pollers_about`): they build it (see
    /// [`EngineState::wake_deadline`]). With none about, nobody else
    /// will: at once, as when it watches the socket (sleeping to its
    /// bound between pumps, its time away growing with each look, it
    /// built a 1 MiB WRITE posted with no poll after it a pump per look,
    /// and with a test's 50 ms time away past the 67 ms ACK timeout).
    fn away_until(&self, bound: u64, pollers_about: bool) -> u64 {
        if !pollers_about && self.nic.more_to_build() {
            return 0;
        }
        self.wake_deadline().map_or(u64::MAX, |d| d.0).min(bound)
    }

    /// Take QP `qpn`'s completions handed to the program and not yet polled
    /// out of its CQs `cqs` (send, receive): what the NIC does with its own
    /// queues when the QP is reset or destroyed.
    pub fn remove_delivered(&self, qpn: u32, cqs: Option<(CqHandle, CqHandle)>) {
        let Some((s, r)) = cqs else { return };
        for sink in [s, r].iter().filter_map(|h| self.cqs.get(h)) {
            sink.delivered.remove_qp(qpn);
        }
    }

    /// Whether packets are shown anywhere (a tap, a capture, the trace log).
    fn observed(&self) -> bool {
        self.tap.is_some() || self.capture.is_some() || tracing::enabled!(tracing::Level::TRACE)
    }

    pub fn now(&self) -> Time {
        Time(u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// Show a packet sent or received to the tap, the capture file and the
    /// trace log, if any.
    fn observe(&self, sent: bool, now: Time, d: &Datagram) {
        if tracing::enabled!(tracing::Level::TRACE) {
            let dir = if sent { "tx" } else { "rx" };
            match d.header {
                Some(h) => tracing::trace!(
                    dir,
                    src = %d.src,
                    dst = %d.dst,
                    opcode = h.name(),
                    dest_qp = format_args!("{:#x}", h.dest_qp),
                    psn = h.psn.value(),
                    bytes = d.payload.len(),
                    "packet"
                ),
                None => tracing::trace!(dir, src = %d.src, "unparsable packet"),
            }
        }
        if let Some(tap) = &self.tap {
            let _ = tap.send(TapEvent {
                sent,
                at: now - Time::ZERO,
                datagram: d.clone(),
            });
        }
        if let Some(c) = &self.capture {
            c.record(sent, d);
        }
    }
}

/// Where the engine receives: the UDP socket on port 4791, or a frame
/// socket on an interface (see `frames`).
#[derive(Debug, Clone, Copy)]
enum Rx<'a> {
    Udp(&'a UdpSocket),
    Frames(BorrowedFd<'a>),
}

impl<'a> Rx<'a> {
    fn fd(self) -> BorrowedFd<'a> {
        match self {
            Rx::Udp(s) => s.as_fd(),
            Rx::Frames(f) => f,
        }
    }
}

/// Where one received packet came from.
#[derive(Debug, Clone, Copy)]
enum Source<'a> {
    /// A UDP socket: the sender's address and port.
    Udp(SocketAddr),
    /// A frame socket: the whole IP packet.
    Frame(&'a [u8]),
}

/// The engines this process started (with its process ID then), for
/// [`flush_at_exit`].
static LIVE: Mutex<Vec<(u32, Weak<Shared>)>> = Mutex::new(Vec::new());

/// How long [`flush_at_exit`] waits for a lock another thread holds.
const EXIT_WAIT: Duration = Duration::from_millis(100);

/// Count `sh` among this process's engines, and have the process send what
/// they hold when it exits.
#[allow(unsafe_code)]
fn register(sh: &Arc<Shared>) {
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    let mut live = LIVE.lock();
    live.retain(|(_, w)| w.strong_count() > 0);
    live.push((std::process::id(), Arc::downgrade(sh)));
    drop(live);
    AT_EXIT.call_once(|| {
        extern "C" fn at_exit() {
            flush_at_exit();
        }
        // SAFETY: `at_exit` is a plain function that neither unwinds (a
        // panic in it aborts) nor calls `exit`.
        if unsafe { libc::atexit(at_exit) } != 0 {
            tracing::warn!("atexit refused: ACKs held at exit will not be sent");
        }
    });
}

/// At exit (`exit(3)`, or `main` returning): send what every engine of
/// this process holds, ACKs held for the program's answer above all.
///
/// A hardware NIC acknowledges what it took in whatever its program does
/// next; rnic holds the ACK of a request for the program's answer (see
/// [`EngineState::hold_for_answer`]), and a program that takes the last
/// request of a ping-pong in and exits without destroying its QP (as many
/// do: the kernel cleans up after them) would leave it unacknowledged: the
/// peer retransmits to a NIC that is gone and fails the request with
/// `IBV_WC_RETRY_EXC_ERR`. The engine threads are still running here, but
/// their next look may come after the process is gone. An engine of the
/// parent process (a forked child's copy) is left alone: its ACKs are the
/// parent's to send.
pub fn flush_at_exit() {
    let pid = std::process::id();
    let Some(live) = LIVE.try_lock_for(EXIT_WAIT) else {
        return;
    };
    let engines: Vec<Arc<Shared>> = live
        .iter()
        .filter(|(p, _)| *p == pid)
        .filter_map(|(_, w)| w.upgrade())
        .collect();
    drop(live);
    for sh in engines {
        sh.flush();
    }
}

/// What one [`EngineState::receive`] took in.
#[derive(Debug, Clone, Copy)]
struct Received {
    /// Packets (0: none was waiting).
    packets: usize,
    /// Of those, requests that end without a completion here (a WRITE's
    /// last packet, a READ or atomic request): no thread polling a
    /// completion queue waits for them.
    unpolled: usize,
}

/// What the engine thread and the application's threads share.
struct Shared {
    state: Mutex<EngineState>,
    /// The socket on 4791: it receives everything, unless `frames` does or
    /// `responses` takes the RC responses.
    socket: UdpSocket,
    /// On the UDP transport, a second socket on 4791 that RC responses
    /// (ACKs, READ responses, atomic ACKs) are steered to (see
    /// [`response_socket`]), if the kernel steers.
    responses: Option<UdpSocket>,
    /// The engine thread sleeps without watching `responses`: threads poll,
    /// and take them in.
    responses_left: AtomicBool,
    /// Steer RC responses apart while staying for a program that spins on
    /// memory (`RNIC_RESPONSE_SOCKET=on`; see [`response_socket`]).
    steer_when_staying: AtomicBool,
    /// RC responses are steered to `responses` now: pollers look there
    /// too. Only while the engine thread leaves them to pollers; otherwise
    /// all comes in on `socket` (and a poll costs one system call, not two).
    steering: AtomicBool,
    /// Steering has started at least once: `responses` may hold packets.
    steered_once: AtomicBool,
    /// A test's choice of steering (1 off, 2 on; 0 the engine's own).
    #[cfg(test)]
    pinned_steering: std::sync::atomic::AtomicU8,
    /// The frame transport's packet socket (see `frames`), if the device
    /// runs on one.
    frames: Option<OwnedFd>,
    /// Wakes the engine thread from poll(2).
    wake: OwnedFd,
    /// When the engine thread means to wake up (ns on the engine's clock;
    /// `u64::MAX` while it is awake): a verb that sets an earlier timer
    /// wakes it, and no other does.
    sleeping_until: AtomicU64,
    /// [`EngineState::next_deadline`] as the last thread to change the
    /// state left it (ns; `u64::MAX`: none), published under the lock:
    /// what the engine thread, away from the socket, reads when it wakes
    /// to look at the pollers, instead of taking the lock from them (see
    /// [`leave_to_pollers`]).
    deadline: AtomicU64,
    stop: AtomicBool,
    /// The engine's clock starts here (as `EngineState::start`).
    start: Instant,
    /// When a thread last polled an empty completion queue or posted work
    /// (ns on the engine's clock; 0: never): a thread in the data path,
    /// which takes in packets at its next poll.
    last_active: AtomicU64,
    /// The core that thread ran on then (`usize::MAX`: unknown): the
    /// engine thread's place (see `sched`).
    active_cpu: AtomicUsize,
    /// The engine thread's thread ID (0 until it runs).
    tid: AtomicU32,
    /// The engine thread sleeps without watching the socket (see `watch`).
    away: AtomicBool,
    /// A thread said it is about to sleep until a completion.
    sleeper: AtomicBool,
    /// Packets taken in by polling threads, ever.
    polled_packets: AtomicU64,
    /// Packets taken in by the engine thread, ever.
    engine_packets: AtomicU64,
    /// Of those, packets it took in while lingering (see `sched::Linger`).
    lingered_packets: AtomicU64,
    /// Of those, packets it took in at a look while away from the socket.
    looked_packets: AtomicU64,
    /// Times the engine thread, back from leaving the socket to pollers,
    /// found waiting a request no completion shows, and stayed.
    stays: AtomicU64,
    /// Times the engine thread slept away from the socket, ever.
    away_sleeps: AtomicU64,
    /// `watch::AWAY_MAX`, or longer in a test that must see a sleeper
    /// served by being told, not by the engine coming back on its own.
    away_max: AtomicU64,
}

impl Shared {
    /// Send what is held now: ACKs held for an answer, datagrams posts
    /// left for the next poll (see [`flush_at_exit`]).
    fn flush(&self) {
        if let Some(mut st) = self.state.try_lock_for(EXIT_WAIT) {
            st.pump(&self.socket);
            self.publish(&st);
        }
    }

    /// Whether to steer: `wanted`, unless a test chose.
    fn pinned(&self, wanted: bool) -> bool {
        #[cfg(test)]
        match self.pinned_steering.load(Ordering::SeqCst) {
            1 => return false,
            2 => return true,
            _ => {}
        }
        wanted
    }

    /// Where RC responses come in, if not at [`Shared::rx`]: nowhere until
    /// steering first starts (nothing reaches `responses` before), so a NIC
    /// that never steers pays no system call for it.
    fn responses_rx(&self) -> Option<Rx<'_>> {
        self.responses
            .as_ref()
            .filter(|_| self.steered_once.load(Ordering::Relaxed))
            .map(Rx::Udp)
    }

    /// Steer RC responses to `responses`, or not (engine thread only),
    /// keeping them in order: packets are taken in under the state lock,
    /// which the switch holds, and what waits on the socket the switch
    /// turns away from is taken in at once, before anything that arrives
    /// on the other. Starting, that is `socket` (up to [`STEER_DRAIN`]
    /// batches: under a flood a response left behind arrives late, as on
    /// a network that reorders); stopping, `responses`. A packet the kernel
    /// was steering as the program changed, if any, is taken in by the
    /// engine thread, which watches `responses` whenever it does not leave
    /// it to pollers (and drains it when it leaves everything to them).
    fn steer(&self, on: bool) {
        if self.steering.load(Ordering::Relaxed) == on {
            return;
        }
        let mut st = self.state.lock();
        if crate::udp::steer_responses(self.socket.as_fd(), on).is_err() {
            return;
        }
        if on {
            self.steered_once.store(true, Ordering::Relaxed);
            for _ in 0..STEER_DRAIN {
                if st.receive(self.rx(), &self.socket, false, false).packets < crate::udp::BATCH {
                    break;
                }
            }
        } else if let Some(r) = self.responses_rx() {
            while st.receive(r, &self.socket, false, false).packets > 0 {}
        }
        self.publish(&st);
        self.steering.store(on, Ordering::SeqCst);
    }

    /// Where packets come in.
    fn rx(&self) -> Rx<'_> {
        match &self.frames {
            Some(f) => Rx::Frames(f.as_fd()),
            None => Rx::Udp(&self.socket),
        }
    }

    /// Now, in ns on the engine's clock, without the lock.
    fn clock(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// A thread is in the data path now; returns now (ns on the engine's
    /// clock), for the caller's own use: one clock read per poll (a system
    /// call where the clock source has no vDSO reading, as on an emulated
    /// CPU's HPET).
    fn active(&self) -> u64 {
        let now = self.clock().max(1);
        self.last_active.store(now, Ordering::Relaxed);
        let cpu = crate::sched::current_cpu().unwrap_or(usize::MAX);
        if self.active_cpu.load(Ordering::Relaxed) != cpu {
            self.active_cpu.store(cpu, Ordering::Relaxed);
        }
        now
    }

    /// Publish `st`'s next deadline (`deadline`), and return it; called
    /// under the lock by every thread that changed the state, before it
    /// lets go.
    fn publish(&self, st: &EngineState) -> Option<Time> {
        let next = st.next_deadline();
        self.deadline
            .store(next.map_or(u64::MAX, |t| t.0), Ordering::SeqCst);
        next
    }

    fn active_cpu(&self) -> Option<usize> {
        match self.active_cpu.load(Ordering::Relaxed) {
            usize::MAX => None,
            c => Some(c),
        }
    }

    fn last_active(&self) -> Option<u64> {
        match self.last_active.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t),
        }
    }

    fn wake(&self) {
        // An eventfd write only fails when the counter would overflow, which
        // already means "awake".
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    /// Wake the engine thread if the next deadline, `next`, comes before
    /// the time it means to wake up.
    ///
    /// The caller published its deadline first (`publish`, under the lock):
    /// an engine thread that reads `deadline` after setting
    /// `sleeping_until` (`leave_to_pollers`) either sees it, or is seen
    /// here (both sequentially consistent).
    fn wake_for(&self, next: Option<Time>) {
        if next.is_some_and(|t| t.0 < self.sleeping_until.load(Ordering::SeqCst)) {
            self.wake();
        }
    }
}

/// The application's handle on the engine.
pub(crate) struct Engine {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    pub addr: IpAddr,
    /// Every address of the NIC, its own first (the interface's, on the
    /// frame transport).
    pub addrs: Vec<IpAddr>,
    /// The same in GID table order ([`crate::frames::Interface::gids`]).
    pub gids: Vec<IpAddr>,
    /// On the frame transport, what holds this NIC's slot of the QP
    /// number space on the interface while it lives.
    _slot_claim: Option<std::os::unix::net::UnixDatagram>,
    /// On the UDP transport with a response socket, what holds the address
    /// for this NIC while it lives (its sockets let others join: see
    /// [`claim_udp`]).
    _udp_claim: Option<std::os::unix::net::UnixDatagram>,
    /// The largest IP packet the link carries.
    pub link_mtu: u32,
    /// The process that started the thread: a forked child has a copy of
    /// this struct but not the thread.
    pid: u32,
}

/// The UDP port of RoCE v2.
pub const ROCE_PORT: u16 = rnic_wire::ROCE_V2_PORT;

/// Port 4791 of `to`, with `scope` if it is a link-local IPv6 address.
/// Cut `run`, datagrams from one address and port, into the messages of
/// UDP GSO sends (`groups`: datagrams per message, see
/// [`crate::udp::gso_run`]), and make each IPv4 segment's ICRC the one for
/// the identification the kernel will give it: its index in its message
/// ([`rnic_wire::icrc::ipv4_id_delta`]; IPv6 has no identification).
fn segment(run: &mut [Datagram], groups: &mut Vec<usize>, cache: &mut Option<IdDeltas>) {
    groups.clear();
    let mut at = 0;
    while at < run.len() {
        let rest = &mut run[at..];
        let n = crate::udp::gso_run(rest.len(), |i| {
            (SocketAddr::new(rest[i].dst, 0), rest[i].payload.len())
        });
        groups.push(n);
        for (k, d) in rest[..n].iter_mut().enumerate().skip(1) {
            d.set_ipv4_id(k as u16, cache);
        }
        at += n;
    }
}

/// Move plain ACKs behind the other datagrams of a batch about to leave in
/// one system call, each kind in its order. Between a connection's data
/// packets an ACK would cut a GSO send in two; after it, it ends one: the
/// ACK a ping-pong's answer follows leaves in the answer's send, one
/// datagram through the stack instead of two. Without GSO the answer
/// still arrives first, so the peer, polling for that ACK, has taken the
/// answer in when the ACK hands it its completion. Nothing is lost by it: the
/// ACK leaves in the same system call, a later ACK of the same QP carries
/// everything an earlier one did, and a READ response it now follows
/// acknowledges what came before it too. NAKs keep their place.
fn acks_last(tx: &mut [Datagram]) {
    let mut ack_before_other = false;
    let mut seen_ack = false;
    for d in tx.iter() {
        let ack = d.is_plain_ack();
        ack_before_other |= seen_ack && !ack;
        seen_ack |= ack;
    }
    if ack_before_other {
        tx.sort_by_key(Datagram::is_plain_ack); // stable: false (the others) first
    }
}

fn to_socket_addr(to: IpAddr, scope: u32) -> SocketAddr {
    match to {
        IpAddr::V6(a) => SocketAddr::V6(std::net::SocketAddrV6::new(a, ROCE_PORT, 0, scope)),
        IpAddr::V4(_) => SocketAddr::new(to, ROCE_PORT),
    }
}

fn open_socket(addr: IpAddr, port: u16, scope: u32) -> io::Result<UdpSocket> {
    open_socket_shared(addr, port, scope, false)
}

/// A UDP socket on `addr`:`port` to send from; with `shared`, one that
/// other processes' NICs on the same address may bind too (SO_REUSEPORT:
/// on the frame transport, where port 4791 only keeps the kernel from
/// answering, and each NIC takes its packets in from its frame socket).
fn open_socket_shared(addr: IpAddr, port: u16, scope: u32, shared: bool) -> io::Result<UdpSocket> {
    let at = match addr {
        IpAddr::V6(a) => SocketAddr::V6(std::net::SocketAddrV6::new(a, port, 0, scope)),
        IpAddr::V4(_) => SocketAddr::new(addr, port),
    };
    let family = if addr.is_ipv4() {
        rustix::net::AddressFamily::INET
    } else {
        rustix::net::AddressFamily::INET6
    };
    let fd = rustix::net::socket_with(
        family,
        rustix::net::SocketType::DGRAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    if shared {
        rustix::net::sockopt::set_socket_reuseport(&fd, true)?;
    }
    rustix::net::bind(&fd, &at)?;
    let socket = UdpSocket::from(fd);
    socket.set_nonblocking(true)?;
    if addr.is_ipv4() {
        // DF on every datagram and IPv4 identification 0: the ICRC convention.
        set_ip_mtu_discover(&socket, Ipv4PathMtuDiscovery::DO)?;
    }
    ask_recv_buffer(socket.as_fd());
    if set_socket_send_buffer_size_force(&socket, SOCKET_BUFFER).is_err() {
        let _ = set_socket_send_buffer_size(&socket, SOCKET_BUFFER);
    }
    Ok(socket)
}

/// Batches of what waits on the first socket taken in when steering starts
/// (see [`Shared::steer`]).
const STEER_DRAIN: usize = 8;

/// Whether a NIC on the UDP transport takes RC responses in on a socket of
/// their own while it stays for a program that spins on memory:
/// `RNIC_RESPONSE_SOCKET` (on, or off, the default). The two sockets are
/// bound either way; off, nothing is ever steered to the second.
///
/// Off by default because what it saves is small and what it costs is
/// not: `rnic perf write --lat` took one engine wake-up per round trip
/// instead of 2.2, yet its p50 moved by 5-15% at most (36.1 against 38.1
/// us, 44 against 47); while a flood to QPs that do not exist keeps the
/// engine thread staying, each poll reads two sockets, and the legitimate
/// transfer of `hostile_wire`'s on-path test kept 0.58-0.80 of its rate
/// alone, against 0.84-1.14 without (six runs each).
///
/// Why: a program that spins on memory between polls (ib_write_lat waits
/// for the peer's WRITE on its buffer's last byte) needs the engine thread
/// to take the WRITE in, so the engine thread watches the socket; it was
/// then woken by every ACK too, which the program's next poll would have
/// taken, and each wake-up preempted a program on a busy core: two per
/// round trip instead of one (`rnic perf write --lat`: 2.2 engine sleeps
/// per round trip). The kernel steers RC responses (the opcodes a requester
/// receives) to the second socket of the port's `SO_REUSEPORT` group
/// ([`crate::udp::steer_responses`]); while threads poll, the engine thread
/// watches only the first, for requests. Requests and responses are
/// separate streams on the wire, each in order on its socket.
fn response_socket() -> io::Result<bool> {
    match std::env::var("RNIC_RESPONSE_SOCKET").as_deref() {
        Ok("on" | "1") => Ok(true),
        Ok("off" | "0") | Err(_) => Ok(false),
        Ok(other) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("RNIC_RESPONSE_SOCKET={other}: expected on or off"),
        )),
    }
}

/// Claim UDP port 4791 of `addr` (link-local IPv6: on interface `scope`)
/// for one NIC, for as long as the returned socket is open. The NIC's two
/// sockets on the port let sockets that ask for SO_REUSEPORT join them, so
/// the port alone no longer says the address is taken: an abstract Unix
/// socket named after it does (as [`crate::frames::claim_slot`]'s). A
/// program that binds the port without SO_REUSEPORT is refused by the
/// kernel as before.
fn claim_udp(addr: IpAddr, scope: u32) -> io::Result<std::os::unix::net::UnixDatagram> {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("rnic/udp/{addr}%{scope}/{ROCE_PORT}");
    let at = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    std::os::unix::net::UnixDatagram::bind_addr(&at).map_err(|e| {
        if e.kind() == io::ErrorKind::AddrInUse {
            io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("UDP port {ROCE_PORT} of {addr} is taken by another rnic NIC"),
            )
        } else {
            e
        }
    })
}

/// Whether a NIC on `addr` sends runs of datagrams as UDP GSO sends:
/// `RNIC_GSO` (on or off) if set; otherwise only on loopback with the UDP
/// transport, where the kernel cuts the segments itself (the way a veth
/// test proves correct) and every receiver is a UDP socket. On a real
/// interface a NIC's own segmentation offload might number the IPv4
/// identification otherwise, and a peer's frame socket on `lo` would see
/// the uncut message.
fn gso_default(addr: IpAddr, frames: bool) -> io::Result<bool> {
    match std::env::var("RNIC_GSO").as_deref() {
        Ok("on" | "1") => Ok(true),
        Ok("off" | "0") => Ok(false),
        Ok(other) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("RNIC_GSO={other}: expected on or off"),
        )),
        Err(_) => Ok(addr.is_loopback() && !frames),
    }
}

/// The largest IP packet between `addr` and its peers: the interface's MTU
/// on the frame transport; loopback carries 64 KiB; any other address is
/// taken to be on 1500-byte Ethernet.
fn link_mtu(addr: IpAddr, iface: Option<&crate::frames::Interface>) -> u32 {
    match iface {
        Some(i) => i.mtu,
        None if addr.is_loopback() => 65536,
        None => 1500,
    }
}

/// A requester may have 1024 packets in flight; the default receive buffer
/// (about 200 KiB) drops a burst of them, and each tail loss costs a local
/// ACK timeout. Ask for 4 MiB on `fd` (beyond net.core.rmem_max only as
/// root), and settle for what the kernel grants.
pub(crate) fn ask_recv_buffer(fd: BorrowedFd<'_>) {
    if set_socket_recv_buffer_size_force(fd, SOCKET_BUFFER).is_err() {
        let _ = set_socket_recv_buffer_size(fd, SOCKET_BUFFER);
    }
}

impl Engine {
    /// Bind `addr`:4791 and start the engine thread, taking packets in from
    /// `iface` through a frame socket if given (see `frames`).
    pub fn start(
        addr: IpAddr,
        iface: Option<&crate::frames::Interface>,
        secret: rnic_core::rng::SecretRng,
        priority: crate::sched::Priority,
    ) -> io::Result<Engine> {
        // The NIC's addresses: the interface's (its own first), or `addr`.
        let mut addrs = vec![addr];
        let scope = iface.map_or(0, |i| i.index);
        let scope_of = |a: IpAddr| iface.map_or(0, |i| i.scope_of(a));
        if let Some(i) = iface {
            addrs.extend(i.gids.iter().filter(|&&a| a != addr));
        }
        let shared = iface.is_some();
        // On the UDP transport, RC responses arrive on a socket of their
        // own where the kernel steers them: the two sockets share the port
        // (SO_REUSEPORT), and a claim keeps the address this NIC's.
        let steer_when_staying = response_socket()?;
        let split = iface.is_none();
        let udp_claim = if split {
            Some(claim_udp(addr, scope)?)
        } else {
            None
        };
        let socket = open_socket_shared(addr, ROCE_PORT, scope_of(addr), shared || split)?;
        let responses = if split {
            let r = open_socket_shared(addr, ROCE_PORT, scope_of(addr), true)?;
            // Not steered until the engine thread leaves responses to pollers.
            match crate::udp::steer_responses(socket.as_fd(), false)
                .and_then(|()| crate::udp::enable_gro(r.as_fd()))
            {
                Ok(()) => Some(r),
                Err(e) => {
                    tracing::info!("RC responses share the socket of requests: {e}");
                    None
                }
            }
        } else {
            None
        };
        let mut send_sockets = HashMap::default();
        let mut nic = Nic::with_secret(addr, secret);
        for &a in &addrs[1..] {
            nic.add_addr(a);
        }
        let mut slot_claim = None;
        let frames = match iface {
            Some(i) => {
                // Other processes' NICs may be on this interface too: this
                // one takes a slot of the QP number space, and its frame
                // socket only the packets to its QPs.
                let (slot, claim) = crate::frames::claim_slot(i)?;
                nic.restrict_qpns(slot.slot, slot.bits)
                    .map_err(|e| io::Error::other(e.to_string()))?;
                slot_claim = Some(claim);
                let f = crate::frames::open(i, &addrs, Some(slot))?;
                crate::frames::receive_nothing(&socket)?;
                // Port 4791 of every other address: bound, so that the
                // kernel answers no RoCE packet with an ICMP port
                // unreachable, receiving nothing, sending what the NIC
                // sends from there.
                for &a in &addrs[1..] {
                    let s = open_socket_shared(a, ROCE_PORT, scope_of(a), true).map_err(|e| {
                        io::Error::new(e.kind(), format!("UDP port {ROCE_PORT} of {a}: {e}"))
                    })?;
                    crate::frames::receive_nothing(&s)?;
                    send_sockets.insert((a, ROCE_PORT), s);
                }
                Some(f)
            }
            None => None,
        };
        for &a in &addrs {
            crate::capture::register_local(a);
        }
        let wake = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
        let span = tracing::info_span!("rnic_engine", %addr);
        let start = Instant::now();
        // Packets of QPs without a port of their own leave from 4791.
        nic.set_udp_source_port(Some(ROCE_PORT));
        // On the UDP transport a peer's GSO send arrives whole where the
        // kernel can (GRO), one receive for what took one send.
        let rx = if frames.is_none() && crate::udp::enable_gro(socket.as_fd()).is_ok() {
            crate::udp::RecvBatch::with_gro()
        } else {
            crate::udp::RecvBatch::new()
        };
        let state = EngineState {
            nic,
            start,
            cqs: HashMap::default(),
            released_cqs: Vec::new(),
            pending_cqs: Vec::new(),
            tap: None,
            events: None,
            capture: None,
            qp_spans: HashMap::default(),
            send_sockets,
            scope,
            span: span.clone(),
            tx: Vec::with_capacity(crate::udp::BATCH),
            impair: None,
            rx,
            gso: gso_default(addr, iface.is_some())?,
            groups: Vec::with_capacity(crate::udp::BATCH),
            gso_deltas: None,
            held_since: None,
            held_for_answer: false,
            answers: 0,
            empty_polls: 0,
            polled_dry: false,
            acked_after: None,
            acked_at: Time(0),
            answer_time: 0,
            answer_wait: ANSWER_WAIT,
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            socket,
            responses,
            responses_left: AtomicBool::new(false),
            steering: AtomicBool::new(false),
            steered_once: AtomicBool::new(false),
            steer_when_staying: AtomicBool::new(steer_when_staying),
            #[cfg(test)]
            pinned_steering: std::sync::atomic::AtomicU8::new(0),
            frames,
            wake,
            sleeping_until: AtomicU64::new(u64::MAX),
            deadline: AtomicU64::new(u64::MAX),
            stop: AtomicBool::new(false),
            start,
            last_active: AtomicU64::new(0),
            active_cpu: AtomicUsize::new(usize::MAX),
            tid: AtomicU32::new(0),
            away: AtomicBool::new(false),
            sleeper: AtomicBool::new(false),
            polled_packets: AtomicU64::new(0),
            engine_packets: AtomicU64::new(0),
            lingered_packets: AtomicU64::new(0),
            looked_packets: AtomicU64::new(0),
            stays: AtomicU64::new(0),
            away_sleeps: AtomicU64::new(0),
            away_max: AtomicU64::new(crate::watch::AWAY_MAX),
        });
        register(&shared);
        let engine_side = shared.clone();
        // The device is ready when its thread is: set up (its scheduling
        // class too) before the first packet, not whenever the scheduler
        // first runs it.
        let (ready, started) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name(format!("rnic-engine-{addr}"))
            .spawn(move || {
                let _entered = span.enter();
                engine_side.tid.store(
                    rustix::thread::gettid().as_raw_nonzero().get() as u32,
                    Ordering::Relaxed,
                );
                let realtime = crate::sched::apply(priority);
                tracing::debug!("engine started on UDP port {ROCE_PORT}, real-time: {realtime}");
                let _ = ready.send(());
                run(&engine_side, realtime);
            })?;
        // An error here means the thread ended before it was ready; the
        // engine then fails its first call as it would have anyway.
        let _ = started.recv();
        Ok(Engine {
            shared,
            thread: Some(thread),
            addr,
            gids: iface.map_or_else(|| vec![addr], |i| i.gids.clone()),
            _slot_claim: slot_claim,
            _udp_claim: udp_claim,
            addrs,
            link_mtu: link_mtu(addr, iface),
            pid: std::process::id(),
        })
    }

    /// Run `f` on the engine's state, on this thread, then send what it
    /// produced and deliver its completions.
    pub fn call<R>(&self, f: impl FnOnce(&mut EngineState) -> R) -> io::Result<R> {
        self.verb(f, false)
    }

    /// [`Engine::call`] for a verb that posts work (a send, a receive, a
    /// bind). The posting thread counts as one that polls: it will poll for
    /// what it posted, and takes in what has arrived then. A bandwidth
    /// client posts for a millisecond at a time between polls; counted as
    /// idle, it brought the engine thread back to the socket each time, and
    /// back to a wake-up per packet batch.
    ///
    /// While the engine thread has left the socket to pollers (threads
    /// poll without pause), the datagrams a post produces wait for the next
    /// poll that finds its queue empty, up to [`crate::udp::BATCH`] of
    /// them: a program that posts a burst and then polls, as bandwidth
    /// programs do, sends the burst in one system call (one GSO send on
    /// loopback) instead of one per post, and one that posts a request and
    /// polls for its answer sends it at its first poll. Any other verb
    /// sends them at once; if the program stops polling, the engine thread
    /// sends them when it next looks, 1-8 ms after the last poll or post
    /// (`watch::AWAY_MAX` to `watch::AWAY_LONGEST`: see
    /// [`Watch::away_for`]), as it takes in what arrived meanwhile. The
    /// posting thread never wakes it for them.
    pub fn post<R>(&self, f: impl FnOnce(&mut EngineState) -> R) -> io::Result<R> {
        self.shared.active();
        self.verb(f, true)
    }

    /// Run verb `f` under the lock, then send what it produced (or hold it,
    /// for a post while threads poll: `may_hold`) and deliver the rest.
    fn verb<R>(&self, f: impl FnOnce(&mut EngineState) -> R, may_hold: bool) -> io::Result<R> {
        let sh = &*self.shared;
        let mut st = sh.state.lock();
        let span = st.span.clone();
        let _entered = span.enter();
        // A send post queues requests (or gives its QP more to build):
        // what counts as an answer; a receive posted does not.
        let queued = st.nic.queued_datagrams();
        let r = f(&mut st);
        if may_hold && queued.is_some_and(|q| st.nic.queued_datagrams().is_none_or(|n| n > q)) {
            st.posted();
        }
        let polled = may_hold && sh.away.load(Ordering::SeqCst);
        let held = polled && st.may_hold();
        if held {
            st.hold();
            st.deliver();
        } else {
            st.pump(&sh.socket);
        }
        let deadline = sh.publish(&st);
        // A timer the post set still wakes the engine thread; while it
        // leaves the socket to pollers, the datagrams the post held, and
        // what it left the NIC to build, do not: the poster's next poll
        // sends them.
        let next = if polled { st.wake_deadline() } else { deadline };
        drop(st);
        // A deadline earlier than the engine thread's wake-up: tell it.
        sh.wake_for(next);
        Ok(r)
    }

    /// Run-to-completion: on the calling thread (one that found its queue
    /// empty), take in what has arrived, as the engine thread would, so a
    /// program that polls needs no hand-off to another thread. Does nothing
    /// if the engine thread (or another poller) holds the lock: it is doing
    /// the same work. Allocates nothing when nothing arrived.
    ///
    /// Timers are the engine thread's: they run here only when it is late
    /// for them (asleep past the time it meant to wake, starved of a core).
    /// That costs one comparison per poll, where looking for a due timer
    /// would look at every queue pair's.
    ///
    /// While the engine thread has left the socket to pollers, what a
    /// batch that delivered a completion produced (the ACK of a SEND, say)
    /// waits for the next poll that finds its queue empty, as a post's
    /// datagrams do ([`Engine::post`]): the program, handed the
    /// completion, often answers it, and the ACK and the answer then leave
    /// in one system call after the answer was posted, instead of the
    /// ACK's system call delaying the answer. A program that polls for
    /// anything at all sends it at its next poll; one that stops polling
    /// leaves it to the engine thread, at most `watch::AWAY_LONGEST` later.
    /// Once the program has shown that it answers what it takes in, ACKs
    /// wait for the answer itself, and a poll leaves them waiting (see
    /// [`EngineState::hold_for_answer`]).
    pub fn progress(&self) {
        let sh = &*self.shared;
        let now = sh.active();
        let Some(mut st) = sh.state.try_lock() else {
            return;
        };
        // What posts held back goes first: it is what the poller waits for
        // (ACKs held for an answer wait for a post, or their time).
        let held = st.held_due().is_some_and(|t| t.0 <= now);
        if held {
            st.pump(&sh.socket);
        }
        let away = sh.away.load(Ordering::SeqCst);
        // After a poll that found nothing, one message: what a ping-pong's
        // poller finds, the answer (with the ACK that came with it: one
        // GSO send, one message). Asking for a batch, the kernel would
        // fill one header and then fail on the next, which costs about
        // what an empty receive does (`recvmmsg` with 64 B WRITEs
        // ping-ponging: 3,400 cycles a receive asking for one, 4,000 for a
        // batch). A thread that finds something at its next poll again
        // asks for a batch: a stream pays one system call more per spell.
        let most = if st.polled_dry { 1 } else { crate::udp::BATCH };
        // Requests (and, unless steered apart, responses), then the
        // responses steered apart.
        let mut received = st
            .receive_at_most(sh.rx(), &sh.socket, away, true, most)
            .packets;
        if let Some(r) = sh
            .responses_rx()
            .filter(|_| sh.steering.load(Ordering::Relaxed))
        {
            received += st.receive_at_most(r, &sh.socket, away, true, most).packets;
        }
        st.polled_dry = received == 0;
        if received > 0 {
            sh.polled_packets
                .fetch_add(received as u64, Ordering::Relaxed);
        }
        let mut worked = held || received > 0;
        // What a pump left the NIC to build, after what arrived was taken
        // in (the order the engine thread keeps): the next bursts.
        if st.nic.more_to_build() {
            st.pump(&sh.socket);
            worked = true;
        }
        if now >= sh.sleeping_until.load(Ordering::Acquire) {
            worked |= st.run_due_timers(&sh.socket);
        }
        if !worked {
            st.empty_polls += 1;
            return;
        }
        // What this poll held does not wake the engine thread, nor what it
        // left to build while the engine thread is away; timers do.
        let next = if away {
            st.wake_deadline()
        } else {
            st.timer_deadline()
        };
        sh.publish(&st);
        drop(st);
        sh.wake_for(next);
    }

    /// A thread is about to sleep until a completion (it armed a queue for
    /// an event, or waits on one): the engine thread must watch the socket
    /// for it, and is woken if it left the socket to pollers.
    pub fn expect_sleeper(&self) {
        let sh = &*self.shared;
        sh.sleeper.store(true, Ordering::SeqCst);
        if sh.away.load(Ordering::SeqCst) || sh.responses_left.load(Ordering::SeqCst) {
            sh.wake();
        }
    }
}

#[cfg(test)]
impl Engine {
    /// Whether the engine thread is asleep away from the socket.
    pub fn is_away(&self) -> bool {
        self.shared.away.load(Ordering::SeqCst)
    }
    /// What the process's exit does for this engine (see
    /// [`flush_at_exit`]).
    pub fn flush_as_at_exit(&self) {
        self.shared.flush();
    }
    /// Whether datagrams posts produced wait for a poll.
    pub fn holding(&self) -> bool {
        self.shared.state.lock().held_since.is_some()
    }
    /// Whether ACKs wait for the program's answer, and whether it has
    /// learned that the program answers.
    pub fn answer(&self) -> (bool, bool) {
        let st = self.shared.state.lock();
        (st.held_for_answer, st.answers > 0)
    }
    /// How long ACKs wait for an answer now (ns).
    pub fn answer_wait(&self) -> u64 {
        self.shared.state.lock().answer_wait()
    }
    /// The shortest wait for an answer (ns).
    pub fn set_answer_wait(&self, wait: u64) {
        let mut st = self.shared.state.lock();
        st.answer_wait = wait;
        self.shared.publish(&st);
    }
    /// Times the engine thread stayed for a request that waited for it.
    pub fn stays(&self) -> u64 {
        self.shared.stays.load(Ordering::Relaxed)
    }
    /// Times the engine thread slept away from the socket.
    pub fn away_sleeps(&self) -> u64 {
        self.shared.away_sleeps.load(Ordering::Relaxed)
    }
    /// Whether the NIC has more to build, when the engine thread away
    /// would look next if it looked now (at the latest at `bound`), and
    /// the engine's clock.
    pub fn away_until(&self, bound: u64) -> (bool, u64, u64) {
        let st = self.shared.state.lock();
        let now = st.now().0;
        let about = Watch::pollers_about(now, self.shared.last_active());
        (st.nic.more_to_build(), st.away_until(bound, about), now)
    }
    /// Steer RC responses to the response socket (`Some(true)`), or not,
    /// whatever the engine thread would choose; `None` leaves it to it.
    pub fn pin_steering(&self, on: Option<bool>) {
        let v = match on {
            None => 0,
            Some(false) => 1,
            Some(true) => 2,
        };
        self.shared.pinned_steering.store(v, Ordering::SeqCst);
        if let Some(on) = on {
            self.shared.steer(on);
        }
    }
    /// Steer RC responses apart while staying (as with
    /// `RNIC_RESPONSE_SOCKET=on`), or not.
    pub fn steer_when_staying(&self, on: bool) {
        self.shared.steer_when_staying.store(on, Ordering::Relaxed);
    }
    /// Whether RC responses are steered to the response socket now.
    pub fn steering(&self) -> bool {
        self.shared.steering.load(Ordering::SeqCst)
    }
    /// Whether runs of datagrams go out as UDP GSO sends now.
    #[cfg(test)]
    pub(crate) fn gso(&self) -> bool {
        self.shared.state.lock().gso
    }
    /// Make every socket this NIC sends from send without UDP checksums:
    /// the kernel then refuses GSO sends (EINVAL), as some paths do.
    #[cfg(test)]
    pub(crate) fn send_without_checksums(&self) {
        let st = self.shared.state.lock();
        for s in std::iter::once(&self.shared.socket).chain(st.send_sockets.values()) {
            crate::udp::set_option(
                s.as_fd(),
                libc::SOL_SOCKET,
                libc::SO_NO_CHECK,
                &1 as &libc::c_int,
            )
            .expect("SO_NO_CHECK");
        }
    }
    /// Send one datagram per message from now on, as where GSO is off.
    #[cfg(test)]
    pub(crate) fn set_gso(&self, on: bool) {
        self.shared.state.lock().gso = on;
    }
    /// Packets polling threads took in, ever.
    pub fn polled_packets(&self) -> u64 {
        self.shared.polled_packets.load(Ordering::Relaxed)
    }
    /// Packets the engine thread took in, ever.
    pub fn engine_packets(&self) -> u64 {
        self.shared.engine_packets.load(Ordering::Relaxed)
    }
    /// Packets the engine thread took in while lingering on the socket
    /// after its last piece of work, ever.
    pub fn lingered_packets(&self) -> u64 {
        self.shared.lingered_packets.load(Ordering::Relaxed)
    }
    /// Packets the engine thread took in at a look while away from the
    /// socket (they waited up to a time away), ever.
    pub fn looked_packets(&self) -> u64 {
        self.shared.looked_packets.load(Ordering::Relaxed)
    }
    /// The engine thread's thread ID.
    pub fn engine_tid(&self) -> i32 {
        self.shared.tid.load(Ordering::Relaxed) as i32
    }
    /// The cores the engine thread may run on now.
    pub fn engine_cpus(&self) -> rustix::thread::CpuSet {
        let pid = rustix::thread::Pid::from_raw(self.engine_tid()).expect("the engine thread runs");
        rustix::thread::sched_getaffinity(Some(pid)).unwrap()
    }
    /// Let the socket go unwatched this long after the last poll.
    pub fn set_away_max(&self, ns: u64) {
        self.shared.away_max.store(ns, Ordering::Relaxed);
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // A forked child's copy: its thread is the parent's, and the
            // locks may be held by threads that do not exist here. Leave
            // everything as it is.
            std::mem::forget(self.thread.take());
            return;
        }
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for &a in &self.addrs {
            crate::capture::unregister_local(a);
        }
    }
}

fn run(sh: &Shared, realtime: bool) {
    // Lingering on the socket after the last piece of work (see
    // `sched::Linger`).
    let window = crate::sched::linger_window();
    let mut linger = crate::sched::Linger::default();
    let mut watch = Watch::default();
    let mut polled = 0;
    // Whether the last look left the socket to pollers (for the log).
    let mut left = false;
    // In real time, the engine thread runs on its program's core.
    let mut follow = if realtime {
        rustix::thread::sched_getaffinity(None)
            .ok()
            .map(crate::sched::Follow::new)
    } else {
        None
    };
    while !sh.stop.load(Ordering::Acquire) {
        let now = sh.clock();
        if let Some(f) = follow.as_mut() {
            if let Some(m) = f.decide(now, sh.last_active(), sh.active_cpu()) {
                f.apply(m);
            }
        }
        let p = sh.polled_packets.load(Ordering::Relaxed);
        let pollers_took = p - polled;
        watch.pollers_took(pollers_took);
        polled = p;
        if sh.sleeper.swap(false, Ordering::SeqCst) {
            watch.sleeper(now);
        }
        let away_for = watch.away_for(now, sh.away_max.load(Ordering::Relaxed));
        let away = watch.away(now, sh.last_active(), away_for);
        if away != std::mem::replace(&mut left, away) {
            if away {
                tracing::debug!("polling threads take the packets in: the engine thread leaves the socket to them");
            } else {
                tracing::debug!("the engine thread watches the socket again");
            }
        }
        if away {
            // Pollers take everything in: one socket is one system call.
            // What was steered to the other before is taken in here, now
            // and each time the engine thread comes back (a packet the
            // kernel was steering as the program changed stays at most
            // the time away).
            sh.steer(sh.pinned(false));
            // What waited on the socket through the time away, the pollers
            // did not take in: a program that posts and polls, but polls
            // only now and then or only finds completions waiting, takes
            // nothing in. Taken in at each look while they are about, so
            // nothing waits longer than a time away however seldom they
            // take packets in (looked at without the lock: a ping-pong's
            // poller has usually taken everything). The engine thread
            // stays away, unless the pollers took nothing since the last
            // look and requests no completion shows waited (a program
            // that posts but does not poll, see `Watch::looked`).
            if Watch::pollers_about(sh.clock(), sh.last_active()) && readable(sh.rx().fd()) {
                let got = take_in_away(sh, sh.rx(), true);
                if got.packets > 0 {
                    sh.looked_packets
                        .fetch_add(got.packets as u64, Ordering::Relaxed);
                    let now = sh.clock();
                    watch.engine_took(got.packets, now, sh.last_active());
                    if watch.looked(now, got.unpolled, pollers_took) {
                        stayed(sh, got.unpolled);
                    }
                    continue;
                }
            }
            if sh
                .responses_rx()
                .is_some_and(|r| take_in_away(sh, r, false).packets > 0)
            {
                continue;
            }
            if linger.stop() {
                linger_class(realtime, false);
            }
            leave_to_pollers(sh, &mut watch, away_for);
            continue;
        }
        // Staying for a program that spins on memory while threads poll:
        // they take the RC responses in, and the engine thread watches for
        // requests only (see `response_socket`).
        let leave_responses = sh.responses.is_some()
            && sh.steer_when_staying.load(Ordering::Relaxed)
            && watch.staying(now)
            && Watch::pollers_about(now, sh.last_active())
            && !watch.sleeper_about(now);
        let leave_responses = sh.pinned(leave_responses);
        sh.steer(leave_responses);
        // Receive everything waiting, a batch per system call, each batch
        // handled under the lock.
        let (mut received, mut unpolled) = (0, 0);
        let responses = sh.responses_rx().filter(|_| !leave_responses);
        for rx in std::iter::once(sh.rx()).chain(responses) {
            loop {
                // Handed on fairly: a thread waiting to post or poll gets
                // the lock before the next batch of a flood.
                let mut st = sh.state.lock();
                let active = Watch::pollers_about(sh.clock(), sh.last_active());
                let got = st.receive(rx, &sh.socket, false, active);
                sh.publish(&st);
                parking_lot::MutexGuard::unlock_fair(st);
                received += got.packets;
                unpolled += got.unpolled;
                if got.packets < crate::udp::BATCH {
                    break;
                }
            }
        }
        sh.engine_packets
            .fetch_add(received as u64, Ordering::Relaxed);
        let now = sh.clock();
        if received > 0 && linger.datagrams(now, window) {
            sh.lingered_packets
                .fetch_add(received as u64, Ordering::Relaxed);
        }
        watch.engine_took(received, now, sh.last_active());
        if watch.back(now, unpolled) {
            stayed(sh, unpolled);
        }
        let mut busy = received > 0;
        let timeout = {
            let mut st = sh.state.lock();
            busy |= st.run_due_timers(&sh.socket);
            let deadline = sh.publish(&st);
            if busy {
                parking_lot::MutexGuard::unlock_fair(st);
                continue;
            }
            // Idle: linger where it pays and no thread polls or posts (in
            // the normal class, yielding the core at each look), then
            // sleep until a datagram, a wake-up, or the next deadline.
            match linger.idle(sh.clock(), window, sh.last_active()) {
                Idle::Linger { started } => {
                    drop(st);
                    if started {
                        linger_class(realtime, true);
                    }
                    std::thread::yield_now();
                    continue;
                }
                Idle::Sleep { stopped } => {
                    if stopped {
                        linger_class(realtime, false);
                    }
                }
            }
            let now = st.now();
            // While threads poll, look at what they took at least every
            // AWAY_MAX: packets they take need not wake this thread.
            let longest = if Watch::pollers_about(now.0, sh.last_active()) {
                crate::watch::AWAY_MAX
            } else {
                100_000_000
            };
            let mut until = deadline.map_or(now.0 + longest, |d| d.0.min(now.0 + longest));
            if leave_responses {
                // Responses are left to pollers until AWAY_MAX after the
                // last poll or post, as when away.
                let last = sh.last_active().unwrap_or(now.0);
                until = until.min(last.saturating_add(sh.away_max.load(Ordering::Relaxed)));
            }
            // Published under the lock: a verb that sets an earlier timer
            // after this sees it and wakes us.
            sh.sleeping_until.store(until, Ordering::SeqCst);
            Duration::from_nanos(until.saturating_sub(now.0))
        };
        watch.sleeping(false, now);
        // A thread about to sleep on a completion checks `responses_left`
        // after saying so; we check what it said after setting it: one of
        // the two sees the other (as with `away`).
        sh.responses_left.store(leave_responses, Ordering::SeqCst);
        let responses = match sh.responses_rx() {
            Some(r) if !leave_responses || sh.sleeper.load(Ordering::SeqCst) => Some(r),
            _ => None,
        };
        let mut fds = [
            PollFd::from_borrowed_fd(sh.rx().fd(), PollFlags::IN),
            PollFd::new(&sh.wake, PollFlags::IN),
            PollFd::from_borrowed_fd(responses.unwrap_or(sh.rx()).fd(), PollFlags::IN),
        ];
        let watched = if responses.is_some() { 3 } else { 2 };
        sleep(sh, &mut fds[..watched], timeout);
        sh.responses_left.store(false, Ordering::SeqCst);
    }
}

/// A real-time engine thread lingers in the normal class, where spinning
/// starves no one, and sleeps in real time, where a datagram's wake-up
/// preempts a busy program (see `sched`): the class for `lingering`.
fn linger_class(realtime: bool, lingering: bool) {
    if realtime {
        crate::sched::set_realtime(!lingering);
    }
}

/// Sleep without the socket while threads poll (they take the packets), at
/// most `away_for` past the last poll, and until the next timer.
///
/// While they poll, this thread wakes every `away_for` (see
/// [`Watch::away_for`]) only to see that they still do. It takes the state
/// lock only if a deadline is due
/// (`Shared::deadline`, published by whoever changed the state last): on
/// the core the program spins on, a real-time thread that takes the lock
/// preempts the poller holding it, spins, sleeps on it, and is woken again
/// when the poller lets go. (A timer it might miss so is one that a
/// thread armed without publishing; `wake_for` covers the race between
/// publishing and this read.)
fn leave_to_pollers(sh: &Shared, watch: &mut Watch, away_for: u64) {
    let now = sh.clock();
    let last = sh.last_active().unwrap_or(now);
    let bound = last.saturating_add(away_for);
    // Set before the deadline is read: a thread that publishes an earlier
    // one after the read sees this and wakes us (`Shared::wake_for`).
    sh.sleeping_until.store(bound, Ordering::SeqCst);
    let due = sh.deadline.load(Ordering::SeqCst);
    let timeout = if due > now {
        let until = due.min(bound);
        sh.sleeping_until.store(until, Ordering::SeqCst);
        Duration::from_nanos(until.saturating_sub(now))
    } else {
        let mut st = sh.state.lock();
        st.run_due_timers(&sh.socket);
        sh.publish(&st);
        let now = st.now().0;
        let until = st.away_until(bound, Watch::pollers_about(now, sh.last_active()));
        sh.sleeping_until.store(until, Ordering::SeqCst);
        Duration::from_nanos(until.saturating_sub(now))
    };
    // A thread about to sleep checks `away` after saying so; we check what
    // it said after setting `away`: one of the two sees the other.
    sh.away.store(true, Ordering::SeqCst);
    if !sh.sleeper.load(Ordering::SeqCst) {
        watch.sleeping(true, now);
        sh.away_sleeps.fetch_add(1, Ordering::Relaxed);
        sleep(sh, &mut [PollFd::new(&sh.wake, PollFlags::IN)], timeout);
    }
    sh.away.store(false, Ordering::SeqCst);
    sh.sleeping_until.store(u64::MAX, Ordering::SeqCst);
}

/// Away from the socket, one batch from `rx` under the lock (handed on
/// fairly), `program_active` as [`EngineState::receive`] takes it.
fn take_in_away(sh: &Shared, rx: Rx<'_>, program_active: bool) -> Received {
    let mut st = sh.state.lock();
    let got = st.receive(rx, &sh.socket, false, program_active);
    sh.publish(&st);
    parking_lot::MutexGuard::unlock_fair(st);
    sh.engine_packets
        .fetch_add(got.packets as u64, Ordering::Relaxed);
    got
}

/// `requests` that no completion shows waited for the engine thread: it
/// watches the socket again (`Watch::back` said so).
fn stayed(sh: &Shared, requests: usize) {
    sh.stays.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(
        requests,
        "requests no completion shows waited for the engine thread: it watches the socket again"
    );
}

/// Whether datagrams wait on `fd` (poll(2), not waiting).
fn readable(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(poll(&mut fds, Some(&now)), Ok(n) if n > 0)
}

/// poll(2) on `fds` for up to `timeout`, then take any wake-up.
fn sleep(sh: &Shared, fds: &mut [PollFd<'_>], timeout: Duration) {
    let ts = Timespec::try_from(timeout).unwrap_or(Timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    });
    let ready = poll(fds, Some(&ts));
    sh.sleeping_until.store(u64::MAX, Ordering::SeqCst);
    // Timed out: nobody woke it (one system call less per look at the
    // pollers).
    if ready != Ok(0) {
        let mut counter = [0u8; 8];
        let _ = rustix::io::read(sh.wake.as_fd(), &mut counter);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain ACKs leave after the other datagrams of their batch, each kind
    /// in its order, NAKs where they were; so the ACK a ping-pong's answer
    /// follows joins the answer's GSO send.
    #[test]
    fn plain_acks_go_last_and_join_the_gso_send_before_them() {
        let from = IpAddr::from([127, 0, 0, 1]);
        let to = IpAddr::from([127, 0, 0, 2]);
        let datagram = |opcode: u8, syndrome: u8, len: usize, tag: u8| {
            let mut payload = vec![tag; len];
            payload[0] = opcode;
            payload[rnic_wire::bth::HEADER_LEN] = syndrome;
            Datagram::new(from, to, 49152, payload)
        };
        let ack = |tag| datagram(0x11, 0x1F, 20, tag);
        let nak = |tag| datagram(0x11, 0x60, 20, tag); // PSN sequence error
        let send = |tag| datagram(0x04, 0, 80, tag); // SEND Only
        let tags = |tx: &[Datagram]| tx.iter().map(|d| d.payload[1]).collect::<Vec<_>>();
        let mut tx = vec![ack(1), send(2), nak(3), ack(4), send(5)];
        acks_last(&mut tx);
        assert_eq!(tags(&tx), [2, 3, 5, 1, 4]);
        let mut tx = vec![ack(1), send(2)];
        let group = |tx: &[Datagram]| {
            crate::udp::gso_run(tx.len(), |i| {
                (SocketAddr::new(tx[i].dst, 0), tx[i].payload.len())
            })
        };
        assert_eq!(group(&tx), 1, "an ACK in front ends its own send");
        acks_last(&mut tx);
        assert_eq!(tags(&tx), [2, 1]);
        assert_eq!(group(&tx), 2, "the answer and the ACK leave in one send");
    }

    /// The port's MTU follows the link: the interface's MTU on the frame
    /// transport (a tap at 9000 carries 4096-byte IB packets, Ethernet at
    /// 1500 only 1024), 64 KiB on loopback, 1500 elsewhere.
    #[test]
    fn the_link_mtu_is_the_interface_s() {
        let tap = |mtu| crate::frames::Interface {
            name: "tap0".into(),
            index: 7,
            gids: vec![IpAddr::from([10, 88, 0, 1])],
            mtu,
        };
        let v4 = IpAddr::from([10, 88, 0, 1]);
        assert_eq!(link_mtu(v4, Some(&tap(9000))), 9000);
        assert_eq!(link_mtu(v4, Some(&tap(1500))), 1500);
        assert_eq!(link_mtu(v4, None), 1500);
        assert_eq!(link_mtu(IpAddr::from([127, 0, 0, 1]), None), 65536);
    }
}
