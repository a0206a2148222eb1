//! Communication manager messages (IBTA 12.6), the data of a CM MAD
//! ([`crate::mad`], class 0x07): REQ, MRA, REJ, REP, RTU, DREQ, DREP,
//! SIDR_REQ and SIDR_REP, with field names and bit positions as the IBTA's
//! tables give them (the Linux kernel's `ibta_vol1_c12.h` lists the same
//! offsets). Offsets below are from the start of the CM data, which follows
//! the 24-byte MAD header; every message fills the 232 bytes, private data
//! last.
//!
//! Also here, because a RoCE peer must agree on them bit for bit: the
//! rdma_cm header at the head of a REQ's or SIDR_REQ's private data
//! ([`CmaHeader`]), the rdma_cm service IDs ([`service_id`]), and how the
//! Linux kernel derives a connection's flow label and RoCE v2 UDP source
//! port from the rdma_cm ports ([`rdma_cm_flow_label`],
//! [`flow_label_udp_sport`]).
//!
//! A message is a plain `Repr` ([`Message`] names which); the fields are
//! many and each message is read and written whole, so there is no
//! per-field `Packet` view as the transport headers have.

use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::field::*;
use crate::mad::{self, DATA_LEN};
use crate::{Error, ErrorKind, Layer, Result};

/// AttributeID of each CM message (IBTA Table 102).
pub mod attr {
    /// ConnectRequest.
    pub const REQ: u16 = 0x0010;
    /// MsgRcptAck.
    pub const MRA: u16 = 0x0011;
    /// ConnectReject.
    pub const REJ: u16 = 0x0012;
    /// ConnectReply.
    pub const REP: u16 = 0x0013;
    /// ReadyToUse.
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest.
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply.
    pub const DREP: u16 = 0x0016;
    /// ServiceIDResReq.
    pub const SIDR_REQ: u16 = 0x0017;
    /// ServiceIDResReqResp.
    pub const SIDR_REP: u16 = 0x0018;
}

/// Bits `width` wide starting `from_msb` bits below the top of `b`.
const fn bits(b: u8, from_msb: u32, width: u32) -> u8 {
    (b >> (8 - from_msb - width)) & ((1u16 << width) - 1) as u8
}

/// `v` placed as [`bits`] reads it (bits of `v` beyond `width` dropped).
const fn place(v: u8, from_msb: u32, width: u32) -> u8 {
    (v & ((1u16 << width) - 1) as u8) << (8 - from_msb - width)
}

fn gid(b: &[u8], at: usize) -> Ipv6Addr {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[at..at + 16]);
    Ipv6Addr::from(g)
}

fn array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

/// The CM data of a MAD, checked for length.
fn data(b: &[u8]) -> Result<&[u8]> {
    crate::error::need(Layer::Cm, b, DATA_LEN)?;
    Ok(&b[..DATA_LEN])
}

/// One path of a REQ (primary or alternate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Path {
    /// Local port LID (0xFFFF over RoCE: the permissive LID).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: Ipv6Addr,
    /// Remote port GID.
    pub remote_gid: Ipv6Addr,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits).
    pub local_ack_timeout: u8,
}

impl Path {
    /// The path that is not there (an alternate path never set up).
    pub const NONE: Path = Path {
        local_lid: 0,
        remote_lid: 0,
        local_gid: Ipv6Addr::UNSPECIFIED,
        remote_gid: Ipv6Addr::UNSPECIFIED,
        flow_label: 0,
        packet_rate: 0,
        traffic_class: 0,
        hop_limit: 0,
        sl: 0,
        subnet_local: false,
        local_ack_timeout: 0,
    };

    fn parse(b: &[u8], at: usize) -> Path {
        let word = get_u32(b, at + 36);
        Path {
            local_lid: get_u16(b, at),
            remote_lid: get_u16(b, at + 2),
            local_gid: gid(b, at + 4),
            remote_gid: gid(b, at + 20),
            flow_label: word >> 12,
            packet_rate: (word & 0x3F) as u8,
            traffic_class: b[at + 40],
            hop_limit: b[at + 41],
            sl: bits(b[at + 42], 0, 4),
            subnet_local: bits(b[at + 42], 4, 1) != 0,
            local_ack_timeout: bits(b[at + 43], 0, 5),
        }
    }

    /// Writes all of the path's 44 bytes but the alternate path's
    /// SAP-supported bit, which the caller adds.
    fn emit(&self, b: &mut [u8], at: usize) {
        set_u16(b, at, self.local_lid);
        set_u16(b, at + 2, self.remote_lid);
        b[at + 4..at + 20].copy_from_slice(&self.local_gid.octets());
        b[at + 20..at + 36].copy_from_slice(&self.remote_gid.octets());
        set_u32(
            b,
            at + 36,
            (self.flow_label & 0xF_FFFF) << 12 | u32::from(self.packet_rate & 0x3F),
        );
        b[at + 40] = self.traffic_class;
        b[at + 41] = self.hop_limit;
        b[at + 42] = place(self.sl, 0, 4) | place(self.subnet_local.into(), 4, 1);
        b[at + 43] = place(self.local_ack_timeout, 0, 5);
    }
}

/// Bytes of private data each message carries.
pub mod private_len {
    /// REQ.
    pub const REQ: usize = 92;
    /// MRA.
    pub const MRA: usize = 222;
    /// REJ.
    pub const REJ: usize = 148;
    /// REP.
    pub const REP: usize = 196;
    /// RTU.
    pub const RTU: usize = 224;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// DREP.
    pub const DREP: usize = 224;
    /// SIDR_REQ.
    pub const SIDR_REQ: usize = 216;
    /// SIDR_REP.
    pub const SIDR_REP: usize = 136;
}

