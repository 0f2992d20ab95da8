//! The workload advisor (`pgline advise`, `GET /v1/advice`): what pgline would do with the
//! statements the origin's `pg_stat_statements` has seen.
//!
//! Purpose: before (or while) pgline is deployed, tell an operator which statements the
//! PostgreSQL front would answer from the store (point lookups), from the query-result cache,
//! or pass through and why; their share of calls and of origin execution time; the origin time
//! saved at a given hit ratio; and what the operator can change.
//!
//! Invariant: **a statement is judged by the cores' own code**:
//! [`pgline_dataplane::engine::serve_class`] (the classifier `pgwire::classify` plus the memo's
//! checks in `engine/pg/lookup.rs` and `results.rs`) against the key space the cores use, then
//! the control plane's own conditions the runtime applies: the session user (`origin.url`'s and
//! `pgwire.cache_users`) and `catalog.disabled`. Nothing here restates a rule.
//!
//! `pg_stat_statements` texts have their constants replaced by `$1..$n`, so they classify as
//! parameterized statements, which is what the cores see for prepared statements; a literal the
//! runtime would refuse (an out-of-range key) cannot be seen here.
//!
//! This module is pure: [`advise`] sums rows read elsewhere (`admin/ops/advise.rs` reads the
//! origin). Bounds: at most [`MAX_LIMIT`] statements, texts over [`MAX_TEXT_BYTES`] are not
//! parsed (reported as `text_too_long`).
//!
//! Limitations: what a statement text cannot tell is listed in [`Advice::caveats`]: reads inside
//! transaction blocks (always the origin's), result formats (binary results of some types), the
//! session's settings, and the repetition of parameter values that the result cache's hit ratio
//! depends on.

use std::collections::{BTreeMap, HashSet};

use pgline_dataplane::engine::{serve_class, NotServed, ServeClass};
use pgline_dataplane::keyspace::KeySpace;
use pgline_dataplane::pgwire::classify::PassReason;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Statements read when no limit is given.
pub const DEFAULT_LIMIT: usize = 1000;
/// Most statements read at once.
pub const MAX_LIMIT: usize = 10_000;
/// Longest statement text classified (longer ones are `text_too_long`).
pub const MAX_TEXT_BYTES: usize = 64 * 1024;
/// Hit ratio of the estimate when none is given.
pub const DEFAULT_HIT_RATIO: f64 = 0.95;
/// Longest statement text kept in the answer.
pub const SHOWN_TEXT_CHARS: usize = 2000;

/// One row of `pg_stat_statements`, as read from the origin.
#[derive(Clone, Debug)]
pub struct StatementRow {
    pub query: String,
    /// The role that ran it (`None`: dropped since).
    pub user: Option<String>,
    pub calls: u64,
    /// `total_exec_time`, milliseconds.
    pub total_exec_ms: f64,
    /// Longer than [`MAX_TEXT_BYTES`] (the text is then a prefix).
    pub too_long: bool,
}

/// What the advisor knows beside the statements.
#[derive(Clone, Debug, Default)]
pub struct Context {
    /// The database the statements ran on (the one pgline caches).
    pub database: String,
    /// Users whose sessions may be answered from cache.
    pub cache_users: Vec<String>,
    /// `schema.table` of cached tables named in `catalog.disabled`.
    pub disabled: HashSet<String>,
    /// Origin tables pgline refuses, by the name a statement uses (`schema.table` and, in
    /// `public`, `table`), with why (no primary key, unlogged, ...).
    pub refused: BTreeMap<String, String>,
    /// `schema.table` of cached tables whose REPLICA IDENTITY is FULL.
    pub identity_full: HashSet<String>,
    /// Statements and their sums over all of `pg_stat_statements` for the database, not only
    /// the ones read.
    pub all: Totals,
    /// Statements beyond those read whose text may be transaction control: only counted for
    /// the transaction caveat, when the cores classify them so.
    pub beyond: Vec<StatementRow>,
}

/// How pgline would answer a statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// A point lookup answered from the store.
    Store,
    /// Answered from the query-result cache.
    Results,
    /// Forwarded to the origin.
    Pass,
}

/// One statement's advice.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct StatementAdvice {
    /// The normalized text (`$n` for constants), at most 2,000 characters.
    pub query: String,
    pub user: Option<String>,
    pub calls: u64,
    /// Origin execution time, milliseconds (`total_exec_time`).
    pub total_exec_ms: f64,
    pub verdict: Verdict,
    /// Why it passes through (a code: `write`, `volatile_function`, `table_not_cached`, ...).
    pub reason: Option<String>,
    /// The reason in words, or for a served statement what it reads.
    pub detail: String,
}

