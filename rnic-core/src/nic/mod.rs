//! One NIC: its memory, queue pairs and completion queues, and the sans-I/O
//! surface the driver and the simulator use. Feed it what happened
//! ([`Nic::handle_datagram`], [`Nic::post_send`], [`Nic::handle_timeout`], each
//! with the time); take what it wants done ([`Nic::poll_transmit`],
//! [`Nic::poll_cq`], [`Nic::next_deadline`]).
//!
//! The surface, by what it does: `verbs` creates, modifies and destroys
//! the NIC's objects; `post` queues work; `receive` takes packets in;
//! `transmit` says what leaves and when (the transmit queue, the bursts it
//! generates, the timers). This module holds the NIC itself and what every
//! event shares: the QPs' context, and what settles after an event.

mod gsi;
mod post;
mod receive;
mod transmit;
mod verbs;

use core::fmt;
use core::net::IpAddr;
use std::collections::VecDeque;

use rnic_wire::icrc;

use crate::counters::{Counters, Footprint};
use crate::cq::{CqHandle, CqTable};
use crate::device::{DEVICE_ATTR, QPNS};
use crate::error::VerbError;
use crate::mem::Memory;
use crate::pool::BufferPool;
use crate::qp::{self, AddressVector, AttrMask, Limits, ModifyError, QpState};
use crate::rc::{Ctx, Execution, Mechanisms, Qp, Timers};
use crate::rng::{Ids, SecretRng};
use crate::srq::{AsyncEvent, Srq};
use crate::table::IdMap;
use crate::time::Time;

/// READ response packets one QP generates before the next busy QP's turn.
pub const RESPONSE_BURST: usize = 16;

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
    /// QP1 and the communication manager, once met ([`gsi`]).
    gsi: Option<gsi::Gsi>,
    gsi_counters: gsi::GsiCounters,
    gsi_port: u16,
    /// The slot of the QP number space ([`Nic::restrict_qpns`]): the
    /// communication manager's IDs are drawn from the same slot of theirs.
    slot: Option<(u32, u32)>,
}

pub use gsi::GsiCounters;

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
            gsi: None,
            gsi_counters: GsiCounters::default(),
            gsi_port: rnic_wire::mad::GSI_UDP_SOURCE_PORT,
            slot: None,
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

    /// Switch transport mechanisms on or off (see [`Mechanisms`]).
    pub fn set_mechanisms(&mut self, m: Mechanisms) {
        self.mechanisms = m;
    }

    /// Hand out only QP numbers whose top `bits` bits are `slot`: the
    /// NIC's share of the QP number space when several NICs (processes)
    /// share one address and the packets for each are told apart by their
    /// destination QP. The rest of each number stays random. The
    /// communication manager's IDs (communication IDs, SIDR request IDs)
    /// take the same slot of theirs, so that a CM message, which names its
    /// receiver's ID, is told apart the same way ([`crate::cm::addressee`]).
    /// Only before the first QP and the first use of the CM; an error (and
    /// no change) after them, or for a slot that does not fit in `bits` (at
    /// most 8).
    pub fn restrict_qpns(&mut self, slot: u32, bits: u32) -> Result<(), VerbError> {
        if self.qps.iter().next().is_some() || self.gsi.is_some() || bits > 8 || slot >> bits != 0 {
            return Err(VerbError::Unsupported(
                "a QP number slot is set before the first QP, in at most 8 bits",
            ));
        }
        let shift = 24 - bits;
        let lo = (slot << shift).max(QPNS.0);
        let hi = (((slot + 1) << shift) - 1).min(QPNS.1);
        self.qpns.set_range(lo, hi);
        self.slot = Some((slot, bits));
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

    /// Memory regions and protection domains.
    pub fn memory(&self) -> &Memory {
        &self.mem
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
}

/// What the fuzz targets' harnesses read of a QP, to forge packets it takes.
#[cfg(feature = "fuzz")]
impl Nic {
    /// QP `qpn`'s oldest unacknowledged PSN and how many PSNs are
    /// outstanding (for the fuzzer, to forge responses a requester takes).
    pub(crate) fn send_window(&self, qpn: u32) -> Option<(rnic_wire::Psn, u32)> {
        self.qps
            .get(qpn)
            .map(|qp| (qp.una, qp.max_sent.forward_from(qp.una)))
    }

    /// The PSN QP `qpn`'s responder expects next (for the fuzzer, to forge
    /// requests it takes).
    pub(crate) fn recv_psn(&self, qpn: u32) -> Option<rnic_wire::Psn> {
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
    use super::receive::pkey_matches;
    use super::{Nic, QPNS};
    use crate::qp::QpType;
    use crate::rc::QpCaps;
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
