//! The BTH opcode table as data (IBTA Table 38, the RoCE v2 CNP, and the IBTA 1.5
//! FLUSH and ATOMIC WRITE): for every opcode, its name, transport, the extension
//! headers that follow the BTH in order, whether a payload follows, and its place
//! in a message.

use core::fmt;

/// A BTH opcode: the top three bits name the transport, the low five the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

/// The transport service an opcode belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected (0x00-0x1F).
    Rc,
    /// Unreliable Connected (0x20-0x3F).
    Uc,
    /// Unreliable Datagram (0x60-0x7F).
    Ud,
    /// Congestion notification (0x80-0x9F; RoCE v2 uses 0x81).
    Cnp,
    /// Extended Reliable Connected (0xA0-0xBF).
    Xrc,
}

impl Transport {
    /// Short name: RC, UC, UD, CNP, XRC.
    pub const fn name(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Ud => "UD",
            Transport::Cnp => "CNP",
            Transport::Xrc => "XRC",
        }
    }
}

/// An extension header that can follow the BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExtHeader {
    /// XRC Extended Transport Header, 4 bytes.
    XrcEth,
    /// Datagram Extended Transport Header, 8 bytes.
    Deth,
    /// FLUSH Extended Transport Header, 4 bytes.
    Feth,
    /// RDMA Extended Transport Header, 16 bytes.
    Reth,
    /// Atomic Extended Transport Header, 28 bytes.
    AtomicEth,
    /// Immediate Data, 4 bytes.
    ImmDt,
    /// Invalidate Extended Transport Header, 4 bytes.
    Ieth,
    /// ACK Extended Transport Header, 4 bytes.
    Aeth,
    /// Atomic Acknowledge Extended Transport Header, 8 bytes.
    AtomicAckEth,
    /// The CNP's 16 reserved bytes.
    CnpPad,
}

impl ExtHeader {
    /// A bit for this header in [`OpcodeInfo::header_mask`].
    pub const fn bit(self) -> u16 {
        1 << (self as u16)
    }

    /// Length in bytes.
    pub const fn wire_len(self) -> usize {
        match self {
            ExtHeader::XrcEth => crate::xrceth::HEADER_LEN,
            ExtHeader::Deth => crate::deth::HEADER_LEN,
            ExtHeader::Feth => crate::feth::HEADER_LEN,
            ExtHeader::Reth => crate::reth::HEADER_LEN,
            ExtHeader::AtomicEth => crate::atomic_eth::HEADER_LEN,
            ExtHeader::ImmDt => crate::immdt::HEADER_LEN,
            ExtHeader::Ieth => crate::ieth::HEADER_LEN,
            ExtHeader::Aeth => crate::aeth::HEADER_LEN,
            ExtHeader::AtomicAckEth => crate::atomic_ack_eth::HEADER_LEN,
            ExtHeader::CnpPad => crate::cnp::HEADER_LEN,
        }
    }

    /// The parse-error layer of this header.
    pub const fn layer(self) -> crate::Layer {
        use crate::Layer;
        match self {
            ExtHeader::XrcEth => Layer::XrcEth,
            ExtHeader::Deth => Layer::Deth,
            ExtHeader::Feth => Layer::Feth,
            ExtHeader::Reth => Layer::Reth,
            ExtHeader::AtomicEth => Layer::AtomicEth,
            ExtHeader::ImmDt => Layer::ImmDt,
            ExtHeader::Ieth => Layer::Ieth,
            ExtHeader::Aeth => Layer::Aeth,
            ExtHeader::AtomicAckEth => Layer::AtomicAckEth,
            ExtHeader::CnpPad => Layer::Cnp,
        }
    }
}

/// Where a packet stands in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message.
    First,
    /// Neither first nor last.
    Middle,
    /// Last packet of a multi-packet message.
    Last,
    /// The whole message in one packet.
    Only,
}

