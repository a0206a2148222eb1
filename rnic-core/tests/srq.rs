//! Shared receive queues: several QPs take receives from one queue.

// The loops index QPs by (NIC, pair) on purpose: QP q on A talks to QP q on B.
#![allow(clippy::needless_range_loop)]

use std::time::Duration;

use rnic_core::mem::{Access, MemError};
use rnic_core::qp::{AddressVector, QpAttr, QpType};
use rnic_core::sim::{Cluster, LinkConfig};
use rnic_core::srq::AsyncEvent;
use rnic_core::wr::{sg_list, RecvWr, SendOp, SendWr, Sge, WcStatus};
use rnic_core::{QpCaps, VerbError};

fn recv(id: u64, lkey: u32) -> RecvWr {
    RecvWr {
        wr_id: id,
        sg_list: sg_list![Sge {
            addr: 0x1000 + id * 256,
            length: 256,
            lkey,
        }],
    }
}

#[test]
fn two_qps_share_one_receive_queue() {
    let mut c = Cluster::new(71, LinkConfig::perfect(Duration::from_micros(5)), 2);
    let (aa, ba) = (c.nics[0].addr(), c.nics[1].addr());
    let mut qps = [[0u32; 2]; 2];
    let mut keys = [0u32; 2];
    let mut cqs = Vec::new();
    let mut pds = Vec::new();
    for (i, nic) in c.nics.iter_mut().enumerate() {
        let pd = nic.alloc_pd();
        pds.push(pd);
        let cq = nic.create_cq(64);
        cqs.push(cq);
        keys[i] = nic
            .reg_mr(
                pd,
                0x1000,
                Box::new(vec![0u8; 1 << 16]),
                Access::LOCAL_WRITE,
            )
            .unwrap()
            .lkey;
        for q in 0..2 {
            qps[i][q] = nic
                .create_qp(pd, QpType::Rc, cq, cq, QpCaps::default())
                .unwrap();
        }
    }
    let srq = c.nics[1].create_srq(pds[1], 16, 1).unwrap();
    for q in 0..2 {
        c.nics[1].attach_srq(qps[1][q], srq).unwrap();
    }
    for i in 0..2 {
        for q in 0..2 {
            let attr = QpAttr {
                ah_attr: Some(AddressVector {
                    dest: if i == 0 { ba } else { aa },
                    src: None,
                    traffic_class: 0,
                    hop_limit: 64,
                    flow_label: 0,
                }),
                dest_qp_num: qps[1 - i][q],
                min_rnr_timer: 1,
                rnr_retry: 7,
                ..QpAttr::default()
            };
            let now = c.now;
            c.nics[i].to_rts(now, qps[i][q], &attr).unwrap();
        }
    }
    // Receives go to the SRQ, not to a QP using it.
    let now = c.now;
    assert!(matches!(
        c.nics[1].post_recv(now, qps[1][0], recv(0, keys[1])),
        Err(VerbError::Unsupported(_))
    ));
    for id in 0..3 {
        c.nics[1].post_srq_recv(srq, recv(id, keys[1])).unwrap();
    }
    c.nics[1].arm_srq(srq, 2).unwrap();

    // A 64-byte SEND from A's QP q; `send` also runs the cluster until idle.
    let post = |c: &mut Cluster, q: usize, id: u64| {
        let wr = SendWr::new(
            id,
            SendOp::send(),
            sg_list![Sge {
                addr: 0x1000,
                length: 64,
                lkey: keys[0],
            }],
        );
        let now = c.now;
        c.nics[0].post_send(now, qps[0][q], wr).unwrap();
    };
    let send = |c: &mut Cluster, q: usize, id: u64| {
        post(c, q, id);
        assert!(c.run(c.now + Duration::from_secs(1), 10_000));
    };
    send(&mut c, 0, 1);
    send(&mut c, 1, 2);
    let got = c.nics[1].poll_cq(cqs[1], 8).unwrap();
    // In queue order, each on the QP the SEND came to.
    assert_eq!(
        got.iter().map(|r| (r.wr_id, r.qp_num)).collect::<Vec<_>>(),
        vec![(0, qps[1][0]), (1, qps[1][1])]
    );
    // Two of three taken: fewer than the limit of 2 remain, once.
    assert_eq!(
        c.nics[1].poll_async_event(),
        Some(AsyncEvent::SrqLimitReached(srq))
    );
    assert_eq!(c.nics[1].poll_async_event(), None);
    assert_eq!(c.nics[1].srq_len(srq), Some(1));

    // The last receive; then the SRQ is empty: RNR NAKs until one is posted.
    send(&mut c, 0, 3);
    post(&mut c, 1, 4);
    let until = c.now + Duration::from_micros(200);
    c.run(until, 10_000);
    assert!(c.nics[1].counters().send_rnr_err >= 1);
    c.nics[1].post_srq_recv(srq, recv(7, keys[1])).unwrap();
    assert!(c.run(c.now + Duration::from_secs(1), 10_000));
    let sent = c.nics[0].poll_cq(cqs[0], 8).unwrap();
    assert_eq!(sent.len(), 4);
    assert!(sent.iter().all(|s| s.status == WcStatus::Success));
    let got = c.nics[1].poll_cq(cqs[1], 8).unwrap();
    assert_eq!(
        got.iter().map(|r| (r.wr_id, r.qp_num)).collect::<Vec<_>>(),
        vec![(2, qps[1][0]), (7, qps[1][1])]
    );
    assert_eq!(
        c.nics[1].poll_async_event(),
        None,
        "the limit disarmed itself"
    );
}

/// An SRQ holds its protection domain, and is refused destruction while a
/// QP takes its receives from it (EBUSY in the C ABI).
#[test]
fn an_srq_holds_its_domain_and_outlives_its_queue_pairs() {
    let mut c = Cluster::new(72, LinkConfig::perfect(Duration::from_micros(5)), 1);
    let nic = &mut c.nics[0];
    let (pd, srq_pd) = (nic.alloc_pd(), nic.alloc_pd());
    let cq = nic.create_cq(8);
    let qp = nic
        .create_qp(pd, QpType::Rc, cq, cq, QpCaps::default())
        .unwrap();
    let srq = nic.create_srq(srq_pd, 8, 1).unwrap();
    assert!(matches!(
        nic.dealloc_pd(srq_pd),
        Err(VerbError::Mem(MemError::PdBusy(_)))
    ));
    nic.attach_srq(qp, srq).unwrap();
    assert!(nic.attach_srq(qp, srq).is_err(), "attached once");
    assert_eq!(nic.destroy_srq(srq), Err(VerbError::SrqBusy(srq)));
    nic.destroy_qp(qp).unwrap();
    nic.destroy_srq(srq).unwrap();
    assert!(nic.srq_len(srq).is_none());
    assert!(nic.destroy_srq(srq).is_err(), "destroyed once");
    nic.dealloc_pd(srq_pd).unwrap();
    let gone = nic.alloc_pd();
    nic.dealloc_pd(gone).unwrap();
    assert!(
        nic.create_srq(gone, 8, 1).is_err(),
        "no SRQ in a freed domain"
    );
}
