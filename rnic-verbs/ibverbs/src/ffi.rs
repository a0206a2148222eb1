//! Where C meets Rust: raw pointers become checked references, Rust errors
//! become errno values, and a panic becomes an error return instead of
//! unwinding into C.
//!
//! Every object rnic hands to a program is a `#[repr(C)]` struct whose first
//! field is the C struct the program sees (at `OFFSET` bytes in, for the
//! context, which verbs.h places after `struct verbs_context`'s own fields),
//! followed by a magic number. A pointer from the program is accepted only
//! if it is non-null, aligned, and carries the right magic; the object is
//! then used through a shared reference, its mutable parts behind locks.
//!
//! Fork: a forked child has the parent's objects in its memory but none of
//! the engine threads behind them. Each object's magic carries the fork
//! generation it was made in, so a child's use of an inherited object is
//! refused (EINVAL) instead of waiting forever on a lock or a thread that
//! does not exist in the child; the child can open the devices afresh
//! (see `device::devices`), and the parent goes on untouched.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

/// How many forks lie between the process that first used rnic and this
/// one: 0 there, and one more in each forked child.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The current fork generation.
pub(crate) fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

extern "C" fn forked_child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Count forks from now on (idempotent; called before any object exists).
pub(crate) fn watch_forks() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a handler that only bumps an atomic, which is
        // async-signal-safe as a fork child handler must be.
        unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
    });
}

/// An object handed to C as a pointer to its first field (or the field at
/// `OFFSET`).
///
/// # Safety
/// The implementing type must be `#[repr(C)]` with `C` at byte `OFFSET` and a
/// `magic: u64` field that holds `MAGIC` while the object is alive.
pub(crate) unsafe trait Object: Sized {
    /// The C struct the program sees.
    type C;
    /// Where it sits inside `Self`.
    const OFFSET: usize = 0;
    /// Eight bytes that say "this is one of ours, of this type".
    const MAGIC: u64;
    /// The magic field.
    fn magic(&self) -> u64;
    /// Set the magic.
    fn set_magic(&mut self, magic: u64);
    /// Clear the magic, so a later use of a freed object's pointer is caught
    /// as long as the memory is not reused.
    fn kill(&mut self) {
        self.set_magic(0);
    }

    /// The object behind the program's pointer `p`, or EINVAL if `p` is
    /// not one of ours of this type (see [`obj`]).
    ///
    /// # Safety
    /// As for [`obj`].
    unsafe fn from_c<'a>(p: *mut Self::C) -> Result<&'a Self, i32> {
        // SAFETY: the caller's promise.
        unsafe { obj::<Self>(p) }.ok_or(libc::EINVAL)
    }

    /// Box the object and hand out the C pointer, its magic stamped with
    /// the fork generation.
    fn into_c(mut self) -> *mut Self::C {
        self.set_magic(Self::MAGIC ^ generation());
        let p = Box::into_raw(Box::new(self));
        // SAFETY: OFFSET is within Self (the trait's contract).
        unsafe { p.cast::<u8>().add(Self::OFFSET).cast() }
    }
}

/// The object behind `p`, if `p` is one of ours of type `T`.
///
/// # Safety
/// `p` must be null or point to memory that is readable for
/// `size_of::<T>()` bytes from `p - OFFSET` (any pointer rnic handed out and
/// has not freed is).
pub(crate) unsafe fn obj<'a, T: Object>(p: *mut T::C) -> Option<&'a T> {
    // SAFETY: the caller's promise.
    unsafe { born_in::<T>(p) }
        .filter(|&(_, g)| g == generation())
        .map(|(t, _)| t)
}

/// The object behind `p` and the fork generation it was made in, if `p` is
/// one of ours of type `T` (of any generation up to this one).
///
/// # Safety
/// As for `obj`.
unsafe fn born_in<'a, T: Object>(p: *mut T::C) -> Option<(&'a T, u64)> {
    if p.is_null() {
        return None;
    }
    let base = p.cast::<u8>().wrapping_sub(T::OFFSET).cast::<T>();
    if !base.is_aligned() {
        return None;
    }
    // SAFETY: the caller's promise; `T` is valid whenever its magic is set,
    // which it is from `into_c` until `free`.
    let t = unsafe { &*base };
    let born = t.magic() ^ T::MAGIC;
    (born <= generation()).then_some((t, born))
}

/// The object behind `p` as [`obj`] finds it, also if it was made before a
/// fork (in this process's parent): only for uses that need nothing of the
/// parent's engine threads and take no lock a parent's thread could hold.
///
/// # Safety
/// As for `obj`.
pub(crate) unsafe fn obj_inherited<'a, T: Object>(p: *mut T::C) -> Option<&'a T> {
    // SAFETY: the caller's promise.
    unsafe { born_in::<T>(p) }.map(|(t, _)| t)
}

