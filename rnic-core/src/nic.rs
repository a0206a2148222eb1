//! One NIC: its memory, queue pairs and completion queues, and the sans-I/O
//! surface the driver and the simulator use. Feed it what happened
//! ([`Nic::handle_datagram`], [`Nic::post_send`], [`Nic::handle_timeout`], each
//! with the time); take what it wants done ([`Nic::poll_transmit`],
//! [`Nic::poll_cq`], [`Nic::next_deadline`]).

use core::fmt;
use core::net::IpAddr;
use std::collections::VecDeque;

use rnic_wire::encap::{Frame, LinkType};
use rnic_wire::{icrc, IbPacket, Psn};

use crate::counters::{Counters, Footprint};
use crate::cq::{Cq, CqHandle, CqTable};
use crate::datagram::{Arrival, Datagram, Header};
use crate::device::{DEVICE_ATTR, QPNS};
use crate::error::VerbError;
use crate::mem::{Access, Memory, MrKeys, PdHandle, Region};
use crate::pool::BufferPool;
use crate::qp::{self, AddressVector, AttrMask, Limits, ModifyError, QpAttr, QpState, QpType};
use crate::rc::{sg_len, Ctx, Execution, Mechanisms, Qp, QpCaps, SendWqe, Timers};
use crate::rng::{Ids, SecretRng};
use crate::srq::{AsyncEvent, Srq, SrqHandle};
use crate::table::{free_slot, IdMap};
use crate::time::Time;
use crate::wr::{Completion, RecvWr, SendOp, SendWr, Sge, UdDest};

/// Take QP `qp`'s unpolled completions out of its CQs, as mlx5 cleans its
/// CQs when a QP is reset or destroyed (mlx5_cq_clean).
fn remove_completions(cqs: &mut CqTable, qp: &Qp) {
    for h in [qp.send_cq, qp.recv_cq] {
        if let Some(q) = cqs.get_mut(h) {
            q.remove_qp(qp.qpn);
        }
    }
}

/// No more scatter/gather entries than the queue takes.
fn check_sges(sg_list: &[Sge], max: u32) -> Result<(), VerbError> {
    if sg_list.len() > max as usize {
        return Err(VerbError::TooManySge {
            given: sg_list.len(),
            max,
        });
    }
    Ok(())
}

/// Inline data only on SEND and WRITE, and no more than the device takes.
fn check_inline(wr: &SendWr) -> Result<(), VerbError> {
    match &wr.inline {
        Some(data)
            if !wr.op.takes_inline() || data.len() > DEVICE_ATTR.max_inline_data as usize =>
        {
            Err(VerbError::BadInline { len: data.len() })
        }
        _ => Ok(()),
    }
}

/// READ response packets one QP generates before the next busy QP's turn.
pub const RESPONSE_BURST: usize = 16;

/// Whether a packet's P_Key matches the QP's (IBTA 10.9.3): the same
/// partition (low 15 bits, not 0) and at least one of them a full member.
fn pkey_matches(packet: u16, qp: u16) -> bool {
    let (a, b) = (packet & 0x7FFF, qp & 0x7FFF);
    a != 0 && a == b && (packet | qp) & 0x8000 != 0
}

/// Queue pairs by number. QP numbers are drawn at random ([`Ids`]), so
/// they are found through a map; the hash spreads a number's bits over
/// the whole word (hashbrown reads its top bits).
#[derive(Default)]
pub(crate) struct QpTable(IdMap<Qp>);

impl QpTable {
    fn get(&self, qpn: u32) -> Option<&Qp> {
        self.0.get(&qpn)
    }
    fn get_mut(&mut self, qpn: u32) -> Option<&mut Qp> {
        self.0.get_mut(&qpn)
    }
    fn insert(&mut self, qp: Qp) {
        self.0.insert(qp.qpn, qp);
    }
    fn remove(&mut self, qpn: u32) -> Option<Qp> {
        self.0.remove(&qpn)
    }
    fn iter_mut(&mut self) -> impl Iterator<Item = &mut Qp> {
        self.0.values_mut()
    }
    fn iter(&self) -> impl Iterator<Item = &Qp> {
        self.0.values()
    }
}

/// A software RoCE v2 NIC.
pub struct Nic {
    /// The NIC's addresses (its GIDs), the first its own by default: it
    /// takes packets sent to any of them.
    addrs: Vec<IpAddr>,
    mem: Memory,
    cqs: CqTable,
    qps: QpTable,
    qpns: Ids,
    tx: crate::txq::TxQueue,
    /// Packet buffers handed back after sending ([`Nic::recycle`]), reused
    /// for the next packets: a steady flow allocates nothing.
    pool: BufferPool,
    counters: Counters,
    limits: Limits,
    exec_log: Option<Vec<Execution>>,
    mechanisms: Mechanisms,
    src_port: Option<u16>,
    srqs: Vec<Option<Srq>>,
    events: VecDeque<AsyncEvent>,
    busy: VecDeque<u32>,
    overrun_cqs: Vec<CqHandle>,
    /// Every QP's deadlines ([`Timers`]).
    timers: Timers,
    /// The latest time an event brought.
    now: Time,
    /// Packets every QP together has unacknowledged ([`Ctx::inflight`]).
    inflight: u32,
    /// QPs waiting for room in the NIC's budget ([`Ctx::starved`]).
    starved: VecDeque<u32>,
    /// The ICRC deltas of GSO segments for the last IB length that needed
    /// them ([`icrc::udp_ident`]).
    gso_deltas: Option<icrc::IdDeltas>,
}

impl fmt::Debug for Nic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nic")
            .field("addrs", &self.addrs)
            .field("qps", &self.qps.iter().count())
            .field("counters", &self.counters)
            .finish()
    }
}

impl Nic {
    /// A NIC with IP address `addr` (its RoCE v2 GID) whose QP numbers and
    /// keys follow from `seed`: reproducible, for simulation. A NIC on a
    /// network takes [`Nic::with_secret`] and a seed from the system.
    pub fn new(addr: IpAddr, seed: u64) -> Nic {
        Nic::with_secret(addr, SecretRng::from_u64(seed))
    }

    /// A NIC with IP address `addr` whose QP numbers and the index part of
    /// its keys are drawn from `secret`: seeded from the operating system,
    /// a peer cannot predict them.
    pub fn with_secret(addr: IpAddr, mut secret: SecretRng) -> Nic {
        let mem_secret = secret.split();
        Nic {
            addrs: vec![addr],
            mem: Memory::with_secret(mem_secret),
            cqs: CqTable::default(),
            qps: QpTable::default(),
            qpns: Ids::new(secret, QPNS.0, QPNS.1),
            tx: crate::txq::TxQueue::default(),
            pool: BufferPool::default(),
            counters: Counters::default(),
            limits: Limits {
                max_qp_init_rd_atom: DEVICE_ATTR.max_qp_init_rd_atom,
                max_qp_rd_atom: DEVICE_ATTR.max_qp_rd_atom,
            },
            exec_log: None,
            mechanisms: Mechanisms::default(),
            src_port: None,
            srqs: Vec::new(),
            events: VecDeque::new(),
            busy: VecDeque::new(),
            inflight: 0,
            starved: VecDeque::new(),
            overrun_cqs: Vec::new(),
            timers: Timers::new(),
            now: Time::ZERO,
            gso_deltas: None,
        }
    }