/// ConnectRequest (IBTA Table 106).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Req {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// ServiceID.
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Responder Resources.
    pub responder_resources: u8,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Initiator Depth.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits).
    pub remote_eecn: u32,
    /// Remote CM Response Timeout (5 bits).
    pub remote_cm_response_timeout: u8,
    /// Transport Service Type (2 bits: 0 RC, 1 UC, 3 XRC-or-extended).
    pub transport_service_type: u8,
    /// End-to-End Flow Control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN (24 bits): the first PSN the active side receives,
    /// where the passive side's requests start (the kernel's CM sets the
    /// passive QP's sq_psn and the active QP's rq_psn from it).
    pub starting_psn: u32,
    /// Local CM Response Timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Retry Count (3 bits).
    pub retry_count: u8,
    /// Partition Key.
    pub partition_key: u16,
    /// Path Packet Payload MTU (4 bits, the verbs MTU code).
    pub path_mtu: u8,
    /// RDC Exists.
    pub rdc_exists: bool,
    /// RNR Retry Count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM Retries (4 bits).
    pub max_cm_retries: u8,
    /// SRQ.
    pub srq: bool,
    /// Extended Transport Type (3 bits).
    pub extended_transport_type: u8,
    /// The primary path.
    pub primary: Path,
    /// The alternate path.
    pub alternate: Path,
    /// SAP Supported.
    pub sap_supported: bool,
    /// Private data.
    pub private_data: [u8; private_len::REQ],
}

impl Req {
    /// Parse a REQ from a MAD's CM data.
    pub fn parse(b: &[u8]) -> Result<Req> {
        let b = data(b)?;
        Ok(Req {
            local_comm_id: get_u32(b, 0),
            service_id: get_u64(b, 8),
            local_ca_guid: get_u64(b, 16),
            local_qkey: get_u32(b, 28),
            local_qpn: get_u24(b, 32),
            responder_resources: b[35],
            local_eecn: get_u24(b, 36),
            initiator_depth: b[39],
            remote_eecn: get_u24(b, 40),
            remote_cm_response_timeout: bits(b[43], 0, 5),
            transport_service_type: bits(b[43], 5, 2),
            end_to_end_flow_control: bits(b[43], 7, 1) != 0,
            starting_psn: get_u24(b, 44),
            local_cm_response_timeout: bits(b[47], 0, 5),
            retry_count: bits(b[47], 5, 3),
            partition_key: get_u16(b, 48),
            path_mtu: bits(b[50], 0, 4),
            rdc_exists: bits(b[50], 4, 1) != 0,
            rnr_retry_count: bits(b[50], 5, 3),
            max_cm_retries: bits(b[51], 0, 4),
            srq: bits(b[51], 4, 1) != 0,
            extended_transport_type: bits(b[51], 5, 3),
            primary: Path::parse(b, 52),
            alternate: Path::parse(b, 96),
            sap_supported: bits(b[139], 5, 1) != 0,
            private_data: array(b, 140),
        })
    }

    /// Write the REQ into a MAD's CM data (232 bytes; reserved bits zero).
    pub fn emit(&self, b: &mut [u8]) {
        let b = &mut b[..DATA_LEN];
        b.fill(0);
        set_u32(b, 0, self.local_comm_id);
        set_u64(b, 8, self.service_id);
        set_u64(b, 16, self.local_ca_guid);
        set_u32(b, 28, self.local_qkey);
        set_u24(b, 32, self.local_qpn);
        b[35] = self.responder_resources;
        set_u24(b, 36, self.local_eecn);
        b[39] = self.initiator_depth;
        set_u24(b, 40, self.remote_eecn);
        b[43] = place(self.remote_cm_response_timeout, 0, 5)
            | place(self.transport_service_type, 5, 2)
            | place(self.end_to_end_flow_control.into(), 7, 1);
        set_u24(b, 44, self.starting_psn);
        b[47] = place(self.local_cm_response_timeout, 0, 5) | place(self.retry_count, 5, 3);
        set_u16(b, 48, self.partition_key);
        b[50] = place(self.path_mtu, 0, 4)
            | place(self.rdc_exists.into(), 4, 1)
            | place(self.rnr_retry_count, 5, 3);
        b[51] = place(self.max_cm_retries, 0, 4)
            | place(self.srq.into(), 4, 1)
            | place(self.extended_transport_type, 5, 3);
        self.primary.emit(b, 52);
        self.alternate.emit(b, 96);
        b[139] |= place(self.sap_supported.into(), 5, 1);
        b[140..].copy_from_slice(&self.private_data);
    }
}

/// Which message an MRA or a REJ answers (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answered {
    /// A REQ.
    Req,
    /// A REP.
    Rep,
    /// A LAP (MRA), or something else (REJ: 2, "Other").
    Other,
    /// The reserved value 3.
    Reserved,
}

impl Answered {
    fn from_bits(v: u8) -> Answered {
        match v {
            0 => Answered::Req,
            1 => Answered::Rep,
            2 => Answered::Other,
            _ => Answered::Reserved,
        }
    }
    const fn bits(self) -> u8 {
        match self {
            Answered::Req => 0,
            Answered::Rep => 1,
            Answered::Other => 2,
            Answered::Reserved => 3,
        }
    }
}