/// Free an object handed out by `into_c`.
///
/// # Safety
/// As for `obj`, and nothing may use the object afterwards.
pub(crate) unsafe fn free<T: Object>(p: *mut T::C) -> Option<T> {
    // SAFETY: the caller's promise.
    unsafe { obj::<T>(p)? };
    let base = p.cast::<u8>().wrapping_sub(T::OFFSET).cast::<T>();
    // SAFETY: it came from Box::into_raw in into_c and its magic is intact.
    let mut b = unsafe { Box::from_raw(base) };
    b.kill();
    Some(*b)
}

/// Implement `Object` for a struct with fields `c` (or `v` for the context)
/// and `magic`.
macro_rules! object {
    ($t:ty, $c:ty, $magic:literal) => {
        object!($t, $c, $magic, 0, c);
    };
    ($t:ty, $c:ty, $magic:literal, $offset:expr, $field:ident) => {
        // SAFETY: `$t` is #[repr(C)] with the C struct first (or at $offset)
        // and a magic field.
        unsafe impl $crate::ffi::Object for $t {
            type C = $c;
            const OFFSET: usize = $offset;
            const MAGIC: u64 = u64::from_le_bytes(*$magic);
            fn magic(&self) -> u64 {
                self.magic
            }
            fn set_magic(&mut self, magic: u64) {
                self.magic = magic;
            }
        }
    };
}
pub(crate) use object;

/// Set the calling thread's errno.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: errno is thread-local; the pointer is valid for this thread.
    unsafe { *libc::__errno_location() = e };
}

/// The calling thread's errno.
pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// The errno rdma-core would give for `e`.
pub(crate) fn errno_of(e: &rnic_verbs::Error) -> i32 {
    use rnic_core::mem::MemError;
    use rnic_verbs::{Error, VerbError};
    match e {
        Error::Io(io) => io.raw_os_error().unwrap_or(match io.kind() {
            // rnic's own errors (a claim refused, a CM call in the wrong
            // state) carry a kind, not a number.
            std::io::ErrorKind::AddrInUse => libc::EADDRINUSE,
            std::io::ErrorKind::AddrNotAvailable => libc::EADDRNOTAVAIL,
            std::io::ErrorKind::ConnectionRefused => libc::ECONNREFUSED,
            std::io::ErrorKind::InvalidInput => libc::EINVAL,
            std::io::ErrorKind::OutOfMemory => libc::ENOMEM,
            std::io::ErrorKind::TimedOut => libc::ETIMEDOUT,
            _ => libc::EIO,
        }),
        Error::Verb(v) => match v {
            VerbError::QueueFull => libc::ENOMEM,
            VerbError::Unsupported(_) => libc::EOPNOTSUPP,
            VerbError::Mem(MemError::PdBusy(_) | MemError::WindowsBound(_)) => libc::EBUSY,
            VerbError::SrqBusy(_) | VerbError::CqBusy(_) => libc::EBUSY,
            VerbError::Mem(MemError::UnsupportedAccess(_)) => libc::EOPNOTSUPP,
            _ => libc::EINVAL,
        },
        Error::NoFreeAddress => libc::EADDRINUSE,
        Error::Timeout => libc::EAGAIN,
        _ => libc::EINVAL,
    }
}

/// Run `f`, catching a panic: a verb that returns an errno (0 on success).
pub(crate) fn errno_call(f: impl FnOnce() -> Result<(), i32>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => e,
        Err(_) => {
            eprintln!("rnic: internal error (a panic was caught at the C boundary)");
            libc::EIO
        }
    }
}

/// Run `f`, catching a panic: a verb that returns a pointer, or NULL with
/// errno set.
pub(crate) fn ptr_call<T>(f: impl FnOnce() -> Result<*mut T, i32>) -> *mut T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            set_errno(e);
            std::ptr::null_mut()
        }
        Err(_) => {
            eprintln!("rnic: internal error (a panic was caught at the C boundary)");
            set_errno(libc::EIO);
            std::ptr::null_mut()
        }
    }
}

/// Run `f`, catching a panic: a verb that returns -1 with errno set on
/// failure (the `ibv_get_cq_event` convention).
pub(crate) fn minus_one_call(f: impl FnOnce() -> Result<i32, i32>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => {
            set_errno(e);
            -1
        }
        Err(_) => {
            set_errno(libc::EIO);
            -1
        }
    }
}

