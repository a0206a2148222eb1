//! Work requests and completions, shaped like `ibv_send_wr`, `ibv_recv_wr` and
//! `ibv_wc`.

use core::fmt;

use smallvec::SmallVec;

use crate::mem::MwBind;

/// Builds an [`SgList`] or [`InlineData`] as `vec!` builds a `Vec`.
pub use smallvec::smallvec as sg_list;

/// The scatter/gather list of one work request. Up to four elements live in
/// the request itself (verbs programs post one or two), so posting one
/// allocates nothing; a longer list, up to `max_sge`, spills to the heap.
pub type SgList = SmallVec<[Sge; 4]>;

/// The most inline bytes a send may carry (`DEVICE_ATTR.max_inline_data`).
pub const MAX_INLINE_DATA: usize = 256;

/// IBV_SEND_INLINE bytes, held in the request itself as a NIC's send queue
/// entry holds them (rdma_rxe's WQE carries its inline data too): up to
/// [`MAX_INLINE_DATA`] bytes without allocating. The length is still checked
/// at post, so a longer buffer is refused, not truncated.
pub type InlineData = SmallVec<[u8; MAX_INLINE_DATA]>;

/// A scatter/gather element: `length` bytes at `addr` in the region of `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sge {
    /// Address (in the region's I/O virtual address space).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region.
    pub lkey: u32,
}

/// What a send work request does (`ibv_wr_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendOp {
    /// IBV_WR_SEND, or IBV_WR_SEND_WITH_IMM with `imm`.
    Send {
        /// Immediate data.
        imm: Option<u32>,
    },
    /// IBV_WR_SEND_WITH_INV: a SEND that, once delivered, invalidates the
    /// peer's memory window `invalidate_rkey` (bound to the receiving QP). RC only.
    SendWithInv {
        /// The R_Key the responder invalidates.
        invalidate_rkey: u32,
    },
    /// IBV_WR_RDMA_WRITE, or IBV_WR_RDMA_WRITE_WITH_IMM with `imm`.
    Write {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm: Option<u32>,
    },
    /// IBV_WR_RDMA_READ.
    Read {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// IBV_WR_ATOMIC_CMP_AND_SWP: if the remote 8 bytes equal `compare`, store
    /// `swap`; the original value lands in the (8-byte) local SGE.
    CompareSwap {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to compare with.
        compare: u64,
        /// Value to store.
        swap: u64,
    },
    /// IBV_WR_ATOMIC_FETCH_AND_ADD: add `add`; the original value lands in the
    /// local SGE.
    FetchAdd {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to add.
        add: u64,
    },
    /// IBV_WR_ATOMIC_WRITE (`ibv_wr_atomic_write`): store 8 bytes at an
    /// 8-byte aligned remote address as one indivisible write. Needs
    /// REMOTE_WRITE; no local buffer.
    AtomicWrite {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// The bytes stored, as they are (`atomic_wire_buf`).
        data: [u8; 8],
    },
    /// IBV_WR_FLUSH (`ibv_wr_flush`): make earlier writes to remote memory
    /// globally visible or persistent before this completes. No local buffer.
    Flush {
        /// Remote address (ignored for a whole region).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Bytes (ignored for a whole region).
        len: u32,
        /// IBV_FLUSH_GLOBAL (1) and/or IBV_FLUSH_PERSISTENT (2).
        placement: u8,
        /// IBV_FLUSH_MR: the whole region the key names; else IBV_FLUSH_RANGE.
        whole_region: bool,
    },
    /// IBV_WR_LOCAL_INV: invalidate a memory window of this QP's protection
    /// domain, in send queue order. Nothing goes on the wire.
    LocalInv {
        /// The window's R_Key.
        rkey: u32,
    },
    /// IBV_WR_BIND_MW: bind a type 2 memory window to this QP, in send queue
    /// order. Nothing goes on the wire.
    BindMw(MwBind),
}

