//! The NIC's in-flight budget: all of a NIC's requesters together have at
//! most one QP's window of packets unacknowledged (1024), and every QP the
//! budget holds back goes on as room frees. Without the budget, many QPs
//! each with a little in flight put far more on the way than a receiving
//! socket holds; without the hand-over, a QP held back with nothing in
//! flight (so no ACK and no timer of its own to wake it) waits for ever.

use std::time::Duration;

use rnic_core::cq::CqHandle;
use rnic_core::mem::Access;
use rnic_core::mem::{MrKeys, PdHandle};
use rnic_core::qp::{AddressVector, Mtu, QpAttr, QpType};
use rnic_core::sim::{Cluster, LinkConfig};
use rnic_core::wr::{sg_list, SendOp, SendWr, Sge, WcStatus};
use rnic_core::QpCaps;

const IOVA: u64 = 0x1000_0000;
/// 64 KiB messages in 4096-byte packets: 16 packets each.
const MSG: u32 = 65536;
const PACKETS_PER_MSG: usize = 16;
/// The budget (one QP's window).
const BUDGET: usize = 1024;

/// A connection's two regions, each with its PD: (A's, B's).
type Regions = ((MrKeys, PdHandle), (MrKeys, PdHandle));

struct Conn {
    qpn_a: u32,
    qpn_b: u32,
    cq_a: CqHandle,
}

/// `n` connected RC QP pairs from NIC 0 to NIC 1, each side with its own
/// 2 * MSG region (A's filled with `i`, B's zero).
fn connect(c: &mut Cluster, n: usize) -> (Vec<Conn>, Vec<Regions>) {
    let now = c.now;
    let mut conns = Vec::new();
    let mut mrs = Vec::new();
    for i in 0..n {
        let mut ends = Vec::new();
        for side in 0..2 {
            let nic = &mut c.nics[side];
            let pd = nic.alloc_pd();
            let cq = nic.create_cq(64);
            let qpn = nic
                .create_qp(pd, QpType::Rc, cq, cq, QpCaps::default())
                .unwrap();
            let fill = if side == 0 { i as u8 + 1 } else { 0 };
            let mr = nic
                .reg_mr(
                    pd,
                    IOVA,
                    Box::new(vec![fill; 2 * MSG as usize]),
                    Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                )
                .unwrap();
            ends.push((cq, qpn, mr, pd));
        }
        for side in 0..2 {
            let attr = QpAttr {
                qp_access_flags: Access::REMOTE_WRITE,
                ah_attr: Some(AddressVector {
                    dest: c.nics[1 - side].addr(),
                    traffic_class: 0,
                    hop_limit: 64,
                    flow_label: 0,
                }),
                path_mtu: Mtu::Mtu4096,
                dest_qp_num: ends[1 - side].1,
                rq_psn: 0x10_0000 + i as u32,
                sq_psn: 0x10_0000 + i as u32,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: 1,
                max_dest_rd_atomic: 1,
                ..QpAttr::default()
            };
            c.nics[side].to_rts(now, ends[side].1, &attr).unwrap();
        }
        conns.push(Conn {
            qpn_a: ends[0].1,
            qpn_b: ends[1].1,
            cq_a: ends[0].0,
        });
        mrs.push(((ends[0].2, ends[0].3), (ends[1].2, ends[1].3)));
    }
    (conns, mrs)
}

/// Two 64 KiB WRITEs on every connection, A's region to B's.
fn post_writes(c: &mut Cluster, conns: &[Conn], mrs: &[Regions]) {
    let now = c.now;
    for (i, (conn, ((a, _), (b, _)))) in conns.iter().zip(mrs).enumerate() {
        for k in 0..2u64 {
            let wr = SendWr {
                wr_id: i as u64 * 2 + k,
                op: SendOp::Write {
                    remote_addr: IOVA + k * u64::from(MSG),
                    rkey: b.rkey,
                    imm: None,
                },
                sg_list: sg_list![Sge {
                    addr: IOVA + k * u64::from(MSG),
                    length: MSG,
                    lkey: a.lkey,
                }],
                signaled: true,
                solicited: false,
                fence: false,
                inline: None,
            };
            c.nics[0].post_send(now, conn.qpn_a, wr).unwrap();
        }
    }
}

fn completions(c: &mut Cluster, conns: &[Conn]) -> Vec<(u64, WcStatus)> {
    let mut all = Vec::new();
    for conn in conns {
        for w in c.nics[0].poll_cq(conn.cq_a, 64).unwrap() {
            all.push((w.wr_id, w.status));
        }
    }
    all.sort_by_key(|w| w.0);
    all
}

#[test]
fn many_qps_together_keep_to_one_window_and_all_finish() {
    let mut c = Cluster::new(11, LinkConfig::perfect(Duration::from_micros(20)), 2);
    let n = 64;
    let (conns, mrs) = connect(&mut c, n);
    post_writes(&mut c, &conns, &mrs);
    c.flush();
    // 2048 packets wanted to go at once; the budget let 1024.
    assert_eq!(n * 2 * PACKETS_PER_MSG, 2 * BUDGET);
    assert_eq!(c.net.in_flight(), BUDGET);
    // Every step after: never more data on the way than the budget (ACKs
    // travel the other way).
    let mut most = 0;
    for _ in 0..100_000 {
        if !c.step() {
            break;
        }
        let a = c.nics[0].addr();
        most = most.max(c.net.in_flight_from(a));
    }
    assert!(most <= BUDGET, "{most} packets from A on the way at once");
    let done = completions(&mut c, &conns);
    assert_eq!(done.len(), 2 * n, "every WRITE completes");
    assert!(done.iter().all(|w| w.1 == WcStatus::Success), "{done:?}");
    assert_eq!(
        c.nics[0].counters().completer_retry_err,
        0,
        "nothing resent"
    );
    for (i, (_, (b, pd))) in mrs.iter().enumerate() {
        let mut got = vec![0u8; 2 * MSG as usize];
        c.nics[1].read_mr(*pd, b.lkey, IOVA, &mut got).unwrap();
        assert!(got.iter().all(|&x| x == i as u8 + 1), "connection {i}");
    }
}

/// QPs holding the whole budget are destroyed with it in flight: what they
/// held goes to the QPs waiting at once, which then finish, long before the
/// destroyed QPs' ACK timers (67 ms) would have come up.
#[test]
fn destroying_the_qps_that_hold_the_budget_lets_the_others_go() {
    let mut c = Cluster::new(12, LinkConfig::perfect(Duration::from_micros(20)), 2);
    let n = 64;
    let (conns, mrs) = connect(&mut c, n);
    post_writes(&mut c, &conns, &mrs);
    c.flush();
    assert_eq!(c.net.in_flight(), BUDGET);
    // The first half took the budget (32 QPs x 32 packets).
    let (held, waiting) = conns.split_at(n / 2);
    for conn in held {
        c.nics[0].destroy_qp(conn.qpn_a).unwrap();
        c.nics[1].destroy_qp(conn.qpn_b).unwrap();
    }
    c.run(c.now + Duration::from_millis(5), 100_000);
    let done = completions(&mut c, waiting);
    assert_eq!(done.len(), n, "the waiting QPs' WRITEs all complete");
    assert!(done.iter().all(|w| w.1 == WcStatus::Success), "{done:?}");
}
