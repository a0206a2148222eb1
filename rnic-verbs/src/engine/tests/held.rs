//! What waits for the program rather than leaving at once: datagrams a
//! post or a poll produced while the engine thread is away, ACKs held for
//! the program's answer, and how they leave (in one GSO send, behind the
//! answer, at exit).

use super::*;

#[test]
fn poll_into_takes_at_most_max_oldest_first_into_the_callers_vector() {
    let p = pair();
    for _ in 0..3 {
        p.write();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while p.b_scq.len() < 3 && std::time::Instant::now() < deadline {
        let _ = p.b_scq.poll_into(&mut Vec::new(), 0);
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut out = Vec::with_capacity(8);
    let mark = Completion {
        wr_id: 99,
        ..p.b_scq.delivered.pop().unwrap()
    };
    out.push(mark);
    assert_eq!(p.b_scq.poll_into(&mut out, 1), 1);
    assert_eq!(p.b_scq.poll_into(&mut out, 5), 1);
    assert_eq!(p.b_scq.poll_into(&mut out, 5), 0);
    assert_eq!(out.len(), 3, "appended after what was there: {out:?}");
    assert_eq!(out[0].wr_id, 99);
    assert!(out[1..]
        .iter()
        .all(|c| c.wr_id == 3 && c.status == WcStatus::Success));
    assert_eq!(out.capacity(), 8, "the caller's room was used");
}

/// A path that refuses UDP GSO sends (here a socket without UDP
/// checksums; the kernel says EINVAL) loses the first run sent as one,
/// and from then on the NIC sends one datagram per message: a 64 KiB
/// WRITE completes after one retransmission, where every resent run,
/// refused alike, would spend the retries.
#[test]
fn a_nic_whose_gso_sends_are_refused_sends_datagrams_one_by_one() {
    // On their sockets: a NIC with a receive ring sends to another past
    // IP and UDP, not through a socket that could refuse.
    let config = Config {
        ring: false,
        ..Config::from_env().unwrap()
    };
    let (a, b) = (
        Device::open_loopback_with(&config).unwrap(),
        Device::open_loopback_with(&config).unwrap(),
    );
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (a_cq, b_cq) = (a.create_cq(8).unwrap(), b.create_cq(8).unwrap());
    let a_qp = pa.create_rc_qp(&a_cq, &a_cq, QpCaps::default()).unwrap();
    let b_qp = pb.create_rc_qp(&b_cq, &b_cq, QpCaps::default()).unwrap();
    let o = ConnectOptions {
        // 67 ms: a retransmission is the refusal's, not a loaded
        // machine's late ACK.
        timeout: 14,
        ..ConnectOptions::default()
    };
    a_qp.connect(&b_qp.endpoint(), &o).unwrap();
    b_qp.connect(&a_qp.endpoint(), &o).unwrap();
    const LEN: usize = 64 * 1024;
    let target = pa
        .register(LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let source = pb.register(LEN, Access::LOCAL_WRITE).unwrap();
    let data: Vec<u8> = (0..LEN as u32).map(|i| (i * 7 + 1) as u8).collect();
    assert!(source.write(0, &data));
    assert!(b.engine.gso(), "GSO is on by default on loopback");
    b.engine.send_without_checksums();
    b_qp.post_send(SendWr::new(
        1,
        SendOp::write(target.addr(), target.rkey()),
        sg_list![source.sge(0, LEN as u32)],
    ))
    .unwrap();
    let c = b_cq.wait(Duration::from_secs(10)).unwrap();
    assert_eq!(c.status, WcStatus::Success);
    assert!(!b.engine.gso(), "GSO is off after the refusal");
    let mut got = vec![0u8; LEN];
    assert!(target.read(0, &mut got));
    assert!(got == data, "the WRITE landed whole");
    let retries = b.counters().unwrap().completer_retry_err;
    assert!(retries <= 2, "{retries} retransmissions");
}

/// A poll after one that found nothing asks the socket for one message
/// (what a ping-pong's poller finds); the next asks for a batch. From a
/// receive ring, where a look costs no system call, a poll takes all it
/// holds.
#[test]
fn a_poll_after_a_dry_one_takes_one_message_in() {
    let p = pair_away_on_sockets();
    assert!(!p.a.engine.has_ring());
    assert_eq!(polls_take(&p), (1, 2));
    let p = pair_away();
    if p.a.engine.has_ring() {
        assert_eq!(polls_take(&p), (3, 0));
    }
}

/// How many of three datagrams sent to a's NIC at once the first poll
/// and the next take in, the first after a dry one.
fn polls_take(p: &Pair) -> (u64, u64) {
    let to = std::net::SocketAddr::new(p.a.engine.addr, crate::engine::ROCE_PORT);
    let peer = std::net::UdpSocket::bind((to.ip(), 0)).unwrap();
    // The engine thread comes back TEST_AWAY after the last poll: a
    // test thread held up that long tries again.
    for _ in 0..5 {
        assert!(p.a_rcq.try_next().is_none(), "a dry poll");
        let (engine, polled) = (p.a.engine.engine_packets(), p.a.engine.polled_packets());
        // Three datagrams, three messages (not RoCE: each is counted
        // as malformed, and as a packet taken in).
        for b in [1u8, 2, 3] {
            peer.send_to(&[b], to).unwrap();
        }
        p.a.engine.progress();
        let first = p.a.engine.polled_packets() - polled;
        p.a.engine.progress();
        let second = p.a.engine.polled_packets() - polled - first;
        if p.a.engine.engine_packets() != engine {
            continue;
        }
        return (first, second);
    }
    panic!("the engine thread took the datagrams in every time");
}

/// While a's engine thread leaves the socket to a poller, what a post
/// left a's NIC to build is built by the poller's next polls, each
/// after taking in what arrived: the engine thread is not woken for it
/// (woken, it took the lock from the poller for a pump, and was woken
/// again for the rest).
///
/// On RC the ACKs that come back find the rest built as they are taken
/// in; on UC nothing comes back, and the polls that find nothing build
/// it.
#[test]
fn what_a_post_left_to_build_waits_for_the_next_poll_while_a_thread_polls() {
    let p = pair_away();
    // One window, 1,024 packets: more than the post's pump and the
    // next poll's build, so the polls after it find more left.
    let (wr, _src, dst, data) = long_write(&p, 1 << 20);
    let uc = |pd: &ProtectionDomain, cq: &CompletionQueue| {
        pd.create_qp(QpType::Uc, cq, cq, QpCaps::default(), None)
            .unwrap()
    };
    let (a_uc, b_uc) = (uc(&p.a_pd, &p.a_scq), uc(&p.b_pd, &p.b_scq));
    let o = ConnectOptions::default();
    a_uc.connect(&b_uc.endpoint(), &o).unwrap();
    b_uc.connect(&a_uc.endpoint(), &o).unwrap();
    for (qp, what) in [(&p._a_qp, "RC"), (&a_uc, "UC")] {
        assert!(dst.write(0, &vec![0; data.len()]));
        // The engine thread comes back TEST_AWAY after the last poll:
        // a test thread held up that long tries again.
        let quiet = (0..5).any(|_| {
            let sleeps = p.a.engine.away_sleeps();
            qp.post_send(wr.clone()).unwrap();
            let c = p.a_scq.spin(Duration::from_secs(10)).unwrap();
            assert_eq!((c.wr_id, c.status), (7, WcStatus::Success), "{what}");
            p.a.engine.away_sleeps() == sleeps
        });
        assert!(
            quiet,
            "{what}: a's engine thread was woken for what the poller's polls build, every time"
        );
        lands(&dst, &data, what);
    }
}

/// The same WRITE, and no poll comes after the post: the engine
/// thread builds the rest when it looks again.
#[test]
fn what_a_post_left_to_build_is_built_by_the_engine_thread_if_no_poll_comes() {
    let p = pair_away();
    let (wr, _src, dst, data) = long_write(&p, 1 << 20);
    p._a_qp.post_send(wr).unwrap();
    // Not a poll: the completions delivered so far, counted.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while p.a_scq.is_empty() {
        assert!(std::time::Instant::now() < deadline, "the WRITE completes");
        std::thread::sleep(Duration::from_millis(1));
    }
    let c = p.a_scq.try_next().unwrap();
    assert_eq!((c.wr_id, c.status), (7, WcStatus::Success));
    lands(&dst, &data, "RC");
    assert_eq!(
        p.a.counters().unwrap().completer_retry_err,
        0,
        "sent, not left to the retransmission timer"
    );
}

/// While a's engine thread leaves the socket to a poller, a's posts
/// wait for a's next poll, which sends them; if no poll comes, the
/// engine thread sends them when it looks again.
#[test]
fn posts_wait_for_the_next_poll_while_a_thread_polls() {
    fn send(p: &Pair, wr_id: u64) {
        send_one(
            (&p._a_qp, &p.a_mr),
            (&p.b_qp, &p.b_mr),
            (wr_id, wr_id),
            false,
        );
    }
    fn received(p: &Pair, wr_id: u64) {
        let c = p.b_scq.wait(Duration::from_secs(10)).unwrap();
        assert_eq!(
            (c.wr_id, c.status, c.opcode),
            (wr_id, WcStatus::Success, WcOpcode::Recv)
        );
    }
    let p = pair_away();
    send(&p, 10);
    assert!(
        p.a.engine.holding(),
        "a post while a thread polls waits for the poll"
    );
    assert!(p.a_rcq.try_next().is_none());
    assert!(
        !p.a.engine.holding(),
        "a poll that found nothing sends what waited"
    );
    received(&p, 10);
    // Posted, and nobody on a polls again: the engine thread sends it.
    let p = pair_away();
    send(&p, 11);
    assert!(p.a.engine.holding());
    received(&p, 11);
    assert!(!p.a.engine.holding());
    assert_eq!(
        p.a.counters().unwrap().completer_retry_err,
        0,
        "sent, not left to the retransmission timer"
    );
}

/// While a's engine thread leaves the socket to a poller, the ACK of a
/// SEND a poll took in waits for a's next poll (which sends it with
/// whatever the program posted meanwhile); if no poll comes, the engine
/// thread sends it when it looks again.
#[test]
fn the_ack_of_a_polled_send_waits_for_the_next_poll() {
    /// Poll a's receive queue until b's SEND arrives (bounded).
    fn take(p: &Pair) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(c) = p.a_rcq.try_next() {
                assert_eq!((c.status, c.opcode), (WcStatus::Success, WcOpcode::Recv));
                return;
            }
            assert!(std::time::Instant::now() < deadline, "the SEND came");
        }
    }
    let p = pair_away();
    p.post();
    take(&p);
    assert!(
        p.a.engine.holding(),
        "the ACK of the SEND a poll took in waits for the next poll"
    );
    assert!(p.a_rcq.try_next().is_none());
    assert!(!p.a.engine.holding(), "the next poll sent it");
    p.sent();
    // Taken in, and nobody on a polls again: the engine thread sends it.
    let p = pair_away();
    p.post();
    take(&p);
    assert!(p.a.engine.holding());
    p.sent();
    assert!(!p.a.engine.holding());
    let b = p.b_qp.dev.counters().unwrap();
    assert_eq!(
        b.completer_retry_err, 0,
        "acknowledged, not left to b's retransmission timer"
    );
}