impl SendOp {
    /// IBV_WR_SEND.
    pub const fn send() -> SendOp {
        SendOp::Send { imm: None }
    }
    /// IBV_WR_SEND_WITH_IMM.
    pub const fn send_imm(imm: u32) -> SendOp {
        SendOp::Send { imm: Some(imm) }
    }
    /// IBV_WR_RDMA_WRITE to `remote_addr` in the region or window of `rkey`.
    pub const fn write(remote_addr: u64, rkey: u32) -> SendOp {
        SendOp::Write {
            remote_addr,
            rkey,
            imm: None,
        }
    }
    /// IBV_WR_RDMA_WRITE_WITH_IMM.
    pub const fn write_imm(remote_addr: u64, rkey: u32, imm: u32) -> SendOp {
        SendOp::Write {
            remote_addr,
            rkey,
            imm: Some(imm),
        }
    }
    /// IBV_WR_RDMA_READ from `remote_addr` in the region or window of `rkey`.
    pub const fn read(remote_addr: u64, rkey: u32) -> SendOp {
        SendOp::Read { remote_addr, rkey }
    }
    /// IBV_WR_ATOMIC_FETCH_AND_ADD of `add` at `remote_addr`.
    pub const fn fetch_add(remote_addr: u64, rkey: u32, add: u64) -> SendOp {
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        }
    }
    /// IBV_WR_ATOMIC_CMP_AND_SWP: `swap` stored at `remote_addr` if it holds
    /// `compare`.
    pub const fn compare_swap(remote_addr: u64, rkey: u32, compare: u64, swap: u64) -> SendOp {
        SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        }
    }

    /// The immediate data it carries, if any (SEND_WITH_IMM,
    /// RDMA_WRITE_WITH_IMM).
    pub const fn imm(&self) -> Option<u32> {
        match *self {
            SendOp::Send { imm, .. } | SendOp::Write { imm, .. } => imm,
            _ => None,
        }
    }

    /// The completion opcode it produces.
    pub const fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send { .. } | SendOp::SendWithInv { .. } => WcOpcode::Send,
            SendOp::Write { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::AtomicWrite { .. } => WcOpcode::AtomicWrite,
            SendOp::Flush { .. } => WcOpcode::Flush,
            SendOp::LocalInv { .. } => WcOpcode::LocalInv,
            SendOp::BindMw(_) => WcOpcode::BindMw,
        }
    }
    /// Operations the responder answers with a response of their own (READ
    /// responses, atomic ACKs, the empty READ response of ATOMIC_WRITE and
    /// FLUSH) and keeps a responder resource for: limited by max_rd_atomic,
    /// waited for by a fence.
    pub const fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::Read { .. }
                | SendOp::CompareSwap { .. }
                | SendOp::FetchAdd { .. }
                | SendOp::AtomicWrite { .. }
                | SendOp::Flush { .. }
        )
    }
    /// Operations done inside the NIC, with nothing on the wire.
    pub const fn is_local(&self) -> bool {
        matches!(self, SendOp::LocalInv { .. } | SendOp::BindMw(_))
    }
    /// Whether the responder takes a receive WQE for it (SEND, and WRITE
    /// with immediate): what end-to-end credits count.
    pub const fn consumes_recv(&self) -> bool {
        matches!(
            self,
            SendOp::Send { .. } | SendOp::SendWithInv { .. } | SendOp::Write { imm: Some(_), .. }
        )
    }
    /// Operations that may carry inline data (IBV_SEND_INLINE): those that
    /// send bytes, SEND and WRITE.
    pub const fn takes_inline(&self) -> bool {
        matches!(
            self,
            SendOp::Send { .. } | SendOp::SendWithInv { .. } | SendOp::Write { .. }
        )
    }
    /// The atomics.
    pub const fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }
}

/// A send work request (`ibv_send_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Local buffers: gathered from for SEND/WRITE, scattered to for READ and atomics.
    pub sg_list: SgList,
    /// IBV_SEND_SIGNALED: produce a completion on success.
    pub signaled: bool,
    /// IBV_SEND_SOLICITED: set SE on the last packet.
    pub solicited: bool,
    /// IBV_SEND_FENCE: start only after every earlier READ and atomic has
    /// completed (so that a READ retried after a loss cannot see this request's
    /// writes).
    pub fence: bool,
    /// IBV_SEND_INLINE: send these bytes, taken at post time, instead of
    /// gathering `sg_list` (which is then ignored): no memory region is needed
    /// and the buffer is free again as soon as the post returns. SEND and
    /// WRITE only, at most `DEVICE_ATTR.max_inline_data` bytes.
    pub inline: Option<InlineData>,
}

