//! The communication manager of one port (IBTA chapter 12): the state
//! machine that connects two RC or UC queue pairs by exchanging REQ, REP
//! and RTU, refuses with REJ, and disconnects with DREQ and DREP, over
//! management datagrams on QP1 ([`rnic_wire::cm`]).
//!
//! Like the rest of the core it does no I/O and reads no clock: the caller
//! hands in each received MAD and the time, takes the MADs to send from
//! [`CmAgent::take_outgoing`] and the events for the application from
//! [`CmAgent::take_events`], and calls [`CmAgent::on_timer`] at
//! [`CmAgent::next_deadline`]. Moving the queue pairs through their states
//! is the caller's, between an event and the call that answers it, as
//! ib_cm leaves it to its users: a [`CmEvent::Reply`] is answered by
//! [`CmAgent::ready`] (the RTU) once the active side's QP is ready to
//! send.
//!
//! Where the IBTA leaves a choice this follows the Linux kernel's ib_cm,
//! whose traffic is the reference (`rnic-wire`'s README): a REQ nobody
//! listens for is refused with reason 8 and Local Communication ID 0; a
//! repeated REQ is met with an MRA while the application has not answered,
//! and refused as a stale connection (reason 10) in timewait; a repeated REP
//! is answered with the RTU again; a DREQ for a connection that is gone
//! still gets its DREP; transaction IDs are those the kernel uses
//! ([`rnic_wire::cm::kernel_tid`]).

use core::net::IpAddr;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use rnic_wire::cm::{
    self, reason, Answered, Dreq, Ids, Mad, Message, Mra, Path, Rej, Rep, Req, SidrRep, SidrReq,
};

use crate::rng::{self, SecretRng};
use crate::time::Time;

/// The most REQs a listener holds unanswered unless told otherwise: the
/// kernel's rdma_cm default (`net.rdma_ucm.max_backlog`).
pub const DEFAULT_BACKLOG: usize = 1024;

/// The service timeout of the MRA sent for a request the application has
/// not answered when its REQ comes again (4.096 us x 2^24, about 69 s):
/// the kernel's rdma_cm's (`CMA_CM_MRA_SETTING`), as the reference
/// captures show it.
pub const MRA_SERVICE_TIMEOUT: u8 = 24;

/// How long a connection stays in timewait after it is disconnected: the
/// IDs of a connection just closed are refused to a late REQ for that long.
pub const TIMEWAIT: Duration = Duration::from_secs(1);

/// The wait for an answer to a REQ, REP or DREQ: 4.096 us x 2^`exponent`
/// (a CM response timeout, IBTA 12.7.29), doubled for the round trip.
fn response_wait(exponent: u8) -> Duration {
    Duration::from_nanos(4096u64 << exponent.min(31)) * 2
}

/// A connection's handle: its Local Communication ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmId(pub u32);

/// What the active side asks for in a REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    /// The service to connect to (rdma_cm's: [`cm::service_id`]).
    pub service_id: u64,
    /// The active side's QP.
    pub qpn: u32,
    /// The first PSN the active side receives: where the passive side's
    /// requests start (the REQ's Starting PSN, as the kernel's CM reads it).
    pub starting_psn: u32,
    /// RDMA READ and atomic requests the active side answers at once.
    pub responder_resources: u8,
    /// RDMA READ and atomic requests the active side sends at once.
    pub initiator_depth: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// Path MTU (the verbs MTU code).
    pub path_mtu: u8,
    /// The path: GIDs, flow label, hop limit, local ACK timeout.
    pub path: Path,
    /// Transport service type: 0 RC, 1 UC.
    pub transport: u8,
    /// Private data (at most 92 bytes; rdma_cm's header first).
    pub private_data: Vec<u8>,
}

/// What the passive side answers in a REP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptParams {
    /// The passive side's QP.
    pub qpn: u32,
    /// The first PSN the passive side receives: where the active side's
    /// requests start (the REP's Starting PSN).
    pub starting_psn: u32,
    /// RDMA READ and atomic requests it answers at once.
    pub responder_resources: u8,
    /// RDMA READ and atomic requests it sends at once.
    pub initiator_depth: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// Private data (at most 196 bytes).
    pub private_data: Vec<u8>,
}

