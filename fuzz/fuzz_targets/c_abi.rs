//! The drop-in libibverbs' C entry points fed arbitrary work requests and
//! attribute structs, as a buggy or hostile program would pass them: every
//! field is the fuzzer's, except that pointers point at memory the program
//! owns (verbs trusts a program's pointers, as rdma-core does). Nothing may
//! crash or panic; a refused call returns an errno (posts set `bad_wr` to
//! the request refused), and the library keeps working: after each input a
//! WRITE on a known-good QP pair must still complete and land.
//!
//! The good pair lives on a second device, at another address. On the
//! inputs' own device it would not be out of their reach: a QP the fuzzer
//! modifies may name any destination QP, and a request with the right PSN
//! and a wrong key moves the QP it reaches to the error state, as the IBTA
//! requires (RoCE cannot tell two QPs of one address apart). From another
//! address the good pair takes nothing: a connected QP takes packets from
//! its peer's address only.

#![no_main]

use std::ffi::c_int;
use std::ptr::null_mut;
use std::sync::OnceLock;

use ibverbs::sys;
use libfuzzer_sys::fuzz_target;

#[path = "../../rnic-verbs/ibverbs/tests/common/mod.rs"]
mod common;
use common::*;

/// The inputs' device and its region (each input makes a QP of its own, and
/// a peer for it, and breaks what it can), and the good pair's.
struct World {
    dev: Dev,
    good: Good,
}

/// A device at another address, its region, and a connected QP (`qp`, its
/// peer beside it) that the inputs cannot reach.
struct Good {
    dev: Dev,
    qp: *mut sys::ibv_qp,
}
// SAFETY: the fuzzer runs inputs on one thread; the objects are rnic's,
// which are thread-safe.
unsafe impl Send for World {}
unsafe impl Sync for World {}

const BUF: usize = 1 << 16;

/// Bytes of input, zero when it runs out.
struct Input<'a>(&'a [u8]);
impl Input<'_> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

/// The QPs of this target connect like this.
const HOW: Connect = Connect {
    access: sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ,
    timeout: 10,
    retry: 2,
};

unsafe fn qp(w: &World, caps: sys::ibv_qp_cap, qp_type: u32) -> *mut sys::ibv_qp {
    // SAFETY: the harness's own objects.
    unsafe { create_qp(w.dev.pd, w.dev.cq, caps, qp_type) }
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        // Devices of their own, away from other programs' default addresses
        // and from another run of this target: rnic0 for the inputs, rnic1
        // for the good pair, on the first two of 127.0.0.200-254 whose port
        // 4791 is free.
        let free: Vec<_> = (200..=254u8)
            .map(|x| std::net::Ipv4Addr::new(127, 0, 0, x))
            .filter(|&a| std::net::UdpSocket::bind((a, 4791)).is_ok())
            .take(2)
            .collect();
        assert_eq!(free.len(), 2, "two free loopback addresses");
        let devices = format!("rnic0={},rnic1={}", free[0], free[1]);
        std::env::set_var("RNIC_DEVICES", devices);
        // SAFETY: the verbs calls of a C program, on objects made here.
        unsafe {
            let list = ibv_get_device_list(null_mut());
            assert!(!list.is_null() && !(*list).is_null() && !(*list.add(1)).is_null());
            let (d, good_dev) = (device(*list), device(*list.add(1)));
            ibv_free_device_list(list);
            let caps = sys::ibv_qp_cap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 256,
            };
            let (g, h) = (
                create_qp(good_dev.pd, good_dev.cq, caps, sys::IBV_QPT_RC),
                create_qp(good_dev.pd, good_dev.cq, caps, sys::IBV_QPT_RC),
            );
            assert!(
                connect(g, (*h).qp_num, good_dev.gid, HOW)
                    && connect(h, (*g).qp_num, good_dev.gid, HOW)
            );
            World {
                dev: d,
                good: Good {
                    dev: good_dev,
                    qp: g,
                },
            }
        }
    })
}

/// An open device with a PD, a CQ, a region over a buffer of its own, and
/// its RoCE v2 GID.
struct Dev {
    ctx: *mut sys::ibv_context,
    pd: *mut sys::ibv_pd,
    cq: *mut sys::ibv_cq,
    mr: *mut sys::ibv_mr,
    buf: *mut u8,
    gid: sys::ibv_gid,
}

