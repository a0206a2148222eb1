//! The transport invariants (DESIGN.md), as properties over random workloads on
//! random impairments, checked against a reference model of the target memory:
//!
//! 1. requests execute at the responder exactly once and in PSN order;
//! 2. every work request completes exactly once, in post order; success means
//!    the responder executed it; after a failure the rest are flushed;
//! 3. the target memory equals the model after the executed requests, and every
//!    successful READ and atomic returned what the model says.
//!
//! `RNIC_SIM_CASES=N` sets the number of cases (default 3000; the long mode is
//! 100000). A failure prints its seed and shrinks.

mod common;

use std::time::Duration;

use common::*;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use rnic_core::mem::Access;
use rnic_core::qp::Mtu;
use rnic_core::sim::LinkConfig;
use rnic_core::wr::{SendOp, WcStatus};
use rnic_core::{ExecKind, Mechanisms};

#[derive(Debug, Clone)]
enum Op {
    Write {
        dst: u64,
        src: u64,
        len: u32,
    },
    Read {
        src: u64,
        len: u32,
    },
    Send {
        src: u64,
        len: u32,
    },
    Cas {
        dst: u64,
        compare_hit: bool,
        swap: u64,
    },
    Add {
        dst: u64,
        add: u64,
    },
    AtomicWrite {
        dst: u64,
        data: [u8; 8],
    },
    Flush {
        dst: u64,
        len: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    // WRITE targets and atomics stay in B's first 96 KiB; SEND receive buffers
    // are above 128 KiB. Lengths up to 12 KiB: up to 48 packets at PMTU 256.
    prop_oneof![
        (0u64..90_000, 0u64..100_000, 0u32..12_288).prop_map(|(dst, src, len)| Op::Write {
            dst: dst.min(96 * 1024 - u64::from(len)),
            src,
            len
        }),
        (0u64..120_000, 0u32..12_288).prop_map(|(src, len)| Op::Read { src, len }),
        (0u64..100_000, 0u32..4096).prop_map(|(src, len)| Op::Send { src, len }),
        (0u64..64, any::<bool>(), any::<u64>()).prop_map(|(d, compare_hit, swap)| Op::Cas {
            dst: d * 8,
            compare_hit,
            swap
        }),
        (0u64..64, any::<u64>()).prop_map(|(d, add)| Op::Add { dst: d * 8, add }),
        (0u64..64, any::<[u8; 8]>()).prop_map(|(d, data)| Op::AtomicWrite { dst: d * 8, data }),
        (0u64..90_000, 0u32..8192).prop_map(|(dst, len)| Op::Flush { dst, len }),
    ]
}

/// Microseconds the simulation runs before an op is posted: mostly none (a
/// burst of posts), sometimes up to three ACK timeouts, so that requests are
/// also posted while earlier ones are in flight, NAKed or being resent.
fn gap() -> impl Strategy<Value = u32> {
    prop_oneof![3 => Just(0u32), 1 => 0u32..3000]
}

fn link() -> impl Strategy<Value = LinkConfig> {
    (0.0..0.3f64, 0.0..0.2f64, 0.0..0.1f64, 0u64..60).prop_map(
        |(loss, duplicate, corrupt, jitter)| LinkConfig {
            loss,
            duplicate,
            corrupt,
            delay: Duration::from_micros(5),
            jitter: Duration::from_micros(jitter),
        },
    )
}

fn mtu() -> impl Strategy<Value = Mtu> {
    prop_oneof![Just(Mtu::Mtu256), Just(Mtu::Mtu1024), Just(Mtu::Mtu4096)]
}

const READ_AREA: u64 = 128 * 1024; // A: READ results go above here
const RECV_AREA: u64 = 128 * 1024; // B: receive buffers above here

/// Run a workload; check every invariant; return whether all succeeded.
fn check(
    seed: u64,
    link: LinkConfig,
    mtu: Mtu,
    ops: &[Op],
    gaps: &[u32],
    mech: Mechanisms,
) -> Result<bool, TestCaseError> {
    check_behind(seed, link, mtu, ops, gaps, mech, 0)
}

/// [`check`], both directions limited to `bytes_per_second` (0: no
/// limit).
fn check_behind(
    seed: u64,
    link: LinkConfig,
    mtu: Mtu,
    ops: &[Op],
    gaps: &[u32],
    mech: Mechanisms,
    bytes_per_second: u64,
) -> Result<bool, TestCaseError> {
    let d = Params::default();
    let params = Params {
        link,
        mtu,
        b_access: d.b_access | Access::FLUSH_GLOBAL,
        b_qp_access: d.b_qp_access | Access::FLUSH_GLOBAL,
        ..d
    };
    let mut p = Pair::new(seed, &params);
    p.c.nics[1].set_mechanisms(mech);
    p.c.net.record_pcap();
    let (a, b) = (p.c.nics[0].addr(), p.c.nics[1].addr());
    p.c.net.set_bandwidth(a, b, bytes_per_second);
    p.c.net.set_bandwidth(b, a, bytes_per_second);
    let a_init: Vec<u8> = (0..REGION)
        .map(|i| (i as u64).wrapping_mul(seed | 1).to_le_bytes()[1])
        .collect();
    p.write_a(0, &a_init[..READ_AREA as usize]);
    let rkey = p.b.mr.rkey;

    // Receives for the SENDs, and per-op local areas for READ and atomic results.
    let mut recv_at = RECV_AREA;
    let mut result_at = READ_AREA;
    let mut recvs = Vec::new();
    let mut results = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Send { len, .. } => {
                p.recv_b(i as u64, recv_at - RECV_AREA + RECV_AREA, len.max(1));
                recvs.push(recv_at);
                recv_at += u64::from(len.max(1));
            }
            Op::Read { len, .. } => {
                results.push(result_at);
                result_at += u64::from(len);
            }
            Op::Cas { .. } | Op::Add { .. } => {
                results.push(result_at);
                result_at += 8;
            }
            Op::Write { .. } | Op::AtomicWrite { .. } | Op::Flush { .. } => {}
        }
    }
    prop_assume!(recv_at <= REGION as u64 && result_at <= REGION as u64);

    // The model of B's memory, and what each op should return, in post order.
    let mut model = vec![0u8; REGION];
    let mut expect = Vec::new();
    // A READ retried after a loss executes again, and would see the writes of
    // requests posted after it: writers after a READ are fenced, as an
    // application must fence them.
    let mut read_before = false;
    let (mut ri, mut si) = (0, 0);
    for (i, op) in ops.iter().enumerate() {
        let id = i as u64;
        if let Some(&g) = gaps.get(i).filter(|&&g| g > 0) {
            let until = p.c.now + Duration::from_micros(u64::from(g));
            p.c.run(until, 5_000_000);
            p.c.now = p.c.now.max(until);
        }
        match *op {
            Op::Write { dst, src, len } => {
                p.post_fenced(
                    id,
                    SendOp::write(B_IOVA + dst, rkey),
                    p.sge_a(src, len),
                    read_before,
                );
                model[dst as usize..(dst + u64::from(len)) as usize]
                    .copy_from_slice(&a_init[src as usize..(src + u64::from(len)) as usize]);
                expect.push(None);
            }
            Op::Read { src, len } => {
                let at = results[ri];
                ri += 1;
                p.post(id, SendOp::read(B_IOVA + src, rkey), p.sge_a(at, len));
                read_before = true;
                expect.push(Some((
                    at,
                    model[src as usize..(src + u64::from(len)) as usize].to_vec(),
                )));
            }
            Op::Send { src, len } => {
                let at = recvs[si];
                si += 1;
                p.post_fenced(id, SendOp::send(), p.sge_a(src, len), read_before);
                model[at as usize..(at + u64::from(len)) as usize]
                    .copy_from_slice(&a_init[src as usize..(src + u64::from(len)) as usize]);
                expect.push(None);
            }
            Op::Cas {
                dst,
                compare_hit,
                swap,
            } => {
                let at = results[ri];
                ri += 1;
                let orig =
                    u64::from_ne_bytes(model[dst as usize..dst as usize + 8].try_into().unwrap());
                let compare = if compare_hit { orig } else { orig ^ 1 };
                p.post_fenced(
                    id,
                    SendOp::compare_swap(B_IOVA + dst, rkey, compare, swap),
                    p.sge_a(at, 8),
                    read_before,
                );
                if compare_hit {
                    model[dst as usize..dst as usize + 8].copy_from_slice(&swap.to_ne_bytes());
                }
                expect.push(Some((at, orig.to_ne_bytes().to_vec())));
            }
            Op::Add { dst, add } => {
                let at = results[ri];
                ri += 1;
                let orig =
                    u64::from_ne_bytes(model[dst as usize..dst as usize + 8].try_into().unwrap());
                p.post_fenced(
                    id,
                    SendOp::fetch_add(B_IOVA + dst, rkey, add),
                    p.sge_a(at, 8),
                    read_before,
                );
                model[dst as usize..dst as usize + 8]
                    .copy_from_slice(&orig.wrapping_add(add).to_ne_bytes());
                expect.push(Some((at, orig.to_ne_bytes().to_vec())));
            }
            Op::AtomicWrite { dst, data } => {
                p.post_fenced(
                    id,
                    SendOp::AtomicWrite {
                        remote_addr: B_IOVA + dst,
                        rkey,
                        data,
                    },
                    SgList::new(),
                    read_before,
                );
                model[dst as usize..dst as usize + 8].copy_from_slice(&data);
                expect.push(None);
            }
            Op::Flush { dst, len } => {
                p.post(
                    id,
                    SendOp::Flush {
                        remote_addr: B_IOVA + dst,
                        rkey,
                        len,
                        placement: 1,
                        whole_region: false,
                    },
                    SgList::new(),
                );
                expect.push(None);
            }
        }
    }
    p.run();

    // 0. The wire: the capture (taken where each packet is sent, before
    //    the link loses, copies or delays it) breaks none of the rules
    //    `rnic check` holds any NIC's traffic to.
    let found = conformance(&p.c.net.pcap());
    prop_assert!(
        found.is_empty(),
        "the traffic breaks the transport's rules: {found:#?}"
    );

    // 2. Completions: each once, in post order; failures only as retry
    //    exhaustion, followed by flushes.
    let comps = p.completions(0);
    prop_assert_eq!(comps.len(), ops.len(), "every WR completes once");
    let mut failed = false;
    let mut succeeded = 0;
    for (i, c) in comps.iter().enumerate() {
        prop_assert_eq!(c.wr_id, i as u64, "post order");
        if failed {
            prop_assert_eq!(c.status, WcStatus::WrFlushErr);
        } else if c.status == WcStatus::Success {
            succeeded += 1;
        } else {
            prop_assert_eq!(
                c.status,
                WcStatus::RetryExcErr,
                "only retry exhaustion may fail"
            );
            failed = true;
        }
    }

    // 1. Executions: a prefix of the posted requests, each exactly once, in order
    //    (READ re-executions of duplicates aside).
    let execs: Vec<_> = p.c.nics[1]
        .executions()
        .iter()
        .filter(|e| {
            !matches!(
                e.kind,
                ExecKind::Read {
                    duplicate: true,
                    ..
                }
            )
        })
        .collect();
    prop_assert!(
        execs.len() <= ops.len(),
        "{} executions for {} requests",
        execs.len(),
        ops.len()
    );
    prop_assert!(execs.len() >= succeeded, "success means executed");
    for (e, op) in execs.iter().zip(ops) {
        let same_kind = matches!(
            (&e.kind, op),
            (ExecKind::Write { .. }, Op::Write { .. })
                | (ExecKind::Read { .. }, Op::Read { .. })
                | (ExecKind::Send { .. }, Op::Send { .. })
                | (ExecKind::Atomic { .. }, Op::Cas { .. } | Op::Add { .. })
                | (ExecKind::Write { .. }, Op::AtomicWrite { .. })
                | (ExecKind::Flush { .. }, Op::Flush { .. })
        );
        prop_assert!(same_kind, "executed {:?} where {:?} was next", e.kind, op);
    }

    // 3. Memory. If everything ran, B equals the model; results match.
    if !failed {
        prop_assert_eq!(execs.len(), ops.len());
        let b = p.read(1, 0, REGION);
        if b != model {
            let first = b.iter().zip(&model).position(|(x, y)| x != y).unwrap();
            return Err(TestCaseError::fail(format!(
                "B's memory differs from the model at offset {first}"
            )));
        }
    }
    for (i, c) in comps.iter().enumerate() {
        if let (WcStatus::Success, Some((at, want))) = (c.status, &expect[i]) {
            let got = p.read(0, *at, want.len());
            if &got != want {
                let first = got.iter().zip(want).position(|(x, y)| x != y).unwrap_or(0);
                return Err(TestCaseError::fail(format!(
                    "request {i} ({:?}) returned wrong data from byte {first} of {}",
                    ops[i],
                    want.len()
                )));
            }
        }
    }
    Ok(!failed)
}

