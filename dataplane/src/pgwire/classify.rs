//! Statement classification for the pgwire cache: point lookup, cacheable read, or
//! pass-through with a reason.
//!
//! # Purpose and place on the request path
//! Decides once per distinct statement text (at Parse, or at first sight of a simple query
//! text) how pgline may serve it; the engine memoizes the answer by text, so this never runs
//! per request. It parses with the `sqlparser` crate (PostgreSQL dialect, pure Rust), which
//! allocates: it is off the hit path by construction.
//!
//! # Classes
//! - [`Classification::PointLookup`]: `SELECT <cols or *> FROM [schema.]t WHERE <pk> = <literal
//!   or $n>` (for a composite key, every key column equated, joined by AND, nothing else), on a
//!   table the [`Catalog`] knows. No joins, grouping, ordering, limit, DISTINCT or locking.
//! - [`Classification::Cacheable`]: a read-only, deterministic query over known tables (joins,
//!   aggregates, window functions, ORDER BY/LIMIT, subqueries, read-only CTEs): the tables it
//!   reads, its normalized text (canonical whitespace and keyword case, unquoted identifiers
//!   lowercased, literals replaced by parameters numbered after the client's), the literal
//!   values in order, and the top-level `column = value` predicates for finer invalidation.
//! - [`Classification::PassThrough`] with a [`PassReason`]: everything else.
//!
//! # Invariants
//! Conservative: anything not positively known to be a deterministic read passes through.
//! Functions are checked against an allowlist of immutable and statement-stable functions;
//! known volatile ones give [`PassReason::Volatile`], any other [`PassReason::UnknownFunction`].
//! Tables must be known to the [`Catalog`] (so temporary tables, views and system catalogs
//! pass through). String literals `'now'`, `'today'`, `'tomorrow'`, `'yesterday'` anywhere
//! make the statement volatile (they are volatile when cast to a date/time type).
//!
//! # Limitations
//! - Stable functions depending on session settings (`date_trunc` on `timestamptz` with
//!   `TimeZone`, `to_char`) are cached; a session is served them only while those settings are
//!   pgline's own (the cache gate: `engine/pg/settings.rs`), not through the key. Extension
//!   operators spelled like built-in ones (`%` of `pg_trgm`) pass as the built-in ones, and
//!   their settings (`pg_trgm.similarity_threshold`) are not read.
//! - Equality predicates are taken only from the outermost SELECT's WHERE conjunction, and only
//!   on a table the statement reads exactly once and whose column can be told.
//! - Two texts that differ only in alias case or redundant parentheses get different keys.

use sqlparser::ast::{
    CastKind, DataType, Expr, ObjectName, ObjectNamePart, SetExpr, Statement, TableFactor, Value,
    Visit, Visitor,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;
use std::ops::ControlFlow;

/// What pgline knows about tables: the cached ones and their primary keys.
pub trait Catalog {
    /// The primary-key columns of a table pgline caches, in key order (empty if it has none);
    /// `None` if the table is unknown (not cached, temporary, a view, a system catalog).
    /// Names arrive lowercased unless the client quoted them.
    fn primary_key(&self, schema: Option<&str>, table: &str) -> Option<&[String]>;
}

/// A table as named in the statement.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TableRef {
    pub schema: Option<String>,
    pub name: String,
}

/// Where a key or predicate value comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// The client's parameter `$n` (1-based).
    Param(usize),
    /// A literal, as written in the normalized text (`42`, `'abc'`).
    Literal(String),
}

/// The columns a SELECT returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Projection {
    /// `*`
    All,
    /// Plain column names, in order.
    Columns(Vec<String>),
}

/// A primary-key lookup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PointLookup {
    pub table: TableRef,
    pub columns: Projection,
    /// One value per primary-key column, in the catalog's key order.
    pub key: Vec<KeySource>,
}

/// `[table.]column = value` found in the outermost WHERE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Equality {
    /// The table the column belongs to, when it can be told (qualified, or one table read).
    pub table: Option<TableRef>,
    pub column: String,
    pub value: KeySource,
}

/// A cacheable read-only deterministic query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheableQuery {
    /// Tables read, sorted, without duplicates.
    pub tables: Vec<TableRef>,
    /// The normalized text: the cache key together with the parameter values.
    pub normalized: String,
    /// Literal values lifted out of the text, in order; literal `i` is `$(client_params+i+1)`.
    pub literals: Vec<String>,
    /// How many parameters the client's text uses (the highest `$n`).
    pub client_params: usize,
    /// Top-level equality predicates, for invalidation finer than the table.
    pub equalities: Vec<Equality>,
}