/// Open `dev` and make its PD, CQ and region.
unsafe fn device(dev: *mut sys::ibv_device) -> Dev {
    // SAFETY: the verbs calls of a C program, on a device of the list.
    unsafe {
        let ctx = ibv_open_device(dev);
        let pd = ibv_alloc_pd(ctx);
        let cq = ibv_create_cq(ctx, 4096, null_mut(), null_mut(), 0);
        let buf = Box::leak(vec![0u8; BUF].into_boxed_slice()).as_mut_ptr();
        let access = sys::IBV_ACCESS_LOCAL_WRITE
            | sys::IBV_ACCESS_REMOTE_WRITE
            | sys::IBV_ACCESS_REMOTE_READ
            | sys::IBV_ACCESS_REMOTE_ATOMIC
            | sys::IBV_ACCESS_MW_BIND;
        let mr = ibv_reg_mr(pd, buf.cast(), BUF, access as c_int);
        assert!(!ctx.is_null() && !pd.is_null() && !cq.is_null() && !mr.is_null());
        let mut gid: sys::ibv_gid = std::mem::zeroed();
        assert_eq!(ibv_query_gid(ctx, 1, 0, &mut gid), 0);
        Dev {
            ctx,
            pd,
            cq,
            mr,
            buf,
            gid,
        }
    }
}

/// Drain the CQ (bounded), each completion's status a valid one.
unsafe fn drain(w: &World) {
    // SAFETY: plain data; the CQ's ops from the context, as verbs.h's inline
    // ibv_poll_cq calls them.
    unsafe {
        let poll = (*w.dev.ctx).ops.poll_cq.unwrap();
        let mut wc: [sys::ibv_wc; 16] = std::mem::zeroed();
        for _ in 0..1000 {
            let n = poll(w.dev.cq, 16, wc.as_mut_ptr());
            assert!(n >= 0, "ibv_poll_cq failed: {n}");
            for c in &wc[..n as usize] {
                assert!(
                    c.status <= sys::IBV_WC_TM_RNDV_INCOMPLETE,
                    "status {}",
                    c.status
                );
            }
            if n == 0 {
                break;
            }
        }
    }
}

