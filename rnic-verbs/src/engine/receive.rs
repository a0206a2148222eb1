//! What comes in: a batch of datagrams from the UDP socket, or of frames
//! from the frame transport's packet socket, each run through the NIC in
//! the order it arrived, straight from the receive buffer; then what that
//! produced is sent, or held for the program (see [`super::hold`]).
//!
//! The two transports differ only here, in how a packet comes in (both
//! send from UDP sockets), so they are an enum matched in one place
//! rather than a trait: see `DESIGN.md`.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};

use rnic_core::time::Time;
use rnic_core::Datagram;
use rnic_wire::encap::LinkType;

use crate::frames::Ring;
use crate::udp::RecvBatch;

use super::relay::{Relayed, Target};
use super::state::EngineState;

/// Where the engine receives: the UDP socket on port 4791, a frame socket
/// on an interface (see `frames`), or the inbox where the NIC that
/// receives its address's packets hands on this NIC's (see [`super::relay`]).
#[derive(Debug, Clone, Copy)]
pub(super) enum Rx<'a> {
    /// A UDP socket on port 4791.
    Udp(&'a UdpSocket),
    /// A frame socket on an interface, read through its ring.
    Frames(&'a Ring),
    /// The NIC's slot's inbox.
    Relayed(BorrowedFd<'a>),
}

impl<'a> Rx<'a> {
    pub(super) fn fd(self) -> BorrowedFd<'a> {
        match self {
            Rx::Udp(s) => s.as_fd(),
            Rx::Frames(r) => r.fd(),
            Rx::Relayed(f) => f,
        }
    }
}

/// One message taken in: the IB packets in it (more than one where GRO
/// joined datagrams) and where it came from; None if it was cut short or
/// is not a packet at all.
type Message<'a> = Option<(std::slice::Chunks<'a, u8>, Source<'a>)>;

/// The message of a frame (an IP packet): its IB packet, whole.
fn frame_message(f: &[u8]) -> (std::slice::Chunks<'_, u8>, Source<'_>) {
    let p = crate::frames::ib_packet(f);
    (p.chunks(p.len().max(1)), Source::Frame(f))
}

/// Where one received packet came from.
#[derive(Debug, Clone, Copy)]
enum Source<'a> {
    /// A UDP socket: the sender's address and port.
    Udp(SocketAddr),
    /// A frame socket: the whole IP packet.
    Frame(&'a [u8]),
}

/// What one [`EngineState::receive_at_most`] took in.
#[derive(Debug, Clone, Copy)]
pub(super) struct Received {
    /// Packets (0: none was waiting).
    pub(super) packets: usize,
    /// Of those, requests that end without a completion here (a WRITE's
    /// last packet, a READ or atomic request): no thread polling a
    /// completion queue waits for them.
    pub(super) unpolled: usize,
    /// The inbox's other end has closed: the NIC that relayed this one's
    /// packets is gone.
    pub(super) closed: bool,
}

impl EngineState {
    /// Receive one batch (at most `most` messages, see
    /// [`crate::udp::RecvBatch::recv_at_most`]; from a frame socket, the
    /// frames its ring holds, up to a whole batch) from `rx` and run each
    /// packet through the NIC in arrival order, straight from the receive
    /// buffer or the ring. Then deliver completions and send what that
    /// produced (from `socket` and the other UDP sockets), or hold it: if
    /// it is ACKs alone, the program polls or posts (`program_active`) and
    /// answers requests, for its next post (see
    /// [`super::hold::Hold::hold_for_answer`]); else, with `may_hold` (a
    /// poller's call while the engine thread is away) when it delivered a
    /// completion, for the poller's next call (see
    /// [`super::Engine::progress`]). Called through
    /// [`super::shared::Shared::receive`], which deals with an inbox found
    /// closed.
    pub(super) fn receive_at_most(
        &mut self,
        rx: Rx<'_>,
        socket: &UdpSocket,
        may_hold: bool,
        program_active: bool,
        most: usize,
    ) -> Received {
        let mut got = Received {
            packets: 0,
            unpolled: 0,
            closed: false,
        };
        let dst = self.nic.addr();
        // When the first message was taken in; None if none was.
        let mut now = None;
        if let Rx::Frames(ring) = rx {
            // `most` spares a system call that would find nothing; a look
            // at the ring costs a load, and a full batch is taken.
            for _ in 0..crate::udp::BATCH {
                let Some(frame) = ring.next() else { break };
                let now = *now.get_or_insert_with(|| self.now());
                if ring.carries_udp() {
                    ring.datagram(&frame, |d| {
                        let message = d.map(|(from, p, seg)| (p.chunks(seg), Source::Udp(from)));
                        self.message_in(rx, message, now, dst, &mut got);
                    });
                    continue;
                }
                self.message_in(rx, frame.bytes().map(frame_message), now, dst, &mut got);
            }
        } else {
            // ICMP errors from earlier sends (port unreachable) surface here
            // as errors: nothing to receive this round.
            let taken = self.rx.recv_at_most(rx.fd(), most).unwrap_or_default();
            if taken == 0 {
                return got;
            }
            // The batch is lent out while the NIC takes its messages in:
            // the messages borrow it, the NIC the rest of the state.
            let batch = std::mem::replace(&mut self.rx, RecvBatch::unallocated());
            let now = *now.insert(self.now());
            for i in 0..taken {
                // A connection's end reads as an empty message, and again
                // at each read: every header of the batch is one. The relay
                // never sends an empty message, so this is the end, not a
                // packet.
                if matches!(rx, Rx::Relayed(_)) && batch.frame(i).is_some_and(<[u8]>::is_empty) {
                    got.closed = true;
                    break;
                }
                let message = match rx {
                    Rx::Udp(_) => batch.get(i).map(|(p, from)| (p, Source::Udp(from))),
                    Rx::Relayed(_) => match batch.frame(i).and_then(super::relay::decode) {
                        Some(Relayed::Udp(from, p)) => {
                            Some((p.chunks(p.len().max(1)), Source::Udp(from)))
                        }
                        Some(Relayed::Frame(f)) => Some(frame_message(f)),
                        None => None,
                    },
                    Rx::Frames(_) => None,
                };
                self.message_in(rx, message, now, dst, &mut got);
            }
            self.rx = batch;
        }
        let Some(now) = now else {
            return got;
        };
        let acks = self.only_acks_queued();
        if acks {
            self.hold.acks_left(now);
        }
        if acks && program_active && self.hold.expects_answer() {
            self.deliver();
            let now = self.now();
            self.hold.hold_for_answer(now);
        } else if may_hold && self.may_hold() && self.deliver() > 0 {
            self.hold_queued();
        } else {
            self.pump(socket);
        }
        got
    }

    /// Run one message taken in from `rx` through the NIC (or hand it on
    /// to the NIC of its slot), counting it in `got`.
    fn message_in(
        &mut self,
        rx: Rx<'_>,
        message: Message<'_>,
        now: Time,
        dst: IpAddr,
        got: &mut Received,
    ) {
        // The IB packets, and where they came from. Another slot's packets
        // (the address's or interface's other NICs') are handed on.
        let Some((packets, source)) = message else {
            got.packets += 1;
            self.nic.count_malformed();
            return;
        };
        if let Source::Frame(f) = source {
            let p = crate::frames::ib_packet(f);
            if p.is_empty() {
                // Not RoCE: the NIC says what it is, and counts it.
                got.packets += 1;
                self.nic.handle_frame(now, LinkType::RawIp, f);
                return;
            }
            if !matches!(rx, Rx::Relayed(_)) {
                let to = self.relay.target(p);
                if let Target::Slot(slot) = to {
                    if self.relay.relay_frame(slot, f) {
                        got.packets += 1;
                        return;
                    }
                }
            }
        }
        for payload in packets {
            got.packets += 1;
            if let (Rx::Udp(_) | Rx::Frames(_), Source::Udp(from)) = (rx, source) {
                if let Target::Slot(slot) = self.relay.target(payload) {
                    if self.relay.relay_udp(slot, from, payload) {
                        continue;
                    }
                }
            }
            // What the NIC read of the packet, with the addresses it
            // carried (a frame's own). A UDP payload that does not
            // parse is still shown, as the socket gave it.
            let arrival = match source {
                Source::Udp(from) => self
                    .nic
                    .handle_udp(now, from.ip(), dst, from.port(), payload)
                    .ok_or(Some((from.ip(), from.port()))),
                Source::Frame(frame) => self
                    .nic
                    .handle_frame(now, LinkType::RawIp, frame)
                    .ok_or(None),
            };
            let header = arrival.ok().map(|a| a.header);
            if header.is_some_and(|h| h.ends_without_responder_completion()) {
                got.unpolled += 1;
            }
            if !self.observed() {
                continue;
            }
            let d = match arrival {
                Ok(a) => Datagram {
                    src: a.src,
                    dst: a.dst,
                    src_port: a.src_port,
                    payload: payload.to_vec(),
                    header,
                    ipv4_id: a.ipv4_id,
                },
                Err(Some((src, src_port))) => Datagram::new(src, dst, src_port, payload.to_vec()),
                Err(None) => continue,
            };
            let span = match header {
                Some(h) if !self.qp_spans.is_empty() => self.qp_span(h.dest_qp),
                _ => tracing::Span::none(),
            };
            let _in_qp = span.enter();
            self.observe(false, now, &d);
        }
    }
}
