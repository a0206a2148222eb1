//! When the engine holds what the NIC queued instead of sending it at once.
//!
//! Two things wait:
//!
//! - While the engine thread leaves the socket to polling threads, what a
//!   post (or a poll that delivered a completion) produced waits for the
//!   next poll that finds its queue empty (see [`super::Engine::post`] and
//!   [`super::Engine::progress`]): a burst posted and then polled for
//!   leaves in one system call.
//! - Plain ACKs wait for the program's answer, if it has shown that it
//!   answers what it takes in ([`Hold::hold_for_answer`]).
//!
//! [`Hold`] is the policy alone, on the engine's clock: what the NIC has
//! queued is the caller's to say.

use rnic_core::time::Time;

/// The longest ACKs wait for the program's answer (ns): a ping-pong's
/// answer held up by the scheduler still takes them along, and a program
/// that stops answering delays one ACK by this much, no more than the
/// engine thread's first time away delays what its posts left for its
/// next poll (`watch::AWAY_MAX`). A requester's ACK timeout is
/// milliseconds (4.096 us x 2^timeout, 14 to 19 being the usual settings).
pub const ANSWER_WAIT: u64 = super::watch::AWAY_MAX;
/// How many times its usual answer time ACKs wait for a program's answer
/// (if that is longer than [`ANSWER_WAIT`]).
const ANSWER_SLACK: u64 = 16;
/// The longest ACKs wait for an answer however slow the program (ns):
/// well inside the usual requesters' ACK timeouts (67 ms and up).
pub const ANSWER_WAIT_MAX: u64 = 8_000_000;
/// How many polls that found their queue empty may come between a batch
/// that left ACKs and the post that answers it: a program that polls
/// several queues in a loop (UCX polls the send and the receive queue of
/// each transport it uses) polls the others, empty, between taking a
/// request in and posting its answer. Counted as no answer, such a
/// program never had its ACKs held: each left alone, in a system call of
/// its own, and the peer took it in alone (ucx_perftest's tag_lat took a
/// quarter longer; the figures are in `docs/performance.md`).
pub const ANSWER_POLLS: u64 = 4;
/// The most [`Hold::answers`] counts up to: a program that has answered
/// quickly for a while keeps its ACKs waiting through a few slow answers.
const ANSWER_SCORE: u8 = 8;

/// What is held, and what the engine has learned of the program's answers.
#[derive(Debug)]
pub(super) struct Hold {
    /// Since when datagrams a post, or a poll that took in a completion,
    /// produced wait for the next poll, or ACKs for the program's answer.
    since: Option<Time>,
    /// What is held is plain ACKs alone, waiting for the program's answer
    /// (see [`Hold::hold_for_answer`]).
    for_answer: bool,
    /// How well the program answers the requests it takes in (0 to
    /// [`ANSWER_SCORE`]): up by one for each post that sends after a
    /// batch left ACKs to send and before the program polled an empty
    /// queue since (what a ping-pong does: it answers what it was handed,
    /// on any CPU, however fast), down by one for a later one that took held
    /// ACKs along, to 0 when held ACKs waited in vain. ACKs wait for an
    /// answer while it is above 0.
    answers: u8,
    /// Polls that found nothing to take in and nothing to send, ever.
    empty_polls: u64,
    /// `empty_polls` when a batch taken in last left ACKs to send, until
    /// a post counted it.
    acked_after: Option<u64>,
    /// When that batch was taken in.
    acked_at: Time,
    /// How long the program takes to answer (ns): a moving average of
    /// the time from a batch that left ACKs to the post that answered it.
    answer_time: u64,
    /// The shortest wait for an answer: [`ANSWER_WAIT`], or another in a
    /// test (see [`Hold::answer_wait`]).
    min_wait: u64,
}

impl Default for Hold {
    fn default() -> Hold {
        Hold {
            since: None,
            for_answer: false,
            answers: 0,
            empty_polls: 0,
            acked_after: None,
            acked_at: Time(0),
            answer_time: 0,
            min_wait: ANSWER_WAIT,
        }
    }
}

impl Hold {
    /// What was held leaves now, at `now` (a pump sends everything). If it
    /// was ACKs held for an answer that never came, the program is taken
    /// not to answer: the next ACKs leave at once.
    pub fn release(&mut self, now: Time) {
        if self.for_answer && self.due().is_some_and(|t| t <= now) {
            self.answers = 0;
            tracing::debug!("ACKs waited for an answer in vain: they leave at once from now on");
        }
        self.since = None;
        self.for_answer = false;
    }

    /// A batch taken in at `now` left plain ACKs alone to send: the next
    /// post that sends something is the program's answer to it, unless the
    /// program polls an empty queue first.
    pub fn acks_left(&mut self, now: Time) {
        self.acked_after = Some(self.empty_polls);
        self.acked_at = now;
    }

