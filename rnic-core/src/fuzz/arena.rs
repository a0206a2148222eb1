//! Memory the harness sees behind the engine's back: every region is a
//! window onto one arena, with guard bytes around it, as registered user
//! memory sits among a program's other data; and every read and write the
//! engine makes through a region is logged, so an oracle can say whether a
//! valid request was allowed to touch those bytes.

use std::sync::{Arc, Mutex, PoisonError};

use crate::mem::Region;

/// Guard bytes before, between and after the regions.
const GUARD: usize = 64;
/// What the guard bytes hold.
const GUARD_BYTE: u8 = 0xA5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Read,
    Write,
}

/// One access the engine made through a region.
#[derive(Debug, Clone, Copy)]
pub(super) struct Touch {
    /// Index of the region, in the order [`Arena::new`] was given.
    pub region: usize,
    pub kind: Kind,
    pub offset: usize,
    pub len: usize,
}

impl Touch {
    /// The bytes touched, as offsets in the region.
    pub fn range(&self) -> core::ops::Range<usize> {
        self.offset..self.offset + self.len
    }
}

/// Per region, the bytes that requests or work requests named: where the
/// engine may go.
pub(super) struct Named(Vec<Vec<bool>>);

impl Named {
    /// Nothing named yet, in regions of `lens` bytes.
    pub fn new(lens: &[usize]) -> Named {
        Named(lens.iter().map(|&len| vec![false; len]).collect())
    }

    /// Name `len` bytes from `offset` in `region`, as far as its end.
    pub fn mark(&mut self, region: usize, offset: u64, len: u64) {
        let bytes = &mut self.0[region];
        let end = offset.saturating_add(len).min(bytes.len() as u64);
        bytes[offset.min(end) as usize..end as usize].fill(true);
    }

    /// Whether `t` stays inside its region and touches named bytes only.
    pub fn covers(&self, t: &Touch) -> bool {
        let bytes = &self.0[t.region];
        t.offset
            .checked_add(t.len)
            .is_some_and(|end| end <= bytes.len())
            && bytes[t.range()].iter().all(|&b| b)
    }
}

struct Inner {
    bytes: Vec<u8>,
    log: Vec<Touch>,
}

#[derive(Clone)]
pub(super) struct Arena(Arc<Mutex<Inner>>);

impl Arena {
    /// An arena holding regions of `lens` bytes, each filled with its index
    /// plus one, and the windows onto them to register.
    pub fn new(lens: &[usize]) -> (Arena, Vec<Window>) {
        let mut bytes = vec![GUARD_BYTE; GUARD];
        let mut starts = Vec::new();
        for (i, &len) in lens.iter().enumerate() {
            starts.push(bytes.len());
            bytes.extend(core::iter::repeat_n(i as u8 + 1, len));
            bytes.extend([GUARD_BYTE; GUARD]);
        }
        let arena = Arena(Arc::new(Mutex::new(Inner {
            bytes,
            log: Vec::new(),
        })));
        let windows = lens
            .iter()
            .zip(starts)
            .enumerate()
            .map(|(region, (&len, start))| Window {
                arena: arena.clone(),
                region,
                start,
                len,
            })
            .collect();
        (arena, windows)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The accesses made since the last call.
    pub fn take_log(&self) -> Vec<Touch> {
        core::mem::take(&mut self.lock().log)
    }

    /// Whether every guard byte still holds its value.
    pub fn guards_intact(&self, lens: &[usize]) -> bool {
        let inner = self.lock();
        let mut at = 0;
        for len in lens.iter().copied().chain([0]) {
            if inner.bytes[at..at + GUARD].iter().any(|&b| b != GUARD_BYTE) {
                return false;
            }
            at += GUARD + len;
        }
        true
    }
}

/// One region: `len` bytes of the arena from `start`.
pub(super) struct Window {
    arena: Arena,
    region: usize,
    start: usize,
    len: usize,
}

impl Window {
    fn log(&self, kind: Kind, offset: usize, len: usize) -> std::sync::MutexGuard<'_, Inner> {
        let mut inner = self.arena.lock();
        inner.log.push(Touch {
            region: self.region,
            kind,
            offset,
            len,
        });
        inner
    }
}

/// Accesses are logged, then made even past the window's end (into the
/// guard bytes, as a stray DMA into user memory would land), so that the
/// oracle, not a slice bound, is what catches a loose check.
impl Region for Window {
    fn len(&self) -> usize {
        self.len
    }
    fn read(&self, offset: usize, out: &mut [u8]) {
        let inner = self.log(Kind::Read, offset, out.len());
        let at = self.start + offset;
        out.copy_from_slice(&inner.bytes[at..at + out.len()]);
    }
    fn write(&mut self, offset: usize, data: &[u8]) {
        let mut inner = self.log(Kind::Write, offset, data.len());
        let at = self.start + offset;
        inner.bytes[at..at + data.len()].copy_from_slice(data);
    }
}