/// MsgRcptAck (IBTA Table 107): "your message arrived; the answer will take
/// longer than you would wait".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mra {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Message MRAed.
    pub message_mraed: Answered,
    /// Service Timeout (5 bits).
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; private_len::MRA],
}

impl Mra {
    /// Parse an MRA from a MAD's CM data.
    pub fn parse(b: &[u8]) -> Result<Mra> {
        let b = data(b)?;
        Ok(Mra {
            local_comm_id: get_u32(b, 0),
            remote_comm_id: get_u32(b, 4),
            message_mraed: Answered::from_bits(bits(b[8], 0, 2)),
            service_timeout: bits(b[9], 0, 5),
            private_data: array(b, 10),
        })
    }

    /// Write the MRA into a MAD's CM data.
    pub fn emit(&self, b: &mut [u8]) {
        let b = &mut b[..DATA_LEN];
        b.fill(0);
        set_u32(b, 0, self.local_comm_id);
        set_u32(b, 4, self.remote_comm_id);
        b[8] = place(self.message_mraed.bits(), 0, 2);
        b[9] = place(self.service_timeout, 0, 5);
        b[10..].copy_from_slice(&self.private_data);
    }
}

/// Reject reasons (IBTA Table 109) this crate names.
pub mod reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// Timeout: the REP or RTU never came.
    pub const TIMEOUT: u16 = 4;
    /// Unsupported request.
    pub const UNSUPPORTED: u16 = 5;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Invalid communication instance.
    pub const INVALID_COMM_INSTANCE: u16 = 7;
    /// Invalid service ID: nobody listens there.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Stale connection.
    pub const STALE_CONN: u16 = 10;
    /// Primary remote port GID rejected: the kernel's answer to a REQ whose
    /// path it cannot make an address from.
    pub const INVALID_GID: u16 = 12;
    /// Invalid MTU.
    pub const INVALID_MTU: u16 = 26;
    /// Consumer defined: the application said no.
    pub const CONSUMER_DEFINED: u16 = 28;
}

/// ConnectReject (IBTA Table 108).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rej {
    /// Local Communication ID (0 when the rejecting side made no
    /// connection, as the kernel's answer to a REQ nobody listens for).
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Message REJected.
    pub message_rejected: Answered,
    /// Reject Info Length (7 bits).
    pub reject_info_length: u8,
    /// Reason.
    pub reason: u16,
    /// Additional Reject Information.
    pub ari: [u8; 72],
    /// Private data.
    pub private_data: [u8; private_len::REJ],
}

impl Rej {
    /// A REJ with no reject information and no private data.
    pub const fn new(
        local_comm_id: u32,
        remote_comm_id: u32,
        message_rejected: Answered,
        reason: u16,
    ) -> Rej {
        Rej {
            local_comm_id,
            remote_comm_id,
            message_rejected,
            reject_info_length: 0,
            reason,
            ari: [0; 72],
            private_data: [0; private_len::REJ],
        }
    }

    /// Parse a REJ from a MAD's CM data.
    pub fn parse(b: &[u8]) -> Result<Rej> {
        let b = data(b)?;
        Ok(Rej {
            local_comm_id: get_u32(b, 0),
            remote_comm_id: get_u32(b, 4),
            message_rejected: Answered::from_bits(bits(b[8], 0, 2)),
            reject_info_length: bits(b[9], 0, 7),
            reason: get_u16(b, 10),
            ari: array(b, 12),
            private_data: array(b, 84),
        })
    }

    /// Write the REJ into a MAD's CM data.
    pub fn emit(&self, b: &mut [u8]) {
        let b = &mut b[..DATA_LEN];
        b.fill(0);
        set_u32(b, 0, self.local_comm_id);
        set_u32(b, 4, self.remote_comm_id);
        b[8] = place(self.message_rejected.bits(), 0, 2);
        b[9] = place(self.reject_info_length, 0, 7);
        set_u16(b, 10, self.reason);
        b[12..84].copy_from_slice(&self.ari);
        b[84..].copy_from_slice(&self.private_data);
    }
}

/// ConnectReply (IBTA Table 110).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rep {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Local EE Context Number (24 bits).
    pub local_eecn: u32,
    /// Starting PSN (24 bits): the first PSN the passive side receives,
    /// where the active side's requests start.
    pub starting_psn: u32,
    /// Responder Resources.
    pub responder_resources: u8,
    /// Initiator Depth.
    pub initiator_depth: u8,
    /// Target ACK Delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover Accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-End Flow Control.
    pub end_to_end_flow_control: bool,
    /// RNR Retry Count (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: [u8; private_len::REP],
}

impl Rep {
    /// Parse a REP from a MAD's CM data.
    pub fn parse(b: &[u8]) -> Result<Rep> {
        let b = data(b)?;
        Ok(Rep {
            local_comm_id: get_u32(b, 0),
            remote_comm_id: get_u32(b, 4),
            local_qkey: get_u32(b, 8),
            local_qpn: get_u24(b, 12),
            local_eecn: get_u24(b, 16),
            starting_psn: get_u24(b, 20),
            responder_resources: b[24],
            initiator_depth: b[25],
            target_ack_delay: bits(b[26], 0, 5),
            failover_accepted: bits(b[26], 5, 2),
            end_to_end_flow_control: bits(b[26], 7, 1) != 0,
            rnr_retry_count: bits(b[27], 0, 3),
            srq: bits(b[27], 3, 1) != 0,
            local_ca_guid: get_u64(b, 28),
            private_data: array(b, 36),
        })
    }

