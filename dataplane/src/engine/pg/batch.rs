//! Batches of an open PostgreSQL session: framing (up to Sync, or one Query), the decision
//! "cached point lookup or forward", the hit's answer, and the forwarded [`PgRequest`].
//!
//! Served from cache, when [`Worker::pg_may_serve`] holds and the store has the row (or a
//! negative entry), are exactly these shapes:
//! - simple: `Query(text)` where text is a point lookup with literal keys;
//! - extended: `[Parse] Bind [Describe portal] Execute Sync` on one portal, the statement a
//!   point lookup, all results in text format, `Execute` unlimited (or a limit >= 2).
//!
//! Answered as PostgreSQL answers them: `[ParseComplete] BindComplete [RowDescription] DataRow*
//! CommandComplete ReadyForQuery(I)` (simple: no Parse/Bind parts, RowDescription always).
//! Cacheable statements (simple, or the same extended shape with an unlimited Execute) are
//! answered from the query-result cache (`results.rs`); a miss is forwarded marked with its
//! result key.
//!
//! Everything else is forwarded as it came, preceded by the Parse of any statement it names
//! that the control plane has not seen (parsed in a batch served here). A store miss is
//! forwarded too, and a [`MissRequest`] for the key is pushed so the next lookup hits.
//!
//! Invariants: a hit allocates nothing once the statement text is memoized. Thread model: the
//! owning core.
//!
//! [`PgRequest`]: crate::plane::PgRequest

use crate::pgwire::{
    compose_bind_complete, compose_parse_complete, compose_ready_for_query,
    compose_select_complete, parse_frontend, sqlstate, Bind, Format, Frontend, Oids, ParseError,
    Target, TxStatus,
};
use crate::plane::{ConnToken, PgRequestKind, ResultKey};
use crate::row::{ColumnsView, SECTION_COLUMNS};
use crate::store::Lookup as StoreLookup;
use rustc_hash::FxHashMap;

use super::lookup::{canonical_param, classify_text, compose_data_row, Class, KeyValue, Lookup};
use super::results::{ResultQuery, ResultServed, ResultShape};
use super::{pg_fatal, pg_protocol_error, PgSession, Statement, Step};
use crate::engine::conn::Conn;
use crate::engine::session::Worker;

/// Messages of a batch kept for shape matching (a served batch has at most five).
const SHAPE: usize = 5;
/// Distinct statement texts memoized per session before the memo starts over.
const MEMO_LIMIT: usize = 4096;

/// Where a batch ends and what it looks like.
struct Framed<'a> {
    /// Bytes of the batch, terminator included.
    end: usize,
    /// Messages in the batch.
    count: usize,
    shape: [Option<Frontend<'a>>; SHAPE],
    /// The raw bytes of the first message when it is a Parse.
    raw_parse: Option<&'a [u8]>,
}

// A stack value used once per batch: boxing the large variant would allocate on the hit path.
#[allow(clippy::large_enum_variant)]
enum Frame<'a> {
    Batch(Framed<'a>),
    Incomplete,
    Terminate,
    Bad(&'static [u8], &'static [u8; 5]),
}

/// Frames the batch at the start of `input`.
fn frame<'a>(input: &'a [u8], worker: &Worker) -> Frame<'a> {
    let mut at = 0;
    let mut shape = [None; SHAPE];
    let mut count = 0;
    let mut raw_parse = None;
    loop {
        let (msg, n) = match parse_frontend(&input[at..], &worker.pg_limits) {
            Ok(v) => v,
            Err(ParseError::Incomplete) => {
                if input.len() >= worker.cfg.max_request_bytes {
                    return Frame::Bad(
                        b"batch exceeds the size limit",
                        sqlstate::PROTOCOL_VIOLATION,
                    );
                }
                return Frame::Incomplete;
            }
            Err(ParseError::Invalid(kind)) => {
                return Frame::Bad(kind.message().as_bytes(), sqlstate::PROTOCOL_VIOLATION)
            }
        };
        match msg {
            Frontend::Terminate => return Frame::Terminate,
            Frontend::Password(_) => {
                return Frame::Bad(b"unexpected password message", sqlstate::PROTOCOL_VIOLATION)
            }
            Frontend::Unsupported(_) => {
                return Frame::Bad(
                    b"COPY and FunctionCall are not supported by pgline",
                    sqlstate::FEATURE_NOT_SUPPORTED,
                )
            }
            _ => {}
        }
        if count == 0 && matches!(msg, Frontend::Parse { .. }) {
            raw_parse = Some(&input[..n]);
        }
        if let Some(slot) = shape.get_mut(count) {
            *slot = Some(msg);
        }
        count += 1;
        at += n;
        if matches!(msg, Frontend::Sync | Frontend::Query(_)) {
            return Frame::Batch(Framed {
                end: at,
                count,
                shape,
                raw_parse,
            });
        }
    }
}