/// A WRITE from b with `tag` in its every byte, polled for on a until
/// it landed (bounded), as a ping-pong waits: memory first, then a
/// poll. No completion shows on a.
fn write_polled_in(p: &Pair, tag: u8) {
    assert!(p.b_mr.write(0, &[tag; 8]));
    p.write();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut landed = [0u8; 8];
    loop {
        assert!(p.a_target.read(0, &mut landed));
        if landed == [tag; 8] {
            return;
        }
        assert!(p.a_scq.try_next().is_none());
        assert!(std::time::Instant::now() < deadline, "the WRITE landed");
    }
}

/// a's answer: a SEND to b (unsignaled), into a receive posted on b.
fn answer(p: &Pair) {
    send_one((&p._a_qp, &p.a_mr), (&p.b_qp, &p.b_mr), (4, 5), false);
}

/// a's answer, then a's next poll, which sends it with the ACKs it
/// took along, and b's completions of both.
fn answer_polled(p: &Pair) {
    answer(p);
    assert!(p.a_scq.try_next().is_none());
    assert!(!p.a.engine.holding(), "the answer took them along");
    answered(p);
}

/// b's completions of its WRITE and of the receive a's answer filled,
/// in either order.
fn answered(p: &Pair) {
    let mut ids = [0u64; 2];
    for id in &mut ids {
        let c = p.b_scq.wait(Duration::from_secs(10)).unwrap();
        assert_eq!(c.status, WcStatus::Success);
        *id = c.wr_id;
    }
    ids.sort();
    assert_eq!(ids, [3, 4]);
}

