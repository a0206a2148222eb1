//! Registered memory shared by the application and the engine thread.
//!
//! On hardware the NIC writes registered memory by DMA while the CPU may read
//! it. Here the "NIC" is another thread of the same process, so the same
//! sharing would be a data race, which Rust forbids. Every byte of a region is
//! therefore part of an `AtomicU64`, read and written with relaxed ordering
//! by both sides, always as whole words: no undefined behaviour, and on x86-64
//! the same instructions as plain loads and stores. Completions carry the ordering: the engine publishes a
//! completion through a channel after its writes, and the application reads
//! the memory after taking the completion.

use core::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rustix::mm::{Advice, MapFlags, ProtFlags};

use rnic_core::mem::Region;

/// Where a region's memory comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backing {
    /// The heap: 8-byte aligned.
    #[default]
    Heap,
    /// Anonymous pages of its own (`mmap`): page-aligned, whole pages.
    Pages,
    /// Huge pages: reserved hugetlbfs pages (2 MiB) if the system has them
    /// (`vm.nr_hugepages`), else pages the kernel is asked to back with
    /// transparent huge pages (`madvise(MADV_HUGEPAGE)`).
    HugePages,
}

/// What a region got (see [`Backing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Heap memory.
    Heap,
    /// Pages of the system's base page size.
    Pages,
    /// 2 MiB hugetlbfs pages.
    HugeTlb,
    /// Base pages with transparent huge pages advised (the kernel decides).
    TransparentHuge,
    /// The caller's own buffer (`ProtectionDomain::register_vec`).
    Caller,
    /// Memory rnic does not own (`ProtectionDomain::register_foreign`: a C
    /// program's buffer registered with `ibv_reg_mr`).
    Foreign,
}

/// 2 MiB: the huge page size rnic asks hugetlbfs for.
const HUGE_PAGE: usize = 2 << 20;

enum Storage {
    Heap(Box<[AtomicU64]>),
    Mapped {
        ptr: NonNull<AtomicU64>,
        words: usize,
        map_len: usize,
    },
    /// A caller's `Vec<u8>`, taken apart: 8-byte aligned, its length padded
    /// to whole words; put back together on drop or by `into_vec`.
    Caller {
        ptr: NonNull<AtomicU64>,
        words: usize,
        capacity: usize,
    },
    /// Memory owned by someone else, who promised it stays mapped until the
    /// region is deregistered (see `DmaBuf::foreign`).
    Foreign {
        ptr: NonNull<u8>,
    },
}

/// Memory the NIC may read and write: 64-bit atomic words, every access to
/// them atomic and of the same size, copied a word at a time.
pub struct DmaBuf {
    storage: Storage,
    len: usize,
    placement: Placement,
}

// SAFETY: the mapping is owned by the `DmaBuf` (unmapped only on drop) and
// holds `AtomicU64`s, which any number of threads may access at once.
unsafe impl Send for DmaBuf {}
// SAFETY: as above: shared access goes through atomics only.
unsafe impl Sync for DmaBuf {}

impl fmt::Debug for DmaBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaBuf")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("placement", &self.placement)
            .finish()
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        match self.storage {
            Storage::Mapped { ptr, map_len, .. } => {
                // SAFETY: the mapping was made by `DmaBuf::map` with this
                // length, and no reference into it outlives `self`.
                unsafe {
                    let _ = rustix::mm::munmap(ptr.as_ptr().cast(), map_len);
                }
            }
            Storage::Caller { .. } => drop(self.take_vec()),
            Storage::Heap(_) | Storage::Foreign { .. } => {}
        }
    }
}

/// A mask selecting bytes `from..to` of a word, in memory order.
fn mask(from: usize, to: usize) -> u64 {
    let mut m = [0u8; 8];
    m[from..to].fill(0xFF);
    u64::from_ne_bytes(m)
}

impl DmaBuf {
    /// `len` zeroed bytes on the heap.
    pub fn zeroed(len: usize) -> DmaBuf {
        DmaBuf {
            storage: Storage::Heap((0..len.div_ceil(8)).map(|_| AtomicU64::new(0)).collect()),
            len,
            placement: Placement::Heap,
        }
    }