impl Position {
    /// True for First and Only: the packet starts a message.
    pub const fn starts_message(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }
    /// True for Last and Only: the packet ends a message.
    pub const fn ends_message(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// What an opcode does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// SEND (any position, with or without immediate or invalidate).
    Send,
    /// RDMA WRITE (any position, with or without immediate).
    RdmaWrite,
    /// RDMA READ request.
    RdmaReadRequest,
    /// RDMA READ response.
    RdmaReadResponse,
    /// ACKNOWLEDGE.
    Acknowledge,
    /// ATOMIC ACKNOWLEDGE.
    AtomicAcknowledge,
    /// CmpSwap.
    CompareSwap,
    /// FetchAdd.
    FetchAdd,
    /// FLUSH.
    Flush,
    /// ATOMIC WRITE.
    AtomicWrite,
    /// Congestion notification.
    Cnp,
}

/// Everything rnic knows about one opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// The opcode.
    pub opcode: Opcode,
    /// IBTA name, transport first: `RC_SEND_FIRST`.
    pub name: &'static str,
    /// Transport service.
    pub transport: Transport,
    /// What it does.
    pub operation: Operation,
    /// Place in a message.
    pub position: Position,
    /// Extension headers after the BTH, in wire order.
    pub headers: &'static [ExtHeader],
    /// Whether a payload follows the headers.
    pub has_payload: bool,
    /// One [`ExtHeader::bit`] per extension header present.
    pub header_mask: u16,
}

const fn mask_of(headers: &[ExtHeader]) -> u16 {
    let mut m = 0;
    let mut i = 0;
    while i < headers.len() {
        m |= headers[i].bit();
        i += 1;
    }
    m
}

impl OpcodeInfo {
    /// Bytes of the BTH and all extension headers.
    pub const fn header_len(&self) -> usize {
        let mut n = crate::bth::HEADER_LEN;
        let mut i = 0;
        while i < self.headers.len() {
            n += self.headers[i].wire_len();
            i += 1;
        }
        n
    }

    /// Offset from the BTH's start of extension header `h`, if this opcode has it.
    pub fn offset_of(&self, h: ExtHeader) -> Option<usize> {
        let mut off = crate::bth::HEADER_LEN;
        for &x in self.headers {
            if x == h {
                return Some(off);
            }
            off += x.wire_len();
        }
        None
    }

    /// Whether extension header `h` follows the BTH.
    pub const fn has(&self, h: ExtHeader) -> bool {
        self.header_mask & h.bit() != 0
    }

    /// True for packets a requester sends; false for responses (ACKs, READ
    /// responses, atomic ACKs) and CNPs.
    pub const fn is_request(&self) -> bool {
        !matches!(
            self.operation,
            Operation::RdmaReadResponse
                | Operation::Acknowledge
                | Operation::AtomicAcknowledge
                | Operation::Cnp
        )
    }

    /// True for the packet that ends a request its responder serves without
    /// a completion of its own: the last (or only) packet of an RDMA WRITE
    /// without immediate data, an RDMA READ request, an atomic, FLUSH,
    /// ATOMIC WRITE. The responder's program sees such a request only in its
    /// memory, if at all, never through a completion queue. (The first and
    /// middle packets of a WRITE say nothing yet: the message may end with
    /// immediate data.)
    pub const fn ends_without_responder_completion(&self) -> bool {
        match self.operation {
            Operation::RdmaWrite => self.position.ends_message() && !self.has_immediate(),
            Operation::RdmaReadRequest
            | Operation::CompareSwap
            | Operation::FetchAdd
            | Operation::Flush
            | Operation::AtomicWrite => true,
            _ => false,
        }
    }

    /// True when the packet carries immediate data.
    pub const fn has_immediate(&self) -> bool {
        self.has(ExtHeader::ImmDt)
    }
}

use ExtHeader::*;
use Operation::*;
use Position::*;

