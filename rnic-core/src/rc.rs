//! A reliable connected queue pair: the state its requester (`req`), completer
//! (`comp`) and responder (`resp`) share, and what they share with the NIC.

use core::net::IpAddr;
use std::collections::VecDeque;

use rnic_wire::{aeth, bth, icrc, IbRepr, Psn};
use smallvec::SmallVec;

use crate::counters::Counters;
use crate::cq::{CqHandle, CqTable};
use crate::datagram::{Datagram, Header};
use crate::mem::{Access, MemError, Memory, PdHandle};
use crate::pool::BufferPool;
use crate::qp::{QpAttr, QpState, QpType};
use crate::srq::{AsyncEvent, Srq, SrqHandle};
use crate::time::Time;
use crate::wr::{Completion, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus};

/// Transport mechanisms that can be switched off, to watch what breaks without
/// them (in the simulator: a property test shows the invariant they protect
/// failing). All are on by default; never switch them off on a real network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mechanisms {
    /// The responder recognises requests older than the expected PSN as
    /// duplicates. Off, it executes them again.
    pub duplicate_detection: bool,
    /// The responder answers a duplicate atomic from its replay cache. Off, it
    /// executes the atomic again.
    pub atomic_replay_cache: bool,
}

impl Default for Mechanisms {
    fn default() -> Mechanisms {
        Mechanisms {
            duplicate_detection: true,
            atomic_replay_cache: true,
        }
    }
}

/// What a QP needs from the NIC while it handles an event.
pub(crate) struct Ctx<'a> {
    pub now: Time,
    /// The NIC's addresses, its own first.
    pub addrs: &'a [IpAddr],
    pub mem: &'a mut Memory,
    pub cqs: &'a mut CqTable,
    pub tx: &'a mut crate::txq::TxQueue,
    pub counters: &'a mut Counters,
    pub exec_log: &'a mut Option<Vec<Execution>>,
    pub mechanisms: Mechanisms,
    pub src_port: Option<u16>,
    pub srqs: &'a mut Vec<Option<Srq>>,
    pub events: &'a mut VecDeque<AsyncEvent>,
    /// QPs with responses waiting to be generated ([`Qp::responses`]), in
    /// the order they are served.
    pub busy: &'a mut VecDeque<u32>,
    /// CQs that overran during this event; the NIC moves their QPs to error.
    pub overrun_cqs: &'a mut Vec<CqHandle>,
    /// Buffers to build packets in ([`crate::Nic::recycle`]).
    pub pool: &'a mut BufferPool,
    /// Packets every QP together has unacknowledged, the sum of
    /// [`Qp::counted`]: at most [`NIC_INFLIGHT_PKTS`] leaves room to send.
    pub inflight: &'a mut u32,
    /// QPs held back by the NIC's budget, in the order they go on.
    pub starved: &'a mut VecDeque<u32>,
    /// The NIC's timers: a QP that sets a deadline adds it here.
    pub timers: &'a mut Timers,
}

/// Deadlines of QPs, earliest first: (when, QP number). A QP holds one
/// entry, no later than its deadlines ([`Qp::timer_at`]): setting a
/// deadline adds an entry only if it is earlier than the one it holds (a
/// re-armed ACK timer moves later, and adds none). The NIC moves an entry
/// that comes up early to the QP's deadline, and drops one whose QP is gone
/// or has none, so no event walks every QP and an ACK costs no heap push.
pub(crate) type Timers = std::collections::BinaryHeap<core::cmp::Reverse<(Time, u32)>>;

impl Ctx<'_> {
    /// Hand a datagram to the transmit queue; its sequence number there.
    pub fn send(&mut self, d: Datagram) -> u64 {
        self.counters.sent_pkts += 1;
        self.tx.push(d)
    }

    /// Take datagram `seq` back out of the transmit queue if it is still
    /// there (see [`crate::txq`]); whether it was.
    pub fn withdraw(&mut self, seq: u64) -> bool {
        let Some(buf) = self.tx.withdraw(seq) else {
            return false;
        };
        self.counters.sent_pkts -= 1;
        self.pool.keep(buf);
        true
    }

    pub fn complete(&mut self, cq: CqHandle, c: Completion) {
        if self.cqs.complete(cq, c) {
            self.events.push_back(AsyncEvent::CqError(cq));
            self.overrun_cqs.push(cq);
        }
    }
}

