//! Sends past IP and UDP on loopback (`frames::FrameSender`): a NIC
//! that reads `lo` through a ring writes its packets' link-layer, IPv4 and
//! UDP headers itself, to peers whose packets a ring takes in too. The
//! kernel's IP layer drops such a packet (a martian, to a loopback address
//! with no route), so a peer on its UDP socket must be sent nothing that
//! way.

use super::*;

/// A NIC with a ring (sending past IP and UDP), and a peer with a ring
/// if `ring_peer` or on its socket; None where there is no ring to be had.
fn devices(ring_peer: bool) -> Option<(Device, Device)> {
    let open = |ring| {
        Device::open_loopback_with(&Config {
            ring,
            ..Config::from_env().unwrap()
        })
        .unwrap()
    };
    let a = open(true);
    if !a.engine.has_ring() {
        eprintln!("SKIPPED: no receive ring (CAP_NET_RAW is needed)");
        assert!(std::env::var_os("RNIC_REQUIRE_TOOLS").is_none());
        return None;
    }
    let b = open(ring_peer);
    assert_eq!(b.engine.has_ring(), ring_peer);
    Some((a, b))
}

const T: Duration = Duration::from_secs(20);

#[test]
fn a_peer_with_a_ring_takes_what_left_past_ip_and_udp_in_order() {
    let Some((a, b)) = devices(true) else {
        return;
    };
    let (small, write) = exchange(&a, &b);
    assert!(
        small >= 400,
        "{small} datagrams of the ping-pong past IP and UDP"
    );
    assert!(write > 0, "none of the WRITE went past IP and UDP");
}

/// A UDP socket would never see what leaves past IP and UDP (the IP layer
/// drops it): to a peer without a ring, everything goes through the socket.
#[test]
fn a_peer_on_its_udp_socket_is_sent_nothing_past_ip_and_udp() {
    let Some((a, b)) = devices(false) else {
        return;
    };
    assert_eq!(exchange(&a, &b), (0, 0));
}

/// A ping-pong of small SENDs, then WRITEs of 512 KiB in all, from `a` to `b`,
/// every byte and completion checked, and neither NIC having seen a bad
/// ICRC or a packet out of order; how many datagrams `a` sent past IP and
/// UDP in each part.
fn exchange(a: &Device, b: &Device) -> (u64, u64) {
    const LEN: usize = 256 << 10;
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ma, mb) = (
        pa.register(2 * LEN, rights).unwrap(),
        pb.register(2 * LEN + 64, rights).unwrap(),
    );
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let qa = pa.create_rc_qp(&ca, &ca, QpCaps::default()).unwrap();
    let qb = pb.create_rc_qp(&cb, &cb, QpCaps::default()).unwrap();
    // At 4,096 bytes a packet, a pump's batch of 32 datagrams of a long
    // WRITE is its first packet alone, two GSO sends of 15 and a last one
    // alone, all in one system call.
    let o = ConnectOptions {
        mtu: Mtu::Mtu4096,
        ..ConnectOptions::default()
    };
    qa.connect(&qb.endpoint(), &o).unwrap();
    qb.connect(&qa.endpoint(), &o).unwrap();

    // A ping-pong of small SENDs: each answer leaves with the ACK of the
    // SEND it answers, one GSO send of two datagrams (the second's ICRC
    // made for identification 1).
    for i in 0..200u32 {
        qa.post_recv(RecvWr {
            wr_id: 0,
            sg_list: sg_list![ma.sge(LEN, 64)],
        })
        .unwrap();
        qb.post_recv(RecvWr {
            wr_id: 0,
            sg_list: sg_list![mb.sge(2 * LEN, 64)],
        })
        .unwrap();
        assert!(ma.write(0, &i.to_le_bytes()));
        qa.post_send(SendWr::new(1, SendOp::send(), sg_list![ma.sge(0, 4)]))
            .unwrap();
        let c = cb.wait(T).expect("b's receive");
        assert_eq!((c.status, c.byte_len), (WcStatus::Success, 4), "{c:?}");
        let mut got = [0u8; 4];
        mb.read(2 * LEN, &mut got);
        assert_eq!(u32::from_le_bytes(got), i);
        assert!(mb.write(0, &(!i).to_le_bytes()));
        qb.post_send(SendWr::new(2, SendOp::send(), sg_list![mb.sge(0, 4)]))
            .unwrap();
        for _ in 0..2 {
            let c = ca.wait(T).expect("a's completions");
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
        }
        ma.read(LEN, &mut got);
        assert_eq!(u32::from_le_bytes(got), !i);
        let c = cb.wait(T).expect("b's SEND completion");
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
    }
    let past = a.engine.frames_sent();

    // A WRITE: its first packet (longer, with a RETH) alone, the rest as
    // GSO sends.
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 % 253) as u8).collect();
    assert!(ma.write(0, &data));
    let write = SendOp::write(mb.addr(), mb.rkey());
    qa.post_send(SendWr::new(3, write, sg_list![ma.sge(0, LEN as u32)]))
        .unwrap();
    let c = ca.wait(T).expect("the WRITE's completion");
    assert_eq!((c.wr_id, c.status), (3, WcStatus::Success), "{c:?}");
    let mut back = vec![0u8; LEN];
    mb.read(0, &mut back);
    assert!(back == data, "the WRITE landed whole");
    // WRITEs one after another: each one's first packet right behind the
    // GSO sends of the one before.
    const PART: usize = LEN / 4;
    for k in 0..4 {
        let write = SendOp::write(mb.addr() + (LEN + k * PART) as u64, mb.rkey());
        let sge = ma.sge(k * PART, PART as u32);
        qa.post_send(SendWr::new(4 + k as u64, write, sg_list![sge]))
            .unwrap();
    }
    for k in 0..4 {
        let c = ca.wait(T).expect("the WRITEs' completions");
        assert_eq!((c.wr_id, c.status), (4 + k, WcStatus::Success), "{c:?}");
    }
    mb.read(LEN, &mut back);
    assert!(back == data, "the WRITEs landed whole");

    let (ka, kb) = (a.counters().unwrap(), b.counters().unwrap());
    assert_eq!((kb.icrc_errors, kb.malformed), (0, 0), "{kb:?}");
    assert_eq!(
        (kb.out_of_seq_request, kb.duplicate_request),
        (0, 0),
        "b took a's packets in the order they left: {kb:?}"
    );
    assert_eq!((ka.icrc_errors, ka.rcvd_seq_err), (0, 0), "{ka:?}");
    (past, a.engine.frames_sent() - past)
}
