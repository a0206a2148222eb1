//! The communication manager: connecting queue pairs through QP1, by the
//! IBTA's REQ, REP and RTU, as rdma_cm does on a real host.
//!
//! Each NIC has one CM ([`rnic_core::cm::CmAgent`], run by the engine
//! under its lock, its timers among the NIC's). This module routes what it
//! says to whoever asked: every call that starts something names a
//! [`CmChannel`] and a token, and the events of that listener or
//! connection arrive there as [`CmNotice`]s carrying the token. A channel
//! has a descriptor that is readable while notices wait, which is what
//! rdma_cm's event channel is; the drop-in librdmacm builds on this, and
//! so does the Rust API here ([`Device::listen`], [`Device::connect`]).
//!
//! Moving the queue pairs through their states is the caller's, as
//! rdma_cm's library does it between the kernel's events:
//! [`QpSetup`] says what the REQ and REP settle.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Duration;

pub use rnic_core::cm::{AcceptParams, CmError, CmEvent, CmId, ConnectParams};
use rnic_core::qp::{AddressVector, AttrMask, Mtu, QpAttr, QpState};
pub use rnic_wire::cm::PortSpace;
use rnic_wire::cm::{private_len, rdma_cm_flow_label, CmaHeader, Path, Rep, Req, CMA_HEADER_LEN};

use crate::channel::{queue, Raise, Waiting};
use crate::{Access, Device, Error, QueuePair, Result};

/// What a [`CmChannel`] carries, for the listener or connection given
/// `token`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmNotice {
    /// The token the listener or connection was given.
    pub token: u64,
    /// What happened.
    pub what: Notice,
}

/// What happened: an event of the CM, or one its user queued itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The CM's.
    Cm(CmEvent),
    /// The user's own ([`CmChannel::post`]): an address resolved, say,
    /// which happens outside the CM.
    Own(u64),
}

/// A queue of [`CmNotice`]s whose descriptor is readable while one waits
/// (rdma_cm's `rdma_event_channel`).
#[derive(Debug)]
pub struct CmChannel {
    raise: Arc<Raise<CmNotice>>,
    waiting: Waiting<CmNotice>,
}

impl CmChannel {
    /// An empty channel.
    pub fn new() -> Result<CmChannel> {
        let (raise, waiting) = queue()?;
        Ok(CmChannel {
            raise: Arc::new(raise),
            waiting,
        })
    }

    /// The next notice, waiting up to `timeout` for one (`None`: forever;
    /// zero: do not wait: [`Error::Timeout`]). Signals do not end the wait.
    pub fn next(&self, timeout: Option<Duration>) -> Result<CmNotice> {
        self.waiting.next(timeout)
    }

    /// The next notice, waiting as `read(2)` on the descriptor would: as
    /// long as it takes if the descriptor is blocking, not at all
    /// ([`Error::Timeout`]) if the program made it non-blocking, ended by a
    /// signal whose handler lacks `SA_RESTART`.
    pub fn read(&self) -> Result<CmNotice> {
        self.waiting.read()
    }

    /// Queue a notice of the caller's own for `token` (an address
    /// resolved, say: what the CM itself never says).
    pub fn post(&self, token: u64, what: u64) {
        self.raise.raise(CmNotice {
            token,
            what: Notice::Own(what),
        });
    }

    fn route(&self, token: u64) -> Route {
        Route {
            to: self.raise.clone(),
            token,
        }
    }
}

impl AsFd for CmChannel {
    /// The descriptor to poll: readable while a notice waits.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.waiting.as_fd()
    }
}

/// Where a listener's or a connection's events go.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    to: Arc<Raise<CmNotice>>,
    token: u64,
}

impl Route {
    fn send(&self, event: CmEvent) {
        self.to.raise(CmNotice {
            token: self.token,
            what: Notice::Cm(event),
        });
    }
}

