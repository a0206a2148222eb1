//! The responder's protection checks over the wire, each with the case that
//! a loosened check would let through: an R_Key of another protection
//! domain, and accesses that end exactly at a region's or a window's end
//! (allowed) or one byte past it, or start one byte before it (NAK remote
//! access error, 0x62, nothing written or returned).

mod common;

use common::*;
use rnic_core::mem::{Access, MrKeys, PdHandle};
use rnic_core::wr::{SendOp, WcStatus};

/// A second protection domain on B, with a region B's QP is not in.
fn region_of_another_pd(p: &mut Pair) -> (PdHandle, MrKeys) {
    let nic = &mut p.c.nics[1];
    let pd = nic.alloc_pd();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let keys = nic
        .reg_mr(pd, OTHER_IOVA, Box::new(vec![0x11u8; 4096]), access)
        .unwrap();
    (pd, keys)
}

const OTHER_IOVA: u64 = 0x7_0000_0000;

fn write(p: &mut Pair, remote_addr: u64, rkey: u32, len: u32) -> WcStatus {
    p.post(1, SendOp::write(remote_addr, rkey), p.sge_a(0, len));
    p.run();
    p.completions(0)[0].status
}

fn read(p: &mut Pair, remote_addr: u64, rkey: u32, len: u32) -> WcStatus {
    p.post(1, SendOp::read(remote_addr, rkey), p.sge_a(8192, len));
    p.run();
    p.completions(0)[0].status
}

/// The NAK codes B sent.
fn naks(p: &Pair) -> Vec<u8> {
    let b = p.c.nics[1].addr();
    wire(p)
        .into_iter()
        .filter(|s| s.src == b)
        .filter_map(|s| s.syndrome)
        .filter(|&x| x & 0xE0 == 0x60)
        .collect()
}

const PATTERN: [u8; 64] = [0xC3; 64];

/// A pair with A's first 64 bytes set to PATTERN; B's region allows
/// windows to be bound over it.
fn setup(seed: u64) -> Pair {
    let d = Params::default();
    let params = Params {
        b_access: d.b_access | Access::MW_BIND,
        ..d
    };
    let (mut p, _, _) = pair(seed, &params);
    p.write_a(0, &PATTERN);
    p
}

#[test]
fn an_rkey_of_another_protection_domain_is_refused() {
    for op in ["write", "read"] {
        let mut p = setup(60);
        let (pd, other) = region_of_another_pd(&mut p);
        let status = if op == "write" {
            write(&mut p, OTHER_IOVA, other.rkey, 64)
        } else {
            read(&mut p, OTHER_IOVA, other.rkey, 64)
        };
        assert_eq!(status, WcStatus::RemAccessErr, "{op}");
        assert_eq!(naks(&p), [0x62], "{op}");
        // Nothing written there, nothing read from there.
        let mut theirs = [0u8; 64];
        p.c.nics[1]
            .read_mr(pd, other.lkey, OTHER_IOVA, &mut theirs)
            .unwrap();
        assert_eq!(theirs, [0x11; 64], "{op}");
        assert_eq!(p.read(0, 8192, 64), [0u8; 64], "{op}");
        assert!(p.c.nics[1].executions().is_empty(), "{op}");
    }
}

/// `len` bytes at `offset` into B's range starting at `base`, written then
/// read back through `rkey`: the statuses, and whether B's bytes changed.
fn write_and_read_at(
    seed: u64,
    rkey_of: impl Fn(&mut Pair) -> (u64, u32),
    offset: i64,
    len: u32,
) -> (WcStatus, WcStatus, bool) {
    let mut p = setup(seed);
    let (base, rkey) = rkey_of(&mut p);
    let va = base.wrapping_add_signed(offset);
    let before = p.read(1, 0, REGION);
    let w = write(&mut p, va, rkey, len);
    let changed = p.read(1, 0, REGION) != before;
    // A fresh pair for the READ: the failed WRITE left B's QP in error.
    let mut q = setup(seed);
    let (_, rkey) = rkey_of(&mut q);
    let r = read(&mut q, va, rkey, len);
    if r == WcStatus::Success {
        assert_eq!(
            q.read(0, 8192, len as usize),
            q.read(1, (va - B_IOVA) as usize as u64, len as usize)
        );
    }
    (w, r, changed)
}

#[test]
fn region_bounds_to_the_byte() {
    let region = |p: &mut Pair| (B_IOVA, p.b.mr.rkey);
    let end = REGION as i64;
    // Ending exactly at the region's end: allowed.
    assert_eq!(
        write_and_read_at(61, region, end - 64, 64),
        (WcStatus::Success, WcStatus::Success, true)
    );
    // One byte past its end, or one byte before its start: refused, nothing written.
    for offset in [end - 63, -1] {
        assert_eq!(
            write_and_read_at(61, region, offset, 64),
            (WcStatus::RemAccessErr, WcStatus::RemAccessErr, false),
            "offset {offset}"
        );
    }
}

#[test]
fn window_bounds_to_the_byte() {
    // The window opens 256 bytes at B_IOVA + 4096 of B's region.
    let window = |p: &mut Pair| {
        let rkey = bound_window(p, Access::REMOTE_WRITE | Access::REMOTE_READ);
        (B_IOVA + 4096, rkey)
    };
    assert_eq!(
        write_and_read_at(62, window, 256 - 64, 64),
        (WcStatus::Success, WcStatus::Success, true)
    );
    assert_eq!(
        write_and_read_at(62, window, 0, 256),
        (WcStatus::Success, WcStatus::Success, true)
    );
    for offset in [256 - 63, -1] {
        assert_eq!(
            write_and_read_at(62, window, offset, 64),
            (WcStatus::RemAccessErr, WcStatus::RemAccessErr, false),
            "offset {offset}"
        );
    }
}
