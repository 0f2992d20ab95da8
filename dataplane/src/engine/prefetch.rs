//! Overlapping the cache misses of pipelined requests.
//!
//! A lookup's cost on a large key space is two cache misses (the index bucket, then the entry),
//! taken one after the other. When a connection's input holds several pipelined `GET`s, this
//! pass parses up to [`MAX_FRAMES`] of them ahead, asks the store to prefetch every bucket,
//! then every entry, so the misses of the whole batch overlap; the normal loop then finds the
//! lines in cache. It changes nothing but timing: frames are parsed again by the normal loop.

use std::ops::Range;

use crate::keyspace::KeySpace;
use crate::resp::{parse_request, Args, Limits};
use crate::store::StoreReader;

/// Frames looked at ahead.
const MAX_FRAMES: usize = 32;
/// Below this many bytes of input there is at most one small frame: nothing to overlap.
pub(crate) const MIN_INPUT: usize = 64;

/// Prefetches the store lines of the `GET` keys among the next frames of `input`.
pub(crate) fn prefetch_pipeline(
    input: &[u8],
    limits: &Limits,
    args: &mut Vec<Range<usize>>,
    keyspace: &KeySpace,
    store: &StoreReader,
) {
    let mut keys: [(u32, usize, usize); MAX_FRAMES] = [(0, 0, 0); MAX_FRAMES];
    let mut found = 0;
    let mut at = 0;
    for _ in 0..MAX_FRAMES {
        let Ok(consumed) = parse_request(&input[at..], limits, args) else {
            break;
        };
        let frame = Args::new(&input[at..], args);
        if frame.len() == 2 && frame.get(0).is_some_and(|c| c.eq_ignore_ascii_case(b"get")) {
            if let (Some(r), Some(key)) = (args.get(1), frame.get(1)) {
                if let Some((table, pk)) = keyspace.resolve(key) {
                    let pk_start = at + r.end - pk.len();
                    keys[found] = (table, pk_start, at + r.end);
                    found += 1;
                }
            }
        }
        at += consumed;
    }
    if found < 2 {
        return;
    }
    for &(table, s, e) in &keys[..found] {
        store.prefetch_bucket(table, &input[s..e]);
    }
    for &(table, s, e) in &keys[..found] {
        store.prefetch_entry(table, &input[s..e]);
    }
}
