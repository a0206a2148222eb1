//! Sessions driven by arbitrary bytes: the bodies of the fuzz targets, and
//! what `cargo test` replays every saved case through.
//!
//! - [`run`] (`nic_packets`): two NICs with a connected QP pair, forged
//!   packets, work requests, the real traffic reordered and lost.
//! - [`responder::run`] (`responder`): one NIC with live RC, UC and UD QPs and
//!   regions of every kind of access, fed request packets that aim near
//!   every bound. Every byte the engine reads or writes is logged and must be
//!   one a valid request was allowed to touch.
//! - [`requester::run`] (`requester`): one NIC whose RC QP talks to a peer
//!   the input plays, with ACKs, NAKs, READ responses and atomic ACKs,
//!   interleaved with posts and timers. Completions come once and in order,
//!   only READ and atomic targets are written, and once the peer falls
//!   silent every work request completes.
//! - [`check::run`] (`check`): `rnic check`'s conformance checker fed
//!   real captures' frames mutated; it never panics and names only
//!   packets it was fed.
//! - [`cm::run`] (`cm`): two NICs' communication managers on QP 1, the
//!   real exchange lost, duplicated and reordered among forged MADs; the
//!   listener is never connected to what it did not accept, and holds no
//!   more than its backlog.

mod arena;
pub mod check;
pub mod cm;
pub mod requester;
pub mod responder;
mod session;

pub use session::run;

/// Bytes from the input, zeros once it runs out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }
    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

/// The path MTUs a harness's setup byte picks from.
const MTUS: [crate::qp::Mtu; 3] = [
    crate::qp::Mtu::Mtu256,
    crate::qp::Mtu::Mtu1024,
    crate::qp::Mtu::Mtu4096,
];

/// `p` (BTH onwards, no ICRC) as a datagram from `from`'s UDP port `port`
/// to `to`, with its ICRC appended (one bit of it flipped if `bad`).
fn datagram(
    from: core::net::IpAddr,
    to: core::net::IpAddr,
    port: u16,
    mut p: Vec<u8>,
    bad: bool,
) -> crate::Datagram {
    let crc = rnic_wire::icrc::for_udp(from, to, port, &p).unwrap_or(0);
    p.extend_from_slice(&(crc ^ u32::from(bad)).to_le_bytes());
    crate::Datagram::new(from, to, port, p)
}

/// Panics unless a datagram a NIC sent parses, carries exactly its
/// opcode's headers and has a correct ICRC.
fn assert_well_formed(d: &crate::Datagram) {
    if let Err(why) = well_formed(d) {
        panic!("the NIC sent a bad packet ({why}): {d:?}");
    }
}

fn well_formed(d: &crate::Datagram) -> Result<(), &'static str> {
    use rnic_wire::ib::{IbPacket, IbRepr};
    let pkt = IbPacket::new_checked(&d.payload[..]).map_err(|_| "does not parse")?;
    let crc =
        rnic_wire::icrc::for_udp(d.src, d.dst, d.src_port, pkt.covered()).map_err(|_| "no ICRC")?;
    if crc != pkt.icrc() {
        return Err("wrong ICRC");
    }
    let repr = IbRepr::parse(&pkt).map_err(|_| "headers do not parse")?;
    repr.check()
        .map_err(|_| "headers do not match the opcode")?;
    Ok(())
}