    /// The UDP source port packets leave from. `None` (the default): a port per
    /// QP pair from their numbers, as rdma_rxe chooses it (flow entropy for
    /// ECMP). A transport that sends every packet from one socket sets that
    /// socket's port, because the ICRC covers the UDP source port.
    pub fn set_udp_source_port(&mut self, port: Option<u16>) {
        self.src_port = port;
    }

    /// The QPs, and what a QP needs from the rest of the NIC to handle an event.
    fn parts(&mut self, now: Time) -> (&mut QpTable, Ctx<'_>) {
        let Nic {
            qps,
            mem,
            cqs,
            tx,
            counters,
            exec_log,
            addrs,
            mechanisms,
            src_port,
            srqs,
            events,
            busy,
            overrun_cqs,
            pool,
            timers,
            now: latest,
            inflight,
            starved,
            ..
        } = self;
        *latest = now.max(*latest);
        let ctx = Ctx {
            now,
            addrs,
            mem,
            cqs,
            tx,
            counters,
            exec_log,
            mechanisms: *mechanisms,
            src_port: *src_port,
            srqs,
            events,
            busy,
            overrun_cqs,
            pool,
            timers,
            inflight,
            starved,
        };
        (qps, ctx)
    }

    /// Run a verb or an event, then [`Nic::settle`]: what it overran takes
    /// effect before the caller sees the NIC again.
    fn settled<R>(&mut self, event: impl FnOnce(&mut Nic) -> R) -> R {
        let r = event(self);
        self.settle();
        r
    }

    /// After an event: every QP that completes into a CQ that overran goes
    /// to the error state (IBV_EVENT_QP_FATAL); flushing it may overrun
    /// more, which are handled in turn.
    fn settle(&mut self) {
        self.drop_stale_timers();
        let now = self.now;
        while let Some(cq) = self.overrun_cqs.pop() {
            let (qps, mut ctx) = self.parts(now);
            for qp in qps.iter_mut() {
                let bound = qp.send_cq == cq || qp.recv_cq == cq;
                if bound && !matches!(qp.state(), QpState::Err | QpState::Reset) {
                    ctx.events.push_back(AsyncEvent::QpFatal(qp.qpn));
                    qp.enter_error(&mut ctx);
                }
            }
        }
        self.serve_starved();
        debug_assert_eq!(
            self.inflight,
            self.qps.iter().map(|q| q.counted).sum::<u32>(),
            "the NIC's in-flight count is the sum of its QPs'"
        );
        debug_assert!(
            self.qps
                .iter()
                .all(|q| q.counted == 0 || matches!(q.state(), QpState::Rts | QpState::Sqd)),
            "a QP that cannot send holds none of the NIC's budget"
        );
    }

    /// Let QPs the NIC's budget held back go on, in turn, while there is
    /// room (each once per event: one that fills the room again waits for
    /// the next).
    fn serve_starved(&mut self) {
        let now = self.now;
        for _ in 0..self.starved.len() {
            if self.inflight >= crate::rc::NIC_INFLIGHT_PKTS {
                break;
            }
            let Some(qpn) = self.starved.pop_front() else {
                break;
            };
            let (qps, mut ctx) = self.parts(now);
            if let Some(qp) = qps.get_mut(qpn) {
                qp.starved = false;
                qp.req_poll(&mut ctx);
            }
        }
    }