/// What `rnic check` finds in `pcap`.
fn conformance(pcap: &[u8]) -> Vec<rnic_core::check::Finding> {
    let mut c = rnic_core::check::Checker::new();
    let reader = rnic_wire::pcap::PcapReader::new(pcap).expect("the simulator's capture");
    for (i, r) in reader.enumerate() {
        let r = r.expect("the simulator's capture");
        c.frame(
            i as u64 + 1,
            r.timestamp_ns,
            rnic_wire::LinkType::from_pcap(r.link_type),
            r.data,
        );
    }
    let f = c.finish().0;
    if !f.is_empty() && std::env::var("RNIC_DEBUG_PCAP").is_ok() {
        std::fs::write("/tmp/props-fail.pcap", pcap).unwrap();
    }
    f
}

fn cases() -> u32 {
    std::env::var("RNIC_SIM_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_under_impairments(
        seed in any::<u64>(),
        link in link(),
        mtu in mtu(),
        steps in proptest::collection::vec((op(), gap()), 1..24),
    ) {
        let (ops, gaps): (Vec<Op>, Vec<u32>) = steps.into_iter().unzip();
        check(seed, link, mtu, &ops, &gaps, Mechanisms::default())?;
    }

    /// The same behind a slow link (0.5 to 50 MB/s each way): a queue
    /// builds in front of each side, round trips pass the requester's delay
    /// target (a quarter of the 1.05 ms ACK timeout), and its window
    /// shrinks and grows slowly while losses, duplicates, timeouts and
    /// go-back-N interleave with it.
    #[test]
    fn invariants_hold_behind_a_slow_link(
        seed in any::<u64>(),
        link in link(),
        mtu in mtu(),
        bytes_per_second in 500_000u64..50_000_000,
        steps in proptest::collection::vec((op(), gap()), 1..24),
    ) {
        let (ops, gaps): (Vec<Op>, Vec<u32>) = steps.into_iter().unzip();
        check_behind(seed, link, mtu, &ops, &gaps, Mechanisms::default(), bytes_per_second)?;
    }
}

