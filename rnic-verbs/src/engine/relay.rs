//! Several NICs on one address, as a host's processes share its
//! addresses: each NIC takes a slot of the address's QP number space
//! (its top `SLOT_BITS` bits, see [`rnic_core::Nic::restrict_qpns`]),
//! and the CM's IDs take the same slot of theirs. Whoever receives the
//! address's packets hands each one that is another slot's to that slot's
//! NIC, over a Unix `SOCK_SEQPACKET` connection the other NIC opened to it
//! at its start (to an abstract name after the address or interface):
//! unlike a datagram socket's, a connection's queue is bounded by bytes
//! (the socket buffers), not by `net.unix.max_dgram_qlen` datagrams (10 by
//! default), which a burst of a bandwidth test overruns at once.
//!
//! - on the UDP transport, the address's first NIC (the one holding port
//!   4791) receives everything and relays the other slots' packets, data
//!   and CM alike (their NICs send from sockets of their own);
//! - on the frame transport, each NIC's packet socket takes its own slot's
//!   packets (the kernel filters), and the NIC in slot 0, which QP 1's
//!   packets belong to, relays the CM messages that are another slot's.
//!
//! A CM message names its receiver by the ID that receiver chose
//! ([`rnic_core::cm::addressee`]), which says the slot; a request names a
//! service, whose listener holds a route name with its slot in it
//! ([`Relay::route`]): the relaying NIC looks for it, and answers a
//! request nobody listens for itself (REJ, reason 8), as the kernel does.

use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketAddrUnix, SocketFlags, SocketType};

use rnic_core::cm::{packet_addressee, Addressee};

use crate::frames::{QpnSlot, SLOT_BITS};

/// A relayed packet's first byte: a UDP payload, with its sender's
/// address and port after it.
const UDP: u8 = 0;
/// A relayed packet's first byte: a whole IP packet from a frame socket.
const FRAME: u8 = 1;
/// The relay header of a UDP payload: kind, IPv6 (or IPv4-mapped)
/// address, port.
const UDP_HEADER: usize = 1 + 16 + 2;

fn abstract_addr(name: &str) -> io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(name)
}

/// The name of `slot`'s claim on `medium`.
fn slot_name(medium: &str, slot: u32) -> String {
    format!("rnic/qpn-slot/{medium}/{slot}")
}

/// Where the NIC that receives `medium`'s packets takes connections.
fn relay_name(medium: &str) -> String {
    format!("rnic/relay/{medium}")
}

fn seqpacket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// Take connections from the other NICs of `medium`, as the NIC that
/// receives its packets: a listening socket, non-blocking.
pub(crate) fn listen(medium: &str) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    rustix::net::bind(
        &fd,
        &SocketAddrUnix::new_abstract_name(relay_name(medium).as_bytes())?,
    )?;
    rustix::net::listen(&fd, 16)?;
    rustix::io::ioctl_fionbio(&fd, true)?;
    Ok(fd)
}

/// Connect to the NIC that receives `medium`'s packets, as the NIC in
/// `slot`: the connection its packets come in on (non-blocking). That NIC
/// may still be starting: tried for up to `patience`.
pub(crate) fn join(medium: &str, slot: u32, patience: Duration) -> io::Result<OwnedFd> {
    let name = SocketAddrUnix::new_abstract_name(relay_name(medium).as_bytes())?;
    let deadline = std::time::Instant::now() + patience;
    loop {
        let fd = seqpacket()?;
        match rustix::net::connect(&fd, &name) {
            Ok(()) => {
                rustix::net::send(&fd, &slot.to_be_bytes(), SendFlags::NOSIGNAL)?;
                rustix::io::ioctl_fionbio(&fd, true)?;
                crate::udp::ask_recv_buffer(fd.as_fd());
                return Ok(fd);
            }
            Err(e) if std::time::Instant::now() < deadline => {
                tracing::trace!("the relay of {medium} is not there yet: {e}");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                return Err(io::Error::new(
                    io::Error::from(e).kind(),
                    format!("no NIC receives the packets of {medium}"),
                ))
            }
        }
    }
}