    /// Whether the program has shown that it answers what it takes in:
    /// ACKs then wait for its answer.
    pub fn expects_answer(&self) -> bool {
        self.answers > 0
    }

    /// Hold the queued ACKs, from `now`, for the program's answer: its next
    /// post that sends something sends them behind it, in one system call;
    /// a poll does not, and they leave on their own
    /// [`Hold::answer_wait`] after they were held (and the engine unlearns
    /// that the program answers).
    ///
    /// Why: a program that spins on memory for the peer's WRITE (a
    /// ping-pong such as ib_write_lat) polls its completion queue only
    /// for its own WRITE's ACK. Sent at once, the ACK of the peer's
    /// request arrives alone, the peer stops polling, and its next
    /// request lands in a socket nobody polls: an engine thread must wake
    /// for it, on each side, every round trip. Behind the answer, it
    /// arrives with the next request, which the peer's poll for that ACK
    /// takes in: a round trip runs on the two polling threads alone.
    /// TCP's delayed ACK does the same, for the same reason. Nothing is
    /// lost: the requester's ACK timeout is milliseconds, and a later ACK
    /// carries what an earlier one did.
    pub fn hold_for_answer(&mut self, now: Time) {
        if self.since.is_none() {
            self.since = Some(now);
            self.for_answer = true;
        }
    }

    /// Leave what the NIC has queued for the next poll, from `now`, if
    /// anything is queued (`queued`). What is held stays held for an
    /// answer only while it is plain ACKs alone (`only_acks`).
    pub fn hold(&mut self, now: Time, queued: bool, only_acks: bool) {
        if self.since.is_none() && queued {
            self.since = Some(now);
        }
        self.for_answer &= only_acks;
    }

    /// A post that sends something came (`now` is read only if it
    /// counts): score it, by how many empty queues the program polled
    /// since the last batch that left ACKs to send (see `answers`).
    pub fn posted(&mut self, now: impl FnOnce() -> Time) {
        let Some(acked) = self.acked_after.take() else {
            return;
        };
        let was = self.answers;
        if self.empty_polls - acked <= ANSWER_POLLS {
            self.answers = (self.answers + 1).min(ANSWER_SCORE);
            // One answer held up (the program descheduled, or busy with
            // something else) moves the average by an eighth of at most
            // what the longest wait allows for.
            let took = now()
                .0
                .saturating_sub(self.acked_at.0)
                .min(ANSWER_WAIT_MAX / ANSWER_SLACK);
            self.answer_time = if self.answer_time == 0 {
                took
            } else {
                (self.answer_time * 7 + took) / 8
            };
        } else if self.for_answer {
            self.answers = self.answers.saturating_sub(1);
        }
        if was == 0 && self.answers > 0 {
            tracing::debug!("the program answers requests: their ACKs wait for the answer");
        }
    }

    /// A poll found nothing to take in and nothing to send.
    pub fn empty_poll(&mut self) {
        self.empty_polls += 1;
    }

    /// When what is held is due: at once, or, for ACKs held for an
    /// answer, [`Hold::answer_wait`] after they were held.
    pub fn due(&self) -> Option<Time> {
        let t = self.since?;
        Some(if self.for_answer {
            Time(t.0.saturating_add(self.answer_wait()))
        } else {
            t
        })
    }

    /// How long ACKs wait for an answer: [`ANSWER_WAIT`], or
    /// [`ANSWER_SLACK`] times as long as the program takes to answer, up
    /// to [`ANSWER_WAIT_MAX`]. A CPU many times slower (an emulated one)
    /// is held up as many times as long: inside the rxe VM a ping-pong's
    /// answers take hundreds of microseconds, and a fixed millisecond
    /// expired every few hundred round trips; each time the ACK left
    /// alone, the peer stopped polling before the answer came, and its
    /// engine thread had to come back for it.
    pub fn answer_wait(&self) -> u64 {
        self.min_wait.max(
            self.answer_time
                .saturating_mul(ANSWER_SLACK)
                .min(ANSWER_WAIT_MAX),
        )
    }

    /// Whether anything is held.
    #[cfg(test)]
    pub fn holding(&self) -> bool {
        self.since.is_some()
    }

    /// Whether ACKs are held for an answer.
    #[cfg(test)]
    pub fn for_answer(&self) -> bool {
        self.for_answer
    }

