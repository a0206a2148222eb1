//! Allocations on the data path, counted on the program's thread: posting
//! and polling through the C entry points, as a verbs program calls them.
//!
//! Polling runs to completion: `ibv_poll_cq` on an empty queue takes in the
//! packets that have arrived and answers them on the program's thread. The
//! receive buffers, the send headers and the packet buffers (a pool in the
//! NIC) are reused, so neither receiving nor sending a packet allocates.
//! What is left, bounded here so a regression fails and an improvement
//! shows in the output: a work request's scatter list is a `Vec` (one
//! allocation per post), and the queue a CQ's completions wait in grows in
//! blocks of 31 (one allocation per 31 completions, on whichever thread
//! delivers them).
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::c_int;
use std::ptr::null_mut;

use ibverbs::sys;

mod common;
use common::*;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the counter is a thread-local
// Cell with a const initialiser, which needs no allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's layout.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: allocated above.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's pointer and layout.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

/// Two RC queue pairs of this test connect like this.
const HOW: common::Connect = common::Connect {
    access: sys::IBV_ACCESS_REMOTE_WRITE,
    timeout: 14,
    retry: 7,
};

/// An RC queue pair with room for 64 requests each way, one SGE each.
unsafe fn rc_qp(pd: *mut sys::ibv_pd, cq: *mut sys::ibv_cq) -> *mut sys::ibv_qp {
    let caps = sys::ibv_qp_cap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    // SAFETY: the test's own objects.
    let qp = unsafe { create_qp(pd, cq, caps, sys::IBV_QPT_RC) };
    assert!(!qp.is_null());
    qp
}

#[test]
fn allocations_on_the_data_path() {
    // Its own device, before the library reads the environment.
    std::env::set_var("RNIC_DEVICES", "rnic0=127.0.0.203");
    // SAFETY: the verbs calls of a C program, on objects made here.
    unsafe {
        let list = ibv_get_device_list(null_mut());
        assert!(!list.is_null() && !(*list).is_null());
        let ctx = ibv_open_device(*list);
        assert!(!ctx.is_null());
        let ops = (*ctx).ops;
        let (post_send, post_recv, poll_cq) = (
            ops.post_send.unwrap(),
            ops.post_recv.unwrap(),
            ops.poll_cq.unwrap(),
        );
        let pd = ibv_alloc_pd(ctx);
        let cq = ibv_create_cq(ctx, 256, null_mut(), null_mut(), 0);
        assert!(!pd.is_null() && !cq.is_null());
        let mut buf = vec![0u8; 1 << 16];
        let access = sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE;
        let mr = ibv_reg_mr(pd, buf.as_mut_ptr().cast(), buf.len(), access as c_int);
        assert!(!mr.is_null());
        let mut gid: sys::ibv_gid = std::mem::zeroed();
        assert_eq!(ibv_query_gid(ctx, 1, 0, &mut gid), 0);
        let (a, b) = (rc_qp(pd, cq), rc_qp(pd, cq));
        assert!(connect(a, (*b).qp_num, gid, HOW));
        assert!(connect(b, (*a).qp_num, gid, HOW));

        let mut sge = sys::ibv_sge {
            addr: buf.as_ptr() as u64,
            length: 64,
            lkey: (*mr).lkey,
        };
        let mut wr: sys::ibv_send_wr = std::mem::zeroed();
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = sys::IBV_WR_RDMA_WRITE;
        wr.send_flags = sys::IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = buf.as_ptr() as u64 + 4096;
        wr.wr.rdma.rkey = (*mr).rkey;
        let mut rwr: sys::ibv_recv_wr = std::mem::zeroed();
        rwr.sg_list = &mut sge;
        rwr.num_sge = 1;
        let mut wc = [std::mem::zeroed::<sys::ibv_wc>(); 16];
        let mut bad: *mut sys::ibv_send_wr = null_mut();
        let mut rbad: *mut sys::ibv_recv_wr = null_mut();

        // Warm up: the first uses of queues and channels may grow them.
        let mut run = |rounds: usize| {
            let (mut posting, mut polling, mut receiving) = (0, 0, 0);
            for i in 0..rounds {
                wr.wr_id = i as u64;
                let before = allocs();
                assert_eq!(post_send(a, &mut wr, &mut bad), 0);
                posting += allocs() - before;
                // WRITEs consume no receive: post a few, within max_recv_wr.
                if i % 20 == 0 {
                    let before = allocs();
                    assert_eq!(post_recv(b, &mut rwr, &mut rbad), 0);
                    receiving += allocs() - before;
                }
                let mut got = 0;
                for _ in 0..10_000_000 {
                    let before = allocs();
                    let n = poll_cq(cq, wc.len() as c_int, wc.as_mut_ptr());
                    polling += allocs() - before;
                    assert!(n >= 0);
                    if wc[..n as usize].iter().any(|w| w.wr_id == i as u64) {
                        assert!(wc[..n as usize].iter().all(|w| w.status == 0));
                        got += 1;
                        break;
                    }
                }
                assert_eq!(got, 1, "WRITE {i} did not complete");
            }
            (posting, polling, receiving)
        };
        run(50);
        let (posting, polling, receiving) = run(500);
        eprintln!(
            "allocations on the program's thread over 500 rounds: post_send {posting}, \
             post_recv {receiving}, poll_cq {polling}"
        );
        // One allocation per 31 completions (the completion queue's blocks),
        // with room for a block more.
        assert!(polling <= 500 / 31 + 2, "poll_cq: {polling} allocations");
        // One per post (the scatter list), with room for what varies with
        // timing (a queue that grows once).
        assert!(receiving <= 25 + 8, "post_recv: {receiving} allocations");
        assert!(posting <= 500 + 5, "post_send: {posting} allocations");
    }
}
