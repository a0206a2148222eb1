//! Why a verb was refused: one error type for every verb of the NIC, each
//! variant naming the bad input.

use core::fmt;

use crate::cq::CqHandle;
use crate::device::DEVICE_ATTR;
use crate::mem::MemError;
use crate::qp::{ModifyError, QpState};
use crate::srq::SrqHandle;

/// Why a verb was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerbError {
    /// A memory or protection domain error.
    Mem(MemError),
    /// A modify_qp error.
    Modify(ModifyError),
    /// No QP with this number.
    NoSuchQp(u32),
    /// No CQ with this handle.
    NoSuchCq(CqHandle),
    /// The QP type is not implemented yet.
    Unsupported(&'static str),
    /// The queue is full (`max_send_wr` / `max_recv_wr`).
    QueueFull,
    /// More scatter/gather entries than the QP's capacity.
    TooManySge {
        /// Entries given.
        given: usize,
        /// The QP's limit.
        max: u32,
    },
    /// An atomic work request whose local buffer is not one 8-byte SGE.
    BadAtomicSge,
    /// The QP's state does not allow this verb.
    BadState(QpState),
    /// A message longer than 2^31 bytes.
    MessageTooLong(u64),
    /// A READ whose response needs 2^23 packets or more at the QP's path MTU:
    /// its PSNs would span half the 24-bit space, where modular comparisons
    /// no longer tell before from after.
    ReadTooManyPackets {
        /// Bytes asked for.
        len: u64,
        /// The path MTU in bytes.
        pmtu: u64,
    },
    /// Queue capacities beyond the device's (see [`DEVICE_ATTR`]).
    CapsTooLarge,
    /// A CQ resized below the completions waiting in it (or to 0).
    CqTooSmall {
        /// The depth asked for.
        depth: usize,
        /// Completions waiting.
        waiting: usize,
    },
    /// Inline data on an operation that takes none, or more than the device allows.
    BadInline {
        /// Bytes given.
        len: usize,
    },
    /// An SRQ that QPs still take their receives from (`ibv_destroy_srq`).
    SrqBusy(SrqHandle),
    /// A CQ that QPs still complete into (`ibv_destroy_cq`).
    CqBusy(CqHandle),
}

impl fmt::Display for VerbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerbError::Mem(e) => e.fmt(f),
            VerbError::Modify(e) => e.fmt(f),
            VerbError::NoSuchQp(q) => write!(f, "no QP {q:#x}"),
            VerbError::NoSuchCq(c) => write!(f, "no CQ {}", c.0),
            VerbError::Unsupported(what) => write!(f, "{what} is not supported yet"),
            VerbError::QueueFull => f.write_str("the work queue is full"),
            VerbError::TooManySge { given, max } => {
                write!(f, "{given} scatter/gather entries, the QP takes {max}")
            }
            VerbError::BadAtomicSge => f.write_str("an atomic needs one 8-byte local SGE"),
            VerbError::BadState(s) => write!(f, "not allowed in state {s}"),
            VerbError::MessageTooLong(n) => write!(f, "message of {n} bytes exceeds 2^31"),
            VerbError::ReadTooManyPackets { len, pmtu } => write!(
                f,
                "a READ of {len} bytes needs {} response packets at path MTU {pmtu}; \
                 fewer than 2^23 fit the PSN space",
                len.div_ceil(*pmtu)
            ),
            VerbError::BadInline { len } => write!(
                f,
                "{len} bytes of inline data: SEND and WRITE only, at most {}",
                DEVICE_ATTR.max_inline_data
            ),
            VerbError::CapsTooLarge => write!(
                f,
                "queue capacities exceed the device's ({} work requests, {} SGEs, {} CQEs)",
                DEVICE_ATTR.max_qp_wr, DEVICE_ATTR.max_sge, DEVICE_ATTR.max_cqe
            ),
            VerbError::CqTooSmall { depth, waiting } => write!(
                f,
                "a CQ of depth {depth} cannot hold the {waiting} completions waiting in it"
            ),
            VerbError::SrqBusy(s) => write!(f, "SRQ {} still has queue pairs", s.0),
            VerbError::CqBusy(c) => write!(f, "CQ {} still has queue pairs", c.0),
        }
    }
}

impl std::error::Error for VerbError {}

impl From<MemError> for VerbError {
    fn from(e: MemError) -> VerbError {
        VerbError::Mem(e)
    }
}