/// What serving from cache found.
enum Served {
    Hit,
    /// A point lookup the store does not hold: forward, and fill this key.
    Miss(u32),
    /// A cacheable statement the store does not hold: forward, marked with its key.
    Result(Box<ResultKey>),
    No,
}

impl Worker {
    /// One batch of an open session.
    pub(crate) fn pg_batch(&mut self, conn: &mut Conn, token: ConnToken) -> Step {
        let Conn {
            rbuf,
            rpos,
            wbuf,
            pg,
            ..
        } = conn;
        let input = &rbuf[*rpos..];
        let framed = match frame(input, self) {
            Frame::Batch(f) => f,
            Frame::Incomplete => return Step::Incomplete,
            Frame::Terminate => {
                conn.closing = true;
                conn.rpos = conn.rbuf.len();
                return Step::Done;
            }
            Frame::Bad(message, code) => {
                if code == sqlstate::PROTOCOL_VIOLATION {
                    pg_protocol_error(conn, message, self.stats());
                } else {
                    pg_fatal(conn, code, message, self.stats());
                }
                return Step::Done;
            }
        };
        let end = framed.end;
        let served = match pg.as_deref_mut() {
            Some(pg) => self.pg_try_serve(pg, &framed, wbuf),
            None => Served::No,
        };
        if let Served::Hit = served {
            conn.rpos += end;
            return Step::Done;
        }
        let messages = self.pg_forward_messages(conn, end);
        let (served, cache) = match served {
            Served::Result(key) => (Served::No, Some(key)),
            other => (other, None),
        };
        if !self.push_pg(conn, token, PgRequestKind::Batch, messages, cache) {
            return Step::Retry;
        }
        self.pg_note_statements(conn, end);
        conn.rpos += end;
        if let Served::Miss(table) = served {
            self.pg_push_fill(conn, token, table);
        }
        Step::Done
    }

    /// Serves the batch from the store when it is a cached point lookup.
    fn pg_try_serve(
        &mut self,
        pg: &mut PgSession,
        framed: &Framed<'_>,
        out: &mut Vec<u8>,
    ) -> Served {
        if !self.pg_may_serve(pg) {
            return Served::No;
        }
        if pg.memo_generation != self.keyspace_generation {
            pg.memo.clear();
            pg.memo_generation = self.keyspace_generation;
        }
        match framed.shape {
            [Some(Frontend::Query(text)), None, ..] if framed.count == 1 => {
                let lookup = match memo_class(&mut pg.memo, text, &self.keyspace) {
                    Class::Lookup(l) => l,
                    Class::Result(q) => {
                        return self.pg_serve_result(pg, &q, ResultShape::Simple, out)
                    }
                    Class::Other => return Served::No,
                };
                if lookup.datetime && !pg.settings.datetime_ok() {
                    return Served::No;
                }
                pg.key_buf.clear();
                if lookup.params != 0 || !literal_key(&lookup, &mut pg.key_buf) {
                    return Served::No;
                }
                self.pg_answer(&lookup, &pg.key_buf, out, Prefix::Simple)
            }
            _ => self.pg_try_serve_extended(pg, framed, out),
        }
    }