/// Why a statement is not served from cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PassReason {
    /// sqlparser could not parse it (PostgreSQL may still accept it).
    Unparsed,
    /// No statement (an empty query).
    Empty,
    /// More than one statement in one text.
    MultipleStatements,
    /// INSERT, UPDATE, DELETE, MERGE, COPY.
    Write,
    /// CREATE, ALTER, DROP, TRUNCATE, GRANT, COMMENT...
    Ddl,
    /// BEGIN, COMMIT, ROLLBACK, SAVEPOINT...
    Transaction,
    /// SET, RESET, DISCARD: session state.
    SessionState,
    /// Any other utility statement (SHOW, EXPLAIN, LISTEN, PREPARE, VACUUM...).
    Utility,
    /// FOR UPDATE / FOR SHARE.
    Locking,
    /// SELECT ... INTO.
    SelectInto,
    /// A CTE or subquery that writes.
    DataModifyingCte,
    /// A volatile function or value (now(), random(), nextval, 'now'...).
    Volatile(String),
    /// A function not on the allowlist.
    UnknownFunction(String),
    /// A table the catalog does not know.
    UnknownTable(String),
    /// A SELECT that reads no table.
    NoTable,
    /// A CTE named like a cached table: which one a nested reference means is not tracked.
    ShadowedTable(String),
}

/// The result of classifying one statement text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Classification {
    PointLookup(PointLookup),
    Cacheable(CacheableQuery),
    PassThrough(PassReason),
}

/// Classifies one statement text against the catalog.
pub fn classify(sql: &str, catalog: &dyn Catalog) -> Classification {
    match classify_inner(sql, catalog) {
        Ok(c) => c,
        Err(reason) => Classification::PassThrough(reason),
    }
}

/// Whether `sql` is one SELECT of constants: literals (numbers, strings, booleans, NULL), each
/// at most cast to a built-in type that SQL names by a keyword (`integer`, `bigint`, `boolean`,
/// `numeric`, `varchar`...), with no FROM, INTO, WITH or locking, and no table, function,
/// operator, parameter or subquery anywhere. No user code can run for such a statement (no
/// function, operator, trigger, policy, domain check or search-path lookup is involved), so it
/// leaves its backend's session state as it found it: the relay may pool that backend again
/// without reading its state (`PgRequest::state_free`). `SELECT 1`, the usual health check, is
/// one.
pub fn is_constant_select(sql: &str) -> bool {
    let Ok(statements) = Parser::parse_sql(&PostgreSqlDialect {}, sql) else {
        return false;
    };
    let [Statement::Query(query)] = statements.as_slice() else {
        return false;
    };
    let SetExpr::Select(select) = &*query.body else {
        return false;
    };
    if query.with.is_some()
        || !query.locks.is_empty()
        || query.for_clause.is_some()
        || !select.from.is_empty()
        || select.into.is_some()
    {
        return false;
    }
    query.visit(&mut Constants).is_continue()
}

/// [`is_constant_select`]'s visitor: stops at anything but a literal or a keyword-type cast.
struct Constants;

impl Visitor for Constants {
    type Break = ();

    fn pre_visit_relation(&mut self, _: &ObjectName) -> ControlFlow<()> {
        ControlFlow::Break(())
    }

    fn pre_visit_table_factor(&mut self, _: &TableFactor) -> ControlFlow<()> {
        ControlFlow::Break(())
    }

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
        let constant = match expr {
            Expr::Value(v) => !matches!(v.value, Value::Placeholder(_)),
            Expr::Nested(_) => true,
            Expr::Cast {
                kind: CastKind::Cast | CastKind::DoubleColon,
                data_type,
                format: None,
                ..
            } => matches!(
                data_type,
                DataType::Integer(None)
                    | DataType::Int(None)
                    | DataType::SmallInt(None)
                    | DataType::BigInt(None)
                    | DataType::Real
                    | DataType::DoublePrecision
                    | DataType::Numeric(_)
                    | DataType::Decimal(_)
                    | DataType::Boolean
                    | DataType::Varchar(_)
                    | DataType::CharacterVarying(_)
                    | DataType::Char(_)
                    | DataType::Character(_)
            ),
            _ => false,
        };
        if constant {
            ControlFlow::Continue(())
        } else {
            ControlFlow::Break(())
        }
    }
}

