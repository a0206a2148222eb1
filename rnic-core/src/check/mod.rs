//! A conformance checker for captured RoCE v2 traffic: it rebuilds, from
//! the packets alone, what each RC connection's requester sent and what its
//! responder answered, and reports where a NIC broke a rule of the IBTA's
//! reliable transport, with the packet numbers, the rule and its section.
//! `rnic check` runs it over a capture file; rnic's own tests run it over
//! what rnic sends, so that it is an oracle for rnic as well as for other
//! NICs.
//!
//! What it can and cannot know. A capture may start in the middle of a
//! connection: each stream learns its state from its first packets and
//! flags nothing it could not know (an opcode sequence is judged from the
//! first message boundary on, MSNs from the first ACK). A capture may miss
//! packets (the capture point drops some, or sits before a lossy link):
//! a packet the responder answered must have been sent, so a gap the
//! responder acknowledged is reported as a loss at the capture point (a
//! note), never as the NIC's fault; a gap the responder NAKed, or the
//! requester sent again, was lost on the way. A network may duplicate
//! packets: a packet identical to one seen just before (within
//! [`DUPLICATE_WINDOW_NS`]) is a copy made on the way, not the NIC's.
//!
//! Pure: fed one captured frame at a time ([`Checker::frame`]), no I/O, no
//! clock; memory grows with the connections and what each has outstanding,
//! not with the packets.

#[cfg(test)]
mod tests;

use core::fmt;
use core::net::IpAddr;
use std::collections::{BTreeMap, HashMap, VecDeque};

use rnic_wire::aeth::{NakCode, Syndrome};
use rnic_wire::{Frame, IbPacket, LinkType, Operation, Position, Psn, Transport};

/// Two identical packets this close together are one packet the network
/// copied.
pub const DUPLICATE_WINDOW_NS: u64 = 200_000;

/// The largest path MTU RoCE has.
const MAX_PMTU: usize = 4096;

/// Requests remembered per connection beyond what was acknowledged.
const KEPT_REQUESTS: usize = 1 << 16;

/// A message that begins this many PSNs from where its stream stands
/// (ahead or behind) begins a new connection on the same QP number: no
/// requester has so many PSNs outstanding, and a capture that missed so
/// many would be no capture of the connection. Connections draw their
/// first PSN at random, so a new one lands this close 1 time in 8.
const NEW_CONNECTION_JUMP: u32 = 1 << 20;

/// The same, where everything the stream sent was acknowledged: nothing is
/// left that a request so far behind could repeat, and a capture would
/// have to miss this many requests of an idle connection (a new one
/// lands this close 1 time in 2,048).
const NEW_IDLE_CONNECTION_JUMP: u32 = 1 << 12;

/// The rules, each with what it says and where the IBTA says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    /// A packet whose ICRC does not verify.
    Icrc,
    /// A request PSN that skips ahead, the skipped PSNs never NAKed, sent
    /// again or acknowledged.
    PsnSkip,
    /// A response for a PSN the requester never sent.
    AckUnsent,
    /// A NAK for a PSN the responder had acknowledged already: outside the
    /// window of PSNs outstanding.
    AckOutsideWindow,
    /// An MSN that does not count the messages acknowledged.
    MsnCount,
    /// A retransmission after a sequence-error NAK that does not restart at
    /// the NAKed PSN.
    GoBackN,
    /// A READ response whose PSNs, count or lengths do not match its
    /// request.
    ReadResponse,
    /// A repeated atomic answered with another original value.
    AtomicReplay,
    /// A MIDDLE or LAST without its FIRST, or a new message before the
    /// LAST of the one before.
    OpcodeSequence,
    /// A payload longer than the path MTU, FIRST and MIDDLE packets of
    /// unequal length, or a pad count a FIRST or MIDDLE may not have.
    Payload,
    /// A NAK that does not fit the request it answers.
    NakCode,
    /// A message that takes a receive, begun beyond the credits the
    /// responder granted (a warning: rdma_rxe's requester ignores credits,
    /// and its responder always grants without limit).
    Credits,
    /// Packets the capture missed, which the responder's answer proves
    /// were sent.
    CaptureLoss,
    /// An order-dependent finding on a connection whose packets the
    /// network reordered before the capture point: it cannot be told from
    /// a fault.
    Reordered,
}

