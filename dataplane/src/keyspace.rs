//! Key names to store keys: `users:42` -> (table id of `users`, pk text `42`).
//!
//! A key is `<prefix>:<pk>` where the prefix is a cached table's name, its schema-qualified name
//! or a configured per-table prefix; all of them name the same table id, so `users:1` and
//! `public.users:1` are one entry. The pk part is everything after the first `:` (prefixes may not
//! contain `:`); composite keys keep their `:`-joined parts as the pk text.
//!
//! The control plane publishes a new immutable [`KeySpace`] when the catalog changes; each core
//! checks one atomic generation per poll and takes the new snapshot only when it moved, so a
//! lookup costs a hash of the prefix and no lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// One immutable snapshot of the prefix -> table id map.
///
/// Hashed with FxHash: the map is small, built only by the control plane and never grown by
/// client input, so a keyed (DoS-resistant) hash buys nothing on this per-key path.
#[derive(Debug, Default, Clone)]
pub struct KeySpace {
    prefixes: rustc_hash::FxHashMap<Box<[u8]>, u32>,
}

impl KeySpace {
    pub fn new() -> Self {
        KeySpace::default()
    }

    /// Adds `prefix` as a name of `table`. Prefixes containing `:` are refused.
    pub fn add(&mut self, prefix: &str, table: u32) -> bool {
        if prefix.is_empty() || prefix.contains(':') {
            return false;
        }
        self.prefixes.insert(prefix.as_bytes().into(), table);
        true
    }

    /// Splits `key` into its table id and pk text, or `None` if the prefix names no cached table.
    pub fn resolve<'a>(&self, key: &'a [u8]) -> Option<(u32, &'a [u8])> {
        let colon = memchr::memchr(b':', key)?;
        let table = *self.prefixes.get(&key[..colon])?;
        Some((table, &key[colon + 1..]))
    }

    pub fn len(&self) -> usize {
        self.prefixes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.prefixes.is_empty()
    }
}

/// The shared, swappable key space.
#[derive(Debug, Default)]
pub struct KeySpaceCell {
    generation: AtomicU64,
    current: RwLock<Arc<KeySpace>>,
}

impl KeySpaceCell {
    pub fn new(space: KeySpace) -> Self {
        KeySpaceCell {
            generation: AtomicU64::new(1),
            current: RwLock::new(Arc::new(space)),
        }
    }

    /// Publishes a new snapshot (control plane only).
    pub fn publish(&self, space: KeySpace) {
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        *current = Arc::new(space);
        self.generation.fetch_add(1, Ordering::Release);
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn snapshot(&self) -> Arc<KeySpace> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_resolve_to_one_table() {
        let mut ks = KeySpace::new();
        assert!(ks.add("users", 7));
        assert!(ks.add("public.users", 7));
        assert!(!ks.add("bad:prefix", 8));
        assert_eq!(ks.resolve(b"users:42"), Some((7, &b"42"[..])));
        assert_eq!(ks.resolve(b"public.users:42"), Some((7, &b"42"[..])));
        assert_eq!(ks.resolve(b"orders:1:2"), None);
        assert_eq!(ks.resolve(b"users"), None);
        assert_eq!(ks.resolve(b"users:a:b"), Some((7, &b"a:b"[..])));
    }

    #[test]
    fn publish_bumps_the_generation() {
        let cell = KeySpaceCell::new(KeySpace::new());
        let g = cell.generation();
        let mut ks = KeySpace::new();
        ks.add("t", 1);
        cell.publish(ks);
        assert!(cell.generation() > g);
        assert_eq!(cell.snapshot().resolve(b"t:1"), Some((1, &b"1"[..])));
    }
}
