//! What the NIC hands its transport: a [`Datagram`] (what a UDP socket on
//! port 4791 carries, BTH through ICRC, with its addresses), and with it
//! what the packet is ([`Header`]).
//!
//! A driver orders, holds and traces datagrams by what they are: it sends
//! plain ACKs after the requests of a batch, holds them for the program's
//! answer, and names the QP and opcode in its trace. The NIC built each
//! packet from a header it knew, so it says what it built, and the driver
//! never parses bytes the NIC produced (as quinn-proto's `Transmit` tells
//! its driver the destination and segment size). Packets the NIC takes
//! in come back the same way: [`crate::Nic::handle_udp`] says what it read.

use core::net::IpAddr;

use rnic_wire::aeth::Syndrome;
use rnic_wire::opcode::Operation;
use rnic_wire::{aeth, bth, icrc, IbPacket, IbRepr, Opcode, Psn};

/// A UDP datagram to port 4791.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// Sender.
    pub src: IpAddr,
    /// Receiver.
    pub dst: IpAddr,
    /// UDP source port.
    pub src_port: u16,
    /// The UDP payload: an IB transport packet, BTH through ICRC.
    pub payload: Vec<u8>,
    /// What the packet is: as the NIC built it, or as its bytes read when
    /// they came from elsewhere ([`Datagram::new`]); `None` if they do not
    /// read as a packet of a known opcode.
    pub header: Option<Header>,
    /// The IPv4 identification it carries, which its ICRC covers: 0 as the
    /// NIC builds every packet ([`icrc::for_udp`]'s convention), segment
    /// i's index once [`Datagram::set_ipv4_id`] made its ICRC for it, and
    /// for a packet taken in, the one it arrived with ([`Arrival`]). IPv6
    /// has none: 0.
    pub ipv4_id: u16,
}

impl Datagram {
    /// A datagram of bytes built elsewhere (a test's forgery, a capture, a
    /// peer's packet): what it is, is read from its BTH and AETH.
    pub fn new(src: IpAddr, dst: IpAddr, src_port: u16, payload: Vec<u8>) -> Datagram {
        Datagram {
            src,
            dst,
            src_port,
            header: Header::read(&payload),
            payload,
            ipv4_id: 0,
        }
    }

    /// Whether it is a plain RC ACK: an ACKNOWLEDGE whose syndrome is ACK,
    /// not a NAK.
    pub fn is_plain_ack(&self) -> bool {
        self.header.is_some_and(|h| h.kind == Kind::Ack)
    }

    /// Make its ICRC, computed for IPv4 identification 0 as the NIC computes
    /// it ([`rnic_wire::icrc::for_udp`]), the one for identification `id`:
    /// what segment `id` of a UDP GSO send carries, the kernel numbering a
    /// send's segments 0, 1, 2, ... An IPv6 datagram has no identification
    /// and is left as it is. `deltas` caches the work for one length.
    pub fn set_ipv4_id(&mut self, id: u16, deltas: &mut Option<icrc::IdDeltas>) {
        // A payload too short for an ICRC was never built by the NIC.
        if self.dst.is_ipv4() && icrc::set_ipv4_id(&mut self.payload, id, deltas).is_ok() {
            self.ipv4_id = id;
        }
    }
}

/// A packet the NIC took in ([`crate::Nic::handle_udp`],
/// [`crate::Nic::handle_frame`]): its addresses and what it is, as the NIC
/// read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// The IP source address.
    pub src: IpAddr,
    /// The IP destination address.
    pub dst: IpAddr,
    /// The UDP source port.
    pub src_port: u16,
    /// What the packet is.
    pub header: Header,
    /// The IPv4 identification it carried: a frame's own; over UDP, the
    /// one its ICRC verified with (0 where none did, and in IPv6).
    pub ipv4_id: u16,
}

/// What a packet is, from its BTH (and AETH).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// The BTH's opcode.
    pub opcode: Opcode,
    /// The BTH's destination QP: the receiver's QP.
    pub dest_qp: u32,
    /// The BTH's PSN.
    pub psn: Psn,
    /// Request, response, ACK or NAK.
    pub kind: Kind,
}

/// Which of a connection's streams a packet belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// What a requester sends: SEND, WRITE, READ request, atomics, FLUSH,
    /// and every UD and UC packet.
    Request,
    /// A READ response or an ATOMIC ACKNOWLEDGE: a response with data.
    Response,
    /// An ACKNOWLEDGE whose syndrome is ACK.
    Ack,
    /// An ACKNOWLEDGE whose syndrome is an RNR NAK, a NAK, or reserved.
    Nak,
    /// A congestion notification packet.
    Cnp,
}

impl Header {
    /// The header of a packet the NIC builds from `ib`.
    pub fn of(ib: &IbRepr) -> Header {
        let syndrome = ib.aeth.map(|a| a.syndrome);
        Header::new(ib.bth.opcode, ib.bth.dest_qp, ib.bth.psn, syndrome)
    }

    /// The header of a packet the NIC parsed.
    pub fn of_packet(p: &IbPacket<&[u8]>) -> Header {
        let bth = p.bth();
        let syndrome = p.aeth().map(|a| Syndrome::from_byte(a.syndrome()));
        Header::new(bth.opcode(), bth.dest_qp(), bth.psn(), syndrome)
    }

