//! Objects created and destroyed by the hundred thousand: a NIC that has
//! lived through them holds no more than it did a few thousand cycles in.
//! rdma_rxe's users report hangs after about a thousand connections; rnic's
//! tables reuse their slots, its timers forget destroyed QPs, and the
//! identifiers it keeps out of use after a destroy are bounded.

use std::time::Duration;

use rnic_core::qp::{Mtu, QpType};
use rnic_core::rng::QUARANTINE;
use rnic_core::sim::{Cluster, LinkConfig};
use rnic_core::wr::{sg_list, SendOp, SendWr, Sge, WcStatus};
use rnic_core::{Footprint, Nic, QpCaps, VerbError};

mod common;
use common::{connected, Params, A_IOVA, B_IOVA};

/// One connection's life on NICs `a` and `b`: PD, 4 KiB region, CQ and QP
/// on each, connected; a WRITE from `a` to `b`, run to its completion if
/// `finish` (else left in flight, timers armed); then everything destroyed
/// in the order a program does it.
fn cycle(c: &mut Cluster, i: u64, finish: bool) {
    let p = Params {
        mtu: Mtu::Mtu1024,
        // 67 ms: the ACK timer of a QP destroyed in flight outlives it.
        timeout: 14,
        cq_depth: 16,
        region: 4096,
        ..Params::default()
    };
    let psn = (i as u32).wrapping_mul(7919) & 0xFF_FFFF;
    let (a, b) = connected(c, &p, (psn, psn), (0, 1));
    let now = c.now;
    c.nics[0]
        .post_send(
            now,
            a.qpn,
            SendWr::new(
                i,
                SendOp::write(B_IOVA + (i % 2048), b.mr.rkey),
                sg_list![Sge {
                    addr: A_IOVA,
                    length: 2048,
                    lkey: a.mr.lkey,
                }],
            ),
        )
        .unwrap();
    if finish {
        assert!(c.run(c.now + Duration::from_secs(1), 10_000));
        let done = c.nics[0].poll_cq(a.cq, 16).unwrap();
        assert_eq!(done.len(), 1);
        assert_eq!((done[0].wr_id, done[0].status), (i, WcStatus::Success));
    } else {
        c.flush();
    }
    for (n, side) in [a, b].into_iter().enumerate() {
        let nic = &mut c.nics[n];
        // A CQ is destroyed after its QPs, as verbs requires.
        assert!(matches!(nic.destroy_cq(side.cq), Err(VerbError::CqBusy(_))));
        nic.destroy_qp(side.qpn).unwrap();
        nic.destroy_cq(side.cq).unwrap();
        nic.dereg_mr(side.mr.lkey).unwrap();
        nic.dealloc_pd(side.pd).unwrap();
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