    /// Write the REP into a MAD's CM data.
    pub fn emit(&self, b: &mut [u8]) {
        let b = &mut b[..DATA_LEN];
        b.fill(0);
        set_u32(b, 0, self.local_comm_id);
        set_u32(b, 4, self.remote_comm_id);
        set_u32(b, 8, self.local_qkey);
        set_u24(b, 12, self.local_qpn);
        set_u24(b, 16, self.local_eecn);
        set_u24(b, 20, self.starting_psn);
        b[24] = self.responder_resources;
        b[25] = self.initiator_depth;
        b[26] = place(self.target_ack_delay, 0, 5)
            | place(self.failover_accepted, 5, 2)
            | place(self.end_to_end_flow_control.into(), 7, 1);
        b[27] = place(self.rnr_retry_count, 0, 3) | place(self.srq.into(), 3, 1);
        set_u64(b, 28, self.local_ca_guid);
        b[36..].copy_from_slice(&self.private_data);
    }
}

/// The messages that are two communication IDs and private data: RTU and
/// DREP (IBTA Tables 111 and 113).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ids {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; private_len::RTU],
}

impl Ids {
    /// Parse an RTU or a DREP from a MAD's CM data.
    pub fn parse(b: &[u8]) -> Result<Ids> {
        let b = data(b)?;
        Ok(Ids {
            local_comm_id: get_u32(b, 0),
            remote_comm_id: get_u32(b, 4),
            private_data: array(b, 8),
        })
    }

    /// Write it into a MAD's CM data.
    pub fn emit(&self, b: &mut [u8]) {
        let b = &mut b[..DATA_LEN];
        set_u32(b, 0, self.local_comm_id);
        set_u32(b, 4, self.remote_comm_id);
        b[8..].copy_from_slice(&self.private_data);
    }
}

/// DisconnectRequest (IBTA Table 112).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dreq {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Remote QPN/EECN (24 bits): the receiver's QP.
    pub remote_qpn_eecn: u32,
    /// Private data.
    pub private_data: [u8; private_len::DREQ],
}

impl Dreq {
    /// Parse a DREQ from a MAD's CM data.
    pub fn parse(b: &[u8]) -> Result<Dreq> {
        let b = data(b)?;
        Ok(Dreq {
            local_comm_id: get_u32(b, 0),
            remote_comm_id: get_u32(b, 4),
            remote_qpn_eecn: get_u24(b, 8),
            private_data: array(b, 12),
        })
    }

    /// Write the DREQ into a MAD's CM data.
    pub fn emit(&self, b: &mut [u8]) {
        let b = &mut b[..DATA_LEN];
        b.fill(0);
        set_u32(b, 0, self.local_comm_id);
        set_u32(b, 4, self.remote_comm_id);
        set_u24(b, 8, self.remote_qpn_eecn);
        b[12..].copy_from_slice(&self.private_data);
    }
}

/// ServiceIDResReq (IBTA Table 119): which UD QP serves this service ID?
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrReq {
    /// RequestID.
    pub request_id: u32,
    /// Partition Key.
    pub partition_key: u16,
    /// ServiceID.
    pub service_id: u64,
    /// Private data.
    pub private_data: [u8; private_len::SIDR_REQ],
}

impl SidrReq {
    /// Parse a SIDR_REQ from a MAD's CM data.
    pub fn parse(b: &[u8]) -> Result<SidrReq> {
        let b = data(b)?;
        Ok(SidrReq {
            request_id: get_u32(b, 0),
            partition_key: get_u16(b, 4),
            service_id: get_u64(b, 8),
            private_data: array(b, 16),
        })
    }

    /// Write the SIDR_REQ into a MAD's CM data.
    pub fn emit(&self, b: &mut [u8]) {
        let b = &mut b[..DATA_LEN];
        b.fill(0);
        set_u32(b, 0, self.request_id);
        set_u16(b, 4, self.partition_key);
        set_u64(b, 8, self.service_id);
        b[16..].copy_from_slice(&self.private_data);
    }
}

/// ServiceIDResReqResp (IBTA Table 120).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrRep {
    /// RequestID.
    pub request_id: u32,
    /// Status (0: the QP is valid; 1 no such service ID; 2 rejected...).
    pub status: u8,
    /// Additional Information Length.
    pub additional_info_length: u8,
    /// QPN (24 bits).
    pub qpn: u32,
    /// ServiceID.
    pub service_id: u64,
    /// Q_Key.
    pub qkey: u32,
    /// Additional Information (ClassPortInfo for a redirect).
    pub additional_info: [u8; 72],
    /// Private data.
    pub private_data: [u8; private_len::SIDR_REP],
}

impl SidrRep {
    /// Parse a SIDR_REP from a MAD's CM data.
    pub fn parse(b: &[u8]) -> Result<SidrRep> {
        let b = data(b)?;
        Ok(SidrRep {
            request_id: get_u32(b, 0),
            status: b[4],
            additional_info_length: b[5],
            qpn: get_u24(b, 8),
            service_id: get_u64(b, 12),
            qkey: get_u32(b, 20),
            additional_info: array(b, 24),
            private_data: array(b, 96),
        })
    }

    /// Write the SIDR_REP into a MAD's CM data.
    pub fn emit(&self, b: &mut [u8]) {
        let b = &mut b[..DATA_LEN];
        b.fill(0);
        set_u32(b, 0, self.request_id);
        b[4] = self.status;
        b[5] = self.additional_info_length;
        set_u24(b, 8, self.qpn);
        set_u64(b, 12, self.service_id);
        set_u32(b, 20, self.qkey);
        b[24..96].copy_from_slice(&self.additional_info);
        b[96..].copy_from_slice(&self.private_data);
    }
}