    /// The header of the packet in `payload` (BTH onwards), if it has a
    /// whole BTH of a known opcode and, for an ACKNOWLEDGE, its AETH.
    pub fn read(payload: &[u8]) -> Option<Header> {
        let bth = bth::Packet::new_checked(payload).ok()?;
        let opcode = bth.opcode();
        let syndrome = match opcode.info()?.operation {
            Operation::Acknowledge => {
                let a = aeth::Packet::new_checked(payload.get(bth::HEADER_LEN..)?).ok()?;
                Some(Syndrome::from_byte(a.syndrome()))
            }
            _ => None,
        };
        Some(Header::new(opcode, bth.dest_qp(), bth.psn(), syndrome))
    }

    /// The header of a packet of `opcode` to `dest_qp` at `psn`, whose
    /// AETH (if any) has `syndrome`.
    fn new(opcode: Opcode, dest_qp: u32, psn: Psn, syndrome: Option<Syndrome>) -> Header {
        Header {
            opcode,
            dest_qp,
            psn,
            kind: Kind::of(opcode, syndrome),
        }
    }

    /// Whether the packet ends a request its responder serves without a
    /// completion ([`rnic_wire::opcode::OpcodeInfo::ends_without_responder_completion`]):
    /// no thread polling a completion queue on the responder waits for it.
    pub fn ends_without_responder_completion(&self) -> bool {
        self.opcode
            .info()
            .is_some_and(|i| i.ends_without_responder_completion())
    }

    /// The opcode's IBTA name (`RC_SEND_ONLY`).
    pub fn name(&self) -> &'static str {
        self.opcode.name().unwrap_or("unknown")
    }
}

impl Kind {
    /// The kind of a packet of `opcode`, whose AETH (if any) has `syndrome`.
    fn of(opcode: Opcode, syndrome: Option<Syndrome>) -> Kind {
        match opcode.info().map(|i| i.operation) {
            Some(Operation::RdmaReadResponse | Operation::AtomicAcknowledge) => Kind::Response,
            Some(Operation::Acknowledge) => match syndrome {
                Some(Syndrome::Ack { .. }) => Kind::Ack,
                _ => Kind::Nak,
            },
            Some(Operation::Cnp) => Kind::Cnp,
            _ => Kind::Request,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a datagram's bytes say it is: the header a NIC would have
    /// given it when it built it.
    #[test]
    fn a_datagram_says_what_its_bytes_are() {
        let from = IpAddr::from([127, 0, 0, 1]);
        let to = IpAddr::from([127, 0, 0, 2]);
        let d = |bytes: &[u8]| Datagram::new(from, to, 49152, bytes.to_vec());
        // RC ACKNOWLEDGE to QP 0x000012, PSN 0x000102, syndrome and ICRC.
        let ack = [
            0x11, 0, 0xFF, 0xFF, 0, 0, 0, 0x12, 0, 0, 1, 2, 0x1F, 0, 0, 1, 0, 0, 0, 0,
        ];
        let h = d(&ack).header.expect("an ACK reads");
        assert_eq!(
            (h.opcode, h.dest_qp, h.psn),
            (Opcode(0x11), 0x12, Psn::new(0x102))
        );
        assert_eq!(h.kind, Kind::Ack);
        assert!(d(&ack).is_plain_ack());
        let mut nak = ack;
        nak[12] = 0x60; // NAK, PSN sequence error
        assert_eq!(d(&nak).header.map(|h| h.kind), Some(Kind::Nak));
        assert!(!d(&nak).is_plain_ack());
        let mut rnr = ack;
        rnr[12] = 0x2E; // RNR NAK
        assert_eq!(d(&rnr).header.map(|h| h.kind), Some(Kind::Nak));
        let mut read_response = ack;
        read_response[0] = 0x10; // RC RDMA READ RESPONSE ONLY
        assert_eq!(
            d(&read_response).header.map(|h| h.kind),
            Some(Kind::Response)
        );
        let mut write = [0u8; 32];
        write[0] = 0x0A; // RC RDMA WRITE ONLY
        let w = d(&write).header.unwrap();
        assert_eq!(w.kind, Kind::Request);
        assert!(w.ends_without_responder_completion());
        assert_eq!(d(&ack[..11]).header, None, "a short BTH is nothing");
        assert_eq!(
            d(&ack[..14]).header,
            None,
            "an ACK without its AETH is nothing"
        );
        let mut unknown = ack;
        unknown[0] = 0x1F;
        assert_eq!(d(&unknown).header, None, "an unknown opcode is nothing");
    }

    /// A datagram renumbered as GSO segment 3 carries identification 3,
    /// and the frame it travels in verifies with it; IPv6 has none.
    #[test]
    fn a_renumbered_datagram_carries_its_identification() {
        let (from, to) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        let mut payload = vec![
            0x11, 0, 0xFF, 0xFF, 0, 0, 0, 0x12, 0, 0, 1, 2, 0x1F, 0, 0, 1,
        ];
        let crc = icrc::for_udp(from, to, 0xC000, &payload).unwrap();
        payload.extend_from_slice(&crc.to_le_bytes());
        let mut d = Datagram::new(from, to, 0xC000, payload);
        assert_eq!(d.ipv4_id, 0);
        let mut cache = None;
        d.set_ipv4_id(3, &mut cache);
        assert_eq!(d.ipv4_id, 3);
        let frame = crate::sim::frame_of(&d);
        assert_eq!(icrc::verify(&frame[14..]), Ok(true), "the frame carries 3");
        let v6 = IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, 1]);
        let mut d6 = Datagram::new(v6, v6, 0xC000, d.payload.clone());
        let before = d6.payload.clone();
        d6.set_ipv4_id(3, &mut cache);
        assert_eq!(
            (d6.ipv4_id, d6.payload),
            (0, before),
            "IPv6 has no identification"
        );
    }
}
