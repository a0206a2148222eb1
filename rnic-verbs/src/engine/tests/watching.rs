//! Where the engine thread is: watching the socket, away from it while
//! the program's threads poll, back for a sleeper or a request nobody
//! polls for, lingering, on the program's core; and RC responses steered
//! apart while it watches for requests.

use super::*;

// The engine thread would come back on its own only after a minute: a
// thread that waits on a queue takes the SEND in itself (see `drive`),
// and the SEND's ACK, which its batch left for the next poll, leaves
// when the wait ends (b's request would time out otherwise).
#[test]
fn a_thread_that_waits_on_a_queue_is_served_while_the_engine_stays_away() {
    let p = pair();
    p.a.engine.set_away_max(60_000_000_000);
    p.until_away();
    p.send_later(|cq| cq.wait(Duration::from_secs(10)));
}

/// While a thread polls without a break, the engine thread, away from
/// the socket, looks at it ever less often: after AWAY_MAX, then twice
/// that, ..., up to AWAY_LONGEST. Each look preempts a spinning program.
#[test]
fn a_thread_that_keeps_polling_wakes_the_engine_ever_less_often() {
    let p = pair();
    p.until_away();
    let before = p.a.engine.away_sleeps();
    let start = std::time::Instant::now();
    let spell = Duration::from_millis(200);
    while start.elapsed() < spell {
        assert!(p.a_rcq.try_next().is_none());
    }
    let sleeps = p.a.engine.away_sleeps() - before;
    // A look every AWAY_MAX would be 200; doubling to AWAY_LONGEST, a
    // few to get there and 25 after. A thread held up for a millisecond
    // brings the engine back and starts it again from AWAY_MAX.
    let every_ms = (spell.as_nanos() / u128::from(crate::engine::watch::AWAY_MAX)) as u64;
    assert!(sleeps < every_ms / 3, "{sleeps} looks in {spell:?}");
    assert!(sleeps > 0, "it looked");
}

/// The engine thread away, looking at what is due with more left to
/// build than its pump built, looks again at the next timer or its
/// bound, not at once (taking the lock from the poller for each pump
/// while the poller builds the same).
#[test]
fn the_engine_thread_away_leaves_what_is_left_to_build_to_the_poller() {
    let p = pair_away();
    let (wr, _src, _dst, _data) = long_write(&p, 256 << 10);
    for _ in 0..20 {
        p._a_qp.post_send(wr.clone()).unwrap();
        let (left, about, until, now) = p.a.engine.away_until(u64::MAX);
        if left && about {
            assert!(
                until > now,
                "the engine thread looks again at once ({until} against {now})"
            );
            let c = p.a_scq.spin(Duration::from_secs(10)).unwrap();
            assert_eq!((c.wr_id, c.status), (7, WcStatus::Success));
            return;
        }
        // The engine thread came back and built it, or this thread was
        // held up so long that it no longer counts as polling (the engine
        // thread then builds the rest at once): again.
        let c = p.a_scq.spin(Duration::from_secs(10)).unwrap();
        assert_eq!((c.wr_id, c.status), (7, WcStatus::Success));
        if !p.a.engine.is_away() {
            p.until_away();
        }
    }
    panic!("the post never left the NIC more to build");
}

/// Steering RC responses apart is off unless asked for
/// (`RNIC_RESPONSE_SOCKET=on`): while a's engine thread watches for
/// requests and a thread polls, the responses stay on the one socket.
#[test]
fn responses_are_not_steered_apart_by_default() {
    if std::env::var_os("RNIC_RESPONSE_SOCKET").is_some() {
        return;
    }
    let p = pair_away_on_sockets();
    let stays = p.a.engine.stays();
    p.write();
    p.sent();
    assert_eq!(
        p.a.engine.stays(),
        stays + 1,
        "the WRITE kept a's engine watching"
    );
    for i in 0..30 {
        p.send_polled(i);
        assert!(!p.a.engine.steering(), "steered at round trip {i}");
    }
}