/// Statements, calls and origin time of one group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Totals {
    pub statements: u64,
    pub calls: u64,
    /// Milliseconds.
    pub exec_ms: f64,
}

impl Totals {
    fn add(&mut self, calls: u64, exec_ms: f64) {
        self.statements += 1;
        self.calls = self.calls.saturating_add(calls);
        self.exec_ms += exec_ms;
    }
}

/// A group's totals and its share of the statements read.
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct Share {
    #[serde(flatten)]
    pub totals: Totals,
    /// Percent of the calls read.
    pub calls_pct: f64,
    /// Percent of the origin time read.
    pub exec_pct: f64,
}

/// Pass-through statements by reason.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct ReasonShare {
    pub reason: String,
    #[serde(flatten)]
    pub share: Share,
}

/// Something the operator can change, and the calls and time it would bring to the cache.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct Action {
    /// What to do, e.g. `ALTER TABLE public.t ADD PRIMARY KEY (...)`.
    pub action: String,
    /// Why, in words.
    pub detail: String,
    #[serde(flatten)]
    pub totals: Totals,
}

/// The origin time pgline would save.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct Estimate {
    /// The hit ratio assumed for served statements.
    pub hit_ratio: f64,
    /// `hit_ratio × calls of served statements`.
    pub calls_saved: f64,
    /// `hit_ratio × total_exec_time of served statements`, milliseconds.
    pub exec_ms_saved: f64,
    /// Of the origin time read, percent.
    pub exec_pct_saved: f64,
}

/// `GET /v1/advice`.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct Advice {
    /// The origin database read (`origin.url`'s, the one pgline caches).
    pub database: String,
    /// Statements read (the busiest by total time, at most `limit`).
    pub read: Totals,
    /// All of `pg_stat_statements` for the database (top-level statements).
    pub all: Totals,
    pub store: Share,
    pub results: Share,
    /// Store and results together: what pgline would serve.
    pub served: Share,
    pub pass: Share,
    pub estimate: Estimate,
    /// Pass-through by reason, most origin time first.
    pub pass_reasons: Vec<ReasonShare>,
    /// What would bring more of the workload to the cache, most origin time first.
    pub actions: Vec<Action>,
    /// What a statement text cannot tell.
    pub caveats: Vec<String>,
    /// Every statement read, most origin time first.
    pub statements: Vec<StatementAdvice>,
}

