//! Hits: batches of an open session answered from the store, without the origin.
//!
//! Served from cache, when [`Serve::eligible`] and [`Serve::gate_open`] hold and the store has the row (or a negative
//! entry), are exactly these shapes:
//! - simple: `Query(text)` where text is a point lookup with literal keys;
//! - extended: `[Parse] Bind [Describe portal] Execute Sync` on one portal, the statement a
//!   point lookup, all results in text format, `Execute` unlimited (or a limit >= 2).
//!
//! Answered as PostgreSQL answers them: `[ParseComplete] BindComplete [RowDescription] DataRow*
//! CommandComplete ReadyForQuery(I)` (simple: no Parse/Bind parts, RowDescription always).
//! Cacheable statements (simple, or the same extended shape with an unlimited Execute) are
//! answered from the query-result cache ([`Serve::result`]; keys and framing in `results.rs`).
//! What is not served says why ([`Served`]): a point lookup's miss asks for the fill of its key
//! and waits (`miss.rs`), anything else is forwarded (`forward.rs`), a result's miss marked with
//! its result key. When the fill lands, the batch runs through here again with it in hand
//! (`landed`) and is answered from it exactly as from the store.
//!
//! The cache gate: a session that may read the cache ([`Serve::eligible`]) is served only while
//! its gate is open ([`Serve::gate_open`]): the relay's last reply vouched for its origin state
//! and the applied WAL has reached its fence. The relay asks the origin for those only after a
//! batch that asked for them (`PgRequest::fence`), so any other forwarded batch (a write, a
//! join that is not cacheable) closes the gate, and the session's next statement the cache
//! could answer goes to the origin instead ([`Served::Fence`]) and brings a fresh fence and
//! verdict. Read-your-writes and monotonic reads follow: a cached answer is given only once
//! pgline's applied WAL has reached a fence taken after everything the session did at the
//! origin. A batch that runs nothing (a driver's `Parse Describe Sync` preparing a statement)
//! or only a statement of constants (a health check's `SELECT 1`) leaves the gate as it was
//! (`PgSession::keeps_gate`).
//!
//! [`Serve`] is the part of the core a hit needs (its port, the key-space snapshot, the scratch
//! buffer), borrowed for one batch, as `execute::Exec` is for a RESP command.
//!
//! Invariants: a hit allocates nothing once the statement text is memoized. Thread model: the
//! owning core.

use rustc_hash::FxHashMap;

use crate::keyspace::KeySpace;
use crate::pgwire::{
    compose_bind_complete, compose_parse_complete, compose_ready_for_query,
    compose_select_complete, Bind, Format, Frontend, Oids, Target, TxStatus,
};
use crate::plane::{CorePort, CoreStats, FillResult, ResultKey, RESULTS_TABLE};
use crate::row::{ColumnsView, SECTION_COLUMNS};
use crate::store::Lookup as StoreLookup;

use super::batch::{Framed, SHAPE};
use super::lookup::{
    canonical_param, classify_text, compose_data_row, Class, KeyValue, Lookup, Statement,
};
use super::miss::Landed;
use super::results::{
    build_key, compose_answer, equalities, formats_fit, hash_key, stored_answer, Declared,
    ResultQuery, ResultServed, ResultShape,
};
use super::settings::Settings;
use super::PgSession;

/// Distinct statement texts memoized per session before the memo starts over.
const MEMO_LIMIT: usize = 4096;

/// What serving from cache found.
pub(super) enum Served {
    Hit,
    /// A point lookup the store does not hold (key in the session's key buffer): fill it.
    Miss(u32),
    /// A cacheable statement the store does not hold: forward, marked with its key.
    Result(Box<ResultKey>),
    /// A statement the cache could answer, but the session's gate is closed: forward it and
    /// ask for the fence and the verdict that reopen the gate.
    Fence,
    No,
}

