//! A peer that dies and comes back, over real UDP on loopback: the
//! survivor's request ends in RETRY_EXC_ERR no sooner than its timeout and
//! retry count allow, the restarted peer drops and counts the packets still
//! aimed at the QP that died with it, and fresh QPs between the two work.
//!
//! One test in its own binary: the restarted peer reopens the dead one's
//! address, which no other test may take in between.

use std::time::{Duration, Instant};

use rnic_verbs::*;

const WAIT: Duration = Duration::from_secs(20);

fn write(wr_id: u64, to: &MemoryRegion, from: &MemoryRegion, len: u32) -> SendWr {
    SendWr::new(
        wr_id,
        SendOp::write(to.addr(), to.rkey()),
        vec![from.sge(0, len)].into(),
    )
}

struct Peer {
    dev: Device,
    pd: ProtectionDomain,
    mr: MemoryRegion,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn peer(dev: Device) -> Peer {
    let pd = dev.alloc_pd().unwrap();
    let mr = pd
        .register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let cq = dev.create_cq(64).unwrap();
    let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    Peer {
        dev,
        pd,
        mr,
        cq,
        qp,
    }
}

#[test]
fn a_dead_peer_ends_in_retry_exceeded_and_a_restarted_one_works() {
    let o = ConnectOptions {
        timeout: 14,
        retry_cnt: 7,
        ..ConnectOptions::default()
    };
    // 4.096 us x 2^timeout per attempt, retry_cnt + 1 attempts.
    let ack_timeout = Duration::from_nanos(4096 << o.timeout);
    let floor = ack_timeout * (u32::from(o.retry_cnt) + 1);

    let a = peer(Device::open_loopback().unwrap());
    let b = peer(Device::open_loopback().unwrap());
    let b_addr = b.dev.addr();
    a.qp.connect(&b.qp.endpoint(), &o).unwrap();
    b.qp.connect(&a.qp.endpoint(), &o).unwrap();
    assert!(a.mr.write(0, b"alive"));
    a.qp.post_send(write(1, &b.mr, &a.mr, 5)).unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    let old_rkey = b.mr.rkey();
    let old_addr = b.mr.addr();
    let old_qpn = b.qp.qpn();

    // B dies: its QP, memory and NIC are gone, its port closed.
    drop(b);
    let t0 = Instant::now();
    a.qp.post_send(SendWr {
        op: SendOp::write(old_addr, old_rkey),
        ..write(2, &a.mr, &a.mr, 5)
    })
    .unwrap();

    // B comes back at the same address while A is still retrying.
    std::thread::sleep(ack_timeout * 2);
    let b = peer(Device::open(b_addr).expect("the dead peer's address is free again"));
    assert_ne!(b.qp.qpn(), old_qpn);

    let c = a.cq.wait(WAIT).unwrap();
    let took = t0.elapsed();
    assert_eq!((c.wr_id, c.status), (2, WcStatus::RetryExcErr));
    println!(
        "RETRY_EXC_ERR after {took:?}: {} attempts of {ack_timeout:?} take at least {floor:?}",
        o.retry_cnt + 1
    );
    assert!(took >= floor, "gave up after {took:?}, before {floor:?}");

    // A's retransmissions reached the new B, aimed at the QP that died.
    let counters = b.dev.counters().unwrap();
    assert!(
        counters.unknown_qp >= 1,
        "the restarted peer saw no packet for the dead QP: {counters:?}"
    );

    // A's old QP is in the error state: what it is given is flushed.
    a.qp.post_send(write(3, &a.mr, &a.mr, 5)).unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::WrFlushErr);

    // Fresh QPs on both sides work.
    let a2 = a.pd.create_rc_qp(&a.cq, &a.cq, QpCaps::default()).unwrap();
    a2.connect(&b.qp.endpoint(), &o).unwrap();
    b.qp.connect(&a2.endpoint(), &o).unwrap();
    assert!(a.mr.write(0, b"again"));
    a2.post_send(write(4, &b.mr, &a.mr, 5)).unwrap();
    let c = a.cq.wait(WAIT).unwrap();
    assert_eq!((c.wr_id, c.status), (4, WcStatus::Success));
    let mut got = [0u8; 5];
    assert!(b.mr.read(0, &mut got));
    assert_eq!(&got, b"again");
    assert!(b.cq.poll().is_empty());
    drop(b.pd);
}
