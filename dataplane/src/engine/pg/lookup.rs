//! Cached point lookups of the PostgreSQL front: the per-session classification memo, the
//! store key of a lookup, and the answer composed from the store's columns section.
//!
//! A statement text is classified once per session and key space generation
//! ([`crate::pgwire::classify::classify`] with the [`KeySpace`] as its catalog); a point lookup
//! is kept as a [`Lookup`]: the table, the projected column indexes, where each key value comes
//! from, and the RowDescription (text format) pre-composed, so a hit only reads the store and
//! writes DataRow, CommandComplete and ReadyForQuery. Only key columns of type int2/int4/int8
//! (canonical decimal), text/varchar (any text) and uuid (canonical lower-case hyphenated) are
//! served; anything else is forwarded.
//!
//! Invariants: the hit path allocates nothing (the store read goes to the worker's scratch
//! buffer, the key to the session's reused key buffer). Thread model: the owning core only.

use std::sync::Arc;

use crate::keyspace::{KeySpace, PgTable};
use crate::pgwire::classify::{
    classify, is_constant_select, Classification, KeySource, PassReason, PointLookup, Projection,
};
use crate::pgwire::{compose_row_description, FieldDescription, Format};
use crate::row::ColumnsView;

use super::binary::{compose_binary_value, BinaryKind};
use super::settings::is_datetime;

const INT2: u32 = 21;
const INT4: u32 = 23;
const INT8: u32 = 20;
const TEXT: u32 = 25;
const VARCHAR: u32 = 1043;
const UUID: u32 = 2950;
const UNKNOWN: u32 = 705;

/// What the memo knows of a statement text.
#[derive(Clone, Debug)]
pub(crate) enum Class {
    Lookup(Arc<Lookup>),
    /// A cacheable read-only statement (see `results.rs`).
    Result(Arc<super::results::ResultQuery>),
    /// One SELECT of constants ([`is_constant_select`]): not served, but it leaves its
    /// backend's session state as it was (`PgRequest::state_free`).
    Constant,
    Other,
}

/// Where one key value comes from.
#[derive(Clone, Debug)]
pub(crate) enum KeyValue {
    /// Parameter index (0-based).
    Param(usize),
    /// Canonical pk text of a literal.
    Literal(Box<[u8]>),
}

/// A point lookup the core can answer.
#[derive(Debug)]
pub(crate) struct Lookup {
    pub table: u32,
    /// Indexes into the table's columns, in output order.
    pub columns: Box<[usize]>,
    /// One per key column, in key order, with that column's type OID.
    pub key: Box<[(KeyValue, u32)]>,
    /// RowDescription for text results.
    pub row_description: Box<[u8]>,
    /// Offset in `row_description` of each column's format code (patched for binary).
    pub format_at: Box<[usize]>,
    /// Per projected column, how to make its binary form (`None`: never served in binary).
    pub binary: Box<[Option<BinaryKind>]>,
    /// A projected column's text depends on DateStyle/IntervalStyle/TimeZone.
    pub datetime: bool,
    /// Parameters the statement text uses (`$n` highest).
    pub params: usize,
    pub pg_table: Arc<PgTable>,
}

/// One of the client's prepared statements.
#[derive(Debug)]
pub(crate) struct Statement {
    pub text: Box<[u8]>,
    pub param_types: Box<[u32]>,
    /// The client's Parse message, to replay to the control plane if it has not seen it.
    pub parse: Box<[u8]>,
    /// The control plane has seen a Parse for this statement under this name.
    pub relay_knows: bool,
    /// The core knows `text` is what the origin holds under this name. False after a Parse
    /// reused the name: PostgreSQL refuses that (42P05) and keeps the old statement, unless
    /// the name's first Parse had failed there too, and the core does not see which. False for
    /// an unnamed statement parsed in a forwarded batch (it may have failed or been skipped).
    /// Such a statement is never answered from cache; a named one still counts against the
    /// session's bound.
    pub known: bool,
}

