//! Parse errors: which header failed, at which byte, and why.

use core::fmt;

/// The header (or container) in which a parse error was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    /// A pcap or pcapng file.
    Pcap,
    /// Ethernet II header.
    Ethernet,
    /// IEEE 802.1Q VLAN tag.
    Vlan,
    /// Linux cooked capture header (SLL).
    LinuxSll,
    /// Linux cooked capture header v2 (SLL2).
    LinuxSll2,
    /// IPv4 header.
    Ipv4,
    /// IPv6 header.
    Ipv6,
    /// UDP header.
    Udp,
    /// Base Transport Header.
    Bth,
    /// XRC Extended Transport Header.
    XrcEth,
    /// Datagram Extended Transport Header.
    Deth,
    /// FLUSH Extended Transport Header.
    Feth,
    /// RDMA Extended Transport Header.
    Reth,
    /// Atomic Extended Transport Header.
    AtomicEth,
    /// Immediate Data Extended Transport Header.
    ImmDt,
    /// Invalidate Extended Transport Header.
    Ieth,
    /// ACK Extended Transport Header.
    Aeth,
    /// Atomic Acknowledge Extended Transport Header.
    AtomicAckEth,
    /// The 16 reserved bytes of a congestion notification packet.
    Cnp,
    /// A management datagram's common header.
    Mad,
    /// A communication manager message (or the rdma_cm header in its
    /// private data).
    Cm,
    /// The payload and its pad bytes.
    Payload,
    /// The invariant CRC.
    Icrc,
}

impl Layer {
    /// The name used in the IBTA specification (or the usual name for non-IB headers).
    pub const fn name(self) -> &'static str {
        match self {
            Layer::Pcap => "pcap",
            Layer::Ethernet => "Ethernet",
            Layer::Vlan => "802.1Q",
            Layer::LinuxSll => "SLL",
            Layer::LinuxSll2 => "SLL2",
            Layer::Ipv4 => "IPv4",
            Layer::Ipv6 => "IPv6",
            Layer::Udp => "UDP",
            Layer::Bth => "BTH",
            Layer::XrcEth => "XRCETH",
            Layer::Deth => "DETH",
            Layer::Feth => "FETH",
            Layer::Reth => "RETH",
            Layer::AtomicEth => "AtomicETH",
            Layer::ImmDt => "ImmDt",
            Layer::Ieth => "IETH",
            Layer::Aeth => "AETH",
            Layer::AtomicAckEth => "AtomicAckETH",
            Layer::Cnp => "CNP",
            Layer::Mad => "MAD",
            Layer::Cm => "CM",
            Layer::Payload => "payload",
            Layer::Icrc => "ICRC",
        }
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What was wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The buffer ends before the header does.
    Truncated {
        /// Bytes the header needs from its start.
        needed: usize,
        /// Bytes available from the header's start.
        available: usize,
    },
    /// More bytes than the format allows (payload above the 4096-byte IB MTU,
    /// trailing bytes after a packet that carries no payload, a record larger
    /// than its file says records can be).
    Oversized {
        /// The largest size allowed.
        max: usize,
        /// The size found.
        actual: usize,
    },
    /// The BTH pad count does not fit the payload: more pad than payload bytes,
    /// or payload plus pad not a multiple of four bytes.
    BadPadCount {
        /// The BTH PadCnt field.
        pad_count: u8,
        /// Payload bytes including the pad.
        padded_len: usize,
    },
    /// An opcode that rnic does not know (reserved, or the RD transport).
    UnknownOpcode(u8),
    /// UDP destination port other than 4791.
    WrongPort(u16),
    /// A version field with an unsupported value (IP version, BTH TVer, pcap version).
    BadVersion(u8),
    /// Not a RoCE v2 frame: an EtherType other than IPv4/IPv6, or an IP protocol other than UDP.
    NotRoce(u16),
    /// A length field that disagrees with the bytes present.
    BadLength {
        /// What the length field says.
        field: usize,
        /// What the buffer holds.
        actual: usize,
    },
    /// An IP fragment: RoCE v2 is sent with DF, and rnic does not reassemble.
    Fragmented,
    /// A link type this crate cannot decode.
    UnsupportedLinkType(u32),
    /// A file that is neither classic pcap nor pcapng, or a corrupt block.
    BadMagic(u32),
    /// A management datagram whose class or attribute this crate does not
    /// decode (the class, then the attribute ID).
    UnknownAttribute(u8, u16),
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ErrorKind::Truncated { needed, available } => {
                write!(f, "truncated: needs {needed} bytes, {available} available")
            }
            ErrorKind::Oversized { max, actual } => {
                write!(f, "oversized: {actual} bytes, at most {max} allowed")
            }
            ErrorKind::BadPadCount {
                pad_count,
                padded_len,
            } => write!(
                f,
                "bad pad count {pad_count} for {padded_len} payload bytes (pad included)"
            ),
            ErrorKind::UnknownOpcode(op) => write!(f, "unknown opcode {op:#04x}"),
            ErrorKind::WrongPort(port) => {
                write!(f, "UDP destination port {port}, not 4791 (RoCE v2)")
            }
            ErrorKind::BadVersion(v) => write!(f, "unsupported version {v}"),
            ErrorKind::NotRoce(t) => write!(f, "not RoCE v2 (protocol {t:#06x})"),
            ErrorKind::BadLength { field, actual } => {
                write!(f, "length field says {field} bytes, {actual} present")
            }
            ErrorKind::Fragmented => {
                write!(f, "IP fragment (RoCE v2 packets are never fragmented)")
            }
            ErrorKind::UnsupportedLinkType(l) => write!(f, "unsupported link type {l}"),
            ErrorKind::BadMagic(m) => write!(f, "bad magic number {m:#010x}"),
            ErrorKind::UnknownAttribute(class, attr) => {
                write!(
                    f,
                    "unknown attribute {attr:#06x} of management class {class:#04x}"
                )
            }
        }
    }
}

