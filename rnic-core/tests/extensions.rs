//! The operations beyond SEND/WRITE/READ/atomics: ATOMIC_WRITE, FLUSH, type 2
//! memory windows (BIND_MW), LOCAL_INV and SEND_WITH_INV.

mod common;

use common::*;
use rnic_core::mem::{Access, MwBind};
use rnic_core::wr::{Completion, SendOp, WcOpcode, WcStatus};
use rnic_core::ExecKind;
use rnic_wire::Opcode;

fn params() -> Params {
    let d = Params::default();
    Params {
        b_access: d.b_access | Access::MW_BIND | Access::FLUSH_GLOBAL,
        b_qp_access: d.b_qp_access | Access::FLUSH_GLOBAL,
        ..d
    }
}

/// The opcodes on the wire, in order.
fn opcodes(p: &Pair) -> Vec<Opcode> {
    wire(p).into_iter().map(|s| s.opcode).collect()
}

fn only(c: Vec<Completion>) -> Completion {
    assert_eq!(c.len(), 1, "{c:?}");
    c[0]
}

fn atomic_write(p: &mut Pair, wr_id: u64, remote_addr: u64, rkey: u32, data: [u8; 8]) {
    p.post(
        wr_id,
        SendOp::AtomicWrite {
            remote_addr,
            rkey,
            data,
        },
        SgList::new(),
    );
}

#[test]
fn atomic_write_stores_eight_bytes_answered_by_an_empty_read_response() {
    let (mut p, _, _) = pair(1, &params());
    let rkey = p.b.mr.rkey;
    atomic_write(&mut p, 7, B_IOVA + 64, rkey, *b"12345678");
    p.run();
    let c = only(p.completions(0));
    assert_eq!(
        (c.wr_id, c.status, c.opcode, c.byte_len),
        (7, WcStatus::Success, WcOpcode::AtomicWrite, 0)
    );
    assert_eq!(p.read(1, 64, 8), b"12345678");
    assert_eq!(
        opcodes(&p),
        [Opcode::RC_ATOMIC_WRITE, Opcode::RC_RDMA_READ_RESPONSE_ONLY]
    );
    assert!(p.completions(1).is_empty(), "the target's CPU sees nothing");
}

#[test]
fn atomic_write_refusals_write_nothing() {
    // Misaligned: invalid request.
    let (mut p, _, _) = pair(2, &params());
    let rkey = p.b.mr.rkey;
    atomic_write(&mut p, 1, B_IOVA + 4, rkey, [0xAA; 8]);
    p.run();
    assert_eq!(only(p.completions(0)).status, WcStatus::RemInvReqErr);
    assert_eq!(p.read(1, 0, 16), [0; 16]);
    // A bad R_Key: remote access error.
    let (mut p, _, _) = pair(3, &params());
    let rkey = p.b.mr.rkey ^ 0x80;
    atomic_write(&mut p, 1, B_IOVA, rkey, [0xAA; 8]);
    p.run();
    assert_eq!(only(p.completions(0)).status, WcStatus::RemAccessErr);
    assert_eq!(p.read(1, 0, 8), [0; 8]);
    // A QP that does not allow remote writes.
    let (mut p, _, _) = pair(
        4,
        &Params {
            b_qp_access: Access::REMOTE_READ,
            ..params()
        },
    );
    let rkey = p.b.mr.rkey;
    atomic_write(&mut p, 1, B_IOVA, rkey, [0xAA; 8]);
    p.run();
    assert_eq!(only(p.completions(0)).status, WcStatus::RemInvReqErr);
    assert_eq!(p.read(1, 0, 8), [0; 8]);
}

