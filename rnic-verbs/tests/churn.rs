//! Connections made and torn down over real UDP on loopback, the way a
//! program does it (and the wrong way round: a CQ dropped before its QP):
//! the devices end holding what they held a few cycles in.

use std::time::Duration;

use rnic_verbs::*;

const WAIT: Duration = Duration::from_secs(20);
const CYCLES: usize = 2000;

#[test]
fn two_thousand_connections_leave_both_devices_as_they_were() {
    let devs = [
        Device::open_loopback().unwrap(),
        Device::open_loopback().unwrap(),
    ];
    let o = ConnectOptions::default();
    let mut early = None;
    for i in 0..CYCLES {
        let pds: Vec<_> = devs.iter().map(|d| d.alloc_pd().unwrap()).collect();
        let mrs: Vec<_> = pds
            .iter()
            .map(|pd| {
                pd.register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                    .unwrap()
            })
            .collect();
        let cqs: Vec<_> = devs.iter().map(|d| d.create_cq(16).unwrap()).collect();
        let qps: Vec<_> = pds
            .iter()
            .zip(&cqs)
            .map(|(pd, cq)| pd.create_rc_qp(cq, cq, QpCaps::default()).unwrap())
            .collect();
        qps[0].connect(&qps[1].endpoint(), &o).unwrap();
        qps[1].connect(&qps[0].endpoint(), &o).unwrap();
        let tag = (i as u64).to_le_bytes();
        assert!(mrs[0].write(0, &tag));
        qps[0]
            .post_send(SendWr::new(
                i as u64,
                SendOp::write(mrs[1].addr(), mrs[1].rkey()),
                vec![mrs[0].sge(0, 8)].into(),
            ))
            .unwrap();
        let c = cqs[0].wait(WAIT).unwrap();
        assert_eq!((c.wr_id, c.status), (i as u64, WcStatus::Success));
        let mut got = [0u8; 8];
        assert!(mrs[1].read(0, &mut got));
        assert_eq!(got, tag);
        // Every other cycle, the CQs go first: destroying one a QP still
        // uses is refused, and dropping it leaves it to the QP's destroy.
        if i % 2 == 1 {
            assert!(matches!(
                cqs[0].destroy_now(),
                Err(Error::Verb(VerbError::CqBusy(_)))
            ));
            drop(cqs);
            drop(qps);
        } else {
            drop(qps);
            drop(cqs);
        }
        drop(mrs);
        drop(pds);
        if i == 10 {
            early = Some(devs.each_ref().map(|d| d.footprint().unwrap()));
        }
    }
    let end = devs.each_ref().map(|d| d.footprint().unwrap());
    for ((f, sinks), (e, early_sinks)) in end.iter().zip(early.unwrap()) {
        assert_eq!((f.qps, f.regions, *sinks), (0, 0, 0), "{f:?}");
        assert_eq!(f.cq_slots, e.cq_slots, "CQ slots grew: {f:?}");
        assert_eq!(f.pd_slots, e.pd_slots, "PD slots grew: {f:?}");
        assert_eq!(f.key_slots, e.key_slots, "key slots grew: {f:?}");
        assert_eq!(early_sinks, 0);
    }
}
