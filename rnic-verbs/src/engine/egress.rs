//! What leaves: the datagrams the NIC built, shaped for the kernel's UDP
//! sockets. A pump has the NIC build a paced amount, lets an impairment
//! have its way with them, sends each run from one address and source port
//! out of the socket bound there, as UDP GSO sends where the kernel takes
//! them (each segment's ICRC made for the IPv4 identification the kernel
//! gives it), and plain ACKs last.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;

use rnic_core::Datagram;
use rnic_wire::icrc::IdDeltas;

use super::state::EngineState;
use super::ROCE_PORT;
use crate::frames::Outgoing;

/// Bursts of packets one pump has the NIC build at most
/// ([`rnic_core::Nic::generate_burst`]: a QP's READ responses and requests).
const PUMP_BURSTS: usize = 4;

impl EngineState {
    /// After anything that may have produced packets, completions or events:
    /// send the packets, deliver the rest.
    ///
    /// What the NIC builds is paced: a pump has it build at most
    /// [`PUMP_BURSTS`] bursts of READ responses and requests, and the
    /// engine comes back for the rest after taking in what arrived (the
    /// engine thread, or while it leaves the socket to polling threads,
    /// their next poll), so a READ of 64 MiB does not hold up the ACKs and
    /// requests of every other connection while it is answered.
    pub(super) fn pump(&mut self, socket: &UdpSocket) {
        let now = self.now();
        self.hold.release(now);
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
            if self.impair.is_some() && self.observed() {
                // Seen as the NIC sends them, before the impairment (a
                // stand-in for the network beyond the NIC) loses, copies,
                // holds back or damages them.
                for d in &tx {
                    self.observe(true, now, d);
                }
            }
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
            // out of the socket bound to them (the ICRC covers both), or
            // past IP and UDP on loopback.
            let own = self.nic.addr();
            let mut at = 0;
            let mut gso_refused = false;
            let mut frames_failed = None;
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
                } else {
                    self.groups.clear();
                    self.groups.resize(run, 1);
                }
                // As they leave: with the ICRC each segment carries.
                if self.impair.is_none() {
                    for d in &tx[at..at + run] {
                        self.observe(true, now, d);
                    }
                }
                let out = Out {
                    from: self
                        .send_sockets
                        .get(&source)
                        .or((source.0 == own).then_some(socket)),
                    gso: self.gso,
                    scope: self.scope,
                };
                let run = &tx[at..at + run];
                at += run.len();
                // Past IP and UDP where the sender takes them and the
                // destination can be sent to so (a ring takes its packets
                // in, on loopback; the kernel knows its link-layer
                // address, on an interface); otherwise, and after a send
                // that way failed, through the socket. In the order they
                // were built either way (what goes through the socket
                // before messages that go past leaves first): the receiver
                // takes each connection's packets in order.
                // Messages from `g0` (datagrams from `d0`) are not sent yet;
                // `g` (`d`) is the next to look at.
                let (mut g0, mut d0, mut g, mut d) = (0, 0, 0, 0);
                while let Some(tx) = self
                    .frame_tx
                    .as_ref()
                    .filter(|_| frames_failed.is_none() && g < self.groups.len())
                {
                    let peers = &mut self.peers;
                    let mut past = |n: usize, at: usize| {
                        run[at..at + n]
                            .iter()
                            .all(|x| tx.takes(n, x.src, x.dst) && peers.mac(x.dst, now).is_some())
                    };
                    // The messages from `g` on that go past, to `g1` (`d1`).
                    let (mut g1, mut d1) = (g, d);
                    while g1 < self.groups.len() && past(self.groups[g1], d1) {
                        d1 += self.groups[g1];
                        g1 += 1;
                    }
                    if g1 == g {
                        d += self.groups[g];
                        g += 1;
                        continue;
                    }
                    gso_refused |= out.send(&self.groups[g0..g], &run[d0..d]);
                    let these = &self.groups[g..g1];
                    let peers = &self.peers;
                    match tx.send(these, |j| outgoing(&run[d + j], peers)) {
                        Ok(sent) => self.frames_sent += sent as u64,
                        Err(e) => {
                            frames_failed = Some(e);
                            gso_refused |= out.send(these, &run[d..d1]);
                        }
                    }
                    (g0, d0, g, d) = (g1, d1, g1, d1);
                }
                gso_refused |= out.send(&self.groups[g0..], &run[d0..]);
                if gso_refused && self.gso {
                    tracing::info!(
                        "the kernel refused a UDP GSO send: one datagram per message from now on"
                    );
                    self.gso = false;
                }
            }
            if let Some(e) = frames_failed {
                tracing::info!(
                    "a send past IP and UDP failed, through the UDP socket from now on: {e}"
                );
                self.frame_tx = None;
            }
            for d in tx.drain(..) {
                self.nic.recycle(d.payload);
            }
            self.tx = tx;
        }
        self.close_retired();
        self.deliver();
    }
}

