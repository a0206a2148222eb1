//! Two CM agents talking through a wire the test controls: every MAD goes
//! through its bytes (emitted, then parsed), and may be dropped.

use super::*;
use core::net::Ipv6Addr;

const A: IpAddr = IpAddr::V4(core::net::Ipv4Addr::new(10, 77, 0, 1));
const B: IpAddr = IpAddr::V4(core::net::Ipv4Addr::new(10, 77, 0, 2));
const SERVICE: u64 = 0x0106_1c06;

struct Pair {
    a: CmAgent,
    b: CmAgent,
    now: Time,
    /// MADs sent, as (from, to, attribute), in order.
    log: Vec<(IpAddr, IpAddr, &'static str)>,
    /// Their transaction IDs.
    tids: Vec<u64>,
    /// Each delivered or dropped MAD as it was parsed, with its receiver.
    mads: Vec<(IpAddr, Mad)>,
}

fn agent(guid: u64, seed: u64) -> CmAgent {
    CmAgent::new(guid, SecretRng::from_u64(seed))
}

fn connect_params() -> ConnectParams {
    ConnectParams {
        service_id: SERVICE,
        qpn: 0x11,
        starting_psn: 0x35907a,
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        path_mtu: 3,
        path: Path {
            local_lid: 0xFFFF,
            remote_lid: 0xFFFF,
            local_gid: Ipv6Addr::from(0xffff_0a4d_0001u128),
            remote_gid: Ipv6Addr::from(0xffff_0a4d_0002u128),
            flow_label: 0x8ac4d,
            hop_limit: 64,
            local_ack_timeout: 19,
            ..Path::NONE
        },
        transport: 0,
        private_data: vec![7; 40],
    }
}

fn accept_params() -> AcceptParams {
    AcceptParams {
        qpn: 0x12,
        starting_psn: 0x049db3,
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        private_data: b"welcome".to_vec(),
    }
}

impl Pair {
    fn new() -> Pair {
        let mut b = agent(0xb, 2);
        b.listen(SERVICE).unwrap();
        Pair {
            a: agent(0xa, 1),
            b,
            now: Time::ZERO,
            log: Vec::new(),
            tids: Vec::new(),
            mads: Vec::new(),
        }
    }

    /// Deliver what both sent (through its bytes), `drop` deciding which
    /// of the MADs (numbered from 0 in this run) are lost; until quiet.
    fn run(&mut self, drop: impl Fn(&str) -> bool) {
        for _ in 0..32 {
            let mut moved = false;
            for from_a in [true, false] {
                let (src, dst) = if from_a {
                    (&mut self.a, &mut self.b)
                } else {
                    (&mut self.b, &mut self.a)
                };
                let out: Vec<_> = src.take_outgoing().collect();
                let from = if from_a { A } else { B };
                for (to, mad) in out {
                    moved = true;
                    assert_eq!(to, if from_a { B } else { A }, "sent to the peer");
                    let mut bytes = [0u8; rnic_wire::mad::MAD_LEN];
                    mad.emit(&mut bytes);
                    let parsed = Mad::parse(&bytes).expect("what the agent sends parses");
                    assert_eq!(parsed, mad);
                    let name = mad.message.name();
                    self.log.push((from, to, name));
                    self.tids.push(mad.header.transaction_id);
                    self.mads.push((to, parsed));
                    if !drop(name) {
                        dst.on_mad(self.now, from, &parsed);
                    }
                }
            }
            if !moved {
                return;
            }
        }
        panic!("the agents never went quiet");
    }

    /// Move the clock to the next deadline of either agent and fire it.
    fn tick(&mut self) {
        let next = [self.a.next_deadline(), self.b.next_deadline()]
            .into_iter()
            .flatten()
            .min()
            .expect("something waits");
        self.now = next;
        self.a.on_timer(self.now);
        self.b.on_timer(self.now);
    }

    fn names(&self) -> Vec<&'static str> {
        self.log.iter().map(|l| l.2).collect()
    }