macro_rules! table {
    ($( $t:ident $base:literal : [ $( $off:literal $name:literal $op:ident $pos:ident [$($h:ident),*] $pl:literal ),* $(,)? ] )*) => {
        /// Every opcode rnic knows, in numeric order.
        pub static OPCODES: &[OpcodeInfo] = &[
            $( $( OpcodeInfo {
                opcode: Opcode($base + $off),
                name: table!(@name $t $name),
                transport: table!(@transport $t),
                operation: $op,
                position: $pos,
                headers: &[$($h),*],
                has_payload: $pl,
                header_mask: mask_of(&[$($h),*]),
            }, )* )*
        ];
    };
    (@name CNP $n:literal) => { "CNP" };
    (@name $t:ident $n:literal) => { concat!(stringify!($t), "_", $n) };
    (@transport RC) => { Transport::Rc };
    (@transport UC) => { Transport::Uc };
    (@transport UD) => { Transport::Ud };
    (@transport CNP) => { Transport::Cnp };
    (@transport XRC) => { Transport::Xrc };
}

table! {
    RC 0x00: [
        0x00 "SEND_FIRST" Send First [] true,
        0x01 "SEND_MIDDLE" Send Middle [] true,
        0x02 "SEND_LAST" Send Last [] true,
        0x03 "SEND_LAST_WITH_IMMEDIATE" Send Last [ImmDt] true,
        0x04 "SEND_ONLY" Send Only [] true,
        0x05 "SEND_ONLY_WITH_IMMEDIATE" Send Only [ImmDt] true,
        0x06 "RDMA_WRITE_FIRST" RdmaWrite First [Reth] true,
        0x07 "RDMA_WRITE_MIDDLE" RdmaWrite Middle [] true,
        0x08 "RDMA_WRITE_LAST" RdmaWrite Last [] true,
        0x09 "RDMA_WRITE_LAST_WITH_IMMEDIATE" RdmaWrite Last [ImmDt] true,
        0x0A "RDMA_WRITE_ONLY" RdmaWrite Only [Reth] true,
        0x0B "RDMA_WRITE_ONLY_WITH_IMMEDIATE" RdmaWrite Only [Reth, ImmDt] true,
        0x0C "RDMA_READ_REQUEST" RdmaReadRequest Only [Reth] false,
        0x0D "RDMA_READ_RESPONSE_FIRST" RdmaReadResponse First [Aeth] true,
        0x0E "RDMA_READ_RESPONSE_MIDDLE" RdmaReadResponse Middle [] true,
        0x0F "RDMA_READ_RESPONSE_LAST" RdmaReadResponse Last [Aeth] true,
        0x10 "RDMA_READ_RESPONSE_ONLY" RdmaReadResponse Only [Aeth] true,
        0x11 "ACKNOWLEDGE" Acknowledge Only [Aeth] false,
        0x12 "ATOMIC_ACKNOWLEDGE" AtomicAcknowledge Only [Aeth, AtomicAckEth] false,
        0x13 "COMPARE_SWAP" CompareSwap Only [AtomicEth] false,
        0x14 "FETCH_ADD" FetchAdd Only [AtomicEth] false,
        0x16 "SEND_LAST_WITH_INVALIDATE" Send Last [Ieth] true,
        0x17 "SEND_ONLY_WITH_INVALIDATE" Send Only [Ieth] true,
        0x1C "FLUSH" Flush Only [Feth, Reth] false,
        0x1D "ATOMIC_WRITE" AtomicWrite Only [Reth] true,
    ]
    UC 0x20: [
        0x00 "SEND_FIRST" Send First [] true,
        0x01 "SEND_MIDDLE" Send Middle [] true,
        0x02 "SEND_LAST" Send Last [] true,
        0x03 "SEND_LAST_WITH_IMMEDIATE" Send Last [ImmDt] true,
        0x04 "SEND_ONLY" Send Only [] true,
        0x05 "SEND_ONLY_WITH_IMMEDIATE" Send Only [ImmDt] true,
        0x06 "RDMA_WRITE_FIRST" RdmaWrite First [Reth] true,
        0x07 "RDMA_WRITE_MIDDLE" RdmaWrite Middle [] true,
        0x08 "RDMA_WRITE_LAST" RdmaWrite Last [] true,
        0x09 "RDMA_WRITE_LAST_WITH_IMMEDIATE" RdmaWrite Last [ImmDt] true,
        0x0A "RDMA_WRITE_ONLY" RdmaWrite Only [Reth] true,
        0x0B "RDMA_WRITE_ONLY_WITH_IMMEDIATE" RdmaWrite Only [Reth, ImmDt] true,
    ]
    UD 0x60: [
        0x04 "SEND_ONLY" Send Only [Deth] true,
        0x05 "SEND_ONLY_WITH_IMMEDIATE" Send Only [Deth, ImmDt] true,
    ]
    CNP 0x80: [
        0x01 "" Cnp Only [CnpPad] false,
    ]
    XRC 0xA0: [
        0x00 "SEND_FIRST" Send First [XrcEth] true,
        0x01 "SEND_MIDDLE" Send Middle [XrcEth] true,
        0x02 "SEND_LAST" Send Last [XrcEth] true,
        0x03 "SEND_LAST_WITH_IMMEDIATE" Send Last [XrcEth, ImmDt] true,
        0x04 "SEND_ONLY" Send Only [XrcEth] true,
        0x05 "SEND_ONLY_WITH_IMMEDIATE" Send Only [XrcEth, ImmDt] true,
        0x06 "RDMA_WRITE_FIRST" RdmaWrite First [XrcEth, Reth] true,
        0x07 "RDMA_WRITE_MIDDLE" RdmaWrite Middle [XrcEth] true,
        0x08 "RDMA_WRITE_LAST" RdmaWrite Last [XrcEth] true,
        0x09 "RDMA_WRITE_LAST_WITH_IMMEDIATE" RdmaWrite Last [XrcEth, ImmDt] true,
        0x0A "RDMA_WRITE_ONLY" RdmaWrite Only [XrcEth, Reth] true,
        0x0B "RDMA_WRITE_ONLY_WITH_IMMEDIATE" RdmaWrite Only [XrcEth, Reth, ImmDt] true,
        0x0C "RDMA_READ_REQUEST" RdmaReadRequest Only [XrcEth, Reth] false,
        0x0D "RDMA_READ_RESPONSE_FIRST" RdmaReadResponse First [Aeth] true,
        0x0E "RDMA_READ_RESPONSE_MIDDLE" RdmaReadResponse Middle [] true,
        0x0F "RDMA_READ_RESPONSE_LAST" RdmaReadResponse Last [Aeth] true,
        0x10 "RDMA_READ_RESPONSE_ONLY" RdmaReadResponse Only [Aeth] true,
        0x11 "ACKNOWLEDGE" Acknowledge Only [Aeth] false,
        0x12 "ATOMIC_ACKNOWLEDGE" AtomicAcknowledge Only [Aeth, AtomicAckEth] false,
        0x13 "COMPARE_SWAP" CompareSwap Only [XrcEth, AtomicEth] false,
        0x14 "FETCH_ADD" FetchAdd Only [XrcEth, AtomicEth] false,
        0x16 "SEND_LAST_WITH_INVALIDATE" Send Last [XrcEth, Ieth] true,
        0x17 "SEND_ONLY_WITH_INVALIDATE" Send Only [XrcEth, Ieth] true,
        0x1C "FLUSH" Flush Only [XrcEth, Feth, Reth] false,
        0x1D "ATOMIC_WRITE" AtomicWrite Only [XrcEth, Reth] true,
    ]
}