    /// `len` zeroed bytes from `backing`.
    pub fn new(len: usize, backing: Backing) -> io::Result<DmaBuf> {
        match backing {
            Backing::Heap => Ok(DmaBuf::zeroed(len)),
            Backing::Pages => DmaBuf::map(len, false),
            Backing::HugePages => DmaBuf::map(len, true).or_else(|_| {
                let mut b = DmaBuf::map(len, false)?;
                if let Storage::Mapped { ptr, map_len, .. } = b.storage {
                    // SAFETY: advice on a mapping `b` owns; it changes no contents.
                    unsafe {
                        rustix::mm::madvise(ptr.as_ptr().cast(), map_len, Advice::LinuxHugepage)?;
                    }
                }
                b.placement = Placement::TransparentHuge;
                Ok(b)
            }),
        }
    }

    /// Take over the caller's buffer: the NIC and the caller then share it
    /// through atomic words, as with any other region. It must be 8-byte
    /// aligned (what the system allocator gives any `Vec<u8>` here); it is
    /// padded with zeros to whole words, which `into_vec` takes off again.
    pub fn from_vec(mut v: Vec<u8>) -> Result<DmaBuf, Vec<u8>> {
        let len = v.len();
        v.resize(len.div_ceil(8) * 8, 0);
        if v.as_ptr() as usize % 8 != 0 {
            v.truncate(len);
            return Err(v);
        }
        let words = v.len() / 8;
        let mut v = std::mem::ManuallyDrop::new(v);
        let capacity = v.capacity();
        let Some(ptr) = NonNull::new(v.as_mut_ptr().cast::<AtomicU64>()) else {
            return Err(std::mem::ManuallyDrop::into_inner(v));
        };
        Ok(DmaBuf {
            // The buffer is initialised, aligned for u64 and a whole number of
            // words, and now owned here alone: a valid [AtomicU64].
            storage: Storage::Caller {
                ptr,
                words,
                capacity,
            },
            len,
            placement: Placement::Caller,
        })
    }

    /// The caller's buffer back (`None` if this region was not one).
    pub fn into_vec(mut self) -> Option<Vec<u8>> {
        match self.storage {
            Storage::Caller { .. } => {
                let mut v = self.take_vec();
                v.truncate(self.len);
                Some(v)
            }
            _ => None,
        }
    }

    /// `len` bytes at `ptr` that rnic does not own: a C program's buffer,
    /// registered in place with `ibv_reg_mr`, of any alignment.
    ///
    /// This is the one place where rnic shares memory the way a DMA engine
    /// does. The program and the NIC touch the same bytes with no lock and no
    /// atomics the program knows of: the program writes a buffer, posts a
    /// SEND, and the NIC reads it; a peer's WRITE lands while the program
    /// spins on the buffer's last byte (ib_write_lat does). Rust's memory
    /// model has no notion of such memory, so rnic keeps to the contract a
    /// device has with its driver: it never forms a reference to these bytes
    /// (every access is a volatile load or store through a raw pointer, so
    /// the compiler neither caches, merges, elides nor reorders them), it
    /// writes ascending through a packet and packets in PSN order, so a
    /// program that waits for a message's last byte sees the bytes before it
    /// (x86-64 keeps stores in order; on weaker machines the completion's
    /// release-acquire is the ordering, as verbs promises); and it stops
    /// touching the memory before `ibv_dereg_mr` returns (every access is
    /// made under the engine's lock, with the key checked first). What the
    /// program does meanwhile, racing with its own posted work, is its
    /// business, as it is with a hardware NIC.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay mapped, readable and writable, until this
    /// `DmaBuf` is dropped.
    pub unsafe fn foreign(ptr: NonNull<u8>, len: usize) -> DmaBuf {
        DmaBuf {
            storage: Storage::Foreign { ptr },
            len,
            placement: Placement::Foreign,
        }
    }

