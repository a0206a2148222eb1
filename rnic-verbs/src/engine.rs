//! The engine thread: it owns the `Nic` and the UDP socket on port 4791, runs
//! every event through rnic-core, and hands completions to the application
//! through lock-free queues.
//!
//! What the ICRC check covers on this path: a UDP socket cannot see the IP
//! header, so the ICRC of a received packet is verified under the convention
//! of `rnic_wire::icrc::for_udp`: IPv4 identification 0 and DF set (IPv6: no
//! convention needed, every variant field is masked). rnic's own sockets send
//! exactly that (`IP_PMTUDISC_DO` on an unconnected socket), so rnic-to-rnic
//! traffic verifies end to end, the IPv4 identification included. A peer that
//! puts its own IDs in IPv4 (rdma_rxe does) fails this check: talking to such
//! a peer needs the frame transport, which reads the whole IP header.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use rnic_core::cq::CqHandle;
use rnic_core::sim::Datagram;
use rnic_core::time::Time;
use rnic_core::wr::Completion;
use rnic_core::Nic;
use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};
use rustix::net::sockopt::{
    set_ip_mtu_discover, set_socket_recv_buffer_size, set_socket_recv_buffer_size_force,
    set_socket_send_buffer_size, set_socket_send_buffer_size_force, Ipv4PathMtuDiscovery,
};

/// Socket buffer size asked for, each way.
const SOCKET_BUFFER: usize = 4 << 20;

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
    pub tx: Sender<Completion>,
    pub notify: Option<crate::channel::Notify>,
}

/// Work for the engine thread.
pub(crate) type Job = Box<dyn FnOnce(&mut EngineState) + Send>;

/// What the engine thread owns.
pub(crate) struct EngineState {
    pub nic: Nic,
    pub start: Instant,
    pub cqs: HashMap<CqHandle, CqSink>,
    pub tap: Option<Sender<TapEvent>>,
    pub events: Option<Sender<rnic_core::srq::AsyncEvent>>,
    pub capture: Option<crate::capture::Capture>,
    /// A tracing span per queue pair: received packets and the verbs on a
    /// QP run inside it.
    pub qp_spans: HashMap<u32, tracing::Span>,
    /// Sockets that send from a queue pair's own UDP source port (the
    /// socket on 4791 receives everything and sends the rest).
    pub send_sockets: HashMap<u16, UdpSocket>,
    pub stop: bool,
}

impl EngineState {
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
    pub fn source_port(&mut self, preferred: u16) -> Option<u16> {
        let addr = self.nic.addr();
        for i in 0..64u16 {
            let port = 0xC000 | (preferred.wrapping_add(i) & 0x3FFF);
            if self.send_sockets.contains_key(&port) {
                return Some(port);
            }
            if let Ok(s) = open_socket(addr, port) {
                self.send_sockets.insert(port, s);
                return Some(port);
            }
        }
        None
    }

