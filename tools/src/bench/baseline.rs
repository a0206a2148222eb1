//! What the kernel's own transports do between the same two loopback
//! addresses with the same sizes: the figures rnic is compared with, measured
//! in the same run. Each is what a program written for speed would do:
//! - a TCP stream, `size`-byte writes;
//! - raw UDP, one datagram per system call;
//! - raw UDP, 32 datagrams per `sendmmsg` and `recvmmsg` (the engine's own
//!   batching code, `rnic_verbs::udp`);
//! - raw UDP with GSO on send and GRO on receive, 64 KiB per system call;
//! - UDP and TCP ping-pongs, both sides spinning on a non-blocking socket
//!   (as `sockperf --nonblocked` does, and as rnic's latency mode polls).
//!
//! And two that send what RoCE puts on the wire, with none of a NIC's work:
//! the kernel's floor for rnic's traffic, what rnic would reach if its own
//! work cost nothing.
//! - WRITE-shaped: the datagrams of RC WRITEs of the message size, each as
//!   long as its packet (BTH, RETH on the first, payload, ICRC; see
//!   [`write_datagrams`]), grouped into GSO sends as rnic groups them
//!   (`rnic_verbs::udp::gso_run`) and sent by the engine's own code
//!   (`rnic_verbs::udp::send_groups`) from an unconnected socket, to a
//!   GRO socket. A WRITE's first packet is 16 bytes longer than the rest,
//!   and the datagrams of a GSO send must all be as long as the first but
//!   the last: a WRITE of three packets or more takes two sends.
//! - A WRITE-shaped ping-pong: each way, what a 64 B WRITE ping-pong puts
//!   on the wire, the WRITE and the ACK of the peer's, as one GSO send.
//!
//! Throughputs count what the receiver got (UDP drops what it cannot take),
//! from its first datagram to its last.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rnic_wire::{bth, IbRepr, Opcode, Psn};
use rustix::net::sockopt;

/// Longest any baseline waits for a peer before giving up.
const PATIENCE: Duration = Duration::from_secs(10);

/// What a receiver took in: the bytes after the first arrival, timed from
/// it to the last (the first arrival only starts the clock).
#[derive(Default)]
struct Tally {
    bytes: u64,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Tally {
    fn add(&mut self, n: usize) {
        let now = Instant::now();
        if self.first.is_none() {
            self.first = Some(now);
        } else {
            self.bytes += n as u64;
        }
        self.last = Some(now);
    }

    /// Bytes per second.
    fn rate(&self) -> f64 {
        match (self.first, self.last) {
            (Some(f), Some(l)) if l > f => self.bytes as f64 / (l - f).as_secs_f64(),
            _ => 0.0,
        }
    }
}

/// A TCP connection from `from` to a listener on `to`: (client, server).
fn tcp_pair(from: IpAddr, to: IpAddr) -> io::Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind(SocketAddr::new(to, 0))?;
    let dest = listener.local_addr()?;
    let family = match from {
        IpAddr::V4(_) => rustix::net::AddressFamily::INET,
        IpAddr::V6(_) => rustix::net::AddressFamily::INET6,
    };
    let fd = rustix::net::socket(family, rustix::net::SocketType::STREAM, None)?;
    rustix::net::bind(&fd, &SocketAddr::new(from, 0))?;
    rustix::net::connect(&fd, &dest)?;
    let client = TcpStream::from(fd);
    let (server, _) = listener.accept()?;
    for s in [&client, &server] {
        sockopt::set_tcp_nodelay(s, true)?;
    }
    Ok((client, server))
}