/// Judges `rows` against the cores' key space `ks` and sums them (see the module doc).
pub fn advise(rows: &[StatementRow], ks: &KeySpace, ctx: &Context, hit_ratio: f64) -> Advice {
    let hit_ratio = if hit_ratio.is_finite() {
        hit_ratio.clamp(0.0, 1.0)
    } else {
        DEFAULT_HIT_RATIO
    };
    let mut read = Totals::default();
    let (mut store, mut results, mut pass) =
        (Totals::default(), Totals::default(), Totals::default());
    let mut reasons: BTreeMap<String, Totals> = BTreeMap::new();
    let mut actions: BTreeMap<String, Action> = BTreeMap::new();
    let mut notes = Notes::default();
    let mut statements = Vec::with_capacity(rows.len());
    for row in rows {
        let judged = judge(row, ks, ctx, &mut notes);
        read.add(row.calls, row.total_exec_ms);
        match judged.verdict {
            Verdict::Store => store.add(row.calls, row.total_exec_ms),
            Verdict::Results => results.add(row.calls, row.total_exec_ms),
            Verdict::Pass => pass.add(row.calls, row.total_exec_ms),
        }
        if let Some(r) = &judged.reason {
            reasons
                .entry(r.clone())
                .or_default()
                .add(row.calls, row.total_exec_ms);
        }
        if let Some((action, detail)) = judged.action {
            actions
                .entry(action.clone())
                .or_insert_with(|| Action {
                    action,
                    detail,
                    totals: Totals::default(),
                })
                .totals
                .add(row.calls, row.total_exec_ms);
        }
        statements.push(StatementAdvice {
            query: shorten(&row.query),
            user: row.user.clone(),
            calls: row.calls,
            total_exec_ms: row.total_exec_ms,
            verdict: judged.verdict,
            reason: judged.reason,
            detail: judged.detail,
        });
    }
    // Transaction control beyond the statements read still tells that reads ran in blocks.
    for row in &ctx.beyond {
        if let ServeClass::Pass(NotServed::Pass(PassReason::Transaction)) =
            serve_class(&row.query, ks)
        {
            notes.transaction_calls = notes.transaction_calls.saturating_add(row.calls);
        }
    }
    let share = |t: Totals| Share {
        totals: t,
        calls_pct: pct(t.calls as f64, read.calls as f64),
        exec_pct: pct(t.exec_ms, read.exec_ms),
    };
    let mut served = store;
    served.statements += results.statements;
    served.calls = served.calls.saturating_add(results.calls);
    served.exec_ms += results.exec_ms;
    let estimate = Estimate {
        hit_ratio,
        calls_saved: hit_ratio * served.calls as f64,
        exec_ms_saved: hit_ratio * served.exec_ms,
        exec_pct_saved: hit_ratio * pct(served.exec_ms, read.exec_ms),
    };
    let by_time = |a: f64, b: f64| b.total_cmp(&a);
    let mut pass_reasons: Vec<ReasonShare> = reasons
        .into_iter()
        .map(|(reason, t)| ReasonShare {
            reason,
            share: share(t),
        })
        .collect();
    pass_reasons.sort_by(|a, b| by_time(a.share.totals.exec_ms, b.share.totals.exec_ms));
    let mut actions: Vec<Action> = actions.into_values().collect();
    actions.sort_by(|a, b| by_time(a.totals.exec_ms, b.totals.exec_ms));
    statements.sort_by(|a, b| by_time(a.total_exec_ms, b.total_exec_ms));
    Advice {
        database: ctx.database.clone(),
        read,
        all: ctx.all,
        store: share(store),
        results: share(results),
        served: share(served),
        pass: share(pass),
        estimate,
        pass_reasons,
        actions,
        caveats: notes.caveats(ctx, rows.len(), &read),
        statements,
    }
}

/// What [`judge`] found out about the workload as a whole, for the caveats.
#[derive(Default)]
struct Notes {
    transaction_calls: u64,
    text_only: BTreeMap<String, u64>,
    other_users: u64,
    hidden_texts: u64,
    results_calls: u64,
}

impl Notes {
    fn caveats(&self, ctx: &Context, read: usize, totals: &Totals) -> Vec<String> {
        let mut out = vec![
            "pg_stat_statements replaces constants with $n: statements are classified as the \
             cores classify prepared statements (a literal the cores would refuse, such as an \
             out-of-range key, cannot be seen)"
                .to_string(),
        ];
        if ctx.all.statements > read as u64 {
            out.push(format!(
                "read the {read} statements with the most origin time of {} ({:.1}% of calls, \
                 {:.1}% of origin time); raise limit to read more",
                ctx.all.statements,
                pct(totals.calls as f64, ctx.all.calls as f64),
                pct(totals.exec_ms, ctx.all.exec_ms)
            ));
        }
        if self.transaction_calls > 0 {
            out.push(format!(
                "{} calls of transaction control (BEGIN, COMMIT, ...): reads inside a \
                 transaction block always go to the origin, and which statements ran inside \
                 one is not in pg_stat_statements, so the served share is an upper bound (the \
                 count is a floor: PostgreSQL 15 records a BEGIN or COMMIT run as a prepared \
                 statement once, however often it runs)",
                self.transaction_calls
            ));
        }
        for (table, calls) in &self.text_only {
            out.push(format!(
                "{calls} calls of point lookups on {table} return columns without an exact \
                 binary form: clients asking for binary results (tokio-postgres, pgx, JDBC \
                 binary) get them from the origin"
            ));
        }
        if self.results_calls > 0 {
            out.push(
                "the query-result cache keys on parameter values: its hit ratio depends on how \
                 often the same values repeat, and any change to a table read drops its results"
                    .into(),
            );
        }
        if self.other_users > 0 {
            out.push(format!(
                "{} calls by users other than {} (origin.url's user and pgwire.cache_users): \
                 their sessions are never answered from cache",
                self.other_users,
                ctx.cache_users.join(", ")
            ));
        }
        if self.hidden_texts > 0 {
            out.push(format!(
                "{} statements show <insufficient privilege>: grant pg_read_all_stats to \
                 origin.url's user to see other users' texts",
                self.hidden_texts
            ));
        }
        out.push(
            "a session is served only while idle, with pgline's settings (client_encoding UTF8, \
             DateStyle ISO, MDY, TimeZone UTC for date/time columns) and within \
             replication.max_lag_ms; the estimate assumes that"
                .into(),
        );
        out
    }
}