/// A program that takes long to answer (a slow CPU: an emulated one
/// answers fifty times slower) has its ACKs wait ANSWER_SLACK times
/// its usual answer time, up to ANSWER_WAIT_MAX, before they leave
/// alone; a new NIC waits ANSWER_WAIT.
#[test]
fn a_slow_program_s_acks_wait_longer_for_its_answer() {
    let p = pair_away();
    assert_eq!(p.a.engine.answer_wait(), crate::engine::hold::ANSWER_WAIT);
    for tag in 1..=4 {
        write_polled_in(&p, tag);
        // Taken in; the program answers 2 ms later.
        std::thread::sleep(Duration::from_millis(2));
        answer_polled(&p);
    }
    assert!(p.a.engine.answer().1, "the program answers");
    assert_eq!(
        p.a.engine.answer_wait(),
        crate::engine::hold::ANSWER_WAIT_MAX
    );
}

/// A program that exits with the ACK of the last request it took in
/// held for its answer (a ping-pong's last message) still has it
/// sent: the process's exit sends what its engines hold.
#[test]
fn a_program_s_exit_sends_the_acks_held_for_its_answer() {
    let p = pair_away();
    p.a.engine.set_answer_wait(60_000_000_000);
    write_polled_in(&p, 1);
    answer_polled(&p);
    write_polled_in(&p, 2);
    assert_eq!(p.a.engine.answer(), (true, true), "the ACK waits");
    assert!(
        p.b_scq.wait(Duration::from_millis(20)).is_err(),
        "not acknowledged before the exit"
    );
    p.a.engine.flush_as_at_exit();
    assert!(!p.a.engine.holding());
    let c = p.b_scq.wait(Duration::from_secs(10)).unwrap();
    assert_eq!((c.wr_id, c.status), (3, WcStatus::Success));
}