/// The name `slot`'s NIC holds while it listens on `service`.
fn route_name(medium: &str, service: u64, slot: u32) -> String {
    format!("rnic/cm-route/{medium}/{service:016x}/{slot}")
}

/// Take the first free slot of `medium`'s QP number space (an interface's
/// name, or [`udp_medium`] of an address), for as long as the returned
/// socket is open.
pub(crate) fn claim_slot(medium: &str) -> io::Result<(QpnSlot, UnixDatagram)> {
    for slot in 0..1 << SLOT_BITS {
        match super::bind_abstract(&slot_name(medium, slot)) {
            Ok(s) => {
                let bits = SLOT_BITS;
                return Ok((QpnSlot { slot, bits }, s));
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!(
            "{} NICs already run on {medium}; no slot of QP numbers is free",
            1 << SLOT_BITS
        ),
    ))
}

/// The medium of UDP port 4791 of `addr` (on interface `scope`).
pub(crate) fn udp_medium(addr: IpAddr, scope: u32) -> String {
    format!("udp:{addr}%{scope}")
}

/// One NIC's part in sharing its address or interface: its slot, and,
/// for the NIC that receives other slots' packets, the means to hand them
/// on.
#[derive(Debug)]
pub(crate) struct Relay {
    /// This NIC's slot.
    pub own: QpnSlot,
    medium: String,
    /// Whether packets to other slots' QPs come in here (the UDP
    /// transport's first NIC), not just QP 1's.
    data: bool,
    /// The connection of each other slot's NIC, by slot.
    members: Vec<Option<OwnedFd>>,
    /// Where they connect, if this NIC receives their packets ([`listen`]).
    listener: Option<OwnedFd>,
    /// Looks for a service's listener (connected to its route, if any).
    probe: UnixDatagram,
    /// A relayed message being built.
    buf: Vec<u8>,
    /// Packets handed to another slot's NIC.
    pub relayed: u64,
    /// Packets for a NIC whose inbox was full: dropped, as a full
    /// receive queue drops them.
    pub undeliverable: u64,
}

/// Where a packet goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// This NIC's.
    Here,
    /// Another slot's NIC's.
    Slot(u32),
}

impl Relay {
    /// The part of the NIC in slot `own` of `medium`, which takes the
    /// other NICs' connections at `listener` if it receives their packets;
    /// `data`: it receives packets to other slots' QPs too, not only QP 1's.
    pub(crate) fn new(
        own: QpnSlot,
        medium: String,
        data: bool,
        listener: Option<OwnedFd>,
    ) -> io::Result<Relay> {
        Ok(Relay {
            own,
            medium,
            data,
            members: (0..1 << own.bits).map(|_| None).collect(),
            listener,
            probe: UnixDatagram::unbound()?,
            buf: Vec::new(),
            relayed: 0,
            undeliverable: 0,
        })
    }

    /// Whose `ib` (a RoCE packet from its BTH on) is. A packet too short
    /// to say is this NIC's, which counts it as malformed.
    pub(crate) fn target(&self, ib: &[u8]) -> Target {
        let Some(q) = ib.get(5..8) else {
            return Target::Here;
        };
        let qpn = u32::from_be_bytes([0, q[0], q[1], q[2]]);
        let slot = if qpn == rnic_wire::mad::GSI_QPN {
            match packet_addressee(ib) {
                Some(Addressee::Agent(id)) => id >> (32 - self.own.bits),
                Some(Addressee::Service(s)) => match self.listener(s) {
                    Some(slot) => slot,
                    // Nobody listens: this NIC's CM refuses it.
                    None => return Target::Here,
                },
                // Not a CM message this NIC's CM would take: its counters
                // say so.
                None => return Target::Here,
            }
        } else if self.data {
            qpn >> (24 - self.own.bits)
        } else {
            return Target::Here;
        };
        if slot == self.own.slot {
            Target::Here
        } else {
            Target::Slot(slot)
        }
    }

    /// The slot whose NIC listens on `service`, if any: the lowest that
    /// holds its route.
    fn listener(&self, service: u64) -> Option<u32> {
        (0..1 << self.own.bits).find(|&slot| {
            abstract_addr(&route_name(&self.medium, service, slot))
                .and_then(|a| self.probe.connect_addr(&a))
                .is_ok()
        })
    }

