//! Impairment of a NIC's own egress on the real transport: loss,
//! duplication, reordering, corruption and delay, drawn from a seeded
//! generator, for testing what runs on rnic against a bad network without
//! one (the simulator's links, on real sockets). Set through
//! [`crate::Device::set_impairment`], `RNIC_IMPAIR` (the drop-in reads it
//! too) or `rnic perf --impair`.
//!
//! Each datagram the NIC sends is, independently: dropped with probability
//! `loss`; otherwise sent twice with probability `dup`; each copy has one
//! bit the ICRC covers flipped with probability `corrupt` (the receiver's
//! ICRC check then drops it) and is held back [`REORDER_HOLD`] with probability `reorder`, so that the
//! datagrams after it overtake it; and every datagram is held `delay`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rnic_core::rng::Rng;
use rnic_core::time::Time;
use rnic_core::Datagram;

/// How long a reordered datagram is held beyond the delay.
pub const REORDER_HOLD: Duration = Duration::from_micros(200);

/// What to do to a NIC's egress.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Impairment {
    /// Probability that a datagram is dropped.
    pub loss: f64,
    /// Probability that a datagram is sent twice.
    pub duplicate: f64,
    /// Probability that a datagram is held back [`REORDER_HOLD`].
    pub reorder: f64,
    /// Probability that one bit of a datagram is flipped.
    pub corrupt: f64,
    /// Held before every datagram leaves.
    pub delay: Duration,
    /// The generator's seed: the same seed, the same choices (the timing of
    /// a real run still varies).
    pub seed: u64,
}

impl Impairment {
    /// Whether it does anything.
    pub fn is_none(&self) -> bool {
        self.loss == 0.0
            && self.duplicate == 0.0
            && self.reorder == 0.0
            && self.corrupt == 0.0
            && self.delay.is_zero()
    }
}

/// A malformed impairment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (expected loss=P,dup=P,reorder=P,corrupt=P,delay=D,seed=N; P as 5% or 0.05, D as 1ms or 200us)",
            self.0
        )
    }
}

impl std::error::Error for ParseError {}

fn probability(key: &str, v: &str) -> Result<f64, ParseError> {
    let p = match v.strip_suffix('%') {
        Some(pct) => pct.parse::<f64>().map(|x| x / 100.0),
        None => v.parse::<f64>(),
    }
    .map_err(|_| ParseError(format!("{key}={v}: not a probability")))?;
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(ParseError(format!("{key}={v}: not between 0 and 100%")))
    }
}

fn duration(key: &str, v: &str) -> Result<Duration, ParseError> {
    let bad = || ParseError(format!("{key}={v}: not a duration"));
    let (num, unit) = v
        .find(|c: char| c.is_ascii_alphabetic())
        .map_or((v, "ms"), |i| v.split_at(i));
    let n: u64 = num.parse().map_err(|_| bad())?;
    match unit {
        "us" => Ok(Duration::from_micros(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        _ => Err(bad()),
    }
}

impl FromStr for Impairment {
    type Err = ParseError;

    /// `loss=5%,dup=1%,reorder=2%,corrupt=0.1%,delay=1ms,seed=7`, any
    /// subset, in any order.
    fn from_str(s: &str) -> Result<Impairment, ParseError> {
        let mut i = Impairment::default();
        for item in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| ParseError(format!("{item}: no '='")))?;
            match k {
                "loss" => i.loss = probability(k, v)?,
                "dup" | "duplicate" => i.duplicate = probability(k, v)?,
                "reorder" => i.reorder = probability(k, v)?,
                "corrupt" => i.corrupt = probability(k, v)?,
                "delay" => i.delay = duration(k, v)?,
                "seed" => {
                    i.seed = v
                        .parse()
                        .map_err(|_| ParseError(format!("{item}: not a number")))?
                }
                _ => return Err(ParseError(format!("{k}: unknown"))),
            }
        }
        Ok(i)
    }
}

/// What the impairment did so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImpairStats {
    /// Datagrams the NIC handed over.
    pub offered: u64,
    /// Dropped.
    pub lost: u64,
    /// Sent a second time.
    pub duplicated: u64,
    /// One bit flipped.
    pub corrupted: u64,
    /// Held back to be overtaken.
    pub reordered: u64,
}

/// The impairment applied: datagrams held until their time.
#[derive(Debug)]
pub(crate) struct Impairer {
    cfg: Impairment,
    rng: Rng,
    held: BinaryHeap<Reverse<(Time, u64)>>,
    datagrams: HashMap<u64, Datagram>,
    seq: u64,
    pub stats: ImpairStats,
}

impl Impairer {
    pub fn new(cfg: Impairment) -> Impairer {
        Impairer {
            cfg,
            rng: Rng::new(cfg.seed ^ 0x696D_7061_6972),
            held: BinaryHeap::new(),
            datagrams: HashMap::new(),
            seq: 0,
            stats: ImpairStats::default(),
        }
    }

    /// Hand a datagram over at `now`: what may leave at once goes to `out`,
    /// the rest is held; a dropped one's buffer goes to `spent`.
    pub fn offer(
        &mut self,
        now: Time,
        d: Datagram,
        out: &mut Vec<Datagram>,
        spent: &mut Vec<Vec<u8>>,
    ) {
        self.stats.offered += 1;
        if self.rng.chance(self.cfg.loss) {
            self.stats.lost += 1;
            spent.push(d.payload);
            return;
        }
        if self.rng.chance(self.cfg.duplicate) {
            self.stats.duplicated += 1;
            self.pass(now, d.clone(), out);
        }
        self.pass(now, d, out);
    }

