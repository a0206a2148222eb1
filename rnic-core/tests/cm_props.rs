//! The communication manager over a bad network: every CM message may be
//! lost, duplicated, corrupted (its ICRC then fails) and reordered, on the
//! simulator. However it goes, both sides end agreeing: connected with the
//! same QP numbers and PSNs, or refused by the listener's
//! application on both sides, or not connected on either (never half-open).
//!
//! `RNIC_SIM_CASES=N` sets the number of cases (default 2000).

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use rnic_core::cm::{AcceptParams, CmEvent, CmId, ConnectParams};
use rnic_core::sim::{Cluster, LinkConfig};
use rnic_core::time::Time;
use rnic_wire::cm::Path;

/// A service ID of the IB CM's own: the REQs here carry no rdma_cm header,
/// which rdma_cm's port spaces would refuse (REJ 28).
const SERVICE: u64 = 0x1000_0000_0000_4e20;

fn cases() -> u32 {
    std::env::var("RNIC_SIM_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Active {
    Waiting,
    Established { qpn: u32, psn: u32 },
    Rejected(u16),
    Unreachable,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Passive {
    Accepted,
    Established,
    Refused,
    Unreachable,
}

fn connect_params(k: u32) -> ConnectParams {
    let gid = |last: u8| std::net::Ipv4Addr::new(10, 0, 0, last).to_ipv6_mapped();
    ConnectParams {
        service_id: SERVICE,
        qpn: 0x100 + k,
        starting_psn: 0x1000 * (k + 1),
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        path_mtu: 3,
        path: Path {
            local_lid: 0xFFFF,
            remote_lid: 0xFFFF,
            local_gid: gid(1),
            remote_gid: gid(2),
            hop_limit: 64,
            local_ack_timeout: 14,
            ..Path::NONE
        },
        transport: 0,
        private_data: k.to_be_bytes().to_vec(),
    }
}

fn accept_params(k: u32) -> AcceptParams {
    AcceptParams {
        qpn: 0x5000 + k,
        starting_psn: 0x20 * (k + 1),
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        private_data: Vec::new(),
    }
}

fn session(seed: u64, link: LinkConfig, accept: &[bool]) -> Result<(), TestCaseError> {
    let mut c = Cluster::new(seed, link, 2);
    let b_addr = c.nics[1].addrs()[0];
    for nic in &mut c.nics {
        // About 33 ms per wait: retries are quick in virtual time.
        nic.cm().response_timeout = 12;
    }
    c.nics[1].cm().listen(SERVICE).unwrap();
    let mut active: HashMap<CmId, (u32, Active)> = HashMap::new();
    let mut passive: HashMap<u32, (CmId, Passive)> = HashMap::new();
    for k in 0..accept.len() as u32 {
        let now = c.now;
        let id = c.nics[0]
            .cm_call(now, |cm, now| cm.connect(now, b_addr, &connect_params(k)))
            .unwrap();
        active.insert(id, (k, Active::Waiting));
    }
    let limit = Time::ZERO + Duration::from_secs(600);
    for _ in 0..200_000 {
        if !c.step() || c.now > limit {
            break;
        }
        let now = c.now;
        while let Some(e) = c.nics[1].poll_cm_event() {
            match e {
                CmEvent::Request { id, req, .. } => {
                    let k = req.local_qpn - 0x100;
                    prop_assert_eq!(req.starting_psn, 0x1000 * (k + 1));
                    prop_assert_eq!(&req.private_data[..4], &k.to_be_bytes()[..]);
                    // A refused request is forgotten (the kernel's CM goes
                    // back to idle): the REQ sent again because the REJ was
                    // lost is a new request, refused again. An accepted one
                    // never comes twice.
                    prop_assert!(
                        passive.get(&k).is_none_or(|p| p.1 == Passive::Refused),
                        "request {} came twice",
                        k
                    );
                    if accept[k as usize] {
                        c.nics[1]
                            .cm_call(now, |cm, now| cm.accept(now, id, &accept_params(k)))
                            .unwrap();
                        passive.insert(k, (id, Passive::Accepted));
                    } else {
                        c.nics[1]
                            .cm_call(now, |cm, _| cm.reject(id, 28, b"no"))
                            .unwrap();
                        passive.insert(k, (id, Passive::Refused));
                    }
                }
                CmEvent::Established { id } => {
                    let p = passive.values_mut().find(|p| p.0 == id).unwrap();
                    prop_assert_eq!(&p.1, &Passive::Accepted);
                    p.1 = Passive::Established;
                }
                CmEvent::Unreachable { id } => {
                    let p = passive.values_mut().find(|p| p.0 == id).unwrap();
                    prop_assert_eq!(&p.1, &Passive::Accepted);
                    p.1 = Passive::Unreachable;
                }
                e => prop_assert!(false, "the listener got {:?}", e),
            }
        }
        while let Some(e) = c.nics[0].poll_cm_event() {
            match e {
                CmEvent::Reply { id, rep } => {
                    let a = active.get_mut(&id).unwrap();
                    prop_assert_eq!(&a.1, &Active::Waiting);
                    a.1 = Active::Established {
                        qpn: rep.local_qpn,
                        psn: rep.starting_psn,
                    };
                    c.nics[0].cm_call(now, |cm, _| cm.ready(id)).unwrap();
                }
                CmEvent::Established { .. } => {}
                CmEvent::Rejected { id, reason, .. } => {
                    let a = active.get_mut(&id).unwrap();
                    prop_assert_eq!(&a.1, &Active::Waiting);
                    a.1 = Active::Rejected(reason);
                }
                CmEvent::Unreachable { id } => {
                    let a = active.get_mut(&id).unwrap();
                    prop_assert_eq!(&a.1, &Active::Waiting);
                    a.1 = Active::Unreachable;
                }
                e => prop_assert!(false, "the active side got {:?}", e),
            }
        }
    }
    prop_assert!(c.next_event().is_none(), "the CMs never went quiet");
    for (k, outcome) in active.values() {
        let p = passive.get(k).map(|p| &p.1);
        match outcome {
            Active::Established { qpn, psn } => {
                prop_assert_eq!(
                    (*qpn, *psn),
                    (0x5000 + k, 0x20 * (k + 1)),
                    "connection {} got another REP",
                    k
                );
                prop_assert_eq!(
                    p,
                    Some(&Passive::Established),
                    "connection {} is half-open",
                    k
                );
            }
            Active::Rejected(reason) => {
                prop_assert_eq!(*reason, 28);
                prop_assert_eq!(p, Some(&Passive::Refused));
            }
            Active::Unreachable => {
                prop_assert!(
                    p.is_none_or(|p| *p == Passive::Unreachable),
                    "connection {} given up by the active side is {:?} on the listener",
                    k,
                    p
                );
            }
            Active::Waiting => prop_assert!(false, "connection {} never ended", k),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn both_sides_agree_however_the_network_treats_the_cm(
        seed in any::<u64>(),
        loss in 0.0f64..0.3,
        duplicate in 0.0f64..0.3,
        corrupt in 0.0f64..0.1,
        jitter_us in 0u64..300,
        accept in proptest::collection::vec(any::<bool>(), 1..6),
    ) {
        let link = LinkConfig {
            loss,
            duplicate,
            corrupt,
            delay: Duration::from_micros(20),
            jitter: Duration::from_micros(jitter_us),
        };
        session(seed, link, &accept)?;
    }
}
