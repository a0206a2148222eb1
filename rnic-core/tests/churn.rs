//! Objects created and destroyed by the hundred thousand: a NIC that has
//! lived through them holds no more than it did a few thousand cycles in.
//! rdma_rxe's users report hangs after about a thousand connections; rnic's
//! tables reuse their slots, its timers forget destroyed QPs, and the
//! identifiers it keeps out of use after a destroy are bounded.

use std::time::Duration;

use rnic_core::mem::Access;
use rnic_core::qp::{AddressVector, Mtu, QpAttr, QpType};
use rnic_core::rng::QUARANTINE;
use rnic_core::sim::{Cluster, LinkConfig};
use rnic_core::wr::{sg_list, SendOp, SendWr, Sge, WcStatus};
use rnic_core::{Footprint, Nic, QpCaps, VerbError};

const IOVA: u64 = 0x1000_0000;

/// One connection's life on NICs `a` and `b`: PD, region, CQ and QP on
/// each, connected; a WRITE from `a` to `b`, run to its completion if
/// `finish` (else left in flight, timers armed); then everything destroyed
/// in the order a program does it.
fn cycle(c: &mut Cluster, i: u64, finish: bool) {
    let now = c.now;
    let mut ends = Vec::new();
    for n in 0..2 {
        let nic = &mut c.nics[n];
        let pd = nic.alloc_pd();
        let cq = nic.create_cq(16);
        let qpn = nic
            .create_qp(pd, QpType::Rc, cq, cq, QpCaps::default())
            .unwrap();
        let mr = nic
            .reg_mr(
                pd,
                IOVA,
                Box::new(vec![n as u8; 4096]),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
            .unwrap();
        ends.push((pd, cq, qpn, mr));
    }
    for n in 0..2 {
        let peer = ends[1 - n];
        let attr = QpAttr {
            qp_access_flags: Access::REMOTE_WRITE,
            ah_attr: Some(AddressVector {
                dest: c.nics[1 - n].addr(),
                traffic_class: 0,
                hop_limit: 64,
                flow_label: 0,
            }),
            path_mtu: Mtu::Mtu1024,
            dest_qp_num: peer.2,
            rq_psn: (i as u32).wrapping_mul(7919) & 0xFF_FFFF,
            sq_psn: (i as u32).wrapping_mul(7919) & 0xFF_FFFF,
            // 67 ms: the ACK timer of a QP destroyed in flight outlives it.
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            ..QpAttr::default()
        };
        c.nics[n].to_rts(now, ends[n].2, &attr).unwrap();
    }
    let (a, b) = (ends[0], ends[1]);
    c.nics[0]
        .post_send(
            now,
            a.2,
            SendWr {
                wr_id: i,
                op: SendOp::Write {
                    remote_addr: IOVA + (i % 2048),
                    rkey: b.3.rkey,
                    imm: None,
                },
                sg_list: sg_list![Sge {
                    addr: IOVA,
                    length: 2048,
                    lkey: a.3.lkey,
                }],
                signaled: true,
                solicited: false,
                fence: false,
                inline: None,
            },
        )
        .unwrap();
    if finish {
        assert!(c.run(c.now + Duration::from_secs(1), 10_000));
        let done = c.nics[0].poll_cq(a.1, 16).unwrap();
        assert_eq!(done.len(), 1);
        assert_eq!((done[0].wr_id, done[0].status), (i, WcStatus::Success));
    } else {
        c.flush();
    }
    for (n, (pd, cq, qpn, mr)) in ends.into_iter().enumerate() {
        let nic = &mut c.nics[n];
        // A CQ is destroyed after its QPs, as verbs requires.
        assert!(matches!(nic.destroy_cq(cq), Err(VerbError::CqBusy(_))));
        nic.destroy_qp(qpn).unwrap();
        nic.destroy_cq(cq).unwrap();
        nic.dereg_mr(mr.lkey).unwrap();
        nic.dealloc_pd(pd).unwrap();
    }
    // What was in flight arrives to nothing, and the clock moves past the
    // dead QPs' timers.
    c.run(c.now + Duration::from_millis(5), 10_000);
    c.now = c.now + Duration::from_millis(5);
    for nic in &mut c.nics {
        nic.handle_timeout(c.now);
        while nic.poll_transmit().is_some() {}
    }
}

fn footprints(c: &Cluster) -> Vec<Footprint> {
    c.nics.iter().map(Nic::footprint).collect()
}

#[test]
fn a_hundred_thousand_connections_leave_the_nic_as_it_was() {
    let mut c = Cluster::new(7, LinkConfig::perfect(Duration::from_micros(5)), 2);
    let cycles = std::env::var("RNIC_CHURN_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000u64);
    // Past the quarantine, every table is at its steady size.
    let settled = QUARANTINE as u64 + 100;
    let mut at_settled = None;
    for i in 0..cycles.max(settled + 1) {
        // One in eight is destroyed with its WRITE unacknowledged and its
        // ACK timer armed.
        cycle(&mut c, i, i % 8 != 7);
        if i == settled {
            at_settled = Some(footprints(&c));
        }
    }
    let end = footprints(&c);
    assert_eq!(Some(end.clone()), at_settled, "the NICs grew");
    for f in &end {
        // Nothing alive, a slot or two for each kind of object, and the
        // identifiers resting bounded by the quarantine.
        assert_eq!((f.qps, f.regions, f.keys, f.timers), (0, 0, 0, 0), "{f:?}");
        assert!(
            f.cq_slots <= 1 && f.pd_slots <= 1 && f.key_slots <= 1,
            "{f:?}"
        );
        assert!(f.resting_ids <= 2 * QUARANTINE, "{f:?}");
        assert_eq!(f.queued, 0, "{f:?}");
    }
}

/// `ibv_destroy_cq` on a CQ a QP completes into is refused (EBUSY in verbs);
/// once the QP is gone it succeeds, with completions still in it, and the
/// handle then names nothing.
#[test]
fn a_cq_is_destroyed_only_after_its_queue_pairs() {
    let mut nic = Nic::new("10.0.0.1".parse().unwrap(), 3);
    let pd = nic.alloc_pd();
    let (send, recv) = (nic.create_cq(4), nic.create_cq(4));
    let qpn = nic
        .create_qp(pd, QpType::Rc, send, recv, QpCaps::default())
        .unwrap();
    assert!(matches!(nic.destroy_cq(send), Err(VerbError::CqBusy(h)) if h == send));
    assert!(matches!(nic.destroy_cq(recv), Err(VerbError::CqBusy(h)) if h == recv));
    nic.destroy_qp(qpn).unwrap();
    nic.destroy_cq(send).unwrap();
    assert!(matches!(nic.destroy_cq(send), Err(VerbError::NoSuchCq(_))));
    assert!(matches!(nic.poll_cq(send, 1), Err(VerbError::NoSuchCq(_))));
    // A QP cannot be made on a destroyed CQ.
    assert!(matches!(
        nic.create_qp(pd, QpType::Rc, send, recv, QpCaps::default()),
        Err(VerbError::NoSuchCq(_))
    ));
    nic.destroy_cq(recv).unwrap();
    assert_eq!(nic.footprint().cq_slots, 2);
    // The slots are reused.
    let again = nic.create_cq(4);
    assert!(again == send || again == recv);
    assert_eq!(nic.footprint().cq_slots, 2);
}