/// What the application learns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// Passive side: a REQ for a service listened on. Answer with
    /// [`CmAgent::accept`] or [`CmAgent::reject`].
    Request {
        /// The new connection.
        id: CmId,
        /// Where the REQ came from.
        from: IpAddr,
        /// The REQ.
        req: Box<Req>,
    },
    /// Active side: the REP. Make the QP ready (RTR, RTS), then
    /// [`CmAgent::ready`].
    Reply {
        /// The connection.
        id: CmId,
        /// The REP.
        rep: Box<Rep>,
    },
    /// The connection is established (the passive side got the RTU, the
    /// active side sent it).
    Established {
        /// The connection.
        id: CmId,
    },
    /// The peer refused (a REJ).
    Rejected {
        /// The connection.
        id: CmId,
        /// The REJ's reason.
        reason: u16,
        /// The REJ's private data.
        private_data: Box<[u8; cm::private_len::REJ]>,
    },
    /// No answer after every retry.
    Unreachable {
        /// The connection.
        id: CmId,
    },
    /// The peer disconnected (its DREQ, answered with a DREP).
    DisconnectRequest {
        /// The connection.
        id: CmId,
    },
    /// The connection is closed (the DREP to this side's DREQ, or no
    /// answer to it); it rests in timewait.
    Disconnected {
        /// The connection.
        id: CmId,
    },
    /// Passive side: a SIDR_REQ for a service listened on (a UD QP's
    /// number and Q_Key asked for). Answer with [`CmAgent::sidr_reply`].
    SidrRequest {
        /// The request.
        id: CmId,
        /// Where it came from.
        from: IpAddr,
        /// The SIDR_REQ.
        req: Box<SidrReq>,
    },
    /// Active side: the SIDR_REP (its status says whether the QP it names
    /// is valid).
    SidrReply {
        /// The request.
        id: CmId,
        /// The SIDR_REP.
        rep: Box<SidrRep>,
    },
}

/// What a SIDR_REP's status says (IBTA Table 113).
pub mod sidr_status {
    /// The QP and Q_Key are valid.
    pub const VALID: u8 = 0;
    /// Nobody serves the service ID.
    pub const UNSUPPORTED: u8 = 1;
    /// The service refused.
    pub const REJECTED: u8 = 2;
}

/// Why a call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmError {
    /// No such connection.
    NoSuchId(CmId),
    /// The connection is not in a state that allows the call.
    BadState(CmId),
    /// The service is listened on already.
    Listening(u64),
    /// Private data longer than the message carries.
    PrivateDataTooLong(usize),
    /// No Local Communication ID is free.
    NoIds,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// SIDR, active: the SIDR_REQ sent, its SIDR_REP awaited.
    SidrSent,
    /// SIDR, passive: the application is to answer the SIDR_REQ.
    SidrRcvd,
    ReqSent,
    ReqRcvd,
    RepSent,
    RepRcvd,
    Established,
    DreqSent,
    Timewait,
}

#[derive(Debug)]
struct Conn {
    state: State,
    peer: IpAddr,
    remote_comm_id: u32,
    /// The transaction of the REQ (and of what answers it).
    tid: u64,
    /// The last message this side sent and may send again.
    last: Option<Mad>,
    /// When it is sent again, or the state left (timewait).
    deadline: Option<Time>,
    retries_left: u8,
    /// The peer's CM response timeout exponent (our wait for its answer).
    response_timeout: u8,
    /// Its QP (a DREQ names it).
    remote_qpn: u32,
    /// This side sent the REQ.
    active: bool,
    /// The service a passive connection's REQ asked for.
    service_id: u64,
}

impl Conn {
    /// A connection (or SIDR request) in `state` with `peer`, in
    /// transaction `tid`, for `service_id`; nothing sent or awaited yet.
    fn new(state: State, peer: IpAddr, tid: u64, service_id: u64, response_timeout: u8) -> Conn {
        Conn {
            state,
            peer,
            remote_comm_id: 0,
            tid,
            last: None,
            deadline: None,
            retries_left: 0,
            response_timeout,
            remote_qpn: 0,
            active: matches!(state, State::ReqSent | State::SidrSent),
            service_id,
        }
    }

    /// Closed: nothing more to send; the IDs rest until `now + TIMEWAIT`.
    fn enter_timewait(&mut self, now: Time) {
        self.state = State::Timewait;
        self.last = None;
        self.deadline = Some(now + TIMEWAIT);
    }
}

/// Whom a CM MAD is for, where several agents answer at one address (see
/// [`addressee`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addressee {
    /// A REQ or SIDR_REQ: the agent that listens on this service ID.
    Service(u64),
    /// Any other message: the agent that chose this ID (the communication
    /// ID or SIDR request ID the message names as its receiver's).
    Agent(u32),
}

/// Whom `mad` is for: every CM message but a request names its receiver's
/// own ID. `None` for a REJ that names none (a REJ of a REQ the sender
/// could not read).
pub fn addressee(mad: &Mad) -> Option<Addressee> {
    let id = match &mad.message {
        Message::Req(m) => return Some(Addressee::Service(m.service_id)),
        Message::SidrReq(m) => return Some(Addressee::Service(m.service_id)),
        Message::SidrRep(m) => m.request_id,
        Message::Rep(m) => m.remote_comm_id,
        Message::Mra(m) => m.remote_comm_id,
        Message::Rej(m) => m.remote_comm_id,
        Message::Rtu(m) | Message::Drep(m) => m.remote_comm_id,
        Message::Dreq(m) => m.remote_comm_id,
    };
    (id != 0).then_some(Addressee::Agent(id))
}