    /// Rebuild the caller's vector; `self.storage` must then not be used as
    /// a `Caller` again.
    fn take_vec(&mut self) -> Vec<u8> {
        match std::mem::replace(&mut self.storage, Storage::Heap(Box::new([]))) {
            // SAFETY: ptr, length and capacity are those of the vector taken
            // apart in `from_vec`, and the storage no longer refers to it.
            Storage::Caller {
                ptr,
                words,
                capacity,
            } => unsafe { Vec::from_raw_parts(ptr.as_ptr().cast::<u8>(), words * 8, capacity) },
            other => {
                self.storage = other;
                Vec::new()
            }
        }
    }

    fn map(len: usize, hugetlb: bool) -> io::Result<DmaBuf> {
        let unit = if hugetlb {
            HUGE_PAGE
        } else {
            rustix::param::page_size()
        };
        let map_len = len.max(1).div_ceil(unit) * unit;
        // No MAP_NORESERVE: with it, a hugetlb mapping succeeds even when no
        // huge pages are reserved, and the first touch dies of SIGBUS.
        let mut flags = MapFlags::PRIVATE;
        if hugetlb {
            flags |= MapFlags::HUGETLB;
        }
        // SAFETY: a fresh anonymous mapping at an address the kernel picks;
        // nothing else refers to it.
        let ptr = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                map_len,
                ProtFlags::READ | ProtFlags::WRITE,
                flags,
            )?
        };
        let ptr = NonNull::new(ptr.cast::<AtomicU64>())
            .ok_or_else(|| io::Error::other("mmap returned a null mapping"))?;
        Ok(DmaBuf {
            // Anonymous pages are zeroed and page-aligned, a valid array of
            // AtomicU64 (any bit pattern is a valid u64).
            storage: Storage::Mapped {
                ptr,
                words: map_len / 8,
                map_len,
            },
            len,
            placement: if hugetlb {
                Placement::HugeTlb
            } else {
                Placement::Pages
            },
        })
    }

    /// Where the memory came from.
    pub fn placement(&self) -> Placement {
        self.placement
    }

    fn words(&self) -> &[AtomicU64] {
        match &self.storage {
            Storage::Heap(w) => w,
            Storage::Foreign { .. } => &[],
            // SAFETY: `ptr` points at `words` initialised AtomicU64s that live
            // until `self` is dropped (a mapping, or the caller's vector).
            Storage::Mapped { ptr, words, .. } | Storage::Caller { ptr, words, .. } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), *words)
            },
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the first byte: the region's I/O virtual address, as
    /// verbs uses the buffer's address.
    pub fn addr(&self) -> u64 {
        match self.storage {
            Storage::Foreign { ptr } => ptr.as_ptr() as u64,
            _ => self.words().as_ptr() as u64,
        }
    }

    fn in_bounds(&self, offset: usize, n: usize) -> bool {
        offset.checked_add(n).is_some_and(|end| end <= self.len)
    }

    /// Copy out `out.len()` bytes from `offset`; false if out of bounds.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        if !self.in_bounds(offset, out.len()) {
            return false;
        }
        if let Storage::Foreign { ptr } = self.storage {
            // SAFETY: in bounds of memory `foreign`'s caller keeps mapped.
            unsafe { foreign_read(ptr.as_ptr().add(offset), out) };
            return true;
        }
        let words = self.words();
        // A part of the first word, whole words, a part of the last.
        let b = offset % 8;
        let take = if b == 0 { 0 } else { (8 - b).min(out.len()) };
        let (head, rest) = out.split_at_mut(take);
        if take > 0 {
            let w = words[offset / 8].load(Ordering::Relaxed).to_ne_bytes();
            head.copy_from_slice(&w[b..b + take]);
        }
        let first = (offset + take) / 8;
        let last = first + rest.len() / 8;
        let (whole, tail) = rest.split_at_mut(rest.len() / 8 * 8);
        copy_out(&words[first..last], whole);
        if !tail.is_empty() {
            let w = words[last].load(Ordering::Relaxed).to_ne_bytes();
            tail.copy_from_slice(&w[..tail.len()]);
        }
        true
    }

    /// Copy `data` in at `offset`; false if it does not fit.
    pub fn write(&self, offset: usize, data: &[u8]) -> bool {
        if !self.in_bounds(offset, data.len()) {
            return false;
        }
        if let Storage::Foreign { ptr } = self.storage {
            // SAFETY: in bounds of memory `foreign`'s caller keeps mapped.
            unsafe { foreign_write(ptr.as_ptr().add(offset), data) };
            return true;
        }
        let words = self.words();
        // Part of a word: clear those bytes, then set them.
        let part = |w: &AtomicU64, at: usize, bytes: &[u8]| {
            let mut v = [0u8; 8];
            v[at..at + bytes.len()].copy_from_slice(bytes);
            let m = mask(at, at + bytes.len());
            w.fetch_and(!m, Ordering::Relaxed);
            w.fetch_or(u64::from_ne_bytes(v) & m, Ordering::Relaxed);
        };
        let b = offset % 8;
        let take = if b == 0 { 0 } else { (8 - b).min(data.len()) };
        let (head, rest) = data.split_at(take);
        if take > 0 {
            part(&words[offset / 8], b, head);
        }
        let first = (offset + take) / 8;
        let (whole, tail) = rest.split_at(rest.len() / 8 * 8);
        copy_in(whole, &words[first..first + whole.len() / 8]);
        if !tail.is_empty() {
            part(&words[first + rest.len() / 8], 0, tail);
        }
        true
    }
}