#[test]
fn atomic_write_duplicate_is_answered_not_executed_again() {
    let (mut p, _, _) = pair(5, &params());
    let b = p.c.nics[1].addr();
    p.c.net.drop_rule(rnic_core::sim::DropRule {
        src: Some(b),
        opcode: Some(Opcode::RC_RDMA_READ_RESPONSE_ONLY),
        psn: None,
        times: 1,
    });
    let rkey = p.b.mr.rkey;
    atomic_write(&mut p, 1, B_IOVA + 8, rkey, [5; 8]);
    p.run();
    let c = only(p.completions(0));
    assert_eq!(
        (c.status, c.opcode),
        (WcStatus::Success, WcOpcode::AtomicWrite)
    );
    assert_eq!(p.c.nics[1].counters().duplicate_request, 1);
    let writes = p.c.nics[1]
        .executions()
        .iter()
        .filter(|e| matches!(e.kind, ExecKind::Write { .. }))
        .count();
    assert_eq!(writes, 1, "executed once, answered twice");
    assert_eq!(
        opcodes(&p),
        [
            Opcode::RC_ATOMIC_WRITE,
            Opcode::RC_RDMA_READ_RESPONSE_ONLY, // lost
            Opcode::RC_ATOMIC_WRITE,            // after the local ACK timeout
            Opcode::RC_RDMA_READ_RESPONSE_ONLY, // from the responder's resource
        ]
    );
}

fn flush(p: &mut Pair, wr_id: u64, rkey: u32, placement: u8, whole_region: bool) {
    p.post(
        wr_id,
        SendOp::Flush {
            remote_addr: B_IOVA + 128,
            rkey,
            len: 512,
            placement,
            whole_region,
        },
        SgList::new(),
    );
}

#[test]
fn flush_after_write_completes_in_order() {
    let (mut p, _, _) = pair(6, &params());
    let rkey = p.b.mr.rkey;
    p.write_a(0, &[3; 512]);
    p.post(1, SendOp::write(B_IOVA + 128, rkey), p.sge_a(0, 512));
    flush(&mut p, 2, rkey, 1, false);
    flush(&mut p, 3, rkey, 1, true);
    p.run();
    let c = p.completions(0);
    let got: Vec<_> = c.iter().map(|c| (c.wr_id, c.status, c.opcode)).collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::Success, WcOpcode::RdmaWrite),
            (2, WcStatus::Success, WcOpcode::Flush),
            (3, WcStatus::Success, WcOpcode::Flush),
        ]
    );
    assert_eq!(p.read(1, 128, 512), [3; 512]);
    let ops = opcodes(&p);
    assert_eq!(ops.iter().filter(|&&o| o == Opcode::RC_FLUSH).count(), 2);
}

#[test]
fn flush_refusals() {
    // Persistence the QP does not allow: invalid request.
    let (mut p, _, _) = pair(7, &params());
    let rkey = p.b.mr.rkey;
    flush(&mut p, 1, rkey, 2, false);
    p.run();
    assert_eq!(only(p.completions(0)).status, WcStatus::RemInvReqErr);
    // The QP allows it, the memory (a plain buffer) cannot persist, so the
    // region could not be registered with the right: remote access error.
    let d = params();
    let (mut p, _, _) = pair(
        8,
        &Params {
            b_qp_access: d.b_qp_access | Access::FLUSH_PERSISTENT,
            ..d
        },
    );
    let rkey = p.b.mr.rkey;
    flush(&mut p, 1, rkey, 2, false);
    p.run();
    assert_eq!(only(p.completions(0)).status, WcStatus::RemAccessErr);
    // A region without FLUSH_GLOBAL.
    let (mut p, _, _) = pair(9, &Params::default());
    let rkey = p.b.mr.rkey;
    flush(&mut p, 1, rkey, 1, false);
    p.run();
    assert_eq!(only(p.completions(0)).status, WcStatus::RemInvReqErr);
}

fn write_through(p: &mut Pair, wr_id: u64, rkey: u32, offset: u64, len: u32) -> WcStatus {
    p.post(
        wr_id,
        SendOp::write(B_IOVA + 4096 + offset, rkey),
        p.sge_a(0, len),
    );
    p.run();
    only(p.completions(0)).status
}