/// One statement's verdict, with the action that would change it.
struct Judged {
    verdict: Verdict,
    reason: Option<String>,
    detail: String,
    action: Option<(String, String)>,
}

impl Judged {
    fn pass(reason: &str, detail: String) -> Judged {
        Judged {
            verdict: Verdict::Pass,
            reason: Some(reason.into()),
            detail,
            action: None,
        }
    }

    fn with_action(mut self, action: String, detail: &str) -> Judged {
        self.action = Some((action, detail.into()));
        self
    }
}

fn judge(row: &StatementRow, ks: &KeySpace, ctx: &Context, notes: &mut Notes) -> Judged {
    if row.query == "<insufficient privilege>" {
        notes.hidden_texts += 1;
        return Judged::pass(
            "hidden_text",
            "the text is not visible to pgline's user".into(),
        );
    }
    if row.too_long {
        return Judged::pass(
            "text_too_long",
            format!("longer than {MAX_TEXT_BYTES} bytes: not classified"),
        );
    }
    let class = serve_class(&row.query, ks);
    if let ServeClass::Pass(NotServed::Pass(PassReason::Transaction)) = class {
        notes.transaction_calls = notes.transaction_calls.saturating_add(row.calls);
    }
    let user_ok = row
        .user
        .as_ref()
        .is_some_and(|u| ctx.cache_users.iter().any(|c| c == u));
    if !user_ok && !matches!(class, ServeClass::Pass(_)) {
        notes.other_users = notes.other_users.saturating_add(row.calls);
        return Judged::pass(
            "user_not_cached",
            format!(
                "run by {}, whose sessions are not answered from cache",
                row.user.as_deref().unwrap_or("a dropped role")
            ),
        )
        .with_action(
            format!(
                "pgwire.cache_users += {}",
                row.user.as_deref().unwrap_or("?")
            ),
            "only sessions of origin.url's user and pgwire.cache_users read the cache (the \
             user must read the cached tables without row-level security)",
        );
    }
    match class {
        ServeClass::Lookup { table, text_only } => {
            if ctx.disabled.contains(&table) {
                return disabled(&table);
            }
            if !text_only.is_empty() {
                *notes.text_only.entry(table.clone()).or_default() += row.calls;
            }
            Judged {
                verdict: Verdict::Store,
                reason: None,
                detail: format!("point lookup on {table}"),
                action: None,
            }
        }
        ServeClass::Result { tables, equalities } => {
            if let Some(t) = tables.iter().find(|t| ctx.disabled.contains(*t)) {
                return disabled(t);
            }
            notes.results_calls = notes.results_calls.saturating_add(row.calls);
            let mut judged = Judged {
                verdict: Verdict::Results,
                reason: None,
                detail: format!("result cache, reads {}", tables.join(", ")),
                action: None,
            };
            if let Some(eq) = equalities.first() {
                judged.detail.push_str(&format!("; invalidated by {eq}"));
                if let Some(action) = identity_action(eq, ks, ctx) {
                    judged.action = Some(action);
                }
            }
            judged
        }
        ServeClass::Pass(why) => pass_reason(why, ctx),
    }
}

fn disabled(table: &str) -> Judged {
    Judged::pass(
        "table_disabled",
        format!("{table} is in catalog.disabled: its reads pass through"),
    )
    .with_action(
        format!("catalog.disabled -= {table}"),
        "a disabled table's reads go to the origin",
    )
}

/// For an equality on a non-key column of a table without REPLICA IDENTITY FULL: the WAL does
/// not carry the column's old value, so an UPDATE drops every result with an equality on it.
fn identity_action(eq: &str, ks: &KeySpace, ctx: &Context) -> Option<(String, String)> {
    let (table, column) = eq.rsplit_once('.')?;
    let (schema, name) = table.split_once('.')?;
    let t = ks.pg_table_named(Some(schema), name)?;
    if t.key_names.iter().any(|k| k == column) || ctx.identity_full.contains(table) {
        return None;
    }
    Some((
        format!("ALTER TABLE {table} REPLICA IDENTITY FULL"),
        "an UPDATE then drops only the cached results whose equality value the row had or \
         has; without it, the old value is unknown and every result with an equality on that \
         column is dropped (more WAL per UPDATE)"
            .into(),
    ))
}