/// A TCP stream: `size`-byte writes for `time`; the receiver's bytes per second.
pub fn tcp_stream(from: IpAddr, to: IpAddr, size: usize, time: Duration) -> io::Result<f64> {
    let (mut tx, mut rx) = tcp_pair(from, to)?;
    sockopt::set_tcp_nodelay(&tx, false)?;
    rx.set_read_timeout(Some(PATIENCE))?;
    let sender = std::thread::spawn(move || -> io::Result<()> {
        let buf = vec![0x5Au8; size];
        let start = Instant::now();
        while start.elapsed() < time {
            tx.write_all(&buf)?;
        }
        tx.shutdown(std::net::Shutdown::Write)
    });
    let mut buf = vec![0u8; 1 << 20];
    let mut got = Tally::default();
    loop {
        let n = rx.read(&mut buf)?;
        if n == 0 {
            break;
        }
        got.add(n);
    }
    sender
        .join()
        .map_err(|_| io::Error::other("the sender panicked"))??;
    Ok(got.rate())
}

/// How a UDP baseline moves its datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Udp {
    /// One `send_to` and one `recv` per datagram.
    PerCall,
    /// `sendmmsg` and `recvmmsg`, 32 datagrams per call.
    Batched,
    /// GSO: up to 64 segments (64 KiB) per `send`; GRO on the receiver.
    Segmented,
}

/// Largest UDP payload of one GSO send.
const GSO_MAX: usize = 65000;

/// Set an integer option at the UDP level (UDP_SEGMENT, UDP_GRO), which
/// neither std nor rustix wraps.
#[allow(unsafe_code)]
fn set_udp_option(s: &impl AsFd, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: the pointer and length describe `value`, which outlives the
    // call; the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            s.as_fd().as_raw_fd(),
            libc::SOL_UDP,
            name,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Raw UDP: datagrams of `dgram` bytes for `time`, sent as `how` says; the
/// receiver's bytes per second and datagrams per second.
pub fn udp_stream(
    from: IpAddr,
    to: IpAddr,
    dgram: usize,
    how: Udp,
    time: Duration,
) -> io::Result<(f64, f64)> {
    let tx = UdpSocket::bind(SocketAddr::new(from, 0))?;
    let per_call = match how {
        Udp::Segmented if dgram < GSO_MAX => {
            set_udp_option(&tx, libc::UDP_SEGMENT, dgram as libc::c_int)?;
            (GSO_MAX / dgram).min(64) * dgram
        }
        _ => dgram,
    };
    let buf = vec![0x5Au8; per_call];
    stream(tx, to, how, dgram, time, |tx, dest| {
        let sent = match how {
            Udp::PerCall | Udp::Segmented => tx.send_to(&buf, dest).map(|_| 1),
            Udp::Batched => {
                rnic_verbs::udp::send(tx.as_fd(), rnic_verbs::udp::BATCH, |_| (dest, &buf[..]))
            }
        };
        Ok(matches!(sent, Ok(n) if n > 0))
    })
}

/// What `send` sends from `tx` to a socket on `to`, called again and again
/// for `time` (when it says the socket buffer refused some, the sender
/// lets the receiver catch up), received as `how` says: the receiver's
/// bytes per second, and `unit`s of bytes per second.
fn stream(
    tx: UdpSocket,
    to: IpAddr,
    how: Udp,
    unit: usize,
    time: Duration,
    send: impl Fn(&UdpSocket, SocketAddr) -> io::Result<bool> + Sync,
) -> io::Result<(f64, f64)> {
    let rx = UdpSocket::bind(SocketAddr::new(to, 0))?;
    let dest = rx.local_addr()?;
    let _ = sockopt::set_socket_recv_buffer_size(&rx, 4 << 20);
    if how == Udp::Segmented {
        set_udp_option(&rx, libc::UDP_GRO, 1)?;
    }
    let _ = sockopt::set_socket_send_buffer_size(&tx, 4 << 20);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let sender = s.spawn(|| {
            let start = Instant::now();
            let r = (|| -> io::Result<()> {
                while start.elapsed() < time {
                    if !send(&tx, dest)? {
                        std::thread::yield_now();
                    }
                }
                Ok(())
            })();
            done.store(true, Ordering::Release);
            r
        });
        let got = udp_receive(&rx, unit, how, &done);
        sender
            .join()
            .map_err(|_| io::Error::other("the sender panicked"))??;
        got
    })
}

