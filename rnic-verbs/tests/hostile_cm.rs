//! A hostile peer of the connection manager, on loopback: CM MADs sent to
//! a NIC's QP 1 from a plain UDP socket, as anyone on the network can send
//! them (no spoofing needed), with a right ICRC. Malformed MADs, messages
//! of transactions nobody started, a request whose rdma_cm header lies,
//! and a flood of requests that never complete: each is dropped or
//! answered as the kernel's CM does, counted, and leaves the listener able
//! to take a legitimate connection.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::Duration;

use rnic_core::cm::CmAgent;
use rnic_core::rng::SecretRng;
use rnic_core::time::Time;
use rnic_verbs::cm::{self, PortSpace};
use rnic_verbs::*;
use rnic_wire::cm::{Dreq, Ids, Mad, Message};
use rnic_wire::mad::{GSI_QKEY, GSI_QPN, MAD_LEN};
use rnic_wire::{bth, deth, icrc, IbRepr, Opcode, Psn};

const WAIT: Duration = Duration::from_secs(10);

/// Outside the range `open_loopback` takes from.
const ATTACKER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 44, 1));

struct Attacker {
    sock: UdpSocket,
    cm: CmAgent,
}

impl Attacker {
    fn new() -> Attacker {
        let sock = UdpSocket::bind((ATTACKER, 0)).unwrap();
        // DF and IPv4 identification 0: the ICRC convention of UDP senders.
        rustix::net::sockopt::set_ip_mtu_discover(
            &sock,
            rustix::net::sockopt::Ipv4PathMtuDiscovery::DO,
        )
        .unwrap();
        Attacker {
            sock,
            cm: CmAgent::new(0x4444, SecretRng::from_u64(44)),
        }
    }

    /// A UD SEND to `to`'s QP 1 with Q_Key `qkey`, carrying `payload`.
    fn send(&self, to: IpAddr, qkey: u32, payload: &[u8]) {
        let mut ib = IbRepr::new(bth::Repr::new(Opcode::UD_SEND_ONLY, GSI_QPN, Psn::new(0)));
        ib.deth = Some(deth::Repr {
            q_key: qkey,
            src_qp: GSI_QPN,
        });
        ib.payload_len = payload.len();
        let mut buf = vec![0u8; ib.buffer_len()];
        ib.emit(&mut buf, payload).unwrap();
        let n = buf.len();
        let port = self.sock.local_addr().unwrap().port();
        let crc = icrc::for_udp(ATTACKER, to, port, &buf[..n - 4]).unwrap();
        buf[n - 4..].copy_from_slice(&crc.to_le_bytes());
        self.sock
            .send_to(&buf, SocketAddr::new(to, rnic_wire::ROCE_V2_PORT))
            .unwrap();
    }

    fn send_mad(&self, to: IpAddr, mad: &Mad) -> [u8; MAD_LEN] {
        let mut b = [0u8; MAD_LEN];
        mad.emit(&mut b);
        self.send(to, GSI_QKEY, &b);
        b
    }

    /// An rdma_cm REQ for `service` at `to`, its header naming `from`.
    fn request(&mut self, from: SocketAddr, to: SocketAddr) -> Mad {
        let p = cm::request(
            PortSpace::Tcp,
            from,
            to,
            0x77,
            0,
            Mtu::Mtu1024,
            1,
            1,
            7,
            7,
            &[],
        )
        .unwrap();
        self.cm.connect(Time::ZERO, to.ip(), &p).unwrap();
        self.cm.take_outgoing().last().unwrap().1
    }
}