/// The reason code, words and action of a statement the cores forward.
fn pass_reason(why: NotServed, ctx: &Context) -> Judged {
    let avoid_volatile = "a volatile function makes a read uncacheable: compute the value in \
                          the application and pass it as a parameter";
    match why {
        NotServed::Pass(r) => match r {
            PassReason::Unparsed => {
                Judged::pass("unparsed", "pgline's SQL parser does not read it".into())
            }
            PassReason::Empty => Judged::pass("empty", "no statement".into()),
            PassReason::MultipleStatements => Judged::pass(
                "multiple_statements",
                "several statements in one text".into(),
            ),
            PassReason::Write => Judged::pass("write", "writes go to the origin".into()),
            PassReason::Ddl => Judged::pass("ddl", "schema changes go to the origin".into()),
            PassReason::Transaction => Judged::pass(
                "transaction",
                "transaction control; reads inside a transaction block go to the origin".into(),
            ),
            PassReason::SessionState => Judged::pass(
                "session_state",
                "SET/RESET/DISCARD: session state (SET pins the session to its backend)".into(),
            ),
            PassReason::Utility => Judged::pass("utility", "a utility statement".into()),
            PassReason::Locking => Judged::pass("locking", "FOR UPDATE/SHARE locks rows".into()),
            PassReason::SelectInto => Judged::pass("select_into", "SELECT INTO writes".into()),
            PassReason::DataModifyingCte => {
                Judged::pass("data_modifying_cte", "a CTE or subquery writes".into())
            }
            PassReason::Volatile(f) => {
                Judged::pass("volatile_function", format!("{f} is volatile"))
                    .with_action(format!("avoid {f} in cached reads"), avoid_volatile)
            }
            PassReason::UnknownFunction(f) => Judged::pass(
                "unknown_function",
                format!("{f} is not on pgline's list of immutable and stable functions"),
            )
            .with_action(format!("avoid {f} in cached reads"), avoid_volatile),
            PassReason::UnknownTable(t) => not_cached(&t, ctx),
            PassReason::NoTable => Judged::pass("no_table", "reads no table".into()),
            PassReason::ShadowedTable(t) => Judged::pass(
                "shadowed_table",
                format!("a CTE named {t} like a cached table"),
            ),
        },
        NotServed::NotPgTable(t) => not_cached(&t, ctx),
        NotServed::RowSecurity(t) => Judged::pass(
            "row_security",
            format!("{t} has row-level security: each role sees other rows"),
        ),
        NotServed::UnknownColumn(c) => {
            Judged::pass("unknown_column", format!("column {c} is not in the table"))
        }
        NotServed::PartialKey => Judged::pass(
            "partial_key",
            "the WHERE clause does not equate each primary-key column once".into(),
        ),
        NotServed::KeyType { column, type_oid } => Judged::pass(
            "key_type",
            format!(
                "key column {column} has type OID {type_oid}: lookups are served on int2, \
                 int4, int8, text, varchar and uuid keys"
            ),
        ),
        NotServed::KeyLiteral => Judged::pass(
            "key_literal",
            "a key literal the key column's type cannot hold".into(),
        ),
        NotServed::BadParameter => Judged::pass("bad_parameter", "a $0 parameter".into()),
    }
}

/// A table the key space does not have: refused by the catalog (with why), or not added.
fn not_cached(name: &str, ctx: &Context) -> Judged {
    let key = name.trim_matches('"');
    if let Some(why) = ctx.refused.get(key) {
        let judged = Judged::pass("table_not_cacheable", format!("{name}: {why}"));
        return if why.starts_with("no primary key") {
            judged.with_action(
                format!("ALTER TABLE {name} ADD PRIMARY KEY (...)"),
                "pgline caches only tables with a primary key",
            )
        } else {
            judged
        };
    }
    let system = key.starts_with("pg_") || key.starts_with("information_schema.");
    let judged = Judged::pass("table_not_cached", format!("{name} is not a cached table"));
    if system {
        judged
    } else {
        judged.with_action(
            format!("pgline tables add {name}"),
            "a table pgline does not cache is read from the origin (a view or a temporary \
             table cannot be added)",
        )
    }
}

fn pct(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        100.0 * part / whole
    } else {
        0.0
    }
}

fn shorten(text: &str) -> String {
    match text.char_indices().nth(SHOWN_TEXT_CHARS) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

#[cfg(test)]
#[path = "advise_tests.rs"]
mod tests;