fn udp_receive(
    rx: &UdpSocket,
    dgram: usize,
    how: Udp,
    done: &AtomicBool,
) -> io::Result<(f64, f64)> {
    let mut got = Tally::default();
    let begun = Instant::now();
    let mut batch = rnic_verbs::udp::RecvBatch::new();
    let mut buf = vec![0u8; 1 << 16];
    rx.set_read_timeout(Some(Duration::from_millis(20)))?;
    loop {
        let quiet = match how {
            Udp::PerCall | Udp::Segmented => match rx.recv(&mut buf) {
                Ok(n) => {
                    got.add(n);
                    false
                }
                Err(_) => true,
            },
            Udp::Batched => {
                let n = batch.recv(rx.as_fd())?;
                for i in 0..n {
                    if let Some((d, _)) = batch.get(i) {
                        got.add(d.map(<[u8]>::len).sum());
                    }
                }
                if n == 0 {
                    let mut fds = [rustix::event::PollFd::new(rx, rustix::event::PollFlags::IN)];
                    let t = rustix::event::Timespec {
                        tv_sec: 0,
                        tv_nsec: 20_000_000,
                    };
                    rustix::event::poll(&mut fds, Some(&t))? == 0
                } else {
                    false
                }
            }
        };
        if quiet && done.load(Ordering::Acquire) {
            break;
        }
        if got.first.is_none() && begun.elapsed() > PATIENCE {
            return Err(io::Error::other("no datagram arrived"));
        }
    }
    let bps = got.rate();
    Ok((bps, bps / dgram as f64))
}

/// The UDP payload lengths of one RC RDMA WRITE of `size` bytes at path
/// MTU `pmtu`, packet by packet: FIRST (with the RETH), MIDDLEs, LAST, or
/// a WRITE ONLY (with the RETH) if it fits in one.
pub fn write_datagrams(size: usize, pmtu: usize) -> Vec<usize> {
    let n = size.div_ceil(pmtu).max(1);
    (0..n)
        .map(|i| {
            let opcode = match (i, n) {
                (_, 1) => Opcode::RC_RDMA_WRITE_ONLY,
                (0, _) => Opcode::RC_RDMA_WRITE_FIRST,
                (i, n) if i + 1 == n => Opcode::RC_RDMA_WRITE_LAST,
                _ => Opcode::RC_RDMA_WRITE_MIDDLE,
            };
            // The opcode says which headers follow the BTH (the RETH on
            // the first): a length needs nothing else but the payload's.
            let mut ib = IbRepr::new(bth::Repr::new(opcode, 0, Psn::new(0)));
            ib.payload_len = (size - i * pmtu).min(pmtu);
            ib.buffer_len()
        })
        .collect()
}

/// The UDP payload length of an RC ACK.
pub fn ack_datagram() -> usize {
    // BTH and AETH, as the opcode says, and the ICRC.
    IbRepr::new(bth::Repr::new(Opcode::RC_ACKNOWLEDGE, 0, Psn::new(0))).buffer_len()
}

/// How the datagrams of `lens` (sent in that order to one destination) go
/// as GSO sends: the number of datagrams in each, as rnic groups them.
pub fn gso_groups(lens: &[usize], to: SocketAddr) -> Vec<usize> {
    let mut groups = Vec::new();
    let mut at = 0;
    while at < lens.len() {
        let n = rnic_verbs::udp::gso_run(lens.len() - at, |i| (to, lens[at + i]));
        groups.push(n);
        at += n;
    }
    groups
}