impl Rule {
    /// A short name, for a report and a filter.
    pub const fn id(self) -> &'static str {
        match self {
            Rule::Icrc => "icrc",
            Rule::PsnSkip => "psn-skip",
            Rule::AckUnsent => "ack-unsent",
            Rule::AckOutsideWindow => "ack-window",
            Rule::MsnCount => "msn",
            Rule::GoBackN => "go-back-n",
            Rule::ReadResponse => "read-response",
            Rule::AtomicReplay => "atomic-replay",
            Rule::OpcodeSequence => "opcode-sequence",
            Rule::Payload => "payload",
            Rule::NakCode => "nak-code",
            Rule::Credits => "credits",
            Rule::CaptureLoss => "capture-loss",
            Rule::Reordered => "reordered",
        }
    }

    /// The rule, in a sentence.
    pub const fn says(self) -> &'static str {
        match self {
            Rule::Icrc => "every packet carries the ICRC of its invariant fields",
            Rule::PsnSkip => {
                "a requester sends its PSNs in sequence: a PSN skipped must be one the network lost"
            }
            Rule::AckUnsent => "a responder answers only PSNs it was sent",
            Rule::AckOutsideWindow => {
                "a NAK names a PSN of the window outstanding, never one acknowledged already"
            }
            Rule::MsnCount => "the MSN counts the messages the responder has completed",
            Rule::GoBackN => "after a sequence-error NAK the requester resends from the NAKed PSN",
            Rule::ReadResponse => {
                "a READ is answered by responses at its PSNs, one per path MTU of its length, FIRST..LAST or ONLY"
            }
            Rule::AtomicReplay => {
                "a repeated atomic is answered from the saved result, with the same original value"
            }
            Rule::OpcodeSequence => {
                "a message is FIRST, MIDDLE..., LAST, or ONLY; a new one begins only after the LAST"
            }
            Rule::Payload => {
                "FIRST and MIDDLE packets carry exactly the path MTU (no pad), no packet more"
            }
            Rule::NakCode => "an RNR NAK answers only a request that takes a receive",
            Rule::Credits => {
                "a requester begins a message that takes a receive only within the credits the responder's ACKs grant, or one beyond them to learn a new count"
            }
            Rule::CaptureLoss => "not a NIC's fault: the capture missed packets the peer answered",
            Rule::Reordered => {
                "not judged: the network reordered this connection's packets before the capture point"
            }
        }
    }

    /// Where the IBTA (Volume 1) says it.
    pub const fn section(self) -> &'static str {
        match self {
            Rule::Icrc => "9.7.3, A17.3.3",
            Rule::PsnSkip | Rule::AckUnsent | Rule::AckOutsideWindow => "9.7.1",
            Rule::MsnCount => "9.7.5.1",
            Rule::GoBackN => "9.7.5.1.3",
            Rule::ReadResponse => "9.4.3",
            Rule::AtomicReplay => "9.7.5.2.4",
            Rule::OpcodeSequence => "9.2.3",
            Rule::Payload => "9.2.4",
            Rule::NakCode => "9.7.5.2.8",
            Rule::Credits => "9.7.7.2",
            Rule::CaptureLoss | Rule::Reordered => "-",
        }
    }

    /// How much it weighs.
    pub const fn kind(self) -> Kind {
        match self {
            Rule::CaptureLoss | Rule::Reordered => Kind::Note,
            Rule::Credits => Kind::Warning,
            _ => Kind::Violation,
        }
    }

    /// Whether it is a NIC's fault (a capture with one is not conformant).
    pub const fn is_violation(self) -> bool {
        matches!(self.kind(), Kind::Violation)
    }

    /// Every rule.
    pub const ALL: [Rule; 14] = [
        Rule::Icrc,
        Rule::PsnSkip,
        Rule::AckUnsent,
        Rule::AckOutsideWindow,
        Rule::MsnCount,
        Rule::GoBackN,
        Rule::ReadResponse,
        Rule::AtomicReplay,
        Rule::OpcodeSequence,
        Rule::Payload,
        Rule::NakCode,
        Rule::Credits,
        Rule::CaptureLoss,
        Rule::Reordered,
    ];
}

/// How much a finding weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A NIC broke a rule: the capture is not conformant.
    Violation,
    /// A NIC did what the IBTA says it shall not, where common NICs do it
    /// too and nothing breaks (a requester that ignores credits): reported,
    /// the capture still conformant.
    Warning,
    /// Not a NIC's fault: about the capture or the network.
    Note,
}

/// One thing found: the packets (numbered from 1, as Wireshark does), the
/// rule, and what exactly happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The packets that show it.
    pub packets: Vec<u64>,
    /// The rule.
    pub rule: Rule,
    /// What happened, with the PSNs and values.
    pub what: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n: Vec<String> = self.packets.iter().map(u64::to_string).collect();
        write!(
            f,
            "packet {}: [{}] {} ",
            n.join(", "),
            self.rule.id(),
            self.what
        )?;
        match self.rule.kind() {
            Kind::Violation | Kind::Warning => {
                write!(f, "(IBTA {}: {})", self.rule.section(), self.rule.says())
            }
            Kind::Note => write!(f, "({})", self.rule.says()),
        }
    }
}

/// What the checker saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Frames fed.
    pub frames: u64,
    /// RoCE v2 packets among them.
    pub roce: u64,
    /// Frames that were not RoCE v2.
    pub other: u64,
    /// RoCE v2 frames that did not parse.
    pub malformed: u64,
    /// RC connections seen (a request stream; with its responses where
    /// they were seen).
    pub rc: usize,
    /// UC request streams.
    pub uc: usize,
    /// UD flows (sender, receiver and destination QP).
    pub ud: usize,
    /// Packets a network copied.
    pub network_copies: u64,
    /// Responses that came after later ones (a lower MSN, a PSN
    /// acknowledged already): the network reordered them; not judged.
    pub reordered_responses: u64,
    /// Responses the checker could not place with a request stream (their
    /// requests not in the capture, or several streams that could have
    /// sent them).
    pub unplaced_responses: u64,
}

/// A request stream: requests from `src` to `dst`'s QP `qp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct StreamKey {
    src: IpAddr,
    dst: IpAddr,
    qp: u32,
}

/// A request as the checker keeps it.
#[derive(Debug, Clone, Copy)]
struct Request {
    op: Operation,
    /// It takes a receive at the responder (a SEND, a WRITE with
    /// immediate data).
    takes_receive: bool,
    /// Its number of PSNs, where known (a READ's depends on the path MTU).
    span: Option<u32>,
    /// The message ends with it (LAST, ONLY, a READ, an atomic).
    ends: bool,
    /// A READ's length.
    len: u32,
    packet: u64,
}

/// A READ being answered.
#[derive(Debug, Clone, Copy)]
struct ReadState {
    len: u32,
    /// The PSN its next response should carry, and the bytes so far.
    next: Psn,
    bytes: u64,
    /// A response was missing on the way: lengths cannot be judged.
    gap: bool,
    packet: u64,
}

/// A gap in the requests: PSNs from `from` up to (not including) `to`.
#[derive(Debug, Clone, Copy)]
struct Gap {
    from: Psn,
    to: Psn,
    packet: u64,
}

/// End-to-end credits as a connection's ACKs granted them.
#[derive(Debug, Default, Clone, Copy)]
enum Granted {
    /// No count seen yet.
    #[default]
    Unknown,
    /// The highest number a message that takes a receive may have, and
    /// the response that granted it.
    Through { limit: u64, packet: u64 },
    /// Without limit, for good.
    Unlimited,
}