/// Whom a RoCE packet to QP 1 (`ib`: from its BTH on) is for, if it holds
/// a CM MAD that names one; what the receiving NIC makes of the packet
/// (its ICRC, its headers' checks) is still the NIC's to say.
pub fn packet_addressee(ib: &[u8]) -> Option<Addressee> {
    let pkt = rnic_wire::IbPacket::new_checked(ib).ok()?;
    if pkt.bth().dest_qp() != rnic_wire::mad::GSI_QPN {
        return None;
    }
    let mad = pkt.payload().get(..rnic_wire::mad::MAD_LEN)?;
    addressee(&Mad::parse(mad).ok()?)
}

/// The communication manager of one port.
pub struct CmAgent {
    ca_guid: u64,
    /// The high half of every transaction ID this agent starts.
    hi_tid: u32,
    ids: rng::Ids,
    conns: HashMap<u32, Conn>,
    /// Services listened on, each with its backlog.
    listening: HashMap<u64, usize>,
    outgoing: VecDeque<(IpAddr, Mad)>,
    events: VecDeque<CmEvent>,
    /// The CM response timeout exponent this side announces (20: about 4 s,
    /// as the kernel's).
    pub response_timeout: u8,
    /// Retries of a REQ, REP or DREQ before giving up (15, as the kernel's).
    pub max_retries: u8,
    /// REQs dropped because their listener's backlog was full.
    pub requests_dropped: u64,
}

impl std::fmt::Debug for CmAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmAgent")
            .field("connections", &self.conns.len())
            .field("listening", &self.listening.len())
            .finish()
    }
}

fn copy_private<const N: usize>(data: &[u8]) -> Result<[u8; N], CmError> {
    if data.len() > N {
        return Err(CmError::PrivateDataTooLong(data.len()));
    }
    let mut out = [0u8; N];
    out[..data.len()].copy_from_slice(data);
    Ok(out)
}

impl CmAgent {
    /// The CM of a port whose CA GUID is `ca_guid`, drawing its
    /// communication IDs and transaction IDs with `rng`.
    pub fn new(ca_guid: u64, mut rng: SecretRng) -> CmAgent {
        let hi_tid = rng.next_u64() as u32;
        CmAgent {
            ca_guid,
            hi_tid,
            ids: rng::Ids::new(rng, 1, u32::MAX),
            conns: HashMap::new(),
            listening: HashMap::new(),
            outgoing: VecDeque::new(),
            events: VecDeque::new(),
            response_timeout: 20,
            max_retries: 15,
            requests_dropped: 0,
        }
    }

