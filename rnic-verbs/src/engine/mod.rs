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
//! (see [`egress`]; a receiver accepts 0 to 63). A peer that
//! puts its own IDs in IPv4 (rdma_rxe does) fails this check: talking to such
//! a peer needs the frame transport (`frames`), which reads the whole IP
//! header.
//!
//! The parts, by concern:
//!
//! - [`state`]: what the lock guards ([`EngineState`]), and the verbs'
//!   bookkeeping under it;
//! - [`receive`]: a batch taken in and run through the NIC (the UDP and
//!   frame transports differ only there);
//! - [`egress`]: what the NIC built, paced, impaired, shaped into GSO
//!   sends and sent;
//! - [`hold`]: when what the NIC queued waits for the program instead;
//! - [`observe`]: taps, captures and the trace log;
//! - [`shared`]: what the engine thread and the program's threads share
//!   without the lock;
//! - [`thread`]: the engine thread's loop, with [`watch`] (whether it
//!   watches the socket or leaves it to pollers) and [`sched`] (its
//!   scheduling class, its core, lingering);
//! - [`sockets`]: the UDP sockets and the claim on an address;
//! - [`exit`]: what a process's exit sends.

mod drive;
mod egress;
mod exit;
mod hold;
mod observe;
mod receive;
pub(crate) mod relay;
// CPU affinity and scheduling, which std and rustix do not wrap.
#[allow(unsafe_code)]
pub(crate) mod sched;
mod shared;
mod sockets;
mod state;
mod thread;
mod watch;

#[cfg(test)]
mod tests;

use std::io;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::Mutex;
use rnic_core::Nic;
use rustc_hash::FxHashMap as HashMap;
use rustix::event::{eventfd, EventfdFlags};

use crate::Config;

pub(crate) use drive::{BusyPoll, Woken};
use exit::register;
pub use observe::TapEvent;
use shared::{Inbox, Shared};
pub(crate) use sockets::bind_abstract;
use sockets::{claim_udp, gso_default, link_mtu, open_socket_shared};
pub use sockets::{nic_on, reserve_loopback, reserve_loopback_for_exec};
pub(crate) use state::{CqSink, EngineState, EventSink};

/// The UDP port of RoCE v2.
pub const ROCE_PORT: u16 = rnic_wire::ROCE_V2_PORT;

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
    /// What holds this NIC's slot of its address's or interface's QP
    /// numbers while it lives (see [`relay`]).
    _slot_claim: std::os::unix::net::UnixDatagram,
    /// On the UDP transport with a response socket, what holds the address
    /// for this NIC while it lives (its sockets let others join: see
    /// [`claim_udp`]).
    _udp_claim: Option<std::os::unix::net::UnixDatagram>,
    /// Held while the NIC's receive ring takes its address's packets in:
    /// others may send to it past IP and UDP (`sockets::mark_ring`).
    _ring_mark: Option<std::os::unix::net::UnixDatagram>,
    /// The largest IP packet the link carries.
    pub link_mtu: u32,
    /// The process that started the thread: a forked child has a copy of
    /// this struct but not the thread.
    pid: u32,
}