fn classify_inner(sql: &str, catalog: &dyn Catalog) -> Result<Classification, PassReason> {
    let mut statements =
        Parser::parse_sql(&PostgreSqlDialect {}, sql).map_err(|_| PassReason::Unparsed)?;
    let mut stmt = match statements.len() {
        0 => return Err(PassReason::Empty),
        1 => statements.remove(0),
        _ => return Err(PassReason::MultipleStatements),
    };
    let Statement::Query(query) = &stmt else {
        return Err(statement_reason(&stmt));
    };
    let mut check = Checker::default();
    if let ControlFlow::Break(reason) = query.visit(&mut check) {
        return Err(reason);
    }
    lowercase_identifiers(&mut stmt);
    let Statement::Query(query) = &stmt else {
        return Err(PassReason::Unparsed);
    };
    let tables = known_tables(&check, catalog)?;
    if let Some(lookup) = point_lookup(query, catalog) {
        return Ok(Classification::PointLookup(lookup));
    }
    // An equality narrows what a change of its table can affect only if the query reads that
    // table once (a second reference, in a subquery or a self-join, reads other rows too).
    let once = |t: &TableRef| {
        check
            .relations
            .iter()
            .filter(|n| table_ref(n).as_ref() == Some(t))
            .count()
            == 1
    };
    let equalities = top_select(query)
        .map(|s| equalities(s, &tables))
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.table.as_ref().is_some_and(once))
        .collect();
    let (normalized, literals) = normalize(stmt, check.max_param);
    Ok(Classification::Cacheable(CacheableQuery {
        tables,
        normalized,
        literals,
        client_params: check.max_param,
        equalities,
    }))
}

/// Why a non-query statement passes through, from its canonical text's first keyword.
fn statement_reason(stmt: &Statement) -> PassReason {
    let text = stmt.to_string();
    let word = text
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or_default()
        .to_ascii_uppercase();
    match word.as_str() {
        "INSERT" | "UPDATE" | "DELETE" | "MERGE" | "COPY" => PassReason::Write,
        "CREATE" | "ALTER" | "DROP" | "TRUNCATE" | "GRANT" | "REVOKE" | "COMMENT" | "RENAME" => {
            PassReason::Ddl
        }
        "BEGIN" | "START" | "COMMIT" | "END" | "ROLLBACK" | "ABORT" | "SAVEPOINT" | "RELEASE" => {
            PassReason::Transaction
        }
        "SET" | "RESET" | "DISCARD" => PassReason::SessionState,
        _ => PassReason::Utility,
    }
}

mod functions;
mod predicates;

use functions::Checker;
use predicates::{equalities, lowercase_identifiers, normalize, point_lookup, top_select};

/// Resolves the relations the checker saw (minus CTE names) against the catalog.
fn known_tables(check: &Checker, catalog: &dyn Catalog) -> Result<Vec<TableRef>, PassReason> {
    if let Some(cte) = check
        .ctes
        .iter()
        .find(|c| catalog.primary_key(None, c).is_some())
    {
        return Err(PassReason::ShadowedTable(cte.clone()));
    }
    let mut tables = Vec::new();
    for name in &check.relations {
        let t = table_ref(name).ok_or_else(|| PassReason::UnknownTable(name.to_string()))?;
        if t.schema.is_none() && check.ctes.contains(&t.name) {
            continue;
        }
        if catalog.primary_key(t.schema.as_deref(), &t.name).is_none() {
            return Err(PassReason::UnknownTable(name.to_string()));
        }
        tables.push(t);
    }
    tables.sort();
    tables.dedup();
    if tables.is_empty() {
        return Err(PassReason::NoTable);
    }
    Ok(tables)
}

/// `[schema.]name` with folded identifiers; `None` for three-part or function names.
fn table_ref(name: &ObjectName) -> Option<TableRef> {
    let mut parts = name.0.iter().map(|p| match p {
        ObjectNamePart::Identifier(id) => Some(fold(id)),
        _ => None,
    });
    match (parts.next()??, parts.next(), parts.next()) {
        (name, None, _) => Some(TableRef { schema: None, name }),
        (schema, Some(Some(name)), None) => Some(TableRef {
            schema: Some(schema),
            name,
        }),
        _ => None,
    }
}

/// An identifier as PostgreSQL resolves it: unquoted ones fold to lower case.
fn fold(id: &sqlparser::ast::Ident) -> String {
    if id.quote_style.is_some() {
        id.value.clone()
    } else {
        id.value.to_lowercase()
    }
}

#[cfg(test)]
#[path = "classify_tests.rs"]
mod tests;
