//! The query-result cache on the core: the key of a cacheable statement's answer, the hit's
//! framing (the origin's stored answer written back) and the [`ResultKey`] a miss forwards. The
//! store read that joins them is `serve.rs`'s `Serve::result`.
//!
//! A statement the classifier marks `Cacheable` (read-only, deterministic, over cached tables)
//! is memoized as a [`ResultQuery`]. Its key is the normalized text, the declared parameter
//! types, each parameter's format code and value, the result format codes and the lifted
//! literals, each length-prefixed; the store holds the answer under
//! [`RESULTS_TABLE`](crate::plane::RESULTS_TABLE) and the key's 64-bit hash, in one section:
//! `key length (u32) | key | RowDescription DataRow* CommandComplete`.
//! A hit compares the full key (a hash collision reads as a miss) and writes the answer:
//! - simple `Query`: the stored bytes, then ReadyForQuery `I`;
//! - extended `[Parse] Bind [Describe portal] Execute Sync`: ParseComplete (if parsed here),
//!   BindComplete, the stored bytes without the RowDescription unless the portal was
//!   described, ReadyForQuery `I`.
//!
//! Binary formats. The stored bytes are the origin's as sent, in the formats the Bind asked
//! for (the RowDescription carries the format codes), so the key holds the formats:
//! - each parameter's format code (the protocol's 0/1/n rule applied per parameter) with its
//!   value's bytes: the same bytes in text and in binary are different keys;
//! - the result formats normalized: no code, one code, or n codes that are all the same are
//!   one form, "every column in format c" (`u c`); n codes that differ are kept as sent
//!   (`p n c1..cn`). n codes mean something only when n is the column count (else the origin
//!   answers `08P01 bind message has n result formats but query has m columns`), so a hit
//!   with n > 1 codes checks n against the stored RowDescription and otherwise goes to the
//!   origin uncached ([`formats_fit`]). A text client and a binary client of one statement
//!   therefore never share an entry.
//!
//! Served only when point lookups would be (`Serve::eligible` and `Serve::gate_open`: idle session, fence
//! reached, hits allowed, plain settings) and, as any answer may hold date/time values, only
//! while the session's DateStyle/IntervalStyle/TimeZone are the server's. `Execute` with a row
//! limit is forwarded uncached.
//!
//! Thread model: the owning core. The key is built in the session's reused buffer; a miss
//! allocates the forwarded [`ResultKey`] (off the hit path).

use std::hash::Hasher;
use std::sync::Arc;

use rustc_hash::FxHasher;

use crate::keyspace::KeySpace;
use crate::pgwire::classify::{CacheableQuery, KeySource};
use crate::pgwire::{compose_bind_complete, compose_parse_complete, compose_ready_for_query};
use crate::pgwire::{Bind, Format, Oids, TxStatus};
use crate::plane::{ResultEquality, ResultKey};

use super::lookup::{canonical_key_type, canonical_literal, canonical_param, NotServed};

/// Where an equality's value comes from.
#[derive(Debug)]
pub(crate) enum EqValue {
    /// Parameter index (0-based), canonicalized for the column's type at miss time; `sole`:
    /// the text uses it nowhere else (see [`equalities`]).
    Param { index: usize, sole: bool },
    /// Canonical text of a literal.
    Literal(Box<[u8]>),
}

/// A memoized cacheable statement.
#[derive(Debug)]
pub(crate) struct ResultQuery {
    pub normalized: Box<[u8]>,
    pub literals: Box<[Box<[u8]>]>,
    /// Parameters the client's text uses.
    pub client_params: usize,
    pub tables: Box<[u32]>,
    /// `(table, column index, column type, value)`, at most one per table.
    pub equalities: Box<[(u32, u16, u32, EqValue)]>,
}

/// The memo entry of a cacheable statement, or why it is not cached (a table that is not a
/// PostgreSQL table, or one under row-level security).
pub(crate) fn result_query(
    q: CacheableQuery,
    keyspace: &KeySpace,
) -> Result<Arc<ResultQuery>, NotServed> {
    let mut tables = Vec::with_capacity(q.tables.len());
    for t in &q.tables {
        let named = || {
            t.schema
                .as_deref()
                .map_or(t.name.clone(), |s| format!("{s}.{}", t.name))
        };
        let table = keyspace
            .pg_table_named(t.schema.as_deref(), &t.name)
            .ok_or_else(|| NotServed::NotPgTable(named()))?;
        // A table under row-level security answers each role differently: never cached.
        if table.row_security {
            return Err(NotServed::RowSecurity(named()));
        }
        tables.push(table.id);
    }
    tables.sort_unstable();
    tables.dedup();
    let mut equalities: Vec<(u32, u16, u32, EqValue)> = Vec::new();
    for e in &q.equalities {
        let Some(t) = e.table.as_ref() else { continue };
        let Some(table) = keyspace.pg_table_named(t.schema.as_deref(), &t.name) else {
            continue;
        };
        if equalities.iter().any(|x| x.0 == table.id) {
            continue;
        }
        let Some(col) = table.columns.iter().position(|c| *c.name == *e.column) else {
            continue;
        };
        let (Ok(idx), ty) = (u16::try_from(col), table.columns[col].type_oid) else {
            continue;
        };
        let value = match &e.value {
            // A parameter's value is only comparable with the WAL's text for these types;
            // otherwise the result is dropped by any change to the table.
            KeySource::Param(n) if *n >= 1 && canonical_key_type(ty) => EqValue::Param {
                index: n - 1,
                sole: occurrences(q.normalized.as_bytes(), *n) == 1,
            },
            KeySource::Param(_) => continue,
            KeySource::Literal(lit) => match canonical_literal(lit.as_bytes(), ty) {
                Some(v) => EqValue::Literal(v.into()),
                None => continue,
            },
        };
        equalities.push((table.id, idx, ty, value));
    }
    Ok(Arc::new(ResultQuery {
        normalized: q.normalized.into_bytes().into(),
        literals: q
            .literals
            .into_iter()
            .map(|l| l.into_bytes().into())
            .collect(),
        client_params: q.client_params,
        tables: tables.into(),
        equalities: equalities.into(),
    }))
}