/// A CM message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Message {
    /// ConnectRequest.
    Req(Req),
    /// MsgRcptAck.
    Mra(Mra),
    /// ConnectReject.
    Rej(Rej),
    /// ConnectReply.
    Rep(Rep),
    /// ReadyToUse.
    Rtu(Ids),
    /// DisconnectRequest.
    Dreq(Dreq),
    /// DisconnectReply.
    Drep(Ids),
    /// ServiceIDResReq.
    SidrReq(SidrReq),
    /// ServiceIDResReqResp.
    SidrRep(SidrRep),
}

impl Message {
    /// Parse the CM data `b` of a MAD whose AttributeID is `attribute_id`.
    pub fn parse(attribute_id: u16, b: &[u8]) -> Result<Message> {
        Ok(match attribute_id {
            attr::REQ => Message::Req(Req::parse(b)?),
            attr::MRA => Message::Mra(Mra::parse(b)?),
            attr::REJ => Message::Rej(Rej::parse(b)?),
            attr::REP => Message::Rep(Rep::parse(b)?),
            attr::RTU => Message::Rtu(Ids::parse(b)?),
            attr::DREQ => Message::Dreq(Dreq::parse(b)?),
            attr::DREP => Message::Drep(Ids::parse(b)?),
            attr::SIDR_REQ => Message::SidrReq(SidrReq::parse(b)?),
            attr::SIDR_REP => Message::SidrRep(SidrRep::parse(b)?),
            a => {
                return Err(Error::new(
                    Layer::Cm,
                    ErrorKind::UnknownAttribute(mad::CLASS_CM, a),
                ))
            }
        })
    }

    /// Its AttributeID.
    pub const fn attribute_id(&self) -> u16 {
        match self {
            Message::Req(_) => attr::REQ,
            Message::Mra(_) => attr::MRA,
            Message::Rej(_) => attr::REJ,
            Message::Rep(_) => attr::REP,
            Message::Rtu(_) => attr::RTU,
            Message::Dreq(_) => attr::DREQ,
            Message::Drep(_) => attr::DREP,
            Message::SidrReq(_) => attr::SIDR_REQ,
            Message::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// Its name, as the IBTA abbreviates it.
    pub const fn name(&self) -> &'static str {
        match self {
            Message::Req(_) => "REQ",
            Message::Mra(_) => "MRA",
            Message::Rej(_) => "REJ",
            Message::Rep(_) => "REP",
            Message::Rtu(_) => "RTU",
            Message::Dreq(_) => "DREQ",
            Message::Drep(_) => "DREP",
            Message::SidrReq(_) => "SIDR_REQ",
            Message::SidrRep(_) => "SIDR_REP",
        }
    }

    /// Its private data (for a REQ or SIDR_REQ, rdma_cm's header first).
    pub fn private_data(&self) -> &[u8] {
        match self {
            Message::Req(m) => &m.private_data,
            Message::Mra(m) => &m.private_data,
            Message::Rej(m) => &m.private_data,
            Message::Rep(m) => &m.private_data,
            Message::Rtu(m) | Message::Drep(m) => &m.private_data,
            Message::Dreq(m) => &m.private_data,
            Message::SidrReq(m) => &m.private_data,
            Message::SidrRep(m) => &m.private_data,
        }
    }

    /// Write the CM data (232 bytes) into `b`.
    pub fn emit(&self, b: &mut [u8]) {
        match self {
            Message::Req(m) => m.emit(b),
            Message::Mra(m) => m.emit(b),
            Message::Rej(m) => m.emit(b),
            Message::Rep(m) => m.emit(b),
            Message::Rtu(m) | Message::Drep(m) => m.emit(b),
            Message::Dreq(m) => m.emit(b),
            Message::SidrReq(m) => m.emit(b),
            Message::SidrRep(m) => m.emit(b),
        }
    }
}

/// A whole CM MAD: the common header and the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mad {
    /// The MAD header.
    pub header: mad::Repr,
    /// The message.
    pub message: Message,
}

impl Mad {
    /// Parse a CM MAD (the payload of a UD SEND to QP1). Another management
    /// class is an [`ErrorKind::UnknownAttribute`] error, as is an
    /// AttributeID the CM does not define.
    pub fn parse(b: &[u8]) -> Result<Mad> {
        let header = mad::Repr::parse(&mad::Packet::new_checked(b)?)?;
        if header.mgmt_class != mad::CLASS_CM {
            return Err(Error::new(
                Layer::Mad,
                ErrorKind::UnknownAttribute(header.mgmt_class, header.attribute_id),
            ));
        }
        let message =
            Message::parse(header.attribute_id, &b[mad::HEADER_LEN..]).map_err(|e| e.at(24))?;
        Ok(Mad { header, message })
    }

    /// A CM MAD carrying `message` in transaction `transaction_id`.
    pub const fn new(transaction_id: u64, message: Message) -> Mad {
        Mad {
            header: mad::Repr::cm(message.attribute_id(), transaction_id),
            message,
        }
    }

    /// Write the 256-byte MAD into `b`.
    pub fn emit(&self, b: &mut [u8]) {
        self.header
            .emit(&mut mad::Packet::new_unchecked(&mut b[..mad::HEADER_LEN]));
        self.message.emit(&mut b[mad::HEADER_LEN..mad::MAD_LEN]);
    }
}