impl SendWr {
    /// Work request `wr_id` doing `op` with the local buffers `sg_list`:
    /// signaled, neither solicited nor fenced, not inline, as most work
    /// requests are. The methods below change the rest.
    pub fn new(wr_id: u64, op: SendOp, sg_list: SgList) -> SendWr {
        SendWr {
            wr_id,
            op,
            sg_list,
            signaled: true,
            solicited: false,
            fence: false,
            inline: None,
        }
    }
    /// IBV_SEND_SIGNALED: whether a success produces a completion.
    pub fn signaled(mut self, signaled: bool) -> SendWr {
        self.signaled = signaled;
        self
    }
    /// IBV_SEND_SOLICITED: whether the last packet asks for the peer's event.
    pub fn solicited(mut self, solicited: bool) -> SendWr {
        self.solicited = solicited;
        self
    }
    /// IBV_SEND_FENCE: whether it waits for every earlier READ and atomic.
    pub fn fence(mut self, fence: bool) -> SendWr {
        self.fence = fence;
        self
    }
    /// IBV_SEND_INLINE: these bytes instead of the gathered list (`None`:
    /// not inline).
    pub fn inline(mut self, inline: Option<InlineData>) -> SendWr {
        self.inline = inline;
        self
    }
}

/// Where a UD send goes (`ibv_send_wr.wr.ud`: the address handle, the remote
/// QP number and its Q_Key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdDest {
    /// The peer's IP address (its GID).
    pub dest: core::net::IpAddr,
    /// The local address to send from (the address handle's source GID);
    /// `None` lets the NIC choose ([`crate::Nic::source_for`]).
    pub src: Option<core::net::IpAddr>,
    /// The remote QP number.
    pub qpn: u32,
    /// The remote QP's Q_Key.
    pub qkey: u32,
}

/// Bytes at the head of every UD receive buffer that hold the packet's network
/// header (the GRH on InfiniBand; for RoCE v2 over IPv4, the IPv4 header in its
/// last 20 bytes), as verbs specifies.
pub const GRH_LEN: usize = 40;

/// A receive work request (`ibv_recv_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where an incoming SEND's payload goes.
    pub sg_list: SgList,
}

/// Completion status (`ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// IBV_WC_SUCCESS.
    Success,
    /// IBV_WC_LOC_LEN_ERR: a receive buffer too small for the SEND.
    LocLenErr,
    /// IBV_WC_LOC_QP_OP_ERR.
    LocQpOpErr,
    /// IBV_WC_LOC_PROT_ERR: a local SGE failed its memory check.
    LocProtErr,
    /// IBV_WC_WR_FLUSH_ERR: the QP went to the error state first.
    WrFlushErr,
    /// IBV_WC_REM_INV_REQ_ERR: NAK "invalid request".
    RemInvReqErr,
    /// IBV_WC_REM_ACCESS_ERR: NAK "remote access error".
    RemAccessErr,
    /// IBV_WC_REM_OP_ERR: NAK "remote operational error".
    RemOpErr,
    /// IBV_WC_RETRY_EXC_ERR: no answer after retry_cnt retries.
    RetryExcErr,
    /// IBV_WC_RNR_RETRY_EXC_ERR: still receiver-not-ready after rnr_retry retries.
    RnrRetryExcErr,
    /// IBV_WC_BAD_RESP_ERR: a response that makes no sense.
    BadRespErr,
    /// IBV_WC_MW_BIND_ERR: a BIND_MW the window, region or QP did not allow.
    MwBindErr,
}

