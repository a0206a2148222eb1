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
/// engine may go. Kept as sorted, disjoint, non-adjacent ranges, so that
/// checking a touch costs a search, not a loop over its bytes (under the
/// fuzzer every compared byte is an instrumented comparison).
pub(super) struct Named {
    lens: Vec<usize>,
    ranges: Vec<Vec<core::ops::Range<usize>>>,
}

impl Named {
    /// Nothing named yet, in regions of `lens` bytes.
    pub fn new(lens: &[usize]) -> Named {
        Named {
            lens: lens.to_vec(),
            ranges: vec![Vec::new(); lens.len()],
        }
    }

    /// Name `len` bytes from `offset` in `region`, as far as its end.
    pub fn mark(&mut self, region: usize, offset: u64, len: u64) {
        let region_len = self.lens[region] as u64;
        let end = offset.saturating_add(len).min(region_len) as usize;
        let start = (offset as usize).min(end);
        if start == end {
            return;
        }
        let ranges = &mut self.ranges[region];
        // Ranges that overlap or touch [start, end) merge into one.
        let first = ranges.partition_point(|r| r.end < start);
        let last = ranges.partition_point(|r| r.start <= end);
        let merged = if first < last {
            ranges[first].start.min(start)..ranges[last - 1].end.max(end)
        } else {
            start..end
        };
        ranges.splice(first..last, [merged]);
    }

    /// Whether `t` stays inside its region and touches named bytes only.
    pub fn covers(&self, t: &Touch) -> bool {
        let Some(end) = t.offset.checked_add(t.len) else {
            return false;
        };
        if end > self.lens[t.region] {
            return false;
        }
        if t.len == 0 {
            return true;
        }
        let ranges = &self.ranges[t.region];
        // The one range that could hold t.offset: the last starting at or before it.
        let i = ranges.partition_point(|r| r.start <= t.offset);
        i > 0 && ranges[i - 1].end >= end
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The ranges answer exactly as a flag per byte would.
    #[test]
    fn named_ranges_agree_with_a_flag_per_byte() {
        let marks = prop::collection::vec((0usize..2, 0u64..80, 0u64..40), 0..12);
        let touches = prop::collection::vec((0usize..2, 0usize..90, 0usize..40), 1..24);
        proptest!(|(marks in marks, touches in touches)| {
            let lens = [64, 48];
            let mut named = Named::new(&lens);
            let mut flags: Vec<Vec<bool>> = lens.iter().map(|&l| vec![false; l]).collect();
            for (region, offset, len) in marks {
                named.mark(region, offset, len);
                let bytes = &mut flags[region];
                let end = offset.saturating_add(len).min(bytes.len() as u64);
                bytes[offset.min(end) as usize..end as usize].fill(true);
            }
            for r in &named.ranges {
                for pair in r.windows(2) {
                    prop_assert!(pair[0].end < pair[1].start, "ranges sorted and merged: {r:?}");
                }
            }
            for (region, offset, len) in touches {
                let t = Touch { region, kind: Kind::Write, offset, len };
                let bytes = &flags[region];
                let want = offset + len <= bytes.len() && bytes[t.range()].iter().all(|&b| b);
                prop_assert_eq!(named.covers(&t), want, "{:?} with {:?}", t, named.ranges[region]);
            }
        });
    }
}