impl fmt::Display for Mad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CM {} tid={:#018x}",
            self.message.name(),
            self.header.transaction_id
        )?;
        match &self.message {
            Message::Req(m) => {
                write!(
                    f,
                    " comm={:#010x} sid={:#018x} qpn={:#08x} psn={:#08x} mtu={} rr={} id={} retry={} rnr={}",
                    m.local_comm_id,
                    m.service_id,
                    m.local_qpn,
                    m.starting_psn,
                    m.path_mtu,
                    m.responder_resources,
                    m.initiator_depth,
                    m.retry_count,
                    m.rnr_retry_count
                )?;
                if let Some(h) = CmaHeader::parse(&m.private_data) {
                    write!(f, " {h}")?;
                }
                Ok(())
            }
            Message::Mra(m) => write!(
                f,
                " comm={:#010x}/{:#010x} mraed={:?} timeout={}",
                m.local_comm_id, m.remote_comm_id, m.message_mraed, m.service_timeout
            ),
            Message::Rej(m) => write!(
                f,
                " comm={:#010x}/{:#010x} rejected={:?} reason={}",
                m.local_comm_id, m.remote_comm_id, m.message_rejected, m.reason
            ),
            Message::Rep(m) => write!(
                f,
                " comm={:#010x}/{:#010x} qpn={:#08x} psn={:#08x} rr={} id={} rnr={}",
                m.local_comm_id,
                m.remote_comm_id,
                m.local_qpn,
                m.starting_psn,
                m.responder_resources,
                m.initiator_depth,
                m.rnr_retry_count
            ),
            Message::Rtu(m) | Message::Drep(m) => write!(
                f,
                " comm={:#010x}/{:#010x}",
                m.local_comm_id, m.remote_comm_id
            ),
            Message::Dreq(m) => write!(
                f,
                " comm={:#010x}/{:#010x} qpn={:#08x}",
                m.local_comm_id, m.remote_comm_id, m.remote_qpn_eecn
            ),
            Message::SidrReq(m) => {
                write!(f, " req={:#010x} sid={:#018x}", m.request_id, m.service_id)?;
                if let Some(h) = CmaHeader::parse(&m.private_data) {
                    write!(f, " {h}")?;
                }
                Ok(())
            }
            Message::SidrRep(m) => write!(
                f,
                " req={:#010x} status={} qpn={:#08x} qkey={:#010x}",
                m.request_id, m.status, m.qpn, m.qkey
            ),
        }
    }
}

/// The rdma_cm port spaces (`enum rdma_ucm_port_space`): the high half of a
/// service ID's low 32 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// RDMA_PS_IPOIB.
    Ipoib,
    /// RDMA_PS_IB.
    Ib,
    /// RDMA_PS_TCP: reliable connections.
    Tcp,
    /// RDMA_PS_UDP: datagrams, resolved by SIDR.
    Udp,
}

impl PortSpace {
    /// Its number.
    pub const fn number(self) -> u16 {
        match self {
            PortSpace::Ipoib => 0x0002,
            PortSpace::Ib => 0x013F,
            PortSpace::Tcp => 0x0106,
            PortSpace::Udp => 0x0111,
        }
    }
    /// The port space of `n`, if rdma_cm defines it.
    pub const fn from_number(n: u16) -> Option<PortSpace> {
        match n {
            0x0002 => Some(PortSpace::Ipoib),
            0x013F => Some(PortSpace::Ib),
            0x0106 => Some(PortSpace::Tcp),
            0x0111 => Some(PortSpace::Udp),
            _ => None,
        }
    }
}

/// The service ID rdma_cm uses for `port` in `space`: `(space << 16) + port`.
pub const fn service_id(space: PortSpace, port: u16) -> u64 {
    (space.number() as u64) << 16 | port as u64
}

/// The port space and port of an rdma_cm service ID, if it is one.
pub const fn rdma_cm_port(service_id: u64) -> Option<(PortSpace, u16)> {
    if service_id >> 32 != 0 {
        return None;
    }
    match PortSpace::from_number((service_id >> 16) as u16) {
        Some(ps) => Some((ps, service_id as u16)),
        None => None,
    }
}

/// The flow label the Linux kernel puts in a REQ's primary path for an
/// rdma_cm connection from `src_port` to `dst_port` (the rdma_cm ports),
/// checked against every REQ of the reference captures.
pub const fn rdma_cm_flow_label(src_port: u16, dst_port: u16) -> u32 {
    (src_port as u32 * 31 + dst_port as u32) & 0xF_FFFF
}

/// The RoCE v2 UDP source port the Linux kernel derives from a flow label
/// (`rdma_flow_label_to_udp_sport`): both directions of a connection made
/// through the CM use it.
pub const fn flow_label_udp_sport(flow_label: u32) -> u16 {
    let low = (flow_label & 0x3FFF) ^ ((flow_label & 0xF_C000) >> 14);
    (low | 0xC000) as u16
}

/// The transaction ID the Linux kernel's CM gives the MADs of a connection
/// whose sender has Local Communication ID `local_comm_id`: its CM agent's
/// `hi_tid` above, the communication ID's four bytes read little-endian
/// below (an ID whose bytes are `c3 db 6a de` gives `0x..._de6adbc3`).
/// REP, REJ, MRA and SIDR_REP answer with the TID of what they answer; RTU
/// and the active side's DREQ reuse the REQ's; the passive side's DREQ has
/// a TID of its own; DREP echoes the DREQ's.
pub const fn kernel_tid(hi_tid: u32, local_comm_id: u32) -> u64 {
    (hi_tid as u64) << 32 | local_comm_id.swap_bytes() as u64
}