/// Opcode byte -> index into [`OPCODES`] (`u8::MAX` = unknown), built at compile time.
static INDEX: [u8; 256] = {
    let mut idx = [u8::MAX; 256];
    let mut i = 0;
    while i < OPCODES.len() {
        idx[OPCODES[i].opcode.0 as usize] = i as u8;
        i += 1;
    }
    idx
};

impl Opcode {
    /// The table entry, or `None` for a reserved opcode or the RD transport.
    #[inline]
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        match INDEX[usize::from(self.0)] {
            u8::MAX => None,
            i => Some(&OPCODES[usize::from(i)]),
        }
    }

    /// The IBTA name, or `None` when unknown.
    pub fn name(self) -> Option<&'static str> {
        self.info().map(|i| i.name)
    }

    /// Look an opcode up by its name (`RC_SEND_ONLY`, or `CNP`).
    pub fn from_name(name: &str) -> Option<Opcode> {
        OPCODES.iter().find(|i| i.name == name).map(|i| i.opcode)
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.info() {
            Some(i) => f.write_str(i.name),
            None => write!(f, "UNKNOWN_{:#04x}", self.0),
        }
    }
}

macro_rules! opcode_consts {
    ($($name:ident = $v:literal,)*) => {
        impl Opcode {
            $(
                #[doc = concat!("`", stringify!($name), "` (", stringify!($v), ").")]
                pub const $name: Opcode = Opcode($v);
            )*
        }
    };
}