    /// A name that tells whoever relays this NIC's CM messages that this
    /// NIC listens on `service`, for as long as it is held.
    pub(crate) fn route(&self, service: u64) -> io::Result<UnixDatagram> {
        super::bind_abstract(&route_name(&self.medium, service, self.own.slot))
    }

    /// Hand UDP payload `ib`, from `from`, to `slot`'s NIC; false if no
    /// NIC holds the slot (the packet is this NIC's to count, as one for a
    /// QP or connection it does not have).
    pub(crate) fn relay_udp(&mut self, slot: u32, from: SocketAddr, ib: &[u8]) -> bool {
        let ip = match from.ip() {
            IpAddr::V4(a) => a.to_ipv6_mapped(),
            IpAddr::V6(a) => a,
        };
        self.buf.clear();
        self.buf.push(UDP);
        self.buf.extend_from_slice(&ip.octets());
        self.buf.extend_from_slice(&from.port().to_be_bytes());
        self.buf.extend_from_slice(ib);
        self.send(slot)
    }

    /// Hand `frame` (a whole IP packet) to `slot`'s NIC; false as
    /// [`Relay::relay_udp`].
    pub(crate) fn relay_frame(&mut self, slot: u32, frame: &[u8]) -> bool {
        self.buf.clear();
        self.buf.push(FRAME);
        self.buf.extend_from_slice(frame);
        self.send(slot)
    }

    fn send(&mut self, slot: u32) -> bool {
        if self.members.get(slot as usize).is_some_and(Option::is_none) {
            // It may have connected since the engine thread last looked.
            self.accept();
        }
        let Some(Some(c)) = self.members.get(slot as usize) else {
            return false;
        };
        let flags = SendFlags::DONTWAIT | SendFlags::NOSIGNAL;
        match rustix::net::send(c, &self.buf, flags) {
            Ok(_) => self.relayed += 1,
            Err(rustix::io::Errno::AGAIN) => self.undeliverable += 1,
            Err(_) => {
                // Gone: its slot is free again.
                self.members[slot as usize] = None;
                return false;
            }
        }
        true
    }

    /// Take the connections other NICs opened (see [`join`]): each says
    /// its slot first.
    pub(crate) fn accept(&mut self) {
        let Some(listener) = &self.listener else {
            return;
        };
        while let Ok(c) = rustix::net::accept_with(listener, SocketFlags::CLOEXEC) {
            // Its slot, sent right after it connected.
            let _ = rustix::net::sockopt::set_socket_timeout(
                &c,
                rustix::net::sockopt::Timeout::Recv,
                Some(Duration::from_millis(200)),
            );
            let mut slot = [0u8; 4];
            let said = rustix::net::recv(&c, &mut slot, RecvFlags::empty());
            let slot = u32::from_be_bytes(slot) as usize;
            if !matches!(said, Ok((_, 4))) || slot >= self.members.len() {
                continue;
            }
            let _ = rustix::io::ioctl_fionbio(&c, true);
            let _ =
                rustix::net::sockopt::set_socket_send_buffer_size(&c, crate::udp::SOCKET_BUFFER);
            self.members[slot] = Some(c);
        }
    }
}

/// A message from a slot's inbox.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Relayed<'a> {
    /// A UDP payload and its sender.
    Udp(SocketAddr, &'a [u8]),
    /// A whole IP packet.
    Frame(&'a [u8]),
}

/// Read a message of a slot's inbox; `None` if it is not one.
pub(crate) fn decode(m: &[u8]) -> Option<Relayed<'_>> {
    match *m.first()? {
        UDP if m.len() >= UDP_HEADER => {
            let ip: [u8; 16] = m[1..17].try_into().ok()?;
            let ip = Ipv6Addr::from(ip);
            let ip = ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4);
            let port = u16::from_be_bytes([m[17], m[18]]);
            Some(Relayed::Udp(SocketAddr::new(ip, port), &m[UDP_HEADER..]))
        }
        FRAME => Some(Relayed::Frame(&m[1..])),
        _ => None,
    }
}