/// The header rdma_cm puts at the start of a REQ's or SIDR_REQ's private
/// data (36 bytes; the application's private data follows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHeader {
    /// The header's version (0).
    pub version: u8,
    /// The active side's rdma_cm port.
    pub src_port: u16,
    /// The active side's address.
    pub src: IpAddr,
    /// The passive side's address.
    pub dst: IpAddr,
}

/// Bytes of [`CmaHeader`].
pub const CMA_HEADER_LEN: usize = 36;

impl CmaHeader {
    /// The header at the start of `private_data`, if it is one: version 0,
    /// IP version 4 or 6. An IPv4 address sits in the last 4 of its 16
    /// bytes, zeros before it (not in the `::ffff:` form).
    pub fn parse(private_data: &[u8]) -> Option<CmaHeader> {
        let b = private_data.get(..CMA_HEADER_LEN)?;
        if b[0] != 0 {
            return None;
        }
        let addr = |at: usize| -> IpAddr {
            let v4 = get_u32(b, at + 12);
            match bits(b[1], 0, 4) {
                4 => IpAddr::V4(Ipv4Addr::from(v4)),
                _ => IpAddr::V6(gid(b, at)),
            }
        };
        match bits(b[1], 0, 4) {
            4 | 6 => Some(CmaHeader {
                version: b[0],
                src_port: get_u16(b, 2),
                src: addr(4),
                dst: addr(20),
            }),
            _ => None,
        }
    }

    /// Write the header into the first 36 bytes of `private_data`. Both
    /// addresses must be of one family (the IP version names it).
    pub fn emit(&self, private_data: &mut [u8]) {
        let b = &mut private_data[..CMA_HEADER_LEN];
        b.fill(0);
        b[0] = self.version;
        b[1] = place(if self.src.is_ipv4() { 4 } else { 6 }, 0, 4);
        set_u16(b, 2, self.src_port);
        for (at, a) in [(4, self.src), (20, self.dst)] {
            match a {
                IpAddr::V4(v4) => set_u32(b, at + 12, v4.into()),
                IpAddr::V6(v6) => b[at..at + 16].copy_from_slice(&v6.octets()),
            }
        }
    }
}