opcode_consts! {
    RC_SEND_FIRST = 0x00,
    RC_SEND_MIDDLE = 0x01,
    RC_SEND_LAST = 0x02,
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03,
    RC_SEND_ONLY = 0x04,
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05,
    RC_RDMA_WRITE_FIRST = 0x06,
    RC_RDMA_WRITE_MIDDLE = 0x07,
    RC_RDMA_WRITE_LAST = 0x08,
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09,
    RC_RDMA_WRITE_ONLY = 0x0A,
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0B,
    RC_RDMA_READ_REQUEST = 0x0C,
    RC_RDMA_READ_RESPONSE_FIRST = 0x0D,
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0E,
    RC_RDMA_READ_RESPONSE_LAST = 0x0F,
    RC_RDMA_READ_RESPONSE_ONLY = 0x10,
    RC_ACKNOWLEDGE = 0x11,
    RC_ATOMIC_ACKNOWLEDGE = 0x12,
    RC_COMPARE_SWAP = 0x13,
    RC_FETCH_ADD = 0x14,
    RC_SEND_LAST_WITH_INVALIDATE = 0x16,
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17,
    RC_FLUSH = 0x1C,
    RC_ATOMIC_WRITE = 0x1D,
    UC_SEND_FIRST = 0x20,
    UC_SEND_MIDDLE = 0x21,
    UC_SEND_LAST = 0x22,
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23,
    UC_SEND_ONLY = 0x24,
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25,
    UC_RDMA_WRITE_FIRST = 0x26,
    UC_RDMA_WRITE_MIDDLE = 0x27,
    UC_RDMA_WRITE_LAST = 0x28,
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29,
    UC_RDMA_WRITE_ONLY = 0x2A,
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2B,
    UD_SEND_ONLY = 0x64,
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65,
    CNP = 0x81,
    XRC_SEND_FIRST = 0xA0,
    XRC_SEND_MIDDLE = 0xA1,
    XRC_SEND_LAST = 0xA2,
    XRC_SEND_LAST_WITH_IMMEDIATE = 0xA3,
    XRC_SEND_ONLY = 0xA4,
    XRC_SEND_ONLY_WITH_IMMEDIATE = 0xA5,
    XRC_RDMA_WRITE_FIRST = 0xA6,
    XRC_RDMA_WRITE_MIDDLE = 0xA7,
    XRC_RDMA_WRITE_LAST = 0xA8,
    XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0xA9,
    XRC_RDMA_WRITE_ONLY = 0xAA,
    XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0xAB,
    XRC_RDMA_READ_REQUEST = 0xAC,
    XRC_RDMA_READ_RESPONSE_FIRST = 0xAD,
    XRC_RDMA_READ_RESPONSE_MIDDLE = 0xAE,
    XRC_RDMA_READ_RESPONSE_LAST = 0xAF,
    XRC_RDMA_READ_RESPONSE_ONLY = 0xB0,
    XRC_ACKNOWLEDGE = 0xB1,
    XRC_ATOMIC_ACKNOWLEDGE = 0xB2,
    XRC_COMPARE_SWAP = 0xB3,
    XRC_FETCH_ADD = 0xB4,
    XRC_SEND_LAST_WITH_INVALIDATE = 0xB6,
    XRC_SEND_ONLY_WITH_INVALIDATE = 0xB7,
    XRC_FLUSH = 0xBC,
    XRC_ATOMIC_WRITE = 0xBD,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_unique_and_named_consistently() {
        assert!(OPCODES.windows(2).all(|w| w[0].opcode < w[1].opcode));
        for info in OPCODES {
            assert_eq!(info.opcode.info(), Some(info));
            let top = info.opcode.0 & 0xE0;
            let t = match top {
                0x00 => Transport::Rc,
                0x20 => Transport::Uc,
                0x60 => Transport::Ud,
                0x80 => Transport::Cnp,
                0xA0 => Transport::Xrc,
                _ => unreachable!("opcode {:#x} in an unexpected transport", info.opcode.0),
            };
            assert_eq!(info.transport, t, "{}", info.name);
            assert!(info.name.starts_with(t.name()));
            assert_eq!(
                Opcode::from_name(&info.opcode.to_string()),
                Some(info.opcode)
            );
            // Ops that carry immediate data end with the ImmDt header; IETH likewise.
            assert_eq!(
                info.name.contains("IMMEDIATE"),
                info.has(ImmDt),
                "{}",
                info.name
            );
            assert_eq!(
                info.name.contains("INVALIDATE"),
                info.has(Ieth),
                "{}",
                info.name
            );
            // XRC requests, and only they, carry an XRCETH right after the BTH.
            assert_eq!(
                info.transport == Transport::Xrc && info.is_request(),
                info.headers.first() == Some(&XrcEth),
                "{}",
                info.name
            );
        }
    }

    #[test]
    fn known_entries() {
        let w = Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.info().unwrap();
        assert_eq!(w.headers, &[Reth, ImmDt]);
        assert_eq!(w.header_len(), 12 + 16 + 4);
        assert_eq!(w.offset_of(ImmDt), Some(28));
        let a = Opcode::RC_ATOMIC_ACKNOWLEDGE.info().unwrap();
        assert_eq!(a.header_len(), 12 + 4 + 8);
        assert!(!a.is_request());
        assert_eq!(Opcode::CNP.to_string(), "CNP");
        assert_eq!(Opcode::CNP.info().unwrap().header_len(), 28);
        assert_eq!(Opcode::UD_SEND_ONLY.info().unwrap().headers, &[Deth]);
        assert_eq!(Opcode::RC_FLUSH.info().unwrap().headers, &[Feth, Reth]);
        // RD and reserved opcodes are unknown.
        for op in [0x15u8, 0x18, 0x40, 0x44, 0x60, 0x80, 0xB5, 0xFF] {
            assert_eq!(Opcode(op).info(), None, "{op:#x}");
        }
        assert_eq!(Opcode(0x40).to_string(), "UNKNOWN_0x40");
    }

    #[test]
    fn requests_that_end_without_a_completion_at_the_responder() {
        let names: Vec<&str> = OPCODES
            .iter()
            .filter(|i| i.transport == Transport::Rc && i.ends_without_responder_completion())
            .map(|i| i.name)
            .collect();
        assert_eq!(
            names,
            [
                "RC_RDMA_WRITE_LAST",
                "RC_RDMA_WRITE_ONLY",
                "RC_RDMA_READ_REQUEST",
                "RC_COMPARE_SWAP",
                "RC_FETCH_ADD",
                "RC_FLUSH",
                "RC_ATOMIC_WRITE",
            ]
        );
        // A WRITE with immediate data ends in a receive completion; SENDs,
        // responses and CNPs never qualify, on any transport.
        for info in OPCODES {
            if info.has_immediate() || !info.is_request() || info.operation == Send {
                assert!(!info.ends_without_responder_completion(), "{}", info.name);
            }
        }
    }

    #[test]
    fn counts() {
        let count = |t| OPCODES.iter().filter(|i| i.transport == t).count();
        assert_eq!(count(Transport::Rc), 25);
        assert_eq!(count(Transport::Uc), 12);
        assert_eq!(count(Transport::Ud), 2);
        assert_eq!(count(Transport::Cnp), 1);
        assert_eq!(count(Transport::Xrc), 25);
    }
}