/// A request the responder carried out, recorded for the simulator's checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    /// The responder's QP.
    pub qpn: u32,
    /// PSN of the request (its first packet).
    pub psn: Psn,
    /// What was done.
    pub kind: ExecKind,
}

/// What the responder did for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecKind {
    /// A SEND delivered into a receive buffer.
    Send {
        /// The payload.
        data: Vec<u8>,
    },
    /// An RDMA WRITE.
    Write {
        /// Target address.
        va: u64,
        /// The bytes written.
        data: Vec<u8>,
    },
    /// An RDMA READ (or a re-execution of a duplicate).
    Read {
        /// Source address.
        va: u64,
        /// Length read.
        len: u64,
        /// Whether this re-executed a duplicate request.
        duplicate: bool,
    },
    /// A FLUSH of `len` bytes at `va` (the whole range it covered).
    Flush {
        /// Start address.
        va: u64,
        /// Length.
        len: u64,
    },
    /// An atomic, executed once; duplicates are answered from the cache.
    Atomic {
        /// Target address.
        va: u64,
        /// The value found.
        orig: u64,
        /// The value left.
        new: u64,
    },
}

/// A send work request in the send queue.
#[derive(Debug)]
pub(crate) struct SendWqe {
    pub wr: SendWr,
    pub len: u64,
    pub first_psn: Psn,
    /// PSNs the request occupies (packets, or READ response packets).
    pub npkts: u32,
    /// READ: response packets received in order so far.
    pub resp_done: u32,
    /// READ: the response packet the latest READ request (first or
    /// re-issued) asked from; its answer begins there.
    pub read_start: u32,
    pub status: Option<WcStatus>,
}

impl SendWqe {
    /// The last PSN it occupies (a local operation occupies none: its first).
    pub fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts.saturating_sub(1))
    }
    /// Whether `psn` is one of this request's PSNs.
    pub fn covers(&self, psn: Psn) -> bool {
        psn.forward_from(self.first_psn) < self.npkts
    }
}

/// A message the responder is in the middle of.
#[derive(Debug)]
pub(crate) enum InMsg {
    Send {
        recv: RecvWr,
        offset: u64,
        first_psn: Psn,
        data: Vec<u8>,
    },
    Write {
        va: u64,
        rkey: u32,
        remaining: u64,
        first_psn: Psn,
        /// The bytes (kept only when executions are recorded).
        data: Vec<u8>,
        start_va: u64,
        /// The RETH's DMA length: a WRITE_WITH_IMM's receive reports it.
        length: u64,
    },
}

/// A READ or atomic the responder keeps for duplicates (max_dest_rd_atomic entries).
#[derive(Debug, Clone, Copy)]
pub(crate) enum RdAtomic {
    Read {
        psn: Psn,
        npkts: u32,
        /// What it asked for: a duplicate may ask for part of it, never more.
        va: u64,
        len: u64,
        rkey: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
    /// ATOMIC_WRITE and FLUSH: answered by an empty READ response.
    Placed {
        psn: Psn,
        msn: u32,
    },
}

/// A READ response being generated, a packet at a time, as the transmit
/// queue takes them: its state is the same few words whatever the READ's
/// length.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadStream {
    /// The READ's first PSN: the responder resource it belongs to.
    pub origin: Psn,
    /// PSN of the next response packet.
    pub psn: Psn,
    /// Where the next packet's payload starts, and the bytes still to send.
    pub va: u64,
    pub remaining: u64,
    pub rkey: u32,
    /// Whether the next packet is the response's first (FIRST or ONLY).
    pub first: bool,
    pub msn: u32,
    /// A duplicate READ answered again: it holds no resource of its own
    /// (see `read_reply`).
    pub again: bool,
}

/// A response the responder owes, in PSN order.
#[derive(Debug)]
pub(crate) enum Response {
    /// READ response packets still to generate.
    Read(ReadStream),
    /// A response built while a READ response was ahead of it.
    Ready { d: Datagram, plain_ack: bool },
}

/// Responses (other than READ streams) one QP may hold behind a READ
/// response being generated.
pub(crate) const MAX_QUEUED_RESPONSES: usize = 64;

/// Queue pair capacities (`ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send WR.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive WR.
    pub max_recv_sge: u32,
}

impl Default for QpCaps {
    fn default() -> QpCaps {
        QpCaps {
            max_send_wr: 1024,
            max_recv_wr: 1024,
            max_send_sge: 16,
            max_recv_sge: 16,
        }
    }
}