/// While a's engine thread watches for requests (a WRITE waited for it:
/// a program spinning on memory) and a thread polls, the ACKs of a's
/// SENDs reach the polling thread without waking the engine thread
/// (see `engine::shared`).
#[test]
fn responses_are_left_to_pollers_while_the_engine_watches_for_requests() {
    // Steering needs the socket pair of port 4791: no receive ring.
    let p = pair_away_on_sockets();
    p.a.engine.steer_when_staying(true);
    let mut tries = 0;
    loop {
        tries += 1;
        if !p.a.engine.is_away() {
            p.until_away();
        }
        // A WRITE that waits for a's engine thread: it comes back,
        // finds it, and stays to watch for requests.
        let stays = p.a.engine.stays();
        p.write();
        p.sent();
        let stayed = p.a.engine.stays() == stays + 1;
        if !stayed && tries < 10 {
            // The engine thread came back before the WRITE for something
            // else, or its look found this thread had polled: again.
            continue;
        }
        assert!(stayed, "the WRITE kept a's engine watching");
        // It sees this thread poll when it next wakes (for the first
        // ACK, say), and then leaves the responses to it.
        for _ in 0..30 {
            if p.a.engine.steering() || p.a.engine.is_away() {
                break;
            }
            p.send_polled(0);
        }
        let changes = p.a.engine.steering_changes();
        let steered = p.a.engine.steering();
        let engine_took = p.a.engine.engine_packets();
        for i in 1..=20 {
            p.send_polled(i);
        }
        let held = steered && p.a.engine.steering_changes() == changes;
        if !held && tries < 10 {
            // The stay ended before or during the round trips (this
            // thread or the engine's held up on a loaded machine): not
            // what this test looks at. Again.
            continue;
        }
        assert!(
            held,
            "a's engine thread left the responses to pollers throughout"
        );
        assert_eq!(
            p.a.engine.engine_packets(),
            engine_took,
            "a's engine thread took in none of the ACKs"
        );
        break;
    }
}

/// Steering starting and stopping does not let a response overtake
/// an older one: what waited on the first socket from before the start
/// is taken in before what was steered to the second, and at the stop
/// what the second holds before anything newer on the first.
#[test]
fn responses_keep_their_order_when_steering_starts_and_stops() {
    // An engine thread away from the socket: what arrives waits for
    // this thread's polls (on the socket pair: no receive ring).
    let p = pair_away_on_sockets();
    let d = &p.a;
    let addr = d.addr();
    let tap = d.tap().unwrap();
    let peer = std::net::UdpSocket::bind((IpAddr::from([127, 0, 33, 3]), 0)).unwrap();
    let to = std::net::SocketAddr::new(addr, crate::engine::ROCE_PORT);
    // Ghost ACKs for a QP that does not exist, numbered by their PSN:
    // received (and shown to the tap), then dropped.
    let send = |psns: std::ops::Range<u32>| {
        for p in psns {
            let mut ack = [0u8; 20];
            ack[0] = 0x11; // RC ACKNOWLEDGE
            ack[7] = 0x99; // destination QP 0x000099
            ack[9..12].copy_from_slice(&p.to_be_bytes()[1..]);
            peer.send_to(&ack, to).unwrap();
        }
    };
    let mut seen = Vec::new();
    let mut take = |n: usize| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while seen.len() < n {
            d.engine.progress();
            while let Ok(e) = tap.try_recv() {
                if !e.sent {
                    let b = &e.datagram.payload;
                    seen.push(u32::from_be_bytes([0, b[9], b[10], b[11]]));
                }
            }
            assert!(std::time::Instant::now() < deadline, "bounded");
        }
    };
    // 40 on the first socket, then steering, then 40 on the second.
    d.engine.pin_steering(Some(false));
    send(0..40);
    d.engine.pin_steering(Some(true));
    send(40..80);
    take(80);
    // 40 on the second, steering stops, 40 on the first.
    send(80..120);
    d.engine.pin_steering(Some(false));
    send(120..160);
    take(160);
    // Started and stopped before a poll: the first socket's first.
    send(160..200);
    d.engine.pin_steering(Some(true));
    send(200..240);
    d.engine.pin_steering(Some(false));
    send(240..280);
    take(280);
    assert_eq!(seen, (0..280).collect::<Vec<u32>>());
}

