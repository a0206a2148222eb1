//! Two software RDMA NICs on loopback: an RC connection, and an RDMA WRITE
//! into the peer's memory that the peer's CPU never sees.
//!
//!     cargo run -p rnic-verbs --example hello

use std::time::Duration;

use rnic_verbs::*;

fn main() -> Result<()> {
    // Each device takes the next free loopback address (127.0.0.1, .2, ...).
    let (a, b) = (Device::open_loopback()?, Device::open_loopback()?);
    let (pd_a, pd_b) = (a.alloc_pd()?, b.alloc_pd()?);
    let src = pd_a.register(4096, Access::LOCAL_WRITE)?;
    let dst = pd_b.register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let (cq_a, cq_b) = (a.create_cq(16)?, b.create_cq(16)?);
    let qp_a = pd_a.create_rc_qp(&cq_a, &cq_a, QpCaps::default())?;
    let qp_b = pd_b.create_rc_qp(&cq_b, &cq_b, QpCaps::default())?;
    // Each side learns the other's endpoint out of band (between processes,
    // over TCP: rnic_verbs::rendezvous).
    let opts = ConnectOptions::default();
    qp_a.connect(&qp_b.endpoint(), &opts)?;
    qp_b.connect(&qp_a.endpoint(), &opts)?;

    let msg = b"hello, RDMA";
    src.write(0, msg);
    let write = SendOp::write(dst.addr(), dst.rkey());
    let from = sg_list![src.sge(0, msg.len() as u32)];
    qp_a.post_send(SendWr::new(1, write, from))?;
    let done = cq_a.wait(Duration::from_secs(5))?;
    assert_eq!(done.status, WcStatus::Success);

    let mut landed = vec![0u8; msg.len()];
    dst.read(0, &mut landed);
    println!("B's memory: {}", String::from_utf8_lossy(&landed));
    Ok(())
}
