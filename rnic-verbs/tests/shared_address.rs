//! Several NICs on one address, as a host's processes share its
//! addresses: the first receives the address's packets and hands on those
//! that are another's (by the slot in the QP number, or in the CM ID a CM
//! message names, or by who listens on the service a request names).
//! Here the NICs are in one process; `tools/rdmacm-tests` runs the same
//! with unmodified programs in several.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use rnic_verbs::*;

const WAIT: Duration = Duration::from_secs(10);

struct Side {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn side(dev: &Device) -> Side {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = pd.register(4096, access).unwrap();
    qp.init(Access::REMOTE_WRITE | Access::REMOTE_READ).unwrap();
    qp.post_recv(RecvWr {
        wr_id: 1,
        sg_list: sg_list![mr.sge(2048, 64)],
    })
    .unwrap();
    Side { pd, cq, qp, mr }
}

impl Side {
    /// Post `op` with the 6 bytes of this side's buffer at `at`, and wait
    /// for its successful completion.
    fn run(&self, wr_id: u64, op: SendOp, at: usize) {
        self.qp
            .post_send(SendWr::new(wr_id, op, sg_list![self.mr.sge(at, 6)]))
            .unwrap();
        assert_eq!(self.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    }
}

fn grant(s: &Side) -> Vec<u8> {
    let mut g = s.mr.addr().to_be_bytes().to_vec();
    g.extend_from_slice(&s.mr.rkey().to_be_bytes());
    g
}

fn granted(g: &[u8]) -> (u64, u32) {
    (
        u64::from_be_bytes(g[..8].try_into().unwrap()),
        u32::from_be_bytes(g[8..12].try_into().unwrap()),
    )
}

/// `a` connects to `b`'s listener (at `b_addr`, which `b` may share),
/// then each WRITEs, READs and SENDs to the other, data checked; `a`
/// disconnects.
fn connect_and_talk(a: &Device, b: &Device, b_addr: IpAddr) {
    let listener = b.listen(0).unwrap();
    let to = SocketAddr::new(b_addr, listener.port());
    let (sa, sb) = (side(a), side(b));
    let (conn_a, conn_b) = std::thread::scope(|s| {
        let c = s.spawn(|| a.connect(&sa.qp, to, &grant(&sa), WAIT).unwrap());
        let incoming = listener.next(WAIT).unwrap();
        let (addr, rkey) = granted(incoming.private_data());
        let conn_b = incoming.accept(&sb.qp, &grant(&sb), WAIT).unwrap();
        (c.join().unwrap(), (conn_b, addr, rkey))
    });
    let (conn_b, a_buf, a_rkey) = conn_b;
    let (b_buf, b_rkey) = granted(conn_a.private_data());
    for (me, peer_buf, peer_rkey, peer, tag) in [
        (&sa, b_buf, b_rkey, &sb, b"from a"),
        (&sb, a_buf, a_rkey, &sa, b"from b"),
    ] {
        me.mr.write(0, tag);
        me.run(10, SendOp::write(peer_buf, peer_rkey), 0);
        let mut got = [0u8; 6];
        peer.mr.read(0, &mut got);
        assert_eq!(&got, tag, "the WRITE landed");
        // READ it back into the requester's buffer at 512.
        me.run(11, SendOp::read(peer_buf, peer_rkey), 512);
        me.mr.read(512, &mut got);
        assert_eq!(&got, tag, "the READ brought it back");
        me.run(12, SendOp::send(), 0);
        let r = peer.cq.wait(WAIT).unwrap();
        assert_eq!((r.wr_id, r.status, r.byte_len), (1, WcStatus::Success, 6));
        peer.mr.read(2048, &mut got);
        assert_eq!(&got, tag, "the SEND arrived");
    }
    conn_a.disconnect(WAIT).unwrap();
    conn_b.wait_disconnect(WAIT).unwrap();
    drop((sa.pd, sb.pd));
}

/// The address's first NIC, a second one sharing it, and a client on an
/// address of its own: the client connects to a listener on each through
/// the CM, and to the second from it, and data flows both ways on every
/// connection; a port nobody on the address listens on is refused.
#[test]
fn nics_sharing_an_address_each_connect_and_talk() {
    let first = Device::open_loopback().unwrap();
    let addr = first.addr();
    let second = Device::open(addr).unwrap();
    let client = Device::open_loopback().unwrap();
    assert_ne!(client.addr(), addr);
    assert_eq!(
        (
            first.sharing().unwrap().slot,
            second.sharing().unwrap().slot
        ),
        (0, 1)
    );

    // The client to the second NIC's listener: its REQ, RTU and data
    // come in at the first and are handed on.
    connect_and_talk(&client, &second, addr);
    let handed = first.sharing().unwrap().relayed;
    assert!(handed >= 2 + 6, "the first handed on {handed} packets");
    // The second connects out: the REP comes back by its CM ID's slot.
    connect_and_talk(&second, &client, client.addr());
    // The first's own listener still answers at its address.
    connect_and_talk(&client, &first, addr);
    // And the two on the address reach each other.
    connect_and_talk(&second, &first, addr);
    connect_and_talk(&first, &second, addr);

    // A port nobody listens on: REJ reason 8, from the first's CM.
    let port = {
        let l = second.listen(0).unwrap();
        l.port()
    };
    let s = side(&client);
    match client.connect(&s.qp, SocketAddr::new(addr, port), &[], WAIT) {
        Err(Error::Io(e)) if e.kind() == io::ErrorKind::ConnectionRefused => {
            assert!(e.to_string().contains("reason 8"), "{e}")
        }
        other => panic!("a port nobody listens on: {other:?}"),
    }
    assert_eq!(first.sharing().unwrap().undeliverable, 0);
}

/// A QP of a slot no NIC holds (one that has closed): the address's first
/// NIC counts its packets as a NIC counts those for a QP it lacks.
#[test]
fn packets_for_a_slot_nobody_holds_are_dropped_and_counted() {
    let first = Device::open_loopback().unwrap();
    let addr = first.addr();
    let second = Device::open(addr).unwrap();
    let client = Device::open_loopback().unwrap();
    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(4).unwrap();
    let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    let mr = pd.register(64, Access::LOCAL_WRITE).unwrap();
    // A QP number of the second's slot, connected before it goes.
    let target = {
        let s = side(&second);
        s.qp.qpn()
    };
    drop(second);
    let to = Endpoint {
        addr,
        qpn: target,
        psn: 0,
    };
    qp.connect(&to, &ConnectOptions::default()).unwrap();
    qp.post_send(SendWr::new(1, SendOp::send(), sg_list![mr.sge(0, 8)]))
        .unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while first.counters().unwrap().unknown_qp == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(first.counters().unwrap().unknown_qp >= 1);
    assert_eq!(first.sharing().unwrap().relayed, 0);
    let _ = mr;
}

/// The NIC that received the address's packets closes first: the other
/// is told once (its connection ends) and goes on answering its program,
/// neither spinning on the closed connection nor counting it as packets.
#[test]
fn the_first_nic_closing_leaves_the_others_quiet() {
    let first = Device::open_loopback().unwrap();
    let addr = first.addr();
    let second = Device::open(addr).unwrap();
    drop(first);
    std::thread::sleep(Duration::from_millis(300));
    let c = second.counters().unwrap();
    if (c.malformed, c.rcvd_pkts) != (0, 0) {
        // An engine thread reading the closed connection over and over
        // never stops, and dropping the device would wait for it: the
        // test fails rather than hangs.
        std::mem::forget(second);
        panic!("the closed connection was read as packets: {c:?}");
    }
    let s = side(&second);
    assert!(s.qp.qpn() >> 20 == 1);
}
