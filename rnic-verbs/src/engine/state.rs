//! What the engine's lock guards: the NIC, where its completions go, the
//! sockets it sends from, and the bookkeeping of the verbs that run under
//! the lock (queue pairs' spans and source ports, CQs released while still
//! in use), with the deadlines the engine thread wakes for.

use std::net::{IpAddr, UdpSocket};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;
use rnic_core::cq::CqHandle;
use rnic_core::time::Time;
use rnic_core::{Datagram, Nic};
use rnic_wire::icrc::IdDeltas;
use rustc_hash::FxHashMap as HashMap;

use super::hold::Hold;
use super::sockets::open_socket;
use super::{TapEvent, ROCE_PORT};

/// Where the engine sends asynchronous events: a plain channel
/// ([`Device::async_events`](crate::Device::async_events)), or a queue with
/// a descriptor ([`Device::async_event_queue`](crate::Device::async_event_queue)).
#[derive(Debug)]
pub(crate) enum EventSink {
    /// A channel.
    Channel(Sender<rnic_core::srq::AsyncEvent>),
    /// A queue whose descriptor it makes readable.
    Queue(crate::channel::Raise<rnic_core::srq::AsyncEvent>),
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
    pub(super) released_cqs: Vec<CqHandle>,
    /// The CQs [`EngineState::deliver`] looks at, reused.
    pub(super) pending_cqs: Vec<CqHandle>,
    pub tap: Option<Sender<TapEvent>>,
    /// Where asynchronous events go.
    pub events: Option<EventSink>,
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
    pub(super) scope: u32,
    /// The device's span: queue pairs' spans are its children, whichever
    /// thread runs them.
    pub span: tracing::Span,
    /// Datagrams waiting to be sent, reused.
    pub(super) tx: Vec<Datagram>,
    /// The impairment of this NIC's egress, if any (`impair`).
    pub impair: Option<crate::impair::Impairer>,
    /// Receive buffers, used by whichever thread holds the lock: receiving
    /// and handling a batch is one step, so datagrams are handled in the
    /// order they arrived.
    pub(super) rx: crate::udp::RecvBatch,
    /// Whether runs of datagrams go out as UDP GSO sends (see
    /// [`super::egress`]).
    pub gso: bool,
    /// The NIC's slot of its address or interface, and the other slots'
    /// packets it hands on.
    pub(crate) relay: super::relay::Relay,
    /// Datagrams per message of the run being sent, reused.
    pub(super) groups: Vec<usize>,
    /// The ICRC deltas for the last segment length sent.
    pub(super) gso_deltas: Option<IdDeltas>,
    /// Where datagrams leave past the kernel's IP and UDP layers, on a NIC
    /// that reads `lo` through a ring or on the frame transport (see
    /// [`crate::frames::FrameSender`]).
    pub(super) frame_tx: Option<crate::frames::FrameSender>,
    /// Datagrams sent through `frame_tx`, ever.
    pub(crate) frames_sent: u64,
    /// Where `frame_tx` may send to.
    pub(super) peers: super::egress::Peers,
    /// What is held back, and what the engine has learned of the
    /// program's answers (see [`Hold`]).
    pub(super) hold: Hold,
    /// The last poll (`Engine::progress`) took nothing in: the next asks
    /// for one message.
    pub(super) polled_dry: bool,
    /// Where the communication manager's events go.
    pub cm_routes: crate::cm::Routes,
    /// The queue pairs sending from each source-port socket
    /// [`EngineState::source_port`] opened: it is closed with the last.
    port_users: HashMap<(IpAddr, u16), u32>,
    /// The source-port socket each queue pair sends from.
    qp_ports: HashMap<u32, (IpAddr, u16)>,
    /// Source-port sockets no queue pair uses any more, closed once
    /// nothing waiting to be sent (an ACK held for an answer, say) leaves
    /// from them: the ICRC of such a datagram covers the port.
    retiring: Vec<(IpAddr, u16)>,
}

impl EngineState {
    /// What tells the NIC that receives this NIC's CM messages that it
    /// listens on `service`, for as long as it is held (see
    /// [`super::relay`]).
    pub(crate) fn listening_on(
        &self,
        service: u64,
    ) -> std::io::Result<std::os::unix::net::UnixDatagram> {
        self.relay.route(service)
    }

