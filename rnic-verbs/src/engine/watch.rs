//! Whether the engine thread watches the socket, or leaves it to the
//! program's polling threads.
//!
//! A thread that polls an empty completion queue takes in packets itself
//! (`Engine::progress`), as a NIC's poll-mode driver would. The engine
//! thread, asleep in poll(2) on the same socket, is woken for each of those
//! packets all the same; and on a machine whose cores are all busy (two
//! programs spinning) each wake-up preempts someone: a ping-pong between two
//! processes on two cores takes several times as long with the engine
//! thread watching as with the pollers alone (the figures are in
//! `docs/performance.md`).
//!
//! But some programs never poll for what they wait on: ib_write_lat spins
//! on its buffer's last byte, perftest's bandwidth servers sleep on TCP, a
//! program sleeps on a completion channel. They need the engine thread. So
//! it learns which kind of program it serves:
//!
//! - It watches the socket until [`LEAVE_AFTER`] packets in a row were
//!   taken by polling threads, or by the engine thread while a thread was
//!   polling or posting (within [`POLLER_ACTIVE`]): those packets had a
//!   taker already. A thread that posts work counts as one that polls: it
//!   will poll for what it posted.
//!   (A packet a poller takes may still have woken the engine thread: the
//!   kernel wakes it, finds the socket empty and puts it back to sleep,
//!   unseen by it; so what counts is who took the packets.)
//! - Then it sleeps without the socket for as long as threads keep polling
//!   or posting, and for at most [`AWAY_MAX`] after the last poll or post.
//!   Timers still wake it. The longer the threads have kept at it, the
//!   longer it leaves the socket unwatched: as long as it has been away,
//!   from [`AWAY_MAX`] up to [`AWAY_LONGEST`]; back on the socket for any
//!   reason, it starts again from [`AWAY_MAX`]. Each wake-up preempts a
//!   program that spins (the engine thread runs in real time on its
//!   program's core), and on an emulated CPU a wake-up per millisecond
//!   slowed a ping-pong by more than half (see [`AWAY_LONGEST`]).
//! - A thread that polls or posts need not take packets in: a poll does
//!   only when it finds its queue empty. So at each look, while threads
//!   are about, the engine thread takes in whatever waits on the socket,
//!   and stays away: a packet waits at most a time away, whatever the
//!   program does. Unless the pollers took nothing since the look before
//!   and requests no completion shows were waiting ([`Watch::looked`]):
//!   then nothing but the engine thread takes packets in (a program that
//!   posts receives but never polls), and it comes back, as below.
//! - If, back on the socket, it finds waiting a request that no completion
//!   queue will ever show here (the last packet of a WRITE without
//!   immediate data, a READ or atomic request), a program needed it: it
//!   watches for a while, [`STAY_MIN`] the first time, twice as long each
//!   time it happens again (up to [`STAY_MAX`]), half as long after each
//!   time the pollers left with nothing of the kind waiting. A program that
//!   spins on memory between polls (ib_write_lat) so costs a packet
//!   [`AWAY_MAX`] a few times at its start, then rarely.
//! - ACKs, READ responses and SENDs that waited say nothing: they end in
//!   completions, and the next poll would have taken them. A polling thread
//!   held up for a scheduler tick (4 ms behind a real-time thread on two
//!   busy cores, as ib_write_bw's client is a few times a second) leaves
//!   them waiting; staying for that cost the bandwidth client a wake-up
//!   per packet batch, half a core, for the rest of its run.
//! - Arming a completion queue for an event (or sleeping in
//!   [`CompletionQueue::wait`](crate::CompletionQueue::wait)) says a thread
//!   is about to sleep: the engine watches for a while, woken at once if it
//!   was away.
//!
//! So nothing waits longer than [`AWAY_LONGEST`] for the engine thread
//! (and [`AWAY_MAX`] unless the program polled without a break for a few
//! milliseconds before); a program that polls pays a wake-up every
//! [`AWAY_LONGEST`].

