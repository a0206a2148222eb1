//! Connecting through the communication manager, by IP address and port,
//! between two NICs on loopback: no side channel, only QP1.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use rnic_verbs::*;

const WAIT: Duration = Duration::from_secs(10);

fn qp(dev: &Device) -> (ProtectionDomain, CompletionQueue, QueuePair) {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    (pd, cq, qp)
}

/// A listener takes the request with the client's private data, accepts
/// with its own, and a WRITE and a SEND then cross the connection the CM
/// set up; both sides disconnect cleanly.
#[test]
fn connect_by_address_and_port_then_write() {
    let (a, b) = (
        Device::open_loopback().unwrap(),
        Device::open_loopback().unwrap(),
    );
    let listener = b.listen(0).unwrap();
    let to = SocketAddr::new(b.addr(), listener.port());
    let server = std::thread::spawn(move || {
        let (pd, cq, qp) = qp(&b);
        let mr = pd
            .register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        qp.init(Access::REMOTE_WRITE).unwrap();
        qp.post_recv(RecvWr {
            wr_id: 7,
            sg_list: sg_list![mr.sge(1024, 64)],
        })
        .unwrap();
        let incoming = listener.next(WAIT).unwrap();
        assert_eq!(incoming.private_data()[..6], *b"client");
        let mut grant = Vec::new();
        grant.extend_from_slice(&mr.addr().to_be_bytes());
        grant.extend_from_slice(&mr.rkey().to_be_bytes());
        let conn = incoming.accept(&qp, &grant, WAIT).unwrap();
        let c = cq.wait(WAIT).unwrap();
        assert_eq!((c.wr_id, c.status, c.byte_len), (7, WcStatus::Success, 5));
        let mut got = [0u8; 16];
        mr.read(0, &mut got);
        assert_eq!(&got, b"written via CM!!");
        conn.wait_disconnect(WAIT).unwrap();
        drop(qp);
    });
    let (pd, cq, qp) = qp(&a);
    let src = pd.register(4096, Access::LOCAL_WRITE).unwrap();
    let conn = a.connect(&qp, to, b"client", WAIT).unwrap();
    let grant = conn.private_data();
    let addr = u64::from_be_bytes(grant[..8].try_into().unwrap());
    let rkey = u32::from_be_bytes(grant[8..12].try_into().unwrap());
    src.write(0, b"written via CM!!");
    qp.post_send(SendWr::new(
        1,
        SendOp::write(addr, rkey),
        sg_list![src.sge(0, 16)],
    ))
    .unwrap();
    assert_eq!(cq.wait(WAIT).unwrap().status, WcStatus::Success);
    src.write(100, b"hello");
    qp.post_send(SendWr::new(2, SendOp::send(), sg_list![src.sge(100, 5)]))
        .unwrap();
    assert_eq!(cq.wait(WAIT).unwrap().status, WcStatus::Success);
    conn.disconnect(WAIT).unwrap();
    server.join().unwrap();
    let g = a.gsi_counters().unwrap();
    assert!(g.mads_sent >= 3 && g.mads_received >= 2, "{g:?}");
}

/// A port nobody listens on refuses with REJ reason 8, as the kernel's CM
/// does; a port taken is taken for a second listener, and free again once
/// the first is gone.
#[test]
fn refused_and_taken_ports() {
    let (a, b) = (
        Device::open_loopback().unwrap(),
        Device::open_loopback().unwrap(),
    );
    let (_pd, _cq, qp) = qp(&a);
    let listener = b.listen(0).unwrap();
    let port = listener.port();
    drop(listener);
    let e = a
        .connect(&qp, SocketAddr::new(b.addr(), port), &[], WAIT)
        .unwrap_err();
    match e {
        Error::Io(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            assert!(e.to_string().contains("reason 8"), "{e}")
        }
        e => panic!("{e}"),
    }
    let first = b.listen(port).unwrap();
    match b.listen(port) {
        Err(Error::Io(e)) if e.kind() == io::ErrorKind::AddrInUse => {}
        other => panic!("a second listener on port {port}: {other:?}"),
    }
    drop(first);
    b.listen(port).unwrap();
}

/// The listener refuses with private data: the client learns reason 28.
#[test]
fn a_listener_that_says_no() {
    let (a, b) = (
        Device::open_loopback().unwrap(),
        Device::open_loopback().unwrap(),
    );
    let listener = b.listen(0).unwrap();
    let to = SocketAddr::new(b.addr(), listener.port());
    let server = std::thread::spawn(move || {
        listener.next(WAIT).unwrap().reject(b"go away").unwrap();
    });
    let (_pd, _cq, qp) = qp(&a);
    let e = a.connect(&qp, to, &[], WAIT).unwrap_err();
    assert!(e.to_string().contains("reason 28"), "{e}");
    server.join().unwrap();
}