    /// The state of a NIC that sends from `send_sockets` (and the socket
    /// the engine owns), receives into `rx`, and shares its address or
    /// interface as `relay` says. It sends one datagram per message until
    /// told it may send runs of them as GSO sends ([`EngineState::gso`]).
    pub(super) fn new(
        nic: Nic,
        start: Instant,
        send_sockets: HashMap<(IpAddr, u16), UdpSocket>,
        scope: u32,
        span: tracing::Span,
        rx: crate::udp::RecvBatch,
        relay: super::relay::Relay,
    ) -> EngineState {
        EngineState {
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
            span,
            tx: Vec::with_capacity(crate::udp::BATCH),
            impair: None,
            rx,
            relay,
            gso: false,
            groups: Vec::with_capacity(crate::udp::BATCH),
            gso_deltas: None,
            frame_tx: None,
            frames_sent: 0,
            peers: Default::default(),
            hold: Hold::default(),
            polled_dry: false,
            cm_routes: crate::cm::Routes::default(),
            port_users: HashMap::default(),
            qp_ports: HashMap::default(),
            retiring: Vec::new(),
        }
    }

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
        self.release_source_port(qpn);
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
                self.port_users.insert((addr, port), 0);
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
        self.release_source_port(qpn);
        let Some((src, p)) = av
            .src
            .and_then(|src| Some((src, self.source_port(src, preferred)?)))
        else {
            return Ok(ROCE_PORT);
        };
        self.nic.set_qp_source_port(qpn, p)?;
        // Counted only on the sockets opened for queue pairs (port 4791
        // and QP1's stay whatever happens to queue pairs).
        if let Some(n) = self.port_users.get_mut(&(src, p)) {
            *n += 1;
            self.qp_ports.insert(qpn, (src, p));
            self.retiring.retain(|&k| k != (src, p));
        }
        Ok(p)
    }

    /// Close the source-port sockets no queue pair uses and nothing
    /// waiting to be sent leaves from.
    pub(super) fn close_retired(&mut self) {
        if self.retiring.is_empty() {
            return;
        }
        let waiting: Vec<(IpAddr, u16)> = self
            .nic
            .queued()
            .map(|d| (d.src, d.src_port))
            .filter(|k| self.retiring.contains(k))
            .collect();
        let mut retiring = std::mem::take(&mut self.retiring);
        retiring.retain(|k| {
            if waiting.contains(k) || self.port_users.get(k).is_some_and(|&n| n > 0) {
                return true;
            }
            self.port_users.remove(k);
            self.send_sockets.remove(k);
            false
        });
        self.retiring = retiring;
    }

    /// QP `qpn` no longer sends from its source-port socket: closed if it
    /// was the last to (a program that makes and ends connections keeps
    /// no socket per connection it ever had).
    fn release_source_port(&mut self, qpn: u32) {
        let Some(at) = self.qp_ports.remove(&qpn) else {
            return;
        };
        if let Some(n) = self.port_users.get_mut(&at) {
            *n = n.saturating_sub(1);
            if *n == 0 && !self.retiring.contains(&at) {
                self.retiring.push(at);
            }
        }
        self.close_retired();
    }

    /// The scope a socket address needs for `addr`: the interface's index
    /// for a link-local IPv6 address on the frame transport, else 0.
    pub(super) fn scope_of(&self, addr: IpAddr) -> u32 {
        scope_for(self.scope, addr)
    }

    /// Hand completions to their queues and events to their channel;
    /// how many completions went.
    pub(super) fn deliver(&mut self) -> usize {
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
            match &self.events {
                Some(EventSink::Channel(tx)) => {
                    let _ = tx.send(e);
                }
                Some(EventSink::Queue(q)) => q.raise(e),
                None => {}
            }
        }
        while let Some(e) = self.nic.poll_cm_event() {
            self.cm_routes.deliver(e);
        }
        total
    }

    /// Run the timers that are due, then send what they produced; whether
    /// any was.
    pub(super) fn run_due_timers(&mut self, socket: &UdpSocket) -> bool {
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
        [self.timer_deadline(), self.hold.due()]
            .into_iter()
            .flatten()
            .min()
    }

    /// [`EngineState::next_deadline`] but for what posts held back: the
    /// deadlines worth waking the engine thread for while it watches the
    /// socket.
    pub(super) fn timer_deadline(&self) -> Option<Time> {
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
    /// with more left, and was woken again, over and over while 1,000 QPs
    /// streamed (`rnic perf write -q 1000 -t 2`).
    pub(super) fn wake_deadline(&self) -> Option<Time> {
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
    pub(super) fn away_until(&self, bound: u64, pollers_about: bool) -> u64 {
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

    /// Now, on the engine's clock.
    pub fn now(&self) -> Time {
        since(self.start)
    }

    /// A post that sends something came (see [`Hold::posted`]).
    pub(super) fn posted(&mut self) {
        let start = self.start;
        self.hold.posted(|| since(start));
    }

    /// Whether what the NIC has queued may wait for a poller's next call
    /// (the engine thread has left the socket to pollers: `away`): a few
    /// datagrams, with nothing left to build and no impairment to time.
    pub(super) fn may_hold(&self) -> bool {
        self.impair.is_none()
            && self
                .nic
                .queued_datagrams()
                .is_some_and(|n| n < crate::udp::BATCH)
    }

    /// Whether what the NIC has queued is plain ACKs alone, few enough to
    /// hold (see [`EngineState::may_hold`]).
    pub(super) fn only_acks_queued(&self) -> bool {
        self.may_hold()
            && self.nic.queued_datagrams() != Some(0)
            && self.nic.queued().all(Datagram::is_plain_ack)
    }

    /// Leave what the NIC has queued for the next poll (the caller
    /// delivers the completions).
    pub(super) fn hold_queued(&mut self) {
        let now = self.now();
        let queued = self.nic.queued_datagrams() != Some(0);
        let only_acks = self.only_acks_queued();
        self.hold.hold(now, queued, only_acks);
    }
}

/// The scope a socket address needs for `addr` on a NIC whose link-local
/// addresses are scoped to `scope` (see [`EngineState::scope_of`]).
pub(super) fn scope_for(scope: u32, addr: IpAddr) -> u32 {
    if crate::frames::link_local(addr) {
        scope
    } else {
        0
    }
}

/// The engine's clock: the time since `start`.
pub(super) fn since(start: Instant) -> Time {
    Time(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX))
}
