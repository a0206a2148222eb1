//! What the engine thread and the application's threads share: the state
//! behind its lock, the sockets, and the flags and clocks read without the
//! lock (whether the engine thread watches the socket, when it means to
//! wake, who took packets in).
//!
//! # RC responses on a socket of their own
//!
//! A program that spins on memory between polls (ib_write_lat waits for
//! the peer's WRITE on its buffer's last byte) needs the engine thread to
//! take the WRITE in, so the engine thread watches the socket; it is then
//! woken by every ACK too, which the program's next poll would have taken,
//! and each wake-up preempts a program on a busy core: two per round trip
//! instead of one. The kernel can steer RC responses (the opcodes a
//! requester receives) to the second socket of the port's `SO_REUSEPORT`
//! group ([`crate::udp::steer_responses`]); while threads poll, the engine
//! thread then watches only the first, for requests. Requests and
//! responses are separate streams on the wire, each in order on its
//! socket.
//!
//! The two sockets are bound either way. Steering while the engine thread
//! stays for such a program is off unless `RNIC_RESPONSE_SOCKET=on`
//! ([`crate::Config::response_socket`]): it saves a wake-up per round trip
//! but barely moves the round trip's time, and while a flood to QPs that
//! do not exist keeps the engine thread staying, each poll reads two
//! sockets and a legitimate transfer beside the flood slows down
//! (`docs/performance.md` has the figures).

use std::net::UdpSocket;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use rnic_core::time::Time;
use rustix::event::{eventfd, EventfdFlags};

use super::receive::{Received, Rx};
use super::state::EngineState;

/// Batches of what waits on the first socket taken in when steering starts
/// (see [`Shared::steer`]).
const STEER_DRAIN: usize = 8;

/// What a NIC's slot's inbox brings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Inbox {
    /// Every packet: the NIC shares an address on the UDP transport, and
    /// the address's first NIC hands on this one's packets.
    Main,
    /// The CM messages for this NIC, which the interface's NIC in slot 0
    /// receives (the frame transport).
    Side,
    /// Nothing: the NIC receives its packets itself.
    Unread,
}

/// What the engine thread and the application's threads share.
pub(super) struct Shared {
    pub(super) state: Mutex<EngineState>,
    /// The socket on 4791: it receives everything, unless `frames` does or
    /// `responses` takes the RC responses.
    pub(super) socket: UdpSocket,
    /// On the UDP transport, a second socket on 4791 that RC responses
    /// (ACKs, READ responses, atomic ACKs) are steered to (see
    /// the module's documentation), if the kernel steers.
    pub(super) responses: Option<UdpSocket>,
    /// The engine thread sleeps without watching `responses`: threads poll,
    /// and take them in.
    pub(super) responses_left: AtomicBool,
    /// Steer RC responses apart while staying for a program that spins on
    /// memory (`RNIC_RESPONSE_SOCKET=on`; see the module's documentation).
    pub(super) steer_when_staying: AtomicBool,
    /// RC responses are steered to `responses` now: pollers look there
    /// too. Only while the engine thread leaves them to pollers; otherwise
    /// all comes in on `socket` (and a poll costs one system call, not two).
    pub(super) steering: AtomicBool,
    /// Steering has started at least once: `responses` may hold packets.
    pub(super) steered_once: AtomicBool,
    /// Times steering started or stopped, ever (tests tell a spell that
    /// steered throughout from one that stopped and started again).
    pub(super) steering_changes: std::sync::atomic::AtomicU64,
    /// A test's choice of steering (1 off, 2 on; 0 the engine's own).
    #[cfg(test)]
    pub(super) pinned_steering: std::sync::atomic::AtomicU8,
    /// The frame transport's packet socket (see `frames`), if the device
    /// runs on one.
    pub(super) frames: Option<crate::frames::Ring>,
    /// With `frames`, the same on `lo`: the packets this host sends to
    /// the NIC's own addresses (see [`crate::frames::open_loopback`]).
    /// The engine thread's alone to watch, as `side_rx`.
    pub(super) loopback: Option<crate::frames::Ring>,
    /// The connection to the NIC that receives this one's packets, if
    /// another does (see [`super::relay`]).
    pub(super) inbox: Option<OwnedFd>,
    /// What comes in there.
    pub(super) inlet: Inbox,
    /// Where the other NICs of the address or interface connect, if this
    /// one receives their packets (the relay's own copy is used under the
    /// lock; this one is watched without it).
    pub(super) listener: Option<OwnedFd>,
    /// Wakes the engine thread from poll(2).
    pub(super) wake: OwnedFd,
    /// When the engine thread means to wake up (ns on the engine's clock;
    /// `u64::MAX` while it is awake): a verb that sets an earlier timer
    /// wakes it, and no other does.
    pub(super) sleeping_until: AtomicU64,
    /// [`EngineState::next_deadline`] as the last thread to change the
    /// state left it (ns; `u64::MAX`: none), published under the lock:
    /// what the engine thread, away from the socket, reads when it wakes
    /// to look at the pollers, instead of taking the lock from them (see
    /// `thread::leave_to_pollers`).
    pub(super) deadline: AtomicU64,
    pub(super) stop: AtomicBool,
    /// The engine's clock starts here (as `EngineState::start`).
    pub(super) start: Instant,
    /// When a thread last polled an empty completion queue or posted work
    /// (ns on the engine's clock; 0: never): a thread in the data path,
    /// which takes in packets at its next poll.
    pub(super) last_active: AtomicU64,
    /// The core that thread ran on then (`usize::MAX`: unknown): the
    /// engine thread's place (see `sched`).
    pub(super) active_cpu: AtomicUsize,
    /// The engine thread's thread ID (0 until it runs).
    pub(super) tid: AtomicU32,
    /// The engine thread sleeps without watching the socket (see `watch`).
    pub(super) away: AtomicBool,
    /// A thread said it is about to sleep until a completion.
    pub(super) sleeper: AtomicBool,
    /// Threads asleep on a completion channel and on the socket, which
    /// take in what arrives themselves (see `drive`): they count as
    /// threads that poll.
    pub(super) drivers: AtomicUsize,
    /// How long a driving thread spins before it sleeps, where that pays
    /// (ns; `RNIC_BUSY_POLL_US`, see `drive::BusyPoll`).
    pub(super) busy_poll_window: u64,
    /// Packets taken in by polling threads, ever.
    pub(super) polled_packets: AtomicU64,
    /// Packets taken in by the engine thread, ever.
    pub(super) engine_packets: AtomicU64,
    /// Of those, packets it took in while lingering (see `sched::Linger`).
    pub(super) lingered_packets: AtomicU64,
    /// Of those, packets it took in at a look while away from the socket.
    pub(super) looked_packets: AtomicU64,
    /// Times the engine thread, back from leaving the socket to pollers,
    /// found waiting a request no completion shows, and stayed.
    pub(super) stays: AtomicU64,
    /// Times the engine thread slept away from the socket, ever.
    pub(super) away_sleeps: AtomicU64,
    /// `watch::AWAY_MAX`, or longer in a test that must see a sleeper
    /// served by being told, not by the engine coming back on its own.
    pub(super) away_max: AtomicU64,
}