impl fmt::Display for CmaHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rdma_cm {}:{} -> {}", self.src, self.src_port, self.dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_fields_sit_where_the_ibta_puts_them() {
        assert_eq!(bits(0b1010_0110, 0, 5), 0b10100);
        assert_eq!(bits(0b1010_0110, 5, 2), 0b11);
        assert_eq!(bits(0b1010_0110, 7, 1), 0);
        assert_eq!(place(0b10100, 0, 5) | place(0b11, 5, 2), 0b1010_0110);
        assert_eq!(
            place(0xFF, 4, 1),
            0b0000_1000,
            "a value wider than its field is cut"
        );
    }

    #[test]
    fn kernel_derivations_match_the_captures() {
        // cm-rping: CMA source port 51929 to rping's 7174.
        assert_eq!(rdma_cm_flow_label(51929, 7174), 0x8ac4d);
        assert_eq!(flow_label_udp_sport(0x8ac4d), 60527);
        // cm-rping-v6 and cm-send-bw, from their REQs' flow labels.
        assert_eq!(flow_label_udp_sport(0x84dba), 52635);
        assert_eq!(flow_label_udp_sport(0xcea9d), 60078);
        assert_eq!(kernel_tid(2, 0xc3db_6ade), 0x0000_0002_de6a_dbc3);
        assert_eq!(service_id(PortSpace::Tcp, 7174), 0x0106_1c06);
        assert_eq!(rdma_cm_port(0x0111_1c06), Some((PortSpace::Udp, 7174)));
        assert_eq!(rdma_cm_port(0x1_0106_1c06), None);
        assert_eq!(rdma_cm_port(0x0777_1c06), None);
    }

    #[test]
    fn the_cma_header_round_trips_both_families() {
        // cm-rping's REQ: 0040cad9, then 10.77.0.1 and 10.77.0.2 in the
        // last 4 bytes of their 16.
        let mut raw = [0u8; 36];
        raw[..4].copy_from_slice(&[0x00, 0x40, 0xca, 0xd9]);
        raw[16..20].copy_from_slice(&[10, 77, 0, 1]);
        raw[32..36].copy_from_slice(&[10, 77, 0, 2]);
        let h = CmaHeader::parse(&raw).unwrap();
        assert_eq!(h.src_port, 51929);
        assert_eq!(h.src, "10.77.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(h.dst, "10.77.0.2".parse::<IpAddr>().unwrap());
        let mut out = [0xEEu8; 36];
        h.emit(&mut out);
        assert_eq!(out, raw);
        let v6 = CmaHeader {
            version: 0,
            src_port: 55322,
            src: "fd77::1".parse().unwrap(),
            dst: "fd77::2".parse().unwrap(),
        };
        v6.emit(&mut out);
        assert_eq!(out[1], 0x60);
        assert_eq!(CmaHeader::parse(&out), Some(v6));
        // Not a CMA header: a version other than 0, an IP version other
        // than 4 or 6, too short.
        out[1] = 0x50;
        assert_eq!(CmaHeader::parse(&out), None);
        assert_eq!(CmaHeader::parse(&raw[..35]), None);
        raw[0] = 1;
        assert_eq!(CmaHeader::parse(&raw), None);
    }

    #[test]
    fn short_data_and_unknown_attributes_are_errors() {
        let b = [0u8; DATA_LEN];
        assert!(Req::parse(&b[..DATA_LEN - 1]).is_err());
        let e = Message::parse(0x0019, &b).unwrap_err();
        assert_eq!(e.kind, ErrorKind::UnknownAttribute(mad::CLASS_CM, 0x0019));
        let mut m = [0u8; mad::MAD_LEN];
        mad::Repr::cm(attr::RTU, 7).emit(&mut mad::Packet::new_unchecked(&mut m[..]));
        m[1] = 0x04; // another class
        assert!(Mad::parse(&m).is_err());
        m[1] = mad::CLASS_CM;
        assert!(matches!(Mad::parse(&m).unwrap().message, Message::Rtu(_)));
        let e = Mad::parse(&m[..200]).unwrap_err();
        assert_eq!((e.layer, e.offset), (Layer::Cm, 24));
    }

    #[test]
    fn every_field_round_trips_at_its_widest() {
        // All-ones fields: a field that spilled into its neighbour, or a
        // bit left out, would change the bytes.
        let ones = Path {
            local_lid: 0xFFFF,
            remote_lid: 0xFFFF,
            local_gid: Ipv6Addr::from([0xFF; 16]),
            remote_gid: Ipv6Addr::from([0xFF; 16]),
            flow_label: 0xF_FFFF,
            packet_rate: 0x3F,
            traffic_class: 0xFF,
            hop_limit: 0xFF,
            sl: 0xF,
            subnet_local: true,
            local_ack_timeout: 0x1F,
        };
        let req = Req {
            local_comm_id: u32::MAX,
            service_id: u64::MAX,
            local_ca_guid: u64::MAX,
            local_qkey: u32::MAX,
            local_qpn: 0xFF_FFFF,
            responder_resources: 0xFF,
            local_eecn: 0xFF_FFFF,
            initiator_depth: 0xFF,
            remote_eecn: 0xFF_FFFF,
            remote_cm_response_timeout: 0x1F,
            transport_service_type: 3,
            end_to_end_flow_control: true,
            starting_psn: 0xFF_FFFF,
            local_cm_response_timeout: 0x1F,
            retry_count: 7,
            partition_key: 0xFFFF,
            path_mtu: 0xF,
            rdc_exists: true,
            rnr_retry_count: 7,
            max_cm_retries: 0xF,
            srq: true,
            extended_transport_type: 7,
            primary: ones,
            alternate: ones,
            sap_supported: true,
            private_data: [0xFF; private_len::REQ],
        };
        let mut b = [0u8; DATA_LEN];
        req.emit(&mut b);
        assert_eq!(Req::parse(&b).unwrap(), req);
        // Reserved: 4..8, 24..28, 88..92 bits 11:6, 94 bits 2:0, 95 bits
        // 2:0, and the alternate path's likewise (139 keeps SAP at bit 2).
        let reserved_zero = [4, 5, 6, 7, 24, 25, 26, 27];
        for i in reserved_zero {
            assert_eq!(b[i], 0, "byte {i} is reserved");
        }
        assert_eq!(b[90] & 0x0F, 0);
        assert_eq!(b[91] & 0xC0, 0);
        assert_eq!(b[94] & 0x07, 0);
        assert_eq!(b[95] & 0x07, 0);
        assert_eq!(b[139] & 0x07, 0x04);
        let rep = Rep {
            local_comm_id: u32::MAX,
            remote_comm_id: u32::MAX,
            local_qkey: u32::MAX,
            local_qpn: 0xFF_FFFF,
            local_eecn: 0xFF_FFFF,
            starting_psn: 0xFF_FFFF,
            responder_resources: 0xFF,
            initiator_depth: 0xFF,
            target_ack_delay: 0x1F,
            failover_accepted: 3,
            end_to_end_flow_control: true,
            rnr_retry_count: 7,
            srq: true,
            local_ca_guid: u64::MAX,
            private_data: [0xFF; private_len::REP],
        };
        rep.emit(&mut b);
        assert_eq!(Rep::parse(&b).unwrap(), rep);
        assert_eq!((b[15], b[19], b[23], b[27] & 0x0F), (0, 0, 0, 0));
        let rej = Rej {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_rejected: Answered::Reserved,
            reject_info_length: 0x7F,
            reason: 0xFFFF,
            ari: [0xFF; 72],
            private_data: [0xFF; private_len::REJ],
        };
        rej.emit(&mut b);
        assert_eq!(Rej::parse(&b).unwrap(), rej);
        assert_eq!((b[8] & 0x3F, b[9] & 0x01), (0, 0));
        let mra = Mra {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_mraed: Answered::Other,
            service_timeout: 0x1F,
            private_data: [0xFF; private_len::MRA],
        };
        mra.emit(&mut b);
        assert_eq!(Mra::parse(&b).unwrap(), mra);
        assert_eq!((b[8], b[9] & 0x07), (0x80, 0));
        let sidr = SidrRep {
            request_id: 1,
            status: 0xFF,
            additional_info_length: 0xFF,
            qpn: 0xFF_FFFF,
            service_id: u64::MAX,
            qkey: u32::MAX,
            additional_info: [0xFF; 72],
            private_data: [0xFF; private_len::SIDR_REP],
        };
        sidr.emit(&mut b);
        assert_eq!(SidrRep::parse(&b).unwrap(), sidr);
        assert_eq!((b[6], b[7], b[11]), (0, 0, 0));
    }
}
