//! The UDP transport on loopback with its receive ring (`RNIC_RING=on`):
//! packets come in from an AF_PACKET ring on `lo`, the NIC's UDP socket
//! receiving nothing. Small packets lie in the ring's frames; a GSO send
//! (loopback carries it whole, up to 64 KiB) is longer than a frame and
//! comes whole from the socket's queue, cut into its datagrams by the
//! segment size its virtio-net header gives. Every byte is checked, both
//! ways, and a datagram that is not RoCE is counted, not taken.
//!
//! Needs CAP_NET_RAW (root); without it the device falls back to its
//! socket, and the test says it was skipped (it fails if
//! `RNIC_REQUIRE_TOOLS` is set).

use std::net::IpAddr;
use std::time::Duration;

use rnic_verbs::*;

const T: Duration = Duration::from_secs(20);
const LEN: usize = 1 << 20;

/// Packet sockets on `lo` in this network namespace, by inode.
fn packet_sockets() -> Vec<String> {
    std::fs::read_to_string("/proc/net/packet")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().last().map(str::to_owned))
        .collect()
}

fn ring_device() -> Option<Device> {
    let config = Config {
        ring: true,
        ..Config::default()
    };
    let before = packet_sockets();
    let addr: IpAddr = reserve_loopback().unwrap();
    let dev = Device::open_with(addr, &config).unwrap();
    let opened = packet_sockets().iter().any(|s| !before.contains(s));
    if !opened {
        eprintln!("SKIPPED: no packet socket (CAP_NET_RAW is needed)");
        assert!(
            std::env::var_os("RNIC_REQUIRE_TOOLS").is_none(),
            "CAP_NET_RAW is required"
        );
        return None;
    }
    Some(dev)
}

#[test]
fn every_byte_comes_in_through_the_ring() {
    let (Some(a), Some(b)) = (ring_device(), ring_device()) else {
        return;
    };
    let rights =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ma, mb) = (
        pa.register(3 * LEN, rights).unwrap(),
        pb.register(3 * LEN, rights).unwrap(),
    );
    let (ca, cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let qa = pa.create_rc_qp(&ca, &ca, QpCaps::default()).unwrap();
    let qb = pb.create_rc_qp(&cb, &cb, QpCaps::default()).unwrap();
    let o = ConnectOptions::default();
    qa.connect(&qb.endpoint(), &o).unwrap();
    qb.connect(&qa.endpoint(), &o).unwrap();

    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 % 251) as u8).collect();
    assert!(ma.write(0, &data));
    // 1 MiB WRITE: GSO sends of up to 64 KiB, each longer than a frame.
    let write = SendOp::write(mb.addr(), mb.rkey());
    qa.post_send(SendWr::new(1, write, sg_list![ma.sge(0, LEN as u32)]))
        .unwrap();
    let c = ca.wait(T).expect("the WRITE's completion");
    assert_eq!((c.wr_id, c.status), (1, WcStatus::Success), "{c:?}");
    // READ it back: responses come the other way, also whole sends.
    let read = SendOp::read(mb.addr(), mb.rkey());
    qa.post_send(SendWr::new(2, read, sg_list![ma.sge(LEN, LEN as u32)]))
        .unwrap();
    let c = ca.wait(T).expect("the READ's completion");
    assert_eq!((c.wr_id, c.status), (2, WcStatus::Success), "{c:?}");
    let mut back = vec![0u8; LEN];
    ma.read(LEN, &mut back);
    assert!(back == data, "the READ brought back what was written");

    // Small SENDs one at a time, each a datagram in a frame of the ring,
    // more of them than the ring has frames: it wraps.
    for i in 0..600u32 {
        qb.post_recv(RecvWr {
            wr_id: u64::from(i),
            sg_list: sg_list![mb.sge(2 * LEN, 64)],
        })
        .unwrap();
        assert!(ma.write(2 * LEN, &i.to_le_bytes()));
        qa.post_send(SendWr::new(
            u64::from(i),
            SendOp::send(),
            sg_list![ma.sge(2 * LEN, 4)],
        ))
        .unwrap();
        let c = cb.wait(T).expect("the SEND's receive completion");
        assert_eq!((c.status, c.byte_len), (WcStatus::Success, 4), "{c:?}");
        let mut got = [0u8; 4];
        mb.read(2 * LEN, &mut got);
        assert_eq!(u32::from_le_bytes(got), i);
        let c = ca.wait(T).expect("the SEND's completion");
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
    }

    // What is not RoCE arrives too (the filter passes port 4791 of the
    // address), and is counted as malformed.
    let before = b.counters().unwrap().malformed;
    let udp = std::net::UdpSocket::bind((a.addr(), 0)).unwrap();
    udp.send_to(&[0xFF; 3], (b.addr(), 4791)).unwrap();
    let mut tries = 0;
    while b.counters().unwrap().malformed == before {
        tries += 1;
        assert!(tries < 100, "the datagram was not counted");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(b.counters().unwrap().malformed, before + 1);
}