/// A NIC's port 4791 is its own while it lives, though its two sockets
/// let sockets that ask for SO_REUSEPORT join them: a plain socket is
/// refused (the kernel), a NIC that must have an address of its own skips
/// it (the claim: `open_loopback`), and one opened on it shares it, taking
/// the next slot of its QP numbers.
#[test]
fn a_nic_s_address_is_its_own_while_it_lives() {
    // Outside the range `open_loopback` takes from, so that no test
    // running beside this one takes the address while it is free.
    let addr = IpAddr::from([127, 0, 33, 1]);
    let d = Device::open(addr).unwrap();
    match Device::start(addr, None, &crate::Config::default(), false) {
        Err(Error::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}"),
        other => panic!(
            "a second NIC of its own on {addr}: {:?}",
            other.map(|d| d.addr())
        ),
    }
    let port = std::net::SocketAddr::new(addr, crate::engine::ROCE_PORT);
    assert_eq!(
        std::net::UdpSocket::bind(port).unwrap_err().kind(),
        io::ErrorKind::AddrInUse
    );
    let shared = Device::open(addr).unwrap();
    assert_eq!(shared.addr(), addr);
    assert_eq!(
        (d.sharing().unwrap().slot, shared.sharing().unwrap().slot),
        (0, 1)
    );
    drop((d, shared));
    let again = Device::open(addr).expect("free once the NICs are gone");
    assert_eq!(again.addr(), addr);
    assert_eq!(again.sharing().unwrap().slot, 0);
}

#[test]
fn a_send_that_waited_for_the_engine_does_not_keep_it_watching() {
    let p = pair_away();
    let stays = p.a.engine.stays();
    // Nobody on a polls (a poller held up, say): the engine thread comes
    // back for the SEND, and a's next poll would have shown it anyway.
    p.post();
    p.sent();
    assert_eq!(p.a.engine.stays(), stays, "a SEND kept the engine watching");
    let c = p.a_rcq.spin(Duration::from_secs(10)).unwrap();
    assert_eq!(c.status, WcStatus::Success);
}

/// While a's engine thread has left the socket to a polling thread,
/// timers still fire on time: on its looks at the pollers the engine
/// thread reads the deadline that whoever armed it published, and
/// takes the lock only then. Three ways to arm one: a poll that sends
/// a request a post held (its ACK timeout), a post that sends a
/// request too long to hold, and a poll that takes in a receiver-not-
/// ready NAK (its RNR timer, long before the ACK timeout). The peer
/// never answers (its QP is gone), or has no receive posted; after the
/// one retry allowed the request fails.
#[test]
fn timers_fire_while_the_engine_leaves_the_socket_to_pollers() {
    let cases = [
        (8, false, WcStatus::RetryExcErr),
        (64 * 1024, false, WcStatus::RetryExcErr),
        (8, true, WcStatus::RnrRetryExcErr),
    ];
    for (len, rnr, status) in cases {
        let p = pair();
        let pd = p.a.alloc_pd().unwrap();
        let cq = p.a.create_cq(8).unwrap();
        let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
        let c = Device::open_loopback().unwrap();
        let (pc, c_cq) = (c.alloc_pd().unwrap(), c.create_cq(8).unwrap());
        let peer = pc.create_rc_qp(&c_cq, &c_cq, QpCaps::default()).unwrap();
        let o = ConnectOptions {
            // 1 ms; 4.3 s where the RNR timer (0.64 ms) must fire.
            timeout: if rnr { 20 } else { 8 },
            retry_cnt: 1,
            rnr_retry: 1,
            ..ConnectOptions::default()
        };
        qp.connect(&peer.endpoint(), &o).unwrap();
        peer.connect(&qp.endpoint(), &o).unwrap();
        if !rnr {
            drop(peer);
        }
        let mr = pd.register(len, Access::LOCAL_WRITE).unwrap();
        // Away for as long as this thread polls, and for 10 s after:
        // nothing but the deadline brings the engine thread back in
        // time (a look at the pollers at a shorter bound may run a
        // timer it missed, late).
        p.a.engine.set_away_max(10_000_000_000);
        p.until_away();
        assert!(p.a.engine.is_away());
        let op = if rnr {
            SendOp::send()
        } else {
            SendOp::write(0x1000, 1)
        };
        qp.post_send(SendWr::new(9, op, sg_list![mr.sge(0, len as u32)]))
            .unwrap();
        // Polling without pause: the engine thread stays away, and a
        // poll runs no timer the engine thread is not late for. The
        // retries take milliseconds; a deadline the engine thread
        // missed comes seconds late, if at all.
        let done = cq.spin(Duration::from_secs(2)).unwrap();
        assert_eq!((done.wr_id, done.status), (9, status), "{len} B, RNR {rnr}");
    }
}