/// A work-request list from C (`ibv_send_wr`, `ibv_recv_wr`).
pub(crate) trait WrList {
    /// The request after this one (null at the end).
    fn next(&self) -> *mut Self;
}

impl WrList for crate::sys::ibv_send_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
}

impl WrList for crate::sys::ibv_recv_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
}

/// Post the program's list `wr` on `obj` with `post`, one request at a time,
/// stopping at the first that fails: its errno comes back and `*bad_wr`
/// names it (the head of the list if `obj` itself was bad), as verbs says.
///
/// # Safety
/// `wr` must be null or a valid list; `bad_wr` null or writable.
pub(crate) unsafe fn post_list<O, W: WrList>(
    obj: Result<&O, i32>,
    wr: *mut W,
    bad_wr: *mut *mut W,
    post: impl Fn(&O, &W) -> Result<(), i32>,
) -> i32 {
    let mut cur = wr;
    let r = errno_call(|| {
        let o = obj?;
        while !cur.is_null() {
            // SAFETY: the caller's promise.
            let w = unsafe { &*cur };
            post(o, w)?;
            cur = w.next();
        }
        Ok(())
    });
    if r != 0 && !bad_wr.is_null() {
        // SAFETY: the caller's promise.
        unsafe { *bad_wr = if cur.is_null() { wr } else { cur } };
    }
    r
}

/// `Some(&mut *p)` for a non-null, aligned pointer to a caller's struct.
///
/// # Safety
/// `p` must be null or valid for writes of a `T` for the returned lifetime.
pub(crate) unsafe fn out<'a, T>(p: *mut T) -> Result<&'a mut T, i32> {
    if p.is_null() || !p.is_aligned() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { &mut *p })
}

/// `Some(&*p)` for a non-null, aligned pointer to a caller's struct.
///
/// # Safety
/// `p` must be null or valid for reads of a `T` for the returned lifetime.
pub(crate) unsafe fn input<'a, T>(p: *const T) -> Result<&'a T, i32> {
    if p.is_null() || !p.is_aligned() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { &*p })
}

/// Copy the first `size` bytes of `value` to `dst` (the extended verbs'
/// "fill what the caller's struct has room for").
///
/// # Safety
/// `dst` must be valid for `size` bytes of writes.
pub(crate) unsafe fn copy_prefix<T>(value: &T, dst: *mut T, size: usize) {
    let n = size.min(std::mem::size_of::<T>());
    // SAFETY: `value` is a whole T; `dst` has room for `size` >= n bytes.
    unsafe { std::ptr::copy_nonoverlapping((value as *const T).cast::<u8>(), dst.cast::<u8>(), n) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C)]
    struct Apple {
        c: u64,
        magic: u64,
    }
    object!(Apple, u64, b"t-apple\0");

    #[repr(C)]
    struct Pear {
        c: u64,
        magic: u64,
        more: [u64; 4],
    }
    object!(Pear, u64, b"t-pear\0\0");

    /// A pointer is taken only as the type it was made as: the magic says
    /// which, and a freed object is not taken at all.
    #[test]
    fn an_object_is_taken_only_as_its_own_type() {
        let p = Pear {
            c: 0,
            magic: 0,
            more: [0; 4],
        }
        .into_c();
        // SAFETY: a live Pear, larger than an Apple.
        unsafe {
            assert!(obj::<Pear>(p).is_some());
            assert!(obj::<Apple>(p).is_none());
            assert!(free::<Apple>(p).is_none());
            assert!(obj::<Pear>(std::ptr::null_mut()).is_none());
            assert!(obj::<Pear>(p.cast::<u8>().add(1).cast()).is_none());
            assert!(free::<Pear>(p).is_some());
        }
    }

    /// Every kind of object rnic hands out has a magic of its own.
    #[test]
    fn every_type_has_its_own_magic() {
        let all = [
            <crate::ah::Ah as Object>::MAGIC,
            <crate::cq::Cq as Object>::MAGIC,
            <crate::cq::Channel as Object>::MAGIC,
            <crate::device::Context as Object>::MAGIC,
            <crate::mr::Mr as Object>::MAGIC,
            <crate::mw::Mw as Object>::MAGIC,
            <crate::pd::Pd as Object>::MAGIC,
            <crate::qp::Qp as Object>::MAGIC,
            <crate::srq::Srq as Object>::MAGIC,
        ];
        let distinct: std::collections::HashSet<_> = all.iter().collect();
        assert_eq!(distinct.len(), all.len());
        assert!(!all.contains(&0), "0 is a freed object's magic");
    }
}