#[derive(Debug, Default)]
struct Conn {
    transport: Option<Transport>,
    /// The PSN after the furthest request sent.
    next: Option<Psn>,
    /// A READ whose span is unknown ends the sequence known so far: the
    /// next new request's PSN is taken as it comes.
    next_unknown: bool,
    /// The PSN of the last new request.
    last_new: Psn,
    /// Requests by PSN (the first PSN of each packet), not yet
    /// acknowledged, with those just before.
    requests: BTreeMap<u32, Request>,
    /// The operation of the message the requester is in (new packets), if
    /// known; `None` inside means "between messages".
    in_msg: Option<Option<Operation>>,
    /// The path MTU, once a FIRST or MIDDLE has shown it.
    pmtu: Option<usize>,
    gaps: Vec<Gap>,
    /// A response beyond everything sent: resolved by the next new request.
    ahead: Option<(Psn, u64)>,
    /// After a sequence-error NAK: its PSN and packet, until the first
    /// retransmission.
    nak: Option<(Psn, u64)>,
    /// The requester is resending (its last request was one sent before):
    /// a NAK that comes meanwhile may be taken as part of that
    /// retransmission, as rdma_rxe and rnic both take it (a retry under
    /// way is not started again by a NAK).
    resending: bool,
    /// The last ACK's PSN and MSN.
    last_ack: Option<(Psn, u32, u64)>,
    /// The furthest PSN acknowledged (by an ACK, or implied by a NAK), and
    /// the packet.
    acked: Option<(Psn, u64)>,
    /// The highest MSN a response carried (with its PSN and packet).
    top_msn: Option<(Psn, u32, u64)>,
    /// The network reordered this connection's packets before the capture
    /// point (a response older than one before it, time going back, a copy
    /// of an old request after a NAK): order-dependent findings are held
    /// in `held` and become notes.
    reordered: bool,
    held: Vec<(Vec<u64>, Rule, String)>,
    /// The time of the connection's last packet.
    last_t: u64,
    reads: BTreeMap<u32, ReadState>,
    atomics: HashMap<u32, (u64, u64)>,
    /// Where what is acknowledged was last forgotten.
    pruned: Option<Psn>,
    /// The messages that take a receive, as the requester began them: the
    /// PSN of each not yet acknowledged, with its number (from 1, in the
    /// capture), and how many have begun.
    receiving: VecDeque<(Psn, u64)>,
    receiving_begun: u64,
    /// What the responder's ACKs have granted.
    granted: Granted,
    /// The last request (hash, time) since the last response, and the
    /// last response since the last request, to recognise network copies:
    /// a requester resends only after a response (a NAK) or a timeout, a
    /// responder answers again only after a request (a duplicate).
    recent_requests: Option<(u64, u64)>,
    recent_responses: Option<(u64, u64)>,
}

/// The checker: feed it frames in capture order, then take the findings.
#[derive(Debug, Default)]
pub struct Checker {
    conns: BTreeMap<StreamKey, Conn>,
    /// Connections a new one on the same QP number replaced.
    ended: Vec<(StreamKey, Conn)>,
    /// Response streams (responder, requester, requester's QP) and the
    /// request stream each answers, once known.
    bound: HashMap<StreamKey, StreamKey>,
    ud: std::collections::HashSet<StreamKey>,
    findings: Vec<Finding>,
    stats: Stats,
}

impl Checker {
    /// A checker that has seen nothing.
    pub fn new() -> Checker {
        Checker::default()
    }

    /// Feed captured frame number `n` (from 1), taken at `time_ns`, whose
    /// link header is `link` (`None`: not a link type a RoCE packet comes
    /// in).
    pub fn frame(&mut self, n: u64, time_ns: u64, link: Option<LinkType>, data: &[u8]) {
        self.stats.frames += 1;
        let Some(link) = link else {
            self.stats.other += 1;
            return;
        };
        let f = match Frame::parse(link, data) {
            Ok(f) => f,
            Err(e) if e.is_not_roce() => {
                self.stats.other += 1;
                return;
            }
            Err(_) => {
                self.stats.malformed += 1;
                return;
            }
        };
        self.stats.roce += 1;
        if !f.icrc_ok() {
            self.find(
                vec![n],
                Rule::Icrc,
                format!(
                    "ICRC {:#010x}, the packet's invariant fields give {:#010x}",
                    f.ib.icrc(),
                    f.computed_icrc
                ),
            );
            // Its fields cannot be trusted: judged no further.
            return;
        }
        let (src, dst) = (f.ip.src_addr(), f.ip.dst_addr());
        self.packet(n, time_ns, src, dst, &f.ib);
    }

    fn find(&mut self, packets: Vec<u64>, rule: Rule, what: String) {
        self.findings.push(Finding {
            packets,
            rule,
            what,
        });
    }

    fn packet(&mut self, n: u64, t: u64, src: IpAddr, dst: IpAddr, p: &IbPacket<&[u8]>) {
        let info = p.info();
        let qp = p.bth().dest_qp();
        match info.transport {
            Transport::Ud => {
                self.ud.insert(StreamKey { src, dst, qp });
                return;
            }
            Transport::Rc | Transport::Uc => {}
            _ => return,
        }
        if qp == 1 || info.operation == Operation::Cnp {
            return;
        }
        let key = StreamKey { src, dst, qp };
        if info.is_request() {
            self.request(n, t, key, info.transport, p);
        } else {
            self.response(n, t, key, p);
        }
    }