/// Classifies `text` against `keyspace` (allocates; once per distinct text).
pub(crate) fn classify_text(text: &[u8], keyspace: &KeySpace) -> Class {
    let Ok(sql) = std::str::from_utf8(text) else {
        return Class::Other;
    };
    match classify(sql, keyspace) {
        Classification::PointLookup(p) => lookup(p, keyspace).map_or(Class::Other, Class::Lookup),
        Classification::Cacheable(q) => {
            super::results::result_query(q, keyspace).map_or(Class::Other, Class::Result)
        }
        Classification::PassThrough(PassReason::NoTable) if is_constant_select(sql) => {
            Class::Constant
        }
        Classification::PassThrough(_) => Class::Other,
    }
}

/// Why the PostgreSQL front forwards a statement text to the origin: the classifier's reason,
/// or one of the checks the core makes on its classification ([`serve_class`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotServed {
    /// The classifier's reason ([`PassReason`]).
    Pass(PassReason),
    /// A table under row-level security (enabled or forced): each role sees other rows.
    RowSecurity(String),
    /// A table the classifier accepted that the key space has no PostgreSQL description of.
    NotPgTable(String),
    /// A projected column the table does not have.
    UnknownColumn(String),
    /// The key columns equated are not the table's key (or the table has none).
    PartialKey,
    /// A key column of a type lookups are not served on (only int2/int4/int8, text, varchar,
    /// uuid are).
    KeyType { column: String, type_oid: u32 },
    /// A literal key value the key column's type cannot hold as the origin prints it (out of
    /// range, not an integer, not a uuid).
    KeyLiteral,
    /// A `$0` parameter.
    BadParameter,
}

/// How the PostgreSQL front serves a statement text, with the same classification and checks
/// as the core's memo ([`classify_text`]): for tools that ask "would pgline serve this?"
/// (`pgline advise`). Only the statement's text is judged: the session's conditions (user and
/// database, idle, settings, fence, result formats) are not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServeClass {
    /// A point lookup answered from the store.
    Lookup {
        /// `schema.table`.
        table: String,
        /// Projected columns without an exact binary form: a client asking for binary results
        /// (tokio-postgres, pgx, JDBC in binary mode) gets these lookups from the origin.
        text_only: Vec<String>,
    },
    /// A read answered from the query-result cache.
    Result {
        /// `schema.table` of each table read.
        tables: Vec<String>,
        /// `schema.table.column` of the equality that narrows invalidation, if any.
        equalities: Vec<String>,
    },
    /// Forwarded to the origin.
    Pass(NotServed),
}

/// Classifies `sql` as the core does (see [`ServeClass`]); allocates, never panics.
pub fn serve_class(sql: &str, keyspace: &KeySpace) -> ServeClass {
    let qualified = |t: &PgTable| format!("{}.{}", t.schema, t.name);
    match classify(sql, keyspace) {
        Classification::PointLookup(p) => match lookup(p, keyspace) {
            Ok(l) => ServeClass::Lookup {
                table: qualified(&l.pg_table),
                text_only: l
                    .columns
                    .iter()
                    .zip(l.binary.iter())
                    .filter(|(_, b)| b.is_none())
                    .map(|(&i, _)| l.pg_table.columns[i].name.to_string())
                    .collect(),
            },
            Err(why) => ServeClass::Pass(why),
        },
        Classification::Cacheable(q) => match super::results::result_query(q, keyspace) {
            Ok(r) => {
                let table = |id: &u32| keyspace.pg_table(*id);
                ServeClass::Result {
                    tables: r
                        .tables
                        .iter()
                        .filter_map(table)
                        .map(|t| qualified(t))
                        .collect(),
                    equalities: r
                        .equalities
                        .iter()
                        .filter_map(|(id, col, _, _)| {
                            let t = keyspace.pg_table(*id)?;
                            let c = t.columns.get(usize::from(*col))?;
                            Some(format!("{}.{}", qualified(t), c.name))
                        })
                        .collect(),
                }
            }
            Err(why) => ServeClass::Pass(why),
        },
        Classification::PassThrough(r) => ServeClass::Pass(NotServed::Pass(r)),
    }
}

