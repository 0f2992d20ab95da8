//! Per-statement statistics of the relay: calls, origin time (mean and p99 from a log2
//! histogram), reply bytes and errors, keyed by normalized statement text.
//!
//! Normalization replaces string and numeric literals with `?` and collapses whitespace, so
//! `WHERE id = 1` and `WHERE id = 2` share an entry; parameters (`$1`) stay as they are.
//! At most [`MAX_ENTRIES`] texts are kept; later new texts count under [`OTHER`].
//!
//! Thread model: one mutex, taken once per batch by the session task that ran it (off the hit
//! path). Not exposed in the HTTP API yet.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

pub const MAX_ENTRIES: usize = 10_000;
pub const OTHER: &str = "<other>";
const MAX_KEY: usize = 1024;
const BUCKETS: usize = 40;

/// A statement's figures so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatementStats {
    pub calls: u64,
    pub errors: u64,
    pub bytes: u64,
    pub total_us: u64,
    /// `hist[i]`: calls that took under `2^i` microseconds (and at least `2^(i-1)`).
    hist: [u64; BUCKETS],
}

impl Default for StatementStats {
    fn default() -> Self {
        StatementStats {
            calls: 0,
            errors: 0,
            bytes: 0,
            total_us: 0,
            hist: [0; BUCKETS],
        }
    }
}

impl StatementStats {
    pub fn mean_us(&self) -> u64 {
        self.total_us.checked_div(self.calls).unwrap_or(0)
    }

    /// The upper bound of the bucket holding the 99th percentile, in microseconds.
    pub fn p99_us(&self) -> u64 {
        let want = self.calls - self.calls / 100;
        let mut seen = 0;
        for (i, n) in self.hist.iter().enumerate() {
            seen += n;
            if seen >= want && *n > 0 {
                return 1u64 << i;
            }
        }
        0
    }
}

#[derive(Default)]
pub struct Stats {
    map: Mutex<HashMap<String, StatementStats>>,
}

impl Stats {
    /// Records one batch of statements `sql` that took `origin` and sent `bytes` back.
    pub fn record(&self, sql: &[String], origin: Duration, bytes: usize, error: bool) {
        if sql.is_empty() {
            return;
        }
        let mut key = String::new();
        for s in sql {
            let n = normalize(s);
            if !key.split("; ").any(|k| k == n) {
                if !key.is_empty() {
                    key.push_str("; ");
                }
                key.push_str(&n);
            }
        }
        key.truncate(floor_char_boundary(&key, MAX_KEY));
        let us = u64::try_from(origin.as_micros()).unwrap_or(u64::MAX);
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if !map.contains_key(&key) && map.len() >= MAX_ENTRIES {
            key = OTHER.into();
        }
        let e = map.entry(key).or_default();
        e.calls += 1;
        e.errors += u64::from(error);
        e.bytes += bytes as u64;
        e.total_us = e.total_us.saturating_add(us);
        let bucket = (64 - us.leading_zeros() as usize).min(BUCKETS - 1);
        e.hist[bucket] += 1;
    }

    /// Every statement's figures.
    pub fn snapshot(&self) -> Vec<(String, StatementStats)> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

fn floor_char_boundary(s: &str, max: usize) -> usize {
    if s.len() <= max {
        return s.len();
    }
    (0..=max)
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0)
}

/// Literals become `?`, runs of whitespace one space.
pub fn normalize(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len().min(MAX_KEY));
    let mut chars = sql.trim().chars().peekable();
    let mut prev_word = false;
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                while let Some(d) = chars.next() {
                    if d == '\'' {
                        if chars.peek() == Some(&'\'') {
                            chars.next();
                        } else {
                            break;
                        }
                    }
                }
                out.push('?');
                prev_word = false;
            }
            c if c.is_ascii_digit() && !prev_word => {
                while chars
                    .peek()
                    .is_some_and(|d| d.is_ascii_digit() || *d == '.')
                {
                    chars.next();
                }
                out.push('?');
            }
            c if c.is_whitespace() => {
                while chars.peek().is_some_and(|d| d.is_whitespace()) {
                    chars.next();
                }
                out.push(' ');
                prev_word = false;
            }
            c => {
                prev_word = c.is_alphanumeric() || c == '_' || c == '$';
                out.push(c);
            }
        }
        if out.len() >= MAX_KEY {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_normalized() {
        assert_eq!(
            normalize("SELECT *\n  FROM t1 WHERE id = 42 AND name = 'it''s' AND x = $1"),
            "SELECT * FROM t1 WHERE id = ? AND name = ? AND x = $1"
        );
        assert_eq!(normalize("select 1.5"), "select ?");
    }

    #[test]
    fn mean_and_p99() {
        let s = Stats::default();
        let q = vec!["SELECT 1".to_string()];
        for _ in 0..99 {
            s.record(&q, Duration::from_micros(100), 10, false);
        }
        s.record(&q, Duration::from_millis(50), 10, true);
        let snap = s.snapshot();
        assert_eq!(snap.len(), 1);
        let (key, st) = &snap[0];
        assert_eq!(key, "SELECT ?");
        assert_eq!((st.calls, st.errors, st.bytes), (100, 1, 1000));
        assert_eq!(st.mean_us(), (99 * 100 + 50_000) / 100);
        assert_eq!(st.p99_us(), 128);
        s.record(&q, Duration::from_millis(50), 10, false);
        assert_eq!(s.snapshot()[0].1.p99_us(), 65_536);
    }
}