/// The largest number of packets a requester has unacknowledged at once.
pub(crate) const MAX_INFLIGHT_PKTS: u32 = 1024;

/// Datagrams the NIC's transmit queue holds at most before a requester
/// stops building more and waits in the busy list ([`Qp::mark_busy`]) for
/// the transport to take them: a window of 1,024 packets is not built (and
/// its buffers allocated) ahead of the socket, and what other QPs send
/// waits behind at most this many.
pub(crate) const REQUEST_BURST: usize = 32;

/// Packets a requester may have unacknowledged after a local ACK timeout,
/// until the responder is heard from again. A timeout says the path or the
/// responder could not take the last window; resending all of it at once
/// (up to `MAX_INFLIGHT_PKTS`) to a responder that is merely slow (an
/// emulated CPU behind a full queue) loses its head again behind the tail
/// of the last burst, and the retries run out while the link is up. Each
/// acknowledged packet opens the window by one, doubling it every round
/// trip, as TCP opens its congestion window after a retransmission timeout;
/// any other loss halves the window, to no less than this.
pub(crate) const RECOVERY_WINDOW: u32 = 16;

/// The largest number of packets all of a NIC's requesters together have
/// unacknowledged at once: one QP's window. Without it, a thousand QPs with
/// two 64 KiB WRITEs each in flight put 32,000 packets on the way at once,
/// far more than the receiving socket holds (about 1,000 of 4 KiB): most
/// were dropped and resent, and the aggregate fell to half of one QP's. A
/// QP the budget holds back waits in [`Ctx::starved`], and the NIC lets it
/// go on, in turn, as acknowledgements free room.
pub(crate) const NIC_INFLIGHT_PKTS: u32 = MAX_INFLIGHT_PKTS;

/// Inside a long message, every this many packets asks for an ACK (as
/// rdma_rxe does every 64): without it a message longer than the in-flight
/// window would wait for an ACK nobody was asked for, time out, and resend
/// the same window until the retries ran out.
pub(crate) const ACK_EVERY: u32 = 64;

/// A connected queue pair, reliable (RC) or unreliable (UC).
#[derive(Debug)]
pub(crate) struct Qp {
    pub qpn: u32,
    pub qp_type: QpType,
    pub pd: PdHandle,
    pub send_cq: CqHandle,
    pub recv_cq: CqHandle,
    pub caps: QpCaps,
    pub attr: QpAttr,

    // Requester and completer.
    pub sq: VecDeque<SendWqe>,
    /// PSN the next new request gets.
    pub sq_psn: Psn,
    /// Index in `sq` of the request being sent, and its next packet.
    pub next_wqe: usize,
    pub next_pkt: u32,
    /// Oldest PSN not yet acknowledged.
    pub una: Psn,
    /// The PSN after the furthest packet sent (READs count all their responses).
    pub max_sent: Psn,
    pub retry_left: u8,
    pub rnr_left: u8,
    pub ack_deadline: Option<Time>,
    pub rnr_until: Option<Time>,
    /// The time of this QP's entry in the NIC's timers, if it has one: no
    /// later than either deadline while it has one ([`Qp::schedule`]).
    pub timer_at: Option<Time>,
    /// A go-back-N retransmission is under way (a sequence NAK, a READ gap
    /// or a timeout started it); until the responder is seen to progress, a
    /// NAK or gap does not start another.
    pub retry_started: bool,
    /// Packets that may be unacknowledged now: `MAX_INFLIGHT_PKTS`, less
    /// after a loss (halved, at least [`RECOVERY_WINDOW`]; that after a
    /// local ACK timeout), and one more for every packet acknowledged: it
    /// doubles in a round trip without loss, as TCP's window does in slow
    /// start; a round trip that takes too long shrinks it and slows its
    /// growth ([`Qp::round_trip`]). `heard_una` is `una` when the window
    /// last grew.
    pub window: u32,
    pub heard_una: Psn,
    /// The round trip being timed: the PSN whose acknowledgement ends it
    /// (the one after a packet sent for the first time), when that packet
    /// left, and how many packets were unacknowledged then. One at a time;
    /// dropped when a retransmission starts (an ACK after it may answer
    /// either copy, as Karn's rule says).
    pub rtt_probe: Option<(Psn, Time, u32)>,
    /// The last round trip took more than half the delay target: the
    /// window grows by a packet per acknowledgement, not by each packet
    /// acknowledged.
    pub delay_high: bool,
    /// What this QP adds to the NIC's [`Ctx::inflight`]: its unacknowledged
    /// packets when it last sent or heard, 0 outside RTS and SQD.
    pub counted: u32,
    /// Waiting in [`Ctx::starved`].
    pub starved: bool,
    /// End-to-end credits (IBTA 9.7.7.2, as rdmavt keeps them): the
    /// sequence number of the last message begun (SSN, counted as the
    /// responder counts its MSN, 24 bits that wrap), and the limit the
    /// responder's ACKs allow (LSN = MSN + credits). A message that takes
    /// a receive WQE begins only while its SSN is at most LSN + 1 (one
    /// beyond the limit, to learn a new count), or with nothing
    /// outstanding; one that takes none moves the limit on by one.
    pub ssn: Psn,
    pub lsn: Psn,
    /// The responder sent the "invalid" credit code: it keeps no count
    /// (rdma_rxe, a QP on a shared receive queue). Sticky until reset.
    pub credits_unlimited: bool,
    /// Waiting for credits now (counted once per wait).
    pub credit_wait: bool,

