//! A process's executable mappings over time: the current layout, the retired ranges of
//! earlier ones (for addresses sampled before a library moved), and the bound on how many.

use std::{collections::HashMap, sync::Arc};

use procfs::process::{MMapPath, MemoryMap};

use super::{MappedFile, MAX_TRACKED_MAPPINGS};

/// One executable mapping, or what is left of it where newer layouts cover the rest.
#[derive(Clone, Debug)]
pub(super) struct Mapping {
    pub(super) start: u64,
    pub(super) end: u64,
    /// File offset of `base`.
    pub(super) offset: u64,
    /// The mapping's first address as the process mapped it (`start` moves up when a newer
    /// mapping covers its beginning): offsets into it are counted from here.
    pub(super) base: u64,
    pub(super) backing: Backing,
    /// Once retired, the layout change that retired it, for dropping the oldest first.
    pub(super) seen: u64,
}

impl Mapping {
    fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }
}

/// The mapping of sorted, non-overlapping `mappings` that holds `addr`, by binary search.
pub(super) fn find(mappings: &[Mapping], addr: u64) -> Option<&Mapping> {
    let at = mappings.partition_point(|m| m.start <= addr);
    mappings
        .get(at.checked_sub(1)?)
        .filter(|m| m.contains(addr))
}

/// Puts `retired`, mappings the process no longer has, into `kept` (both sorted and
/// non-overlapping): where they overlap what `kept` holds, they win, being newer.
pub(super) fn retire(kept: &mut Vec<Mapping>, retired: Vec<Mapping>) {
    if retired.is_empty() {
        return;
    }
    let mut out = Vec::with_capacity(kept.len() + retired.len());
    let mut old: std::collections::VecDeque<Mapping> = std::mem::take(kept).into();
    for new in retired {
        while let Some(o) = old.pop_front() {
            if o.start >= new.end {
                old.push_front(o);
                break;
            }
            // What of the older mapping lies outside the newer one stays.
            if o.start < new.start {
                out.push(Mapping {
                    end: o.end.min(new.start),
                    ..o.clone()
                });
            }
            if o.end > new.end {
                // It goes on past the newer mapping: the rest is compared with the next one.
                old.push_front(Mapping {
                    start: new.end,
                    ..o
                });
                break;
            }
        }
        out.push(new);
    }
    out.extend(old);
    *kept = out;
}

/// Removes from `kept` (sorted, non-overlapping) every part that `current` (sorted,
/// non-overlapping) covers: lookups find those addresses in `current` first, and when the
/// process changes them, `current`'s mappings are retired over them anyway.
pub(super) fn uncover(kept: &mut Vec<Mapping>, current: &[Mapping]) {
    let mut out = Vec::with_capacity(kept.len());
    let mut holes = current.iter().peekable();
    for m in kept.drain(..) {
        let mut piece = Some(m);
        while let Some(p) = piece.take() {
            while holes.next_if(|h| h.end <= p.start).is_some() {}
            match holes.peek() {
                Some(h) if h.start < p.end => {
                    if p.start < h.start {
                        out.push(Mapping {
                            end: h.start,
                            ..p.clone()
                        });
                    }
                    if p.end > h.end {
                        piece = Some(Mapping { start: h.end, ..p });
                    }
                }
                _ => out.push(p),
            }
        }
    }
    *kept = out;
}

#[derive(Clone, Debug)]
pub(super) enum Backing {
    File(Arc<MappedFile>),
    /// Anonymous or special memory (`[vdso]`, `[anon]`, a deleted file that could not be opened).
    Named(String),
}

/// At most [`MAX_TRACKED_MAPPINGS`] of a process's executable mappings (in address order),
/// and how many were left out: each object's (file's or name's) first mappings are kept
/// before any object's later ones, so that a process mapping one thing thousands of times
/// still has its executable and libraries named.
pub(super) fn bounded(maps: Vec<MemoryMap>) -> (Vec<MemoryMap>, usize) {
    if maps.len() <= MAX_TRACKED_MAPPINGS {
        return (maps, 0);
    }
    // Ranks, addresses and indices only, then the kept maps in place: 60,000 mappings cost
    // 1.4 MB more here, where moving the parsed maps into a ranked copy cost 8.6 MB.
    let mut seen: HashMap<(u64, (i32, i32), String), u32> = HashMap::new();
    let mut ranked: Vec<(u32, u64, u32)> = maps
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let name = match &m.pathname {
                MMapPath::Path(_) => String::new(),
                other => format!("{other:?}"),
            };
            let n = seen.entry((m.inode, m.dev, name)).or_default();
            *n += 1;
            (*n, m.address.0, i as u32)
        })
        .collect();
    let left_out = ranked.len() - MAX_TRACKED_MAPPINGS;
    ranked.sort_unstable();
    let mut keep = vec![false; maps.len()];
    for &(_, _, i) in &ranked[..MAX_TRACKED_MAPPINGS] {
        keep[i as usize] = true;
    }
    drop(ranked);
    // In place, so in address order still, as /proc lists them.
    let mut kept = maps;
    let mut at = 0;
    kept.retain(|_| {
        at += 1;
        keep[at - 1]
    });
    (kept, left_out)
}

pub(super) fn same_layout(a: &[Mapping], b: &[Mapping]) -> bool {
    let same_backing = |x: &Backing, y: &Backing| match (x, y) {
        (Backing::File(x), Backing::File(y)) => x.id == y.id,
        (Backing::Named(x), Backing::Named(y)) => x == y,
        _ => false,
    };
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.start == y.start
                && x.end == y.end
                && x.offset == y.offset
                && same_backing(&x.backing, &y.backing)
        })
}