    /// Take a QP from RESET to RTS with the three `ibv_modify_qp` calls of
    /// rdma-core's pingpong programs, the values from `attr`. RC
    /// (`ibv_rc_pingpong`): INIT with P_Key index, port and access flags; RTR
    /// with address vector, path MTU, destination QP, receive PSN,
    /// max_dest_rd_atomic and min_rnr_timer; RTS with send PSN, timeout,
    /// retry_cnt, rnr_retry and max_rd_atomic. UC (`ibv_uc_pingpong`): the same
    /// without the RC-only attributes. UD (`ibv_ud_pingpong`): INIT with P_Key
    /// index, port and Q_Key; RTR with nothing; RTS with the send PSN.
    pub fn to_rts(&mut self, now: Time, qpn: u32, attr: &QpAttr) -> Result<(), VerbError> {
        use AttrMask as M;
        let t = self.qps.get(qpn).ok_or(VerbError::NoSuchQp(qpn))?.qp_type;
        let steps = match t {
            QpType::Rc => [
                (QpState::Init, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
                (
                    QpState::Rtr,
                    M::AV
                        | M::PATH_MTU
                        | M::DEST_QPN
                        | M::RQ_PSN
                        | M::MAX_DEST_RD_ATOMIC
                        | M::MIN_RNR_TIMER,
                ),
                (
                    QpState::Rts,
                    M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
                ),
            ],
            QpType::Uc => [
                (QpState::Init, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
                (QpState::Rtr, M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN),
                (QpState::Rts, M::SQ_PSN),
            ],
            QpType::Ud => [
                (QpState::Init, M::PKEY_INDEX | M::PORT | M::QKEY),
                (QpState::Rtr, M::EMPTY),
                (QpState::Rts, M::SQ_PSN),
            ],
        };
        for (state, mask) in steps {
            let a = QpAttr {
                qp_state: state,
                ..*attr
            };
            self.modify_qp(now, qpn, &a, M::STATE | mask)?;
        }
        Ok(())
    }

    /// Switch transport mechanisms on or off (see [`Mechanisms`]).
    pub fn set_mechanisms(&mut self, m: Mechanisms) {
        self.mechanisms = m;
    }

    /// Hand out only QP numbers whose top `bits` bits are `slot`: the
    /// NIC's share of the QP number space when several NICs (processes)
    /// share one address and the packets for each are told apart by their
    /// destination QP. The rest of each number stays random. Only before
    /// the first QP; an error (and no change) after it, or for a slot that
    /// does not fit in `bits` (at most 8).
    pub fn restrict_qpns(&mut self, slot: u32, bits: u32) -> Result<(), VerbError> {
        if self.qps.iter().next().is_some() || bits > 8 || slot >> bits != 0 {
            return Err(VerbError::Unsupported(
                "a QP number slot is set before the first QP, in at most 8 bits",
            ));
        }
        let shift = 24 - bits;
        let lo = (slot << shift).max(QPNS.0);
        let hi = (((slot + 1) << shift) - 1).min(QPNS.1);
        self.qpns.set_range(lo, hi);
        Ok(())
    }

    /// The NIC's own address: the first of [`Nic::addrs`].
    pub fn addr(&self) -> IpAddr {
        self.addrs[0]
    }

    /// Every address the NIC answers at, as a RoCE port's GID table lists
    /// an interface's addresses.
    pub fn addrs(&self) -> &[IpAddr] {
        &self.addrs
    }

    /// Answer at `addr` too (a no-op if the NIC already does).
    pub fn add_addr(&mut self, addr: IpAddr) {
        if !self.addrs.contains(&addr) {
            self.addrs.push(addr);
        }
    }

    /// The address to reach `dest` from: the first of the NIC's addresses
    /// of its family, and a link-local IPv6 address for a link-local peer,
    /// one that is not for any other (as the kernel's source address
    /// selection would pick); any of the family if that is all there is.
    /// `None` if the NIC has no address of that family.
    pub fn source_for(&self, dest: IpAddr) -> Option<IpAddr> {
        qp::source_for(&self.addrs, dest)
    }

    /// `av` with its source address checked (one of the NIC's, of the
    /// peer's family) or chosen ([`Nic::source_for`]).
    fn resolve_source(&self, mut av: AddressVector) -> Result<AddressVector, ModifyError> {
        let src = match av.src {
            Some(s) if self.addrs.contains(&s) && s.is_ipv4() == av.dest.is_ipv4() => s,
            Some(_) => {
                return Err(ModifyError::InvalidValue {
                    attr: AttrMask::AV,
                    value: 0,
                    rule: "the source GID must be one of the NIC's, of the destination's family",
                })
            }
            None => self.source_for(av.dest).ok_or(ModifyError::InvalidValue {
                attr: AttrMask::AV,
                value: 0,
                rule: "the NIC has no address of the destination's family",
            })?,
        };
        av.src = Some(src);
        Ok(av)
    }

    /// The counters.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Record every request the responder executes (for the simulator's checks).
    pub fn record_executions(&mut self) {
        self.exec_log.get_or_insert_with(Vec::new);
    }

    /// The executions recorded.
    pub fn executions(&self) -> &[Execution] {
        self.exec_log.as_deref().unwrap_or(&[])
    }

    /// The UDP source port of QP `qpn`'s packets, which the ICRC covers: the
    /// driver must send them from exactly this port. Overrides
    /// [`Nic::set_udp_source_port`] for this QP.
    pub fn set_qp_source_port(&mut self, qpn: u32, port: u16) -> Result<(), VerbError> {
        let qp = self.qps.get_mut(qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        qp.src_port = Some(port);
        Ok(())
    }

    /// Memory regions and protection domains.
    pub fn memory(&self) -> &Memory {
        &self.mem
    }

    /// Allocate a protection domain.
    pub fn alloc_pd(&mut self) -> PdHandle {
        self.mem.alloc_pd()
    }

    /// Count one more user of `pd` that is none of the NIC's own objects (a
    /// parent domain over it): `dealloc_pd` is refused until
    /// [`Nic::pd_release`].
    pub fn pd_acquire(&mut self, pd: PdHandle) -> Result<(), VerbError> {
        Ok(self.mem.pd_acquire(pd)?)
    }

    /// One user of `pd` fewer (see [`Nic::pd_acquire`]).
    pub fn pd_release(&mut self, pd: PdHandle) {
        self.mem.pd_release(pd);
    }

    /// Free a protection domain (`ibv_dealloc_pd`): refused while a region,
    /// window or queue pair is in it.
    pub fn dealloc_pd(&mut self, pd: PdHandle) -> Result<(), VerbError> {
        Ok(self.mem.dealloc_pd(pd)?)
    }

    /// The owner of `pd` is done with it: freed now, or with the last
    /// region, window or queue pair in it. Nothing new can be made in it.
    pub fn release_pd(&mut self, pd: PdHandle) -> Result<(), VerbError> {
        Ok(self.mem.release_pd(pd)?)
    }

    /// Register memory.
    pub fn reg_mr(
        &mut self,
        pd: PdHandle,
        iova: u64,
        region: Box<dyn Region>,
        access: Access,
    ) -> Result<MrKeys, VerbError> {
        Ok(self.mem.register(pd, iova, region, access)?)
    }

    /// Change a registered region in place (`ibv_rereg_mr`), keeping its
    /// keys: see [`Memory::reregister`](crate::mem::Memory::reregister).
    pub fn rereg_mr(
        &mut self,
        lkey: u32,
        pd: Option<PdHandle>,
        access: Option<Access>,
        translation: Option<(u64, Box<dyn Region>)>,
    ) -> Result<Option<Box<dyn Region>>, VerbError> {
        Ok(self.mem.reregister(lkey, pd, access, translation)?)
    }

    /// Deregister memory and take it back.
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<Box<dyn Region>, VerbError> {
        Ok(self.mem.deregister(lkey)?)
    }

    /// Allocate a type 2 memory window (`ibv_alloc_mw`); bind it with a
    /// [`SendOp::BindMw`] work request.
    pub fn alloc_mw(&mut self, pd: PdHandle) -> Result<u32, VerbError> {
        Ok(self.mem.alloc_mw(pd)?)
    }

    /// Allocate a memory window of type `kind` (`ibv_alloc_mw`).
    pub fn alloc_mw_of(
        &mut self,
        pd: PdHandle,
        kind: crate::mem::MwType,
    ) -> Result<u32, VerbError> {
        Ok(self.mem.alloc_mw_of(pd, kind)?)
    }

    /// Free a memory window (`ibv_dealloc_mw`), by its current R_Key.
    pub fn dealloc_mw(&mut self, rkey: u32) -> Result<(), VerbError> {
        Ok(self.mem.dealloc_mw(rkey)?)
    }

    /// Check that local key `lkey` of `pd` covers `len` bytes at `addr` with
    /// `access`, as a work request's SGE would be checked (`ibv_advise_mr`).
    pub fn check_local(
        &self,
        pd: PdHandle,
        lkey: u32,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(), VerbError> {
        self.mem.check(lkey, pd, addr, len, access)?;
        Ok(())
    }

    /// Read `len` bytes of a region through its local key (for tests and tools).
    pub fn read_mr(
        &self,
        pd: PdHandle,
        lkey: u32,
        addr: u64,
        out: &mut [u8],
    ) -> Result<(), VerbError> {
        let span = self
            .mem
            .check(lkey, pd, addr, out.len() as u64, Access::NONE)?;
        self.mem.read(span, out);
        Ok(())
    }

    /// Create a completion queue of `depth` entries (at most
    /// `DEVICE_ATTR.max_cqe`; more is clamped).
    pub fn create_cq(&mut self, depth: usize) -> CqHandle {
        let depth = depth.min(DEVICE_ATTR.max_cqe as usize);
        self.cqs.insert(Cq::new(depth))
    }

    /// What the NIC holds now ([`Footprint`]).
    pub fn footprint(&self) -> Footprint {
        let mem = self.mem.footprint();
        Footprint {
            qps: self.qps.iter().count(),
            cq_slots: self.cqs.capacity(),
            srq_slots: self.srqs.len(),
            resting_ids: mem.resting_ids + self.qpns.resting(),
            timers: self.timers.len(),
            packets: self.tx.len() + self.pool.len(),
            queued: self.events.len() + self.busy.len() + self.overrun_cqs.len(),
            ..mem
        }
    }

    /// Destroy CQ `cq` (`ibv_destroy_cq`) with the completions still in it.
    /// Refused ([`VerbError::CqBusy`]) while a QP completes into it, as
    /// verbs refuses with EBUSY. Its handle may name a new CQ later.
    pub fn destroy_cq(&mut self, cq: CqHandle) -> Result<(), VerbError> {
        self.cq_mut(cq)?;
        if self.qps.iter().any(|q| q.send_cq == cq || q.recv_cq == cq) {
            return Err(VerbError::CqBusy(cq));
        }
        self.cqs.remove(cq);
        self.overrun_cqs.retain(|&h| h != cq);
        Ok(())
    }

    fn cq_mut(&mut self, cq: CqHandle) -> Result<&mut Cq, VerbError> {
        self.cqs.get_mut(cq).ok_or(VerbError::NoSuchCq(cq))
    }

    /// Change CQ `cq`'s depth (`ibv_resize_cq`), at most
    /// `DEVICE_ATTR.max_cqe`. `outside` counts completions already handed to
    /// the consumer and not yet polled: with more waiting than `depth`, it
    /// fails with [`VerbError::CqTooSmall`] and nothing changes.
    pub fn resize_cq(
        &mut self,
        cq: CqHandle,
        depth: usize,
        outside: usize,
    ) -> Result<(), VerbError> {
        if depth > DEVICE_ATTR.max_cqe as usize {
            return Err(VerbError::CapsTooLarge);
        }
        let q = self.cq_mut(cq)?;
        if q.resize(depth, outside) {
            Ok(())
        } else {
            Err(VerbError::CqTooSmall {
                depth,
                waiting: q.len() + outside,
            })
        }
    }

    /// Move the CQs a completion went to since the last call onto the end
    /// of `out`, each once: only those have anything for
    /// [`Nic::deliver_cq`] (a driver that hands completions over after each
    /// batch looks at those, however many CQs there are).
    pub fn take_pending_cqs(&mut self, out: &mut Vec<CqHandle>) {
        self.cqs.take_pending(out);
    }

    /// Hand CQ `cq`'s completions to a consumer that already holds
    /// `outside` of them unpolled (a driver that queues completions where the
    /// program polls them): the depth counts both, and completions that do
    /// not fit overrun the CQ as if they had arrived to a full queue
    /// (IBV_EVENT_CQ_ERR, and the QPs that complete into it go to error).
    /// Each goes to `each`, in order; returns how many did.
    pub fn deliver_cq(
        &mut self,
        cq: CqHandle,
        outside: usize,
        each: impl FnMut(Completion),
    ) -> Result<usize, VerbError> {
        let q = self.cq_mut(cq)?;
        let room = q.depth().saturating_sub(outside);
        let first = q.overrun_beyond(room);
        let out = q.drain_into(room, each);
        if first {
            self.events.push_back(AsyncEvent::CqError(cq));
            self.overrun_cqs.push(cq);
            self.settle();
        }
        Ok(out)
    }

    /// The send and receive CQs of QP `qpn`.
    pub fn qp_cqs(&self, qpn: u32) -> Option<(CqHandle, CqHandle)> {
        self.qps.get(qpn).map(|q| (q.send_cq, q.recv_cq))
    }

    /// Take up to `max` completions.
    pub fn poll_cq(&mut self, cq: CqHandle, max: usize) -> Result<Vec<Completion>, VerbError> {
        Ok(self.cq_mut(cq)?.poll(max))
    }

    /// Create a QP in the RESET state; returns its number.
    pub fn create_qp(
        &mut self,
        pd: PdHandle,
        qp_type: QpType,
        send_cq: CqHandle,
        recv_cq: CqHandle,
        caps: QpCaps,
    ) -> Result<u32, VerbError> {
        self.create_qp_numbered(pd, qp_type, send_cq, recv_cq, caps, None)
    }

    /// As [`Nic::create_qp`], with QP number `qpn` if given (free, in
    /// 0x11..=0xFFFFFE): to replay a capture into a NIC set up as the one
    /// that made it. A NIC on a network lets its numbers be drawn.
    pub fn create_qp_numbered(
        &mut self,
        pd: PdHandle,
        qp_type: QpType,
        send_cq: CqHandle,
        recv_cq: CqHandle,
        caps: QpCaps,
        qpn: Option<u32>,
    ) -> Result<u32, VerbError> {
        let a = DEVICE_ATTR;
        if caps.max_send_wr > a.max_qp_wr
            || caps.max_recv_wr > a.max_qp_wr
            || caps.max_send_sge > a.max_sge
            || caps.max_recv_sge > a.max_sge
        {
            return Err(VerbError::CapsTooLarge);
        }
        for cq in [send_cq, recv_cq] {
            if self.cqs.get(cq).is_none() {
                return Err(VerbError::NoSuchCq(cq));
            }
        }
        let qps = &self.qps;
        let taken = |q| qps.get(q).is_some();
        let qpn = match qpn {
            None => self.qpns.draw(taken),
            Some(q) => self.qpns.claim(q, taken).then_some(q),
        }
        .ok_or(VerbError::Unsupported("that QP number is not free"))?;
        self.mem.pd_acquire(pd)?;
        self.qps
            .insert(Qp::new(qpn, qp_type, pd, send_cq, recv_cq, caps));
        Ok(qpn)
    }

    /// Destroy a QP (`ibv_destroy_qp`): its work requests are dropped
    /// without completions, as verbs does, and packets for its number find
    /// nothing from now on (the number is not handed out again until
    /// [`QUARANTINE`](crate::rng::QUARANTINE) more QPs have been destroyed).
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), VerbError> {
        let qp = self.qps.remove(qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        self.qpns.release(qpn);
        self.mem.pd_release(qp.pd);
        // Its unpolled completions go with it: a QP number reused later
        // never finds completions of the QP before it.
        remove_completions(&mut self.cqs, &qp);
        if let Some(h) = qp.srq {
            if let Ok(s) = self.srq_mut(h) {
                s.users = s.users.saturating_sub(1);
            }
        }
        self.busy.retain(|&q| q != qpn);
        // What it had in flight frees room for the others.
        self.inflight = self.inflight.saturating_sub(qp.counted);
        self.starved.retain(|&q| q != qpn);
        self.settle();
        Ok(())
    }

    /// The QP's attributes, with its PSNs as they stand now, as a NIC
    /// reports them (rdma_rxe's `req.psn` and `resp.psn`, ConnectX's next
    /// send and receive PSNs): `rq_psn` is the PSN the responder expects
    /// next, once in RTR; `sq_psn` the PSN the next new request gets, once
    /// in RTS. Before that, what the program set (0 if nothing).
    pub fn query_qp(&self, qpn: u32) -> Result<QpAttr, VerbError> {
        let qp = self.qps.get(qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        let mut attr = qp.attr;
        let state = qp.state();
        if !matches!(state, QpState::Reset | QpState::Init) {
            attr.rq_psn = qp.epsn.value();
        }
        if !matches!(state, QpState::Reset | QpState::Init | QpState::Rtr) {
            attr.sq_psn = qp.sq_psn.value();
        }
        Ok(attr)
    }

    /// `ibv_modify_qp`.
    pub fn modify_qp(
        &mut self,
        now: Time,
        qpn: u32,
        attr: &QpAttr,
        mask: AttrMask,
    ) -> Result<(), VerbError> {
        self.settled(|nic| nic.modify_qp_inner(now, qpn, attr, mask))
    }

    fn modify_qp_inner(
        &mut self,
        now: Time,
        qpn: u32,
        attr: &QpAttr,
        mask: AttrMask,
    ) -> Result<(), VerbError> {
        let mut attr = *attr;
        if mask.contains(AttrMask::AV) {
            if let Some(av) = attr.ah_attr {
                attr.ah_attr = Some(self.resolve_source(av).map_err(VerbError::Modify)?);
            }
        }
        let attr = &attr;
        let limits = self.limits;
        let (qps, mut ctx) = self.parts(now);
        let qp = qps.get_mut(qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        let t =
            qp::modify(qp.qp_type, &mut qp.attr, attr, mask, &limits).map_err(VerbError::Modify)?;
        match (t.from, t.to) {
            (_, QpState::Reset) => {
                qp.reset(&mut ctx);
                // Completions of the QP not yet polled go too (flushed
                // receives, say): a program that resets a QP after an error
                // and uses it again sees nothing from before, as mlx5 cleans
                // its CQs (mlx5_cq_clean). The layer holding completions
                // handed over to the program cleans those
                // ([`Nic::qp_cqs`]).
                remove_completions(ctx.cqs, qp);
            }
            (QpState::Init, QpState::Rtr) => {
                qp.epsn = Psn::new(qp.attr.rq_psn);
                qp.ack_psn = qp.epsn;
                qp.msn = 0;
                qp.seq_nak_sent = false;
            }
            (QpState::Rtr, QpState::Rts) => {
                qp.sq_psn = Psn::new(qp.attr.sq_psn);
                qp.una = qp.sq_psn;
                qp.heard_una = qp.sq_psn;
                qp.max_sent = qp.sq_psn;
                qp.retry_left = qp.attr.retry_cnt;
                qp.rnr_left = qp.attr.rnr_retry;
            }
            (from, QpState::Err) if from != QpState::Err => qp.flush(&mut ctx),
            (QpState::Rts, QpState::Sqd) => qp.sq_drained = false,
            _ => {}
        }
        qp.req_poll(&mut ctx);
        Ok(())
    }

    /// Count a datagram the driver could not pass on (truncated, or from a
    /// sender that is not an IP address) as malformed.
    pub fn count_malformed(&mut self) {
        self.counters.malformed += 1;
    }

    /// `ibv_post_send`. In the error state (and the send queue error state of
    /// UC and UD) the request completes at once with WR_FLUSH_ERR, as verbs
    /// specifies.
    pub fn post_send(&mut self, now: Time, qpn: u32, wr: SendWr) -> Result<(), VerbError> {
        self.settled(|nic| nic.post_send_inner(now, qpn, wr))
    }

    fn post_send_inner(&mut self, now: Time, qpn: u32, wr: SendWr) -> Result<(), VerbError> {
        let (qps, mut ctx) = self.parts(now);
        let qp = qps.get_mut(qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        check_sges(&wr.sg_list, qp.caps.max_send_sge)?;
        if qp.sq.len() >= qp.caps.max_send_wr as usize {
            return Err(VerbError::QueueFull);
        }
        if wr.op.is_atomic() && (wr.sg_list.len() != 1 || wr.sg_list[0].length != 8) {
            return Err(VerbError::BadAtomicSge);
        }
        if qp.qp_type == QpType::Ud {
            return Err(VerbError::Unsupported(
                "post_send on a UD queue pair: use post_send_ud",
            ));
        }
        if qp.is_uc() && (wr.op.is_read_or_atomic() || matches!(wr.op, SendOp::SendWithInv { .. }))
        {
            return Err(VerbError::Unsupported(
                "READ, atomics, ATOMIC_WRITE, FLUSH and SEND_WITH_INV on a UC queue pair",
            ));
        }
        check_inline(&wr)?;
        let len = match (&wr.inline, wr.op) {
            (Some(data), _) => data.len() as u64,
            (
                None,
                SendOp::Send { .. }
                | SendOp::SendWithInv { .. }
                | SendOp::Write { .. }
                | SendOp::Read { .. },
            ) => sg_len(&wr.sg_list),
            // Their data is in the request itself, or there is none.
            (None, _) => 0,
        };
        if len > 1 << 31 {
            return Err(VerbError::MessageTooLong(len));
        }
        match qp.state() {
            QpState::Rts | QpState::Sqd => {}
            QpState::Err | QpState::Sqe => {
                qp.flush_one(&mut ctx, &wr);
                return Ok(());
            }
            s => return Err(VerbError::BadState(s)),
        }
        let pmtu = qp.pmtu();
        let npkts = match wr.op {
            SendOp::LocalInv { .. } | SendOp::BindMw(_) => 0,
            SendOp::CompareSwap { .. }
            | SendOp::FetchAdd { .. }
            | SendOp::AtomicWrite { .. }
            | SendOp::Flush { .. } => 1,
            _ => len.div_ceil(pmtu).max(1) as u32,
        };
        if matches!(wr.op, SendOp::Read { .. }) && npkts >= 1 << 23 {
            return Err(VerbError::ReadTooManyPackets { len, pmtu });
        }
        let first_psn = qp.sq_psn;
        qp.sq_psn = first_psn.add(npkts);
        qp.sq.push_back(SendWqe {
            wr,
            len,
            first_psn,
            npkts,
            resp_done: 0,
            read_start: 0,
            status: None,
        });
        qp.req_poll(&mut ctx);
        Ok(())
    }

    /// `ibv_post_send` on a UD QP: a SEND (with or without immediate) of at
    /// most 4096 bytes to `to`.
    pub fn post_send_ud(
        &mut self,
        now: Time,
        qpn: u32,
        wr: SendWr,
        to: UdDest,
    ) -> Result<(), VerbError> {
        self.settled(|nic| nic.post_send_ud_inner(now, qpn, wr, to))
    }

    fn post_send_ud_inner(
        &mut self,
        now: Time,
        qpn: u32,
        wr: SendWr,
        to: UdDest,
    ) -> Result<(), VerbError> {
        let (qps, mut ctx) = self.parts(now);
        let qp = qps.get_mut(qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        if qp.qp_type != QpType::Ud {
            return Err(VerbError::Unsupported(
                "post_send_ud on a connected queue pair",
            ));
        }
        if !matches!(wr.op, SendOp::Send { .. }) {
            return Err(VerbError::Unsupported("UD carries SENDs only"));
        }
        check_inline(&wr)?;
        check_sges(&wr.sg_list, qp.caps.max_send_sge)?;
        match qp.state() {
            QpState::Rts => qp.post_ud(&mut ctx, wr, to),
            QpState::Err | QpState::Sqe => qp.flush_one(&mut ctx, &wr),
            s => return Err(VerbError::BadState(s)),
        }
        Ok(())
    }

    /// Create a shared receive queue of `max_wr` receives of up to `max_sge`
    /// entries each (`ibv_create_srq`).
    pub fn create_srq(
        &mut self,
        pd: PdHandle,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<SrqHandle, VerbError> {
        if max_wr > DEVICE_ATTR.max_qp_wr || max_sge > DEVICE_ATTR.max_sge {
            return Err(VerbError::CapsTooLarge);
        }
        self.mem.pd_acquire(pd)?;
        let srq = Srq {
            pd,
            users: 0,
            queue: VecDeque::new(),
            max_wr,
            max_sge,
            limit: 0,
        };
        let i = free_slot(&mut self.srqs);
        self.srqs[i] = Some(srq);
        Ok(SrqHandle(i as u32))
    }

    /// `ibv_destroy_srq`: refused (SrqBusy) while a QP takes its receives
    /// from it. The receives still posted go without a completion.
    pub fn destroy_srq(&mut self, srq: SrqHandle) -> Result<(), VerbError> {
        let s = self.srq_mut(srq)?;
        if s.users > 0 {
            return Err(VerbError::SrqBusy(srq));
        }
        let pd = s.pd;
        self.srqs[srq.0 as usize] = None;
        self.mem.pd_release(pd);
        Ok(())
    }

    fn srq_mut(&mut self, srq: SrqHandle) -> Result<&mut Srq, VerbError> {
        self.srqs
            .get_mut(srq.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(VerbError::Unsupported("no such SRQ"))
    }

    /// `ibv_post_srq_recv`.
    pub fn post_srq_recv(&mut self, srq: SrqHandle, wr: RecvWr) -> Result<(), VerbError> {
        let s = self.srq_mut(srq)?;
        check_sges(&wr.sg_list, s.max_sge)?;
        if s.queue.len() >= s.max_wr as usize {
            return Err(VerbError::QueueFull);
        }
        s.queue.push_back(wr);
        Ok(())
    }

    /// Arm the SRQ's limit (`ibv_modify_srq` with IBV_SRQ_LIMIT): when fewer
    /// than `limit` receives remain, an `AsyncEvent::SrqLimitReached` is raised
    /// once. 0 disarms.
    pub fn arm_srq(&mut self, srq: SrqHandle, limit: u32) -> Result<(), VerbError> {
        let s = self.srq_mut(srq)?;
        if limit > s.max_wr {
            return Err(VerbError::CapsTooLarge);
        }
        s.limit = limit;
        Ok(())
    }

    /// Receives waiting in an SRQ.
    pub fn srq_len(&self, srq: SrqHandle) -> Option<usize> {
        self.srqs
            .get(srq.0 as usize)
            .and_then(Option::as_ref)
            .map(|s| s.queue.len())
    }

    /// Make a QP (in RESET, with nothing posted) take its receives from `srq`,
    /// as `ibv_create_qp` with `srq` set does.
    pub fn attach_srq(&mut self, qpn: u32, srq: SrqHandle) -> Result<(), VerbError> {
        self.srq_mut(srq)?;
        let qp = self.qps.get_mut(qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        if qp.state() != QpState::Reset || !qp.rq.is_empty() || qp.srq.is_some() {
            return Err(VerbError::BadState(qp.state()));
        }
        qp.srq = Some(srq);
        self.srq_mut(srq)?.users += 1;
        Ok(())
    }

    /// The next asynchronous event (`ibv_get_async_event`).
    pub fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, now: Time, qpn: u32, wr: RecvWr) -> Result<(), VerbError> {
        self.settled(|nic| nic.post_recv_inner(now, qpn, wr))
    }

    fn post_recv_inner(&mut self, now: Time, qpn: u32, wr: RecvWr) -> Result<(), VerbError> {
        let (qps, mut ctx) = self.parts(now);
        let qp = qps.get_mut(qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        check_sges(&wr.sg_list, qp.caps.max_recv_sge)?;
        if qp.srq.is_some() {
            return Err(VerbError::Unsupported(
                "post_recv on a QP with an SRQ: post to the SRQ",
            ));
        }
        if qp.rq.len() >= qp.caps.max_recv_wr as usize {
            return Err(VerbError::QueueFull);
        }
        if qp.state() == QpState::Reset {
            return Err(VerbError::BadState(QpState::Reset));
        }
        qp.rq.push_back(wr);
        if qp.state() == QpState::Err {
            qp.flush(&mut ctx);
        }
        Ok(())
    }

    /// A UDP datagram to port 4791 arrived. Its ICRC is checked under the UDP
    /// convention (see [`rnic_wire::icrc::for_udp`]), in IPv4 for the
    /// identifications a GSO send's segments carry too
    /// ([`rnic_wire::icrc::udp_ident`]); a packet that fails it, or does not
    /// parse, is dropped and counted. Returns what the packet is, if it
    /// parsed, whatever became of it (see [`crate::datagram`]).
    pub fn handle_datagram(&mut self, now: Time, d: &Datagram) -> Option<Header> {
        self.handle_udp(now, d.src, d.dst, d.src_port, &d.payload)
    }

    /// Handle a UDP payload from `src` (port `src_port`) to `dst`, in place:
    /// what [`Nic::handle_datagram`] does, for a caller whose bytes sit in
    /// its own receive buffer.
    pub fn handle_udp(
        &mut self,
        now: Time,
        src: IpAddr,
        dst: IpAddr,
        src_port: u16,
        payload: &[u8],
    ) -> Option<Header> {
        self.settled(|nic| nic.handle_udp_inner(now, src, dst, src_port, payload))
    }

    fn handle_udp_inner(
        &mut self,
        now: Time,
        src: IpAddr,
        dst: IpAddr,
        src_port: u16,
        payload: &[u8],
    ) -> Option<Header> {
        let Ok(pkt) = IbPacket::new_checked(payload) else {
            self.counters.malformed += 1;
            return None;
        };
        let header = Header::of_packet(&pkt);
        let covered = pkt.covered();
        match icrc::udp_ident(
            src,
            dst,
            src_port,
            covered,
            pkt.icrc(),
            &mut self.gso_deltas,
        ) {
            Ok(Some(_)) => self.handle_checked(now, src, dst, &pkt),
            _ => self.counters.icrc_errors += 1,
        }
        Some(header)
    }

    /// A whole frame, as a transport that sees every header receives it
    /// (`link` says how it begins: an Ethernet header, or the IP header).
    /// Its ICRC is verified over the IP header it arrived with, the IPv4
    /// identification included, whatever the peer put there: rdma_rxe puts
    /// a new value in every packet, which a UDP socket never shows. A frame
    /// that is not RoCE v2 to this NIC's address (another protocol, UDP
    /// port or destination) is dropped and counted as foreign; a RoCE v2
    /// frame that does not parse, as malformed. Returns its addresses and
    /// what the packet is, if it parsed as RoCE v2, whatever became of it.
    pub fn handle_frame(&mut self, now: Time, link: LinkType, frame: &[u8]) -> Option<Arrival> {
        self.settled(|nic| nic.handle_frame_inner(now, link, frame))
    }

    fn handle_frame_inner(&mut self, now: Time, link: LinkType, frame: &[u8]) -> Option<Arrival> {
        let f = match Frame::parse(link, frame) {
            Ok(f) => f,
            Err(e) if e.is_not_roce() => {
                self.counters.foreign_frames += 1;
                return None;
            }
            Err(_) => {
                self.counters.malformed += 1;
                return None;
            }
        };
        let arrival = Arrival {
            src: f.ip.src_addr(),
            dst: f.ip.dst_addr(),
            src_port: f.udp.src_port,
            header: Header::of_packet(&f.ib),
        };
        if !self.addrs.contains(&arrival.dst) {
            self.counters.foreign_frames += 1;
        } else if !f.icrc_ok() {
            self.counters.icrc_errors += 1;
        } else {
            self.handle_checked(now, arrival.src, arrival.dst, &f.ib);
        }
        Some(arrival)
    }

    /// A packet whose ICRC verified, from `src` to `dst`.
    fn handle_checked(&mut self, now: Time, src: IpAddr, dst: IpAddr, pkt: &IbPacket<&[u8]>) {
        // IBTA 9.2.6: only transport header version 0 is defined.
        if pkt.bth().tver() != rnic_wire::bth::TVER {
            self.counters.bad_tver += 1;
            return;
        }
        let qpn = pkt.bth().dest_qp();
        let (qps, mut ctx) = self.parts(now);
        let Some(qp) = qps.get_mut(qpn) else {
            ctx.counters.unknown_qp += 1;
            return;
        };
        // rnic's P_Key table has one entry (index 0): the default partition.
        if !pkey_matches(pkt.bth().p_key(), rnic_wire::bth::DEFAULT_P_KEY) {
            ctx.counters.pkey_violations += 1;
            return;
        }
        // The transport in the opcode must be the QP's own.
        let transport = match qp.qp_type {
            QpType::Rc => rnic_wire::Transport::Rc,
            QpType::Uc => rnic_wire::Transport::Uc,
            QpType::Ud => rnic_wire::Transport::Ud,
        };
        if pkt.info().transport != transport {
            ctx.counters.wrong_transport += 1;
            return;
        }
        if qp.qp_type == QpType::Ud {
            ctx.counters.rcvd_pkts += 1;
            qp.resp_ud(&mut ctx, pkt, src, dst);
            return;
        }
        // A connected QP takes packets from its peer only, sent to the
        // address it sends from (rdma_rxe's check_addr).
        if !qp
            .attr
            .ah_attr
            .is_some_and(|a| a.dest == src && a.src.is_none_or(|s| s == dst))
        {
            ctx.counters.unknown_qp += 1;
            return;
        }
        ctx.counters.rcvd_pkts += 1;
        if pkt.info().is_request() {
            qp.resp_packet(&mut ctx, pkt);
        } else {
            qp.comp_packet(&mut ctx, pkt);
        }
        qp.req_poll(&mut ctx);
    }

    /// The time is `now`: run expired timers.
    pub fn handle_timeout(&mut self, now: Time) {
        self.settled(|nic| nic.handle_timeout_inner(now));
    }

    fn handle_timeout_inner(&mut self, now: Time) {
        // The due entries, earliest first (the same order on every replay);
        // a QP is served once however many entries it has.
        let mut due = Vec::new();
        while let Some(&core::cmp::Reverse((t, qpn))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            if let Some(qp) = self.qps.get_mut(qpn) {
                if qp.timer_at == Some(t) {
                    qp.timer_at = None;
                }
            }
            if !due.contains(&qpn) {
                due.push(qpn);
            }
        }
        let (qps, mut ctx) = self.parts(now);
        for qpn in due {
            let Some(qp) = qps.get_mut(qpn) else { continue };
            if qp.deadline().is_some_and(|t| t <= now) {
                qp.comp_timeout(&mut ctx);
                qp.req_poll(&mut ctx);
            }
            // An entry that came up early, or a deadline left: its entry.
            if let Some(t) = qp.deadline() {
                qp.schedule(&mut ctx, t);
            }
        }
    }

    /// Hand back a sent datagram's buffer for the NIC to build a later
    /// packet in (at most [`POOL`](crate::pool::POOL) are kept).
    pub fn recycle(&mut self, buf: Vec<u8>) {
        self.pool.keep(buf);
    }

    /// How many datagrams [`Nic::poll_transmit`] has ready, or `None` while
    /// READ responses or requests wait to be generated there too: what a
    /// transport that holds a few datagrams back to send them in one system
    /// call asks.
    pub fn queued_datagrams(&self) -> Option<usize> {
        self.busy.is_empty().then_some(self.tx.len())
    }

    /// The next datagram to send. READ responses are generated here, a
    /// burst per QP in turn, as the caller takes them: a READ of any length
    /// holds no more than a burst of packets in memory.
    pub fn poll_transmit(&mut self) -> Option<Datagram> {
        loop {
            if let Some(d) = self.poll_built() {
                return Some(d);
            }
            if !self.generate_burst() {
                return None;
            }
        }
    }

    /// The datagrams built and not yet handed out, in order.
    pub fn queued(&self) -> impl Iterator<Item = &Datagram> {
        self.tx.iter()
    }

    /// The next datagram already built (requests, ACKs, responses
    /// generated so far), generating nothing: with
    /// [`Nic::generate_burst`], what a transport that paces what the NIC
    /// builds calls instead of [`Nic::poll_transmit`].
    pub fn poll_built(&mut self) -> Option<Datagram> {
        self.tx.pop()
    }

    /// Whether READ responses or requests wait to be generated.
    pub fn more_to_build(&self) -> bool {
        !self.busy.is_empty()
    }

    /// Generate the next QP's burst (in turn): at most [`RESPONSE_BURST`]
    /// READ response packets, then the requests it has room for (up to
    /// `REQUEST_BURST` queued), for [`Nic::poll_built`] to hand out. False
    /// if no QP waits.
    pub fn generate_burst(&mut self) -> bool {
        let Some(qpn) = self.busy.pop_front() else {
            return false;
        };
        let now = self.now;
        let (qps, mut ctx) = self.parts(now);
        if let Some(qp) = qps.get_mut(qpn) {
            qp.busy = false;
            qp.generate_responses(&mut ctx, RESPONSE_BURST);
            qp.req_poll(&mut ctx);
        }
        self.drop_stale_timers();
        true
    }

    /// Make the front of the timers exact: pop entries whose QP is gone,
    /// has no deadline, or holds another entry, and move one that is early
    /// to its QP's deadline.
    fn drop_stale_timers(&mut self) {
        while let Some(&core::cmp::Reverse((t, qpn))) = self.timers.peek() {
            let Some(qp) = self.qps.get_mut(qpn) else {
                self.timers.pop();
                continue;
            };
            if qp.timer_at != Some(t) {
                self.timers.pop();
                continue;
            }
            match qp.deadline() {
                Some(d) if d == t => break,
                Some(d) => {
                    self.timers.pop();
                    self.timers.push(core::cmp::Reverse((d, qpn)));
                    qp.timer_at = Some(d);
                }
                None => {
                    self.timers.pop();
                    qp.timer_at = None;
                }
            }
        }
    }

    /// When [`Nic::handle_timeout`] must next be called: the front of the
    /// timers, not a walk over the QPs.
    pub fn next_deadline(&self) -> Option<Time> {
        self.timers.peek().map(|&core::cmp::Reverse((t, _))| t)
    }

    /// Timer entries held, live and stale (a diagnostic: it stays near the
    /// number of QPs with a deadline).
    pub fn timer_entries(&self) -> usize {
        self.timers.len()
    }
}

/// What the fuzz targets' harnesses read of a QP, to forge packets it takes.
#[cfg(feature = "fuzz")]
impl Nic {
    /// QP `qpn`'s oldest unacknowledged PSN and how many PSNs are
    /// outstanding (for the fuzzer, to forge responses a requester takes).
    pub(crate) fn send_window(&self, qpn: u32) -> Option<(Psn, u32)> {
        self.qps
            .get(qpn)
            .map(|qp| (qp.una, qp.max_sent.forward_from(qp.una)))
    }

    /// The PSN QP `qpn`'s responder expects next (for the fuzzer, to forge
    /// requests it takes).
    pub(crate) fn recv_psn(&self, qpn: u32) -> Option<Psn> {
        self.qps.get(qpn).map(|qp| qp.epsn)
    }

    /// How many send work requests QP `qpn` holds (for the fuzzer, to see
    /// that a requester whose peer fell silent drains its queue).
    pub(crate) fn send_queue_len(&self, qpn: u32) -> Option<usize> {
        self.qps.get(qpn).map(|qp| qp.sq.len())
    }
}

#[cfg(test)]
mod tests {
    use super::{pkey_matches, Nic, QpCaps, QpType, QPNS};
    use core::net::{IpAddr, Ipv4Addr};

    #[test]
    fn a_qp_number_slot_keeps_the_top_bits_and_the_rest_random() {
        let mut nic = Nic::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 5);
        assert!(
            nic.restrict_qpns(16, 4).is_err(),
            "16 does not fit in 4 bits"
        );
        assert!(nic.restrict_qpns(0, 9).is_err());
        nic.restrict_qpns(0xA, 4).unwrap();
        let pd = nic.alloc_pd();
        let cq = nic.create_cq(16);
        let qpns: Vec<u32> = (0..200)
            .map(|_| {
                nic.create_qp(pd, QpType::Rc, cq, cq, QpCaps::default())
                    .unwrap()
            })
            .collect();
        assert!(qpns.iter().all(|q| q >> 20 == 0xA), "{qpns:x?}");
        // The 20 bits below are drawn from all of their range.
        assert!(qpns.iter().any(|q| q & 0xF_FFFF < 0x4_0000));
        assert!(qpns.iter().any(|q| q & 0xF_FFFF > 0xC_0000));
        assert!(nic.restrict_qpns(0xB, 4).is_err(), "not once QPs exist");
        // Slot 0 keeps clear of the special QPs, the last of multicast.
        let mut low = Nic::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 6);
        low.restrict_qpns(0, 8).unwrap();
        let mut high = Nic::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 7);
        high.restrict_qpns(0xFF, 8).unwrap();
        for (nic, slot) in [(&mut low, 0), (&mut high, 0xFF)] {
            let pd = nic.alloc_pd();
            let cq = nic.create_cq(16);
            for _ in 0..300 {
                let q = nic
                    .create_qp(pd, QpType::Ud, cq, cq, QpCaps::default())
                    .unwrap();
                assert_eq!(q >> 16, slot);
                assert!((QPNS.0..=QPNS.1).contains(&q), "{q:#x}");
            }
        }
    }

    #[test]
    fn qp_numbers_are_random_and_a_destroyed_one_finds_nothing() {
        let mut nic = Nic::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 3);
        let pd = nic.alloc_pd();
        let cq = nic.create_cq(16);
        let make = |nic: &mut Nic| {
            nic.create_qp(pd, QpType::Rc, cq, cq, QpCaps::default())
                .unwrap()
        };
        let qpns: Vec<u32> = (0..100).map(|_| make(&mut nic)).collect();
        // Not 0x11, 0x12, ... as rdma_rxe and every NIC ReDMArk tried.
        assert_eq!(qpns.windows(2).filter(|w| w[1] == w[0] + 1).count(), 0);
        assert!(qpns.iter().all(|q| (QPNS.0..=QPNS.1).contains(q)));
        assert!(qpns.iter().any(|&q| q < 0x40_0000) && qpns.iter().any(|&q| q > 0xC0_0000));
        for &q in &qpns {
            assert!(nic.query_qp(q).is_ok());
        }
        // A destroyed QP's number finds nothing. (That it rests before
        // reuse is Ids' rule: rng::tests.)
        let gone = qpns[42];
        nic.destroy_qp(gone).unwrap();
        assert!(nic.query_qp(gone).is_err());
        assert!(nic.query_qp(qpns[43]).is_ok());
        // Two NICs (two seeds) number differently.
        let mut other = Nic::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 4);
        let pd2 = other.alloc_pd();
        let cq2 = other.create_cq(16);
        let q2 = other
            .create_qp(pd2, QpType::Rc, cq2, cq2, QpCaps::default())
            .unwrap();
        assert_ne!(q2, qpns[0]);
    }

    #[test]
    fn pkey_matching_needs_one_full_member() {
        assert!(pkey_matches(0xFFFF, 0xFFFF));
        assert!(pkey_matches(0x7FFF, 0xFFFF));
        assert!(pkey_matches(0xFFFF, 0x7FFF));
        // Two limited members of one partition cannot talk (IBTA 10.9.3).
        assert!(!pkey_matches(0x7FFF, 0x7FFF));
        assert!(!pkey_matches(0x8001, 0xFFFF));
        // Partition 0 is invalid.
        assert!(!pkey_matches(0x8000, 0x8000));
    }
}