/// Copy `words` out into `out` (8 bytes each), four words per step: one
/// loop test per 32 bytes (relaxed atomic loads are never merged into
/// wider ones, so the loop's own overhead is what unrolling can save).
fn copy_out(words: &[AtomicU64], out: &mut [u8]) {
    debug_assert_eq!(out.len(), words.len() * 8);
    let mut dst = out.chunks_exact_mut(32);
    let mut src = words.chunks_exact(4);
    for (d, w) in (&mut dst).zip(&mut src) {
        let v = [
            w[0].load(Ordering::Relaxed),
            w[1].load(Ordering::Relaxed),
            w[2].load(Ordering::Relaxed),
            w[3].load(Ordering::Relaxed),
        ];
        for (d, v) in d.chunks_exact_mut(8).zip(v) {
            d.copy_from_slice(&v.to_ne_bytes());
        }
    }
    for (d, w) in dst
        .into_remainder()
        .chunks_exact_mut(8)
        .zip(src.remainder())
    {
        d.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
    }
}

/// Copy `data` into `words` (8 bytes each), four words per step (see
/// `copy_out`).
fn copy_in(data: &[u8], words: &[AtomicU64]) {
    debug_assert_eq!(data.len(), words.len() * 8);
    let mut src = data.chunks_exact(32);
    let mut dst = words.chunks_exact(4);
    for (s, w) in (&mut src).zip(&mut dst) {
        let v = [
            ne_word(&s[..8]),
            ne_word(&s[8..16]),
            ne_word(&s[16..24]),
            ne_word(&s[24..]),
        ];
        for (w, v) in w.iter().zip(v) {
            w.store(v, Ordering::Relaxed);
        }
    }
    for (s, w) in src.remainder().chunks_exact(8).zip(dst.remainder()) {
        w.store(ne_word(s), Ordering::Relaxed);
    }
}

/// The word in 8 bytes, in memory order.
fn ne_word(b: &[u8]) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(b);
    u64::from_ne_bytes(v)
}

/// Copy `out.len()` bytes from `src` with volatile loads, ascending: whole
/// aligned words in the middle, single bytes at the ends.
///
/// # Safety
/// `src..src+out.len()` must be mapped and readable.
unsafe fn foreign_read(src: *const u8, out: &mut [u8]) {
    let n = out.len();
    let head = src.align_offset(8).min(n);
    let mut i = 0;
    while i < head {
        // SAFETY: i < n, inside the caller's range.
        out[i] = unsafe { src.add(i).read_volatile() };
        i += 1;
    }
    let whole = (n - i) / 8 * 8;
    let (quads, rest) = out[i..i + whole].split_at_mut(whole / 32 * 32);
    for dst in quads.chunks_exact_mut(32) {
        // SAFETY: `src + i` is 8-byte aligned (past the head) and the four
        // words are inside the caller's range.
        let w = unsafe {
            let p = src.add(i).cast::<u64>();
            [
                p.read_volatile(),
                p.add(1).read_volatile(),
                p.add(2).read_volatile(),
                p.add(3).read_volatile(),
            ]
        };
        for (d, w) in dst.chunks_exact_mut(8).zip(w) {
            d.copy_from_slice(&w.to_ne_bytes());
        }
        i += 32;
    }
    for dst in rest.chunks_exact_mut(8) {
        // SAFETY: as above, one word.
        let w = unsafe { src.add(i).cast::<u64>().read_volatile() };
        dst.copy_from_slice(&w.to_ne_bytes());
        i += 8;
    }
    while i < n {
        // SAFETY: i < n.
        out[i] = unsafe { src.add(i).read_volatile() };
        i += 1;
    }
}