    /// Connect A to B, B accepting; the two IDs.
    fn establish(&mut self) -> (CmId, CmId) {
        let a_id = self.a.connect(self.now, B, &connect_params()).unwrap();
        self.run(|_| false);
        let b_id = match self.b.take_events().collect::<Vec<_>>().as_slice() {
            [CmEvent::Request { id, from, req }] => {
                assert_eq!(*from, A);
                assert_eq!(req.service_id, SERVICE);
                assert_eq!(req.local_qpn, 0x11);
                assert_eq!(req.starting_psn, 0x35907a);
                assert_eq!(&req.private_data[..40], &[7; 40]);
                *id
            }
            e => panic!("{e:?}"),
        };
        self.b.accept(self.now, b_id, &accept_params()).unwrap();
        self.run(|_| false);
        match self.a.take_events().collect::<Vec<_>>().as_slice() {
            [CmEvent::Reply { id, rep }] => {
                assert_eq!(*id, a_id);
                assert_eq!((rep.local_qpn, rep.starting_psn), (0x12, 0x049db3));
                assert_eq!(&rep.private_data[..7], b"welcome");
            }
            e => panic!("{e:?}"),
        }
        self.a.ready(a_id).unwrap();
        self.run(|_| false);
        assert_eq!(
            self.a.take_events().collect::<Vec<_>>(),
            [CmEvent::Established { id: a_id }]
        );
        assert_eq!(
            self.b.take_events().collect::<Vec<_>>(),
            [CmEvent::Established { id: b_id }]
        );
        (a_id, b_id)
    }
}

#[test]
fn req_rep_rtu_establish_and_dreq_drep_close_both_ways() {
    for active_closes in [true, false] {
        let mut p = Pair::new();
        let (a_id, b_id) = p.establish();
        assert_eq!(p.names(), ["REQ", "REP", "RTU"]);
        if active_closes {
            p.a.disconnect(p.now, a_id).unwrap();
        } else {
            p.b.disconnect(p.now, b_id).unwrap();
        }
        p.run(|_| false);
        let (closer, other, cid, oid) = if active_closes {
            (&mut p.a, &mut p.b, a_id, b_id)
        } else {
            (&mut p.b, &mut p.a, b_id, a_id)
        };
        assert_eq!(
            closer.take_events().collect::<Vec<_>>(),
            [CmEvent::Disconnected { id: cid }]
        );
        assert_eq!(
            other.take_events().collect::<Vec<_>>(),
            [CmEvent::DisconnectRequest { id: oid }]
        );
        assert_eq!(&p.names()[3..], ["DREQ", "DREP"]);
        // Transaction IDs as the kernel's: the REQ's for REP, RTU and the
        // active side's DREQ, made from the sender's comm ID; the passive
        // side's DREQ one of its own; the DREP echoing its DREQ.
        let req_tid = cm::kernel_tid(p.a.hi_tid, a_id.0);
        let dreq_tid = if active_closes {
            req_tid
        } else {
            cm::kernel_tid(p.b.hi_tid, b_id.0)
        };
        assert_eq!(p.tids, [req_tid, req_tid, req_tid, dreq_tid, dreq_tid]);
        // Both rest in timewait, then forget the connection.
        assert_eq!((p.a.connections(), p.b.connections()), (1, 1));
        p.tick();
        assert_eq!((p.a.connections(), p.b.connections()), (0, 0));
        assert_eq!(p.a.next_deadline(), None);
    }
}