/// WRITE-shaped UDP (see the module's docs): RC WRITEs of `size` bytes at
/// path MTU `pmtu`, as many as one `send_groups` call takes (at most 256
/// datagrams, or one WRITE), for `time`; the message bytes and messages
/// per second the receiver got.
pub fn udp_write_shaped(
    from: IpAddr,
    to: IpAddr,
    size: usize,
    pmtu: usize,
    time: Duration,
) -> io::Result<(f64, f64)> {
    let one = write_datagrams(size, pmtu);
    let wire: usize = one.iter().sum();
    let writes = (256 / one.len()).max(1);
    let lens: Vec<usize> = (0..writes).flat_map(|_| one.iter().copied()).collect();
    let buf = vec![0x5Au8; lens.iter().copied().max().unwrap_or(0)];
    // All go to one destination: any address groups them alike.
    let groups = gso_groups(&lens, SocketAddr::new(to, 0));
    let tx = shaped_socket(from)?;
    let (bps, msgs) = stream(tx, to, Udp::Segmented, wire, time, |tx, dest| {
        let sent = rnic_verbs::udp::send_groups(tx.as_fd(), &groups, |i| (dest, &buf[..lens[i]]))?;
        if sent.gso_refused {
            return Err(io::Error::other("the kernel refused a GSO send"));
        }
        Ok(sent.datagrams == lens.len())
    })?;
    // What arrived is whole WRITEs' datagrams (GRO joins datagrams, never
    // cuts one): in message bytes, size for every `wire` bytes.
    Ok((bps * size as f64 / wire as f64, msgs))
}

/// A socket for WRITE-shaped sends: unconnected, on `from`, with
/// `IP_PMTUDISC_DO` as rnic's (IPv4 identification 0 in every datagram).
fn shaped_socket(from: IpAddr) -> io::Result<UdpSocket> {
    let s = UdpSocket::bind(SocketAddr::new(from, 0))?;
    if from.is_ipv4() {
        sockopt::set_ip_mtu_discover(&s, sockopt::Ipv4PathMtuDiscovery::DO)?;
    }
    Ok(s)
}

/// Which socket a ping-pong bounces its message over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PingPong {
    /// Two UDP sockets.
    Udp,
    /// One TCP connection (TCP_NODELAY).
    Tcp,
    /// Two UDP sockets, each message going as what a 64 B WRITE ping-pong
    /// sends: the WRITE of it and the ACK of the peer's last, as one GSO
    /// send from an unconnected socket to a GRO socket.
    WriteShaped,
}

/// Round trips of a `size`-byte message, `n` of them after `n / 10` to warm
/// up, both sides spinning on non-blocking sockets; sorted.
pub fn ping_pong(
    from: IpAddr,
    to: IpAddr,
    size: usize,
    n: usize,
    over: PingPong,
) -> io::Result<Vec<Duration>> {
    let warm = n / 10;
    let (mut a, mut b): (Box<dyn Bouncer>, Box<dyn Bouncer>) = match over {
        PingPong::Udp => {
            let a = UdpSocket::bind(SocketAddr::new(from, 0))?;
            let b = UdpSocket::bind(SocketAddr::new(to, 0))?;
            a.connect(b.local_addr()?)?;
            b.connect(a.local_addr()?)?;
            (Box::new(a), Box::new(b))
        }
        PingPong::Tcp => {
            let (a, b) = tcp_pair(from, to)?;
            (Box::new(a), Box::new(b))
        }
        PingPong::WriteShaped => {
            let (a, b) = (shaped_socket(from)?, shaped_socket(to)?);
            for s in [&a, &b] {
                set_udp_option(s, libc::UDP_GRO, 1)?;
            }
            let (to_b, to_a) = (b.local_addr()?, a.local_addr()?);
            (
                Box::new(Shaped::new(a, to_b, size)),
                Box::new(Shaped::new(b, to_a, size)),
            )
        }
    };
    a.nonblocking()?;
    b.nonblocking()?;
    std::thread::scope(|s| {
        let echo = s.spawn(move || -> io::Result<()> {
            let mut buf = vec![0u8; size];
            for _ in 0..warm + n {
                b.take(&mut buf)?;
                b.put(&buf)?;
            }
            Ok(())
        });
        let mut buf = vec![0x5Au8; size];
        let mut rtts = Vec::with_capacity(n);
        let mine = (|| -> io::Result<()> {
            for i in 0..warm + n {
                let t = Instant::now();
                a.put(&buf)?;
                a.take(&mut buf)?;
                if i >= warm {
                    rtts.push(t.elapsed());
                }
            }
            Ok(())
        })();
        let theirs = echo
            .join()
            .map_err(|_| io::Error::other("the echo panicked"))?;
        mine.and(theirs)?;
        rtts.sort();
        Ok(rtts)
    })
}

