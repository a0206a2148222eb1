//! Type 2 memory windows: B opens 64 bytes of a larger region to A alone,
//! A writes through the window, then closes it with SEND_WITH_INV, and a
//! later WRITE through the stale key is refused.
//!
//!     cargo run -p rnic-verbs --example memory_window

use std::time::Duration;

use rnic_verbs::*;

const T: Duration = Duration::from_secs(5);

fn wr(wr_id: u64, op: SendOp, sg_list: SgList) -> SendWr {
    SendWr::new(wr_id, op, sg_list)
}

fn main() -> Result<()> {
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let (a, b) = (Device::open_loopback()?, Device::open_loopback()?);
    let (pd_a, pd_b) = (a.alloc_pd()?, b.alloc_pd()?);
    let mr_a = pd_a.register(4096, rights)?;
    // The region itself is never shown to A: only the window is.
    let mr_b = pd_b.register(1 << 16, rights | Access::MW_BIND)?;
    let (cq_a, cq_b) = (a.create_cq(16)?, b.create_cq(16)?);
    let qp_a = pd_a.create_rc_qp(&cq_a, &cq_a, QpCaps::default())?;
    let qp_b = pd_b.create_rc_qp(&cq_b, &cq_b, QpCaps::default())?;
    let o = ConnectOptions::default();
    qp_a.connect(&qp_b.endpoint(), &o)?;
    qp_b.connect(&qp_a.endpoint(), &o)?;

    let mw = pd_b.alloc_mw()?;
    let window = qp_b.bind_mw(1, &mw, &mr_b, 1024, 64, Access::REMOTE_WRITE)?;
    println!("bind: {}", cq_b.wait(T)?.status);
    println!(
        "window R_Key {window:#x} opens 64 bytes at {:#x}",
        mr_b.addr() + 1024
    );

    mr_a.write(0, b"through the window");
    let write = |wr_id, rkey| {
        qp_a.post_send(wr(
            wr_id,
            SendOp::write(mr_b.addr() + 1024, rkey),
            sg_list![mr_a.sge(0, 18)],
        ))
    };
    write(2, window)?;
    println!("WRITE through the window: {}", cq_a.wait(T)?.status);

    qp_b.post_recv(RecvWr {
        wr_id: 3,
        sg_list: sg_list![mr_b.sge(0, 64)],
    })?;
    qp_a.post_send(wr(
        4,
        SendOp::SendWithInv {
            invalidate_rkey: window,
        },
        sg_list![mr_a.sge(0, 4)],
    ))?;
    println!("SEND_WITH_INV: {}", cq_a.wait(T)?.status);
    let r = cq_b.wait(T)?;
    let invalidated = r.invalidated_rkey.map(|k| format!("{k:#x}"));
    println!(
        "B's receive: {}, invalidated R_Key {invalidated:?}",
        r.status
    );

    write(5, window)?;
    println!("WRITE through the closed window: {}", cq_a.wait(T)?.status);
    Ok(())
}