/// Eight REQs sent back to back (as `ucmatose -c 8` sends them: one burst,
/// one GSO send on loopback) are eight requests at the listener.
#[test]
fn a_burst_of_requests_reaches_the_listener_whole() {
    use rnic_verbs::cm::{self, CmChannel, CmEvent, Notice, PortSpace};
    let (a, b) = (
        Device::open_loopback().unwrap(),
        Device::open_loopback().unwrap(),
    );
    let listener = b.listen(0).unwrap();
    let to = SocketAddr::new(b.addr(), listener.port());
    let channel = CmChannel::new().unwrap();
    for k in 0..8u16 {
        let p = cm::request(
            PortSpace::Tcp,
            SocketAddr::new(a.addr(), 40000 + k),
            to,
            0x100 + u32::from(k),
            u32::from(k),
            Mtu::Mtu1024,
            1,
            1,
            7,
            7,
            &[],
        )
        .unwrap();
        a.cm_connect(b.addr(), &p, &channel, u64::from(k)).unwrap();
    }
    let mut seen = Vec::new();
    while seen.len() < 8 {
        match listener.next(Duration::from_secs(5)) {
            Ok(r) => seen.push(r.peer().port()),
            Err(e) => panic!(
                "after {} requests: {e}; B's QP1: {:?}",
                seen.len(),
                b.gsi_counters()
            ),
        }
    }
    seen.sort();
    assert_eq!(seen, (40000..40008).collect::<Vec<_>>());
    let _ = (Notice::Own(0), CmEvent::Established { id: cm::CmId(0) });
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Connections made and ended one after another leave nothing behind: no
/// descriptor (each connection's QPs send from a UDP port of their own,
/// the kernel's from the rdma_cm ports, and its socket goes with them),
/// no connection held past timewait beyond the few still resting.
#[test]
fn connections_come_and_go_without_a_trace() {
    let (a, b) = (
        Device::open_loopback().unwrap(),
        Device::open_loopback().unwrap(),
    );
    let listener = b.listen(0).unwrap();
    let to = SocketAddr::new(b.addr(), listener.port());
    let round = |k: u32| {
        let (_pd_b, _cq_b, qp_b) = qp(&b);
        let (_pd_a, _cq_a, qp_a) = qp(&a);
        std::thread::scope(|s| {
            let client = s.spawn(|| a.connect(&qp_a, to, &k.to_be_bytes(), WAIT).unwrap());
            let conn_b = listener
                .next(WAIT)
                .unwrap()
                .accept(&qp_b, &[], WAIT)
                .unwrap();
            let conn_a = client.join().unwrap();
            conn_a.disconnect(WAIT).unwrap();
            conn_b.wait_disconnect(WAIT).unwrap();
        });
    };
    round(0);
    let settled = |want: usize| {
        // A socket goes once nothing held for the program's answer (an
        // ACK, for a moment at most) leaves from it any more.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while open_fds() > want && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        open_fds()
    };
    std::thread::sleep(Duration::from_millis(100));
    let before = open_fds();
    for k in 1..=50 {
        round(k);
    }
    let after = settled(before);
    assert!(
        after <= before,
        "descriptors left behind: {before} before, {after} after"
    );
}

/// The accepting side's SENDs complete too (its QP set up from the REQ).
#[test]
fn the_passive_side_sends_and_its_sends_complete() {
    let (a, b) = (
        Device::open_loopback().unwrap(),
        Device::open_loopback().unwrap(),
    );
    let listener = b.listen(0).unwrap();
    let to = SocketAddr::new(b.addr(), listener.port());
    let (pd_a, cq_a, qp_a) = qp(&a);
    let (pd_b, cq_b, qp_b) = qp(&b);
    let ma = pd_a.register(4096, Access::LOCAL_WRITE).unwrap();
    let mb = pd_b.register(4096, Access::LOCAL_WRITE).unwrap();
    // Both QPs at INIT with receives posted before the connection, as an
    // rdma_cm program has them (and `rnic pingpong --cm`).
    qp_a.init(Access::NONE).unwrap();
    qp_b.init(Access::NONE).unwrap();
    for k in 0..4 {
        qp_a.post_recv(RecvWr {
            wr_id: k,
            sg_list: sg_list![ma.sge(0, 64)],
        })
        .unwrap();
        qp_b.post_recv(RecvWr {
            wr_id: k,
            sg_list: sg_list![mb.sge(64, 64)],
        })
        .unwrap();
    }
    let (conn_a, conn_b) = std::thread::scope(|s| {
        let c = s.spawn(|| a.connect(&qp_a, to, &[], WAIT).unwrap());
        let conn_b = listener
            .next(WAIT)
            .unwrap()
            .accept(&qp_b, &[], WAIT)
            .unwrap();
        (c.join().unwrap(), conn_b)
    });
    mb.write(0, b"from b");
    for k in 0..4 {
        qp_b.post_send(SendWr::new(100 + k, SendOp::send(), sg_list![mb.sge(0, 6)]))
            .unwrap();
        let c = cq_b.wait(WAIT).unwrap();
        assert_eq!(
            (c.wr_id, c.status),
            (100 + k, WcStatus::Success),
            "B's SEND {k}"
        );
        let r = cq_a.wait(WAIT).unwrap();
        assert_eq!((r.wr_id, r.status, r.byte_len), (k, WcStatus::Success, 6));
        // And back.
        qp_a.post_send(SendWr::new(200 + k, SendOp::send(), sg_list![ma.sge(0, 6)]))
            .unwrap();
        let c = cq_a.wait(WAIT).unwrap();
        assert_eq!(
            (c.wr_id, c.status),
            (200 + k, WcStatus::Success),
            "A's SEND {k}"
        );
        let r = cq_b.wait(WAIT).unwrap();
        assert_eq!((r.wr_id, r.status), (k, WcStatus::Success));
    }
    conn_a.disconnect(WAIT).unwrap();
    conn_b.wait_disconnect(WAIT).unwrap();
}