    fn request(
        &mut self,
        n: u64,
        t: u64,
        key: StreamKey,
        transport: Transport,
        p: &IbPacket<&[u8]>,
    ) {
        let mut found = Vec::new();
        if self.conns.get(&key).is_some_and(|c| begins_anew(c, p)) {
            let ended = self.conns.remove(&key).expect("just seen");
            self.bound.retain(|_, to| *to != key);
            self.ended.push((key, ended));
        }
        let conn = self.conns.entry(key).or_default();
        conn.transport.get_or_insert(transport);
        if t < conn.last_t {
            conn.reordered = true;
        }
        conn.last_t = conn.last_t.max(t);
        if is_copy(&mut conn.recent_requests, p, t) {
            self.stats.network_copies += 1;
            return;
        }
        conn.recent_responses = None;
        let info = p.info();
        let psn = p.bth().psn();
        let op = info.operation;
        let len = p.payload().len();
        // Payload shape.
        if matches!(info.position, Position::First | Position::Middle) {
            if p.bth().pad_count() != 0 {
                found.push((
                    vec![n],
                    Rule::Payload,
                    format!("a {} with pad count {}", info.name, p.bth().pad_count()),
                ));
            }
            match conn.pmtu {
                None if len.is_power_of_two() && (256..=MAX_PMTU).contains(&len) => {
                    conn.pmtu = Some(len)
                }
                None => found.push((vec![n], Rule::Payload, format!(
                    "a {} of {len} bytes: a FIRST or MIDDLE carries a whole path MTU (256 to 4096 bytes, a power of two)",
                    info.name
                ))),
                Some(m) if m != len => found.push((vec![n], Rule::Payload, format!(
                    "a {} of {len} bytes where the connection's FIRST and MIDDLE packets carry {m}",
                    info.name
                ))),
                _ => {}
            }
        } else if len > conn.pmtu.unwrap_or(MAX_PMTU) {
            found.push((
                vec![n],
                Rule::Payload,
                format!(
                    "a {} of {len} bytes, more than the path MTU ({})",
                    info.name,
                    conn.pmtu.unwrap_or(MAX_PMTU)
                ),
            ));
        }
        let reth_len = p.reth().map_or(0, |r| r.dma_length());
        let span = match op {
            // One response per path MTU; a READ no longer than the smallest
            // path MTU has one whatever the MTU.
            Operation::RdmaReadRequest if reth_len <= 256 => Some(1),
            Operation::RdmaReadRequest => conn
                .pmtu
                .map(|m| u32::try_from(u64::from(reth_len).div_ceil(m as u64)).unwrap_or(u32::MAX)),
            _ => Some(1),
        };
        let ends = matches!(info.position, Position::Last | Position::Only);
        let request = Request {
            op,
            takes_receive: op == Operation::Send
                || (op == Operation::RdmaWrite && info.has_immediate()),
            span,
            ends,
            len: reth_len,
            packet: n,
        };
        let Some(next) = conn.next else {
            // The first request seen: the stream starts here.
            conn.next = Some(psn.add(span.unwrap_or(1)));
            conn.next_unknown = span.is_none();
            conn.last_new = psn;
            conn.in_msg = match info.position {
                Position::First => Some(Some(op)),
                Position::Only | Position::Last => Some(None),
                // Inside a message begun before the capture.
                Position::Middle => None,
            };
            credits(conn, n, psn, info.position, info.name, request, &mut found);
            note_request(conn, psn, request);
            self.report(found);
            return;
        };
        let fwd = psn.diff(next);
        // After a READ of unknown span, whatever comes after the READ's PSN
        // is new.
        let new = fwd >= 0 || (conn.next_unknown && psn.is_after(conn.last_new));
        if new {
            // A response beyond what was sent: this says whether it had been.
            if let Some((ahead, at)) = conn.ahead.take() {
                if ahead.is_before(psn) {
                    found.push((vec![at, n], Rule::CaptureLoss, format!(
                        "a response for PSN {:#08x} came before the capture saw it sent; the requester's next PSN, {:#08x}, shows it was",
                        ahead.value(), psn.value()
                    )));
                } else {
                    found.push((vec![at], Rule::AckUnsent, format!(
                        "a response for PSN {:#08x}, which the requester had not sent: its next request is PSN {:#08x}",
                        ahead.value(), psn.value()
                    )));
                }
            }
            if fwd > 0 && !conn.next_unknown && conn.transport == Some(Transport::Rc) {
                conn.gaps.push(Gap {
                    from: next,
                    to: psn,
                    packet: n,
                });
            }
            // The opcode sequence of new packets.
            let pos = info.position;
            if let Some(state) = conn.in_msg {
                let bad = match (state, pos) {
                    (Some(_), Position::First | Position::Only) if fwd == 0 => Some(format!(
                        "a {} while the message before has had no LAST",
                        info.name
                    )),
                    (None, Position::Middle | Position::Last) if fwd == 0 => {
                        Some(format!("a {} with no FIRST before it", info.name))
                    }
                    (Some(o), Position::Middle | Position::Last) if fwd == 0 && o != op => Some(
                        format!("a {} inside a message of another operation", info.name),
                    ),
                    _ => None,
                };
                if let Some(what) = bad {
                    found.push((vec![n], Rule::OpcodeSequence, what));
                }
            }
            conn.in_msg =
                if fwd == 0 || matches!(pos, Position::First | Position::Only | Position::Last) {
                    Some(match pos {
                        Position::First | Position::Middle => Some(op),
                        _ => None,
                    })
                } else {
                    // After a gap, inside a message: known again at its end.
                    None
                };
            credits(conn, n, psn, info.position, info.name, request, &mut found);
            conn.next = Some(psn.add(span.unwrap_or(1)));
            conn.next_unknown = span.is_none();
            conn.last_new = psn;
            conn.resending = false;
        } else {
            // Behind the next PSN: sent before, or first seen now (a packet
            // the network held back, or a retransmission of one the
            // capture missed). Either fills a gap.
            conn.gaps
                .retain(|g| !(psn.diff(g.from) >= 0 && psn.is_before(g.to)));
            let seen = conn.requests.contains_key(&psn.value());
            if let Some((nak, at)) = conn.nak {
                // What came after the NAK may have acknowledged more (the
                // requests it named were late, not lost): the requester
                // goes on from the first PSN not acknowledged.
                let from = match conn.acked {
                    Some((a, _)) if !a.is_before(nak) => a.next(),
                    _ => nak,
                };
                // A PSN inside a READ's responses: the requester repeats
                // the READ whole, or asks again from the first response it
                // lacks (middle responses acknowledge nothing on the wire,
                // so from any PSN of the READ's).
                let read_start = if conn.requests.contains_key(&from.value()) {
                    None
                } else {
                    read_covering(conn, from)
                };
                let rereads = read_start.is_some() && read_covering(conn, psn) == read_start;
                if psn == from || rereads {
                    conn.nak = None;
                } else if seen && psn.is_before(from) {
                    // A copy of a packet acknowledged already, after the
                    // NAK: one the network held back.
                    conn.reordered = true;
                } else if seen && psn.is_after(from) {
                    // Only a PSN seen before shows where a retransmission
                    // began: one first seen now may be a packet the
                    // network held back.
                    conn.nak = None;
                    if conn.requests.contains_key(&from.value()) {
                        conn.held.push((
                            vec![at, n],
                            Rule::GoBackN,
                            format!(
                                "the NAK named PSN {:#08x}; the retransmission began at {:#08x}",
                                from.value(),
                                psn.value()
                            ),
                        ));
                    } else {
                        // The capture never saw the NAKed PSN sent: it sits
                        // after the loss, and may have missed its
                        // retransmission the same way.
                        found.push((vec![at, n], Rule::CaptureLoss, format!(
                            "the NAK named PSN {:#08x}, which the capture never saw; the first retransmission it saw was {:#08x} (that of {:#08x} was likely lost on the way too)",
                            from.value(), psn.value(), from.value()
                        )));
                    }
                }
            }
            if seen {
                conn.resending = true;
            }
        }
        note_request(conn, psn, request);
        self.report(found);
    }