/// What a hit needs of the core, borrowed for one batch.
pub(super) struct Serve<'a> {
    pub port: &'a CorePort,
    pub keyspace: &'a KeySpace,
    pub keyspace_generation: u64,
    pub scratch: &'a mut Vec<u8>,
    /// The session's cache gate for this batch ([`Serve::gate_open`]).
    pub gate: bool,
}

impl Serve<'_> {
    /// Whether this session's statements may be answered from cache at all now: it is idle,
    /// its identity and reported settings allow it, and the cache is current.
    pub(super) fn eligible(&self, pg: &PgSession) -> bool {
        pg.tx_status == b'I' && pg.settings.eligible() && self.port.serve_hits()
    }

    /// The session's cache gate: the relay's last reply vouched for its origin state, under
    /// the current key space generation (see `PgSession::verdict_generation`), and the applied
    /// WAL has reached its fence.
    pub(super) fn gate_open(&self, pg: &PgSession) -> bool {
        pg.settings.origin_state_ok()
            && pg.verdict_generation == self.keyspace_generation
            && self.port.applied_lsn() >= pg.fence
    }

    /// Serves the batch from the store when it is a cached point lookup or cached result;
    /// a point lookup whose fill `landed` is answered from that instead of the store.
    pub(super) fn try_serve(
        &mut self,
        pg: &mut PgSession,
        framed: &Framed<'_>,
        out: &mut Vec<u8>,
        landed: Option<&Landed>,
    ) -> Served {
        if !self.eligible(pg) {
            return Served::No;
        }
        self.gate = self.gate_open(pg);
        if pg.memo_generation != self.keyspace_generation {
            pg.memo.clear();
            pg.memo_generation = self.keyspace_generation;
        }
        match framed.shape {
            [Some(Frontend::Query(text)), None, ..] if framed.count == 1 => {
                let served = self.try_serve_simple(pg, text, out, landed);
                if matches!(served, Served::Hit) {
                    pg.drop_unnamed();
                }
                served
            }
            _ => self.try_serve_extended(pg, framed, out, landed),
        }
    }

    fn try_serve_simple(
        &mut self,
        pg: &mut PgSession,
        text: &[u8],
        out: &mut Vec<u8>,
        landed: Option<&Landed>,
    ) -> Served {
        let lookup = match memo_class(&mut pg.memo, text, self.keyspace) {
            Class::Lookup(l) => l,
            Class::Result(q) => {
                let shape = ResultShape::Simple;
                return self.serve_result(&pg.settings, &mut pg.result_key, &q, shape, out);
            }
            Class::Constant | Class::Other => return Served::No,
        };
        if lookup.datetime && !pg.settings.datetime_ok() {
            return Served::No;
        }
        pg.key_buf.clear();
        if lookup.params != 0 || !literal_key(&lookup, &mut pg.key_buf) {
            return Served::No;
        }
        self.answer(&lookup, &pg.key_buf, out, Prefix::Simple, landed)
    }

    fn try_serve_extended(
        &mut self,
        pg: &mut PgSession,
        framed: &Framed<'_>,
        out: &mut Vec<u8>,
        landed: Option<&Landed>,
    ) -> Served {
        let Some(Extended {
            parse,
            bind,
            describe,
            max_rows,
        }) = extended(framed)
        else {
            return Served::No;
        };
        if max_rows != 0 && max_rows < 2 {
            return Served::No;
        }
        let Some((text, declared)) = statement_of(parse, bind, &pg.statements) else {
            return Served::No;
        };
        let ntypes = declared.len();
        let lookup = match memo_class(&mut pg.memo, text, self.keyspace) {
            Class::Lookup(l) => l,
            Class::Result(q) if max_rows == 0 => {
                let shape = ResultShape::Extended {
                    parse: parse.is_some(),
                    describe,
                    bind,
                    declared,
                };
                let served = self.serve_result(&pg.settings, &mut pg.result_key, &q, shape, out);
                if let (Served::Hit, Some((name, query, oids))) = (&served, parse) {
                    let raw = framed.raw_parse.unwrap_or(&[]);
                    pg.remember_parse(name, query, oids, raw, false);
                }
                return served;
            }
            Class::Result(_) | Class::Constant | Class::Other => return Served::No,
        };
        if lookup.datetime && !pg.settings.datetime_ok() {
            return Served::No;
        }
        if bind.param_count() != lookup.params.max(ntypes) || !servable_formats(bind, &lookup) {
            return Served::No;
        }
        pg.key_buf.clear();
        if !bound_key(&lookup, bind, declared, &mut pg.key_buf) {
            return Served::No;
        }
        let prefix = Prefix::Extended {
            parse: parse.is_some(),
            describe,
            bind,
        };
        let served = self.answer(&lookup, &pg.key_buf, out, prefix, landed);
        if let (Served::Hit, Some((name, query, oids))) = (&served, parse) {
            let raw = framed.raw_parse.unwrap_or(&[]);
            pg.remember_parse(name, query, oids, raw, false);
        }
        served
    }

    /// Reads the row (from the store, or from the fill that `landed` for this key) and
    /// composes the whole answer into `out`.
    fn answer(
        &mut self,
        lookup: &Lookup,
        key: &[u8],
        out: &mut Vec<u8>,
        p: Prefix,
        landed: Option<&Landed>,
    ) -> Served {
        if !self.gate {
            return Served::Fence;
        }
        let format = |i: usize| match p {
            Prefix::Simple => Format::Text,
            Prefix::Extended { bind, .. } => bind.result_format(i),
        };
        self.scratch.clear();
        let filled = landed.filter(|l| l.answers(lookup.table, key));
        let found = match filled.map(|l| &l.result) {
            None => self
                .port
                .store()
                .read(lookup.table, key, SECTION_COLUMNS, self.scratch),
            Some(FillResult::Row(row)) => {
                self.scratch.extend_from_slice(&row.columns);
                StoreLookup::Hit
            }
            Some(FillResult::Absent) => StoreLookup::Negative,
            // The fill could not answer (a race with a write, an origin error): still a miss,
            // which the caller sends to the origin, never to a second fill.
            Some(FillResult::Error(_)) => return Served::Miss(lookup.table),
        };
        let stale = found == StoreLookup::Hit
            && ColumnsView::new(self.scratch).count() != lookup.pg_table.columns.len();
        if found == StoreLookup::Miss || stale {
            return Served::Miss(lookup.table);
        }
        let start = out.len();
        let describe = match p {
            Prefix::Simple => true,
            Prefix::Extended {
                parse, describe, ..
            } => {
                if parse {
                    compose_parse_complete(out);
                }
                compose_bind_complete(out);
                describe
            }
        };
        if describe {
            let at = out.len();
            out.extend_from_slice(&lookup.row_description);
            for (i, &f) in lookup.format_at.iter().enumerate() {
                if format(i) == Format::Binary {
                    out[at + f..at + f + 2].copy_from_slice(&Format::Binary.code().to_be_bytes());
                }
            }
        }
        let rows = if found == StoreLookup::Hit {
            if compose_data_row(lookup, self.scratch, format, out).is_none() {
                // A value without an exact binary form (NaN, escape-format bytea, ...).
                out.truncate(start);
                return Served::No;
            }
            1
        } else {
            0
        };
        compose_select_complete(out, rows);
        compose_ready_for_query(out, TxStatus::Idle);
        if filled.is_none() {
            CoreStats::add(&self.port.stats().keys_hit, 1);
        }
        Served::Hit
    }

    /// A cacheable statement: its stored answer, or the key to forward it under.
    fn serve_result(
        &mut self,
        settings: &Settings,
        result_key: &mut Vec<u8>,
        q: &ResultQuery,
        shape: ResultShape<'_>,
        out: &mut Vec<u8>,
    ) -> Served {
        // Any answer may hold date/time values.
        if !settings.datetime_ok() {
            return Served::No;
        }
        if !self.gate {
            return Served::Fence;
        }
        match self.result(q, shape, result_key, out) {
            ResultServed::Hit => Served::Hit,
            ResultServed::Miss(key) => Served::Result(key),
            ResultServed::No => Served::No,
        }
    }

    /// Serves a cacheable statement from the store, or says how to forward it.
    fn result(
        &mut self,
        q: &ResultQuery,
        shape: ResultShape<'_>,
        key: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> ResultServed {
        if !build_key(q, shape, key) {
            return ResultServed::No;
        }
        let hash = hash_key(key);
        self.scratch.clear();
        let found = self
            .port
            .store()
            .read(RESULTS_TABLE, &hash.to_be_bytes(), 0, self.scratch);
        if found == StoreLookup::Hit {
            if let Some(answer) = stored_answer(self.scratch, key) {
                if !formats_fit(answer, shape) {
                    // The origin's error for a bad format count; nothing is cached.
                    return ResultServed::No;
                }
                compose_answer(answer, shape, out);
                CoreStats::add(&self.port.stats().keys_hit, 1);
                return ResultServed::Hit;
            }
        }
        CoreStats::add(&self.port.stats().keys_miss, 1);
        ResultServed::Miss(Box::new(ResultKey {
            hash,
            key: key.as_slice().into(),
            tables: q.tables.clone(),
            equalities: equalities(q, shape),
        }))
    }
}

