//! Time as a value: the core never reads a clock. The driver passes the time of
//! each event; the simulator passes its virtual clock.

use core::fmt;
use core::ops::{Add, Sub};
use std::time::Duration;

/// A point in time, in nanoseconds since an arbitrary origin chosen by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(pub u64);

impl Time {
    /// The origin.
    pub const ZERO: Time = Time(0);

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time elapsed since `earlier` (zero if `earlier` is later).
    pub fn since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, d: Duration) -> Time {
        Time(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}

impl Sub<Time> for Time {
    type Output = Duration;
    fn sub(self, rhs: Time) -> Duration {
        self.since(rhs)
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:06}",
            self.0 / 1_000_000_000,
            self.0 % 1_000_000_000 / 1000
        )
    }
}

/// The local ACK timeout for the QP attribute `timeout` (IBTA 9.7.6.1.3):
/// 4.096 us x 2^timeout, to the nanosecond; `None` for 0, which means "wait
/// forever". Values above 31 are treated as 31.
pub fn local_ack_timeout(timeout: u8) -> Option<Duration> {
    match timeout {
        0 => None,
        t => Some(Duration::from_nanos(4096u64 << u32::from(t.min(31)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_timeouts() {
        assert_eq!(local_ack_timeout(0), None);
        assert_eq!(local_ack_timeout(1), Some(Duration::from_nanos(8_192)));
        // timeout 14 = 67.108864 ms: rdma_rxe's retransmissions every ~68 ms
        // (rxe-rc-retransmits.pcap).
        assert_eq!(
            local_ack_timeout(14),
            Some(Duration::from_nanos(67_108_864))
        );
        assert_eq!(
            local_ack_timeout(31),
            Some(Duration::from_nanos(4096 << 31))
        );
        assert_eq!(local_ack_timeout(200), local_ack_timeout(31));
    }

    #[test]
    fn arithmetic_saturates() {
        let t = Time(u64::MAX - 5) + Duration::from_secs(1);
        assert_eq!(t, Time(u64::MAX));
        assert_eq!(Time(5) - Time(9), Duration::ZERO);
        assert_eq!(Time(1_500_000_000).to_string(), "1.500000");
    }
}