/// With mild impairments nearly every run completes everything: the property
/// above is not passing by giving up.
#[test]
fn most_runs_complete_everything() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = (any::<u64>(), proptest::collection::vec(op(), 1..16));
    let mut complete = 0;
    for _ in 0..200 {
        let (seed, ops) = strategy.new_tree(&mut runner).unwrap().current();
        let link = LinkConfig {
            loss: 0.05,
            duplicate: 0.05,
            corrupt: 0.02,
            delay: Duration::from_micros(5),
            jitter: Duration::from_micros(10),
        };
        if check(seed, link, Mtu::Mtu1024, &ops, &[], Mechanisms::default()).unwrap() {
            complete += 1;
        }
    }
    assert!(complete >= 195, "only {complete} of 200 runs completed");
}

/// Teeth: with duplicate detection off, duplicated packets execute twice and
/// the properties fail.
#[test]
fn without_duplicate_detection_the_properties_fail() {
    let link = LinkConfig {
        duplicate: 0.5,
        ..LinkConfig::perfect(Duration::from_micros(5))
    };
    let ops: Vec<Op> = (0..20)
        .map(|i| Op::Write {
            dst: i * 64,
            src: i * 64,
            len: 64,
        })
        .collect();
    let off = Mechanisms {
        duplicate_detection: false,
        ..Mechanisms::default()
    };
    let failures = (0..20u64)
        .filter(|&seed| check(seed, link, Mtu::Mtu1024, &ops, &[], off).is_err())
        .count();
    assert!(
        failures >= 15,
        "only {failures} of 20 runs caught the duplicates"
    );
    for seed in 0..20u64 {
        check(seed, link, Mtu::Mtu1024, &ops, &[], Mechanisms::default()).unwrap();
    }
}

/// Teeth: without the atomic replay cache, a duplicated FETCH_ADD adds twice.
#[test]
fn without_the_atomic_replay_cache_the_properties_fail() {
    let link = LinkConfig {
        duplicate: 0.5,
        ..LinkConfig::perfect(Duration::from_micros(5))
    };
    let ops: Vec<Op> = (0..20)
        .map(|i| Op::Add {
            dst: (i % 4) * 8,
            add: 1 + i,
        })
        .collect();
    let off = Mechanisms {
        atomic_replay_cache: false,
        ..Mechanisms::default()
    };
    let failures = (0..20u64)
        .filter(|&seed| check(seed, link, Mtu::Mtu1024, &ops, &[], off).is_err())
        .count();
    assert!(
        failures >= 15,
        "only {failures} of 20 runs caught the double execution"
    );
    for seed in 0..20u64 {
        check(seed, link, Mtu::Mtu1024, &ops, &[], Mechanisms::default()).unwrap();
    }
}