    fn report(&mut self, found: Vec<(Vec<u64>, Rule, String)>) {
        for (p, r, w) in found {
            self.find(p, r, w);
        }
    }

    /// The request stream a response stream answers: the one bound, or the
    /// only stream between the two addresses, or the one that sent the
    /// response's PSN.
    fn bind(&mut self, key: StreamKey, psn: Psn) -> Option<StreamKey> {
        let old = self.bound.get(&key).copied();
        if let Some(k) = old {
            // Still the same connection, unless the response's PSN lies
            // far from everything it sent: the requester's QP number is
            // then that of a new connection, to another QP.
            if self.conns.get(&k).is_some_and(|c| answers(c, psn)) {
                return Some(k);
            }
        }
        let candidates: Vec<StreamKey> = self
            .conns
            .iter()
            .filter(|(k, c)| {
                k.src == key.dst && k.dst == key.src && c.transport == Some(Transport::Rc)
            })
            .filter(|(k, _)| !self.bound.values().any(|b| b == *k))
            .filter(|(_, c)| c.requests.contains_key(&psn.value()) || covers(c, psn))
            .map(|(k, _)| *k)
            .collect();
        match candidates.as_slice() {
            [one] => {
                self.bound.insert(key, *one);
                Some(*one)
            }
            // Nothing else fits either: judged against what it was bound to
            // (a response for a PSN never sent is the responder's fault).
            _ => old,
        }
    }