/// The memo entry of a point lookup, or why the core does not serve it.
fn lookup(p: PointLookup, keyspace: &KeySpace) -> Result<Arc<Lookup>, NotServed> {
    let named = || {
        p.table
            .schema
            .as_deref()
            .map_or(p.table.name.clone(), |s| format!("{s}.{}", p.table.name))
    };
    let table = keyspace
        .pg_table_named(p.table.schema.as_deref(), &p.table.name)
        .ok_or_else(|| NotServed::NotPgTable(named()))?;
    // A table under row-level security answers each role differently: always the origin's.
    if table.row_security {
        return Err(NotServed::RowSecurity(named()));
    }
    let columns: Vec<usize> = match &p.columns {
        Projection::All => (0..table.columns.len()).collect(),
        Projection::Columns(names) => names
            .iter()
            .map(|n| {
                table
                    .columns
                    .iter()
                    .position(|c| &*c.name == n.as_str())
                    .ok_or_else(|| NotServed::UnknownColumn(n.clone()))
            })
            .collect::<Result<_, _>>()?,
    };
    if p.key.len() != table.key_columns.len() || p.key.is_empty() {
        return Err(NotServed::PartialKey);
    }
    let mut key = Vec::with_capacity(p.key.len());
    let mut params = 0;
    for (source, &col) in p.key.iter().zip(table.key_columns.iter()) {
        let column = table.columns.get(col).ok_or(NotServed::PartialKey)?;
        let ty = column.type_oid;
        if !canonical_key_type(ty) {
            return Err(NotServed::KeyType {
                column: column.name.to_string(),
                type_oid: ty,
            });
        }
        let value = match source {
            KeySource::Param(n) if *n >= 1 => {
                params = params.max(*n);
                KeyValue::Param(n - 1)
            }
            KeySource::Param(_) => return Err(NotServed::BadParameter),
            KeySource::Literal(lit) => match canonical_literal(lit.as_bytes(), ty) {
                Some(v) => KeyValue::Literal(v.into()),
                None => return Err(NotServed::KeyLiteral),
            },
        };
        key.push((value, ty));
    }
    let fields: Vec<FieldDescription<'_>> = columns
        .iter()
        .map(|&i| {
            let c = &table.columns[i];
            FieldDescription {
                name: c.name.as_bytes(),
                table_oid: table.id,
                column_id: c.attnum,
                type_oid: c.type_oid,
                type_size: c.typlen,
                type_modifier: c.typmod,
                format: Format::Text,
            }
        })
        .collect();
    let mut row_description = Vec::new();
    compose_row_description(&mut row_description, &fields);
    let mut format_at = Vec::with_capacity(fields.len());
    let mut at = 7;
    for f in &fields {
        // name, NUL, table oid (4), attnum (2), type oid (4), size (2), typmod (4), format.
        at += f.name.len() + 1 + 16;
        format_at.push(at);
        at += 2;
    }
    let binary = columns
        .iter()
        .map(|&i| BinaryKind::of(table.columns[i].type_oid))
        .collect();
    let datetime = columns
        .iter()
        .any(|&i| is_datetime(table.columns[i].type_oid));
    Ok(Arc::new(Lookup {
        table: table.id,
        columns: columns.into(),
        key: key.into(),
        row_description: row_description.into(),
        format_at: format_at.into(),
        binary,
        datetime,
        params,
        pg_table: table.clone(),
    }))
}

/// Key types whose canonical text ([`canonical_literal`], [`canonical_param`]) is the text the
/// origin prints, and so what a WAL tuple carries. Other types (bool, numeric, date, bpchar,
/// ...) print a value differently from how a client may spell it (`true` vs `t`).
pub(crate) fn canonical_key_type(ty: u32) -> bool {
    matches!(ty, INT2 | INT4 | INT8 | TEXT | VARCHAR | UUID)
}

