//! A deterministic simulated network: datagrams between IP addresses, on a
//! virtual clock, with per-link loss, duplication, reordering (a bounded random
//! extra delay), corruption (one flipped bit, which the ICRC must catch),
//! partitions and healing. Everything random comes from one seed, so a run
//! replays exactly, and every fate is recorded in a trace a person can read.
//!
//! The NICs of a simulation exchange [`Datagram`]s through it: what a UDP
//! socket on port 4791 would carry (BTH through ICRC).

use core::cmp::Reverse;
use core::fmt;
use core::net::IpAddr;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::time::Duration;

use rnic_wire::pcap::PcapWriter;
use rnic_wire::IbPacket;

use crate::datagram::Datagram;
use crate::rng::Rng;
use crate::time::Time;

/// How a link (one direction between two addresses) treats datagrams.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkConfig {
    /// Probability that a datagram is dropped.
    pub loss: f64,
    /// Probability that a datagram is delivered twice.
    pub duplicate: f64,
    /// Probability that one bit of a datagram is flipped.
    pub corrupt: f64,
    /// Fixed one-way delay.
    pub delay: Duration,
    /// Upper bound of a uniformly random extra delay per copy: datagrams sent
    /// closer together than this can arrive out of order.
    pub jitter: Duration,
}

impl LinkConfig {
    /// A perfect link with a fixed delay.
    pub const fn perfect(delay: Duration) -> LinkConfig {
        LinkConfig {
            loss: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            delay,
            jitter: Duration::ZERO,
        }
    }
}

impl Default for LinkConfig {
    fn default() -> LinkConfig {
        LinkConfig::perfect(Duration::from_micros(10))
    }
}

/// A scripted loss: drop the next `times` datagrams from `src` that match the
/// opcode and PSN given (any, where `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropRule {
    /// Sender to match.
    pub src: Option<IpAddr>,
    /// Opcode to match.
    pub opcode: Option<rnic_wire::Opcode>,
    /// PSN to match.
    pub psn: Option<rnic_wire::Psn>,
    /// How many matching datagrams to drop.
    pub times: u32,
}

impl DropRule {
    fn matches(&self, d: &Datagram) -> bool {
        if self.times == 0 || self.src.is_some_and(|s| s != d.src) {
            return false;
        }
        let Ok(p) = IbPacket::new_checked(&d.payload[..]) else {
            return false;
        };
        self.opcode.is_none_or(|o| o == p.bth().opcode())
            && self.psn.is_none_or(|q| q == p.bth().psn())
    }
}

/// What happened to a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Handed to the network.
    Sent,
    /// Dropped by the link.
    Lost,
    /// Dropped because the two ends are partitioned.
    Partitioned,
    /// A second copy was scheduled.
    Duplicated,
    /// One bit was flipped (its offset in the payload, and the bit).
    Corrupted {
        /// Byte offset in the payload.
        byte: usize,
        /// Bit mask within that byte.
        mask: u8,
    },
    /// Handed to the receiver.
    Delivered,
}

/// One line of the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEvent {
    /// When.
    pub time: Time,
    /// What happened.
    pub fate: Fate,
    /// Sender.
    pub src: IpAddr,
    /// Receiver.
    pub dst: IpAddr,
    /// The packet, decoded (opcode, QPN, PSN) as far as it parses.
    pub summary: String,
}

impl fmt::Display for TraceEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fate = match self.fate {
            Fate::Sent => "sent".to_string(),
            Fate::Lost => "LOST".to_string(),
            Fate::Partitioned => "LOST (partition)".to_string(),
            Fate::Duplicated => "DUPLICATED".to_string(),
            Fate::Corrupted { byte, mask } => format!("CORRUPTED (byte {byte}, bit {mask:#04x})"),
            Fate::Delivered => "delivered".to_string(),
        };
        write!(
            f,
            "{} {} > {} {} {}",
            self.time, self.src, self.dst, self.summary, fate
        )
    }
}