    fn pg_try_serve_extended(
        &mut self,
        pg: &mut PgSession,
        framed: &Framed<'_>,
        out: &mut Vec<u8>,
    ) -> Served {
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
            return Served::No;
        };
        next = msgs.next();
        let mut describe = false;
        if let Some(Frontend::Describe {
            target: Target::Portal,
            name,
        }) = next
        {
            if *name != bind.portal {
                return Served::No;
            }
            describe = true;
            next = msgs.next();
        }
        let Some(Frontend::Execute { portal, max_rows }) = next else {
            return Served::No;
        };
        if *portal != bind.portal || (*max_rows != 0 && *max_rows < 2) {
            return Served::No;
        }
        if !matches!(msgs.next(), Some(Frontend::Sync)) || msgs.next().is_some() {
            return Served::No;
        }
        let mut types = [0u32; 8];
        let (text, ntypes): (&[u8], usize) = match parse {
            Some((name, query, oids)) if name == bind.statement => {
                (query, copy_types(oids.iter(), &mut types))
            }
            Some(_) => return Served::No,
            None => match pg.statements.get(bind.statement) {
                Some(s) => (
                    &s.text[..],
                    copy_types(s.param_types.iter().copied(), &mut types),
                ),
                None => return Served::No,
            },
        };
        if ntypes > types.len() {
            return Served::No;
        }
        let lookup = match memo_class(&mut pg.memo, text, &self.keyspace) {
            Class::Lookup(l) => l,
            Class::Result(q) if *max_rows == 0 => {
                let shape = ResultShape::Extended {
                    parse: parse.is_some(),
                    describe,
                    bind,
                    declared: &types[..ntypes],
                };
                let served = self.pg_serve_result(pg, &q, shape, out);
                if let (Served::Hit, Some((name, query, oids))) = (&served, parse) {
                    let raw = framed.raw_parse.unwrap_or(&[]);
                    remember_parse(pg, name, query, oids, raw, false);
                }
                return served;
            }
            Class::Result(_) | Class::Other => return Served::No,
        };
        if lookup.datetime && !pg.settings.datetime_ok() {
            return Served::No;
        }
        if bind.param_count() != lookup.params.max(ntypes) || !servable_formats(bind, &lookup) {
            return Served::No;
        }
        pg.key_buf.clear();
        if !bound_key(&lookup, bind, &types[..ntypes], &mut pg.key_buf) {
            return Served::No;
        }
        let prefix = Prefix::Extended {
            parse: parse.is_some(),
            describe,
            bind,
        };
        let served = self.pg_answer(&lookup, &pg.key_buf, out, prefix);
        if let (Served::Hit, Some((name, query, oids))) = (&served, parse) {
            let raw = framed.raw_parse.unwrap_or(&[]);
            remember_parse(pg, name, query, oids, raw, false);
        }
        served
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

impl Worker {
    /// Reads the row and composes the whole answer into `out`.
    fn pg_answer(&mut self, lookup: &Lookup, key: &[u8], out: &mut Vec<u8>, p: Prefix) -> Served {
        let format = |i: usize| match p {
            Prefix::Simple => Format::Text,
            Prefix::Extended { bind, .. } => bind.result_format(i),
        };
        self.scratch.clear();
        let found = self
            .port
            .store()
            .read(lookup.table, key, SECTION_COLUMNS, &mut self.scratch);
        let stale = found == StoreLookup::Hit
            && ColumnsView::new(&self.scratch).count() != lookup.pg_table.columns.len();
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
            if compose_data_row(lookup, &self.scratch, format, out).is_none() {
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
        crate::plane::CoreStats::add(&self.stats().keys_hit, 1);
        Served::Hit
    }
}

/// The memoized class of `text`, classifying it on first sight.
fn memo_class(
    memo: &mut FxHashMap<Box<[u8]>, Class>,
    text: &[u8],
    keyspace: &crate::keyspace::KeySpace,
) -> Class {
    if !memo.contains_key(text) {
        if memo.len() >= MEMO_LIMIT {
            memo.clear();
        }
        memo.insert(text.into(), classify_text(text, keyspace));
    }
    memo.get(text).cloned().unwrap_or(Class::Other)
}

impl Worker {
    /// A cacheable statement: its stored answer, or the key to forward it under.
    fn pg_serve_result(
        &mut self,
        pg: &mut PgSession,
        q: &ResultQuery,
        shape: ResultShape<'_>,
        out: &mut Vec<u8>,
    ) -> Served {
        // Any answer may hold date/time values.
        if !pg.settings.datetime_ok() {
            return Served::No;
        }
        match self.pg_result(q, shape, &mut pg.result_key, out) {
            ResultServed::Hit => Served::Hit,
            ResultServed::Miss(key) => Served::Result(key),
            ResultServed::No => Served::No,
        }
    }
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
fn bound_key(lookup: &Lookup, bind: &Bind<'_>, declared: &[u32], key: &mut Vec<u8>) -> bool {
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
                let d = declared.get(*p).copied().unwrap_or(0);
                if canonical_param(v, bind.param_format(*p), d, *ty, key).is_none() {
                    return false;
                }
            }
        }
    }
    true
}

/// Copies declared parameter types into `types`; returns how many there are (more than
/// `types.len()` when they did not fit).
fn copy_types(declared: impl Iterator<Item = u32>, types: &mut [u32; 8]) -> usize {
    let mut n = 0;
    for t in declared {
        if let Some(slot) = types.get_mut(n) {
            *slot = t;
        }
        n += 1;
    }
    n
}

/// Records a Parse (`raw`: the whole message) in the statement table; `relay_knows`: it is
/// being forwarded. No allocation when the statement is already there as is.
pub(super) fn remember_parse(
    pg: &mut PgSession,
    name: &[u8],
    query: &[u8],
    oids: Oids<'_>,
    raw: &[u8],
    relay_knows: bool,
) {
    if let Some(s) = pg.statements.get_mut(name) {
        if *s.text == *query && s.param_types.iter().copied().eq(oids.iter()) {
            s.relay_knows |= relay_knows;
            return;
        }
    }
    pg.statements.insert(
        name.into(),
        Statement {
            text: query.into(),
            param_types: oids.iter().collect(),
            parse: raw.into(),
            relay_knows,
        },
    );
}