/// A WRITE on the pair the input cannot touch lands and completes.
unsafe fn still_works(w: &Good, round: u64) {
    // SAFETY: the harness's objects and buffer.
    unsafe {
        let post = (*w.dev.ctx).ops.post_send.unwrap();
        let poll = (*w.dev.ctx).ops.poll_cq.unwrap();
        let src = w.dev.buf.add(BUF - 128);
        let dst = w.dev.buf.add(BUF - 64);
        for i in 0..64 {
            *src.add(i) = round as u8 ^ i as u8;
        }
        let mut sge = sys::ibv_sge {
            addr: src as u64,
            length: 64,
            lkey: (*w.dev.mr).lkey,
        };
        let mut wr: sys::ibv_send_wr = std::mem::zeroed();
        wr.wr_id = u64::MAX - round;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = sys::IBV_WR_RDMA_WRITE;
        wr.send_flags = sys::IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = dst as u64;
        wr.wr.rdma.rkey = (*w.dev.mr).rkey;
        let mut bad = null_mut();
        assert_eq!(
            post(w.qp, &mut wr, &mut bad),
            0,
            "the good QP refused a WRITE"
        );
        let mut wc: sys::ibv_wc = std::mem::zeroed();
        for _ in 0..2_000_000 {
            if poll(w.dev.cq, 1, &mut wc) == 1 && wc.wr_id == u64::MAX - round {
                assert_eq!(wc.status, sys::IBV_WC_SUCCESS);
                for i in 0..64 {
                    assert_eq!(*dst.add(i), round as u8 ^ i as u8);
                }
                return;
            }
        }
        panic!("the good QP's WRITE did not complete");
    }
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let mut input = Input(data);
    // SAFETY: every pointer handed to rnic points at memory this harness
    // owns for the length it says; every other field is the fuzzer's.
    unsafe {
        let caps = sys::ibv_qp_cap {
            max_send_wr: input.u32() % 256,
            max_recv_wr: input.u32() % 256,
            max_send_sge: input.u32() % 40,
            max_recv_sge: input.u32() % 40,
            max_inline_data: input.u32() % 300,
        };
        let qp_type = [
            sys::IBV_QPT_RC,
            sys::IBV_QPT_UC,
            sys::IBV_QPT_UD,
            input.u32(),
        ][usize::from(input.u8() % 4)];
        let victim = qp(w, caps, qp_type);
        if victim.is_null() {
            return;
        }
        // Its peer on the same device (never the good pair: a request
        // with a wrong key moves the responder's QP to the error state, as
        // the IBTA requires).
        let rc = sys::ibv_qp_cap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let peer = qp(w, rc, sys::IBV_QPT_RC);
        assert!(!peer.is_null());
        if input.u8() & 1 == 1 {
            connect(victim, (*peer).qp_num, w.dev.gid, HOW);
            connect(peer, (*victim).qp_num, w.dev.gid, HOW);
        }
        let post_send = (*w.dev.ctx).ops.post_send.unwrap();
        let post_recv = (*w.dev.ctx).ops.post_recv.unwrap();
        let mut sges: [sys::ibv_sge; 8] = std::mem::zeroed();
        let mut rounds = 0;
        while !input.done() && rounds < 16 {
            rounds += 1;
            match input.u8() % 4 {
                // A send work request, every field the fuzzer's; the SGEs
                // name memory inside the region's buffer (inline data is read
                // from there) or elsewhere by key, which rnic checks.
                0 => {
                    let n = usize::from(input.u8() % 9);
                    for s in sges.iter_mut().take(n) {
                        let off = u64::from(input.u32()) % BUF as u64;
                        s.addr = w.dev.buf as u64 + off;
                        s.length = input.u32() % (BUF as u32 - off as u32 + 1);
                        s.lkey = if input.u8() & 1 == 0 {
                            (*w.dev.mr).lkey
                        } else {
                            input.u32()
                        };
                    }
                    let mut wr: sys::ibv_send_wr = std::mem::zeroed();
                    wr.wr_id = input.u64();
                    wr.sg_list = sges.as_mut_ptr();
                    wr.num_sge = n as c_int;
                    wr.opcode = input.u32() % 16;
                    wr.send_flags = input.u32();
                    wr.__bindgen_anon_1.imm_data = input.u32();
                    let raw: [u8; 40] = input.bytes();
                    std::ptr::copy_nonoverlapping(
                        raw.as_ptr(),
                        &mut wr.wr as *mut _ as *mut u8,
                        40.min(std::mem::size_of_val(&wr.wr)),
                    );
                    // A UD address handle in `wr.wr` would be the fuzzer's
                    // pointer: keep it null (a window to bind, in another
                    // union, stays null too).
                    if qp_type == sys::IBV_QPT_UD {
                        wr.wr = std::mem::zeroed();
                    }
                    let mut bad = null_mut();
                    let r = post_send(victim, &mut wr, &mut bad);
                    assert!(r >= 0, "post_send returned {r}");
                    assert!(r == 0 || std::ptr::eq(bad, &wr), "bad_wr not set");
                }
                1 => {
                    let n = usize::from(input.u8() % 9);
                    for s in sges.iter_mut().take(n) {
                        s.addr = input.u64();
                        s.length = input.u32();
                        s.lkey = if input.u8() & 1 == 0 {
                            (*w.dev.mr).lkey
                        } else {
                            input.u32()
                        };
                    }
                    let mut wr: sys::ibv_recv_wr = std::mem::zeroed();
                    wr.wr_id = input.u64();
                    wr.sg_list = sges.as_mut_ptr();
                    wr.num_sge = n as c_int;
                    let mut bad = null_mut();
                    let r = post_recv(victim, &mut wr, &mut bad);
                    assert!(r >= 0, "post_recv returned {r}");
                    assert!(r == 0 || std::ptr::eq(bad, &wr), "bad_wr not set");
                }
                // An attribute struct and mask, every byte the fuzzer's.
                2 => {
                    let mut a: sys::ibv_qp_attr = std::mem::zeroed();
                    let raw: [u8; 160] = input.bytes();
                    let n = raw.len().min(std::mem::size_of::<sys::ibv_qp_attr>());
                    std::ptr::copy_nonoverlapping(
                        raw.as_ptr(),
                        (&mut a as *mut sys::ibv_qp_attr).cast::<u8>(),
                        n,
                    );
                    let mask = input.u32() as c_int;
                    let r = ibv_modify_qp(victim, &mut a, mask);
                    assert!(r >= 0, "modify_qp returned {r}");
                    let mut q: sys::ibv_qp_attr = std::mem::zeroed();
                    let mut qi: sys::ibv_qp_init_attr = std::mem::zeroed();
                    assert!(ibv_query_qp(victim, &mut q, input.u32() as c_int, &mut qi) >= 0);
                }
                _ => drain(w),
            }
        }
        drain(w);
        assert_eq!(ibv_destroy_qp(victim), 0);
        assert_eq!(ibv_destroy_qp(peer), 0);
        drain(w);
        static ROUND: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        still_works(
            &w.good,
            ROUND.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        );
    }
});