/// The canonical pk text of a literal as the classifier wrote it, for a key of type `ty`.
pub(crate) fn canonical_literal(lit: &[u8], ty: u32) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match ty {
        INT2 | INT4 | INT8 => {
            let inner = unquote(lit).unwrap_or(lit.to_vec());
            canonical_int(&inner, ty, &mut out)?;
        }
        TEXT | VARCHAR => out = unquote(lit)?,
        UUID => canonical_uuid_text(&unquote(lit)?, &mut out)?,
        _ => return None,
    }
    Some(out)
}

/// `'it''s'` -> `it's`; `None` if not a plain single-quoted literal.
fn unquote(lit: &[u8]) -> Option<Vec<u8>> {
    let inner = lit.strip_prefix(b"'")?.strip_suffix(b"'")?;
    let mut out = Vec::with_capacity(inner.len());
    let mut i = 0;
    while i < inner.len() {
        if inner[i] == b'\'' {
            if inner.get(i + 1) != Some(&b'\'') {
                return None;
            }
            i += 1;
        }
        out.push(inner[i]);
        i += 1;
    }
    Some(out)
}

/// Appends the canonical decimal of `text` if it is an integer in `ty`'s range.
fn canonical_int(text: &[u8], ty: u32, out: &mut Vec<u8>) -> Option<()> {
    let s = std::str::from_utf8(text).ok()?;
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: i64 = s.parse().ok()?;
    push_int(v, ty, out)
}

fn push_int(v: i64, ty: u32, out: &mut Vec<u8>) -> Option<()> {
    let in_range = match ty {
        INT2 => i16::try_from(v).is_ok(),
        INT4 => i32::try_from(v).is_ok(),
        _ => true,
    };
    if !in_range {
        return None;
    }
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
    Some(())
}

/// Appends the canonical text of a uuid given in any form PostgreSQL's input accepts that
/// pgline recognises (hex digits with optional hyphens between groups of four, optional braces).
fn canonical_uuid_text(text: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let inner = match text {
        [b'{', rest @ .., b'}'] => rest,
        _ => text,
    };
    let mut raw = [0u8; 16];
    let mut nibbles = 0;
    let mut after_dash = false;
    for &c in inner {
        if c == b'-' {
            // PostgreSQL takes one hyphen after a group of four digits, never two in a row.
            if nibbles % 4 != 0 || nibbles == 0 || after_dash {
                return None;
            }
            after_dash = true;
            continue;
        }
        after_dash = false;
        let v = (c as char).to_digit(16)? as u8;
        if nibbles >= 32 {
            return None;
        }
        raw[nibbles / 2] |= if nibbles % 2 == 0 { v << 4 } else { v };
        nibbles += 1;
    }
    if nibbles != 32 || inner.last() == Some(&b'-') {
        return None;
    }
    push_uuid(&raw, out);
    Some(())
}

fn push_uuid(raw: &[u8; 16], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in raw.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push(b'-');
        }
        out.push(HEX[usize::from(b >> 4)]);
        out.push(HEX[usize::from(b & 15)]);
    }
}