    fn response(&mut self, n: u64, t: u64, key: StreamKey, p: &IbPacket<&[u8]>) {
        let psn = p.bth().psn();
        let Some(req_key) = self.bind(key, psn) else {
            self.stats.unplaced_responses += 1;
            return;
        };
        let mut found = Vec::new();
        let conn = self.conns.get_mut(&req_key).expect("bound to a stream");
        if t < conn.last_t {
            conn.reordered = true;
        }
        conn.last_t = conn.last_t.max(t);
        if is_copy(&mut conn.recent_responses, p, t) {
            self.stats.network_copies += 1;
            return;
        }
        conn.recent_requests = None;
        let info = p.info();
        let syndrome = p.aeth().map(|a| Syndrome::from_byte(a.syndrome()));
        let Some(next) = conn.next else { return };
        // An ACK or NAK with an MSN below one already seen, for a PSN
        // acknowledged already, was sent before that one: the network
        // reordered it, and what it says is older than what is known. (A
        // READ response or atomic answer to a repeated request carries the
        // MSN of the first: not a sign.)
        let plain = info.operation == Operation::Acknowledge;
        if let (true, Some(a), Some((acked, _)), Some((_, top, _))) =
            (plain, p.aeth(), conn.acked, conn.top_msn)
        {
            let behind = top.wrapping_sub(a.msn()) & Psn::MASK;
            if behind > 0 && behind < Psn::HALF && !acked.is_before(psn) {
                self.stats.reordered_responses += 1;
                conn.reordered = true;
                return;
            }
        }
        if let Some(a) = p.aeth() {
            let higher = conn
                .top_msn
                .is_none_or(|(_, top, _)| (a.msn().wrapping_sub(top) & Psn::MASK) < Psn::HALF);
            if higher {
                conn.top_msn = Some((psn, a.msn(), n));
            }
        }
        // Where the response's PSN lies.
        let fwd = psn.diff(next);
        if fwd >= 0 && !conn.next_unknown && conn.ahead.is_none() {
            conn.ahead = Some((psn, n));
        }
        // A NAK names the PSN the responder expects (or could not take):
        // never one it has acknowledged already.
        if let (Some(Syndrome::Nak(_) | Syndrome::RnrNak { .. }), Some((acked, at))) =
            (syndrome, conn.acked)
        {
            if !acked.is_before(psn) {
                conn.held.push((vec![at, n], Rule::AckOutsideWindow, format!(
                    "a NAK for PSN {:#08x}, which the responder had acknowledged already (through {:#08x})",
                    psn.value(), acked.value()
                )));
            }
        }
        // Gaps the response settles.
        let acked_through = match syndrome {
            Some(Syndrome::Ack { .. }) => Some(psn),
            Some(Syndrome::Nak(NakCode::PsnSeqError)) | Some(Syndrome::RnrNak { .. }) => {
                Some(psn.sub(1))
            }
            _ => None,
        };
        if let Some(Syndrome::Nak(NakCode::PsnSeqError)) = syndrome {
            conn.gaps
                .retain(|g| !(psn.diff(g.from) >= 0 && psn.is_before(g.to)));
            conn.nak = (!conn.resending).then_some((psn, n));
        }
        if let Some(through) = acked_through {
            if conn.acked.is_none_or(|(a, _)| a.is_before(through)) {
                conn.acked = Some((through, n));
            }
            let (settled, open): (Vec<Gap>, Vec<Gap>) = conn
                .gaps
                .iter()
                .partition(|g| through.diff(g.to) >= 0 || through.diff(g.from) >= 0);
            conn.gaps = open;
            for g in settled {
                found.push((vec![g.packet, n], Rule::CaptureLoss, format!(
                    "PSNs {:#08x}..{:#08x} never appear in the capture, and the responder acknowledged them",
                    g.from.value(), g.to.sub(1).value()
                )));
            }
        }
        if let Some(Syndrome::Ack { credits }) = syndrome {
            grant(conn, psn, credits, n);
        }
        // RNR NAKs answer only what takes a receive.
        if let Some(Syndrome::RnrNak { .. }) = syndrome {
            if let Some(r) = conn.requests.get(&psn.value()) {
                // A WRITE's FIRST or MIDDLE may yet end with immediate data.
                let may_take = r.takes_receive || (r.op == Operation::RdmaWrite && !r.ends);
                if !may_take {
                    found.push((
                        vec![r.packet, n],
                        Rule::NakCode,
                        format!(
                            "an RNR NAK for a {:?} request, which takes no receive",
                            r.op
                        ),
                    ));
                }
            }
        }
        // MSN: plain ACKs count messages.
        if let (Some(Syndrome::Ack { .. }), Operation::Acknowledge, Some(a)) =
            (syndrome, info.operation, p.aeth())
        {
            let msn = a.msn();
            if let Some((last, last_msn, at)) = conn.last_ack {
                let grew = msn.wrapping_sub(last_msn) & Psn::MASK;
                if grew > Psn::HALF {
                    found.push((
                        vec![at, n],
                        Rule::MsnCount,
                        format!("the MSN went back from {last_msn} to {msn}"),
                    ));
                } else if psn.is_after(last) {
                    let (ended, reads) = messages_between(conn, last, psn);
                    // A re-ACK of a duplicate SEND or WRITE names the last
                    // such PSN but carries the MSN of now (rdma_rxe's
                    // responder does the same): it may count what was
                    // answered since, and the READs and atomics right
                    // after its PSN, done though their answers may not
                    // have come out yet.
                    let mut reach = reads_and_atomics_after(conn, psn);
                    if let Some((through, _)) = conn.acked {
                        if through.is_after(reach) {
                            reach = through;
                        }
                    }
                    let most = if reach.is_after(psn) {
                        messages_between(conn, last, reach).0
                    } else {
                        ended
                    };
                    if let Some(ended) = ended {
                        if most.is_some_and(|m| grew > m) || (reads == 0 && grew < ended) {
                            found.push((vec![at, n], Rule::MsnCount, format!(
                                "the MSN went from {last_msn} to {msn} while {ended} message(s) ended between PSNs {:#08x} and {:#08x}",
                                last.next().value(), psn.value()
                            )));
                        }
                    }
                }
            }
            if conn.last_ack.is_none_or(|(l, _, _)| !psn.is_before(l)) {
                conn.last_ack = Some((psn, msn, n));
            }
        }
        if info.operation == Operation::RdmaReadResponse {
            read_response(conn, n, p, &mut found);
        }
        if let Some(a) = p.atomic_ack_eth() {
            let orig = a.orig_rem_dt();
            match conn.atomics.get(&psn.value()) {
                Some(&(seen, at)) if seen != orig => found.push((
                    vec![at, n],
                    Rule::AtomicReplay,
                    format!(
                        "PSN {:#08x} was answered with original value {seen:#x}, then {orig:#x}",
                        psn.value()
                    ),
                )),
                Some(_) => {}
                None => {
                    conn.atomics.insert(psn.value(), (orig, n));
                }
            }
        }
        // Forget what is acknowledged, but a window's worth before: every
        // quarter window acknowledged (a walk over everything kept).
        let due = |t: Psn| {
            conn.pruned
                .is_none_or(|p| t.diff(p) >= (KEPT_REQUESTS / 4) as i32 || t.is_before(p))
        };
        if let Some(through) = acked_through.filter(|&t| due(t)) {
            conn.pruned = Some(through);
            let keep_from = through.sub(KEPT_REQUESTS as u32);
            conn.requests
                .retain(|&k, _| !Psn::new(k).is_before(keep_from));
            conn.atomics
                .retain(|&k, _| !Psn::new(k).is_before(keep_from));
            conn.reads.retain(|&k, _| !Psn::new(k).is_before(keep_from));
        }
        self.report(found);
    }

    /// The RC connections whose two directions it has paired: each as
    /// (requester address and QP, responder address and QP). A view such
    /// as `rnic ladder` names a packet's source QP from it (the BTH names
    /// only the destination's).
    pub fn connections(&self) -> Vec<((IpAddr, u32), (IpAddr, u32))> {
        let mut v: Vec<_> = self
            .bound
            .iter()
            .map(|(resp, req)| ((req.src, resp.qp), (req.dst, req.qp)))
            .collect();
        v.sort();
        v
    }