/// A thread that polled an empty queue (or posted) this recently is
/// polling (ns).
pub const POLLER_ACTIVE: u64 = 500_000;
/// Packets in a row that a polling thread took or could have taken, before
/// the engine thread leaves the socket to the pollers.
pub const LEAVE_AFTER: u64 = 64;
/// How long the socket goes unwatched after the last poll or post (ns),
/// when the engine thread has just left it to pollers.
pub const AWAY_MAX: u64 = 1_000_000;
/// The longest the socket goes unwatched after the last poll or post (ns),
/// once the engine thread has been away that long.
///
/// Why this long: in the rdma_rxe VM (two emulated vCPUs, both programs
/// of a ping-pong spinning), a wake-up per millisecond had each engine
/// thread preempt its program over a thousand times a second, and half a
/// round trip took more than twice as long as with a look every 8 ms (the
/// figures are in `docs/performance.md`).
pub const AWAY_LONGEST: u64 = 8_000_000;
/// How long the engine thread watches, at least, once a packet waited for
/// it or a thread said it would sleep (ns).
pub const STAY_MIN: u64 = 10_000_000;
/// The longest it watches before leaving the socket to pollers again (ns).
pub const STAY_MAX: u64 = 10_000_000_000;

/// The engine thread's choice, from what it has seen (all times in ns on
/// the engine's clock).
#[derive(Debug)]
pub struct Watch {
    /// Packets in a row that a polling thread took or could have taken.
    needless: u64,
    /// Watch at least until then.
    stay_until: u64,
    /// The last sleep left the socket to the pollers.
    was_away: bool,
    /// How long to watch after the next packet that waited.
    stay: u64,
    /// A thread said it would sleep until a completion: watch for
    /// everything (RC responses too) until then.
    sleeper_until: u64,
    /// Since when the engine thread has left the socket to pollers without
    /// coming back (see [`Watch::away_for`]).
    away_since: Option<u64>,
}

impl Default for Watch {
    fn default() -> Watch {
        Watch {
            needless: 0,
            stay_until: 0,
            was_away: false,
            stay: STAY_MIN,
            sleeper_until: 0,
            away_since: None,
        }
    }
}

impl Watch {
    /// Whether to sleep without the socket now, given when a thread last
    /// polled an empty queue or posted (`None`: never) and the longest the
    /// socket may go unwatched after that (`AWAY_MAX`, longer in tests).
    pub fn away(&self, now: u64, last_active: Option<u64>, away_max: u64) -> bool {
        self.needless >= LEAVE_AFTER
            && now >= self.stay_until
            && last_active.is_some_and(|p| now.saturating_sub(p) < away_max)
    }

    /// How long the socket may go unwatched after the last poll or post at
    /// `now`, given the shortest (`AWAY_MAX`, longer in tests): as long as
    /// the engine thread has been away without coming back, at least the
    /// shortest, at most [`AWAY_LONGEST`] (or the shortest, if longer).
    /// So it looks after 1 ms and again 1 ms later, then after 2 and 4 ms,
    /// then every 8 ms, whatever else (a timer) woke it meanwhile.
    pub fn away_for(&self, now: u64, shortest: u64) -> u64 {
        let away = self.away_since.map_or(0, |t| now.saturating_sub(t));
        away.clamp(shortest, shortest.max(AWAY_LONGEST))
    }

    /// The engine thread is about to sleep at `now`: `away` as
    /// [`Watch::away`] said. Watching the socket, it starts again from the
    /// shortest time away.
    pub fn sleeping(&mut self, away: bool, now: u64) {
        self.was_away = away;
        if !away {
            self.away_since = None;
        } else if self.away_since.is_none() {
            self.away_since = Some(now);
        }
    }

    /// Polling threads took `n` packets.
    pub fn pollers_took(&mut self, n: u64) {
        self.needless = self.needless.saturating_add(n);
    }

    /// The engine thread took `n` packets off the socket it watched; a
    /// thread last polled or posted at `last_active`.
    pub fn engine_took(&mut self, n: usize, now: u64, last_active: Option<u64>) {
        if n == 0 {
            return;
        }
        if last_active.is_some_and(|p| now.saturating_sub(p) < POLLER_ACTIVE) {
            self.needless = self.needless.saturating_add(1);
        } else {
            self.needless = 0;
        }
    }

    /// Whether a thread polled or posted recently enough that it may be taking
    /// packets: the engine thread then looks at the count at least this
    /// often, even with nothing to do.
    pub fn pollers_about(now: u64, last_active: Option<u64>) -> bool {
        last_active.is_some_and(|p| now.saturating_sub(p) < AWAY_MAX)
    }

    /// Back on the socket after sleeping away from it: `waiting` requests
    /// that end without a completion here were there. Returns whether it
    /// stays to watch for such requests.
    pub fn back(&mut self, now: u64, waiting: usize) -> bool {
        if !std::mem::take(&mut self.was_away) {
            return false;
        }
        if waiting > 0 {
            self.stay(now);
            self.stay = (self.stay * 2).min(STAY_MAX);
            true
        } else {
            self.stay = (self.stay / 2).max(STAY_MIN);
            false
        }
    }