    /// Accept REQs for `service_id`, with the default backlog
    /// ([`DEFAULT_BACKLOG`]).
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        self.listen_with_backlog(service_id, DEFAULT_BACKLOG)
    }

    /// Accept REQs for `service_id`, holding at most `backlog` the
    /// application has not answered yet: a REQ beyond them is dropped
    /// (and counted), not refused, as the kernel's CM drops one its
    /// listener has no room for, so that the peer's retry may find room.
    /// A peer that floods REQs and never completes one holds no more.
    pub fn listen_with_backlog(&mut self, service_id: u64, backlog: usize) -> Result<(), CmError> {
        if self.listening.contains_key(&service_id) {
            return Err(CmError::Listening(service_id));
        }
        self.listening.insert(service_id, backlog.max(1));
        Ok(())
    }

    /// Draw IDs (communication IDs, SIDR request IDs) only with `slot` in
    /// their top `bits` bits (at most 8), as the QP numbers of a NIC that
    /// shares its address with others ([`crate::Nic::restrict_qpns`]); the
    /// rest stays random.
    pub fn restrict_ids(&mut self, slot: u32, bits: u32) {
        let bits = bits.min(8);
        let shift = 32 - bits;
        let lo = (slot << shift).max(1);
        let hi = (u64::from(slot + 1) << shift).saturating_sub(1) as u32;
        self.ids.set_range(lo, hi);
    }

    /// Stop accepting REQs for `service_id`.
    pub fn unlisten(&mut self, service_id: u64) {
        self.listening.remove(&service_id);
    }

    fn new_id(&mut self) -> Result<u32, CmError> {
        let conns = &self.conns;
        self.ids
            .draw(|v| conns.contains_key(&v))
            .ok_or(CmError::NoIds)
    }

    fn send(&mut self, to: IpAddr, mad: Mad) {
        self.outgoing.push_back((to, mad));
    }

    /// Send `mad` for `id` and keep it to send again until answered.
    fn send_kept(&mut self, now: Time, id: u32, mad: Mad) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.last = Some(mad);
        c.retries_left = self.max_retries;
        c.deadline = Some(now + response_wait(c.response_timeout));
        let peer = c.peer;
        self.send(peer, mad);
    }

    /// Active side: send a REQ to `to`; the answer comes as an event.
    pub fn connect(&mut self, now: Time, to: IpAddr, p: &ConnectParams) -> Result<CmId, CmError> {
        let private_data = copy_private(&p.private_data)?;
        let id = self.new_id()?;
        let req = Req {
            local_comm_id: id,
            service_id: p.service_id,
            local_ca_guid: self.ca_guid,
            local_qkey: 0,
            local_qpn: p.qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: self.response_timeout,
            transport_service_type: p.transport,
            end_to_end_flow_control: false,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: self.response_timeout,
            retry_count: p.retry_count,
            partition_key: 0xFFFF,
            path_mtu: p.path_mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: self.max_retries,
            srq: false,
            extended_transport_type: 0,
            primary: p.path,
            alternate: Path::NONE,
            sap_supported: false,
            private_data,
        };
        let tid = cm::kernel_tid(self.hi_tid, id);
        let conn = Conn::new(State::ReqSent, to, tid, p.service_id, self.response_timeout);
        self.conns.insert(id, conn);
        self.send_kept(now, id, Mad::new(tid, Message::Req(req)));
        Ok(CmId(id))
    }

    /// Active side of SIDR (Service ID Resolution, for UD): ask `to` for
    /// the UD QP serving `service_id`, with `private_data` (at most 216
    /// bytes; rdma_cm's header first); the answer comes as
    /// [`CmEvent::SidrReply`], or [`CmEvent::Unreachable`] once every
    /// retry went unanswered.
    pub fn sidr_request(
        &mut self,
        now: Time,
        to: IpAddr,
        service_id: u64,
        private_data: &[u8],
    ) -> Result<CmId, CmError> {
        let private_data = copy_private(private_data)?;
        let id = self.new_id()?;
        let req = SidrReq {
            request_id: id,
            partition_key: 0xFFFF,
            service_id,
            private_data,
        };
        let tid = cm::kernel_tid(self.hi_tid, id);
        let conn = Conn::new(State::SidrSent, to, tid, service_id, self.response_timeout);
        self.conns.insert(id, conn);
        self.send_kept(now, id, Mad::new(tid, Message::SidrReq(req)));
        Ok(CmId(id))
    }

    /// Passive side of SIDR: answer request `id` with `status`
    /// ([`sidr_status`]), the UD QP `qpn` and its `qkey`, and
    /// `private_data` (at most 136 bytes). The request is done with.
    pub fn sidr_reply(
        &mut self,
        id: CmId,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let private_data = copy_private(private_data)?;
        let c = self.conns.get(&id.0).ok_or(CmError::NoSuchId(id))?;
        if c.state != State::SidrRcvd {
            return Err(CmError::BadState(id));
        }
        let rep = SidrRep {
            request_id: c.remote_comm_id,
            status,
            additional_info_length: 0,
            qpn: qpn & 0xFF_FFFF,
            service_id: c.service_id,
            qkey,
            additional_info: [0; 72],
            private_data,
        };
        let (peer, tid) = (c.peer, c.tid);
        self.conns.remove(&id.0);
        self.send(peer, Mad::new(tid, Message::SidrRep(rep)));
        Ok(())
    }

    /// Passive side: accept the REQ of `id` with a REP.
    pub fn accept(&mut self, now: Time, id: CmId, p: &AcceptParams) -> Result<(), CmError> {
        let private_data = copy_private(&p.private_data)?;
        let c = self.conns.get_mut(&id.0).ok_or(CmError::NoSuchId(id))?;
        if c.state != State::ReqRcvd {
            return Err(CmError::BadState(id));
        }
        c.state = State::RepSent;
        let rep = Rep {
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            local_qkey: 0,
            local_qpn: p.qpn,
            local_eecn: 0,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: 15,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: p.rnr_retry_count,
            srq: false,
            local_ca_guid: self.ca_guid,
            private_data,
        };
        let tid = c.tid;
        self.send_kept(now, id.0, Mad::new(tid, Message::Rep(rep)));
        Ok(())
    }

    /// Refuse the REQ of `id` (passive side, before accepting; reason 28
    /// is the application's own) or the REP (active side, before
    /// [`CmAgent::ready`]). The connection is gone.
    pub fn reject(&mut self, id: CmId, why: u16, private_data: &[u8]) -> Result<(), CmError> {
        let pd = copy_private(private_data)?;
        let c = self.conns.get(&id.0).ok_or(CmError::NoSuchId(id))?;
        let message_rejected = match c.state {
            State::ReqRcvd => Answered::Req,
            State::RepRcvd => Answered::Rep,
            _ => return Err(CmError::BadState(id)),
        };
        let rej = Rej {
            private_data: pd,
            ..Rej::new(id.0, c.remote_comm_id, message_rejected, why)
        };
        let (peer, tid) = (c.peer, c.tid);
        self.conns.remove(&id.0);
        self.send(peer, Mad::new(tid, Message::Rej(rej)));
        Ok(())
    }

    /// Passive side: a packet of the connection arrived on its QP before
    /// the RTU did (`IBV_EVENT_COMM_EST`, which rdma_cm's `rdma_notify`
    /// passes on): the connection is established as if the RTU had come,
    /// and the REP is not sent again. Established already: nothing to do.
    pub fn established(&mut self, id: CmId) -> Result<(), CmError> {
        let c = self.conns.get_mut(&id.0).ok_or(CmError::NoSuchId(id))?;
        match c.state {
            State::RepSent => {
                c.state = State::Established;
                c.deadline = None;
                c.last = None;
                self.events.push_back(CmEvent::Established { id });
                Ok(())
            }
            State::Established => Ok(()),
            _ => Err(CmError::BadState(id)),
        }
    }

    /// Active side: the QP is ready; send the RTU. The connection is
    /// established.
    pub fn ready(&mut self, id: CmId) -> Result<(), CmError> {
        let c = self.conns.get_mut(&id.0).ok_or(CmError::NoSuchId(id))?;
        if c.state != State::RepRcvd {
            return Err(CmError::BadState(id));
        }
        c.state = State::Established;
        c.deadline = None;
        let rtu = Message::Rtu(Ids {
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            private_data: [0; cm::private_len::RTU],
        });
        let mad = Mad::new(c.tid, rtu);
        // Kept: a repeated REP (the RTU was lost) is answered with it.
        c.last = Some(mad);
        let peer = c.peer;
        self.send(peer, mad);
        self.events.push_back(CmEvent::Established { id });
        Ok(())
    }

    /// Disconnect an established connection (a DREQ); the end comes as
    /// [`CmEvent::Disconnected`].
    pub fn disconnect(&mut self, now: Time, id: CmId) -> Result<(), CmError> {
        let c = self.conns.get_mut(&id.0).ok_or(CmError::NoSuchId(id))?;
        if c.state != State::Established {
            return Err(CmError::BadState(id));
        }
        c.state = State::DreqSent;
        let dreq = Dreq {
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            remote_qpn_eecn: c.remote_qpn,
            private_data: [0; cm::private_len::DREQ],
        };
        // The active side's DREQ is in the REQ's transaction, the passive
        // side's in one of its own (as the kernel's).
        let tid = if c.active {
            c.tid
        } else {
            cm::kernel_tid(self.hi_tid, id.0)
        };
        self.send_kept(now, id.0, Mad::new(tid, Message::Dreq(dreq)));
        Ok(())
    }

    /// The application is done with connection `id` (rdma_cm's
    /// `rdma_destroy_id`, or its process ending): what the kernel's CM
    /// sends when an ID is destroyed in each state (`cm_destroy_id`), so the
    /// peer is never left holding a connection nobody will close.
    ///
    /// - a REQ awaiting its REP: REJ reason 4 (timeout), with this CA's
    ///   GUID as the reject information; the connection is gone;
    /// - a REQ not yet answered, or a REP not yet answered with an RTU:
    ///   REJ 28 (the consumer's); gone;
    /// - a REP awaiting its RTU: REJ 28, then timewait (the peer may
    ///   have taken the REP);
    /// - established: a DREQ, as [`CmAgent::disconnect`];
    /// - a SIDR_REQ received: a SIDR_REP with status 2 (rejected).
    ///
    /// One difference, on purpose: the kernel stops resending a DREQ when
    /// its ID is destroyed, which leaves the peer connected for ever if
    /// that DREQ was lost. Here it goes on being resent while the NIC
    /// lives, as for an ID still held. Destroying an ID the agent no longer
    /// holds (rejected, timed out, its timewait over) does nothing.
    pub fn destroy(&mut self, now: Time, id: CmId) {
        let Some(c) = self.conns.get(&id.0) else {
            return;
        };
        let (peer, tid, remote) = (c.peer, c.tid, c.remote_comm_id);
        let rej = |message: Answered, local: u32, why: u16| {
            Mad::new(tid, Message::Rej(Rej::new(local, remote, message, why)))
        };
        match c.state {
            State::SidrSent => {
                self.conns.remove(&id.0);
            }
            State::SidrRcvd => {
                let _ = self.sidr_reply(id, sidr_status::REJECTED, 0, 0, &[]);
            }
            State::ReqSent => {
                let mut r = Rej::new(id.0, 0, Answered::Other, reason::TIMEOUT);
                r.reject_info_length = 8;
                r.ari[..8].copy_from_slice(&self.ca_guid.to_be_bytes());
                self.conns.remove(&id.0);
                self.send(peer, Mad::new(tid, Message::Rej(r)));
            }
            State::ReqRcvd => {
                self.conns.remove(&id.0);
                self.send(peer, rej(Answered::Req, 0, reason::CONSUMER_DEFINED));
            }
            State::RepRcvd => {
                self.conns.remove(&id.0);
                self.send(peer, rej(Answered::Rep, id.0, reason::CONSUMER_DEFINED));
            }
            State::RepSent => {
                let mad = rej(Answered::Other, id.0, reason::CONSUMER_DEFINED);
                if let Some(c) = self.conns.get_mut(&id.0) {
                    c.enter_timewait(now);
                }
                self.send(peer, mad);
            }
            State::Established => {
                let _ = self.disconnect(now, id);
            }
            State::DreqSent | State::Timewait => {}
        }
    }

    /// Destroy every connection (see [`CmAgent::destroy`]): the NIC's
    /// process is ending.
    pub fn destroy_all(&mut self, now: Time) {
        // In ID order: what goes out does not depend on the map's hashing.
        let mut ids: Vec<u32> = self.conns.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            self.destroy(now, CmId(id));
        }
    }

    /// How many DREQs wait for their DREP.
    pub fn unanswered_dreqs(&self) -> usize {
        self.conns
            .values()
            .filter(|c| c.state == State::DreqSent)
            .count()
    }

    /// Send every unanswered DREQ once more now, its retries and timer
    /// untouched: for a process about to end, whose timers end with it.
    pub fn resend_dreqs(&mut self) {
        let again: Vec<(IpAddr, Mad)> = self
            .conns
            .values()
            .filter(|c| c.state == State::DreqSent)
            .filter_map(|c| Some((c.peer, c.last?)))
            .collect();
        self.outgoing.extend(again);
    }

    /// A CM MAD arrived from `from`.
    pub fn on_mad(&mut self, now: Time, from: IpAddr, mad: &Mad) {
        let tid = mad.header.transaction_id;
        match &mad.message {
            Message::Req(req) => self.on_req(from, tid, req),
            Message::Rep(rep) => self.on_rep(from, rep),
            Message::Rtu(rtu) => {
                if let Some(c) = self.conns.get_mut(&rtu.remote_comm_id) {
                    if c.state == State::RepSent && c.peer == from {
                        c.state = State::Established;
                        c.deadline = None;
                        c.last = None;
                        let id = CmId(rtu.remote_comm_id);
                        self.events.push_back(CmEvent::Established { id });
                    }
                }
            }
            Message::Rej(rej) => {
                // A REJ names this side's ID and, once the REP has told it,
                // the peer's (a REQ's REJ names none: its sender had not
                // made one, or it is the kernel's, whose REJ of a REQ
                // carries 0). It ends the connection in any state before
                // the close: one still being made is gone, one the peer
                // may hold rests in timewait (the kernel's
                // `cm_rej_handler`), as when the peer's ID was destroyed.
                let id = rej.remote_comm_id;
                let Some(c) = self.conns.get_mut(&id) else {
                    return;
                };
                let names_peer = c.state == State::ReqSent
                    || rej.message_rejected == Answered::Req
                    || rej.local_comm_id == c.remote_comm_id;
                let ours = c.peer == from
                    && names_peer
                    && matches!(
                        c.state,
                        State::ReqSent
                            | State::RepSent
                            | State::RepRcvd
                            | State::Established
                            | State::DreqSent
                    );
                if ours {
                    if matches!(c.state, State::ReqSent | State::RepSent) {
                        self.conns.remove(&id);
                    } else {
                        c.enter_timewait(now);
                    }
                    self.events.push_back(CmEvent::Rejected {
                        id: CmId(id),
                        reason: rej.reason,
                        private_data: Box::new(rej.private_data),
                    });
                }
            }
            Message::Mra(mra) => {
                // The peer needs longer: wait its service timeout more.
                if let Some(c) = self.conns.get_mut(&mra.remote_comm_id) {
                    if c.peer == from && c.deadline.is_some() {
                        c.deadline = Some(now + response_wait(mra.service_timeout));
                    }
                }
            }
            Message::Dreq(dreq) => self.on_dreq(now, from, tid, dreq),
            Message::SidrReq(req) => self.on_sidr_req(from, tid, req),
            Message::SidrRep(rep) => {
                let id = rep.request_id;
                let ours = self
                    .conns
                    .get(&id)
                    .is_some_and(|c| c.peer == from && c.state == State::SidrSent);
                if ours {
                    self.conns.remove(&id);
                    self.events.push_back(CmEvent::SidrReply {
                        id: CmId(id),
                        rep: Box::new(*rep),
                    });
                }
            }
            Message::Drep(drep) => {
                if let Some(c) = self.conns.get_mut(&drep.remote_comm_id) {
                    if c.state == State::DreqSent && c.peer == from {
                        c.enter_timewait(now);
                        let id = CmId(drep.remote_comm_id);
                        self.events.push_back(CmEvent::Disconnected { id });
                    }
                }
            }
        }
    }

    /// A REQ that rdma_cm refuses before any connection is made (its
    /// header or QP type is not its port space's): REJ 28 (consumer
    /// defined) if somebody listens for its service ID, as the kernel's
    /// rdma_cm answers, else REJ 8 as for any REQ nobody listens for. No
    /// state is kept. Whether somebody listens.
    pub fn refuse_request(&mut self, from: IpAddr, tid: u64, req: &Req) -> bool {
        let listening = self.listening.contains_key(&req.service_id);
        let why = if listening {
            reason::CONSUMER_DEFINED
        } else {
            reason::INVALID_SERVICE_ID
        };
        let rej = Rej::new(0, req.local_comm_id, Answered::Req, why);
        self.send(from, Mad::new(tid, Message::Rej(rej)));
        listening
    }

    /// A SIDR_REQ: refused with status UNSUPPORTED if nobody listens (the
    /// kernel's answer), dropped if it repeats one the application has not
    /// answered yet or the listener's backlog is full, else a request.
    fn on_sidr_req(&mut self, from: IpAddr, tid: u64, req: &SidrReq) {
        let Some(&backlog) = self.listening.get(&req.service_id) else {
            let rep = SidrRep {
                request_id: req.request_id,
                status: sidr_status::UNSUPPORTED,
                additional_info_length: 0,
                qpn: 0,
                service_id: req.service_id,
                qkey: 0,
                additional_info: [0; 72],
                private_data: [0; cm::private_len::SIDR_REP],
            };
            self.send(from, Mad::new(tid, Message::SidrRep(rep)));
            return;
        };
        let repeated = self.conns.values().any(|c| {
            c.state == State::SidrRcvd && c.peer == from && c.remote_comm_id == req.request_id
        });
        if repeated {
            return;
        }
        if self.waiting(req.service_id) >= backlog {
            self.requests_dropped += 1;
            return;
        }
        let Ok(id) = self.new_id() else {
            return;
        };
        let conn = Conn {
            remote_comm_id: req.request_id,
            ..Conn::new(
                State::SidrRcvd,
                from,
                tid,
                req.service_id,
                self.response_timeout,
            )
        };
        self.conns.insert(id, conn);
        self.events.push_back(CmEvent::SidrRequest {
            id: CmId(id),
            from,
            req: Box::new(*req),
        });
    }

    /// Requests for `service_id` the application has not answered.
    fn waiting(&self, service_id: u64) -> usize {
        self.conns
            .values()
            .filter(|c| {
                matches!(c.state, State::ReqRcvd | State::SidrRcvd) && c.service_id == service_id
            })
            .count()
    }

    fn on_req(&mut self, from: IpAddr, tid: u64, req: &Req) {
        // A REQ seen before: the connection it made.
        let known = self
            .conns
            .iter()
            .find(|(_, c)| c.peer == from && c.remote_comm_id == req.local_comm_id && c.tid == tid);
        if let Some((&id, c)) = known {
            match c.state {
                State::Timewait => {
                    let rej = Rej::new(id, req.local_comm_id, Answered::Other, reason::STALE_CONN);
                    self.send(from, Mad::new(tid, Message::Rej(rej)));
                }
                // The application has not answered, and the peer is
                // running out of patience: it is told the answer will be
                // late, as the kernel's rdma_cm tells it (its MRA is
                // "delayed" until the REQ comes again).
                State::ReqRcvd => {
                    let mra = Mra {
                        local_comm_id: id,
                        remote_comm_id: req.local_comm_id,
                        message_mraed: Answered::Req,
                        service_timeout: MRA_SERVICE_TIMEOUT,
                        private_data: [0; cm::private_len::MRA],
                    };
                    self.send(from, Mad::new(tid, Message::Mra(mra)));
                }
                // Otherwise the REP answers it (and is sent again on its
                // own timer).
                _ => {}
            }
            return;
        }
        let Some(&backlog) = self.listening.get(&req.service_id) else {
            let rej = Rej::new(
                0,
                req.local_comm_id,
                Answered::Req,
                reason::INVALID_SERVICE_ID,
            );
            self.send(from, Mad::new(tid, Message::Rej(rej)));
            return;
        };
        if self.waiting(req.service_id) >= backlog {
            self.requests_dropped += 1;
            return;
        }
        let Ok(id) = self.new_id() else {
            return; // the REQ is sent again; an ID may be free by then
        };
        // How long the active side takes to answer the REP: its own
        // response timeout.
        let wait = req.local_cm_response_timeout;
        let conn = Conn {
            remote_comm_id: req.local_comm_id,
            remote_qpn: req.local_qpn,
            ..Conn::new(State::ReqRcvd, from, tid, req.service_id, wait)
        };
        self.conns.insert(id, conn);
        self.events.push_back(CmEvent::Request {
            id: CmId(id),
            from,
            req: Box::new(*req),
        });
    }

    fn on_rep(&mut self, from: IpAddr, rep: &Rep) {
        let Some(c) = self.conns.get_mut(&rep.remote_comm_id) else {
            return;
        };
        if c.peer != from {
            return;
        }
        match c.state {
            State::ReqSent => {
                c.state = State::RepRcvd;
                c.remote_comm_id = rep.local_comm_id;
                c.remote_qpn = rep.local_qpn;
                c.deadline = None;
                c.last = None;
                let id = CmId(rep.remote_comm_id);
                self.events.push_back(CmEvent::Reply {
                    id,
                    rep: Box::new(*rep),
                });
            }
            // The RTU was lost: send it again.
            State::Established if c.remote_comm_id == rep.local_comm_id => {
                if let Some(rtu) = c.last {
                    let peer = c.peer;
                    self.send(peer, rtu);
                }
            }
            _ => {}
        }
    }

    fn on_dreq(&mut self, now: Time, from: IpAddr, tid: u64, dreq: &Dreq) {
        let drep = Message::Drep(Ids {
            local_comm_id: dreq.remote_comm_id,
            remote_comm_id: dreq.local_comm_id,
            private_data: [0; cm::private_len::DREP],
        });
        // Answered whatever the state: a DREQ whose DREP was lost, or for
        // a connection gone, must not be sent for ever.
        self.send(from, Mad::new(tid, drep));
        let Some(c) = self.conns.get_mut(&dreq.remote_comm_id) else {
            return;
        };
        if c.peer != from || c.remote_comm_id != dreq.local_comm_id {
            return;
        }
        if matches!(
            c.state,
            State::Established | State::RepSent | State::DreqSent
        ) {
            let was_sending = c.state == State::DreqSent;
            c.enter_timewait(now);
            let id = CmId(dreq.remote_comm_id);
            self.events.push_back(if was_sending {
                CmEvent::Disconnected { id }
            } else {
                CmEvent::DisconnectRequest { id }
            });
        }
    }

    /// The next time [`CmAgent::on_timer`] has something to do.
    pub fn next_deadline(&self) -> Option<Time> {
        self.conns.values().filter_map(|c| c.deadline).min()
    }

    /// Send again what waits for an answer past its time; give up on what
    /// has no retries left; end timewaits.
    pub fn on_timer(&mut self, now: Time) {
        let mut due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(&id, _)| id)
            .collect();
        // In ID order, as `destroy_all`: the simulator replays a run only
        // if what goes out does not depend on the map's hashing.
        due.sort_unstable();
        for id in due {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            let state = c.state;
            if state == State::Timewait {
                self.conns.remove(&id);
                continue;
            }
            if c.retries_left == 0 {
                let event = match state {
                    State::DreqSent => {
                        c.enter_timewait(now);
                        CmEvent::Disconnected { id: CmId(id) }
                    }
                    _ => {
                        self.conns.remove(&id);
                        CmEvent::Unreachable { id: CmId(id) }
                    }
                };
                self.events.push_back(event);
                continue;
            }
            c.retries_left -= 1;
            c.deadline = Some(now + response_wait(c.response_timeout));
            if let Some(m) = c.last {
                let peer = c.peer;
                self.send(peer, m);
            }
        }
    }

    /// The MADs to send, each with its destination.
    pub fn take_outgoing(&mut self) -> impl Iterator<Item = (IpAddr, Mad)> + '_ {
        self.outgoing.drain(..)
    }

    /// The next thing the application learns.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// Every event for the application, in order (the iterator drains them
    /// all, whether or not it is run to the end).
    pub fn take_events(&mut self) -> impl Iterator<Item = CmEvent> + '_ {
        self.events.drain(..)
    }

    /// Connections held (in any state, timewait included).
    pub fn connections(&self) -> usize {
        self.conns.len()
    }
}

#[cfg(test)]
mod tests;
