//! Several NICs on one address, as a host's processes share its
//! addresses: each NIC takes a slot of the address's QP number space
//! (its top `SLOT_BITS` bits, see [`rnic_core::Nic::restrict_qpns`]),
//! and the CM's IDs take the same slot of theirs. Whoever receives the
//! address's packets hands each one that is another slot's to that slot's
//! NIC, through an abstract Unix datagram socket named after the slot (the
//! slot's claim itself: it vanishes with its holder, however it ends):
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
use std::os::unix::net::UnixDatagram;

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

/// The name of `slot`'s claim on `medium`, which is its inbox.
fn inbox_name(medium: &str, slot: u32) -> String {
    format!("rnic/qpn-slot/{medium}/{slot}")
}

/// The name `slot`'s NIC holds while it listens on `service`.
fn route_name(medium: &str, service: u64, slot: u32) -> String {
    format!("rnic/cm-route/{medium}/{service:016x}/{slot}")
}

/// Take the first free slot of `medium`'s QP number space (an interface's
/// name, or [`udp_medium`] of an address), for as long as the returned
/// socket is open: it is the slot's inbox, where relayed packets arrive.
pub(crate) fn claim_slot(medium: &str) -> io::Result<(QpnSlot, UnixDatagram)> {
    for slot in 0..1 << SLOT_BITS {
        match super::bind_abstract(&inbox_name(medium, slot)) {
            Ok(s) => {
                s.set_nonblocking(true)?;
                crate::udp::ask_recv_buffer(std::os::fd::AsFd::as_fd(&s));
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
    /// Sends to other slots' inboxes; unbound.
    out: UnixDatagram,
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
    /// The part of the NIC in slot `own` of `medium`; `data`: it receives
    /// packets to other slots' QPs too.
    pub(crate) fn new(own: QpnSlot, medium: String, data: bool) -> io::Result<Relay> {
        let out = UnixDatagram::unbound()?;
        out.set_nonblocking(true)?;
        Ok(Relay {
            own,
            medium,
            data,
            out,
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
        let to = abstract_addr(&inbox_name(&self.medium, slot));
        match to.and_then(|a| self.out.send_to_addr(&self.buf, &a)) {
            Ok(_) => self.relayed += 1,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.undeliverable += 1,
            Err(_) => return false,
        }
        true
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