fn summarize(payload: &[u8]) -> String {
    match IbPacket::new_checked(payload) {
        Ok(p) => {
            let bth = p.bth();
            format!(
                "{} qp={:#08x} psn={:#08x}",
                p.info().name,
                bth.dest_qp(),
                bth.psn().value()
            )
        }
        Err(e) => format!("unparsable ({e})"),
    }
}

/// Counters of what the network did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NetStats {
    /// Datagrams handed in.
    pub sent: u64,
    /// Dropped by loss.
    pub lost: u64,
    /// Dropped by a partition.
    pub partitioned: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Copies with a flipped bit.
    pub corrupted: u64,
    /// Copies handed to receivers.
    pub delivered: u64,
}

/// The simulated network.
#[derive(Debug)]
pub struct Network {
    rng: Rng,
    default_link: LinkConfig,
    links: HashMap<(IpAddr, IpAddr), LinkConfig>,
    partitions: HashSet<(IpAddr, IpAddr)>,
    in_flight: BinaryHeap<Reverse<(Time, u64)>>,
    datagrams: HashMap<u64, Datagram>,
    seq: u64,
    trace: Option<Vec<TraceEvent>>,
    capture: Option<PcapWriter<Vec<u8>>>,
    rules: Vec<DropRule>,
    bottlenecks: HashMap<(IpAddr, IpAddr), Bottleneck>,
    stats: NetStats,
}

/// A link of limited bandwidth: datagrams leave one after another, each
/// after the one before it has been serialized, so a burst queues.
#[derive(Debug, Clone, Copy)]
struct Bottleneck {
    bytes_per_second: u64,
    /// When the link has finished sending what it was given so far.
    free_at: Time,
}