/// Copy `data` to `dst` with volatile stores, ascending (see `foreign_read`).
///
/// # Safety
/// `dst..dst+data.len()` must be mapped and writable.
unsafe fn foreign_write(dst: *mut u8, data: &[u8]) {
    let n = data.len();
    let head = dst.align_offset(8).min(n);
    let mut i = 0;
    while i < head {
        // SAFETY: i < n, inside the caller's range.
        unsafe { dst.add(i).write_volatile(data[i]) };
        i += 1;
    }
    let whole = (n - i) / 8 * 8;
    let (quads, rest) = data[i..i + whole].split_at(whole / 32 * 32);
    for src in quads.chunks_exact(32) {
        let w = [
            ne_word(&src[..8]),
            ne_word(&src[8..16]),
            ne_word(&src[16..24]),
            ne_word(&src[24..]),
        ];
        // SAFETY: aligned (past the head) and the four words inside the
        // caller's range.
        unsafe {
            let p = dst.add(i).cast::<u64>();
            p.write_volatile(w[0]);
            p.add(1).write_volatile(w[1]);
            p.add(2).write_volatile(w[2]);
            p.add(3).write_volatile(w[3]);
        }
        i += 32;
    }
    for src in rest.chunks_exact(8) {
        // SAFETY: as above, one word.
        unsafe { dst.add(i).cast::<u64>().write_volatile(ne_word(src)) };
        i += 8;
    }
    while i < n {
        // SAFETY: i < n.
        unsafe { dst.add(i).write_volatile(data[i]) };
        i += 1;
    }
}

/// The engine's handle on a region: it keeps the memory alive for as long as
/// the region is registered, whatever the application does with its handle.
pub(crate) struct Shared(pub Arc<DmaBuf>);