/// One end of a ping-pong: send a whole message, spin until one has come.
trait Bouncer: Send {
    fn nonblocking(&mut self) -> io::Result<()>;
    fn put(&mut self, m: &[u8]) -> io::Result<()>;
    fn take(&mut self, m: &mut [u8]) -> io::Result<()>;
}

/// Spin on `f` until it does something, for at most [`PATIENCE`].
fn spin<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let start = Instant::now();
    let mut tries = 0u32;
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                tries = tries.wrapping_add(1);
                if tries % 1024 == 0 && start.elapsed() > PATIENCE {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the peer went quiet",
                    ));
                }
                std::hint::spin_loop();
            }
            other => return other,
        }
    }
}

impl Bouncer for UdpSocket {
    fn nonblocking(&mut self) -> io::Result<()> {
        self.set_nonblocking(true)
    }
    fn put(&mut self, m: &[u8]) -> io::Result<()> {
        spin(|| self.send(m)).map(drop)
    }
    fn take(&mut self, m: &mut [u8]) -> io::Result<()> {
        spin(|| self.recv(m)).map(drop)
    }
}

impl Bouncer for TcpStream {
    fn nonblocking(&mut self) -> io::Result<()> {
        self.set_nonblocking(true)
    }
    fn put(&mut self, m: &[u8]) -> io::Result<()> {
        let mut at = 0;
        while at < m.len() {
            at += spin(|| self.write(&m[at..]))?;
        }
        Ok(())
    }
    fn take(&mut self, m: &mut [u8]) -> io::Result<()> {
        let mut at = 0;
        while at < m.len() {
            match spin(|| self.read(&mut m[at..]))? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                k => at += k,
            }
        }
        Ok(())
    }
}

/// One end of a WRITE-shaped ping-pong.
struct Shaped {
    socket: UdpSocket,
    peer: SocketAddr,
    /// The WRITE's datagram and then the ACK's, back to back.
    out: Vec<u8>,
    /// The WRITE's length in `out`.
    write: usize,
    /// Room for what arrives.
    rx: Vec<u8>,
}

impl Shaped {
    fn new(socket: UdpSocket, peer: SocketAddr, size: usize) -> Shaped {
        let write = write_datagrams(size, usize::MAX)[0];
        Shaped {
            socket,
            peer,
            out: vec![0; write + ack_datagram()],
            write,
            rx: vec![0; 1 << 16],
        }
    }

    /// Where a message's bytes go in the WRITE's datagram: after the BTH
    /// and RETH.
    fn payload(&self, size: usize) -> std::ops::Range<usize> {
        let at = self.write - size.next_multiple_of(4) - 4;
        at..at + size
    }
}

