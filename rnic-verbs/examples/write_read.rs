//! Two rnic NICs in one process, on loopback: connect an RC queue pair, RDMA
//! WRITE a message into the peer's memory, READ it back, and sleep on a
//! completion channel instead of spinning.
//!
//!     cargo run -p rnic-verbs --example write_read

use std::time::Duration;

use rnic_verbs::*;

fn main() -> Result<()> {
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    // Each device takes the next free loopback address (127.0.0.1, .2, ...).
    let (a, b) = (Device::open_loopback()?, Device::open_loopback()?);
    println!(
        "NIC A on {} (GID {}), NIC B on {}",
        a.addr(),
        a.gid(),
        b.addr()
    );
    let (pd_a, pd_b) = (a.alloc_pd()?, b.alloc_pd()?);
    let mr_a = pd_a.register_with(8192, rights, Backing::Pages)?;
    let mr_b = pd_b.register(8192, rights)?;

    let channel = a.create_comp_channel()?;
    let cq_a = a.create_cq_with_channel(16, &channel)?;
    let cq_b = b.create_cq(16)?;
    let qp_a = pd_a.create_rc_qp(&cq_a, &cq_a, QpCaps::default())?;
    let qp_b = pd_b.create_rc_qp(&cq_b, &cq_b, QpCaps::default())?;
    // Out of band, each side learns the other's endpoint (rnic_verbs::rendezvous
    // does this over TCP between processes).
    let o = ConnectOptions::default();
    qp_a.connect(&qp_b.endpoint(), &o)?;
    qp_b.connect(&qp_a.endpoint(), &o)?;

    let msg = b"hello from A, placed by the NIC";
    mr_a.write(0, msg);
    let post = |wr_id, op| {
        qp_a.post_send(SendWr::new(
            wr_id,
            op,
            sg_list![mr_a.sge(if wr_id == 1 { 0 } else { 4096 }, msg.len() as u32)],
        ))
    };
    for (wr_id, op) in [
        (1, SendOp::write(mr_b.addr(), mr_b.rkey())),
        (2, SendOp::read(mr_b.addr(), mr_b.rkey())),
    ] {
        cq_a.req_notify();
        post(wr_id, op)?;
        // Sleep until the channel's descriptor is readable (it could be in an
        // epoll set with the application's sockets).
        let cq = channel.get_cq_event(Duration::from_secs(5))?;
        assert_eq!(cq, cq_a.id());
        for c in cq_a.poll() {
            println!("completion: wr_id {} {} {}", c.wr_id, c.opcode, c.status);
        }
    }
    let mut at_b = vec![0u8; msg.len()];
    mr_b.read(0, &mut at_b);
    let mut read_back = vec![0u8; msg.len()];
    mr_a.read(4096, &mut read_back);
    println!("B's memory: {:?}", String::from_utf8_lossy(&at_b));
    println!("read back:  {:?}", String::from_utf8_lossy(&read_back));
    println!("B's CPU saw {} completions", cq_b.poll().len());
    Ok(())
}