    /// At a look while away, the engine thread took in `waiting` requests
    /// that no completion shows, which waited through the time away, and
    /// polling threads took `pollers_took` packets since the look before.
    /// If they took none, nothing takes packets in but the engine thread
    /// (a program that posts but does not poll), and requests wait for it:
    /// it comes back to watch, as [`Watch::back`] says. Requests that the
    /// pollers were taking packets around (a ping-pong's, found a moment
    /// before its next poll) say nothing. Returns whether it stays.
    pub fn looked(&mut self, now: u64, waiting: usize, pollers_took: u64) -> bool {
        waiting > 0 && pollers_took == 0 && self.back(now, waiting)
    }

    /// Watch from `now` for the current stay, and learn again after it.
    pub fn stay(&mut self, now: u64) {
        self.needless = 0;
        self.stay_until = now.saturating_add(self.stay);
    }

    /// A thread said at `now` it would sleep until a completion: stay, and
    /// watch for RC responses too, which end in the completion it waits
    /// for.
    pub fn sleeper(&mut self, now: u64) {
        self.stay(now);
        self.sleeper_until = self.stay_until;
    }

    /// Whether it watches because a request waited for it (a program that
    /// spins on memory), or a thread said it would sleep, until a while
    /// after `now`.
    pub fn staying(&self, now: u64) -> bool {
        now < self.stay_until
    }