    /// The findings, with what was seen; unresolved gaps in the requests
    /// are skips.
    pub fn finish(mut self) -> (Vec<Finding>, Stats) {
        let mut found = Vec::new();
        for (k, c) in self.ended.iter().map(|(k, c)| (k, c)).chain(&self.conns) {
            match c.transport {
                Some(Transport::Rc) => self.stats.rc += 1,
                Some(Transport::Uc) => self.stats.uc += 1,
                _ => {}
            }
            if let Some((psn, at)) = c.ahead {
                found.push((vec![at], Rule::CaptureLoss, format!(
                    "{} -> {} QP {:#x}: a response for PSN {:#08x}, which the capture never saw sent and nothing after tells about: it was sent, or the responder answered a PSN it was never sent",
                    k.dst, k.src, k.qp, psn.value()
                )));
            }
            for (packets, rule, what) in &c.held {
                if c.reordered {
                    found.push((
                        packets.clone(),
                        Rule::Reordered,
                        format!("[{}] {what}", rule.id()),
                    ));
                } else {
                    found.push((packets.clone(), *rule, what.clone()));
                }
            }
            for g in &c.gaps {
                found.push((vec![g.packet], Rule::PsnSkip, format!(
                    "{} -> {} QP {:#x}: PSNs {:#08x}..{:#08x} were never sent, NAKed or acknowledged",
                    k.src, k.dst, k.qp, g.from.value(), g.to.sub(1).value()
                )));
            }
        }
        self.stats.ud = self.ud.len();
        self.report(found);
        self.findings
            .sort_by_key(|f| (f.packets.first().copied(), f.rule));
        (self.findings, self.stats)
    }
}

/// Whether `p` is a copy of the packet just before it, `last` (the
/// same direction of the same connection), seen within
/// [`DUPLICATE_WINDOW_NS`]; remembering it if not. Only the packet just
/// before: a requester that resends in bursts (rnic does, with the same
/// bytes) sends other packets between two copies of one.
fn is_copy(last: &mut Option<(u64, u64)>, p: &IbPacket<&[u8]>, t: u64) -> bool {
    // Without the ICRC: a copy sent in another UDP GSO batch, or by a
    // stack that numbers IPv4 identifications, carries another.
    let b = p.as_bytes();
    let h = digest(&b[..b.len().saturating_sub(4)]);
    if last.is_some_and(|(seen, at)| seen == h && t.saturating_sub(at) <= DUPLICATE_WINDOW_NS) {
        return true;
    }
    *last = Some((h, t));
    false
}

/// A packet's bytes, hashed to tell a copy: their CRC-32 (which crc32fast
/// takes at memory speed) and their length.
fn digest(b: &[u8]) -> u64 {
    (b.len() as u64) << 32 | u64::from(crc32fast::hash(b))
}

/// A new request: if it begins a message that takes a receive, count it,
/// and judge it against the credits granted (as rnic's requester and
/// rdmavt's follow them: the one message beyond the limit asks for a new
/// count). With nothing outstanding the last grant covers every message
/// done, so the one beyond it may always go.
fn credits(
    conn: &mut Conn,
    n: u64,
    psn: Psn,
    position: Position,
    name: &str,
    r: Request,
    found: &mut Vec<(Vec<u64>, Rule, String)>,
) {
    let begins = matches!(position, Position::First | Position::Only);
    // A WRITE with immediate data shows it only at its end: counted there.
    let counted = r.takes_receive && (begins || r.op == Operation::RdmaWrite);
    if !counted {
        return;
    }
    conn.receiving_begun += 1;
    let k = conn.receiving_begun;
    conn.receiving.push_back((psn, k));
    if conn.receiving.len() > KEPT_REQUESTS {
        conn.receiving.pop_front();
    }
    if let (true, Granted::Through { limit, packet: at }) = (begins, conn.granted) {
        if k > limit + 1 {
            found.push((
                vec![at, n],
                Rule::Credits,
                format!(
                    "a {name} begins receive-taking message {k} of the capture; the last grant allowed through {limit} (and {} to ask for a new count)",
                    limit + 1
                ),
            ));
        }
    }
}

/// A response's AETH grants `code` credits beyond the messages through
/// `psn`.
fn grant(conn: &mut Conn, psn: Psn, code: u8, n: u64) {
    if let Granted::Unlimited = conn.granted {
        return;
    }
    let Some(credits) = rnic_wire::aeth::decode_credits(code) else {
        conn.granted = Granted::Unlimited;
        return;
    };
    // The messages through `psn` are done: forgotten; those left are
    // numbered on from the ones done.
    while conn
        .receiving
        .front()
        .is_some_and(|&(p, _)| !p.is_after(psn))
    {
        conn.receiving.pop_front();
    }
    let done = conn
        .receiving
        .front()
        .map_or(conn.receiving_begun, |&(_, k)| k - 1);
    let limit = done + u64::from(credits);
    if !matches!(conn.granted, Granted::Through { limit: l, .. } if l >= limit) {
        conn.granted = Granted::Through { limit, packet: n };
    }
}

/// Whether request `p` begins a new connection on the stream `c` was:
/// a message begun far from where `c` stands.
fn begins_anew(c: &Conn, p: &IbPacket<&[u8]>) -> bool {
    let Some(next) = c.next else { return false };
    if !matches!(p.info().position, Position::First | Position::Only) {
        return false;
    }
    let distance = p.bth().psn().diff(next).unsigned_abs();
    let idle = c.acked.is_some_and(|(a, _)| a.next() == next);
    distance > NEW_CONNECTION_JUMP || (idle && distance > NEW_IDLE_CONNECTION_JUMP)
}

fn note_request(conn: &mut Conn, psn: Psn, r: Request) {
    if r.op == Operation::RdmaReadRequest {
        conn.reads.insert(
            psn.value(),
            ReadState {
                len: r.len,
                next: psn,
                bytes: 0,
                gap: false,
                packet: r.packet,
            },
        );
    }
    conn.requests.insert(psn.value(), r);
    if conn.requests.len() > 2 * KEPT_REQUESTS {
        if let Some(&first) = conn.requests.keys().next() {
            conn.requests.remove(&first);
        }
    }
}

/// Whether a response for `psn` may belong to `c`: a PSN it sent, or
/// near where it stands (a NAK names the next PSN; a response may run
/// ahead of what the capture saw sent).
fn answers(c: &Conn, psn: Psn) -> bool {
    c.requests.contains_key(&psn.value())
        || covers(c, psn)
        || c.next
            .is_some_and(|next| psn.diff(next).unsigned_abs() <= KEPT_REQUESTS as u32)
}