    // Responder.
    pub rq: VecDeque<RecvWr>,
    pub epsn: Psn,
    /// The PSN after the last SEND or WRITE packet executed: what a
    /// duplicate's re-ACK names (READs and atomics are answered by their
    /// own responses, never covered by a plain ACK).
    pub ack_psn: Psn,
    pub msn: u32,
    pub in_msg: Option<InMsg>,
    pub seq_nak_sent: bool,
    pub rd_atomic: VecDeque<RdAtomic>,
    /// Responses owed, in PSN order, generated as the transmit queue takes them.
    pub responses: VecDeque<Response>,
    /// Whether the QP is in the NIC's busy list.
    pub busy: bool,
    /// In SQD: the send queue has drained (and the event, if asked for, is raised).
    pub sq_drained: bool,
    /// Reused for the payload of each packet sent, to spare an allocation.
    pub scratch: Vec<u8>,
    /// The shared receive queue this QP takes receives from, if any.
    pub srq: Option<SrqHandle>,
    /// The UDP source port this QP's packets carry, if the driver chose one.
    pub src_port: Option<u16>,
    /// The transmit queue's number for the last plain ACK this QP queued
    /// there ([`crate::txq`]): a newer one withdraws it if it has not left.
    pub queued_ack: Option<u64>,
}

impl Qp {
    pub fn new(
        qpn: u32,
        qp_type: QpType,
        pd: PdHandle,
        send_cq: CqHandle,
        recv_cq: CqHandle,
        caps: QpCaps,
    ) -> Qp {
        Qp {
            qpn,
            qp_type,
            pd,
            send_cq,
            recv_cq,
            caps,
            attr: QpAttr::default(),
            sq: VecDeque::new(),
            sq_psn: Psn::new(0),
            next_wqe: 0,
            next_pkt: 0,
            una: Psn::new(0),
            max_sent: Psn::new(0),
            retry_left: 0,
            rnr_left: 0,
            ack_deadline: None,
            rnr_until: None,
            timer_at: None,
            retry_started: false,
            window: MAX_INFLIGHT_PKTS,
            heard_una: Psn::new(0),
            rtt_probe: None,
            delay_high: false,
            counted: 0,
            starved: false,
            ssn: Psn::new(0),
            lsn: Psn::new(0),
            credits_unlimited: false,
            credit_wait: false,
            rq: VecDeque::new(),
            epsn: Psn::new(0),
            ack_psn: Psn::new(0),
            msn: 0,
            in_msg: None,
            seq_nak_sent: false,
            rd_atomic: VecDeque::new(),
            responses: VecDeque::new(),
            busy: false,
            sq_drained: false,
            scratch: Vec::new(),
            srq: None,
            src_port: None,
            queued_ack: None,
        }
    }

    /// The index in `sq` of the unfinished request that holds `psn`.
    pub fn pending_wqe(&self, psn: Psn) -> Option<usize> {
        self.sq
            .iter()
            .position(|w| w.status.is_none() && w.covers(psn))
    }

    /// The receive completion for receive `wr_id` with `status`, carrying
    /// nothing yet (no bytes, no immediate): what a flushed or refused
    /// receive reports, and what a delivered one starts from.
    pub fn recv_completion(&self, wr_id: u64, status: WcStatus) -> Completion {
        Completion {
            wr_id,
            status,
            opcode: WcOpcode::Recv,
            byte_len: 0,
            imm_data: None,
            qp_num: self.qpn,
            src_qp: None,
            invalidated_rkey: None,
            network: None,
        }
    }