/// A program that keeps posting but takes nothing in (it polls only
/// now and then, or only finds completions waiting) leaves the engine
/// thread away, and nobody took in what came meanwhile: a WRITE to it
/// waited for the program's next poll of an empty queue, past the
/// peer's ACK timeout (`rnic soak`: 1% loss, 16.8 ms timeouts,
/// requests failed with RETRY_EXC_ERR within seconds). The engine
/// thread takes it in at its next look, at most a time away later.
#[test]
fn what_arrives_while_the_program_only_posts_is_taken_in_at_the_next_look() {
    // Away until TEST_AWAY after this thread's last call: still away
    // when the WRITE goes, however held up this thread is.
    let p = pair_away();
    assert!(p.a.engine.is_away());
    let stop = AtomicBool::new(false);
    let c = std::thread::scope(|s| {
        s.spawn(|| p.post_receives_until(&stop));
        p.write();
        let c = p.b_scq.wait(Duration::from_secs(5));
        stop.store(true, Ordering::Relaxed);
        c
    });
    let c = c.expect("the WRITE completes");
    assert_eq!((c.wr_id, c.status), (3, WcStatus::Success));
}

/// The CPU time a thread of this process has used, in clock ticks.
fn cpu_ticks(tid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
    // After the command's closing parenthesis: state is field 3, utime
    // and stime fields 14 and 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// A responder whose program never polls (the server of ib_read_lat)
/// has only its engine thread: requests that follow each other closely
/// find it lingering on the socket, in the normal class, instead of
/// asleep (nearly all of them on an idle machine, a third beside two
/// threads that spin; none without lingering). The requester's engine,
/// whose program polls, never lingers; and once the requests stop, the
/// responder's engine sleeps again, in real time where it started
/// there.
#[test]
fn a_responder_nobody_polls_lingers_while_requests_follow_closely() {
    let p = pair();
    let (tid, requests) = (p.a.engine.engine_tid(), 3000);
    let started_realtime = super::sched::is_realtime(tid);
    let mut seen_normal = false;
    for i in 0..requests {
        p.write();
        let c = p.b_scq.spin(Duration::from_secs(10)).unwrap();
        assert_eq!(c.status, WcStatus::Success);
        if i % 16 == 0 && !super::sched::is_realtime(tid) {
            seen_normal = true;
        }
    }
    let lingered = p.a.engine.lingered_packets();
    assert!(
        lingered * 10 >= requests,
        "{lingered} of {requests} requests found a's engine lingering"
    );
    // A poller held up on a loaded machine looks gone for a moment.
    let b_lingered = p.b_pd.dev.engine.lingered_packets();
    assert!(
        b_lingered * 100 <= requests,
        "b's program polls, yet {b_lingered} of {requests} ACKs found b's engine lingering"
    );
    if started_realtime {
        assert!(seen_normal, "a's engine lingered in real time");
    }
    // Asleep again within a few windows (bounded).
    let asleep = (0..200).any(|_| {
        std::thread::sleep(Duration::from_millis(1));
        super::sched::is_realtime(tid) == started_realtime
    });
    assert!(asleep, "a's engine did not go back to real time");
    let before = cpu_ticks(tid);
    std::thread::sleep(Duration::from_millis(300));
    let used = cpu_ticks(tid) - before;
    // Clock ticks are 10 ms: lingering on would be about 30.
    assert!(used <= 5, "a's engine used {used} ticks in 300 ms of quiet");
}

/// A program that posts receives now and then but never polls takes
/// nothing in: the engine thread, away because a thread posts, finds
/// WRITEs waiting at its look with nothing taken by pollers since the
/// look before, and comes back to watch the socket. Before, every
/// WRITE waited a look (up to 8 ms).
#[test]
fn requests_to_a_program_that_only_posts_wait_for_one_look_at_most() {
    let p = pair_away();
    let (looked_before, stays_before) = (p.a.engine.looked_packets(), p.a.engine.stays());
    let polled_before = p.a.engine.polled_packets();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| p.post_receives_until(&stop));
        for _ in 0..300 {
            p.write();
            let c = p.b_scq.spin(Duration::from_secs(10)).unwrap();
            assert_eq!(c.status, WcStatus::Success);
        }
        stop.store(true, Ordering::Relaxed);
    });
    let looked = p.a.engine.looked_packets() - looked_before;
    let stays = p.a.engine.stays() - stays_before;
    assert!(stays >= 1, "a's engine never came back");
    assert!(
        looked <= 30,
        "{looked} of 300 WRITEs waited for a look ({stays} stays)"
    );
    assert_eq!(p.a.engine.polled_packets(), polled_before);
}