/// Wait until `f` of `dev`'s QP 1 counters reaches `want` (up to WAIT).
fn gsi_reaches(dev: &Device, f: fn(&rnic_core::nic::GsiCounters) -> u64, want: u64) -> u64 {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let got = f(&dev.gsi_counters().unwrap());
        if got >= want || std::time::Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_hostile_cm_peer_is_dropped_counted_and_harmless() {
    let b = Device::open_loopback().unwrap();
    let listener = b.listen(0).unwrap();
    let to = SocketAddr::new(b.addr(), listener.port());
    let mut evil = Attacker::new();
    let base = b.gsi_counters().unwrap();

    // Malformed: a Q_Key other than the GSI's; a MAD cut short; a
    // management class other than the CM's; an attribute the CM lacks.
    let req = evil.request(SocketAddr::new(ATTACKER, 5000), to);
    let mut bytes = [0u8; MAD_LEN];
    req.emit(&mut bytes);
    evil.send(b.addr(), 0x1234_5678, &bytes);
    evil.send(b.addr(), GSI_QKEY, &bytes[..100]);
    let mut other_class = bytes;
    other_class[1] = 0x01;
    evil.send(b.addr(), GSI_QKEY, &other_class);
    let mut other_attr = bytes;
    other_attr[16..18].copy_from_slice(&0x0019u16.to_be_bytes());
    evil.send(b.addr(), GSI_QKEY, &other_attr);
    assert_eq!(
        gsi_reaches(&b, |g| g.dropped_bad_header, base.dropped_bad_header + 1),
        base.dropped_bad_header + 1
    );
    assert_eq!(
        gsi_reaches(&b, |g| g.dropped_bad_mad, base.dropped_bad_mad + 3),
        base.dropped_bad_mad + 3
    );

    // Transactions nobody started: an RTU and a DREP are dropped; a DREQ
    // is answered with a DREP, as the kernel answers one, and nothing more.
    let ids = Ids {
        local_comm_id: 0x1111,
        remote_comm_id: 0xdead_beef,
        private_data: [0; rnic_wire::cm::private_len::RTU],
    };
    let sent = b.gsi_counters().unwrap().mads_sent;
    evil.send_mad(b.addr(), &Mad::new(1, Message::Rtu(ids)));
    evil.send_mad(b.addr(), &Mad::new(2, Message::Drep(ids)));
    let dreq = Dreq {
        local_comm_id: 0x1111,
        remote_comm_id: 0xdead_beef,
        remote_qpn_eecn: 0x77,
        private_data: [0; rnic_wire::cm::private_len::DREQ],
    };
    evil.send_mad(b.addr(), &Mad::new(3, Message::Dreq(dreq)));
    gsi_reaches(&b, |g| g.mads_sent, sent + 1);

    // A request whose rdma_cm header names another sender: refused with
    // REJ 28, as the kernel's rdma_cm refuses a header it cannot route
    // back (tests/tests/cm_hostile_vm.rs compares the two), counted.
    let lie = evil.request(SocketAddr::new([127, 0, 44, 99].into(), 5001), to);
    evil.send_mad(b.addr(), &lie);
    assert_eq!(
        gsi_reaches(&b, |g| g.rejected_rdma_cm, 1),
        1,
        "the lying request is counted"
    );
    // None of it reached the listener.
    assert!(listener.next(Duration::from_millis(100)).is_err());
    let g = b.gsi_counters().unwrap();
    assert_eq!(g.mads_sent, sent + 2, "the DREP and the REJ: {g:?}");
    assert_eq!(b.cm_connections().unwrap(), 0, "nothing kept");

    // A flood of requests that never complete: the listener holds at most
    // its backlog of them; the rest are dropped, as the kernel's CM drops
    // a request its listener has no room for.
    let flood = rnic_core::cm::DEFAULT_BACKLOG + 500;
    let received = g.mads_received;
    for k in 0..flood {
        let r = evil.request(SocketAddr::new(ATTACKER, 10_000 + k as u16), to);
        evil.send_mad(b.addr(), &r);
        if k % 64 == 0 {
            // Paced: a full socket buffer would drop some uncounted.
            std::thread::sleep(Duration::from_micros(500));
        }
    }
    gsi_reaches(&b, |g| g.mads_received, received + flood as u64);
    let mut held = Vec::new();
    while let Ok(r) = listener.next(Duration::from_millis(300)) {
        held.push(r);
    }
    assert_eq!(held.len(), rnic_core::cm::DEFAULT_BACKLOG);
    for r in held {
        r.reject(&[]).unwrap();
    }

    // And a legitimate client still connects.
    let a = Device::open_loopback().unwrap();
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(4).unwrap();
    let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    let pd_b = b.alloc_pd().unwrap();
    let cq_b = b.create_cq(4).unwrap();
    let qp_b = pd_b.create_rc_qp(&cq_b, &cq_b, QpCaps::default()).unwrap();
    std::thread::scope(|s| {
        let c = s.spawn(|| a.connect(&qp, to, b"legit", WAIT).unwrap());
        let incoming = listener.next(WAIT).unwrap();
        assert_eq!(&incoming.private_data()[..5], b"legit");
        incoming.accept(&qp_b, &[], WAIT).unwrap();
        c.join().unwrap();
    });
}