/// Once a's program has answered a request a poll took in (posted
/// something to send soon after), the ACKs of the next requests its
/// polls take in wait for its answer, not for its next poll, and
/// leave with it. Answers after more empty polls than a loop over a
/// few queues makes still take them along
/// but count down to leaving them alone; an answer that does not come
/// in the answer wait leaves them to go alone, and the engine
/// unlearns at once.
#[test]
fn the_ack_of_a_request_waits_for_the_program_s_answer() {
    const LONG: u64 = 60_000_000_000;
    let p = pair_away();
    p.a.engine.set_answer_wait(LONG);
    // Nothing learned: the ACK leaves at once.
    write_polled_in(&p, 1);
    assert_eq!(p.a.engine.answer(), (false, false));
    answer_polled(&p);
    assert_eq!(p.a.engine.answer(), (false, true), "the program answers");
    // Learned: the next ACK waits for the answer.
    write_polled_in(&p, 2);
    assert_eq!(p.a.engine.answer(), (true, true), "the ACK waits");
    answer_polled(&p);
    // Polls do not send it; an answer after them (the program
    // answering something else) still takes it along, but counts
    // down: after two quick answers, two such, and the next ACK leaves
    // at once.
    write_polled_in(&p, 3);
    assert_eq!(p.a.engine.answer(), (true, true), "the ACK waits");
    for _ in 0..1000 {
        assert!(p.a_scq.try_next().is_none());
    }
    assert!(p.a.engine.answer().0, "a poll does not send it");
    assert!(
        p.b_scq.wait(Duration::from_millis(20)).is_err(),
        "b's WRITE is not acknowledged before the answer"
    );
    answer_polled(&p);
    write_polled_in(&p, 4);
    assert_eq!(p.a.engine.answer(), (true, true), "one count left");
    // More empty polls than a loop over a few queues makes.
    for _ in 0..=crate::engine::hold::ANSWER_POLLS {
        assert!(p.a_scq.try_next().is_none());
    }
    answer_polled(&p);
    write_polled_in(&p, 5);
    assert_eq!(p.a.engine.answer(), (false, false), "counted down");
    // A receive posted sends nothing: no answer.
    p._a_qp
        .post_recv(RecvWr {
            wr_id: 6,
            sg_list: sg_list![p.a_mr.sge(0, 64)],
        })
        .unwrap();
    assert_eq!(
        p.a.engine.answer(),
        (false, false),
        "a receive is no answer"
    );
    p.sent();
    // Learned again; then no answer: the ACK leaves on its own after
    // the wait, and the next one leaves at once.
    p.a.engine.set_answer_wait(5_000_000);
    write_polled_in(&p, 6);
    answer_polled(&p);
    write_polled_in(&p, 7);
    assert_eq!(p.a.engine.answer(), (true, true));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while p.a.engine.holding() {
        assert!(p.a_scq.try_next().is_none());
        assert!(std::time::Instant::now() < deadline, "bounded");
    }
    p.sent();
    assert_eq!(p.a.engine.answer(), (false, false), "unlearned");
    write_polled_in(&p, 8);
    assert!(!p.a.engine.holding(), "the ACK left at once");
    p.sent();
    assert_eq!(p.b_qp.dev.counters().unwrap().completer_retry_err, 0);
}

