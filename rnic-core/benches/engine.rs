//! Packets the engine handles per second on one core: two NICs connected back
//! to back in one thread (no network, no I/O), one RC QP pair, a stream of 64 B
//! and 4 KiB WRITEs and SENDs. Every packet is built, ICRC'd, parsed, verified
//! and executed. A report, not a test; the goal is at least 3 million packets/s
//! for 64 B, far below a system call's cost (about 1 us).
//!
//! One core does both ends of every packet here, so two figures are printed:
//! packets moved (each one sent by one NIC and handled by the other), and
//! packet events (a send or a receive at one NIC), which is twice as many and
//! is what one NIC's core would handle.
//!
//! `cargo bench -p rnic-core --bench engine`

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use rnic_core::mem::Access;
use rnic_core::qp::{AddressVector, Mtu, QpAttr, QpType};
use rnic_core::time::Time;
use rnic_core::wr::{sg_list, RecvWr, SendOp, SendWr, Sge};
use rnic_core::{Nic, QpCaps};

struct Setup {
    nics: [Nic; 2],
    qpn: [u32; 2],
    cq: [rnic_core::cq::CqHandle; 2],
    lkey: [u32; 2],
    rkey_b: u32,
}

fn setup() -> Setup {
    let addrs = [
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
    ];
    let mut nics = [Nic::new(addrs[0], 1), Nic::new(addrs[1], 2)];
    let caps = QpCaps {
        max_send_wr: 4096,
        max_recv_wr: 4096,
        ..QpCaps::default()
    };
    let mut qpn = [0; 2];
    let mut cq = [rnic_core::cq::CqHandle(0); 2];
    let mut keys = Vec::new();
    for (i, nic) in nics.iter_mut().enumerate() {
        let pd = nic.alloc_pd();
        cq[i] = nic.create_cq(1 << 20);
        qpn[i] = nic.create_qp(pd, QpType::Rc, cq[i], cq[i], caps).unwrap();
        keys.push(
            nic.reg_mr(
                pd,
                0x10000,
                Box::new(vec![0u8; 1 << 20]),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap(),
        );
    }
    for i in 0..2 {
        let attr = QpAttr {
            qp_access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ,
            ah_attr: Some(AddressVector {
                dest: addrs[1 - i],
                src: None,
                traffic_class: 0,
                hop_limit: 64,
                flow_label: 0,
            }),
            path_mtu: Mtu::Mtu4096,
            dest_qp_num: qpn[1 - i],
            ..QpAttr::default()
        };
        nics[i].to_rts(Time::ZERO, qpn[i], &attr).unwrap();
    }
    Setup {
        nics,
        qpn,
        cq,
        lkey: [keys[0].lkey, keys[1].lkey],
        rkey_b: keys[1].rkey,
    }
}

/// Run `n` operations of `size` bytes in batches; returns packets handled per second.
fn run(send: bool, size: u32, n: u64) -> f64 {
    let mut s = setup();
    let batch = 256u64;
    let start = Instant::now();
    let mut packets = 0u64;
    let mut now = Time(1);
    let mut wr_id = 0u64;
    while wr_id < n {
        for _ in 0..batch {
            if send {
                s.nics[1]
                    .post_recv(
                        now,
                        s.qpn[1],
                        RecvWr {
                            wr_id,
                            sg_list: sg_list![Sge {
                                addr: 0x10000,
                                length: size,
                                lkey: s.lkey[1],
                            }],
                        },
                    )
                    .unwrap();
            }
            let op = if send {
                SendOp::send()
            } else {
                SendOp::write(0x10000, s.rkey_b)
            };
            let wr = SendWr::new(
                wr_id,
                op,
                sg_list![Sge {
                    addr: 0x10000,
                    length: size,
                    lkey: s.lkey[0],
                }],
            )
            .signaled(wr_id % 64 == 63);
            s.nics[0].post_send(now, s.qpn[0], wr).unwrap();
            wr_id += 1;
        }
        // Move packets both ways until both NICs are quiet.
        loop {
            let mut moved = false;
            for i in 0..2 {
                while let Some(d) = s.nics[i].poll_transmit() {
                    s.nics[1 - i].handle_datagram(now, &d);
                    packets += 1;
                    moved = true;
                }
            }
            if !moved {
                break;
            }
        }
        for i in 0..2 {
            black_box(s.nics[i].poll_cq(s.cq[i], usize::MAX).unwrap());
        }
        now = Time(now.0 + 1000);
    }
    packets as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    // For instruction counting under valgrind: one configuration, once.
    if let Ok(n) = std::env::var("RNIC_BENCH_ONCE_WRITE64") {
        let n = n.parse().unwrap_or(20_000);
        println!("{:.0} packets/s", run(false, 64, n));
        return;
    }
    println!("RC engine, one thread, two NICs back to back, PMTU 4096");
    println!(
        "{:>10}  {:>6}  {:>14}  {:>16}  {:>14}",
        "operation", "size", "packets moved/s", "packet events/s", "ns per event"
    );
    for (send, name) in [(false, "WRITE"), (true, "SEND")] {
        for size in [64u32, 4096] {
            let n = if size == 64 { 400_000 } else { 100_000 };
            // Best of several rounds: these machines are shared and noisy.
            let best = (0..7).map(|_| run(send, size, n / 2)).fold(0.0, f64::max);
            println!(
                "{name:>10}  {size:>5}B  {best:>14.0}  {:>16.0}  {:>14.0}",
                2.0 * best,
                1e9 / (2.0 * best)
            );
        }
    }
}