/// The parameter types a statement was prepared with, borrowed where they are: the Parse of
/// this batch, or the session's statement table. No copy, so no bound on their number.
#[derive(Clone, Copy)]
pub(crate) enum Declared<'a> {
    Wire(Oids<'a>),
    Stored(&'a [u32]),
}

impl Declared<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Declared::Wire(o) => o.len(),
            Declared::Stored(s) => s.len(),
        }
    }

    /// The type of parameter `i` (0: not declared, the origin infers it).
    pub(crate) fn get(&self, i: usize) -> u32 {
        match self {
            Declared::Wire(o) => o.iter().nth(i).unwrap_or(0),
            Declared::Stored(s) => s.get(i).copied().unwrap_or(0),
        }
    }

    fn for_each(&self, mut f: impl FnMut(u32)) {
        match self {
            Declared::Wire(o) => o.iter().for_each(f),
            Declared::Stored(s) => s.iter().for_each(|&t| f(t)),
        }
    }
}

/// How many times parameter `$n` appears in `text` as a whole token (`$1` is not in `$10`).
fn occurrences(text: &[u8], n: usize) -> usize {
    let mut digits = [0u8; 20];
    let mut len = 0;
    let mut v = n;
    loop {
        digits[len] = b'0' + (v % 10) as u8;
        len += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    digits[..len].reverse();
    let digits = &digits[..len];
    (0..text.len())
        .filter(|&i| {
            text[i] == b'$'
                && text[i + 1..].starts_with(digits)
                && !text.get(i + 1 + len).is_some_and(|c| c.is_ascii_digit())
        })
        .count()
}

/// How the answer is framed for the client.
#[derive(Clone, Copy)]
pub(crate) enum ResultShape<'a> {
    Simple,
    Extended {
        parse: bool,
        describe: bool,
        bind: &'a Bind<'a>,
        declared: Declared<'a>,
    },
}

/// What serving a result found.
pub(crate) enum ResultServed {
    Hit,
    /// Forward, marked cacheable under this key.
    Miss(Box<ResultKey>),
    /// Forward, not cacheable.
    No,
}

fn push_field(key: &mut Vec<u8>, value: Option<&[u8]>) {
    match value {
        Some(v) => {
            key.extend_from_slice(&(v.len() as u32).to_be_bytes());
            key.extend_from_slice(v);
        }
        None => key.extend_from_slice(&u32::MAX.to_be_bytes()),
    }
}

/// Builds the key into `key`; false if the batch cannot be cached.
pub(super) fn build_key(q: &ResultQuery, shape: ResultShape<'_>, key: &mut Vec<u8>) -> bool {
    key.clear();
    key.extend_from_slice(&q.normalized);
    key.push(0);
    match shape {
        ResultShape::Simple => {
            if q.client_params != 0 {
                return false;
            }
            key.extend_from_slice(&0u32.to_be_bytes());
        }
        ResultShape::Extended { bind, declared, .. } => {
            if bind.param_count() < q.client_params {
                return false;
            }
            key.extend_from_slice(&(declared.len() as u32).to_be_bytes());
            declared.for_each(|t| key.extend_from_slice(&t.to_be_bytes()));
            key.extend_from_slice(&(bind.param_count() as u32).to_be_bytes());
            for (i, p) in bind.params().enumerate() {
                key.push(bind.param_format(i).code() as u8);
                push_field(key, p);
            }
            push_result_formats(bind, key);
        }
    }
    for l in q.literals.iter() {
        push_field(key, Some(l));
    }
    true
}