impl WcStatus {
    /// The `ibv_wc_status` name, as `ibv_wc_status_str` spells the enum.
    pub const fn name(self) -> &'static str {
        match self {
            WcStatus::Success => "IBV_WC_SUCCESS",
            WcStatus::LocLenErr => "IBV_WC_LOC_LEN_ERR",
            WcStatus::LocQpOpErr => "IBV_WC_LOC_QP_OP_ERR",
            WcStatus::LocProtErr => "IBV_WC_LOC_PROT_ERR",
            WcStatus::WrFlushErr => "IBV_WC_WR_FLUSH_ERR",
            WcStatus::RemInvReqErr => "IBV_WC_REM_INV_REQ_ERR",
            WcStatus::RemAccessErr => "IBV_WC_REM_ACCESS_ERR",
            WcStatus::RemOpErr => "IBV_WC_REM_OP_ERR",
            WcStatus::RetryExcErr => "IBV_WC_RETRY_EXC_ERR",
            WcStatus::RnrRetryExcErr => "IBV_WC_RNR_RETRY_EXC_ERR",
            WcStatus::BadRespErr => "IBV_WC_BAD_RESP_ERR",
            WcStatus::MwBindErr => "IBV_WC_MW_BIND_ERR",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Completion opcode (`ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// IBV_WC_SEND.
    Send,
    /// IBV_WC_RDMA_WRITE.
    RdmaWrite,
    /// IBV_WC_RDMA_READ.
    RdmaRead,
    /// IBV_WC_COMP_SWAP.
    CompSwap,
    /// IBV_WC_FETCH_ADD.
    FetchAdd,
    /// IBV_WC_BIND_MW.
    BindMw,
    /// IBV_WC_LOCAL_INV.
    LocalInv,
    /// IBV_WC_FLUSH.
    Flush,
    /// IBV_WC_ATOMIC_WRITE.
    AtomicWrite,
    /// IBV_WC_RECV.
    Recv,
    /// IBV_WC_RECV_RDMA_WITH_IMM.
    RecvRdmaWithImm,
}

impl WcOpcode {
    /// The `ibv_wc_opcode` name.
    pub const fn name(self) -> &'static str {
        match self {
            WcOpcode::Send => "IBV_WC_SEND",
            WcOpcode::RdmaWrite => "IBV_WC_RDMA_WRITE",
            WcOpcode::RdmaRead => "IBV_WC_RDMA_READ",
            WcOpcode::CompSwap => "IBV_WC_COMP_SWAP",
            WcOpcode::FetchAdd => "IBV_WC_FETCH_ADD",
            WcOpcode::BindMw => "IBV_WC_BIND_MW",
            WcOpcode::LocalInv => "IBV_WC_LOCAL_INV",
            WcOpcode::Flush => "IBV_WC_FLUSH",
            WcOpcode::AtomicWrite => "IBV_WC_ATOMIC_WRITE",
            WcOpcode::Recv => "IBV_WC_RECV",
            WcOpcode::RecvRdmaWithImm => "IBV_WC_RECV_RDMA_WITH_IMM",
        }
    }
}

impl fmt::Display for WcOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A work completion (`ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The work request's wr_id.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode (meaningful on success, as in verbs).
    pub opcode: WcOpcode,
    /// Bytes received (receive completions).
    pub byte_len: u32,
    /// Immediate data (IBV_WC_WITH_IMM).
    pub imm_data: Option<u32>,
    /// The local QP.
    pub qp_num: u32,
    /// UD receives: the sender's QP number (from the DETH).
    pub src_qp: Option<u32>,
    /// Receives of a SEND_WITH_INV: the R_Key it invalidated
    /// (IBV_WC_WITH_INV, `wc.invalidated_rkey`).
    pub invalidated_rkey: Option<u32>,
    /// UD receives: the network header the datagram came in, whose copy
    /// fills the first 40 bytes of the receive buffer (IBTA Annex A17.4.5.1;
    /// `wc.network_hdr_type` in the kernel's verbs).
    pub network: Option<NetworkHdr>,
}

/// The network header a RoCE v2 datagram travelled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkHdr {
    /// IPv4: the 20-byte header sits in the last 20 of the 40 bytes.
    Ipv4,
    /// IPv6: the 40 bytes are the header, laid out as a GRH.
    Ipv6,
}