impl Engine {
    /// Bind `addr`:4791 and start the engine thread, taking packets in from
    /// `iface` through a frame socket if given (see `frames`). On the UDP
    /// transport, with `share`, a NIC on an address another NIC holds
    /// shares it (see [`relay`]); without, that is `AddrInUse`.
    pub fn start(
        addr: IpAddr,
        iface: Option<&crate::frames::Interface>,
        secret: rnic_core::rng::SecretRng,
        config: &Config,
        share: bool,
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
        let steer_when_staying = config.response_socket;
        let udp = iface.is_none();
        // A NIC on an address another holds receives what that one hands
        // on, and sends from a port of its own.
        let (udp_claim, joined) = if udp {
            match claim_udp(addr, scope) {
                Ok(c) => (Some(c), false),
                Err(e) if share && e.kind() == io::ErrorKind::AddrInUse => (None, true),
                Err(e) => return Err(e),
            }
        } else {
            (None, false)
        };
        // On loopback, the NIC that holds its address may take packets in
        // through a receive ring on `lo` (`RNIC_RING`, see `frames`).
        let ring = if udp && !joined && config.ring && addr.is_loopback() {
            crate::frames::open_loopback_udp(addr)
                .inspect_err(|e| tracing::info!("no receive ring on lo, the socket instead: {e}"))
                .ok()
        } else {
            None
        };
        // The NIC that holds its address receives the packets of every NIC
        // on it, and hands the others' on.
        let owner = udp && !joined;
        let split = owner && ring.is_none();
        // Every NIC takes a slot of its address's (or interface's) QP
        // numbers: others may come to share it.
        let medium = iface.map_or_else(|| relay::udp_medium(addr, scope), |i| i.name.clone());
        let (slot, slot_claim) = relay::claim_slot(&medium)?;
        // The NIC that receives the packets of the address (UDP) or of QP 1
        // (the interface's slot 0) takes the others' connections; the others
        // connect to it.
        let relays = owner || (iface.is_some() && slot.slot == 0);
        let listener = relays.then(|| relay::listen(&medium)).transpose()?;
        let inbox = if joined {
            Some(relay::join(
                &medium,
                slot.slot,
                std::time::Duration::from_secs(2),
            )?)
        } else if !relays {
            let c = relay::join(&medium, slot.slot, std::time::Duration::from_millis(200));
            if let Err(e) = &c {
                tracing::warn!("no connection manager for this NIC: {e}");
            }
            c.ok()
        } else {
            None
        };
        let socket = if joined {
            let s = open_socket_shared(addr, 0, scope_of(addr), false)?;
            crate::frames::receive_nothing(&s)?;
            s
        } else {
            open_socket_shared(addr, ROCE_PORT, scope_of(addr), shared || split)?
        };
        if ring.is_some() {
            // Bound, receiving nothing: the ring takes each packet in. With
            // GRO on, a GSO send reaches the filter whole rather than cut
            // into datagrams first.
            crate::frames::receive_nothing(&socket)?;
            let _ = crate::udp::enable_gro(socket.as_fd());
        }
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
        nic.restrict_qpns(slot.slot, slot.bits)
            .map_err(|e| io::Error::other(e.to_string()))?;
        let mut loopback = None;
        let frames = match iface {
            None => ring,
            Some(i) => {
                // Other processes' NICs may be on this interface too: this
                // one's frame socket takes only the packets to its QPs.
                let f = crate::frames::open(i, &addrs, Some(slot))?;
                loopback = crate::frames::open_loopback(i, &addrs, Some(slot))?;
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
        };
        // QP1's packets leave from the port the kernel's do, from a socket
        // every NIC on the address may share (nothing is sent to it).
        let gsi_port = rnic_wire::mad::GSI_UDP_SOURCE_PORT;
        for &a in &addrs {
            match open_socket_shared(a, gsi_port, scope_of(a), true) {
                Ok(s) => {
                    send_sockets.insert((a, gsi_port), s);
                }
                Err(e) => {
                    tracing::info!(
                        "QP1 sends from port {ROCE_PORT}: UDP port {gsi_port} of {a}: {e}"
                    );
                    nic.set_gsi_source_port(ROCE_PORT);
                }
            }
        }
        for &a in &addrs {
            crate::capture::register_local(a);
        }
        let wake = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
        let span = tracing::info_span!("rnic_engine", %addr);
        let start = Instant::now();
        // Packets of QPs without a port of their own leave from 4791 (from
        // the NIC's own port, on an address it shares).
        nic.set_udp_source_port(Some(socket.local_addr()?.port()));
        // A NIC that takes packets in through a ring and has no inbox
        // receives nothing into a batch: it gets one with no room. On the
        // UDP transport a peer's GSO send arrives whole where the kernel
        // can (GRO), one receive for what took one send.
        let rx = if frames.is_some() && inbox.is_none() {
            crate::udp::RecvBatch::unallocated()
        } else if split && crate::udp::enable_gro(socket.as_fd()).is_ok() {
            crate::udp::RecvBatch::with_gro()
        } else {
            crate::udp::RecvBatch::new()
        };
        let inlet = match (&inbox, joined) {
            (Some(_), true) => Inbox::Main,
            (Some(_), false) => Inbox::Side,
            (None, _) => Inbox::Unread,
        };
        let members = listener.as_ref().map(|l| l.try_clone()).transpose()?;
        let relay = relay::Relay::new(slot, medium, owner, members)?;
        let mut state = EngineState::new(nic, start, send_sockets, scope, span.clone(), rx, relay);
        state.gso = gso_default(addr, iface.is_some(), config.gso);
        // A ring on loopback is made known for as long as it is held:
        // others may send to it past IP and UDP.
        let ring_mark = (udp && frames.is_some())
            .then(|| {
                sockets::mark_ring(addr)
                    .inspect_err(|e| tracing::info!("the receive ring is not made known: {e}"))
                    .ok()
            })
            .flatten();
        // Sends past IP and UDP (`RNIC_RAW_SENDS`): on loopback from a NIC
        // with a ring, to NICs with rings; on an interface, to neighbours.
        if config.raw_sends {
            if udp && frames.is_some() {
                state.frame_tx = crate::frames::FrameSender::loopback()
                    .inspect_err(|e| tracing::info!("no sends past IP and UDP on lo: {e}"))
                    .ok();
            } else if let Some(i) = iface {
                state.frame_tx = crate::frames::FrameSender::on(i)
                    .inspect_err(|e| tracing::info!("no sends past IP and UDP on {}: {e}", i.name))
                    .ok();
                state.peers = egress::Peers::on(&i.name);
            }
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            socket,
            responses,
            responses_left: AtomicBool::new(false),
            steering: AtomicBool::new(false),
            steered_once: AtomicBool::new(false),
            steering_changes: std::sync::atomic::AtomicU64::new(0),
            steer_when_staying: AtomicBool::new(steer_when_staying),
            #[cfg(test)]
            pinned_steering: std::sync::atomic::AtomicU8::new(0),
            frames,
            loopback,
            inbox,
            inlet,
            listener,
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
            drivers: AtomicUsize::new(0),
            busy_poll_window: config.linger_window,
            polled_packets: AtomicU64::new(0),
            engine_packets: AtomicU64::new(0),
            lingered_packets: AtomicU64::new(0),
            looked_packets: AtomicU64::new(0),
            stays: AtomicU64::new(0),
            away_sleeps: AtomicU64::new(0),
            away_max: AtomicU64::new(watch::AWAY_MAX),
        });
        register(&shared);
        let (priority, linger_window) = (config.priority, config.linger_window);
        let engine_side = shared.clone();
        // The device is ready when its thread is: set up (its scheduling
        // class too) before the first packet, not whenever the scheduler
        // first runs it.
        let (ready, started) = std::sync::mpsc::sync_channel(1);
        let builder = std::thread::Builder::new().name(format!("rnic-engine-{addr}"));
        let thread = crate::signals::spawn(builder, move || {
            let _entered = span.enter();
            engine_side.tid.store(
                rustix::thread::gettid().as_raw_nonzero().get() as u32,
                Ordering::Relaxed,
            );
            let realtime = sched::apply(priority);
            tracing::debug!("engine started on UDP port {ROCE_PORT}, real-time: {realtime}");
            let _ = ready.send(());
            thread::run(&engine_side, realtime, linger_window);
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
            _ring_mark: ring_mark,
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
    /// sends them when it next looks, `watch::AWAY_MAX` to
    /// `watch::AWAY_LONGEST` after the last poll or post (see
    /// [`watch::Watch::away_for`]), as it takes in what arrived meanwhile.
    /// The posting thread never wakes it for them.
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
            st.hold_queued();
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
    /// [`hold::Hold::hold_for_answer`]).
    pub fn progress(&self) {
        let sh = &*self.shared;
        let now = sh.active();
        let Some(mut st) = sh.state.try_lock() else {
            return;
        };
        // What posts held back goes first: it is what the poller waits for
        // (ACKs held for an answer wait for a post, or their time).
        let held = st.hold.due().is_some_and(|t| t.0 <= now);
        if held {
            st.pump(&sh.socket);
        }
        let away = sh.away.load(Ordering::SeqCst);
        // After a poll that found nothing, one message: what a ping-pong's
        // poller finds, the answer (with the ACK that came with it: one
        // GSO send, one message). Asking for a batch, the kernel would
        // fill one header and then fail on the next, which costs about
        // what an empty receive does. A thread that finds something at its
        // next poll again asks for a batch: a stream pays one system call
        // more per spell.
        let most = if st.polled_dry { 1 } else { crate::udp::BATCH };
        // Requests (and, unless steered apart, responses), then the
        // responses steered apart.
        let mut received = sh.receive(&mut st, sh.rx(), away, true, most).packets;
        if let Some(r) = sh
            .responses_rx()
            .filter(|_| sh.steering.load(Ordering::Relaxed))
        {
            received += sh.receive(&mut st, r, away, true, most).packets;
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
            st.hold.empty_poll();
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