    pub fn now(&self) -> Time {
        Time(u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// Show a packet sent or received to the tap, the capture file and the
    /// trace log, if any.
    fn observe(&self, sent: bool, now: Time, d: &Datagram) {
        if tracing::enabled!(tracing::Level::TRACE) {
            match rnic_wire::IbPacket::new_checked(&d.payload[..]) {
                Ok(p) => tracing::trace!(
                    dir = if sent { "tx" } else { "rx" },
                    src = %d.src,
                    dst = %d.dst,
                    opcode = p.info().name,
                    dest_qp = format_args!("{:#x}", p.bth().dest_qp()),
                    psn = p.bth().psn().value(),
                    bytes = d.payload.len(),
                    "packet"
                ),
                Err(e) => {
                    tracing::trace!(dir = if sent { "tx" } else { "rx" }, src = %d.src, error = %e, "unparsable packet")
                }
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

/// The application's handle on the engine thread.
pub(crate) struct Engine {
    jobs: Sender<Job>,
    wake: OwnedFd,
    thread: Option<JoinHandle<()>>,
    pub addr: IpAddr,
}

/// The UDP port of RoCE v2.
pub const ROCE_PORT: u16 = rnic_wire::ROCE_V2_PORT;

fn open_socket(addr: IpAddr, port: u16) -> io::Result<UdpSocket> {
    let socket = UdpSocket::bind(SocketAddr::new(addr, port))?;
    socket.set_nonblocking(true)?;
    if addr.is_ipv4() {
        // DF on every datagram and IPv4 identification 0: the ICRC convention.
        set_ip_mtu_discover(&socket, Ipv4PathMtuDiscovery::DO)?;
    }
    // A requester may have 1024 packets in flight; the default receive buffer
    // (about 200 KiB) drops a burst of them, and each tail loss costs a local
    // ACK timeout. Ask for 4 MiB (beyond net.core.rmem_max only as root), and
    // settle for what the kernel grants.
    if set_socket_recv_buffer_size_force(&socket, SOCKET_BUFFER).is_err() {
        let _ = set_socket_recv_buffer_size(&socket, SOCKET_BUFFER);
    }
    if set_socket_send_buffer_size_force(&socket, SOCKET_BUFFER).is_err() {
        let _ = set_socket_send_buffer_size(&socket, SOCKET_BUFFER);
    }
    Ok(socket)
}

impl Engine {
    /// Bind `addr`:4791 and start the engine thread.
    pub fn start(addr: IpAddr, seed: u64) -> io::Result<Engine> {
        let socket = open_socket(addr, ROCE_PORT)?;
        crate::capture::register_local(addr);
        let wake = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
        let wake_engine = wake.try_clone()?;
        let (jobs, job_rx) = crossbeam_channel::unbounded::<Job>();
        let thread = std::thread::Builder::new()
            .name(format!("rnic-engine-{addr}"))
            .spawn(move || {
                let span = tracing::info_span!("rnic_engine", %addr);
                let _entered = span.enter();
                tracing::debug!("engine started on UDP port {ROCE_PORT}");
                let mut nic = Nic::new(addr, seed);
                // One socket sends everything, from port 4791.
                nic.set_udp_source_port(Some(ROCE_PORT));
                let state = EngineState {
                    nic,
                    start: Instant::now(),
                    cqs: HashMap::new(),
                    tap: None,
                    events: None,
                    capture: None,
                    qp_spans: HashMap::new(),
                    send_sockets: HashMap::new(),
                    stop: false,
                };
                run(state, socket, job_rx, wake_engine, addr);
            })?;
        Ok(Engine {
            jobs,
            wake,
            thread: Some(thread),
            addr,
        })
    }

    /// Run `f` on the engine thread and wait for its result.
    pub fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut EngineState) -> R + Send + 'static,
    ) -> io::Result<R> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.submit(Box::new(move |st| {
            let _ = tx.send(f(st));
        }))?;
        rx.recv()
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the engine thread has stopped"))
    }

    /// Queue `job` for the engine thread and wake it.
    pub fn submit(&self, job: Job) -> io::Result<()> {
        self.jobs.send(job).map_err(|_| {
            io::Error::new(io::ErrorKind::BrokenPipe, "the engine thread has stopped")
        })?;
        // An eventfd write only fails when the counter would overflow, which
        // already means "awake".
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
        Ok(())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.submit(Box::new(|st| st.stop = true));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        crate::capture::unregister_local(self.addr);
    }
}

/// How long the engine keeps polling after its last piece of work before it
/// sleeps: `RNIC_BUSY_POLL_US` microseconds (default 0: sleep at once).
/// Polling trades a core for latency; on a machine with spare cores, 20-50 us
/// keeps a ping-pong's turnaround off the scheduler's wake-up path.
fn busy_poll() -> Duration {
    std::env::var("RNIC_BUSY_POLL_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_micros)
        .unwrap_or(Duration::ZERO)
}

fn run(mut st: EngineState, socket: UdpSocket, jobs: Receiver<Job>, wake: OwnedFd, addr: IpAddr) {
    let mut rx = crate::udp::RecvBatch::new();
    let mut tx: Vec<Datagram> = Vec::with_capacity(crate::udp::BATCH);
    let spin = busy_poll();
    let mut idle_since: Option<Instant> = None;
    while !st.stop {
        let mut busy = false;
        while let Ok(job) = jobs.try_recv() {
            job(&mut st);
            busy = true;
        }
        // Receive everything waiting, a batch per system call.
        loop {
            // ICMP errors from earlier sends (port unreachable) surface
            // here as errors: nothing to receive this round.
            let n = rx.recv(socket.as_fd()).unwrap_or_default();
            for i in 0..n {
                let Some((payload, from)) = rx.get(i) else {
                    st.nic.count_malformed();
                    continue;
                };
                let d = Datagram {
                    src: from.ip(),
                    dst: addr,
                    src_port: from.port(),
                    payload: payload.to_vec(),
                };
                let now = st.now();
                // The BTH's destination QP (bytes 5-7): the local QP.
                let span = match d.payload.get(5..8) {
                    Some(q) => st.qp_span(u32::from_be_bytes([0, q[0], q[1], q[2]])),
                    None => tracing::Span::none(),
                };
                let _in_qp = span.enter();
                st.observe(false, now, &d);
                st.nic.handle_datagram(now, &d);
            }
            busy |= n > 0;
            if n < crate::udp::BATCH {
                break;
            }
        }
        let now = st.now();
        if st.nic.next_deadline().is_some_and(|d| d <= now) {
            st.nic.handle_timeout(now);
        }
        // Send what the NIC wants sent, a batch per system call.
        loop {
            tx.clear();
            while tx.len() < crate::udp::BATCH {
                match st.nic.poll_transmit() {
                    Some(d) => tx.push(d),
                    None => break,
                }
            }
            if tx.is_empty() {
                break;
            }
            for d in &tx {
                st.observe(true, now, d);
            }
            // Each run of datagrams from one source port goes out of the
            // socket bound to it (the ICRC covers the port).
            let mut rest = &tx[..];
            while let Some(first) = rest.first() {
                let run = rest
                    .iter()
                    .take_while(|d| d.src_port == first.src_port)
                    .count();
                let out: Vec<(SocketAddr, &[u8])> = rest[..run]
                    .iter()
                    .map(|d| (SocketAddr::new(d.dst, ROCE_PORT), &d.payload[..]))
                    .collect();
                let from = st.send_sockets.get(&first.src_port).unwrap_or(&socket);
                // Datagrams the socket buffer refused are lost, as on a full link.
                let _ = crate::udp::send(from.as_fd(), &out);
                rest = &rest[run..];
            }
            busy = true;
        }
        // Completions to the application's queues.
        for (h, sink) in &st.cqs {
            if let Ok(done) = st.nic.poll_cq(*h, usize::MAX) {
                let any = !done.is_empty();
                for c in done {
                    let _ = sink.tx.send(c);
                }
                if let (true, Some(n)) = (any, &sink.notify) {
                    n.completed(*h);
                }
            }
        }
        while let Some(e) = st.nic.poll_async_event() {
            if let Some(tx) = &st.events {
                let _ = tx.send(e);
            }
        }
        if busy {
            idle_since = None;
            continue;
        }
        // Idle: poll on for a while if asked, then sleep until a datagram, a
        // job, or the next deadline.
        let since = *idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() < spin {
            std::hint::spin_loop();
            continue;
        }
        let timeout = st
            .nic
            .next_deadline()
            .map(|d| Duration::from_nanos(d.0.saturating_sub(st.now().0)))
            .unwrap_or(Duration::from_millis(100))
            .min(Duration::from_millis(100));
        let ts = Timespec::try_from(timeout).unwrap_or(Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        });
        let mut fds = [
            PollFd::new(&socket, PollFlags::IN),
            PollFd::new(&wake, PollFlags::IN),
        ];
        let _ = poll(&mut fds, Some(&ts));
        let mut counter = [0u8; 8];
        let _ = rustix::io::read(wake.as_fd(), &mut counter);
        idle_since = None;
    }
}