/// The routes of one NIC's CM, under the engine's lock: events are routed
/// as they are taken from the NIC, and a route set in the same locked call
/// that starts a connection is there before any event of it.
#[derive(Debug, Default)]
pub(crate) struct Routes {
    /// Each service listened on: its route, and the name that tells the
    /// NIC that receives the address's CM messages who listens (see
    /// `engine::relay`).
    listeners: HashMap<u64, (Route, std::os::unix::net::UnixDatagram)>,
    conns: HashMap<CmId, Route>,
}

impl Routes {
    /// Hand `e` to whoever waits for it. A request goes to its service's
    /// listener and the new connection has no route until it is accepted;
    /// an event nobody waits for is dropped (its connection was released).
    pub fn deliver(&mut self, e: CmEvent) {
        let route = match &e {
            CmEvent::Request { req, .. } => self.listeners.get(&req.service_id).map(|l| &l.0),
            CmEvent::SidrRequest { req, .. } => self.listeners.get(&req.service_id).map(|l| &l.0),
            CmEvent::Reply { id, .. }
            | CmEvent::Established { id }
            | CmEvent::Rejected { id, .. }
            | CmEvent::Unreachable { id }
            | CmEvent::DisconnectRequest { id }
            | CmEvent::Disconnected { id }
            | CmEvent::SidrReply { id, .. } => self.conns.get(id),
        };
        match route {
            Some(r) => {
                tracing::debug!(token = r.token, ?e, "CM event");
                r.send(e)
            }
            None => tracing::debug!(?e, "a CM event nobody waits for"),
        }
    }
}

impl From<CmError> for Error {
    fn from(e: CmError) -> Error {
        let kind = match e {
            CmError::Listening(_) => io::ErrorKind::AddrInUse,
            CmError::PrivateDataTooLong(_) => io::ErrorKind::InvalidInput,
            CmError::NoIds => io::ErrorKind::OutOfMemory,
            CmError::NoSuchId(_) | CmError::BadState(_) => io::ErrorKind::InvalidInput,
        };
        Error::Io(io::Error::new(kind, format!("{e:?}")))
    }
}

impl Device {
    /// Take the REQs for `service_id` (rdma_cm's: [`rnic_wire::cm::service_id`]):
    /// each arrives on `channel` as a [`CmEvent::Request`] with `token`,
    /// at most `backlog` of them unanswered at a time (those beyond are
    /// dropped, and the peer's retry may find room). Another listener of
    /// the service on this NIC: `AddrInUse`.
    pub fn cm_listen(
        &self,
        service_id: u64,
        backlog: usize,
        channel: &CmChannel,
        token: u64,
    ) -> Result<()> {
        let route = channel.route(token);
        tracing::debug!(service_id = format_args!("{service_id:#x}"), "CM listen");
        self.engine.call(move |st| -> Result<()> {
            st.nic.cm().listen_with_backlog(service_id, backlog)?;
            match st.listening_on(service_id) {
                Ok(name) => {
                    st.cm_routes.listeners.insert(service_id, (route, name));
                    Ok(())
                }
                Err(e) => {
                    st.nic.cm().unlisten(service_id);
                    Err(e.into())
                }
            }
        })?
    }

    /// Stop taking REQs for `service_id`; a later REQ is refused as the
    /// kernel refuses one nobody listens for.
    pub fn cm_unlisten(&self, service_id: u64) -> Result<()> {
        self.engine.call(move |st| {
            st.nic.cm().unlisten(service_id);
            st.cm_routes.listeners.remove(&service_id);
        })?;
        Ok(())
    }

    /// Send a REQ to `to`; its answer arrives on `channel` with `token`
    /// (a [`CmEvent::Reply`], [`CmEvent::Rejected`] or
    /// [`CmEvent::Unreachable`]).
    pub fn cm_connect(
        &self,
        to: IpAddr,
        params: &ConnectParams,
        channel: &CmChannel,
        token: u64,
    ) -> Result<CmId> {
        let route = channel.route(token);
        tracing::debug!(%to, service_id = format_args!("{:#x}", params.service_id), "CM connect");
        self.engine.call(move |st| -> Result<CmId> {
            let now = st.now();
            let id = st.nic.cm_call(now, |cm, now| cm.connect(now, to, params))?;
            st.cm_routes.conns.insert(id, route);
            Ok(id)
        })?
    }