impl Region for Shared {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn read(&self, offset: usize, out: &mut [u8]) {
        self.0.read(offset, out);
    }
    fn write(&mut self, offset: usize, data: &[u8]) {
        self.0.write(offset, data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_alignment_round_trips() {
        // Lengths past four words: the copies move four at a time, then
        // the words left, then the bytes left.
        const LEN: usize = 128;
        let b = DmaBuf::zeroed(LEN);
        for offset in 0..20 {
            for len in (0..40).chain([63, 64, 65, 72, 79]) {
                let data: Vec<u8> = (0..len as u8)
                    .map(|i| i.wrapping_mul(37).wrapping_add(offset as u8 + 1))
                    .collect();
                let before = {
                    let mut v = vec![0u8; LEN];
                    b.read(0, &mut v);
                    v
                };
                assert!(b.write(offset, &data));
                let mut after = vec![0u8; LEN];
                assert!(b.read(0, &mut after));
                let mut want = before.clone();
                want[offset..offset + len].copy_from_slice(&data);
                assert_eq!(after, want, "offset {offset} len {len}");
                let mut back = vec![0u8; len];
                assert!(b.read(offset, &mut back));
                assert_eq!(back, data, "read at offset {offset} len {len}");
            }
        }
        assert_eq!(DmaBuf::zeroed(13).len(), 13);
        assert!(!DmaBuf::zeroed(13).write(10, &[0; 4]));
    }

    #[test]
    fn page_backed_memory() {
        let page = rustix::param::page_size() as u64;
        let b = DmaBuf::new(10_000, Backing::Pages).unwrap();
        assert_eq!(b.addr() % page, 0, "page-aligned");
        assert_eq!((b.len(), b.placement()), (10_000, Placement::Pages));
        assert!(b.write(9_992, &[7; 8]));
        assert!(!b.write(9_993, &[7; 8]));
        let mut out = [0u8; 9];
        assert!(b.read(9_991, &mut out));
        assert_eq!(out, [0, 7, 7, 7, 7, 7, 7, 7, 7]);
        let h = DmaBuf::new(3 << 20, Backing::HugePages).unwrap();
        match h.placement() {
            Placement::HugeTlb => assert_eq!(h.addr() % (2 << 20), 0),
            p => assert_eq!(p, Placement::TransparentHuge),
        }
        assert!(h.write((3 << 20) - 1, &[1]));
    }

    #[test]
    fn a_callers_vector_goes_in_and_comes_back() {
        // Rust promises a Vec<u8> no alignment; the system allocator gives 16
        // bytes, Miri as little as it may. An unaligned one comes back as it was.
        let mut b = None;
        for _ in 0..64 {
            match DmaBuf::from_vec((0..13).collect()) {
                Ok(buf) => {
                    b = Some(buf);
                    break;
                }
                Err(v) => assert_eq!(v, (0..13).collect::<Vec<u8>>()),
            }
        }
        let b = b.expect("an 8-byte aligned vector in 64 tries");
        assert_eq!((b.len(), b.placement()), (13, Placement::Caller));
        assert_eq!(b.addr() % 8, 0);
        assert!(b.write(11, &[0xAA, 0xBB]));
        assert!(!b.write(12, &[0, 0]), "the padding is not the caller's");
        let back = b.into_vec().unwrap();
        let mut want: Vec<u8> = (0..13).collect();
        want[11] = 0xAA;
        want[12] = 0xBB;
        assert_eq!(back, want);
        // Dropped without into_vec: freed, once (Miri checks this).
        drop(DmaBuf::from_vec(vec![1u8; 100]));
        assert_eq!(DmaBuf::zeroed(8).into_vec(), None);
    }

    #[test]
    fn foreign_memory_at_every_alignment() {
        // Long enough for the copies' four words at a time, then the
        // words left, then the bytes left, from every alignment.
        const LEN: usize = 120;
        let mut backing = vec![0u8; LEN + 16];
        for start in 0..9 {
            let base = NonNull::new(backing.as_mut_ptr()).unwrap();
            // SAFETY: `backing` outlives `b` and is not otherwise touched
            // until `b` is gone.
            let b = unsafe { DmaBuf::foreign(base.add(start), LEN) };
            assert_eq!(b.placement(), Placement::Foreign);
            assert_eq!(b.addr(), base.as_ptr() as u64 + start as u64);
            let mut model = vec![0u8; LEN];
            for off in 0..9 {
                for len in [0, 1, 7, 8, 17, 31, 32, 33, 40, 63, 64, 65, 100] {
                    let data: Vec<u8> = (0..len as u8)
                        .map(|i| i ^ (start as u8 * 7 + off as u8 + 1))
                        .collect();
                    assert!(b.write(off, &data));
                    model[off..off + len].copy_from_slice(&data);
                    let mut back = vec![0u8; len];
                    assert!(b.read(off, &mut back));
                    assert_eq!(back, data, "start {start} offset {off} len {len}");
                    let mut all = vec![0u8; LEN];
                    assert!(b.read(0, &mut all));
                    assert_eq!(all, model, "start {start} offset {off} len {len}");
                }
            }
            assert!(!b.write(LEN - 7, &[0; 8]), "one byte past the end");
            assert!(!b.read(LEN, &mut [0; 1]));
            drop(b);
            assert!(
                backing[..start].iter().all(|&x| x == 0),
                "nothing before the region"
            );
            assert!(
                backing[start + LEN..].iter().all(|&x| x == 0),
                "nothing after it"
            );
            backing.fill(0);
        }
    }

    #[test]
    fn bounds() {
        let b = DmaBuf::zeroed(16);
        assert!(b.write(12, &[1, 2, 3, 4]));
        assert!(!b.write(13, &[1, 2, 3, 4]));
        assert!(!b.write(usize::MAX, &[1]));
        let mut out = [0u8; 5];
        assert!(b.read(11, &mut out));
        assert_eq!(out, [0, 1, 2, 3, 4]);
        assert!(!b.read(12, &mut out));
    }
}