    /// The send completion for `w` with `status`. Where verbs leaves a
    /// field open, it is what rdma_rxe and mlx5 report: on success
    /// `byte_len` is the message's length (8 for the two atomics, whose
    /// data is their 8-byte answer), and a request that carried immediate
    /// data says so (IBV_WC_WITH_IMM); an error completion carries neither.
    pub fn send_completion(&self, w: &SendWqe, status: WcStatus) -> Completion {
        let ok = status == WcStatus::Success;
        Completion {
            wr_id: w.wr.wr_id,
            status,
            opcode: w.wr.op.wc_opcode(),
            byte_len: match w.wr.op {
                _ if !ok => 0,
                SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => 8,
                _ => w.len as u32,
            },
            imm_data: w.wr.op.imm().filter(|_| ok),
            qp_num: self.qpn,
            src_qp: None,
            invalidated_rkey: None,
            network: None,
        }
    }

    /// The next receive: from the QP's own queue, or its shared one.
    pub fn take_recv(&mut self, ctx: &mut Ctx<'_>) -> Option<RecvWr> {
        match self.srq {
            None => self.rq.pop_front(),
            Some(h) => {
                let srq = ctx.srqs.get_mut(h.0 as usize)?.as_mut()?;
                let (r, event) = srq.take(h);
                ctx.events.extend(event);
                r
            }
        }
    }

    /// Put back a receive taken for a message that was dropped: first in line.
    pub fn return_recv(&mut self, ctx: &mut Ctx<'_>, r: RecvWr) {
        match self
            .srq
            .and_then(|h| ctx.srqs.get_mut(h.0 as usize))
            .and_then(Option::as_mut)
        {
            Some(srq) => srq.queue.push_front(r),
            None => self.rq.push_front(r),
        }
    }

    /// Receives waiting for this QP.
    pub fn recvs_available(&self, ctx: &Ctx<'_>) -> usize {
        match self
            .srq
            .and_then(|h| ctx.srqs.get(h.0 as usize))
            .and_then(Option::as_ref)
        {
            Some(srq) => srq.queue.len(),
            None => self.rq.len(),
        }
    }

    /// Unreliable connected: no ACKs, no retransmission.
    pub fn is_uc(&self) -> bool {
        self.qp_type == QpType::Uc
    }

    pub fn state(&self) -> QpState {
        self.attr.qp_state
    }

    pub fn pmtu(&self) -> u64 {
        self.attr.path_mtu.bytes() as u64
    }

    /// From where to where a connected QP's packets go: its source address
    /// and its peer's.
    fn route(&self, ctx: &Ctx<'_>) -> Option<(IpAddr, IpAddr)> {
        let av = self.attr.ah_attr?;
        Some((av.src.unwrap_or(ctx.addrs[0]), av.dest))
    }

    /// Emit one IB packet to the connected peer.
    pub fn transmit(&self, ctx: &mut Ctx<'_>, ib: &IbRepr, payload: &[u8]) {
        if let Some(route) = self.route(ctx) {
            self.transmit_to(ctx, route, ib, payload);
        }
    }