    /// Accept the request of connection `id` with a REP; the connection's
    /// events arrive on `channel` with `token` from now on.
    pub fn cm_accept(
        &self,
        id: CmId,
        params: &AcceptParams,
        channel: &CmChannel,
        token: u64,
    ) -> Result<()> {
        let route = channel.route(token);
        self.engine.call(move |st| -> Result<()> {
            let now = st.now();
            st.nic.cm_call(now, |cm, now| cm.accept(now, id, params))?;
            st.cm_routes.conns.insert(id, route);
            Ok(())
        })?
    }

    /// Ask `to` by SIDR for the UD QP serving `service_id`; the answer
    /// ([`CmEvent::SidrReply`], or [`CmEvent::Unreachable`]) arrives on
    /// `channel` with `token`.
    pub fn cm_sidr_request(
        &self,
        to: IpAddr,
        service_id: u64,
        private_data: &[u8],
        channel: &CmChannel,
        token: u64,
    ) -> Result<CmId> {
        let route = channel.route(token);
        self.engine.call(move |st| -> Result<CmId> {
            let now = st.now();
            let id = st.nic.cm_call(now, |cm, now| {
                cm.sidr_request(now, to, service_id, private_data)
            })?;
            st.cm_routes.conns.insert(id, route);
            Ok(id)
        })?
    }