    /// Whether a thread that said it would sleep may still be waiting.
    pub fn sleeper_about(&self, now: u64) -> bool {
        now < self.sleeper_until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `LEAVE_AFTER` packets taken by pollers, from `t`.
    fn learn(w: &mut Watch, t: u64) {
        for i in 0..LEAVE_AFTER / 2 {
            w.pollers_took(1);
            w.engine_took(1, t + i * 1_000, Some(t + i * 1_000 - 500));
        }
    }

    #[test]
    fn watches_until_pollers_have_taken_the_packets_many_times_in_a_row() {
        let mut w = Watch::default();
        let t = 10_000_000;
        assert!(!w.away(t, Some(t - 1), AWAY_MAX), "a new engine watches");
        w.pollers_took(LEAVE_AFTER - 2);
        w.engine_took(1, t, Some(t - 1));
        w.engine_took(0, t, Some(t - 1));
        assert!(
            !w.away(t + 100, Some(t + 99), AWAY_MAX),
            "one short of the count"
        );
        // A packet the engine took with no poller about starts it again.
        w.engine_took(1, t + 200, Some(t + 200 - POLLER_ACTIVE));
        w.pollers_took(1);
        assert!(!w.away(t + 400, Some(t + 399), AWAY_MAX));
        learn(&mut w, t + 1_000);
        let now = t + 1_000 + LEAVE_AFTER * 1_000;
        assert!(w.away(now, Some(now - 10), AWAY_MAX));
    }

    #[test]
    fn away_only_while_threads_poll_and_never_longer_than_away_max() {
        let mut w = Watch::default();
        learn(&mut w, 5_000_000);
        let p = 6_000_000;
        assert!(w.away(p + 1, Some(p), AWAY_MAX));
        assert!(w.away(p + AWAY_MAX - 1, Some(p), AWAY_MAX));
        assert!(
            !w.away(p + AWAY_MAX, Some(p), AWAY_MAX),
            "the pollers went quiet"
        );
        assert!(!w.away(p, None, AWAY_MAX), "nobody ever polled");
    }

    #[test]
    fn a_packet_that_waited_brings_the_engine_back_for_longer_each_time() {
        let mut w = Watch::default();
        let mut t = 5_000_000;
        learn(&mut w, t);
        t += 1_000_000;
        assert!(w.away(t, Some(t - 10), AWAY_MAX));
        w.sleeping(true, 0);
        // Nothing waited: the pollers took everything.
        assert!(!w.back(t + AWAY_MAX, 0));
        assert!(w.away(t + AWAY_MAX + 20, Some(t + AWAY_MAX + 10), AWAY_MAX));
        // A packet waited (a program spinning on memory, say), again and
        // again: the engine stays STAY_MIN, then twice that, ...
        for stay in [STAY_MIN, 2 * STAY_MIN, 4 * STAY_MIN] {
            w.sleeping(true, 0);
            t += 3 * AWAY_MAX;
            assert!(w.back(t, 1));
            assert!(!w.away(t + 10, Some(t + 5), AWAY_MAX));
            assert!(!w.away(t + stay - 1, Some(t + stay - 2), AWAY_MAX));
            // After the stay it must learn again before it leaves.
            assert!(!w.away(t + stay, Some(t + stay - 1), AWAY_MAX));
            learn(&mut w, t + stay);
            t += stay + LEAVE_AFTER * 1_000;
            assert!(w.away(t, Some(t - 1), AWAY_MAX), "{stay}");
        }
        // Pollers that leave with nothing waiting halve it.
        w.sleeping(true, 0);
        w.back(t + AWAY_MAX, 0);
        w.sleeping(true, 0);
        t += 3 * AWAY_MAX;
        w.back(t, 1);
        assert!(!w.away(t + 4 * STAY_MIN - 1, Some(t + 4 * STAY_MIN - 2), AWAY_MAX));
        learn(&mut w, t + 4 * STAY_MIN);
        assert!(w.away(t + 5 * STAY_MIN, Some(t + 5 * STAY_MIN - 1), AWAY_MAX));
    }

    /// A request taken in at a look, while away, brings the engine back
    /// only if the pollers took nothing since the look before.
    #[test]
    fn a_request_taken_at_a_look_brings_the_engine_back_if_nobody_polled() {
        let mut w = Watch::default();
        let t = 5_000_000;
        learn(&mut w, t);
        let t = t + 1_000_000;
        w.sleeping(true, t);
        assert!(!w.looked(t + AWAY_MAX, 1, 5), "the pollers take packets in");
        assert!(!w.looked(t + AWAY_MAX, 0, 0), "only completions waited");
        assert!(w.away(t + AWAY_MAX + 1, Some(t + AWAY_MAX), AWAY_MAX));
        assert!(w.looked(t + 2 * AWAY_MAX, 2, 0));
        assert!(!w.away(t + 2 * AWAY_MAX + 1, Some(t + 2 * AWAY_MAX), AWAY_MAX));
        assert!(w.staying(t + 2 * AWAY_MAX + STAY_MIN - 1));
    }

    #[test]
    fn the_longer_the_engine_has_been_away_the_longer_it_stays_away() {
        let mut w = Watch::default();
        let t = 5_000_000;
        assert_eq!(w.away_for(t, AWAY_MAX), AWAY_MAX);
        w.sleeping(true, t);
        // Each look: after 1 ms, 2, 4, 8, then every 8 ms; a timer that
        // woke it between looks changes nothing.
        let mut now = t;
        for want in [AWAY_MAX, AWAY_MAX, 2 * AWAY_MAX, 4 * AWAY_MAX, AWAY_LONGEST] {
            assert_eq!(w.away_for(now, AWAY_MAX), want, "{}", now - t);
            now += want;
            w.sleeping(true, now - want / 2);
        }
        assert_eq!(
            w.away_for(now + 1_000 * AWAY_LONGEST, AWAY_MAX),
            AWAY_LONGEST,
            "bounded"
        );
        // Back on the socket, for whatever reason: from the shortest again.
        w.sleeping(false, now);
        assert_eq!(w.away_for(now + AWAY_LONGEST, AWAY_MAX), AWAY_MAX);
        w.sleeping(true, now + AWAY_LONGEST);
        assert_eq!(w.away_for(now + AWAY_LONGEST, AWAY_MAX), AWAY_MAX);
        // A test's shortest, longer than the longest, is kept as it is.
        let long = 60 * AWAY_LONGEST;
        assert_eq!(w.away_for(now + 2 * long, long), long);
    }

    #[test]
    fn the_stay_is_bounded() {
        let mut w = Watch::default();
        for i in 0..64 {
            w.sleeping(true, 0);
            w.back(i, 1);
        }
        assert_eq!(w.stay, STAY_MAX);
    }

    #[test]
    fn packets_found_after_watching_are_not_counted_as_waiting() {
        let mut w = Watch::default();
        learn(&mut w, 5_000_000);
        w.sleeping(false, 0);
        w.back(7_000_000, 5);
        assert!(
            w.away(7_000_010, Some(7_000_000), AWAY_MAX),
            "it was not away"
        );
    }

    #[test]
    fn a_sleeper_keeps_the_engine_watching() {
        let mut w = Watch::default();
        learn(&mut w, 5_000_000);
        w.stay(6_000_000);
        assert!(!w.away(6_000_010, Some(6_000_000), AWAY_MAX));
        let end = 6_000_000 + STAY_MIN;
        assert!(!w.away(end - 1, Some(end - 2), AWAY_MAX));
    }
}