/// What precedes the rows in a served answer, and the result formats.
#[derive(Clone, Copy)]
enum Prefix<'a> {
    Simple,
    Extended {
        parse: bool,
        describe: bool,
        bind: &'a Bind<'a>,
    },
}

/// A batch `[Parse] Bind [Describe] Execute Sync` on one portal, in its parts.
struct Extended<'s, 'a> {
    /// The Parse's name, text and declared parameter types.
    parse: Option<(&'a [u8], &'a [u8], Oids<'a>)>,
    bind: &'s Bind<'a>,
    /// A Describe of the portal came before the Execute.
    describe: bool,
    max_rows: i32,
}

/// The parts of `framed` if it is a batch [`Extended`] describes.
fn extended<'s, 'a>(framed: &'s Framed<'a>) -> Option<Extended<'s, 'a>> {
    let mut msgs = framed.shape[..framed.count.min(SHAPE)].iter().flatten();
    let mut next = msgs.next();
    let mut parse = None;
    if let Some(Frontend::Parse {
        name,
        query,
        param_types,
    }) = next
    {
        parse = Some((*name, *query, *param_types));
        next = msgs.next();
    }
    let Some(Frontend::Bind(bind)) = next else {
        return None;
    };
    next = msgs.next();
    let mut describe = false;
    if let Some(Frontend::Describe {
        target: Target::Portal,
        name,
    }) = next
    {
        if *name != bind.portal {
            return None;
        }
        describe = true;
        next = msgs.next();
    }
    let Some(Frontend::Execute { portal, max_rows }) = next else {
        return None;
    };
    if *portal != bind.portal || !matches!(msgs.next(), Some(Frontend::Sync)) {
        return None;
    }
    if msgs.next().is_some() {
        return None;
    }
    Some(Extended {
        parse,
        bind,
        describe,
        max_rows: *max_rows,
    })
}

/// The text and declared parameter types of the statement an [`Extended`] batch binds: its own
/// Parse's, or the session's statement table's. None for a Parse of a name the session holds:
/// PostgreSQL refuses it (42P05) and keeps the old statement, so the relay answers it.
fn statement_of<'x>(
    parse: Option<(&'x [u8], &'x [u8], Oids<'x>)>,
    bind: &Bind<'_>,
    statements: &'x FxHashMap<Box<[u8]>, Statement>,
) -> Option<(&'x [u8], Declared<'x>)> {
    match parse {
        Some((name, query, oids))
            if name == bind.statement && (name.is_empty() || !statements.contains_key(name)) =>
        {
            Some((query, Declared::Wire(oids)))
        }
        Some(_) => None,
        None => statements
            .get(bind.statement)
            .filter(|s| s.known)
            .map(|s| (&s.text[..], Declared::Stored(&s.param_types))),
    }
}

/// Whether a batch is one statement of constants run on its own (a simple Query, or an
/// [`Extended`] batch with no parameter): see [`Class::Constant`]. Memoized with the session's
/// other statement texts; the class does not depend on the key space.
pub(super) fn constant_batch(pg: &mut PgSession, framed: &Framed<'_>, keyspace: &KeySpace) -> bool {
    let text: &[u8] = match framed.shape {
        [Some(Frontend::Query(text)), None, ..] if framed.count == 1 => text,
        _ => {
            let Some(e) = extended(framed) else {
                return false;
            };
            // No parameter at all: a declared one, even unused, is converted at Bind by its
            // type's input function, and a domain's input runs the domain's checks (user code).
            match statement_of(e.parse, e.bind, &pg.statements) {
                Some((text, declared)) if declared.len() == 0 && e.bind.param_count() == 0 => text,
                _ => return false,
            }
        }
    };
    // Only a short SELECT without FROM is classified for this: the memo does not hold the
    // forwarded texts of a session that may not read the cache, so each new one would be
    // parsed here on the core.
    let select = text
        .trim_ascii_start()
        .get(..6)
        .is_some_and(|w| w.eq_ignore_ascii_case(b"select"));
    if text.len() > CONSTANT_TEXT_MAX
        || !select
        || text.windows(4).any(|w| w.eq_ignore_ascii_case(b"from"))
    {
        return false;
    }
    matches!(memo_class(&mut pg.memo, text, keyspace), Class::Constant)
}

/// The longest statement text [`constant_batch`] classifies (health checks are short).
const CONSTANT_TEXT_MAX: usize = 256;

/// The memoized class of `text`, classifying it on first sight.
fn memo_class(memo: &mut FxHashMap<Box<[u8]>, Class>, text: &[u8], keyspace: &KeySpace) -> Class {
    if !memo.contains_key(text) {
        if memo.len() >= MEMO_LIMIT {
            memo.clear();
        }
        memo.insert(text.into(), classify_text(text, keyspace));
    }
    memo.get(text).cloned().unwrap_or(Class::Other)
}

/// The result formats (the protocol's 0/1/N rule) are ones a hit can produce: text, or binary
/// for a column whose type converts exactly (see `binary.rs`).
fn servable_formats(bind: &Bind<'_>, lookup: &Lookup) -> bool {
    let n = bind.result_format_count();
    if n > 1 && n != lookup.columns.len() {
        return false;
    }
    (0..lookup.columns.len())
        .all(|i| bind.result_format(i) == Format::Text || lookup.binary[i].is_some())
}

/// The store key of a lookup whose key values are all literals.
fn literal_key(lookup: &Lookup, key: &mut Vec<u8>) -> bool {
    for (i, (value, _)) in lookup.key.iter().enumerate() {
        let KeyValue::Literal(v) = value else {
            return false;
        };
        if i > 0 {
            key.push(b':');
        }
        key.extend_from_slice(v);
    }
    true
}

/// The store key of a lookup from its literals and the Bind's parameters.
fn bound_key(lookup: &Lookup, bind: &Bind<'_>, declared: Declared<'_>, key: &mut Vec<u8>) -> bool {
    for (i, (value, ty)) in lookup.key.iter().enumerate() {
        if i > 0 {
            key.push(b':');
        }
        match value {
            KeyValue::Literal(v) => key.extend_from_slice(v),
            KeyValue::Param(p) => {
                let Some(Some(v)) = bind.params().nth(*p) else {
                    return false;
                };
                let d = declared.get(*p);
                if canonical_param(v, bind.param_format(*p), d, *ty, key).is_none() {
                    return false;
                }
            }
        }
    }
    true
}