    /// Answer SIDR request `id` ([`rnic_core::cm::sidr_status`]): the UD
    /// QP `qpn` with `qkey`, or a refusal.
    pub fn cm_sidr_reply(
        &self,
        id: CmId,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<()> {
        self.cm_do(id, |cm, _| {
            cm.sidr_reply(id, status, qpn, qkey, private_data)
        })
    }

    /// Refuse the request of connection `id` (a REJ with `reason` and
    /// `private_data`).
    pub fn cm_reject(&self, id: CmId, reason: u16, private_data: &[u8]) -> Result<()> {
        self.cm_do(id, |cm, _| cm.reject(id, reason, private_data))
    }

    /// Active side: the QP is ready; send the RTU.
    pub fn cm_ready(&self, id: CmId) -> Result<()> {
        self.cm_do(id, |cm, _| cm.ready(id))
    }

    /// Passive side: the connection's QP took a packet before the RTU came
    /// (`IBV_EVENT_COMM_EST`): it is established.
    pub fn cm_established(&self, id: CmId) -> Result<()> {
        self.cm_do(id, |cm, _| cm.established(id))
    }

    /// Send a DREQ; [`CmEvent::Disconnected`] follows.
    pub fn cm_disconnect(&self, id: CmId) -> Result<()> {
        self.cm_do(id, |cm, now| cm.disconnect(now, id))
    }

    /// Send connection `id`'s events to `channel` with `token` from now on
    /// (rdma_cm's `rdma_migrate_id`).
    pub fn cm_reroute(&self, id: CmId, channel: &CmChannel, token: u64) -> Result<()> {
        let route = channel.route(token);
        self.engine.call(move |st| {
            st.cm_routes.conns.insert(id, route);
        })?;
        Ok(())
    }

    /// The program is done with connection `id` (rdma_cm's
    /// `rdma_destroy_id`): nobody waits for its events any more, and the
    /// peer is told what the kernel's CM would tell it (a DREQ for a
    /// connection still up, a REJ for one being made: see
    /// [`rnic_core::cm::CmAgent::destroy`]).
    pub fn cm_release(&self, id: CmId) -> Result<()> {
        self.engine.call(move |st| {
            st.cm_routes.conns.remove(&id);
            let now = st.now();
            st.nic.cm_call(now, |cm, now| cm.destroy(now, id));
        })?;
        Ok(())
    }

    fn cm_do(
        &self,
        _id: CmId,
        f: impl FnOnce(
            &mut rnic_core::cm::CmAgent,
            rnic_core::time::Time,
        ) -> std::result::Result<(), CmError>,
    ) -> Result<()> {
        self.engine.call(move |st| -> Result<()> {
            let now = st.now();
            Ok(st.nic.cm_call(now, f)?)
        })?
    }

    /// Send now what waits for the program's answer (the ACKs of requests
    /// it has shown it answers, see the engine's `hold`): a program that
    /// turns to the CM (to resolve an address, say) is not about to answer
    /// on a QP, and a peer may be waiting for those ACKs to go on, to
    /// listen for the connection this program is about to make.
    pub fn send_held(&self) -> Result<()> {
        // Every call sends what is held once it has run.
        self.engine.call(|_| ())?;
        Ok(())
    }

    /// What QP 1 has counted.
    pub fn gsi_counters(&self) -> Result<rnic_core::nic::GsiCounters> {
        Ok(self.engine.call(|st| st.nic.gsi_counters())?)
    }

    /// How many connections the NIC's connection manager holds, in any
    /// state (timewait included): what a peer that never finished a
    /// connection, or a hostile one, left behind.
    pub fn cm_connections(&self) -> Result<usize> {
        Ok(self.engine.call(|st| st.nic.cm().connections())?)
    }
}

/// The local ACK timeout exponent of a connection rdma_cm makes over RoCE,
/// which both sides' QPs take: the kernel's packet lifetime (18) plus one,
/// as every REQ of the reference captures carries.
pub const ACK_TIMEOUT: u8 = 19;

/// The verbs code of `mtu` (`IBV_MTU_256` = 1, ... `IBV_MTU_4096` = 5), as a
/// REQ carries it.
pub fn mtu_code(mtu: Mtu) -> u8 {
    (mtu.bytes().trailing_zeros() - 7) as u8
}

/// The GID of `addr` as the CM's paths carry it (IPv4-mapped for IPv4).
fn gid(addr: IpAddr) -> std::net::Ipv6Addr {
    crate::gid_of(addr)
}

/// What the active side of an rdma_cm connection asks for: the REQ for QP
/// `qpn` (receiving first PSN `psn`), from rdma_cm port `local` to `remote` in port
/// space `ps`, with the rdma_cm header in front of `private_data`. The
/// path's flow label is the one the kernel derives from the two ports, so
/// the data path's UDP source port is the kernel's too.
#[allow(clippy::too_many_arguments)]
pub fn request(
    ps: PortSpace,
    local: SocketAddr,
    remote: SocketAddr,
    qpn: u32,
    psn: u32,
    mtu: Mtu,
    responder_resources: u8,
    initiator_depth: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    private_data: &[u8],
) -> Result<ConnectParams> {
    if private_data.len() > private_len::REQ - CMA_HEADER_LEN {
        return Err(CmError::PrivateDataTooLong(private_data.len()).into());
    }
    let mut data = vec![0u8; CMA_HEADER_LEN + private_data.len()];
    CmaHeader {
        version: 0,
        src_port: local.port(),
        src: local.ip(),
        dst: remote.ip(),
    }
    .emit(&mut data);
    data[CMA_HEADER_LEN..].copy_from_slice(private_data);
    Ok(ConnectParams {
        service_id: rnic_wire::cm::service_id(ps, remote.port()),
        qpn,
        starting_psn: psn & 0xFF_FFFF,
        responder_resources,
        initiator_depth,
        retry_count: retry_count.min(7),
        rnr_retry_count: rnr_retry_count.min(7),
        path_mtu: mtu_code(mtu),
        path: Path {
            local_lid: 0xFFFF,
            remote_lid: 0xFFFF,
            local_gid: gid(local.ip()),
            remote_gid: gid(remote.ip()),
            flow_label: rdma_cm_flow_label(local.port(), remote.port()),
            hop_limit: 64,
            local_ack_timeout: ACK_TIMEOUT,
            ..Path::NONE
        },
        transport: 0,
        private_data: data,
    })
}

/// How a connection's QP is set up, once REQ and REP have been exchanged:
/// what rdma_cm's `rdma_init_qp_attr` hands out for INIT, RTR and RTS,
/// from the kernel's `cm_init_qp_*_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpSetup {
    /// The address vector: the peer, this side's address, the REQ's flow
    /// label.
    pub av: AddressVector,
    /// The peer's QP.
    pub dest_qp: u32,
    /// The first PSN this side receives (its own Starting PSN).
    pub rq_psn: u32,
    /// The first PSN this side sends (the peer's Starting PSN).
    pub sq_psn: u32,
    /// The path MTU.
    pub mtu: Mtu,
    /// READs and atomics this side answers at once.
    pub responder_resources: u8,
    /// READs and atomics this side sends at once.
    pub initiator_depth: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// The local ACK timeout exponent.
    pub timeout: u8,
}