/// The result formats in their normalized form (module doc): `u c` when every column is in
/// format `c` (no code, one code, or n equal codes), else `p n c1..cn`.
fn push_result_formats(bind: &Bind<'_>, key: &mut Vec<u8>) {
    let n = bind.result_format_count();
    let first = bind.result_format(0);
    if (1..n).all(|i| bind.result_format(i) == first) {
        key.push(b'u');
        key.push(first.code() as u8);
    } else {
        key.push(b'p');
        key.extend_from_slice(&(n as u32).to_be_bytes());
        key.extend((0..n).map(|i| bind.result_format(i).code() as u8));
    }
}

/// Whether the stored `answer` may answer this batch's result formats: n > 1 codes must be
/// one per column of its RowDescription (the origin refuses any other count).
pub(super) fn formats_fit(answer: &[u8], shape: ResultShape<'_>) -> bool {
    let ResultShape::Extended { bind, .. } = shape else {
        return true;
    };
    let n = bind.result_format_count();
    if n <= 1 {
        return true;
    }
    match answer {
        [b'T', _, _, _, _, hi, lo, ..] => usize::from(u16::from_be_bytes([*hi, *lo])) == n,
        _ => false,
    }
}

pub(super) fn hash_key(key: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    h.write(key);
    h.write_usize(key.len());
    h.finish()
}

/// The answer of an entry whose key is `key`.
pub(super) fn stored_answer<'a>(entry: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    let len = u32::from_be_bytes(entry.get(..4)?.try_into().ok()?) as usize;
    let stored = entry.get(4..4 + len)?;
    (stored == key).then(|| &entry[4 + len..])
}

/// Writes the stored answer framed for the client's batch.
pub(super) fn compose_answer(answer: &[u8], shape: ResultShape<'_>, out: &mut Vec<u8>) {
    let mut body = answer;
    if let ResultShape::Extended {
        parse, describe, ..
    } = shape
    {
        if parse {
            compose_parse_complete(out);
        }
        compose_bind_complete(out);
        if !describe && body.first() == Some(&b'T') {
            let len = body
                .get(1..5)
                .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
            body = body.get(1 + len..).unwrap_or(&[]);
        }
    }
    out.extend_from_slice(body);
    compose_ready_for_query(out, TxStatus::Idle);
}

/// The equalities with their values for this batch (canonical text of the column's type).
pub(super) fn equalities(q: &ResultQuery, shape: ResultShape<'_>) -> Box<[ResultEquality]> {
    let mut out = Vec::with_capacity(q.equalities.len());
    for (table, col, ty, value) in q.equalities.iter() {
        let text = match (value, shape) {
            (EqValue::Literal(v), _) => v.to_vec(),
            (EqValue::Param { index: p, sole }, ResultShape::Extended { bind, declared, .. }) => {
                let Some(Some(v)) = bind.params().nth(*p) else {
                    continue;
                };
                let d = declared.get(*p);
                // A binary value is read as the column's type when no type was declared: true
                // only if the equality alone gave the parameter its type. Used elsewhere in
                // the text (`$1::float8 > 0 AND id = $1`), it may have another type of the
                // same width; the answer is then dropped by any change to the table instead.
                if bind.param_format(*p) == Format::Binary && d == 0 && !sole {
                    continue;
                }
                let mut canon = Vec::new();
                if canonical_param(v, bind.param_format(*p), d, *ty, &mut canon).is_none() {
                    continue;
                }
                canon
            }
            (EqValue::Param { .. }, ResultShape::Simple) => continue,
        };
        out.push((*table, *col, text.into()));
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_answer_needs_its_whole_key() {
        let mut entry = 3u32.to_be_bytes().to_vec();
        entry.extend_from_slice(b"abcT");
        assert_eq!(stored_answer(&entry, b"abc"), Some(&b"T"[..]));
        assert_eq!(stored_answer(&entry, b"abd"), None);
        assert_eq!(stored_answer(&entry[..5], b"abc"), None);
    }

    #[test]
    fn parameters_are_counted_as_whole_tokens() {
        let text = b"SELECT $1, $10 FROM t WHERE a = $1 AND b = $2";
        assert_eq!(occurrences(text, 1), 2);
        assert_eq!(occurrences(text, 10), 1);
        assert_eq!(occurrences(text, 2), 1);
        assert_eq!(occurrences(text, 3), 0);
    }

    #[test]
    fn keys_separate_values_and_nulls() {
        let q = ResultQuery {
            normalized: b"SELECT 1 FROM t WHERE a = $1".to_vec().into(),
            literals: vec![b"'x'".to_vec().into()].into(),
            client_params: 0,
            tables: vec![1].into(),
            equalities: Vec::new().into(),
        };
        let mut a = Vec::new();
        assert!(build_key(&q, ResultShape::Simple, &mut a));
        let mut q2 = q;
        q2.literals = vec![b"'y'".to_vec().into()].into();
        let mut b = Vec::new();
        assert!(build_key(&q2, ResultShape::Simple, &mut b));
        assert_ne!(a, b);
        assert_ne!(hash_key(&a), hash_key(&b));
        let mut k = Vec::new();
        push_field(&mut k, None);
        let mut e = Vec::new();
        push_field(&mut e, Some(b""));
        assert_ne!(k, e);
    }
}
