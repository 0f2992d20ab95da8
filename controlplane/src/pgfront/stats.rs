//! Per-statement statistics of the relay: calls, origin time (mean and p99 from a log2
//! histogram), reply bytes and errors, keyed by normalized statement text.
//!
//! Normalization works as `pg_stat_statements` does: every constant (numbers and strings of every
//! spelling: `'..'`, `E'..'`, `$$..$$`, `$tag$..$tag$`, `B'..'`, `X'..'`, `U&'..'`, `N'..'`)
//! becomes `$n`, numbered in order of appearance starting after the highest parameter number the
//! statement already uses (`$1` stays `$1`; `WHERE a = $1 AND b = 'x'` gives `b = $2`); comments
//! and runs of whitespace become one space. Statements are split into tokens by `sqlparser`'s
//! PostgreSQL tokenizer, not by a hand-written lexer. A statement that cannot be tokenized (an
//! unterminated quote, say) is listed as `<unparsable: N bytes>`, never as typed: what the API
//! shows never holds a literal (`ALTER ROLE bob PASSWORD $$secret$$`).
//! At most [`MAX_ENTRIES`] texts are kept; later new texts count under [`OTHER`].
//!
//! A statement text seen before is not read again: its normalized text and what it may do to a
//! backend ([`plan::Traits`]) are kept under a keyed 128-bit hash of its *shape* (the text
//! itself, literals included, is not kept; two shapes meet under one key with odds of 2^-128,
//! and the keys are random, so a client cannot choose texts that do), for at
//! most [`TEXT_CACHE`] texts. The shape is the text with each number written as `0`
//! ([`shape_key`]), so the statements of a client that writes its values into the text
//! (pgbench's simple protocol: `... WHERE aid = 48213`) are tokenized once per shape, not once
//! per run. Texts of one shape have one normalized text (every number is a constant, `$n`) and
//! the same traits (no keyword the traits look for holds a digit). A full cache starts over, so
//! texts that differ in every batch (string literals in the text) cannot keep the repeated ones
//! out for good. The tokenizer allocates a
//! string per token, and it ran on every forwarded batch: about 1 % of the core's samples, and
//! part of its `malloc` share, under pgbench `select 1` (`docs/decisions.md`).
//!
//! Thread model: two mutexes, the text cache's taken once per statement (`text`) and the
//! figures' once per batch, by the session task that ran it (off the hit path). Shown by the HTTP API
//! (`api/system.rs`).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::plan;

pub const MAX_ENTRIES: usize = 10_000;
/// Statement texts whose normalized form is remembered (at most 1 KiB each: 4 MiB).
pub const TEXT_CACHE: usize = 4_096;
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

/// What the relay knows of one statement text (see the module doc).
#[derive(Debug)]
pub struct Text {
    /// Constants as `$n`, at most `MAX_KEY` bytes.
    pub normalized: Arc<str>,
    pub traits: plan::Traits,
}

#[derive(Default)]
pub struct Stats {
    map: Mutex<HashMap<String, StatementStats>>,
    /// Texts by the keyed hash of the text as sent (see the module doc).
    texts: Mutex<HashMap<u128, Arc<Text>>>,
    /// The hash's random keys, two halves (a text cannot be chosen to collide with another's).
    hasher: (RandomState, RandomState),
}

impl Stats {
    /// What is known of `sql`, from the text cache when a text of its shape was seen before.
    pub fn text(&self, sql: &str) -> Arc<Text> {
        let h = shape_key(&self.hasher, sql);
        let texts = || self.texts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = texts().get(&h) {
            return t.clone();
        }
        let mut n = normalize(sql);
        n.truncate(floor_char_boundary(&n, MAX_KEY));
        let t = Arc::new(Text {
            normalized: n.into(),
            traits: plan::Traits::of(sql),
        });
        let mut texts = texts();
        if texts.len() >= TEXT_CACHE {
            texts.clear();
        }
        texts.insert(h, t.clone());
        t
    }