impl QpSetup {
    /// The passive side's, for a REQ from `from` taken at `local`, answered
    /// with `accept`, on a port whose MTU is `port_mtu`.
    pub fn passive(
        req: &Req,
        from: IpAddr,
        local: IpAddr,
        accept: &AcceptParams,
        port_mtu: Mtu,
    ) -> QpSetup {
        let mtu = Mtu::from_ibv(u32::from(req.path_mtu)).map_or(port_mtu, |m| m.min(port_mtu));
        QpSetup {
            av: AddressVector {
                dest: from,
                src: Some(local),
                traffic_class: req.primary.traffic_class,
                hop_limit: req.primary.hop_limit.max(1),
                flow_label: req.primary.flow_label,
            },
            dest_qp: req.local_qpn,
            // Each side's Starting PSN is the one it receives first: the
            // REQ's is this side's first, the REP's the peer's (the
            // kernel's ib_cm, rdma_rxe's and ConnectX's traffic alike).
            rq_psn: accept.starting_psn,
            sq_psn: req.starting_psn,
            mtu,
            responder_resources: accept.responder_resources,
            initiator_depth: accept.initiator_depth,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            timeout: req.primary.local_ack_timeout,
        }
    }

    /// The active side's, for its REQ `req` to `to` from `local`, answered
    /// by `rep`.
    pub fn active(req: &ConnectParams, rep: &Rep, local: IpAddr, to: IpAddr) -> QpSetup {
        QpSetup {
            av: AddressVector {
                dest: to,
                src: Some(local),
                traffic_class: req.path.traffic_class,
                hop_limit: req.path.hop_limit.max(1),
                flow_label: req.path.flow_label,
            },
            dest_qp: rep.local_qpn,
            // The REQ offered what this side receives first; the REP,
            // what the peer does (see `passive`).
            rq_psn: req.starting_psn,
            sq_psn: rep.starting_psn,
            mtu: Mtu::from_ibv(u32::from(req.path_mtu)).unwrap_or(Mtu::Mtu1024),
            // What the peer sends at once is what this side answers.
            responder_resources: rep.initiator_depth,
            initiator_depth: rep.responder_resources,
            retry_count: req.retry_count,
            rnr_retry_count: rep.rnr_retry_count,
            timeout: req.path.local_ack_timeout,
        }
    }

    /// INIT: the remote rights a connection gets (WRITE; READ and atomics
    /// too if it answers any).
    pub fn init_attr(&self) -> (QpAttr, AttrMask) {
        let mut access = Access::REMOTE_WRITE;
        if self.responder_resources > 0 {
            access = access | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        }
        let attr = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: access,
            pkey_index: 0,
            port_num: 1,
            ..QpAttr::default()
        };
        let mask = AttrMask::STATE | AttrMask::ACCESS_FLAGS | AttrMask::PKEY_INDEX | AttrMask::PORT;
        (attr, mask)
    }

    /// RTR. The RNR timer is 0 (655 ms) as the kernel's CM sets it.
    pub fn rtr_attr(&self) -> (QpAttr, AttrMask) {
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: Some(self.av),
            dest_qp_num: self.dest_qp,
            rq_psn: self.rq_psn,
            path_mtu: self.mtu,
            max_dest_rd_atomic: self.responder_resources,
            min_rnr_timer: 0,
            ..QpAttr::default()
        };
        let mask = AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER;
        (attr, mask)
    }

    /// RTS.
    pub fn rts_attr(&self) -> (QpAttr, AttrMask) {
        let attr = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: self.sq_psn,
            timeout: self.timeout,
            retry_cnt: self.retry_count,
            rnr_retry: self.rnr_retry_count,
            max_rd_atomic: self.initiator_depth,
            ..QpAttr::default()
        };
        let mask = AttrMask::STATE
            | AttrMask::SQ_PSN
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC;
        (attr, mask)
    }

    /// Take `qp` from wherever it is (RESET or INIT) through RTR to RTS.
    pub fn apply(&self, qp: &QueuePair) -> Result<()> {
        if qp.state()? == QpState::Reset {
            let (a, m) = self.init_attr();
            qp.modify(&a, m)?;
        }
        let (a, m) = self.rtr_attr();
        qp.modify(&a, m)?;
        let (a, m) = self.rts_attr();
        qp.modify(&a, m)
    }
}