/// Where this NIC may send past IP and UDP (see [`crate::frames::FrameSender`]), as far
/// as it knows: on loopback, to the addresses whose packets a receive ring
/// takes in ([`super::sockets::mark_ring`]); on an interface, to those
/// whose link-layer address the kernel's neighbour table holds. Asked
/// again after [`Peers::FOR`]: a NIC that closed and one that opened on the
/// same address without a ring, or a neighbour that moved, cost RC
/// retransmissions for that long at most. A no is asked again sooner
/// ([`Peers::FOR_NO`]): the neighbour table learns a peer's address from
/// the first datagrams the UDP socket sends it.
#[derive(Debug, Default)]
pub(crate) struct Peers {
    /// The interface whose neighbours these are; None: loopback's rings.
    iface: Option<String>,
    /// Each address's link-layer address (loopback's: zeroes) or None, and
    /// when it was asked.
    known: std::collections::HashMap<IpAddr, (Option<[u8; 6]>, u64)>,
}

impl Peers {
    /// How long an answer holds (ns).
    const FOR: u64 = 1_000_000_000;
    /// How long a no holds (ns).
    const FOR_NO: u64 = 20_000_000;

    /// The neighbours of interface `name`.
    pub(crate) fn on(name: &str) -> Peers {
        Peers {
            iface: Some(name.to_owned()),
            known: Default::default(),
        }
    }

    /// The link-layer address to send to `addr` at, if it may be sent to.
    fn mac(&mut self, addr: IpAddr, now: rnic_core::time::Time) -> Option<[u8; 6]> {
        match self.known.get(&addr) {
            Some(&(mac, at))
                if now.0.saturating_sub(at)
                    < if mac.is_some() {
                        Self::FOR
                    } else {
                        Self::FOR_NO
                    } =>
            {
                mac
            }
            _ => {
                let mac = match (&self.iface, addr) {
                    (None, _) => super::sockets::ring_marked(addr).then_some([0; 6]),
                    (Some(i), IpAddr::V4(a)) => crate::frames::neighbour(a, i),
                    (Some(_), IpAddr::V6(_)) => None,
                };
                self.known.insert(addr, (mac, now.0));
                mac
            }
        }
    }

    /// What [`Peers::mac`] last found for `addr`.
    fn known(&self, addr: IpAddr) -> [u8; 6] {
        self.known.get(&addr).and_then(|k| k.0).unwrap_or([0; 6])
    }
}

/// Where a run of datagrams from one address and port leaves through the
/// UDP socket.
struct Out<'a> {
    /// The socket bound to the address and port (none: the datagrams are
    /// lost, which a NIC that sends only from its own sockets never sees).
    from: Option<&'a UdpSocket>,
    /// Whether messages of several datagrams go as GSO sends.
    gso: bool,
    /// The scope of a link-local IPv6 destination.
    scope: u32,
}

impl Out<'_> {
    /// Send `groups` (datagrams per message) of `datagrams`. Datagrams the
    /// socket buffer refused are lost, as on a full link. Whether the
    /// kernel refused a GSO send for good (see [`crate::udp::Sent`]).
    fn send(&self, groups: &[usize], datagrams: &[Datagram]) -> bool {
        let Some(from) = self.from.filter(|_| !groups.is_empty()) else {
            return false;
        };
        let to = |j: usize| {
            let to = datagrams[j].dst;
            (
                to_socket_addr(to, super::state::scope_for(self.scope, to)),
                &datagrams[j].payload[..],
            )
        };
        if self.gso {
            crate::udp::send_groups(from.as_fd(), groups, to).is_ok_and(|s| s.gso_refused)
        } else {
            let _ = crate::udp::send(from.as_fd(), datagrams.len(), to);
            false
        }
    }
}

/// A datagram as [`crate::frames::FrameSender::send`] takes it (one it
/// [takes](crate::frames::FrameSender::takes): IPv4), to the link-layer address `peers`
/// found for its destination.
fn outgoing<'a>(d: &'a Datagram, peers: &Peers) -> Outgoing<'a> {
    let v4 = |a: IpAddr| match a {
        IpAddr::V4(a) => a,
        IpAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
    };
    Outgoing {
        src: v4(d.src),
        dst: v4(d.dst),
        src_port: d.src_port,
        mac: peers.known(d.dst),
        ib: &d.payload,
    }
}

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

/// Port 4791 of `to`, with `scope` if it is a link-local IPv6 address.
fn to_socket_addr(to: IpAddr, scope: u32) -> SocketAddr {
    match to {
        IpAddr::V6(a) => SocketAddr::V6(std::net::SocketAddrV6::new(a, ROCE_PORT, 0, scope)),
        IpAddr::V4(_) => SocketAddr::new(to, ROCE_PORT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether an address has a ring is what its mark says, asked again
    /// once a yes is a second old (a NIC that let its ring go, or ended, is
    /// sent nothing past IP and UDP from then on), a no sooner.
    #[test]
    fn a_ring_peer_is_one_whose_mark_is_held_as_of_the_last_second() {
        use rnic_core::time::Time;
        // An address no other NIC of the tests holds.
        let addr = crate::reserve_loopback().unwrap();
        let mut peers = Peers::default();
        let ring = |p: &mut Peers, t| p.mac(addr, Time(t)).is_some();
        assert!(!ring(&mut peers, 0), "no mark, no ring");
        let mark = super::super::sockets::mark_ring(addr).unwrap();
        assert!(!ring(&mut peers, Peers::FOR_NO - 1), "the no holds");
        let yes = Peers::FOR_NO;
        assert!(ring(&mut peers, yes), "asked again");
        drop(mark);
        assert!(
            ring(&mut peers, yes + Peers::FOR - 1),
            "the yes holds longer"
        );
        assert!(!ring(&mut peers, yes + Peers::FOR), "the mark is gone");
    }

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
}