#[test]
fn window_opens_its_range_only_then_send_with_invalidate_closes_it() {
    let (mut p, _, _) = pair(10, &params());
    p.write_a(0, &[0x5A; 300]);
    let win = bound_window(&mut p, Access::REMOTE_WRITE);
    assert_eq!(write_through(&mut p, 1, win, 0, 256), WcStatus::Success);
    assert_eq!(p.read(1, 4096, 256), [0x5A; 256]);
    // SEND_WITH_INV: B's receive reports the key it invalidated.
    p.recv_b(9, 0, 64);
    p.post(
        2,
        SendOp::SendWithInv {
            invalidate_rkey: win,
        },
        p.sge_a(0, 16),
    );
    p.run();
    let c = only(p.completions(0));
    assert_eq!((c.status, c.opcode), (WcStatus::Success, WcOpcode::Send));
    let r = only(p.completions(1));
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len, r.invalidated_rkey),
        (9, WcStatus::Success, WcOpcode::Recv, 16, Some(win))
    );
    assert_eq!(
        opcodes(&p)[2..4],
        [Opcode::RC_SEND_ONLY_WITH_INVALIDATE, Opcode::RC_ACKNOWLEDGE]
    );
    // The key is dead.
    assert_eq!(write_through(&mut p, 3, win, 0, 8), WcStatus::RemAccessErr);
}

#[test]
fn window_refuses_beyond_its_range_and_rights() {
    let (mut p, _, _) = pair(11, &params());
    let win = bound_window(&mut p, Access::REMOTE_WRITE);
    assert_eq!(
        write_through(&mut p, 1, win, 250, 8),
        WcStatus::RemAccessErr
    );
    assert_eq!(p.read(1, 4096 + 250, 8), [0; 8]);
    let (mut p, _, _) = pair(12, &params());
    let win = bound_window(&mut p, Access::REMOTE_READ);
    assert_eq!(write_through(&mut p, 1, win, 0, 8), WcStatus::RemAccessErr);
}

#[test]
fn local_invalidate_in_send_queue_order() {
    let (mut p, _, _) = pair(13, &params());
    let win = bound_window(&mut p, Access::REMOTE_WRITE | Access::REMOTE_READ);
    assert_eq!(write_through(&mut p, 1, win, 0, 8), WcStatus::Success);
    post_b(&mut p, 51, SendOp::LocalInv { rkey: win });
    p.run();
    let c = only(p.completions(1));
    assert_eq!(
        (c.wr_id, c.status, c.opcode),
        (51, WcStatus::Success, WcOpcode::LocalInv)
    );
    assert_eq!(write_through(&mut p, 2, win, 0, 8), WcStatus::RemAccessErr);
}

#[test]
fn local_operations_that_fail_complete_in_error() {
    // A region registered by reg_mr cannot be invalidated.
    let (mut p, _, _) = pair(14, &params());
    let rkey = p.b.mr.rkey;
    post_b(&mut p, 1, SendOp::LocalInv { rkey });
    p.run();
    assert_eq!(only(p.completions(1)).status, WcStatus::LocQpOpErr);
    // A region without MW_BIND cannot have a window.
    let (mut p, _, _) = pair(15, &Params::default());
    let mw = p.c.nics[1].alloc_mw(p.b.pd).unwrap();
    let mr_lkey = p.b.mr.lkey;
    post_b(
        &mut p,
        2,
        SendOp::BindMw(MwBind {
            mw_rkey: mw,
            new_rkey: mw,
            mr_lkey,
            addr: B_IOVA,
            length: 8,
            access: Access::REMOTE_READ,
        }),
    );
    p.run();
    assert_eq!(only(p.completions(1)).status, WcStatus::MwBindErr);
}

#[test]
fn send_with_invalidate_of_a_region_key_is_refused() {
    let (mut p, _, _) = pair(16, &params());
    let rkey = p.b.mr.rkey;
    p.recv_b(9, 0, 64);
    p.post(
        1,
        SendOp::SendWithInv {
            invalidate_rkey: rkey,
        },
        p.sge_a(0, 16),
    );
    p.run();
    assert_eq!(only(p.completions(0)).status, WcStatus::RemInvReqErr);
    let r = only(p.completions(1));
    assert_eq!((r.wr_id, r.status), (9, WcStatus::RemInvReqErr));
}