    /// One copy over the link: perhaps one bit flipped, then sent at once
    /// or held. Each copy on its own, as two trips over a link would be.
    fn pass(&mut self, now: Time, mut d: Datagram, out: &mut Vec<Datagram>) {
        // The flipped bit is one the ICRC covers: the BTH's reserved byte is
        // masked out of it by design, and a flip there changes nothing.
        if d.payload.len() > 1 && self.rng.chance(self.cfg.corrupt) {
            self.stats.corrupted += 1;
            let mut byte = self.rng.below(d.payload.len() as u64 - 1);
            if byte >= rnic_wire::bth::RESV8A_OFFSET as u64 {
                byte += 1;
            }
            let bit = self.rng.below(8);
            d.payload[byte as usize] ^= 1 << bit;
        }
        let mut hold = self.cfg.delay;
        if self.rng.chance(self.cfg.reorder) {
            self.stats.reordered += 1;
            hold += REORDER_HOLD;
        }
        if hold.is_zero() {
            out.push(d);
        } else {
            self.seq += 1;
            self.held.push(Reverse((now + hold, self.seq)));
            self.datagrams.insert(self.seq, d);
        }
    }

    /// Move the datagrams whose time has come to `out`, in order.
    pub fn release(&mut self, now: Time, out: &mut Vec<Datagram>) {
        while let Some(&Reverse((t, seq))) = self.held.peek() {
            if t > now {
                break;
            }
            self.held.pop();
            if let Some(d) = self.datagrams.remove(&seq) {
                out.push(d);
            }
        }
    }

    /// When the next held datagram may leave.
    pub fn next_release(&self) -> Option<Time> {
        self.held.peek().map(|&Reverse((t, _))| t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impairments_parse_and_refuse_nonsense() {
        let i: Impairment = "loss=5%,dup=1%,reorder=2%,corrupt=0.1%,delay=3ms,seed=9"
            .parse()
            .unwrap();
        assert_eq!(
            i,
            Impairment {
                loss: 0.05,
                duplicate: 0.01,
                reorder: 0.02,
                corrupt: 0.001,
                delay: Duration::from_millis(3),
                seed: 9,
            }
        );
        assert_eq!("loss=0.5".parse::<Impairment>().unwrap().loss, 0.5);
        assert_eq!(
            "delay=200us".parse::<Impairment>().unwrap().delay,
            Duration::from_micros(200)
        );
        assert!("".parse::<Impairment>().unwrap().is_none());
        for bad in [
            "loss=150%",
            "loss=x",
            "jitter=1ms",
            "loss",
            "delay=3h",
            "seed=-1",
        ] {
            assert!(bad.parse::<Impairment>().is_err(), "{bad}");
        }
    }

    fn datagram(k: u8) -> Datagram {
        let nowhere = std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
        Datagram::new(nowhere, nowhere, 0, vec![k; 64])
    }

    /// 10,000 datagrams, 1 us apart, through an impairment of `cfg`.
    fn offer_many(cfg: Impairment) -> (Impairer, Vec<Datagram>, Vec<Vec<u8>>) {
        let mut imp = Impairer::new(cfg);
        let (mut out, mut spent) = (Vec::new(), Vec::new());
        for k in 0..10_000u32 {
            imp.offer(
                Time(u64::from(k) * 1_000),
                datagram(k as u8),
                &mut out,
                &mut spent,
            );
        }
        (imp, out, spent)
    }

    #[test]
    fn each_impairment_happens_at_its_rate_and_held_ones_leave_in_time() {
        let cfg: Impairment = "loss=10%,dup=5%,reorder=20%,corrupt=10%,seed=3"
            .parse()
            .unwrap();
        let (mut imp, mut out, spent) = offer_many(cfg);
        let s = imp.stats;
        assert_eq!(s.offered, 10_000);
        assert!((900..1100).contains(&s.lost), "{s:?}");
        assert_eq!(spent.len() as u64, s.lost);
        assert!((350..600).contains(&s.duplicated), "{s:?}");
        assert!((800..1100).contains(&s.corrupted), "{s:?}");
        assert!((1600..2200).contains(&s.reordered), "{s:?}");
        // Every copy leaves: at once, or once its time has come.
        let held = imp.held.len() as u64;
        assert_eq!(out.len() as u64 + held, s.offered - s.lost + s.duplicated);
        assert_eq!(held, s.reordered);
        let first = imp.next_release().unwrap();
        let last = imp.held.iter().map(|r| r.0 .0).max().unwrap();
        imp.release(Time(first.0 - 1), &mut out);
        assert_eq!(imp.held.len() as u64, held, "nothing before its time");
        imp.release(Time(last.0 - 1), &mut out);
        assert!(!imp.held.is_empty() && imp.held.iter().all(|r| r.0 .0 == last));
        imp.release(last, &mut out);
        assert!(imp.held.is_empty() && imp.datagrams.is_empty());
        // Corrupted copies differ from what was offered by one bit.
        let flipped = out
            .iter()
            .filter(|d| d.payload.iter().any(|&b| b != d.payload[0]) || d.payload.is_empty())
            .count();
        assert!(flipped > 0);
        // The same seed makes the same choices.
        assert_eq!(offer_many(cfg).0.stats, s);
    }
}