/// Appends the canonical pk text of parameter value `value` (format `format`, declared type
/// `declared`, 0 = inferred) for a key of type `ty`; `None` when pgline cannot be sure of it.
pub(crate) fn canonical_param(
    value: &[u8],
    format: Format,
    declared: u32,
    ty: u32,
    out: &mut Vec<u8>,
) -> Option<()> {
    let int_key = matches!(ty, INT2 | INT4 | INT8);
    match format {
        Format::Text => {
            let ok = declared == 0
                || declared == UNKNOWN
                || declared == ty
                || (int_key && matches!(declared, INT2 | INT4 | INT8))
                || (matches!(ty, TEXT | VARCHAR) && matches!(declared, TEXT | VARCHAR));
            if !ok {
                return None;
            }
            match ty {
                INT2 | INT4 | INT8 => canonical_int(value, ty, out),
                UUID => canonical_uuid_text(value, out),
                TEXT | VARCHAR => {
                    out.extend_from_slice(value);
                    Some(())
                }
                _ => None,
            }
        }
        Format::Binary => {
            let declared = if declared == 0 { ty } else { declared };
            match (declared, value.len()) {
                (INT2, 2) if int_key => {
                    push_int(i16::from_be_bytes([value[0], value[1]]).into(), ty, out)
                }
                (INT4, 4) if int_key => {
                    let v = i32::from_be_bytes([value[0], value[1], value[2], value[3]]);
                    push_int(v.into(), ty, out)
                }
                (INT8, 8) if int_key => {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(value);
                    push_int(i64::from_be_bytes(b), ty, out)
                }
                (UUID, 16) if ty == UUID => {
                    let mut raw = [0u8; 16];
                    raw.copy_from_slice(value);
                    push_uuid(&raw, out);
                    Some(())
                }
                (TEXT | VARCHAR, _) if matches!(ty, TEXT | VARCHAR) => {
                    out.extend_from_slice(value);
                    Some(())
                }
                _ => None,
            }
        }
    }
}