    /// Records one batch of statements `sql` (from [`Stats::text`]) that took `origin` and sent `bytes` back.
    pub fn record(&self, sql: &[Arc<Text>], origin: Duration, bytes: usize, error: bool) {
        if sql.is_empty() {
            return;
        }
        let mut key = String::new();
        for s in sql {
            let n = &s.normalized;
            if !key.split("; ").any(|k| k == &**n) {
                if !key.is_empty() {
                    key.push_str("; ");
                }
                key.push_str(n);
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

/// The keyed 128-bit hash of `sql` with each number written as `0`: each maximal run of ASCII
/// digits that does not continue a word (after a letter, digit, `_`, `$` or a non-ASCII byte: an
/// identifier, or a parameter `$n`) and is not inside a double-quoted identifier becomes one
/// `0`. Inside a string literal a run may become `0` too, which leaves it a string. Quotes are
/// followed only in texts without a backslash, `$$`/`$tag$` quoting or comments, where `'` and
/// `"` alone open and close literals and identifiers (doubling one inside is two toggles);
/// any other text is hashed as sent.
fn shape_key(keys: &(RandomState, RandomState), sql: &str) -> u128 {
    use std::hash::Hasher;
    let (mut a, mut b) = (keys.0.build_hasher(), keys.1.build_hasher());
    let bytes = sql.as_bytes();
    let plain = !bytes.contains(&b'\\')
        && !sql.contains("--")
        && !sql.contains("/*")
        && !bytes
            .windows(2)
            .any(|w| w[0] == b'$' && !w[1].is_ascii_digit());
    let mut written = 0;
    if plain {
        let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80;
        let (mut single, mut double) = (false, false);
        let mut i = 0;
        while i < bytes.len() {
            let c = bytes[i];
            match c {
                b'\'' if !double => single = !single,
                b'"' if !single => double = !double,
                b'0'..=b'9' if !double && (i == 0 || !word(bytes[i - 1])) => {
                    let end = bytes[i..]
                        .iter()
                        .position(|d| !d.is_ascii_digit())
                        .map_or(bytes.len(), |n| i + n);
                    for h in [&mut a, &mut b] {
                        h.write(&bytes[written..i]);
                        h.write(b"0");
                    }
                    written = end;
                    i = end;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
    for h in [&mut a, &mut b] {
        h.write(&bytes[written..]);
        // The end, so that no text's shape is the start of another's.
        h.write_u8(0xff);
    }
    u128::from(a.finish()) << 64 | u128::from(b.finish())
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

/// Every constant becomes `$n`, comments and whitespace one space (see the module doc).
pub fn normalize(sql: &str) -> String {
    use sqlparser::dialect::PostgreSqlDialect;
    use sqlparser::tokenizer::{Token, Tokenizer};
    let dialect = PostgreSqlDialect {};
    let Ok(tokens) = Tokenizer::new(&dialect, sql).tokenize() else {
        return format!("<unparsable: {} bytes>", sql.len());
    };
    let param = |t: &Token| match t {
        Token::Placeholder(p) => p.strip_prefix('$').and_then(|n| n.parse::<u32>().ok()),
        _ => None,
    };
    let mut next = tokens.iter().filter_map(param).max().unwrap_or(0);
    let mut out = String::with_capacity(sql.len().min(MAX_KEY));
    let mut space = false;
    for t in &tokens {
        let constant = matches!(
            t,
            Token::Number(..)
                | Token::SingleQuotedString(_)
                | Token::TripleSingleQuotedString(_)
                | Token::TripleDoubleQuotedString(_)
                | Token::DollarQuotedString(_)
                | Token::SingleQuotedByteStringLiteral(_)
                | Token::DoubleQuotedByteStringLiteral(_)
                | Token::TripleSingleQuotedByteStringLiteral(_)
                | Token::TripleDoubleQuotedByteStringLiteral(_)
                | Token::SingleQuotedRawStringLiteral(_)
                | Token::DoubleQuotedRawStringLiteral(_)
                | Token::TripleSingleQuotedRawStringLiteral(_)
                | Token::TripleDoubleQuotedRawStringLiteral(_)
                | Token::NationalStringLiteral(_)
                | Token::QuoteDelimitedStringLiteral(_)
                | Token::NationalQuoteDelimitedStringLiteral(_)
                | Token::EscapedStringLiteral(_)
                | Token::UnicodeStringLiteral(_)
                | Token::HexStringLiteral(_)
        );
        match t {
            Token::Whitespace(_) => {
                space = !out.is_empty();
                continue;
            }
            Token::EOF => continue,
            _ => {}
        }
        if space {
            out.push(' ');
            space = false;
        }
        if constant {
            next += 1;
            out.push('$');
            out.push_str(itoa::Buffer::new().format(next));
        } else {
            use std::fmt::Write as _;
            let _ = write!(out, "{t}");
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

    fn record(s: &Stats, sql: &[String], origin: Duration, bytes: usize, error: bool) {
        let texts: Vec<_> = sql.iter().map(|q| s.text(q)).collect();
        s.record(&texts, origin, bytes, error);
    }

    /// Texts that differ only in their numbers share a shape, and with it one normalized text
    /// and one set of traits; identifiers, parameters and quoted names with digits, and texts
    /// whose quoting is not followed, do not.
    #[test]
    fn texts_differing_in_numbers_share_a_shape() {
        let keys = (RandomState::new(), RandomState::new());
        let same = [
            (
                "UPDATE pgbench_accounts SET abalance = abalance + 4021 WHERE aid = 7;",
                "UPDATE pgbench_accounts SET abalance = abalance + 12 WHERE aid = 999999;",
            ),
            (
                "select 1.5e10, x[3] from t1 where a = $1",
                "select 2.0e10, x[10] from t1 where a = $1",
            ),
            ("select '1' as \"c\"\"1\"", "select '22' as \"c\"\"1\""),
            ("SET work_mem = 4096", "SET work_mem = 1"),
            (
                "CREATE TEMP TABLE x AS SELECT 1",
                "CREATE TEMP TABLE x AS SELECT 22",
            ),
        ];
        for (x, y) in same {
            assert_eq!(shape_key(&keys, x), shape_key(&keys, y), "{x} / {y}");
            assert_eq!(normalize(x), normalize(y), "{x} / {y}");
            assert_eq!(plan::Traits::of(x), plan::Traits::of(y), "{x} / {y}");
        }
        let different = [
            ("select * from t1", "select * from t2"),
            ("select $1, 5", "select $2, 5"),
            ("select \"1\" from t", "select \"2\" from t"),
            ("select \"a 1\" from t", "select \"a 2\" from t"),
            ("select 'x\\' as \"1\" -- 1", "select 'x\\' as \"2\" -- 1"),
            ("select 1 -- note", "select 2 -- note"),
            ("select $$1$$", "select $$2$$"),
            ("select 1", "select 1 "),
            ("select 1", "select 1;"),
        ];
        for (x, y) in different {
            assert_ne!(shape_key(&keys, x), shape_key(&keys, y), "{x} / {y}");
        }
    }

    /// A text's traits come from the cache as from the text, for every text of the cache.
    #[test]
    fn a_cached_text_keeps_its_traits() {
        let s = Stats::default();
        for sql in [
            "BEGIN",
            "set search_path = x",
            "DISCARD ALL",
            "copy t to stdout",
            "select 1",
        ] {
            for _ in 0..2 {
                assert_eq!(s.text(sql).traits, plan::Traits::of(sql), "{sql}");
            }
        }
        let t = plan::Traits::of("BEGIN; SET work_mem = '1MB'");
        assert!(t.may_open_tx && t.leaves_state && !t.copy && !t.clears_prepared);
        assert!(plan::Traits::of("DEALLOCATE ALL").clears_prepared);
        assert!(plan::Traits::of("COPY t FROM STDIN").copy);
        assert_eq!(plan::Traits::of("select 1"), plan::Traits::default());
    }

    #[test]
    fn literals_are_normalized() {
        assert_eq!(
            normalize("SELECT *\n  FROM t1 WHERE id = 42 AND name = 'it''s' AND x = $1"),
            "SELECT * FROM t1 WHERE id = $2 AND name = $3 AND x = $1"
        );
        assert_eq!(normalize("select 1.5"), "select $1");
        assert_eq!(normalize("select 1e3, .5, 0x1F"), "select $1, $2, $3");
    }

    /// C6 (issue 11): no literal of any spelling survives; comments go too.
    #[test]
    fn every_literal_spelling_is_masked() {
        let secret = "s3cr3t";
        let cases: &[(&[u8], &str)] = &[
            (
                b"alter role bob password $$s3cr3t$$",
                "alter role bob password $1",
            ),
            (
                b"ALTER ROLE bob PASSWORD $pw$s3cr3t$pw$",
                "ALTER ROLE bob PASSWORD $1",
            ),
            (b"select E's3cr3t\\n'", "select $1"),
            (b"select E'it\\'s3cr3t'", "select $1"),
            (b"select U&'s3cr3t'", "select $1"),
            (b"select X'5333', B'0101', N's3cr3t'", "select $1, $2, $3"),
            (b"select 's3cr3t' /* s3cr3t */ -- s3cr3t\n", "select $1"),
            (b"select $2, 's3cr3t', $1", "select $2, $3, $1"),
            (
                b"select interval '1 day' + 's3cr3t'",
                "select interval $1 + $2",
            ),
        ];
        for (sql, want) in cases {
            let sql = std::str::from_utf8(sql).unwrap();
            let got = normalize(sql);
            assert_eq!(got, *want, "{sql}");
            assert!(
                !got.contains(secret) && !got.contains("5333"),
                "{sql} -> {got}"
            );
        }
    }

    #[test]
    fn untokenizable_statements_are_masked_whole() {
        for sql in ["select 's3cr3t", "select $$s3cr3t", "select E's3cr3t\\'"] {
            let got = normalize(sql);
            assert_eq!(got, format!("<unparsable: {} bytes>", sql.len()), "{sql}");
        }
    }

    /// A text seen again is normalized from the cache, to the same key; a full cache starts
    /// over and still normalizes every text.
    #[test]
    fn repeated_texts_are_normalized_once() {
        let s = Stats::default();
        let q = vec!["select 1 /* a */".to_string(), "select 'x'".to_string()];
        record(&s, &q, Duration::from_micros(10), 1, false);
        assert_eq!(s.texts.lock().unwrap().len(), 2);
        record(&s, &q, Duration::from_micros(10), 1, false);
        assert_eq!(s.texts.lock().unwrap().len(), 2);
        let snap = s.snapshot();
        assert_eq!(snap.len(), 1);
        assert_eq!(snap[0].0, "select $1");
        assert_eq!(snap[0].1.calls, 2);
        // The cache holds no literal.
        assert!(s
            .texts
            .lock()
            .unwrap()
            .values()
            .all(|t| !t.normalized.contains('x')));

        let full = Stats::default();
        for i in 0..TEXT_CACHE + 10 {
            let q = vec![format!("select {i} from t{i}")];
            record(&full, &q, Duration::from_micros(10), 1, false);
        }
        assert_eq!(full.texts.lock().unwrap().len(), 10);
        let q = vec!["select 'y' from t1".to_string()];
        record(&full, &q, Duration::from_micros(10), 1, false);
        assert!(full
            .snapshot()
            .iter()
            .any(|(k, v)| k == "select $1 from t1" && v.calls == 2));
    }

    #[test]
    fn mean_and_p99() {
        let s = Stats::default();
        let q = vec!["SELECT 1".to_string()];
        for _ in 0..99 {
            record(&s, &q, Duration::from_micros(100), 10, false);
        }
        record(&s, &q, Duration::from_millis(50), 10, true);
        let snap = s.snapshot();
        assert_eq!(snap.len(), 1);
        let (key, st) = &snap[0];
        assert_eq!(key, "SELECT $1");
        assert_eq!((st.calls, st.errors, st.bytes), (100, 1, 1000));
        assert_eq!(st.mean_us(), (99 * 100 + 50_000) / 100);
        assert_eq!(st.p99_us(), 128);
        record(&s, &q, Duration::from_millis(50), 10, false);
        assert_eq!(s.snapshot()[0].1.p99_us(), 65_536);
    }
}