/// Agents that share an address draw their IDs from their own slot, and
/// every message but a request names its receiver's ID: a driver can hand
/// each MAD to its agent by the ID's top bits, a request by its service.
#[test]
fn every_mad_names_its_receiver_by_service_or_by_an_id_of_its_slot() {
    let slot_of = |to: IpAddr| if to == A { 0x3 } else { 0x9 };
    for active_closes in [true, false] {
        let mut p = Pair::new();
        p.a.restrict_ids(slot_of(A), 4);
        p.b.restrict_ids(slot_of(B), 4);
        let (a_id, b_id) = p.establish();
        assert_eq!((a_id.0 >> 28, b_id.0 >> 28), (0x3, 0x9));
        if active_closes {
            p.a.disconnect(p.now, a_id).unwrap();
        } else {
            p.b.disconnect(p.now, b_id).unwrap();
        }
        p.run(|_| false);
        let id = p.a.sidr_request(p.now, B, SERVICE, &[]).unwrap();
        p.run(|_| false);
        let Some(CmEvent::SidrRequest { id: sidr, .. }) = p.b.take_events().last() else {
            panic!("no SIDR request");
        };
        p.b.sidr_reply(sidr, sidr_status::VALID, 0x16, 1, &[])
            .unwrap();
        p.run(|_| false);
        assert_eq!(id.0 >> 28, 0x3);
        let names: Vec<_> = p.mads.iter().map(|(_, m)| m.message.name()).collect();
        assert_eq!(
            names,
            ["REQ", "REP", "RTU", "DREQ", "DREP", "SIDR_REQ", "SIDR_REP"]
        );
        for (to, mad) in &p.mads {
            match addressee(mad) {
                Some(Addressee::Service(s)) => {
                    assert!(matches!(mad.message, Message::Req(_) | Message::SidrReq(_)));
                    assert_eq!(s, SERVICE);
                }
                Some(Addressee::Agent(id)) => assert_eq!(id >> 28, slot_of(*to), "{mad:?}"),
                None => panic!("{mad:?} names nobody"),
            }
        }
    }
    // A REJ of a REQ nobody listens for names the REQ's sender.
    let mut p = Pair::new();
    p.a.restrict_ids(0xF, 4);
    p.b.unlisten(SERVICE);
    p.a.connect(p.now, B, &connect_params()).unwrap();
    p.run(|_| false);
    let (_, rej) = p.mads.last().unwrap();
    assert!(matches!(addressee(rej), Some(Addressee::Agent(id)) if id >> 28 == 0xF));
}

