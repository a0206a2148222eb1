//! What a NIC counts (its counters, named as rdma_rxe's hardware counters)
//! and what it holds (its footprint, object by object): what a driver
//! shows a person, and what tests that churn objects measure.

/// Counters, named like rdma_rxe's hardware counters where one exists.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets sent.
    pub sent_pkts: u64,
    /// Packets received and accepted for processing.
    pub rcvd_pkts: u64,
    /// Packets dropped because their ICRC was wrong.
    pub icrc_errors: u64,
    /// Packets dropped because they did not parse.
    pub malformed: u64,
    /// Packets for a QP that does not exist (or is not connected to the sender).
    pub unknown_qp: u64,
    /// Duplicate requests received.
    pub duplicate_request: u64,
    /// Duplicate READs dropped because they were not the same READ or a
    /// part of it (another R_Key, a range outside it, responses beyond its PSNs).
    pub duplicate_read_refused: u64,
    /// Requests received ahead of the expected PSN.
    pub out_of_seq_request: u64,
    /// RNR NAKs sent.
    pub send_rnr_err: u64,
    /// RNR NAKs received.
    pub rcvd_rnr_err: u64,
    /// Sequence-error NAKs received.
    pub rcvd_seq_err: u64,
    /// Sequence-error NAKs that started no retransmission, one being under way.
    pub seq_nak_ignored: u64,
    /// Retransmissions started (timeout, sequence NAK, missing READ response).
    pub completer_retry_err: u64,
    /// Requests failed with RETRY_EXC_ERR.
    pub retry_exceeded_err: u64,
    /// Requests failed with RNR_RETRY_EXC_ERR.
    pub retry_rnr_exceeded_err: u64,
    /// Responses for nothing outstanding (ghost or duplicate ACKs).
    pub ghost_or_duplicate_response: u64,
    /// Times a requester shrank its window because a round trip took more
    /// than a quarter of its local ACK timeout (a queue in front of a slow
    /// responder).
    pub window_delay_cuts: u64,
    /// Times a SEND or WRITE with immediate waited for the responder's
    /// end-to-end credits (IBTA 9.7.7.2; rdmavt's `rc_crwaits`).
    pub credit_waits: u64,
    /// READ response packets dropped because their opcode does not fit
    /// where they fall in the response (a LAST where a FIRST is due, say).
    pub read_response_out_of_order: u64,
    /// SEND messages received.
    pub rdma_recvs: u64,
    /// UC messages dropped (a PSN gap, or a request that could not be carried out).
    pub uc_dropped: u64,
    /// UD packets dropped for a Q_Key that was not the QP's.
    pub qkey_violations: u64,
    /// Packets dropped for a BTH TVer other than 0 (IBTA 9.2.6; rdma_rxe's
    /// `hdr_check` drops them too).
    pub bad_tver: u64,
    /// Packets dropped because their P_Key does not match the QP's
    /// (IBTA 9.2.7, 10.9.3: rnic's one P_Key is the default 0xFFFF, which
    /// matches 0xFFFF and the limited member 0x7FFF).
    pub pkey_violations: u64,
    /// Packets dropped because their opcode is of another transport than
    /// the QP's (a UD or XRC SEND to an RC QP, say; as rdma_rxe's
    /// `check_type_state`).
    pub wrong_transport: u64,
    /// UD packets dropped because no receive was posted.
    pub ud_dropped_no_recv: u64,
    /// Packets that could not be built.
    pub send_err: u64,
    /// Plain ACKs withdrawn before they left, a newer ACK of the same QP
    /// saying what they said (coalesced, see the transmit queue).
    pub acks_coalesced: u64,
    /// Responses dropped because a QP already held its most behind a READ
    /// response (the requester's retry recovers them).
    pub responses_dropped: u64,
    /// Frames a frame transport handed over that were not RoCE v2 to this
    /// NIC: another protocol, another UDP port, another destination address.
    pub foreign_frames: u64,
    /// Invalid Request NAKs sent (a malformed or impossible request: a
    /// length past the path MTU, a misaligned atomic, a bad opcode sequence).
    pub nak_invalid_request_sent: u64,
    /// Remote Access Error NAKs sent (an R_Key, range, right or domain the
    /// request had no claim to).
    pub nak_remote_access_sent: u64,
    /// Remote Operational Error NAKs sent.
    pub nak_remote_op_sent: u64,
}

/// What a NIC holds, object by object: for tests that create and destroy
/// objects by the hundred thousand and require the NIC to end no larger
/// than a few cycles in ([`crate::Nic::footprint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Footprint {
    /// Live QPs.
    pub qps: usize,
    /// CQ table slots (live or free).
    pub cq_slots: usize,
    /// SRQ table slots (live or free).
    pub srq_slots: usize,
    /// PD table slots (live or free).
    pub pd_slots: usize,
    /// Region and window table slots (live or free).
    pub key_slots: usize,
    /// Key indices mapped to a slot.
    pub keys: usize,
    /// Live regions and windows.
    pub regions: usize,
    /// Freed QP numbers and key indices kept out of use (bounded by
    /// [`crate::rng::QUARANTINE`] each).
    pub resting_ids: usize,
    /// Entries in the timer heap.
    pub timers: usize,
    /// Packets waiting to be sent, and spare packet buffers.
    pub packets: usize,
    /// Async events and QPs waiting for their turn.
    pub queued: usize,
}