/// A port of an rdma_cm port space on some addresses, held while the
/// value lives: per address, the name of an abstract Unix socket, which
/// belongs to the network namespace as the address does and which the
/// kernel frees however the holder ends. An id bound to the wildcard
/// address holds the port on every address of its NICs (the only ones it
/// listens on), so two ids conflict exactly when they want one port of
/// one address, whichever processes they are in.
#[derive(Debug)]
pub struct PortClaim {
    _sockets: Vec<std::os::unix::net::UnixDatagram>,
    /// The port.
    pub port: u16,
}

fn claim_name(ps: PortSpace, port: u16, addr: IpAddr) -> String {
    format!("rnic/cm/{:04x}/{port}/{addr}", ps.number())
}

/// The ports the kernel hands out when a program asks for none
/// (`ip_local_port_range`'s default).
const EPHEMERAL: std::ops::RangeInclusive<u16> = 32768..=60999;

impl PortClaim {
    /// Claim `port` (0: a free one from the ephemeral range) of `ps` on
    /// every address of `addrs`, among every process of the host:
    /// `AddrInUse` if another id holds it on one of them.
    pub fn claim(ps: PortSpace, addrs: &[IpAddr], port: u16) -> Result<PortClaim> {
        if port != 0 {
            return Ok(Self::claim_exact(ps, addrs, port)?);
        }
        let span = EPHEMERAL.end() - EPHEMERAL.start() + 1;
        // Start somewhere of the process's own, so that processes starting
        // together rarely try the same ports.
        let mut b = [0u8; 2];
        let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
        let start = u16::from_ne_bytes(b) % span;
        for k in 0..span {
            let p = EPHEMERAL.start() + (start.wrapping_add(k) % span);
            match Self::claim_exact(ps, addrs, p) {
                Ok(c) => return Ok(c),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Io(io::Error::new(
            io::ErrorKind::AddrInUse,
            "no free rdma_cm port",
        )))
    }

    fn claim_exact(ps: PortSpace, addrs: &[IpAddr], port: u16) -> io::Result<PortClaim> {
        let sockets = addrs
            .iter()
            .map(|&a| {
                crate::engine::bind_abstract(&claim_name(ps, port, a)).map_err(|e| {
                    if e.kind() == io::ErrorKind::AddrInUse {
                        io::Error::new(
                            io::ErrorKind::AddrInUse,
                            format!("rdma_cm port {port} of {a} is bound already"),
                        )
                    } else {
                        e
                    }
                })
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(PortClaim {
            _sockets: sockets,
            port,
        })
    }
}

/// A listener on an rdma_cm port of the TCP port space (RC connections),
/// for a Rust program: [`Device::listen`].
#[derive(Debug)]
pub struct Listener {
    dev: Device,
    service_id: u64,
    channel: CmChannel,
    _claim: PortClaim,
}

/// A connection request a [`Listener`] took: accept it with a QP, or
/// reject it.
#[derive(Debug)]
pub struct Incoming {
    dev: Device,
    id: CmId,
    from: IpAddr,
    req: Box<Req>,
    header: Option<CmaHeader>,
    /// Accepted or rejected: the ID is no longer this request's to drop.
    answered: bool,
}

/// An RC connection made through the CM. Its QP is the caller's. Dropping
/// it is rdma_cm's `rdma_destroy_id`: a connection still up is closed with a
/// DREQ, without waiting for the answer (see [`Connection::disconnect`]).
#[derive(Debug)]
pub struct Connection {
    dev: Device,
    id: CmId,
    channel: CmChannel,
    private_data: Vec<u8>,
    _claim: Option<PortClaim>,
}

impl Device {
    /// Listen on rdma_cm port `port` (TCP port space) at this NIC's
    /// address, as `rdma_bind_addr` and `rdma_listen` do: `AddrInUse` if
    /// an id of any process holds the port.
    pub fn listen(&self, port: u16) -> Result<Listener> {
        let claim = PortClaim::claim(PortSpace::Tcp, self.gids(), port)?;
        let service_id = rnic_wire::cm::service_id(PortSpace::Tcp, claim.port);
        let channel = CmChannel::new()?;
        self.cm_listen(service_id, rnic_core::cm::DEFAULT_BACKLOG, &channel, 0)?;
        Ok(Listener {
            dev: self.clone(),
            service_id,
            channel,
            _claim: claim,
        })
    }

    /// Connect RC QP `qp` (in RESET or INIT) to the listener at `to`,
    /// handing it `private_data` (at most 56 bytes, after rdma_cm's
    /// header): REQ, REP, the QP to RTS, RTU. Waits up to `timeout` for
    /// the answer; a refusal is `ConnectionRefused`, with the reason.
    pub fn connect(
        &self,
        qp: &QueuePair,
        to: SocketAddr,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<Connection> {
        let local_ip = qp.src.unwrap_or_else(|| self.addr());
        let claim = PortClaim::claim(PortSpace::Tcp, &[local_ip], 0)?;
        let mtu = self.query_port().active_mtu;
        let params = request(
            PortSpace::Tcp,
            SocketAddr::new(local_ip, claim.port),
            to,
            qp.qpn(),
            qp.sq_psn,
            mtu,
            DEFAULT_RD_ATOMIC,
            DEFAULT_RD_ATOMIC,
            7,
            7,
            private_data,
        )?;
        let channel = CmChannel::new()?;
        let id = self.cm_connect(to.ip(), &params, &channel, 0)?;
        let refused = |what: String| {
            Err(Error::Io(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                what,
            )))
        };
        match channel.next(Some(timeout)) {
            Ok(CmNotice {
                what: Notice::Cm(CmEvent::Reply { rep, .. }),
                ..
            }) => {
                let setup = QpSetup::active(&params, &rep, local_ip, to.ip());
                if let Err(e) = setup.apply(qp) {
                    let _ = self.cm_reject(id, rnic_wire::cm::reason::CONSUMER_DEFINED, &[]);
                    let _ = self.cm_release(id);
                    return Err(e);
                }
                self.cm_ready(id)?;
                Ok(Connection {
                    dev: self.clone(),
                    id,
                    channel,
                    private_data: rep.private_data.to_vec(),
                    _claim: Some(claim),
                })
            }
            Ok(CmNotice {
                what: Notice::Cm(CmEvent::Rejected { reason, .. }),
                ..
            }) => {
                let _ = self.cm_release(id);
                refused(format!("{to} refused the connection (REJ reason {reason})"))
            }
            Ok(CmNotice { what, .. }) => {
                let _ = self.cm_release(id);
                refused(format!("{to}: {what:?}"))
            }
            Err(e) => {
                let _ = self.cm_release(id);
                Err(e)
            }
        }
    }
}

/// The READs and atomics each side of a [`Device::connect`] sends and
/// answers at once.
pub const DEFAULT_RD_ATOMIC: u8 = 16;

impl Listener {
    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self._claim.port
    }

    /// The next connection request, waiting up to `timeout`.
    pub fn next(&self, timeout: Duration) -> Result<Incoming> {
        loop {
            let n = self.channel.next(Some(timeout))?;
            if let Notice::Cm(CmEvent::Request { id, from, req }) = n.what {
                let header = CmaHeader::parse(&req.private_data);
                return Ok(Incoming {
                    dev: self.dev.clone(),
                    id,
                    from,
                    req,
                    header,
                    answered: false,
                });
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.dev.cm_unlisten(self.service_id);
    }
}

impl Incoming {
    /// Where the request came from: the peer's address and rdma_cm port.
    pub fn peer(&self) -> SocketAddr {
        SocketAddr::new(self.from, self.header.map_or(0, |h| h.src_port))
    }

    /// The peer's private data (after rdma_cm's header).
    pub fn private_data(&self) -> &[u8] {
        let skip = if self.header.is_some() {
            CMA_HEADER_LEN
        } else {
            0
        };
        &self.req.private_data[skip..]
    }

    /// Accept with RC QP `qp` (in RESET or INIT), answering
    /// `private_data`: the QP to RTS, the REP, then a wait of up to
    /// `timeout` for the RTU.
    pub fn accept(
        mut self,
        qp: &QueuePair,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<Connection> {
        let local = qp.src.unwrap_or_else(|| self.dev.addr());
        let rr = self.req.initiator_depth.min(DEFAULT_RD_ATOMIC);
        let params = AcceptParams {
            qpn: qp.qpn(),
            starting_psn: qp.sq_psn & 0xFF_FFFF,
            responder_resources: rr,
            initiator_depth: self.req.responder_resources.min(DEFAULT_RD_ATOMIC),
            rnr_retry_count: 7,
            private_data: private_data.to_vec(),
        };
        let mtu = self.dev.query_port().active_mtu;
        let setup = QpSetup::passive(&self.req, self.from, local, &params, mtu);
        if let Err(e) = setup.apply(qp) {
            let _ = self
                .dev
                .cm_reject(self.id, rnic_wire::cm::reason::CONSUMER_DEFINED, &[]);
            return Err(e);
        }
        let channel = CmChannel::new()?;
        self.dev.cm_accept(self.id, &params, &channel, 0)?;
        // The connection's now: dropped, it closes as a connection.
        self.answered = true;
        let conn = Connection {
            dev: self.dev.clone(),
            id: self.id,
            channel,
            private_data: self.private_data().to_vec(),
            _claim: None,
        };
        match conn.channel.next(Some(timeout))?.what {
            Notice::Cm(CmEvent::Established { .. }) => Ok(conn),
            e => Err(Error::Io(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!("{}: {e:?}", self.from),
            ))),
        }
    }

    /// Refuse the request (REJ reason 28, the consumer's), with
    /// `private_data` for the peer.
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        self.dev.cm_reject(
            self.id,
            rnic_wire::cm::reason::CONSUMER_DEFINED,
            private_data,
        )
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let _ = self.dev.cm_release(self.id);
    }
}

impl Drop for Incoming {
    /// A request dropped unanswered is refused (REJ 28), as the kernel's CM
    /// refuses one whose ID is destroyed.
    fn drop(&mut self) {
        if !self.answered {
            let _ = self.dev.cm_release(self.id);
        }
    }
}

impl Connection {
    /// The private data the peer sent (its REQ's after rdma_cm's header,
    /// or its REP's).
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// Disconnect (a DREQ, or the DREP to the peer's) and wait up to
    /// `timeout` for the connection to close.
    pub fn disconnect(self, timeout: Duration) -> Result<()> {
        let deadline = std::time::Instant::now() + timeout;
        self.dev.cm_disconnect(self.id)?;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.channel.next(Some(left)) {
                Ok(CmNotice {
                    what: Notice::Cm(CmEvent::Disconnected { .. }),
                    ..
                }) => break Ok(()),
                Ok(_) => continue,
                Err(e) => break Err(e),
            }
        }
    }

    /// Wait up to `timeout` for the peer to disconnect (its DREQ, which
    /// the CM answers), as a server does at the end.
    pub fn wait_disconnect(self, timeout: Duration) -> Result<()> {
        loop {
            match self.channel.next(Some(timeout)) {
                Ok(CmNotice {
                    what:
                        Notice::Cm(CmEvent::DisconnectRequest { .. } | CmEvent::Disconnected { .. }),
                    ..
                }) => break Ok(()),
                Ok(_) => continue,
                Err(e) => break Err(e),
            }
        }
    }
}