impl Shared {
    /// Whether to steer: `wanted`, unless a test chose.
    pub(super) fn pinned(&self, wanted: bool) -> bool {
        #[cfg(test)]
        match self.pinned_steering.load(Ordering::SeqCst) {
            1 => return false,
            2 => return true,
            _ => {}
        }
        wanted
    }

    /// Where RC responses come in, if not at [`Shared::rx`]: nowhere until
    /// steering first starts (nothing reaches `responses` before), so a NIC
    /// that never steers pays no system call for it.
    pub(super) fn responses_rx(&self) -> Option<Rx<'_>> {
        self.responses
            .as_ref()
            .filter(|_| self.steered_once.load(Ordering::Relaxed))
            .map(Rx::Udp)
    }

    /// Steer RC responses to `responses`, or not (engine thread only),
    /// keeping them in order: packets are taken in under the state lock,
    /// which the switch holds, and what waits on the socket the switch
    /// turns away from is taken in at once, before anything that arrives
    /// on the other. Starting, that is `socket` (up to [`STEER_DRAIN`]
    /// batches: under a flood a response left behind arrives late, as on
    /// a network that reorders); stopping, `responses`. A packet the kernel
    /// was steering as the program changed, if any, is taken in by the
    /// engine thread, which watches `responses` whenever it does not leave
    /// it to pollers (and drains it when it leaves everything to them).
    pub(super) fn steer(&self, on: bool) {
        if self.steering.load(Ordering::Relaxed) == on {
            return;
        }
        let mut st = self.state.lock();
        if crate::udp::steer_responses(self.socket.as_fd(), on).is_err() {
            return;
        }
        if on {
            self.steered_once.store(true, Ordering::Relaxed);
            for _ in 0..STEER_DRAIN {
                let got = self.receive(&mut st, self.rx(), false, false, crate::udp::BATCH);
                if got.packets < crate::udp::BATCH {
                    break;
                }
            }
        } else if let Some(r) = self.responses_rx() {
            while self
                .receive(&mut st, r, false, false, crate::udp::BATCH)
                .packets
                > 0
            {}
        }
        self.publish(&st);
        self.steering.store(on, Ordering::SeqCst);
        self.steering_changes.fetch_add(1, Ordering::Relaxed);
    }

    /// Where packets come in.
    pub(super) fn rx(&self) -> Rx<'_> {
        match (&self.frames, self.inlet) {
            (Some(f), _) => Rx::Frames(f),
            (None, Inbox::Main) => match &self.inbox {
                Some(i) => Rx::Relayed(i.as_fd()),
                None => Rx::Udp(&self.socket),
            },
            (None, _) => Rx::Udp(&self.socket),
        }
    }

    /// Where else packets come in, the engine thread's alone to watch: the
    /// CM messages another NIC hands on, if not at [`Shared::rx`], and the
    /// packets that reach the NIC through `lo`.
    pub(super) fn side_rx(&self) -> impl Iterator<Item = Rx<'_>> {
        let relayed = match (&self.inbox, self.inlet) {
            (Some(i), Inbox::Side) => Some(Rx::Relayed(i.as_fd())),
            _ => None,
        };
        let looped = self.loopback.as_ref().map(Rx::Frames);
        relayed.into_iter().chain(looped)
    }

    /// One batch from `rx` into `st`, as [`EngineState::receive_at_most`]
    /// takes it in; if that found the inbox's other end closed, the inbox
    /// is quietened ([`Shared::inbox_closed`]). Every receive goes through
    /// here: whichever thread reads the end first deals with it, and none
    /// reads it again (it reads as an empty message at every try, and a
    /// batch of them as a full batch).
    pub(super) fn receive(
        &self,
        st: &mut EngineState,
        rx: Rx<'_>,
        may_hold: bool,
        program_active: bool,
        most: usize,
    ) -> Received {
        let got = st.receive_at_most(rx, &self.socket, may_hold, program_active, most);
        if got.closed {
            self.inbox_closed();
        }
        got
    }

    /// The NIC that received this one's packets has closed its end (it is
    /// gone): nothing more comes in there. The descriptor is replaced by
    /// one that never becomes readable (an eventfd nobody writes), so the
    /// threads that watch or read it need not know.
    #[allow(unsafe_code)]
    fn inbox_closed(&self) {
        let Some(inbox) = &self.inbox else { return };
        tracing::warn!(
            "the NIC that received this address's packets has closed: this NIC receives no more"
        );
        if let Ok(quiet) = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC) {
            // SAFETY: `inbox` is this struct's own descriptor, open for as
            // long as it lives; dup3 replaces what it refers to atomically.
            let mut target = unsafe { OwnedFd::from_raw_fd(inbox.as_raw_fd()) };
            let _ = rustix::io::dup3(&quiet, &mut target, rustix::io::DupFlags::CLOEXEC);
            std::mem::forget(target);
        }
    }

    /// Now, in ns on the engine's clock, without the lock.
    pub(super) fn clock(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// A thread is in the data path now; returns now (ns on the engine's
    /// clock), for the caller's own use: one clock read per poll (a system
    /// call where the clock source has no vDSO reading, as on an emulated
    /// CPU's HPET).
    pub(super) fn active(&self) -> u64 {
        let now = self.clock().max(1);
        self.last_active.store(now, Ordering::Relaxed);
        let cpu = super::sched::current_cpu().unwrap_or(usize::MAX);
        if self.active_cpu.load(Ordering::Relaxed) != cpu {
            self.active_cpu.store(cpu, Ordering::Relaxed);
        }
        now
    }

    /// Publish `st`'s next deadline (`deadline`), and return it; called
    /// under the lock by every thread that changed the state, before it
    /// lets go.
    pub(super) fn publish(&self, st: &EngineState) -> Option<Time> {
        let next = st.next_deadline();
        self.deadline
            .store(next.map_or(u64::MAX, |t| t.0), Ordering::SeqCst);
        next
    }

    pub(super) fn active_cpu(&self) -> Option<usize> {
        match self.active_cpu.load(Ordering::Relaxed) {
            usize::MAX => None,
            c => Some(c),
        }
    }

    /// When a thread last polled or posted: now, while a thread drives the
    /// engine from a wait (see `drive`).
    pub(super) fn last_active(&self) -> Option<u64> {
        if self.drivers.load(Ordering::SeqCst) > 0 {
            return Some(self.clock().max(1));
        }
        match self.last_active.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t),
        }
    }

    pub(super) fn wake(&self) {
        // An eventfd write only fails when the counter would overflow, which
        // already means "awake".
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    /// Wake the engine thread if the next deadline, `next`, comes before
    /// the time it means to wake up.
    ///
    /// The caller published its deadline first (`publish`, under the lock):
    /// an engine thread that reads `deadline` after setting
    /// `sleeping_until` (`leave_to_pollers`) either sees it, or is seen
    /// here (both sequentially consistent).
    pub(super) fn wake_for(&self, next: Option<Time>) {
        if next.is_some_and(|t| t.0 < self.sleeping_until.load(Ordering::SeqCst)) {
            self.wake();
        }
    }
}