/// A parse error: the header, the byte offset where it starts (from the start of
/// the buffer given to the outermost parser), and what was wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Error {
    /// The header that failed to parse.
    pub layer: Layer,
    /// Byte offset of that header in the buffer handed to the parser.
    pub offset: usize,
    /// What was wrong.
    pub kind: ErrorKind,
}

impl Error {
    /// An error in `layer` at offset 0; outer parsers move it with [`Error::at`].
    pub const fn new(layer: Layer, kind: ErrorKind) -> Self {
        Error {
            layer,
            offset: 0,
            kind,
        }
    }

    /// A truncation error: `layer` needs `needed` bytes and only `available` are there.
    pub const fn truncated(layer: Layer, needed: usize, available: usize) -> Self {
        Error::new(layer, ErrorKind::Truncated { needed, available })
    }

    /// The same error, seen from a buffer in which this one starts at `base`.
    #[must_use]
    pub const fn at(mut self, base: usize) -> Self {
        self.offset += base;
        self
    }

    /// True when the frame simply is not RoCE v2 (another protocol or UDP port),
    /// as opposed to a RoCE v2 frame that is malformed.
    pub const fn is_not_roce(&self) -> bool {
        matches!(self.kind, ErrorKind::NotRoce(_) | ErrorKind::WrongPort(_))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}: {}", self.layer, self.offset, self.kind)
    }
}

impl std::error::Error for Error {}

/// The result of a parse.
pub type Result<T> = core::result::Result<T, Error>;

/// Check that `buf` holds at least `needed` bytes for `layer`.
#[inline]
pub(crate) fn need(layer: Layer, buf: &[u8], needed: usize) -> Result<()> {
    if buf.len() < needed {
        Err(Error::truncated(layer, needed, buf.len()))
    } else {
        Ok(())
    }
}