/// Appends a DataRow of the projected columns of `section` (a store columns section), column
/// `i` in format `format(i)`. `None` if the section does not hold the table's columns or a
/// value has no exact binary form.
pub(crate) fn compose_data_row(
    lookup: &Lookup,
    section: &[u8],
    format: impl Fn(usize) -> Format,
    out: &mut Vec<u8>,
) -> Option<()> {
    let view = ColumnsView::new(section);
    if view.count() != lookup.pg_table.columns.len() {
        return None;
    }
    let start = out.len();
    out.push(b'D');
    out.extend_from_slice(&[0; 4]);
    let count = i16::try_from(lookup.columns.len()).ok()?;
    out.extend_from_slice(&count.to_be_bytes());
    for (i, &want) in lookup.columns.iter().enumerate() {
        let (_, value) = view.iter().nth(want)?;
        match value {
            Some(v) if format(i) == Format::Binary => {
                compose_binary_value((*lookup.binary.get(i)?)?, v, out)?;
            }
            Some(v) => {
                out.extend_from_slice(&(v.len() as i32).to_be_bytes());
                out.extend_from_slice(v);
            }
            None => out.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    let len = i32::try_from(out.len() - start - 1).ok()?;
    out[start + 1..start + 5].copy_from_slice(&len.to_be_bytes());
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::PgColumn;

    #[test]
    fn uuid_spellings_follow_postgres() {
        let canon = |t: &[u8]| {
            let mut out = Vec::new();
            canonical_uuid_text(t, &mut out).map(|()| String::from_utf8(out).unwrap())
        };
        let want = Some("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11".to_string());
        for ok in [
            &b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"[..],
            b"A0EEBC999C0B4EF8BB6D6BB9BD380A11",
            b"{a0eebc99-9c0b4ef8-bb6d6bb9-bd380a11}",
            b"a0ee-bc99-9c0b-4ef8-bb6d-6bb9-bd38-0a11",
        ] {
            assert_eq!(canon(ok), want, "{ok:?}");
        }
        for bad in [
            &b"a0eebc99--9c0b-4ef8-bb6d-6bb9bd380a11"[..],
            b"-a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11-",
            b"a0eebc9-99c0b-4ef8-bb6d-6bb9bd380a11",
            b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1",
        ] {
            assert_eq!(canon(bad), None, "{bad:?}");
        }
    }

    fn keyspace() -> KeySpace {
        let col = |name: &str, attnum, type_oid, typlen| PgColumn {
            name: name.into(),
            attnum,
            type_oid,
            typlen,
            typmod: -1,
        };
        let mut ks = KeySpace::new();
        ks.add_pg_table(PgTable {
            id: 99,
            schema: "public".into(),
            name: "t_1".into(),
            columns: vec![col("id", 1, INT4, 4), col("name", 2, TEXT, -1)].into(),
            key_columns: vec![0].into(),
            key_names: vec!["id".to_string()].into(),
            row_security: false,
        });
        ks
    }

    #[test]
    fn point_lookups_classify_with_canonical_keys() {
        let ks = keyspace();
        let c = classify_text(b"SELECT * FROM t_1 WHERE id = 1", &ks);
        let Class::Lookup(l) = c else {
            panic!("{:?}", classify("SELECT * FROM t_1 WHERE id = 1", &ks))
        };
        assert!(matches!(&l.key[0].0, KeyValue::Literal(v) if &**v == b"1"));
        assert_eq!(&*l.columns, &[0, 1]);
        let Class::Lookup(l) = classify_text(b"SELECT name FROM t_1 WHERE id = $1", &ks) else {
            panic!("param lookup")
        };
        assert_eq!(l.params, 1);
        assert!(matches!(
            classify_text(b"SELECT nope FROM t_1 WHERE id = 1", &ks),
            Class::Other
        ));
    }

    #[test]
    fn serve_class_gives_the_cores_reasons() {
        let mut ks = keyspace();
        let col = |name: &str, attnum, type_oid| PgColumn {
            name: name.into(),
            attnum,
            type_oid,
            typlen: -1,
            typmod: -1,
        };
        ks.add_pg_table(PgTable {
            id: 100,
            schema: "public".into(),
            name: "n_1".into(),
            columns: vec![col("k", 1, 1700), col("v", 2, 600)].into(),
            key_columns: vec![0].into(),
            key_names: vec!["k".to_string()].into(),
            row_security: false,
        });
        let class = |sql: &str| serve_class(sql, &ks);
        assert_eq!(
            class("SELECT * FROM t_1 WHERE id = $1"),
            ServeClass::Lookup {
                table: "public.t_1".into(),
                text_only: vec![]
            }
        );
        assert_eq!(
            class("SELECT v FROM n_1 WHERE k = 2"),
            ServeClass::Pass(NotServed::KeyType {
                column: "k".into(),
                type_oid: 1700
            })
        );
        assert_eq!(
            class("SELECT * FROM t_1 WHERE id = 99999999999"),
            ServeClass::Pass(NotServed::KeyLiteral)
        );
        assert!(matches!(
            class("SELECT count(*) FROM t_1 WHERE name = $1"),
            ServeClass::Result { tables, equalities }
                if tables == ["public.t_1"] && equalities == ["public.t_1.name"]
        ));
        assert!(matches!(
            class("SELECT * FROM other WHERE id = $1"),
            ServeClass::Pass(NotServed::Pass(PassReason::UnknownTable(_)))
        ));
        // The memo agrees: what serve_class serves, classify_text memoizes as served.
        for sql in [
            "SELECT * FROM t_1 WHERE id = $1",
            "SELECT v FROM n_1 WHERE k = 2",
        ] {
            let served = !matches!(class(sql), ServeClass::Pass(_));
            let memo = !matches!(
                classify_text(sql.as_bytes(), &ks),
                Class::Other | Class::Constant
            );
            assert_eq!(served, memo, "{sql}");
        }
    }

    #[test]
    fn params_and_literals_canonicalize() {
        let mut out = Vec::new();
        assert!(canonical_param(&7i32.to_be_bytes(), Format::Binary, 0, INT4, &mut out).is_some());
        assert_eq!(out, b"7");
        out.clear();
        assert!(canonical_param(b"x", Format::Text, 700, INT4, &mut out).is_none());
        assert_eq!(
            canonical_literal(b"'{A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11}'", UUID).as_deref(),
            Some(&b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"[..])
        );
        assert_eq!(
            canonical_literal(b"'it''s'", TEXT).as_deref(),
            Some(&b"it's"[..])
        );
        assert_eq!(canonical_literal(b"70000", INT2), None);
        assert_eq!(canonical_literal(b"007", INT4).as_deref(), Some(&b"7"[..]));
    }
}