/// The frame a datagram travels in on a wire: Ethernet, IPv4 or IPv6 as an
/// unconnected `IP_PMTUDISC_DO` UDP socket sends it (DF, TTL 64, the IPv4
/// identification the datagram carries: 0, or its index in a UDP GSO send),
/// UDP to 4791 with checksum 0. Under that convention its ICRC verifies.
pub fn frame_of(d: &Datagram) -> Vec<u8> {
    let ident = d.ipv4_id;
    let ip_len = if d.src.is_ipv4() { 20 } else { 40 };
    let mut f = vec![0u8; 14 + ip_len + 8 + d.payload.len()];
    let eth = rnic_wire::encap::ethernet::Repr {
        dst: rnic_wire::encap::ethernet::MacAddr([2, 0, 0, 0, 0, mac_byte(d.dst)]),
        src: rnic_wire::encap::ethernet::MacAddr([2, 0, 0, 0, 0, mac_byte(d.src)]),
        vlan_tci: None,
    };
    let udp_len = 8 + d.payload.len();
    let ip_ok = match (d.src, d.dst) {
        (IpAddr::V4(s), IpAddr::V4(t)) => {
            let _ = eth.emit(&mut f, rnic_wire::encap::ethernet::ETHERTYPE_IPV4);
            let mut ip = rnic_wire::encap::ipv4::Repr::new(s, t);
            ip.ident = ident;
            ip.emit(&mut f[14..], udp_len).is_ok()
        }
        (IpAddr::V6(s), IpAddr::V6(t)) => {
            let _ = eth.emit(&mut f, rnic_wire::encap::ethernet::ETHERTYPE_IPV6);
            rnic_wire::encap::ipv6::Repr::new(s, t)
                .emit(&mut f[14..], udp_len)
                .is_ok()
        }
        _ => false,
    };
    if !ip_ok {
        return Vec::new();
    }
    let u = 14 + ip_len;
    f[u..u + 2].copy_from_slice(&d.src_port.to_be_bytes());
    f[u + 2..u + 4].copy_from_slice(&rnic_wire::ROCE_V2_PORT.to_be_bytes());
    f[u + 4..u + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    f[u + 8..].copy_from_slice(&d.payload);
    f
}

fn mac_byte(a: IpAddr) -> u8 {
    match a {
        IpAddr::V4(v) => v.octets()[3],
        IpAddr::V6(v) => v.octets()[15],
    }
}

impl Network {
    /// A network whose every random choice follows from `seed`; all links
    /// start as `default_link`. The trace is off (see [`Network::record_trace`]).
    pub fn new(seed: u64, default_link: LinkConfig) -> Network {
        Network {
            rng: Rng::new(seed),
            default_link,
            links: HashMap::new(),
            partitions: HashSet::new(),
            in_flight: BinaryHeap::new(),
            datagrams: HashMap::new(),
            seq: 0,
            trace: None,
            capture: None,
            rules: Vec::new(),
            bottlenecks: HashMap::new(),
            stats: NetStats::default(),
        }
    }

    /// Capture every datagram as it is sent (before loss, like a capture on
    /// the sender's side), as whole frames; see [`Network::pcap`].
    pub fn record_pcap(&mut self) {
        if self.capture.is_none() {
            // Writing to a Vec cannot fail.
            self.capture = PcapWriter::new(Vec::new(), 1).ok();
        }
    }

    /// The capture so far: a classic pcap file (Ethernet), which Wireshark and
    /// `rnic dump` read.
    pub fn pcap(&self) -> Vec<u8> {
        self.capture
            .as_ref()
            .map(|w| w.get_ref().clone())
            .unwrap_or_default()
    }

    /// Record every event from now on.
    pub fn record_trace(&mut self) {
        self.trace.get_or_insert_with(Vec::new);
    }

    /// The events recorded.
    pub fn trace(&self) -> &[TraceEvent] {
        self.trace.as_deref().unwrap_or(&[])
    }

    /// The counters.
    pub fn stats(&self) -> NetStats {
        self.stats
    }

    /// Set the link from `src` to `dst` (one direction).
    pub fn set_link(&mut self, src: IpAddr, dst: IpAddr, cfg: LinkConfig) {
        self.links.insert((src, dst), cfg);
    }

    /// Limit the link from `src` to `dst` (one direction) to
    /// `bytes_per_second` of UDP payload: a datagram leaves when the ones
    /// before it have been serialized, then takes the link's delay. A peer
    /// slower than its requester, a backlog that drains for longer than a
    /// timer, is modelled so. 0 removes the limit.
    pub fn set_bandwidth(&mut self, src: IpAddr, dst: IpAddr, bytes_per_second: u64) {
        if bytes_per_second == 0 {
            self.bottlenecks.remove(&(src, dst));
        } else {
            self.bottlenecks.insert(
                (src, dst),
                Bottleneck {
                    bytes_per_second,
                    free_at: Time::ZERO,
                },
            );
        }
    }

    /// When a datagram of `len` bytes handed to the link `src` to `dst` at
    /// `now` has left it.
    fn departure(&mut self, now: Time, src: IpAddr, dst: IpAddr, len: usize) -> Time {
        let Some(b) = self.bottlenecks.get_mut(&(src, dst)) else {
            return now;
        };
        let nanos = (len as u128 * 1_000_000_000).div_ceil(u128::from(b.bytes_per_second));
        let serialize = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        b.free_at = b.free_at.max(now) + serialize;
        b.free_at
    }

    /// Cut both directions between `a` and `b`: datagrams sent from now on are
    /// dropped (those already in flight still arrive).
    pub fn partition(&mut self, a: IpAddr, b: IpAddr) {
        self.partitions.insert((a, b));
        self.partitions.insert((b, a));
    }

    /// Add a scripted loss.
    pub fn drop_rule(&mut self, rule: DropRule) {
        self.rules.push(rule);
    }

    /// Undo [`Network::partition`].
    pub fn heal(&mut self, a: IpAddr, b: IpAddr) {
        self.partitions.remove(&(a, b));
        self.partitions.remove(&(b, a));
    }

    fn log(&mut self, time: Time, fate: Fate, d: &Datagram) {
        if let Some(trace) = &mut self.trace {
            trace.push(TraceEvent {
                time,
                fate,
                src: d.src,
                dst: d.dst,
                summary: summarize(&d.payload),
            });
        }
    }

    fn schedule(&mut self, now: Time, cfg: &LinkConfig, mut d: Datagram) {
        if !d.payload.is_empty() && self.rng.chance(cfg.corrupt) {
            let bit = self.rng.below(d.payload.len() as u64 * 8);
            let (byte, mask) = ((bit / 8) as usize, 1u8 << (bit % 8));
            d.payload[byte] ^= mask;
            self.stats.corrupted += 1;
            self.log(now, Fate::Corrupted { byte, mask }, &d);
        }
        let jitter = match u64::try_from(cfg.jitter.as_nanos()).unwrap_or(u64::MAX) {
            0 => 0,
            j => self.rng.below(j + 1),
        };
        let at = self.departure(now, d.src, d.dst, d.payload.len())
            + cfg.delay
            + Duration::from_nanos(jitter);
        self.seq += 1;
        self.in_flight.push(Reverse((at, self.seq)));
        self.datagrams.insert(self.seq, d);
    }

    /// Hand a datagram to the network at time `now`.
    pub fn send(&mut self, now: Time, d: Datagram) {
        self.stats.sent += 1;
        if let Some(w) = &mut self.capture {
            let _ = w.write_packet(now.as_nanos(), &frame_of(&d));
        }
        self.log(now, Fate::Sent, &d);
        if self.partitions.contains(&(d.src, d.dst)) {
            self.stats.partitioned += 1;
            self.log(now, Fate::Partitioned, &d);
            return;
        }
        if let Some(rule) = self.rules.iter_mut().find(|r| r.matches(&d)) {
            rule.times -= 1;
            self.stats.lost += 1;
            self.log(now, Fate::Lost, &d);
            return;
        }
        let cfg = *self
            .links
            .get(&(d.src, d.dst))
            .unwrap_or(&self.default_link);
        if self.rng.chance(cfg.loss) {
            self.stats.lost += 1;
            self.log(now, Fate::Lost, &d);
            return;
        }
        if self.rng.chance(cfg.duplicate) {
            self.stats.duplicated += 1;
            self.log(now, Fate::Duplicated, &d);
            self.schedule(now, &cfg, d.clone());
        }
        self.schedule(now, &cfg, d);
    }

    /// When the next datagram arrives, if any is in flight.
    pub fn next_arrival(&self) -> Option<Time> {
        self.in_flight.peek().map(|Reverse((t, _))| *t)
    }

    /// The next datagram due by `now`, in arrival order (ties in send order).
    pub fn pop_due(&mut self, now: Time) -> Option<(Time, Datagram)> {
        let &Reverse((at, seq)) = self.in_flight.peek()?;
        if at > now {
            return None;
        }
        self.in_flight.pop();
        let d = self.datagrams.remove(&seq)?;
        self.stats.delivered += 1;
        self.log(at, Fate::Delivered, &d);
        Some((at, d))
    }

    /// Datagrams still in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Datagrams from `src` still in flight.
    pub fn in_flight_from(&self, src: IpAddr) -> usize {
        self.datagrams.values().filter(|d| d.src == src).count()
    }
}

/// NICs on a simulated network, driven event by event on the virtual clock.
#[derive(Debug)]
pub struct Cluster {
    /// The virtual time.
    pub now: Time,
    /// The network.
    pub net: Network,
    /// The NICs; NIC `i` has address 10.0.0.(i+1).
    pub nics: Vec<crate::Nic>,
}

impl Cluster {
    /// `n` NICs on a network with `link` everywhere; all randomness from `seed`.
    pub fn new(seed: u64, link: LinkConfig, n: usize) -> Cluster {
        let nics = (0..n)
            .map(|i| {
                let addr = IpAddr::V4(core::net::Ipv4Addr::new(10, 0, 0, i as u8 + 1));
                crate::Nic::new(
                    addr,
                    seed.wrapping_add(i as u64 + 1).wrapping_mul(0x9E37_79B9),
                )
            })
            .collect();
        Cluster {
            now: Time::ZERO,
            net: Network::new(seed, link),
            nics,
        }
    }

    /// Hand everything the NICs want to send to the network.
    pub fn flush(&mut self) {
        for nic in &mut self.nics {
            while let Some(d) = nic.poll_transmit() {
                self.net.send(self.now, d);
            }
        }
    }

    /// The time of the next event (an arrival or a NIC timer).
    pub fn next_event(&self) -> Option<Time> {
        let timers = self.nics.iter().filter_map(crate::Nic::next_deadline).min();
        match (self.net.next_arrival(), timers) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Run the next event; false when nothing is left to happen.
    pub fn step(&mut self) -> bool {
        self.flush();
        let Some(t) = self.next_event() else {
            return false;
        };
        self.now = self.now.max(t);
        while let Some((_, d)) = self.net.pop_due(self.now) {
            if let Some(nic) = self.nics.iter_mut().find(|n| n.addrs().contains(&d.dst)) {
                nic.handle_datagram(self.now, &d);
            }
        }
        for nic in &mut self.nics {
            if nic.next_deadline().is_some_and(|d| d <= self.now) {
                nic.handle_timeout(self.now);
            }
        }
        self.flush();
        true
    }

    /// Run until nothing is left to happen or the clock passes `limit`; true
    /// if the cluster went idle. Bounded by `max_steps` events as well.
    pub fn run(&mut self, limit: Time, max_steps: u64) -> bool {
        for _ in 0..max_steps {
            self.flush();
            match self.next_event() {
                None => return true,
                Some(t) if t > limit => return false,
                Some(_) => {}
            }
            self.step();
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::Ipv4Addr;
    use rnic_wire::{bth, IbRepr, Opcode, Psn};

    const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));

    fn packet(psn: u32) -> Datagram {
        let mut ib = IbRepr::new(bth::Repr::new(Opcode::RC_SEND_ONLY, 0x11, Psn::new(psn)));
        ib.payload_len = 8;
        let mut buf = vec![0u8; ib.buffer_len()];
        ib.emit(&mut buf, &[7; 8]).unwrap();
        Datagram::new(A, B, 0xC000, buf)
    }

    /// Send `n` packets 1 us apart, then drain; returns the PSNs in arrival order.
    fn run(net: &mut Network, n: u32) -> Vec<u32> {
        for i in 0..n {
            net.send(Time(u64::from(i) * 1000), packet(i));
        }
        let mut out = Vec::new();
        while let Some(t) = net.next_arrival() {
            while let Some((_, d)) = net.pop_due(t) {
                let p = IbPacket::new_checked(&d.payload[..]);
                out.push(p.map(|p| p.bth().psn().value()).unwrap_or(u32::MAX));
            }
        }
        out
    }

    #[test]
    fn perfect_link_is_fifo_and_timed() {
        let mut net = Network::new(1, LinkConfig::perfect(Duration::from_micros(5)));
        net.send(Time(0), packet(1));
        assert_eq!(net.next_arrival(), Some(Time(5_000)));
        assert!(net.pop_due(Time(4_999)).is_none());
        assert_eq!(net.pop_due(Time(5_000)).unwrap().0, Time(5_000));
        assert_eq!(run(&mut net, 100), (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn same_seed_same_history() {
        let cfg = LinkConfig {
            loss: 0.2,
            duplicate: 0.1,
            corrupt: 0.05,
            delay: Duration::from_micros(3),
            jitter: Duration::from_micros(20),
        };
        let history = |seed| {
            let mut net = Network::new(seed, cfg);
            net.record_trace();
            let order = run(&mut net, 300);
            (
                order,
                net.trace()
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>(),
            )
        };
        assert_eq!(history(42), history(42));
        assert_ne!(history(42).0, history(43).0);
    }

    #[test]
    fn impairments_happen_at_their_rates() {
        let cfg = LinkConfig {
            loss: 0.3,
            duplicate: 0.1,
            corrupt: 0.1,
            delay: Duration::from_micros(1),
            jitter: Duration::from_micros(50),
        };
        let mut net = Network::new(7, cfg);
        let order = run(&mut net, 10_000);
        let s = net.stats();
        assert_eq!(s.sent, 10_000);
        assert!((2_700..3_300).contains(&s.lost), "{s:?}");
        assert!((500..900).contains(&s.duplicated), "{s:?}");
        assert_eq!(s.delivered, s.sent - s.lost + s.duplicated);
        assert_eq!(order.len() as u64, s.delivered);
        assert!(order.windows(2).any(|w| w[0] > w[1]), "jitter reorders");
        assert_eq!(net.in_flight(), 0);
    }

    #[test]
    fn corruption_flips_one_bit_the_icrc_sees() {
        // The datagrams carry no real ICRC here; compare with the original bytes.
        let cfg = LinkConfig {
            corrupt: 1.0,
            ..LinkConfig::default()
        };
        let mut net = Network::new(3, cfg);
        for i in 0..200 {
            let original = packet(i);
            net.send(Time(0), original.clone());
            let (_, got) = net.pop_due(Time(1_000_000)).unwrap();
            let flipped: u32 = original
                .payload
                .iter()
                .zip(&got.payload)
                .map(|(a, b)| (a ^ b).count_ones())
                .sum();
            assert_eq!(flipped, 1);
        }
    }

    #[test]
    fn partitions_and_healing() {
        let mut net = Network::new(5, LinkConfig::default());
        net.record_trace();
        net.partition(A, B);
        assert!(run(&mut net, 10).is_empty());
        assert_eq!(net.stats().partitioned, 10);
        net.heal(B, A);
        assert_eq!(run(&mut net, 10).len(), 10);
        assert!(net.trace()[1]
            .to_string()
            .contains("RC_SEND_ONLY qp=0x000011 psn=0x000000 LOST (partition)"));
    }

    #[test]
    fn a_bandwidth_limit_queues_a_burst() {
        let mut net = Network::new(11, LinkConfig::perfect(Duration::from_micros(5)));
        // A packet() carries 8 + 12 (BTH) + 4 (ICRC) = 24 bytes: 24 us each at 1 MB/s.
        let len = packet(0).payload.len() as u64;
        assert_eq!(len, 24);
        net.set_bandwidth(A, B, 1_000_000);
        for i in 0..3 {
            net.send(Time(0), packet(i));
        }
        let arrivals: Vec<Time> = (0..3)
            .map(|_| {
                let t = net.next_arrival().unwrap();
                net.pop_due(t).unwrap().0
            })
            .collect();
        assert_eq!(arrivals, [Time(29_000), Time(53_000), Time(77_000)]);
        // An idle link sends at once; the other direction is not limited.
        net.send(Time(1_000_000), packet(3));
        assert_eq!(net.next_arrival(), Some(Time(1_029_000)));
        net.pop_due(Time(1_029_000)).unwrap();
        net.send(
            Time(2_000_000),
            Datagram {
                src: B,
                dst: A,
                ..packet(4)
            },
        );
        assert_eq!(net.next_arrival(), Some(Time(2_005_000)));
        net.pop_due(Time(2_005_000)).unwrap();
        // 0 lifts the limit.
        net.set_bandwidth(A, B, 0);
        net.send(Time(3_000_000), packet(5));
        assert_eq!(net.next_arrival(), Some(Time(3_005_000)));
    }

    #[test]
    fn per_link_settings() {
        let mut net = Network::new(9, LinkConfig::default());
        net.set_link(
            A,
            B,
            LinkConfig {
                loss: 1.0,
                ..LinkConfig::default()
            },
        );
        assert!(run(&mut net, 5).is_empty());
        net.send(
            Time(0),
            Datagram {
                src: B,
                dst: A,
                ..packet(0)
            },
        );
        assert!(net.pop_due(Time(1_000_000)).is_some());
    }
}