/// A WRITE shows in no completion queue of a's: a program waiting for it
/// spins on memory, and needs the engine thread. One that waited for the
/// engine thread while it was away brings it back to watch. On a loaded
/// machine the engine thread may have come back before the WRITE is
/// posted (the pollers quiet for long enough): then the WRITE proves
/// nothing, and the case is tried again (bounded).
#[test]
fn a_write_that_waited_for_the_engine_keeps_it_watching() {
    for attempt in 0..5 {
        let p = pair_away();
        let stays = p.a.engine.stays();
        let away = p.a.engine.is_away();
        p.write();
        p.sent();
        let mut landed = [0u8; 8];
        assert!(p.a_target.read(0, &mut landed));
        let mut sent = [0u8; 8];
        assert!(p.b_mr.read(0, &mut sent));
        assert_eq!(landed, sent);
        if !away {
            eprintln!("attempt {attempt}: the engine thread was back before the WRITE");
            continue;
        }
        assert_eq!(p.a.engine.stays(), stays + 1);
        return;
    }
    panic!("the engine thread was never away when the WRITE was posted");
}

#[test]
fn a_thread_that_posts_keeps_the_engine_away() {
    let p = pair_away();
    // Receives posted for four times TEST_AWAY, no poll.
    for i in 0..200 {
        p._a_qp
            .post_recv(RecvWr {
                wr_id: 100 + i,
                sg_list: sg_list![p.a_mr.sge(0, 64)],
            })
            .unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    // It may be between two sleeps away: look a few times.
    let away = (0..200).any(|_| {
        std::thread::sleep(Duration::from_micros(10));
        p.a.engine.is_away()
    });
    assert!(away, "the engine thread came back while a thread posted");
}

/// A real-time engine thread runs on the core of the thread that
/// polls, follows it to another, and may run anywhere again once
/// nobody polls (`sched::Follow`). In the normal class it stays free.
#[test]
fn the_engine_thread_runs_where_its_program_polls() {
    use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
    let d = Device::open_loopback().unwrap();
    let cq = d.create_cq(4).unwrap();
    let realtime = sched::is_realtime(d.engine.engine_tid());
    let allowed = sched_getaffinity(None).unwrap();
    assert_eq!(d.engine.engine_cpus(), allowed);
    let cores: Vec<usize> = (0..CpuSet::MAX_CPU)
        .filter(|&c| allowed.is_set(c))
        .collect();
    // Last core first, so the first move is away from where the engine
    // thread most likely started.
    for &core in cores.iter().rev().take(2) {
        let followed = std::thread::scope(|s| {
            s.spawn(|| {
                sched_setaffinity(None, &sched::one_core(core)).unwrap();
                let limit = Duration::from_millis(if realtime { 5000 } else { 100 });
                let t = std::time::Instant::now();
                while t.elapsed() < limit {
                    assert!(cq.try_next().is_none());
                    if d.engine.engine_cpus() == sched::one_core(core) {
                        return true;
                    }
                }
                false
            })
            .join()
            .unwrap()
        });
        assert_eq!(followed, realtime, "core {core}, real time: {realtime}");
    }
    // Nobody polls: the engine thread may run anywhere again.
    let t = std::time::Instant::now();
    while d.engine.engine_cpus() != allowed && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(d.engine.engine_cpus(), allowed);
}

/// As above: a thread that armed a queue for an event is about to sleep.
/// It sleeps in its own poll(2) on the channel's descriptor, as programs
/// that watch several descriptors do: nothing but the engine thread takes
/// the packet in (a wait in `get_cq_event` would take it in itself, see
/// `driven`).
#[test]
fn arming_a_queue_for_an_event_brings_the_engine_back() {
    let p = pair();
    p.a.engine.set_away_max(60_000_000_000);
    p.until_away();
    p.send_later(|cq| {
        cq.req_notify();
        let mut fds = [rustix::event::PollFd::new(
            &p.chan,
            rustix::event::PollFlags::IN,
        )];
        let ten = rustix::event::Timespec {
            tv_sec: 10,
            tv_nsec: 0,
        };
        assert_eq!(rustix::event::poll(&mut fds, Some(&ten)), Ok(1));
        let id = p.chan.get_cq_event(Duration::ZERO)?;
        assert_eq!(id, cq.id());
        cq.try_next().ok_or(Error::Timeout)
    });
}