/// Whether a READ request of `c` covers `psn`.
fn covers(c: &Conn, psn: Psn) -> bool {
    read_covering(c, psn).is_some()
}

/// The first PSN of the READ request of `c` whose responses' PSNs hold
/// `psn`, if any.
fn read_covering(c: &Conn, psn: Psn) -> Option<Psn> {
    // Requests hold disjoint PSN ranges: only the nearest at or before
    // `psn` (the PSN space wrapping) can hold it.
    let nearest = c
        .requests
        .range(..=psn.value())
        .next_back()
        .or_else(|| c.requests.iter().next_back());
    let (&k, r) = nearest?;
    let start = Psn::new(k);
    // Where the path MTU is not known yet, the most responses the READ can
    // have: one per 256 bytes, the smallest.
    let most = r.span.unwrap_or_else(|| r.len.div_ceil(256).max(1));
    (r.op == Operation::RdmaReadRequest && psn.diff(start) >= 0 && psn.forward_from(start) < most)
        .then_some(start)
}

/// The last PSN of the READs and atomics sent right after `psn` (up to the
/// first other request, or the first whose span is unknown): `psn` if none.
fn reads_and_atomics_after(c: &Conn, psn: Psn) -> Psn {
    let Some(next) = c.next else { return psn };
    let mut end = psn;
    for _ in 0..KEPT_REQUESTS {
        let at = end.next();
        if !at.is_before(next) {
            break;
        }
        let Some(r) = c.requests.get(&at.value()) else {
            break;
        };
        let (true, Some(span)) = (answered_apart(r.op), r.span) else {
            break;
        };
        end = at.add(span - 1);
    }
    end
}

/// Whether a request is answered with responses of its own (not by a
/// plain ACK).
fn answered_apart(op: Operation) -> bool {
    matches!(
        op,
        Operation::RdmaReadRequest
            | Operation::FetchAdd
            | Operation::CompareSwap
            | Operation::Flush
            | Operation::AtomicWrite
    )
}

/// The messages that ended at PSNs after `from` through `to` (`None` if
/// some request there is unknown: a gap in what the capture shows), and
/// how many of them were READs or atomics.
fn messages_between(c: &Conn, from: Psn, to: Psn) -> (Option<u32>, u32) {
    let want = to.forward_from(from);
    let mut covered = 0u32;
    let mut ended = 0u32;
    let mut reads = 0u32;
    let mut at = from.next();
    // Walk the requests in PSN order from `from`.
    for _ in 0..want.min(1 << 20) {
        if covered >= want {
            break;
        }
        let Some(r) = c.requests.get(&at.value()) else {
            return (None, reads);
        };
        let span = match r.span {
            Some(s) => s,
            None => return (None, reads),
        };
        if r.ends {
            ended += 1;
            if answered_apart(r.op) {
                reads += 1;
            }
        }
        covered += span;
        at = at.add(span);
    }
    (Some(ended), reads)
}

fn read_response(
    conn: &mut Conn,
    n: u64,
    p: &IbPacket<&[u8]>,
    found: &mut Vec<(Vec<u64>, Rule, String)>,
) {
    let psn = p.bth().psn();
    let pos = p.info().position;
    let len = p.payload().len();
    // A FLUSH or ATOMIC WRITE is answered by an empty READ response ONLY at
    // its own PSN: not a READ's.
    if conn
        .requests
        .get(&psn.value())
        .is_some_and(|r| r.op != Operation::RdmaReadRequest)
    {
        return;
    }
    // The READ this answers: the latest at or before its PSN.
    let Some((&start, _)) = conn
        .reads
        .iter()
        .filter(|(&k, _)| psn.diff(Psn::new(k)) >= 0)
        .max_by_key(|(&k, _)| Psn::new(k).forward_from(psn.sub(Psn::HALF)))
    else {
        return;
    };
    let pmtu = conn.pmtu;
    if matches!(pos, Position::First | Position::Middle) {
        match pmtu {
            None if len.is_power_of_two() && (256..=MAX_PMTU).contains(&len) => {
                conn.pmtu = Some(len)
            }
            Some(m) if m != len => found.push((
                vec![n],
                Rule::ReadResponse,
                format!(
                    "a {} of {len} bytes where the path MTU is {m}",
                    p.info().name
                ),
            )),
            _ => {}
        }
    }
    let pmtu = conn.pmtu;
    let Some(r) = conn.reads.get_mut(&start) else {
        return;
    };
    let first = Psn::new(start);
    match pos {
        Position::First | Position::Only => {
            if psn != first {
                // A replay from the middle (answering a duplicate READ) is
                // judged as its own READ; this is one the request did not ask.
                found.push((
                    vec![r.packet, n],
                    Rule::ReadResponse,
                    format!(
                        "a {} at PSN {:#08x}, but the READ asked from {:#08x}",
                        p.info().name,
                        psn.value(),
                        first.value()
                    ),
                ));
                return;
            }
            r.next = psn.next();
            r.bytes = len as u64;
            r.gap = false;
        }
        Position::Middle | Position::Last => {
            if psn != r.next {
                r.gap = true;
            }
            r.next = psn.next();
            r.bytes += len as u64;
        }
    }
    if matches!(pos, Position::Last | Position::Only) && !r.gap {
        let want = u64::from(r.len);
        if r.bytes != want {
            found.push((
                vec![r.packet, n],
                Rule::ReadResponse,
                format!(
                    "the READ at PSN {:#08x} asked {want} bytes; its responses carried {}",
                    first.value(),
                    r.bytes
                ),
            ));
        } else if let Some(m) = pmtu {
            let count = psn.forward_from(first) + 1;
            let should = u32::try_from(want.div_ceil(m as u64).max(1)).unwrap_or(u32::MAX);
            if count != should {
                found.push((vec![r.packet, n], Rule::ReadResponse, format!(
                    "the READ at PSN {:#08x} of {want} bytes took {count} responses; a path MTU of {m} makes {should}",
                    first.value()
                )));
            }
        }
        r.gap = true; // judged
    }
}