    /// [`Qp::transmit`] with the payload written in place by `fill`; an
    /// error from `fill` sends nothing and is handed back.
    pub fn transmit_with<E>(
        &self,
        ctx: &mut Ctx<'_>,
        ib: &IbRepr,
        fill: impl FnOnce(&Memory, &mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        match self.route(ctx) {
            Some(route) => self.transmit_to_with(ctx, route, ib, fill),
            None => Ok(()),
        }
    }

    /// [`Qp::transmit_to`] with the payload written in place by `fill`.
    pub fn transmit_to_with<E>(
        &self,
        ctx: &mut Ctx<'_>,
        route: (IpAddr, IpAddr),
        ib: &IbRepr,
        fill: impl FnOnce(&Memory, &mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        if let Some(d) = self.build_datagram_with(ctx, route, ib, fill)? {
            ctx.send(d);
        }
        Ok(())
    }

    /// Emit one IB packet from `route.0` to `route.1`.
    pub fn transmit_to(
        &self,
        ctx: &mut Ctx<'_>,
        route: (IpAddr, IpAddr),
        ib: &IbRepr,
        payload: &[u8],
    ) {
        if let Some(d) = self.build_datagram(ctx, route, ib, payload) {
            ctx.send(d);
        }
    }

    /// Emit a response (ACK, NAK, atomic ACK, empty READ response) to the
    /// connected peer in PSN order: while a READ response is still being
    /// generated, it waits behind it. Consecutive plain ACKs waiting there
    /// coalesce (each acknowledges everything before it), and so does a
    /// plain ACK with the last one still in the transmit queue; beyond
    /// [`MAX_QUEUED_RESPONSES`] a response is dropped and counted, which RC
    /// recovers from as from a lost packet.
    pub fn respond(&mut self, ctx: &mut Ctx<'_>, ib: &IbRepr, payload: &[u8]) {
        let plain_ack = ib.bth.opcode == rnic_wire::Opcode::RC_ACKNOWLEDGE
            && matches!(
                ib.aeth.map(|a| a.syndrome),
                Some(aeth::Syndrome::Ack { .. })
            );
        let Some(route) = self.route(ctx) else {
            return;
        };
        let Some(d) = self.build_datagram(ctx, route, ib, payload) else {
            return;
        };
        if self.responses.is_empty() {
            if !plain_ack {
                ctx.send(d);
                return;
            }
            // The ACK this QP queued before, if it has not left yet, is
            // said again by this one (coalescing, see `crate::txq`).
            if self.queued_ack.take().is_some_and(|seq| ctx.withdraw(seq)) {
                ctx.counters.acks_coalesced += 1;
            }
            self.queued_ack = Some(ctx.send(d));
            return;
        }
        if let Some(Response::Ready {
            d: last,
            plain_ack: true,
        }) = self.responses.back_mut()
        {
            if plain_ack {
                *last = d;
                return;
            }
        }
        let ready = self
            .responses
            .iter()
            .filter(|r| matches!(r, Response::Ready { .. }))
            .count();
        if ready >= MAX_QUEUED_RESPONSES {
            ctx.counters.responses_dropped += 1;
            return;
        }
        self.responses.push_back(Response::Ready { d, plain_ack });
    }

    /// One IB packet from `src` to `dest` as a datagram, its ICRC computed.
    fn build_datagram(
        &self,
        ctx: &mut Ctx<'_>,
        route: (IpAddr, IpAddr),
        ib: &IbRepr,
        payload: &[u8],
    ) -> Option<Datagram> {
        let copy = |_: &Memory, p: &mut [u8]| {
            p.copy_from_slice(payload);
            Ok::<(), core::convert::Infallible>(())
        };
        match self.build_datagram_with(ctx, route, ib, copy) {
            Ok(d) => d,
            Err(never) => match never {},
        }
    }

    /// [`Qp::build_datagram`] with the payload written in place by `fill`
    /// (from the NIC's memory, say): no copy of it anywhere else first. An
    /// error from `fill` sends nothing and is handed back.
    fn build_datagram_with<E>(
        &self,
        ctx: &mut Ctx<'_>,
        (src, dest): (IpAddr, IpAddr),
        ib: &IbRepr,
        fill: impl FnOnce(&Memory, &mut [u8]) -> Result<(), E>,
    ) -> Result<Option<Datagram>, E> {
        let need = ib.buffer_len();
        let mut buf = ctx.pool.take();
        // A recycled buffer keeps its length: every byte of the packet is
        // written below (headers, the payload by `fill`, pad and ICRC), so
        // only what it grows by needs zeroing first.
        if buf.len() >= need {
            buf.truncate(need);
        } else {
            buf.resize(need, 0);
        }
        let mem = &*ctx.mem;
        let mut filled = Ok(());
        if ib.emit_with(&mut buf, |p| filled = fill(mem, p)).is_err() {
            ctx.counters.send_err += 1;
            return Ok(None);
        }
        if let Err(e) = filled {
            ctx.pool.keep(buf);
            return Err(e);
        }
        let src_port = self.src_port.or(ctx.src_port).unwrap_or_else(|| {
            rnic_wire::encap::udp::rxe_src_port(self.qpn, self.attr.dest_qp_num)
        });
        let n = buf.len();
        match icrc::for_udp(src, dest, src_port, &buf[..n - 4]) {
            Ok(crc) => buf[n - 4..].copy_from_slice(&crc.to_le_bytes()),
            Err(_) => {
                ctx.counters.send_err += 1;
                return Ok(None);
            }
        }
        Ok(Some(Datagram {
            src,
            dst: dest,
            src_port,
            payload: buf,
            header: Some(Header::of(ib)),
            ipv4_id: 0,
        }))
    }

    /// Put the QP in the NIC's busy list (once): it has READ responses or
    /// requests to build when the transport takes what is queued
    /// ([`crate::Nic::generate_burst`]).
    pub(crate) fn mark_busy(&mut self, ctx: &mut Ctx<'_>) {
        if !self.busy {
            self.busy = true;
            ctx.busy.push_back(self.qpn);
        }
    }

    /// A BTH to the peer QP.
    pub fn bth(&self, opcode: rnic_wire::Opcode, psn: Psn) -> bth::Repr {
        bth::Repr::new(opcode, self.attr.dest_qp_num, psn)
    }

    /// An ACK (or NAK) with `syndrome` for `psn`.
    pub fn send_ack(&mut self, ctx: &mut Ctx<'_>, syndrome: aeth::Syndrome, psn: Psn) {
        match syndrome {
            aeth::Syndrome::Nak(aeth::NakCode::InvalidRequest) => {
                ctx.counters.nak_invalid_request_sent += 1;
            }
            aeth::Syndrome::Nak(aeth::NakCode::RemoteAccessError) => {
                ctx.counters.nak_remote_access_sent += 1;
            }
            aeth::Syndrome::Nak(aeth::NakCode::RemoteOperationalError) => {
                ctx.counters.nak_remote_op_sent += 1;
            }
            _ => {}
        }
        let mut ib = IbRepr::new(self.bth(rnic_wire::Opcode::RC_ACKNOWLEDGE, psn));
        ib.aeth = Some(aeth::Repr {
            syndrome,
            msn: self.msn & 0xFF_FFFF,
        });
        self.respond(ctx, &ib, &[]);
    }

    /// The ACK syndrome with this QP's receive credits. A QP on a shared
    /// receive queue advertises none (IBTA 10.2.9.5: credits are per QP).
    pub fn ack_syndrome(&self, ctx: &Ctx<'_>) -> aeth::Syndrome {
        if self.srq.is_some() {
            return aeth::Syndrome::ACK_NO_CREDITS;
        }
        aeth::Syndrome::Ack {
            credits: aeth::encode_credits(self.recvs_available(ctx) as u32),
        }
    }

    /// Enter the error state: every outstanding work request completes with
    /// WR_FLUSH_ERR (the one that failed has already completed with its error).
    pub fn enter_error(&mut self, ctx: &mut Ctx<'_>) {
        self.attr.qp_state = QpState::Err;
        self.attr.cur_qp_state = QpState::Err;
        self.flush(ctx);
        self.recount(ctx);
    }

    /// Back to RESET (`rxe_qp_reset`): the queues are emptied without a
    /// completion, so a CQ that lives on sees nothing stale from this QP,
    /// and the transport starts afresh. A receive taken from a shared queue
    /// for a message in progress goes back to that queue.
    pub fn reset(&mut self, ctx: &mut Ctx<'_>) {
        if let Some(InMsg::Send { recv, .. }) = self.in_msg.take() {
            if self.srq.is_some() {
                self.return_recv(ctx, recv);
            }
        }
        let mut fresh = Qp::new(
            self.qpn,
            self.qp_type,
            self.pd,
            self.send_cq,
            self.recv_cq,
            self.caps,
        );
        fresh.attr = self.attr;
        fresh.srq = self.srq;
        fresh.src_port = self.src_port;
        // Still in the NIC's busy list if it was: keep the flag saying so,
        // or a new response would add it a second time.
        fresh.busy = self.busy;
        // Likewise in the starved list; and what it had in flight is gone.
        fresh.starved = self.starved;
        *ctx.inflight = ctx.inflight.saturating_sub(self.counted);
        *self = fresh;
    }

    /// A request posted to a QP in the error state completes at once, flushed.
    pub fn flush_one(&self, ctx: &mut Ctx<'_>, wr: &SendWr) {
        ctx.complete(
            self.send_cq,
            Completion {
                wr_id: wr.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: wr.op.wc_opcode(),
                byte_len: 0,
                imm_data: None,
                qp_num: self.qpn,
                src_qp: None,
                invalidated_rkey: None,
                network: None,
            },
        );
    }

    /// Send queue error (UC and UD, IBTA 10.3.1): a send request failed
    /// before reaching the wire. It has its error completion; the requests
    /// after it are flushed; the receive side goes on. `modify_qp` to RTS
    /// resumes sending.
    pub fn enter_sqe(&mut self, ctx: &mut Ctx<'_>) {
        self.attr.qp_state = QpState::Sqe;
        self.attr.cur_qp_state = QpState::Sqe;
        self.flush_send(ctx);
    }

    fn flush_send(&mut self, ctx: &mut Ctx<'_>) {
        self.ack_deadline = None;
        self.rnr_until = None;
        for w in std::mem::take(&mut self.sq) {
            let status = w.status.unwrap_or(WcStatus::WrFlushErr);
            if status != WcStatus::Success || w.wr.signaled {
                ctx.complete(self.send_cq, self.send_completion(&w, status));
            }
        }
        self.next_wqe = 0;
        self.next_pkt = 0;
        self.una = self.sq_psn;
        self.max_sent = self.sq_psn;
    }

    /// Flush both queues with WR_FLUSH_ERR. Responses still owed for
    /// requests accepted before the error (READ responses, and the NAK
    /// behind them that caused it) are still sent, in order; RESET drops them.
    pub fn flush(&mut self, ctx: &mut Ctx<'_>) {
        self.flush_send(ctx);
        if let Some(InMsg::Send { recv, .. }) = self.in_msg.take() {
            self.return_recv(ctx, recv);
        }
        for r in std::mem::take(&mut self.rq) {
            let c = self.recv_completion(r.wr_id, WcStatus::WrFlushErr);
            ctx.complete(self.recv_cq, c);
        }
    }
}

/// Bytes in a scatter/gather list (saturating).
pub(crate) fn sg_len(sgl: &[Sge]) -> u64 {
    sgl.iter().map(|s| u64::from(s.length)).sum()
}

/// A send work request's data from `offset`, `out.len()` bytes of it: the
/// bytes posted inline, or its gather list read through the L_Keys.
pub(crate) fn gather_wr(
    mem: &Memory,
    pd: PdHandle,
    wr: &SendWr,
    offset: u64,
    out: &mut [u8],
) -> Result<(), MemError> {
    match &wr.inline {
        Some(data) => {
            let at = offset as usize;
            out.copy_from_slice(&data[at..at + out.len()]);
            Ok(())
        }
        None => gather(mem, pd, &wr.sg_list, offset, out),
    }
}

/// Gather `out.len()` bytes starting `offset` bytes into `sgl`.
fn gather(
    mem: &Memory,
    pd: PdHandle,
    sgl: &[Sge],
    mut offset: u64,
    out: &mut [u8],
) -> Result<(), MemError> {
    let mut done = 0usize;
    for sge in sgl {
        let len = u64::from(sge.length);
        if offset >= len {
            offset -= len;
            continue;
        }
        let take = ((len - offset) as usize).min(out.len() - done);
        let span = mem.check(sge.lkey, pd, sge.addr + offset, take as u64, Access::NONE)?;
        mem.read(span, &mut out[done..done + take]);
        done += take;
        offset = 0;
        if done == out.len() {
            break;
        }
    }
    // (A list shorter than the request cannot be posted; were it, what it
    // leaves is zero, not what a reused buffer held.)
    out[done..].fill(0);
    Ok(())
}

/// Scatter `data` starting `offset` bytes into `sgl`, which needs LOCAL_WRITE.
/// Every SGE touched is checked before any byte is written.
pub(crate) fn scatter(
    mem: &mut Memory,
    pd: PdHandle,
    sgl: &[Sge],
    offset: u64,
    data: &[u8],
) -> Result<(), MemError> {
    // As many spans as SGEs touched; a list that fits in a request fits here.
    let mut spans: SmallVec<[_; 4]> = SmallVec::new();
    let mut off = offset;
    let mut done = 0usize;
    for sge in sgl {
        if done == data.len() {
            break;
        }
        let len = u64::from(sge.length);
        if off >= len {
            off -= len;
            continue;
        }
        let take = ((len - off) as usize).min(data.len() - done);
        let span = mem.check(
            sge.lkey,
            pd,
            sge.addr + off,
            take as u64,
            Access::LOCAL_WRITE,
        )?;
        spans.push((span, done, take));
        done += take;
        off = 0;
    }
    for (span, at, take) in spans {
        mem.write(span, &data[at..at + take]);
    }
    Ok(())
}