    /// Make the shortest wait for an answer `ns`.
    #[cfg(test)]
    pub fn set_min_wait(&mut self, ns: u64) {
        self.min_wait = ns;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    /// A program that answers a batch's ACKs with a post, without polling
    /// an empty queue in between (a ping-pong), learns to hold them.
    fn answering(h: &mut Hold, at: u64, took: u64) {
        h.acks_left(Time(at));
        h.posted(|| Time(at + took));
    }

    /// The program went back to polling (empty queues) after the batch.
    fn late(h: &mut Hold) {
        for _ in 0..=ANSWER_POLLS {
            h.empty_poll();
        }
    }

    #[test]
    fn acks_wait_for_an_answer_once_the_program_has_answered_one() {
        let mut h = Hold::default();
        assert!(!h.expects_answer(), "a new engine sends ACKs at once");
        answering(&mut h, 0, 5 * US);
        assert!(h.expects_answer());
        h.hold_for_answer(Time(100 * US));
        assert!(h.holding() && h.for_answer());
        assert_eq!(h.due(), Some(Time(100 * US + ANSWER_WAIT)));
        // The answer comes: a pump sends the ACKs with it.
        h.release(Time(110 * US));
        assert!(!h.holding() && !h.for_answer());
        assert!(h.expects_answer(), "an answer in time keeps the lesson");
    }

    #[test]
    fn more_empty_polls_than_a_loop_over_a_few_queues_before_the_post_are_no_answer() {
        let mut h = Hold::default();
        h.acks_left(Time(0));
        for _ in 0..ANSWER_POLLS {
            h.empty_poll();
        }
        h.posted(|| Time(5 * US));
        assert!(h.expects_answer(), "the other queues polled on the way");
        let mut h = Hold::default();
        h.acks_left(Time(0));
        for _ in 0..=ANSWER_POLLS {
            h.empty_poll();
        }
        h.posted(|| panic!("a post that answers nothing reads no clock"));
        assert!(!h.expects_answer());
        // Nor does a post with no batch of ACKs before it.
        h.posted(|| panic!("nothing to score"));
        assert!(!h.expects_answer());
    }

    #[test]
    fn acks_that_waited_in_vain_leave_at_once_from_then_on() {
        let mut h = Hold::default();
        for i in 0..ANSWER_SCORE as u64 + 4 {
            answering(&mut h, i * 100 * US, 5 * US);
        }
        h.hold_for_answer(Time(0));
        let due = h.due().unwrap();
        // Released before its time: still a program that answers.
        h.release(Time(due.0 - 1));
        assert!(h.expects_answer());
        h.hold_for_answer(Time(0));
        h.release(due);
        assert!(!h.expects_answer(), "no answer came within the wait");
    }

    #[test]
    fn a_late_post_that_takes_held_acks_along_lowers_the_score() {
        let mut h = Hold::default();
        answering(&mut h, 0, 5 * US);
        answering(&mut h, 100 * US, 5 * US);
        h.hold_for_answer(Time(200 * US));
        h.acks_left(Time(200 * US));
        late(&mut h);
        h.posted(|| Time(300 * US));
        assert!(h.expects_answer(), "one of two answers is left");
        h.acks_left(Time(400 * US));
        late(&mut h);
        h.posted(|| Time(500 * US));
        assert!(!h.expects_answer());
    }

    #[test]
    fn a_slow_program_s_acks_wait_longer_up_to_the_most() {
        let mut h = Hold::default();
        assert_eq!(h.answer_wait(), ANSWER_WAIT);
        for i in 0..40 {
            answering(&mut h, i * 10_000 * US, 200 * US);
        }
        let wait = h.answer_wait();
        assert!(wait > ANSWER_WAIT, "{wait}");
        assert!(wait <= ANSWER_SLACK * 200 * US, "{wait}");
        let mut h = Hold::default();
        for i in 0..4 {
            answering(&mut h, i * 100_000 * US, 50_000 * US);
        }
        assert_eq!(h.answer_wait(), ANSWER_WAIT_MAX);
        h.set_min_wait(ANSWER_WAIT_MAX * 2);
        assert_eq!(
            h.answer_wait(),
            ANSWER_WAIT_MAX * 2,
            "a test's shortest wait rules"
        );
    }

    #[test]
    fn held_posts_are_due_at_once_and_stop_waiting_for_an_answer_behind_other_datagrams() {
        let mut h = Hold::default();
        h.hold(Time(7), false, false);
        assert!(!h.holding(), "nothing queued, nothing held");
        h.hold(Time(7), true, false);
        assert_eq!(h.due(), Some(Time(7)));
        h.release(Time(8));
        answering(&mut h, 0, 1);
        h.hold_for_answer(Time(10));
        h.hold(Time(20), true, true);
        assert!(h.for_answer(), "ACKs alone still wait for the answer");
        assert_eq!(
            h.due(),
            Some(Time(10 + ANSWER_WAIT)),
            "held from when it began"
        );
        h.hold(Time(30), true, false);
        assert!(!h.for_answer());
        assert_eq!(
            h.due(),
            Some(Time(10)),
            "a post's datagrams are due at once"
        );
    }
}