impl Bouncer for Shaped {
    fn nonblocking(&mut self) -> io::Result<()> {
        self.socket.set_nonblocking(true)
    }
    fn put(&mut self, m: &[u8]) -> io::Result<()> {
        let at = self.payload(m.len());
        self.out[at].copy_from_slice(m);
        let (write, peer) = (self.write, self.peer);
        let (socket, out) = (&self.socket, &self.out);
        spin(|| {
            let sent = rnic_verbs::udp::send_groups(socket.as_fd(), &[2], |i| {
                (peer, if i == 0 { &out[..write] } else { &out[write..] })
            })?;
            match sent.datagrams {
                2 => Ok(()),
                _ if sent.gso_refused => Err(io::Error::other("the kernel refused a GSO send")),
                _ => Err(io::ErrorKind::WouldBlock.into()),
            }
        })
    }
    fn take(&mut self, m: &mut [u8]) -> io::Result<()> {
        // Both datagrams: one message where GRO joined them, else two.
        let mut got = 0;
        while got < self.out.len() {
            let (socket, rx) = (&self.socket, &mut self.rx[got..]);
            got += spin(|| socket.recv(rx))?;
        }
        let at = self.payload(m.len());
        m.copy_from_slice(&self.rx[at]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

    #[test]
    fn every_baseline_moves_data() {
        let t = Duration::from_millis(50);
        assert!(tcp_stream(A, B, 4096, t).unwrap() > 0.0);
        for how in [Udp::PerCall, Udp::Batched, Udp::Segmented] {
            let (bps, pps) = udp_stream(A, B, 1024, how, t).unwrap();
            assert!(bps > 0.0 && pps > 0.0, "{how:?}");
        }
        let (bps, mps) = udp_write_shaped(A, B, 65536, 4096, t).unwrap();
        assert!(bps > 0.0 && mps > 0.0);
        for over in [PingPong::Udp, PingPong::Tcp, PingPong::WriteShaped] {
            let rtts = ping_pong(A, B, 64, 100, over).unwrap();
            assert_eq!(rtts.len(), 100);
            assert!(rtts[0] <= rtts[99]);
        }
    }

    #[test]
    fn a_writes_datagrams_are_its_packets() {
        // BTH 12, RETH 16, ICRC 4; pad to a multiple of 4.
        assert_eq!(write_datagrams(64, 4096), [96]);
        assert_eq!(write_datagrams(1, 4096), [36]);
        assert_eq!(write_datagrams(0, 4096), [32]);
        assert_eq!(write_datagrams(5000, 4096), [4128, 920]);
        let big = write_datagrams(65536, 4096);
        assert_eq!(big.len(), 16);
        assert_eq!(big[0], 4128);
        assert!(big[1..].iter().all(|&l| l == 4112));
        assert_eq!(ack_datagram(), 20);
    }

    #[test]
    fn a_shaped_message_is_a_write_and_an_ack_in_one_gso_send() {
        let (a, b) = (shaped_socket(A).unwrap(), shaped_socket(B).unwrap());
        set_udp_option(&b, libc::UDP_GRO, 1).unwrap();
        b.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut end = Shaped::new(a, b.local_addr().unwrap(), 64);
        end.put(&[7; 64]).unwrap();
        // One GSO send reaches a GRO socket whole: both in one receive.
        let mut got = [0u8; 1024];
        assert_eq!(b.recv(&mut got).unwrap(), 96 + 20);
        assert_eq!(got[28..92], [7; 64]);
    }

    #[test]
    fn a_write_of_three_packets_or_more_takes_two_gso_sends() {
        let to = SocketAddr::new(B, 4791);
        assert_eq!(gso_groups(&write_datagrams(65536, 4096), to), [2, 14]);
        assert_eq!(gso_groups(&write_datagrams(16384, 4096), to), [2, 2]);
        assert_eq!(gso_groups(&write_datagrams(8192, 4096), to), [2]);
        // WRITE ONLYs of one size go together.
        let small: Vec<usize> = (0..100).flat_map(|_| write_datagrams(64, 4096)).collect();
        assert_eq!(gso_groups(&small, to), [64, 36]);
        // The ping-pong's WRITE and ACK: one send.
        assert_eq!(gso_groups(&[96, ack_datagram()], to), [2]);
    }
}
