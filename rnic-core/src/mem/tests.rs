//! The memory tables' tests: keys, bounds, rights, windows, and their
//! properties under random sequences of verbs.

use super::*;
use proptest::prelude::*;

fn setup() -> (Memory, PdHandle, MrKeys) {
    let mut m = Memory::new(1);
    let pd = m.alloc_pd();
    let keys = m
        .register(
            pd,
            0x1000,
            Box::new(vec![0u8; 256]),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    (m, pd, keys)
}

#[test]
fn read_write_in_bounds() {
    let (mut m, pd, k) = setup();
    let s = m
        .check(k.rkey, pd, 0x1010, 4, Access::REMOTE_WRITE)
        .unwrap();
    m.write(s, &[1, 2, 3, 4]);
    let mut out = [0u8; 6];
    let s = m.check(k.lkey, pd, 0x100f, 6, Access::NONE).unwrap();
    m.read(s, &mut out);
    assert_eq!(out, [0, 1, 2, 3, 4, 0]);
    // The last byte, and an empty range at the end, are in bounds.
    assert!(m.check(k.rkey, pd, 0x10ff, 1, Access::REMOTE_READ).is_ok());
    assert!(m.check(k.rkey, pd, 0x1100, 0, Access::REMOTE_READ).is_ok());
}

#[test]
fn refusals() {
    let (mut m, pd, k) = setup();
    let other_pd = m.alloc_pd();
    assert_eq!(
        m.check(k.rkey, pd, 0x1100, 1, Access::REMOTE_READ),
        Err(MemError::OutOfBounds {
            key: k.rkey,
            va: 0x1100,
            len: 1
        })
    );
    assert!(matches!(
        m.check(k.rkey, pd, 0xfff, 1, Access::NONE),
        Err(MemError::OutOfBounds { .. })
    ));
    assert!(matches!(
        m.check(k.rkey, pd, 0x1000, u64::MAX, Access::NONE),
        Err(MemError::OutOfBounds { .. })
    ));
    assert!(matches!(
        m.check(k.rkey, pd, u64::MAX, 2, Access::NONE),
        Err(MemError::OutOfBounds { .. })
    ));
    assert_eq!(
        m.check(k.rkey, other_pd, 0x1000, 1, Access::NONE),
        Err(MemError::WrongPd { key: k.rkey })
    );
    assert!(matches!(
        m.check(k.rkey, pd, 0x1000, 8, Access::REMOTE_ATOMIC),
        Err(MemError::NoPermission { .. })
    ));
    assert_eq!(
        m.check(k.rkey ^ 1, pd, 0x1000, 1, Access::NONE),
        Err(MemError::InvalidKey(k.rkey ^ 1))
    );
    assert_eq!(
        m.check(0xFFFF_FF00, pd, 0x1000, 1, Access::NONE),
        Err(MemError::InvalidKey(0xFFFF_FF00))
    );
    assert_eq!(
        m.register(pd, 0, Box::new(vec![0u8; 8]), Access::REMOTE_WRITE)
            .unwrap_err(),
        MemError::RemoteWriteNeedsLocalWrite
    );
    assert_eq!(
        m.register(pd, u64::MAX - 3, Box::new(vec![0u8; 8]), Access::NONE)
            .unwrap_err(),
        MemError::AddressOverflow {
            iova: u64::MAX - 3,
            len: 8
        }
    );
    assert_eq!(m.dealloc_pd(pd), Err(MemError::PdBusy(pd)));
}

#[test]
fn atomics_need_alignment_and_right() {
    let mut m = Memory::new(2);
    let pd = m.alloc_pd();
    let k = m
        .register(
            pd,
            0x2000,
            Box::new(vec![0u8; 64]),
            Access::LOCAL_WRITE | Access::REMOTE_ATOMIC,
        )
        .unwrap();
    let s = m
        .check_atomic(k.rkey, pd, 0, 0x2008, Access::REMOTE_ATOMIC)
        .unwrap();
    m.write_u64(s, 0x1122_3344_5566_7788);
    assert_eq!(m.read_u64(s), 0x1122_3344_5566_7788);
    assert_eq!(
        m.check_atomic(k.rkey, pd, 0, 0x2004, Access::REMOTE_ATOMIC),
        Err(MemError::Misaligned { va: 0x2004 })
    );
    assert!(matches!(
        m.check_atomic(k.rkey, pd, 0, 0x2040, Access::REMOTE_ATOMIC),
        Err(MemError::OutOfBounds { .. })
    ));
}

#[test]
fn stale_keys_fail_after_reregistration() {
    let (mut m, pd, k) = setup();
    let region = m.deregister(k.lkey).unwrap();
    assert_eq!(region.len(), 256);
    assert_eq!(
        m.check(k.rkey, pd, 0x1000, 1, Access::NONE),
        Err(MemError::InvalidKey(k.rkey))
    );
    assert!(m.deregister(k.lkey).is_err());
    let k2 = m.register(pd, 0x1000, region, Access::LOCAL_WRITE).unwrap();
    assert_ne!(k2.lkey >> 8, k.lkey >> 8, "a freed index rests");
    assert!(m.check(k.rkey, pd, 0x1000, 1, Access::NONE).is_err());
    m.deregister(k2.lkey).unwrap();
    assert_eq!(m.dealloc_pd(pd), Ok(()));
    assert_eq!(m.dealloc_pd(pd), Err(MemError::NoSuchPd(pd)));
}

#[test]
fn key_indices_are_random_and_a_freed_one_finds_nothing() {
    let mut m = Memory::new(12);
    let pd = m.alloc_pd();
    let keys: Vec<u32> = (0..200)
        .map(|_| {
            m.register(pd, 0, Box::new(vec![0u8; 8]), Access::NONE)
                .unwrap()
                .rkey
        })
        .collect();
    let index = |k: u32| k >> 8;
    // Not in order (rdma_rxe's are, stepping by one), and over the
    // whole 23-bit range of region indices.
    assert_eq!(
        keys.windows(2)
            .filter(|w| index(w[1]) == index(w[0]) + 1)
            .count(),
        0
    );
    assert!(keys.iter().any(|&k| index(k) < 0x20_0000));
    assert!(keys.iter().any(|&k| index(k) > 0x60_0000));
    assert!(keys.iter().all(|&k| index(k) & MW_INDEX as u32 == 0));
    let w = m.alloc_mw(pd).unwrap();
    assert_ne!(
        index(w) & MW_INDEX as u32,
        0,
        "a window's index has the top bit"
    );
    // A deregistered key finds nothing, the others still work. (That its
    // index rests before reuse is Ids' rule: rng::tests.)
    let stale = keys[7];
    m.deregister(stale).unwrap();
    assert_eq!(
        m.check(stale, pd, 0, 1, Access::NONE),
        Err(MemError::InvalidKey(stale))
    );
    assert!(m.check(keys[8], pd, 0, 8, Access::NONE).is_ok());
}

#[test]
fn keys_differ_between_nics_and_registrations() {
    let keys = |seed| {
        let mut m = Memory::new(seed);
        let pd = m.alloc_pd();
        (0..4)
            .map(|_| {
                m.register(pd, 0, Box::new(vec![0u8; 1]), Access::NONE)
                    .unwrap()
                    .rkey
            })
            .collect::<Vec<_>>()
    };
    assert_ne!(keys(1), keys(2));
    assert_eq!(keys(3), keys(3));
}

#[test]
fn rereg_changes_rights_domain_and_memory_keeping_the_keys() {
    let (mut m, pd, k) = setup();
    let w = Access::REMOTE_WRITE;
    // Access: remote writes are refused after, local use still works.
    assert!(m
        .reregister(k.lkey, None, Some(Access::LOCAL_WRITE), None)
        .unwrap()
        .is_none());
    assert!(matches!(
        m.check(k.rkey, pd, 0x1000, 1, w),
        Err(MemError::NoPermission { .. })
    ));
    assert!(m.check(k.lkey, pd, 0x1000, 1, Access::LOCAL_WRITE).is_ok());
    m.reregister(k.lkey, None, Some(Access::LOCAL_WRITE | w), None)
        .unwrap();
    assert!(m.check(k.rkey, pd, 0x1000, 1, w).is_ok());
    // Domain: the old one is free to go, the new one is in use.
    let pd2 = m.alloc_pd();
    m.reregister(k.lkey, Some(pd2), None, None).unwrap();
    assert_eq!(
        m.check(k.rkey, pd, 0x1000, 1, w),
        Err(MemError::WrongPd { key: k.rkey })
    );
    assert!(m.check(k.rkey, pd2, 0x1000, 1, w).is_ok());
    assert_eq!(m.dealloc_pd(pd2), Err(MemError::PdBusy(pd2)));
    assert_eq!(m.dealloc_pd(pd), Ok(()));
    // Memory: the old range is gone, the new one reached; the old memory
    // comes back as it was.
    let s = m.check(k.rkey, pd2, 0x1000, 1, w).unwrap();
    m.write(s, &[7]);
    let old = m
        .reregister(k.lkey, None, None, Some((0x9000, Box::new(vec![0u8; 16]))))
        .unwrap()
        .expect("the old memory");
    let mut b = [0u8];
    old.read(0, &mut b);
    assert_eq!((old.len(), b[0]), (256, 7));
    assert!(matches!(
        m.check(k.rkey, pd2, 0x1000, 1, w),
        Err(MemError::OutOfBounds { .. })
    ));
    assert!(matches!(
        m.check(k.rkey, pd2, 0x9000, 17, w),
        Err(MemError::OutOfBounds { .. })
    ));
    let s = m.check(k.rkey, pd2, 0x900F, 1, w).unwrap();
    m.write(s, &[9]);
}

#[test]
fn a_refused_rereg_changes_nothing() {
    let (mut m, pd, k) = setup();
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let pd2 = m.alloc_pd();
    let gone = m.alloc_pd();
    m.dealloc_pd(gone).unwrap();
    assert_eq!(
        m.reregister(k.lkey, Some(gone), Some(Access::NONE), None)
            .map(drop)
            .unwrap_err(),
        MemError::NoSuchPd(gone)
    );
    // A bad access with a good domain: the domain stays too.
    assert_eq!(
        m.reregister(k.lkey, Some(pd2), Some(Access::REMOTE_WRITE), None)
            .map(drop)
            .unwrap_err(),
        MemError::RemoteWriteNeedsLocalWrite
    );
    assert!(m.check(k.rkey, pd, 0x1000, 1, rw).is_ok());
    assert!(matches!(
        m.reregister(
            k.lkey,
            None,
            None,
            Some((u64::MAX - 3, Box::new(vec![0u8; 8])))
        ),
        Err(MemError::AddressOverflow { .. })
    ));
    assert_eq!(
        m.reregister(k.lkey, None, Some(Access::FLUSH_PERSISTENT), None)
            .map(drop)
            .unwrap_err(),
        MemError::CannotPersist
    );
    assert_eq!(
        m.reregister(k.lkey ^ 1, None, Some(Access::NONE), None)
            .map(drop)
            .unwrap_err(),
        MemError::InvalidKey(k.lkey ^ 1)
    );
    // The same rights, domain and memory; pd2 never gained a user.
    assert!(m.check(k.rkey, pd, 0x10FF, 1, rw).is_ok());
    assert_eq!(m.dealloc_pd(pd2), Ok(()));
}

#[test]
fn rereg_is_refused_while_windows_are_bound() {
    let mut m = Memory::new(4);
    let pd = m.alloc_pd();
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::MW_BIND;
    let k = m.register(pd, 0x4000, Box::new(vec![0u8; 64]), rw).unwrap();
    let mw = m.alloc_mw(pd).unwrap();
    let b = MwBind {
        mw_rkey: mw,
        new_rkey: (mw & !0xFF) | ((mw + 1) & 0xFF),
        mr_lkey: k.lkey,
        addr: 0x4000,
        length: 64,
        access: Access::REMOTE_WRITE,
    };
    m.bind_mw(pd, 7, &b).unwrap();
    assert_eq!(
        m.reregister(k.lkey, None, None, Some((0, Box::new(vec![0u8; 8]))))
            .map(drop)
            .unwrap_err(),
        MemError::WindowsBound(k.lkey)
    );
}

#[test]
fn a_type_1_window_opens_to_every_qp_of_its_domain_and_rebinds() {
    let mut m = Memory::new(5);
    let pd = m.alloc_pd();
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::MW_BIND;
    let k = m.register(pd, 0x4000, Box::new(vec![0u8; 64]), rw).unwrap();
    let mw = m.alloc_mw_of(pd, MwType::One).unwrap();
    let w = Access::REMOTE_WRITE;
    assert!(m.check_remote(mw, pd, 7, 0x4000, 1, w).is_err(), "unbound");
    let bind = |old: u32, addr, length| MwBind {
        mw_rkey: old,
        new_rkey: (old & !0xFF) | (old.wrapping_add(1) & 0xFF),
        mr_lkey: k.lkey,
        addr,
        length,
        access: w,
    };
    let k1 = m.bind_mw(pd, 7, &bind(mw, 0x4000, 16)).unwrap();
    // Any QP of the domain, not only the one that bound it.
    assert!(m.check_remote(k1, pd, 9, 0x400F, 1, w).is_ok());
    assert!(matches!(
        m.check_remote(k1, pd, 9, 0x4010, 1, w),
        Err(MemError::OutOfBounds { .. })
    ));
    let other = m.alloc_pd();
    assert_eq!(
        m.check_remote(k1, other, 9, 0x4000, 1, w),
        Err(MemError::WrongPd { key: k1 })
    );
    // Never invalidated by LOCAL_INV or SEND_WITH_INV.
    assert!(matches!(
        m.invalidate(k1, pd, None),
        Err(MemError::BadWindow { .. })
    ));
    assert!(matches!(
        m.invalidate(k1, pd, Some(9)),
        Err(MemError::BadWindow { .. })
    ));
    // Bound again while bound: the new range replaces the old, under a
    // new key; the old key opens nothing.
    let k2 = m.bind_mw(pd, 9, &bind(k1, 0x4020, 32)).unwrap();
    assert_eq!(
        m.check_remote(k1, pd, 7, 0x4020, 1, w),
        Err(MemError::InvalidKey(k1))
    );
    assert!(m.check_remote(k2, pd, 7, 0x403F, 1, w).is_ok());
    assert!(m.check_remote(k2, pd, 7, 0x4000, 1, w).is_err());
    assert_eq!(
        m.deregister(k.lkey).map(drop),
        Err(MemError::WindowsBound(k.lkey))
    );
    // Length 0 closes it; the region is free to go.
    let b0 = MwBind {
        mr_lkey: 0,
        addr: 0,
        ..bind(k2, 0, 0)
    };
    let k3 = m.bind_mw(pd, 7, &b0).unwrap();
    assert_ne!(k3, k2);
    assert!(m.check_remote(k3, pd, 7, 0x4020, 1, w).is_err());
    assert!(m.check_remote(k2, pd, 7, 0x4020, 1, w).is_err());
    assert!(m.deregister(k.lkey).is_ok());
}

#[test]
fn a_refused_type_1_bind_leaves_the_old_binding() {
    let mut m = Memory::new(6);
    let pd = m.alloc_pd();
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::MW_BIND;
    let k = m.register(pd, 0x4000, Box::new(vec![0u8; 64]), rw).unwrap();
    let mw = m.alloc_mw_of(pd, MwType::One).unwrap();
    let b = MwBind {
        mw_rkey: mw,
        new_rkey: (mw & !0xFF) | (mw.wrapping_add(1) & 0xFF),
        mr_lkey: k.lkey,
        addr: 0x4000,
        length: 64,
        access: Access::REMOTE_READ,
    };
    let k1 = m.bind_mw(pd, 7, &b).unwrap();
    let past = MwBind {
        mw_rkey: k1,
        new_rkey: (k1 & !0xFF) | (k1.wrapping_add(1) & 0xFF),
        length: 65,
        ..b
    };
    assert!(matches!(
        m.bind_mw(pd, 7, &past),
        Err(MemError::OutOfBounds { .. })
    ));
    assert!(m
        .check_remote(k1, pd, 3, 0x403F, 1, Access::REMOTE_READ)
        .is_ok());
}

#[test]
fn a_window_grants_only_remote_rights() {
    let mut m = Memory::new(4);
    let pd = m.alloc_pd();
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::MW_BIND;
    let k = m.register(pd, 0x4000, Box::new(vec![0u8; 64]), rw).unwrap();
    let mw = m.alloc_mw(pd).unwrap();
    let bind = |access| MwBind {
        mw_rkey: mw,
        new_rkey: (mw & !0xFF) | ((mw + 1) & 0xFF),
        mr_lkey: k.lkey,
        addr: 0x4000,
        length: 64,
        access,
    };
    // MW_BIND is no right a window can pass on.
    assert_eq!(
        m.bind_mw(pd, 7, &bind(Access::REMOTE_READ | Access::MW_BIND)),
        Err(MemError::UnsupportedAccess(0x14))
    );
    // LOCAL_WRITE is accepted, as rdma_rxe accepts it, and grants nothing.
    let rkey = m
        .bind_mw(pd, 7, &bind(Access::LOCAL_WRITE | Access::REMOTE_READ))
        .unwrap();
    assert!(m
        .check_remote(rkey, pd, 7, 0x4000, 8, Access::REMOTE_READ)
        .is_ok());
    assert!(matches!(
        m.check_remote(rkey, pd, 7, 0x4000, 8, Access::REMOTE_WRITE),
        Err(MemError::NoPermission { .. })
    ));
    assert!(matches!(
        m.check_remote(rkey, pd, 7, 0x4000, 8, Access::LOCAL_WRITE),
        Err(MemError::NoPermission { .. })
    ));
}

#[test]
fn memory_windows() {
    let mut m = Memory::new(4);
    let pd = m.alloc_pd();
    let other = m.alloc_pd();
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let no_bind = m.register(pd, 0x1000, Box::new(vec![0u8; 64]), rw).unwrap();
    let k = m
        .register(pd, 0x4000, Box::new(vec![0u8; 256]), rw | Access::MW_BIND)
        .unwrap();
    let mw = m.alloc_mw(pd).unwrap();
    // Unbound, the key opens nothing.
    assert_eq!(
        m.check_remote(mw, pd, 7, 0x4000, 1, Access::REMOTE_READ),
        Err(MemError::InvalidKey(mw))
    );
    let bind = |mr_lkey, addr, length, access| MwBind {
        mw_rkey: mw,
        new_rkey: (mw & !0xFF) | ((mw + 1) & 0xFF),
        mr_lkey,
        addr,
        length,
        access,
    };
    let wr = Access::REMOTE_WRITE;
    assert!(matches!(
        m.bind_mw(pd, 7, &bind(no_bind.lkey, 0x1000, 8, wr)),
        Err(MemError::NoPermission { .. })
    ));
    assert!(matches!(
        m.bind_mw(pd, 7, &bind(k.lkey, 0x40F8, 16, wr)),
        Err(MemError::OutOfBounds { .. })
    ));
    assert!(matches!(
        m.bind_mw(pd, 7, &bind(k.lkey, 0x4000, 0, wr)),
        Err(MemError::BadWindow { .. })
    ));
    assert_eq!(
        m.bind_mw(other, 7, &bind(k.lkey, 0x4000, 8, wr)),
        Err(MemError::WrongPd { key: mw })
    );
    let rkey = m.bind_mw(pd, 7, &bind(k.lkey, 0x4010, 32, wr)).unwrap();
    assert_ne!(rkey, mw);
    // The old key is dead; the new one opens exactly the window, for QP 7,
    // with exactly the rights bound.
    assert!(m
        .check_remote(mw, pd, 7, 0x4010, 1, Access::REMOTE_WRITE)
        .is_err());
    let s = m
        .check_remote(rkey, pd, 7, 0x4010, 32, Access::REMOTE_WRITE)
        .unwrap();
    m.write(s, &[9; 32]);
    let mut out = [0u8; 2];
    let s = m.check(k.lkey, pd, 0x400F, 2, Access::NONE).unwrap();
    m.read(s, &mut out);
    assert_eq!(
        out,
        [0, 9],
        "the window starts at its address in the region"
    );
    assert!(matches!(
        m.check_remote(rkey, pd, 7, 0x4010, 33, Access::REMOTE_WRITE),
        Err(MemError::OutOfBounds { .. })
    ));
    assert!(matches!(
        m.check_remote(rkey, pd, 7, 0x4010, 1, Access::REMOTE_READ),
        Err(MemError::NoPermission { .. })
    ));
    assert_eq!(
        m.check_remote(rkey, pd, 8, 0x4010, 1, Access::REMOTE_WRITE),
        Err(MemError::WrongQp { key: rkey })
    );
    assert_eq!(m.extent(rkey, pd, 7), Ok((0x4010, 32)));
    // Bound again before invalidation: refused. The region cannot go while
    // the window is bound.
    assert!(m.bind_mw(pd, 7, &bind(k.lkey, 0x4000, 8, wr)).is_err());
    assert_eq!(
        m.deregister(k.lkey).err(),
        Some(MemError::WindowsBound(k.lkey))
    );
    // Remote invalidation only from the QP it is bound to.
    assert_eq!(
        m.invalidate(rkey, pd, Some(8)),
        Err(MemError::WrongQp { key: rkey })
    );
    assert!(matches!(
        m.invalidate(k.rkey, pd, None),
        Err(MemError::BadWindow { .. })
    ));
    m.invalidate(rkey, pd, Some(7)).unwrap();
    assert_eq!(
        m.check_remote(rkey, pd, 7, 0x4010, 1, Access::REMOTE_WRITE),
        Err(MemError::InvalidKey(rkey))
    );
    assert!(matches!(
        m.invalidate(rkey, pd, None),
        Err(MemError::BadWindow { .. })
    ));
    m.deregister(k.lkey).unwrap();
    assert_eq!(m.dealloc_pd(pd), Err(MemError::PdBusy(pd)));
    m.dealloc_mw(rkey).unwrap();
    assert!(m.dealloc_mw(rkey).is_err());
    m.deregister(no_bind.lkey).unwrap();
    assert_eq!(m.dealloc_pd(pd), Ok(()));
}

#[test]
fn persistence_needs_memory_that_persists() {
    let mut m = Memory::new(5);
    let pd = m.alloc_pd();
    assert_eq!(
        m.register(pd, 0, Box::new(vec![0u8; 8]), Access::FLUSH_PERSISTENT)
            .unwrap_err(),
        MemError::CannotPersist
    );
    assert!(m
        .register(pd, 0, Box::new(vec![0u8; 8]), Access::FLUSH_GLOBAL)
        .is_ok());
}

proptest! {
    /// check() accepts exactly the ranges inside the region, for any inputs.
    #[test]
    fn bounds_are_exact(iova in any::<u64>(), size in 0usize..4096, va in any::<u64>(), len in any::<u64>()) {
        let mut m = Memory::new(9);
        let pd = m.alloc_pd();
        let Ok(k) = m.register(pd, iova, Box::new(vec![0u8; size]), Access::NONE) else {
            prop_assert!(iova.checked_add(size as u64).is_none());
            return Ok(());
        };
        let inside = va >= iova
            && (va as u128) + (len as u128) <= (iova as u128) + (size as u128);
        prop_assert_eq!(m.check(k.lkey, pd, va, len, Access::NONE).is_ok(), inside);
    }
}