#[test]
fn a_req_nobody_listens_for_is_refused_with_reason_8_and_comm_id_0() {
    let mut p = Pair::new();
    let mut params = connect_params();
    params.service_id = 0x0106_1f3f;
    let id = p.a.connect(p.now, B, &params).unwrap();
    let mut captured = None;
    for _ in 0..2 {
        let out: Vec<_> = p.a.take_outgoing().collect();
        for (_, m) in out {
            p.b.on_mad(p.now, A, &m);
        }
        let back: Vec<_> = p.b.take_outgoing().collect();
        for (_, m) in back {
            captured = Some(m);
            p.a.on_mad(p.now, B, &m);
        }
    }
    let rej = captured.expect("a REJ");
    match rej.message {
        Message::Rej(r) => {
            assert_eq!(r.reason, reason::INVALID_SERVICE_ID);
            assert_eq!(r.local_comm_id, 0);
            assert_eq!(r.remote_comm_id, id.0);
            assert_eq!(r.message_rejected, Answered::Req);
        }
        m => panic!("{m:?}"),
    }
    match p.a.take_events().collect::<Vec<_>>().as_slice() {
        [CmEvent::Rejected {
            id: got, reason, ..
        }] => {
            assert_eq!((*got, *reason), (id, 8));
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(p.a.connections(), 0);
    assert!(p.b.take_events().next().is_none());
}

#[test]
fn the_application_s_reject_carries_its_reason_and_private_data() {
    let mut p = Pair::new();
    let a_id = p.a.connect(p.now, B, &connect_params()).unwrap();
    p.run(|_| false);
    let Some(CmEvent::Request { id, .. }) = p.b.take_events().next() else {
        panic!("no request");
    };
    p.b.reject(id, reason::CONSUMER_DEFINED, b"not now")
        .unwrap();
    assert_eq!(
        p.b.reject(id, reason::CONSUMER_DEFINED, b""),
        Err(CmError::NoSuchId(id)),
        "the connection is gone"
    );
    p.run(|_| false);
    match p.a.take_events().collect::<Vec<_>>().as_slice() {
        [CmEvent::Rejected {
            id,
            reason,
            private_data,
        }] => {
            assert_eq!((*id, *reason), (a_id, 28));
            assert_eq!(&private_data[..7], b"not now");
        }
        e => panic!("{e:?}"),
    }
    assert_eq!((p.a.connections(), p.b.connections()), (0, 0));
}

#[test]
fn a_lost_req_is_sent_again_and_a_repeated_one_is_not_a_second_connection() {
    let mut p = Pair::new();
    let a_id = p.a.connect(p.now, B, &connect_params()).unwrap();
    p.run(|n| n == "REQ");
    assert!(p.b.take_events().next().is_none(), "lost");
    p.tick();
    // The REQ again, byte for byte; B sees one request.
    p.run(|_| false);
    let events: Vec<_> = p.b.take_events().collect();
    assert_eq!(events.len(), 1);
    // And once more (A's timer again, B not answering yet): no second
    // request, an MRA (see a_repeated_req_gets_an_mra_and_the_active_side_waits).
    p.tick();
    p.run(|_| false);
    assert!(p.b.take_events().next().is_none());
    assert_eq!(p.b.connections(), 1);
    assert_eq!(p.names(), ["REQ", "REQ", "REQ", "MRA"]);
    let CmEvent::Request { id, .. } = &events[0] else {
        panic!()
    };
    p.b.accept(p.now, *id, &accept_params()).unwrap();
    p.run(|_| false);
    assert!(matches!(
        p.a.take_events().next(),
        Some(CmEvent::Reply { id, .. }) if id == a_id
    ));
}

#[test]
fn a_lost_rtu_is_answered_by_the_rep_sent_again() {
    let mut p = Pair::new();
    let a_id = p.a.connect(p.now, B, &connect_params()).unwrap();
    p.run(|_| false);
    let Some(CmEvent::Request { id: b_id, .. }) = p.b.take_events().next() else {
        panic!()
    };
    p.b.accept(p.now, b_id, &accept_params()).unwrap();
    p.run(|_| false);
    let _ = p.a.take_events().count();
    p.a.ready(a_id).unwrap();
    p.run(|n| n == "RTU");
    assert_eq!(p.a.take_events().count(), 1, "A is established");
    assert!(p.b.take_events().next().is_none(), "B is not");
    p.tick(); // B's REP again; A answers with the RTU again
    p.run(|_| false);
    assert_eq!(
        p.b.take_events().collect::<Vec<_>>(),
        [CmEvent::Established { id: b_id }]
    );
    assert_eq!(p.names(), ["REQ", "REP", "RTU", "REP", "RTU"]);
    assert_eq!(p.b.next_deadline(), None, "nothing left to send again");
}

#[test]
fn an_unanswered_req_gives_up_after_its_retries() {
    let mut p = Pair::new();
    p.a.max_retries = 3;
    let id = p.a.connect(p.now, B, &connect_params()).unwrap();
    let start = p.now;
    for _ in 0..4 {
        p.run(|_| true);
        p.tick();
    }
    assert_eq!(p.names(), ["REQ"; 4], "the first and three retries");
    assert_eq!(
        p.a.take_events().collect::<Vec<_>>(),
        [CmEvent::Unreachable { id }]
    );
    assert_eq!(p.a.connections(), 0);
    // Each wait is the response timeout (4.096 us x 2^20) doubled.
    let wait = Duration::from_nanos(4096 << 20) * 2;
    assert_eq!(p.now - start, wait * 4);
}

#[test]
fn a_req_repeated_in_timewait_is_refused_as_stale() {
    let mut p = Pair::new();
    let (a_id, _) = p.establish();
    // Keep A's REQ as a late duplicate would arrive.
    let req = Mad::new(
        cm::kernel_tid(p.a.hi_tid, a_id.0),
        Message::Req(
            Req::parse(
                &{
                    let mut m = [0u8; rnic_wire::mad::MAD_LEN];
                    let mut params = connect_params();
                    params.private_data.clear();
                    let mut other = agent(0xa, 1);
                    let id = other.connect(Time::ZERO, B, &params).unwrap();
                    assert_eq!(id, a_id, "the same seed draws the same ID");
                    let (_, mad) = other.take_outgoing().next().unwrap();
                    mad.emit(&mut m);
                    m
                }[24..],
            )
            .unwrap(),
        ),
    );
    p.a.disconnect(p.now, a_id).unwrap();
    p.run(|_| false);
    let _ = (p.a.take_events().count(), p.b.take_events().count());
    p.b.on_mad(p.now, A, &req);
    let out: Vec<_> = p.b.take_outgoing().collect();
    match out.as_slice() {
        [(
            to,
            Mad {
                message: Message::Rej(r),
                ..
            },
        )] => {
            assert_eq!(*to, A);
            assert_eq!(r.reason, reason::STALE_CONN);
            assert_eq!(r.remote_comm_id, a_id.0);
        }
        o => panic!("{o:?}"),
    }
    assert!(p.b.take_events().next().is_none(), "no new connection");
}

#[test]
fn a_dreq_is_answered_even_for_a_connection_gone_and_a_lost_drep_is_retried() {
    let mut p = Pair::new();
    let (a_id, b_id) = p.establish();
    p.a.disconnect(p.now, a_id).unwrap();
    p.run(|n| n == "DREP");
    assert_eq!(
        p.b.take_events().collect::<Vec<_>>(),
        [CmEvent::DisconnectRequest { id: b_id }]
    );
    assert!(p.a.take_events().next().is_none());
    // A sends the DREQ again; B answers again, though its timewait (the
    // earlier deadline) has ended and the connection is gone.
    p.tick();
    assert_eq!(p.b.connections(), 0);
    p.tick();
    p.run(|_| false);
    assert_eq!(
        p.a.take_events().collect::<Vec<_>>(),
        [CmEvent::Disconnected { id: a_id }]
    );
    // A DREQ for nothing at all still gets a DREP.
    let stray = Mad::new(
        99,
        Message::Dreq(Dreq {
            local_comm_id: 5,
            remote_comm_id: 6,
            remote_qpn_eecn: 7,
            private_data: [0; cm::private_len::DREQ],
        }),
    );
    p.b.on_mad(p.now, A, &stray);
    match p.b.take_outgoing().collect::<Vec<_>>().as_slice() {
        [(
            _,
            Mad {
                header,
                message: Message::Drep(d),
            },
        )] => {
            assert_eq!(header.transaction_id, 99);
            assert_eq!((d.local_comm_id, d.remote_comm_id), (6, 5));
        }
        o => panic!("{o:?}"),
    }
}

#[test]
fn misuse_is_refused_and_changes_nothing() {
    let mut p = Pair::new();
    assert_eq!(p.b.listen(SERVICE), Err(CmError::Listening(SERVICE)));
    let mut params = connect_params();
    params.private_data = vec![0; 93];
    assert_eq!(
        p.a.connect(p.now, B, &params),
        Err(CmError::PrivateDataTooLong(93))
    );
    assert_eq!(p.a.connections(), 0);
    let id = p.a.connect(p.now, B, &connect_params()).unwrap();
    assert_eq!(p.a.ready(id), Err(CmError::BadState(id)), "no REP yet");
    assert_eq!(p.a.disconnect(p.now, id), Err(CmError::BadState(id)));
    assert_eq!(
        p.a.accept(p.now, id, &accept_params()),
        Err(CmError::BadState(id))
    );
    assert_eq!(p.a.ready(CmId(1)), Err(CmError::NoSuchId(CmId(1))));
    // A REP from an address that is not the peer's is ignored.
    p.run(|_| false);
    let Some(CmEvent::Request { id: b_id, .. }) = p.b.take_events().next() else {
        panic!()
    };
    p.b.accept(p.now, b_id, &accept_params()).unwrap();
    let (_, rep) = p.b.take_outgoing().next().unwrap();
    let stranger: IpAddr = "10.77.0.9".parse().unwrap();
    p.a.on_mad(p.now, stranger, &rep);
    assert!(p.a.take_events().next().is_none());
    p.a.on_mad(p.now, B, &rep);
    assert!(matches!(
        p.a.take_events().next(),
        Some(CmEvent::Reply { .. })
    ));
}

/// An RTU for a request the application has not accepted establishes
/// nothing, even naming the right IDs (the listener's ID is only sent in a
/// REP; this is the check behind that).
#[test]
fn an_rtu_before_the_accept_establishes_nothing() {
    let mut p = Pair::new();
    let a_id = p.a.connect(p.now, B, &connect_params()).unwrap();
    p.run(|_| false);
    let [CmEvent::Request { id: b_id, .. }] = p.b.take_events().collect::<Vec<_>>()[..] else {
        panic!("no request");
    };
    let tid = p.tids[0];
    let rtu = Message::Rtu(Ids {
        local_comm_id: a_id.0,
        remote_comm_id: b_id.0,
        private_data: [0; cm::private_len::RTU],
    });
    p.b.on_mad(p.now, A, &Mad::new(tid, rtu));
    assert_eq!(
        p.b.take_events().count(),
        0,
        "established without an accept"
    );
    // Accepted, the same RTU establishes it.
    p.b.accept(p.now, b_id, &accept_params()).unwrap();
    p.b.on_mad(p.now, A, &Mad::new(tid, rtu));
    assert_eq!(
        p.b.take_events().collect::<Vec<_>>(),
        [CmEvent::Established { id: b_id }]
    );
}

/// SIDR: the SIDR_REQ reaches the listener with its private data, its
/// answer names the UD QP and Q_Key, and the TID is the request's; nobody
/// listening is status 1 (the kernel's answer); a lost SIDR_REP is asked
/// for again, and unanswered the request ends unreachable.
#[test]
fn sidr_resolves_a_ud_qp_or_says_why_not() {
    let mut p = Pair::new();
    let id = p.a.sidr_request(p.now, B, SERVICE, &[5; 40]).unwrap();
    p.run(|_| false);
    let [CmEvent::SidrRequest {
        id: b_id,
        from,
        req,
    }] = &p.b.take_events().collect::<Vec<_>>()[..]
    else {
        panic!("no SIDR request");
    };
    assert_eq!((*from, req.service_id, req.request_id), (A, SERVICE, id.0));
    assert_eq!(&req.private_data[..40], &[5; 40]);
    p.b.sidr_reply(*b_id, sidr_status::VALID, 0x16, 0x0123_4567, b"ud")
        .unwrap();
    p.run(|_| false);
    let [CmEvent::SidrReply { id: got, rep }] = &p.a.take_events().collect::<Vec<_>>()[..] else {
        panic!("no SIDR reply");
    };
    assert_eq!(*got, id);
    assert_eq!((rep.status, rep.qpn, rep.qkey), (0, 0x16, 0x0123_4567));
    assert_eq!(&rep.private_data[..2], b"ud");
    assert_eq!(p.names(), ["SIDR_REQ", "SIDR_REP"]);
    assert_eq!(p.tids[0], p.tids[1]);
    assert_eq!((p.a.connections(), p.b.connections()), (0, 0));

    // Nobody listens: status 1, from the CM itself.
    let mut p = Pair::new();
    p.b.unlisten(SERVICE);
    let id = p.a.sidr_request(p.now, B, SERVICE, &[]).unwrap();
    p.run(|_| false);
    assert!(matches!(
        &p.a.take_events().collect::<Vec<_>>()[..],
        [CmEvent::SidrReply { id: got, rep }] if *got == id && rep.status == sidr_status::UNSUPPORTED
    ));

    // Every SIDR_REQ lost: sent again on the timer, then unreachable.
    let mut p = Pair::new();
    p.a.max_retries = 2;
    let id = p.a.sidr_request(p.now, B, SERVICE, &[]).unwrap();
    p.run(|name| name == "SIDR_REQ");
    for _ in 0..3 {
        p.tick();
        p.run(|name| name == "SIDR_REQ");
    }
    assert_eq!(p.names(), ["SIDR_REQ"; 3]);
    assert_eq!(
        p.a.take_events().collect::<Vec<_>>(),
        [CmEvent::Unreachable { id }]
    );
}

/// A REQ that comes again while the listener's application has not
/// answered is met with an MRA (service timeout 24, the REQ's TID), as the
/// kernel's rdma_cm answers it; the active side then waits that much longer
/// before sending the REQ again, and the late accept still connects.
#[test]
fn a_repeated_req_gets_an_mra_and_the_active_side_waits() {
    let mut p = Pair::new();
    let a_id = p.a.connect(p.now, B, &connect_params()).unwrap();
    p.run(|_| false);
    let [CmEvent::Request { id: b_id, .. }] = p.b.take_events().collect::<Vec<_>>()[..] else {
        panic!("no request");
    };
    // A's REQ timer fires: the REQ again, and B's MRA.
    p.tick();
    p.run(|_| false);
    assert_eq!(p.names(), ["REQ", "REQ", "MRA"]);
    assert_eq!(p.tids[2], p.tids[0]);
    let waited_from = p.now;
    assert!(
        p.b.take_events().next().is_none(),
        "the repeat is no new request"
    );
    // A now waits the MRA's service timeout (about 137 s for the round trip).
    let next = p.a.next_deadline().unwrap();
    assert!(
        next.since(waited_from) > Duration::from_secs(60),
        "{:?}",
        next.since(waited_from)
    );
    // The application answers late; the connection is made.
    p.now = waited_from + Duration::from_secs(30);
    p.b.accept(p.now, b_id, &accept_params()).unwrap();
    p.run(|_| false);
    assert!(matches!(
        &p.a.take_events().collect::<Vec<_>>()[..],
        [CmEvent::Reply { id, .. }] if *id == a_id
    ));
}

/// The one REJ `side` sent in this run, parsed.
fn only_rej(p: &Pair, from_a: bool) -> Rej {
    let to = if from_a { B } else { A };
    let rejs: Vec<Rej> = p
        .mads
        .iter()
        .filter(|(t, _)| *t == to)
        .filter_map(|(_, m)| match m.message {
            Message::Rej(r) => Some(r),
            _ => None,
        })
        .collect();
    match rejs.as_slice() {
        [r] => *r,
        r => panic!("{r:?}"),
    }
}

#[test]
fn destroying_an_established_id_sends_the_dreq_its_program_did_not() {
    for a_destroys in [true, false] {
        let mut p = Pair::new();
        let (a_id, b_id) = p.establish();
        if a_destroys {
            p.a.destroy(p.now, a_id);
        } else {
            p.b.destroy(p.now, b_id);
        }
        // The first DREQ is lost: it is sent again, though nobody holds
        // the ID any more (the kernel's CM would stop here).
        let first = core::cell::Cell::new(true);
        p.run(|n| first.replace(false) && n == "DREQ");
        assert_eq!(&p.names()[3..], ["DREQ"]);
        p.tick();
        p.run(|_| false);
        assert_eq!(&p.names()[3..], ["DREQ", "DREQ", "DREP"]);
        let (closer, other, oid) = if a_destroys {
            (&mut p.a, &mut p.b, b_id)
        } else {
            (&mut p.b, &mut p.a, a_id)
        };
        assert_eq!(
            other.take_events().collect::<Vec<_>>(),
            [CmEvent::DisconnectRequest { id: oid }]
        );
        assert_eq!(closer.unanswered_dreqs(), 0);
        // Destroying it again, or an ID never made, does nothing.
        closer.destroy(p.now, if a_destroys { a_id } else { b_id });
        closer.destroy(p.now, CmId(0x1234));
        assert_eq!(closer.take_outgoing().count(), 0);
    }
}

#[test]
fn destroying_an_id_midway_rejects_as_the_kernel_s_cm_does() {
    // A's REQ unanswered (B never got it): REJ 4, timeout, with A's CA
    // GUID as the reject information.
    let mut p = Pair::new();
    let a_id = p.a.connect(p.now, B, &connect_params()).unwrap();
    p.run(|n| n == "REQ");
    p.a.destroy(p.now, a_id);
    p.run(|_| false);
    let r = only_rej(&p, true);
    assert_eq!(
        (r.reason, r.message_rejected),
        (reason::TIMEOUT, Answered::Other)
    );
    assert_eq!((r.local_comm_id, r.remote_comm_id), (a_id.0, 0));
    assert_eq!(r.reject_info_length, 8);
    assert_eq!(r.ari[..8], 0xa_u64.to_be_bytes());
    assert_eq!((p.a.connections(), p.a.next_deadline()), (0, None));

    // B destroys the request it has not answered: REJ 28 of the REQ, with
    // local comm ID 0; A learns it.
    let mut p = Pair::new();
    let a_id = p.a.connect(p.now, B, &connect_params()).unwrap();
    p.run(|_| false);
    let Some(CmEvent::Request { id: b_id, .. }) = p.b.take_events().next() else {
        panic!("no request");
    };
    p.b.destroy(p.now, b_id);
    p.run(|_| false);
    let r = only_rej(&p, false);
    assert_eq!(
        (r.reason, r.message_rejected),
        (reason::CONSUMER_DEFINED, Answered::Req)
    );
    assert_eq!((r.local_comm_id, r.remote_comm_id), (0, a_id.0));
    assert!(matches!(
        p.a.take_events().collect::<Vec<_>>().as_slice(),
        [CmEvent::Rejected { id, reason: 28, .. }] if *id == a_id
    ));
    assert_eq!((p.a.connections(), p.b.connections()), (0, 0));

    // A destroys with B's REP in hand, before its RTU: REJ 28 of the REP;
    // B's REP is not sent again.
    let mut p = Pair::new();
    let a_id = p.a.connect(p.now, B, &connect_params()).unwrap();
    p.run(|_| false);
    let Some(CmEvent::Request { id: b_id, .. }) = p.b.take_events().next() else {
        panic!("no request");
    };
    p.b.accept(p.now, b_id, &accept_params()).unwrap();
    p.run(|_| false);
    assert!(matches!(
        p.a.take_events().next(),
        Some(CmEvent::Reply { .. })
    ));
    p.a.destroy(p.now, a_id);
    p.run(|_| false);
    let r = only_rej(&p, true);
    assert_eq!(
        (r.reason, r.message_rejected),
        (reason::CONSUMER_DEFINED, Answered::Rep)
    );
    assert_eq!((r.local_comm_id, r.remote_comm_id), (a_id.0, b_id.0));
    assert!(matches!(
        p.b.take_events().collect::<Vec<_>>().as_slice(),
        [CmEvent::Rejected { id, reason: 28, .. }] if *id == b_id
    ));
    assert_eq!((p.a.connections(), p.b.connections()), (0, 0));

    // B destroys with its REP sent and no RTU yet: REJ 28 ("other"), B in
    // timewait; A, its REP in hand, learns it and rests in timewait too,
    // so an RTU it then sends finds nothing.
    let mut p = Pair::new();
    let a_id = p.a.connect(p.now, B, &connect_params()).unwrap();
    p.run(|_| false);
    let Some(CmEvent::Request { id: b_id, .. }) = p.b.take_events().next() else {
        panic!("no request");
    };
    p.b.accept(p.now, b_id, &accept_params()).unwrap();
    p.run(|_| false);
    assert!(matches!(
        p.a.take_events().next(),
        Some(CmEvent::Reply { .. })
    ));
    p.b.destroy(p.now, b_id);
    p.run(|_| false);
    let r = only_rej(&p, false);
    assert_eq!(
        (r.reason, r.message_rejected),
        (reason::CONSUMER_DEFINED, Answered::Other)
    );
    assert_eq!((r.local_comm_id, r.remote_comm_id), (b_id.0, a_id.0));
    assert!(matches!(
        p.a.take_events().collect::<Vec<_>>().as_slice(),
        [CmEvent::Rejected { id, reason: 28, .. }] if *id == a_id
    ));
    assert_eq!(p.a.ready(a_id), Err(CmError::BadState(a_id)));
    assert_eq!((p.a.connections(), p.b.connections()), (1, 1));
    p.tick();
    assert_eq!((p.a.connections(), p.b.connections()), (0, 0));
}

#[test]
fn a_rej_that_names_another_connection_of_the_peer_ends_nothing() {
    let mut p = Pair::new();
    let (a_id, b_id) = p.establish();
    let stray = |local| {
        Mad::new(
            7,
            Message::Rej(Rej::new(
                local,
                a_id.0,
                Answered::Other,
                reason::CONSUMER_DEFINED,
            )),
        )
    };
    p.a.on_mad(p.now, B, &stray(b_id.0 ^ 1));
    p.a.on_mad(p.now, A, &stray(b_id.0));
    assert_eq!(p.a.take_events().count(), 0);
    p.a.on_mad(p.now, B, &stray(b_id.0));
    assert!(matches!(
        p.a.take_events().collect::<Vec<_>>().as_slice(),
        [CmEvent::Rejected { id, .. }] if *id == a_id
    ));
    assert_eq!(p.a.disconnect(p.now, a_id), Err(CmError::BadState(a_id)));
}

#[test]
fn a_process_ending_destroys_every_id_and_can_resend_its_dreqs() {
    let mut p = Pair::new();
    p.establish();
    p.a.connect(p.now, B, &connect_params()).unwrap();
    p.run(|n| n == "REQ");
    p.a.destroy_all(p.now);
    assert_eq!(p.a.unanswered_dreqs(), 1);
    let mut sent: Vec<&str> = p.a.take_outgoing().map(|(_, m)| m.message.name()).collect();
    sent.sort_unstable();
    assert_eq!(sent, ["DREQ", "REJ"]);
    // Its timers are not to be waited for: the DREQ goes again now, and
    // again, without spending a retry.
    let deadline = p.a.next_deadline();
    p.a.resend_dreqs();
    p.a.resend_dreqs();
    let again: Vec<&str> = p.a.take_outgoing().map(|(_, m)| m.message.name()).collect();
    assert_eq!(again, ["DREQ", "DREQ"]);
    assert_eq!(p.a.next_deadline(), deadline);
}