/// Without GSO too, ACKs held for the answer leave behind it: the
/// peer, polling for the ACK, has taken the answer in by the time the
/// ACK hands it its completion (ahead of it, the peer stopped polling
/// with the answer still on its way).
#[test]
fn without_gso_the_answer_leaves_before_the_ack() {
    let p = pair_away();
    p.a.engine.set_gso(false);
    p.a.engine.set_answer_wait(60_000_000_000);
    write_polled_in(&p, 1);
    answer_polled(&p);
    let tap = p.a.tap().unwrap();
    write_polled_in(&p, 2);
    assert_eq!(p.a.engine.answer(), (true, true), "the ACK waits");
    answer_polled(&p);
    let sent: Vec<u8> = tap
        .try_iter()
        .filter(|e| e.sent)
        .filter_map(|e| e.datagram.payload.first().copied())
        .collect();
    assert_eq!(
        sent,
        [
            rnic_wire::Opcode::RC_SEND_ONLY.0,
            rnic_wire::Opcode::RC_ACKNOWLEDGE.0
        ],
        "the answer, then the ACK"
    );
}

/// A new NIC has learned nothing: a request taken in while its
/// program polls is acknowledged at once. And one the engine thread
/// takes in while no thread of the program polls or posts is
/// acknowledged at once, though the program answered before: nobody
/// is there to answer now.
#[test]
fn the_ack_waits_for_no_answer_while_nobody_polls() {
    let p = pair();
    p.a.engine.set_answer_wait(60_000_000_000);
    write_polled_in(&p, 1);
    assert_eq!(p.a.engine.answer(), (false, false), "nothing learned");
    answer(&p);
    assert_eq!(p.a.engine.answer(), (false, true), "the program answers");
    answered(&p);
    // Longer than a poller counts as about (watch::AWAY_MAX).
    std::thread::sleep(Duration::from_millis(5));
    for _ in 0..3 {
        p.write();
        p.sent();
    }
    assert_eq!(p.a.engine.answer(), (false, true));
}
