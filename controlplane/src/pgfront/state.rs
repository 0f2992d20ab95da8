//! A backend's session state as the origin reports it, and whether cached answers fit it.
//!
//! Cached answers (point lookups from the store, stored query results) are the bytes the
//! origin sends pgline's own sessions: pgline's role reading the rows, names resolved in
//! `public`, pgline's output settings. A client session may get them only while the origin,
//! in that session's exact state, would send the same bytes. Rather than guess that state from
//! statement text (which `set_config('search'||'_path', ...)`, a function, a role default or a
//! startup `options` evade), the relay asks the origin: the fence query, at login and after a
//! batch asking for it (see `session`), and the state query, before a session takes another
//! session's reserved backend and at a session's end, return (the fence query beside the WAL
//! position) these columns:
//!
//! - `session_user` and `current_user`: `SET ROLE`, `SET SESSION AUTHORIZATION` and
//!   `set_config('role', ...)` show here (a `SECURITY DEFINER` function's role lasts only
//!   while it runs);
//! - the resolved search path (`current_schemas(true)`, so `"$user"`, role and database
//!   defaults, startup options and `pg_temp` are all resolved) and whether the session has
//!   temporary relations or types (an empty temporary schema stays on the path after `DISCARD
//!   ALL` and hides nothing), and the `search_path` setting as written (fingerprint only: a
//!   schema that does not exist changes `SHOW search_path` but not the resolved path);
//! - the output settings the origin does not report with ParameterStatus
//!   ([`UNREPORTED`]); the reported ones (`DateStyle`, `IntervalStyle`, `TimeZone`,
//!   `client_encoding`, `standard_conforming_strings`) the core follows itself;
//! - whether the session listens on a channel or holds a cursor `WITH HOLD`: `LISTEN` and
//!   `DECLARE` in a client's own text pin its backend (`plan::leaves_session_state`), but a
//!   function can run them through `EXECUTE`, and another session on that backend would then
//!   get the notifications or find the cursor (fingerprint only; both cheap to ask: the
//!   backend's own lists). Not asked: SQL-level prepared statements and session advisory locks
//!   made inside a function (`pg_prepared_statements` and `pg_locks` cost a scan of every
//!   prepared statement, of every lock), see `docs/pgwire.md`;
//! - the custom settings the relay is told to follow (`pgwire.custom_settings`, [`OwnSql`]):
//!   `pg_settings` lists none, so a function's `set_config('app.tenant', .., false)` shows only
//!   to a read by name (fingerprint only).
//! - the settings that change what a session's statements do without changing cached answers
//!   ([`WATCHED`]: `row_security`, `statement_timeout`, `session_replication_role`, the
//!   `default_transaction_*` settings, ...), as one text, compared with the values last known
//!   not to be the session's own on that backend ([`settings_clean`]; not in the fingerprint).
//!
//! Every name in the query is schema-qualified: a session with `pg_catalog` late on its path
//! cannot substitute its own `current_setting`.
//!
//! Two uses:
//! - [`OriginState::serves_cache`]: the verdict the core gets with each reply
//!   ([`pgline_dataplane::plane::PgReply::serve_cached`]);
//! - [`OriginState::fingerprint`]: a session's state right after login (part of its pool's
//!   key) against the backend's state after a batch. A backend whose state moved away from
//!   its login state holds session state: its session keeps it (pinned), and at the session's
//!   end it goes back to the pool only if `DISCARD ALL` brought the fingerprint back.

use std::io;
use std::sync::LazyLock;

use super::backend::{Backend, Row};

/// Output settings the origin does not report, whose values must equal pgline's own sessions'
/// for a cached answer to be the origin's: floats, bytea, money, `x = NULL` read as `x IS
/// NULL`, what `to_char`, `to_number` and `to_date` print and read (`lc_numeric`, `lc_time`),
/// `quote_ident` and `format('%I')` (`quote_all_identifiers`), whether `NULL` in an array
/// literal is a null (`array_nulls`), what `text @@ text` matches
/// (`default_text_search_config`), what a zone abbreviation in a literal means
/// (`timezone_abbreviations`: `IST` is +02 by default, +05:30 under `India`), how many rows
/// a GIN index scan may return (`gin_fuzzy_search_limit`), and what `pg_trgm`'s `text % text`
/// matches (`pg_trgm.similarity_threshold`: the classifier reads `%` as one of PostgreSQL's
/// own operators, and for text it is the extension's). Seven were added in stop 40 (a session
/// with `quote_all_identifiers` on was served a stored `quote_ident` answer unquoted), the
/// last in stop 41 (a session with the threshold at 0.1 was served the count stored for 0.3);
/// the query reads them in this order, after the other columns, so those keep their places.
/// The threshold is not part of the fingerprint ([`FINGERPRINTED`]).
/// pgline's own sessions' values (the baseline) are read with [`STATE_SQL`] too.
pub const UNREPORTED: [&str; 12] = [
    "extra_float_digits",
    "bytea_output",
    "lc_monetary",
    "transform_null_equals",
    "lc_numeric",
    "lc_time",
    "quote_all_identifiers",
    "array_nulls",
    "default_text_search_config",
    "timezone_abbreviations",
    "gin_fuzzy_search_limit",
    "pg_trgm.similarity_threshold",
];

/// [`UNREPORTED`]'s values, in order.
pub type Baseline = [String; 12];

/// Settings that change what a session's statements do, or whether they succeed, beside the
/// output settings and the name resolution: row-level security on or off, triggers and foreign
/// keys skipped (`session_replication_role`), timeouts, the default transaction mode, commit
/// durability, XML parsing and printing, string-literal rules, `CREATE FUNCTION`'s checks, the
/// notices a client gets and the language of errors, where new tables go, and whether an error
/// ends the session. A function can set any of them for the rest of its session with
/// `set_config(.., false)`, which no statement text shows; a backend left so must stay with its
/// session, as one whose fingerprint moved does. They are not in the fingerprint: a
/// configuration reload changes them on every backend at once, which would pin every session to
/// its backend (stop 40, `docs/decisions.md`). Instead the state query reads them as one text
/// (an array of `current_setting(name, true)`, NULL where the server has no such setting, in
/// its text form, which quotes what needs it: two different sets of values never read alike),
/// and a text other than the one last seen clean on that backend is explained by
/// asking the origin which of them the session set ([`SESSION_SETTINGS_SQL`], one read of
/// `pg_settings`: about 0.7 ms, paid only when the text moved). Planner and memory settings
/// (`work_mem`, `enable_*`, `jit`) are left out: they change plans, not answers.
pub const WATCHED: [&str; 22] = [
    "row_security",
    "session_replication_role",
    "default_transaction_read_only",
    "default_transaction_isolation",
    "default_transaction_deferrable",
    "statement_timeout",
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "idle_session_timeout",
    "transaction_timeout",
    "synchronous_commit",
    "xmloption",
    "xmlbinary",
    "backslash_quote",
    "escape_string_warning",
    "check_function_bodies",
    "client_min_messages",
    "lc_messages",
    "default_tablespace",
    "temp_tablespaces",
    "default_table_access_method",
    "exit_on_error",
];

/// Which of [`WATCHED`] the backend's session set itself (`SET`, or `set_config(.., false)`
/// in a function), joined by `,`; NULL when none. The value a configuration reload gave is
/// `configuration file`'s, a role's or database's default `user`'s or `database`'s, a startup
/// option `client`'s: none of them is the session's.
pub static SESSION_SETTINGS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT pg_catalog.string_agg(name, ',' ORDER BY name) FROM pg_catalog.pg_settings \
         WHERE source OPERATOR(pg_catalog.=) 'session' \
         AND name OPERATOR(pg_catalog.=) ANY ('{{{}}}'::pg_catalog.text[])",
        WATCHED.join(",")
    )
});

/// How many of [`UNREPORTED`] (the first ones) are part of [`OriginState::fingerprint`]. The
/// last, `pg_trgm.similarity_threshold`, counts for the cache verdict only: a placeholder keeps
/// the text as written (`0.30`) until the library loads and prints it as `0.3`, so a backend
/// that loads the library mid-session would otherwise look changed, be pinned to its session
/// and closed at its end. Set in a function's body, it therefore reaches the pool's next
/// session like the settings outside the read (`docs/pgwire.md`); set in a client's own text
/// (`SET`, `set_config`), it pins the backend as any such statement does.
const FINGERPRINTED: usize = 11;

/// The columns of a [`Resolution`], in its order. The temporary-object check runs only when the
/// session has a temporary schema (a CASE evaluates its sub-selects lazily).
macro_rules! resolution_columns {
    () => {
        "pg_catalog.\"session_user\"()::pg_catalog.text, \
         pg_catalog.\"current_user\"()::pg_catalog.text, \
         pg_catalog.array_to_string(pg_catalog.current_schemas(true), ','), \
         CASE WHEN pg_catalog.pg_my_temp_schema() OPERATOR(pg_catalog.=) 0 THEN 'false' \
         ELSE (EXISTS (SELECT FROM pg_catalog.pg_class WHERE relnamespace \
         OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()) \
         OR EXISTS (SELECT FROM pg_catalog.pg_type WHERE typnamespace \
         OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()))::pg_catalog.text END"
    };
}

/// The state columns of the fence query (after the LSN) and of [`STATE_SQL`]: the
/// [`Resolution`], the first four [`UNREPORTED`] settings, the reported ones, the written
/// `search_path`, the session objects, the other [`UNREPORTED`] settings, then the
/// [`WATCHED`] ones as one text. A backend that
/// has not loaded `pg_trgm` (or a database without it) has no `pg_trgm.similarity_threshold`
/// unless something set it, and one that was set and reset holds an empty placeholder: both
/// are read as the extension's default, 0.3 (what loading the library defines), without a
/// cast (a placeholder may hold any text, and a failed cast would fail the whole read).
macro_rules! state_columns {
    () => {
        concat!(
            resolution_columns!(),
            ", \
         pg_catalog.current_setting('extra_float_digits'), \
         pg_catalog.current_setting('bytea_output'), \
         pg_catalog.current_setting('lc_monetary'), \
         pg_catalog.current_setting('transform_null_equals'), \
         pg_catalog.current_setting('DateStyle'), \
         pg_catalog.current_setting('IntervalStyle'), \
         pg_catalog.current_setting('TimeZone'), \
         pg_catalog.current_setting('client_encoding'), \
         pg_catalog.current_setting('standard_conforming_strings'), \
         pg_catalog.current_setting('search_path'), \
         (EXISTS (SELECT FROM pg_catalog.pg_listening_channels()) \
         OR EXISTS (SELECT FROM pg_catalog.pg_cursors WHERE is_holdable))::pg_catalog.text, \
         pg_catalog.current_setting('lc_numeric'), \
         pg_catalog.current_setting('lc_time'), \
         pg_catalog.current_setting('quote_all_identifiers'), \
         pg_catalog.current_setting('array_nulls'), \
         pg_catalog.current_setting('default_text_search_config'), \
         pg_catalog.current_setting('timezone_abbreviations'), \
         pg_catalog.current_setting('gin_fuzzy_search_limit'), \
         CASE WHEN pg_catalog.current_setting('pg_trgm.similarity_threshold', true) \
         OPERATOR(pg_catalog.<>) '' \
         THEN pg_catalog.current_setting('pg_trgm.similarity_threshold', true) ELSE '0.3' END, \
         (ARRAY[\
         pg_catalog.current_setting('row_security', true), \
         pg_catalog.current_setting('session_replication_role', true), \
         pg_catalog.current_setting('default_transaction_read_only', true), \
         pg_catalog.current_setting('default_transaction_isolation', true), \
         pg_catalog.current_setting('default_transaction_deferrable', true), \
         pg_catalog.current_setting('statement_timeout', true), \
         pg_catalog.current_setting('lock_timeout', true), \
         pg_catalog.current_setting('idle_in_transaction_session_timeout', true), \
         pg_catalog.current_setting('idle_session_timeout', true), \
         pg_catalog.current_setting('transaction_timeout', true), \
         pg_catalog.current_setting('synchronous_commit', true), \
         pg_catalog.current_setting('xmloption', true), \
         pg_catalog.current_setting('xmlbinary', true), \
         pg_catalog.current_setting('backslash_quote', true), \
         pg_catalog.current_setting('escape_string_warning', true), \
         pg_catalog.current_setting('check_function_bodies', true), \
         pg_catalog.current_setting('client_min_messages', true), \
         pg_catalog.current_setting('lc_messages', true), \
         pg_catalog.current_setting('default_tablespace', true), \
         pg_catalog.current_setting('temp_tablespaces', true), \
         pg_catalog.current_setting('default_table_access_method', true), \
         pg_catalog.current_setting('exit_on_error', true)])::pg_catalog.text"
        )
    };
}

/// The fence query: the WAL position (`lsn::visible_lsn_sql`: everything the session may have
/// seen), then the state (its reply is hidden from the client). Asked at login as well.
pub const FENCE_SQL: &str = concat!(
    "SELECT ",
    crate::lsn::visible_lsn_sql!(),
    "::pg_catalog.text, ",
    state_columns!()
);

/// [`FENCE_SQL`] for a session that may have committed asynchronously whatever its setting is
/// now (`lsn::async_visible_lsn_sql`; see `PgSession::async_commits`).
pub const FENCE_ASYNC_SQL: &str = concat!(
    "SELECT ",
    crate::lsn::async_visible_lsn_sql!(),
    "::pg_catalog.text, ",
    state_columns!()
);

/// The state alone (before another session takes a reserved backend, and at a session's end).
pub const STATE_SQL: &str = concat!("SELECT ", state_columns!());

/// The query pipelined before a cacheable statement whose answer may be stored: the snapshot
/// (under READ COMMITTED the statement's own is taken later, so it sees everything this one
/// sees), then how the session resolves names as the statement starts. The state read after
/// the statement (the fence) alone misses a name the statement resolved under a path that
/// changed back while it ran: a schema under the session user's name (`"$user"`), made by
/// another connection, whose view renames it. The answer is stored only if both reads serve
/// the cache. Only the [`Resolution`] is read here: the settings and roles of a session whose
/// gate is open change only by what the session runs, which the read after sees, while the
/// resolved path also follows other connections' DDL. (The full state would double this
/// query's cost to the origin: 104 → 230 µs against 104 → 160 µs, measured with pgbench.)
pub const SNAPSHOT_SQL: &str = concat!(
    "SELECT pg_catalog.pg_current_snapshot()::pg_catalog.text, ",
    resolution_columns!()
);

/// The names [`FENCE_SQL`] and [`STATE_SQL`] are prepared under on each backend (then only
/// bound and executed while trusted: parsing and planning them was half the origin's cost of a
/// short batch). They cannot meet a client statement's backend name, which is `pgl_` and 16
/// hex digits (`plan::backend_name`); like those, they are booked in `Backend::prepared`, which
/// `DISCARD ALL` / `DEALLOCATE ALL` clear, and a run that fails forgets the name and falls back
/// to a simple query.
///
/// SQL-level `PREPARE` shares the protocol's name space, so a client can `DEALLOCATE pgl_fence`
/// and `PREPARE` its own statement under the name (in plain text, or unseen through a
/// function's `EXECUTE`), one that reports a clean state. After any batch the core did not
/// vouch for (one that is not a cacheable read or a statement of constants),
/// [`Backend::distrust_own_statements`](super::backend::Backend): the fence statement's
/// answers count only for the session that ran that batch (its own cache gate) until pgline
/// parses it again (closing whatever held the name first), which it does before its answer
/// would serve another session, a stored query result or the pool. Parsing the fence after
/// every write would cost a write-then-read session 35-40 % of its throughput. The state
/// statement, read when a session steals another's backend of the same pool (same user), is
/// not parsed again: that cost TPC-B at 32 clients a quarter of its throughput, and a user's
/// session that forges it harms only sessions of the same user (`docs/decisions.md`).
pub const FENCE_STATEMENT: &str = "pgl_fence";
/// [`FENCE_ASYNC_SQL`]'s name; what is said of [`FENCE_STATEMENT`] holds for it too.
pub const FENCE_ASYNC_STATEMENT: &str = "pgl_fence_async";
pub const STATE_STATEMENT: &str = "pgl_state";
/// The three, as [`Backend::prepared`](super::backend::Backend) books them.
pub const OWN_STATEMENTS: [&str; 3] = [FENCE_STATEMENT, FENCE_ASYNC_STATEMENT, STATE_STATEMENT];
/// Both fence statements.
pub const FENCE_STATEMENTS: [&str; 2] = [FENCE_STATEMENT, FENCE_ASYNC_STATEMENT];

/// The fence statement's name for a session that may (`true`) or may not have committed with
/// `synchronous_commit = off` in a way its current setting does not show.
pub fn fence_name(async_commits: bool) -> &'static str {
    if async_commits {
        FENCE_ASYNC_STATEMENT
    } else {
        FENCE_STATEMENT
    }
}

/// The texts of the fence and state statements of one relay: [`FENCE_SQL`],
/// [`FENCE_ASYNC_SQL`] and [`STATE_SQL`] with a column per custom setting it follows
/// (`pgwire.custom_settings`), read as `current_setting(name, true)`, NULL where the backend
/// never defined it. PostgreSQL lists no custom setting (`app.tenant`) in `pg_settings`, so
/// only a name can find one: a function that sets it with `set_config(.., false)` changes no
/// other column.
#[derive(Debug, Clone)]
pub struct OwnSql {
    fence: String,
    fence_async: String,
    state: String,
}

impl OwnSql {
    /// For `custom` (names `config::PgwireConfig::validate` accepted: letters, digits, `_`, `$`
    /// and `.`, so no quote can end the literal).
    pub fn new(custom: &[String]) -> OwnSql {
        let mut extra = String::new();
        for name in custom {
            debug_assert!(name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_$.".contains(&b)));
            extra.push_str(&format!(", pg_catalog.current_setting('{name}', true)"));
        }
        OwnSql {
            fence: format!("{FENCE_SQL}{extra}"),
            fence_async: format!("{FENCE_ASYNC_SQL}{extra}"),
            state: format!("{STATE_SQL}{extra}"),
        }
    }

    /// The fence statement's name and text (see [`fence_name`]).
    pub fn fence(&self, async_commits: bool) -> (&'static str, &str) {
        let sql = if async_commits {
            &self.fence_async
        } else {
            &self.fence
        };
        (fence_name(async_commits), sql)
    }

    /// The state statement's text (prepared as [`STATE_STATEMENT`]).
    pub fn state(&self) -> &str {
        &self.state
    }
}

impl Default for OwnSql {
    fn default() -> Self {
        OwnSql::new(&[])
    }
}

/// The custom settings (`app.tenant`) that the current database's row-level security policies
/// (`polqual`, `polwithcheck`) and the bodies of its functions not written in C pass as literals
/// to `current_setting` or `set_config`, lower-cased, one per row. A name built at run time
/// (`format('app.%s', ..)`) is not found.
pub const CUSTOM_SETTING_NAMES_SQL: &str = r#"SELECT DISTINCT pg_catalog.lower(m[1]) FROM (
      SELECT pg_catalog.pg_get_expr(p.polqual, p.polrelid) AS src FROM pg_catalog.pg_policy p
      UNION ALL
      SELECT pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid) FROM pg_catalog.pg_policy p
      UNION ALL
      SELECT f.prosrc FROM pg_catalog.pg_proc f
        JOIN pg_catalog.pg_language l ON l.oid = f.prolang
        JOIN pg_catalog.pg_namespace n ON n.oid = f.pronamespace
       WHERE l.lanname NOT IN ('internal', 'c')
         AND n.nspname NOT IN ('pg_catalog', 'information_schema')) s,
    pg_catalog.regexp_matches(s.src,
      '(?:current_setting|set_config)\s*\(\s*''([a-z_][a-z0-9_$]*(?:\.[a-z_][a-z0-9_$]*)+)''',
      'gi') m
    ORDER BY 1"#;

/// The names of `found` ([`CUSTOM_SETTING_NAMES_SQL`]) that `listed` (`pgwire.custom_settings`)
/// lacks; setting names compare without case, as PostgreSQL's do.
pub fn unlisted_custom_settings<'a>(found: &'a [String], listed: &[String]) -> Vec<&'a str> {
    found
        .iter()
        .filter(|f| !listed.iter().any(|l| l.eq_ignore_ascii_case(f)))
        .map(String::as_str)
        .collect()
}

/// The one search path whose name resolution the store follows: unqualified names are read as
/// `public`'s (`KeySpace::pg_table_named`), functions and operators as `pg_catalog`'s.
pub const CACHE_SEARCH_PATH: &str = "pg_catalog,public";

/// The columns of [`STATE_SQL`] (and of the fence statements after their LSN), before the
/// custom settings of [`OwnSql`].
pub const STATE_COLUMNS: usize = 24;

/// A clean state's columns as the origin sends them, in [`OriginState`]'s order (for tests).
#[cfg(test)]
pub(super) const CLEAN_COLUMNS: [&str; STATE_COLUMNS] = [
    "app",
    "app",
    "pg_catalog,public",
    "false",
    "1",
    "hex",
    "C.UTF-8",
    "off",
    "ISO, MDY",
    "postgres",
    "UTC",
    "UTF8",
    "on",
    "\"$user\", public",
    "false",
    "C.UTF-8",
    "C.UTF-8",
    "off",
    "on",
    "pg_catalog.english",
    "Default",
    "0",
    "0.3",
    "{on,origin,off,\"read committed\",off,0,0,0,0,NULL,on,content,base64,safe_encoding,on,on,\
     notice,C.UTF-8,\"\",\"\",heap,off}",
];

/// Whose rights a session reads with and how it resolves names: the first columns of its
/// state (see the module doc), also read before a statement whose answer may be stored
/// ([`SNAPSHOT_SQL`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    pub session_user: String,
    pub current_user: String,
    /// `current_schemas(true)` joined by `,`, without an empty temporary schema.
    pub search_path: String,
    pub temp_objects: bool,
}

impl Resolution {
    /// From [`resolution_columns`]' text columns (`None` when any is missing or NULL).
    pub fn from_columns(cols: &[Option<String>]) -> Option<Resolution> {
        let text = |i: usize| cols.get(i).cloned().flatten();
        let temp_objects = text(3)? == "true";
        let mut search_path = text(2)?;
        if !temp_objects {
            // An empty temporary schema stays on the path (after DISCARD ALL) and hides nothing.
            if let Some(rest) = search_path
                .strip_prefix("pg_temp_")
                .and_then(|r| r.split_once(','))
                .filter(|(n, _)| n.bytes().all(|b| b.is_ascii_digit()))
                .map(|(_, rest)| rest.to_owned())
            {
                search_path = rest;
            }
        }
        Some(Resolution {
            session_user: text(0)?,
            current_user: text(1)?,
            search_path,
            temp_objects,
        })
    }

    /// Whether a session that logged in as `login_user` reads with pgline's rights and
    /// resolves names as the store does.
    pub fn serves_cache(&self, login_user: &str) -> bool {
        self.session_user == login_user
            && self.current_user == login_user
            && self.search_path == CACHE_SEARCH_PATH
            && !self.temp_objects
    }
}

/// One backend's session state (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginState {
    pub resolution: Resolution,
    /// [`UNREPORTED`]'s values, in order.
    pub settings: Baseline,
    /// The reported output settings (`DateStyle`, `IntervalStyle`, `TimeZone`,
    /// `client_encoding`, `standard_conforming_strings`): the core follows them from
    /// ParameterStatus, which a batch on another backend of the pool does not repeat, so they
    /// are part of the fingerprint (a pool's backends all have its sessions' values).
    pub reported: [String; 5],
    /// The `search_path` setting as written: `SHOW search_path` answers it, and schemas that do
    /// not exist are in it but not in the resolved path (fingerprint only).
    pub search_path_setting: String,
    /// Listens on a channel or holds a cursor `WITH HOLD` (fingerprint only).
    pub session_objects: bool,
    /// The custom settings the relay follows ([`OwnSql`]), in order; `None` where undefined
    /// (fingerprint only: a statement that reads one is never answered from cache).
    pub custom: Vec<Option<String>>,
    /// [`WATCHED`]'s values as one text (not in the fingerprint: see [`settings_clean`]).
    pub watched: String,
}

impl OriginState {
    /// From the text columns of the state query (`None` when any is missing or NULL); the
    /// columns past [`STATE_COLUMNS`] are the custom settings, which may be NULL.
    pub fn from_columns(cols: &[Option<String>]) -> Option<OriginState> {
        let text = |i: usize| cols.get(i).cloned().flatten();
        Some(OriginState {
            resolution: Resolution::from_columns(cols)?,
            settings: [
                text(4)?,
                text(5)?,
                text(6)?,
                text(7)?,
                text(15)?,
                text(16)?,
                text(17)?,
                text(18)?,
                text(19)?,
                text(20)?,
                text(21)?,
                text(22)?,
            ],
            reported: [text(8)?, text(9)?, text(10)?, text(11)?, text(12)?],
            search_path_setting: text(13)?,
            session_objects: text(14)? == "true",
            custom: cols.get(STATE_COLUMNS..).unwrap_or_default().to_vec(),
            watched: text(23)?,
        })
    }

    /// Whether cached answers are the origin's for a session in this state that logged in as
    /// `login_user`, given the output settings of pgline's own sessions (`baseline`).
    pub fn serves_cache(&self, login_user: &str, baseline: &Baseline) -> bool {
        self.resolution.serves_cache(login_user) && &self.settings == baseline
    }

    /// The whole state as one comparable text.
    pub fn fingerprint(&self) -> String {
        let r = &self.resolution;
        let mut f = format!(
            "{}\u{1f}{}\u{1f}{}\u{1f}{}",
            r.session_user, r.current_user, r.search_path, r.temp_objects
        );
        let raw = std::slice::from_ref(&self.search_path_setting);
        let settings = &self.settings[..FINGERPRINTED];
        for s in settings.iter().chain(&self.reported).chain(raw) {
            f.push('\u{1f}');
            f.push_str(s);
        }
        if self.session_objects {
            f.push_str("\u{1f}objects");
        }
        // Length-prefixed, and NULL apart from '' (what `DISCARD ALL` leaves of a custom
        // setting, where a new connection reads NULL).
        for v in &self.custom {
            match v {
                Some(v) => f.push_str(&format!("\u{1e}{}:{v}", v.len())),
                None => f.push_str("\u{1e}null"),
            }
        }
        f
    }
}

/// Runs pgline's statement `name` (`sql`, returning one row) on `b` once its cancels have
/// landed, and returns the row's columns; `Ok(None)` when the origin answered with an error or
/// no row.
pub async fn query_row(b: &mut Backend, name: &str, sql: &str) -> io::Result<Option<Row>> {
    Ok(b.query_prepared(name, sql).await?.flatten())
}

/// Whether `b`, whose state read `s` shows, holds none of [`WATCHED`] as its session's own:
/// true at once when `s` shows the values last found clean on `b` (at its login, after its
/// `DISCARD ALL`, or by an earlier ask); otherwise the origin is asked
/// ([`SESSION_SETTINGS_SQL`]), and values it finds clean (a reload's) are remembered. An error
/// answer counts as not clean; `b` must be idle or in a transaction that is not aborted.
pub async fn settings_clean(b: &mut Backend, s: &OriginState) -> io::Result<bool> {
    if b.clean_settings.as_deref() == Some(s.watched.as_str()) {
        return Ok(true);
    }
    let clean = matches!(b.simple(&SESSION_SETTINGS_SQL).await?, Some(None));
    if clean {
        b.clean_settings = Some(s.watched.clone());
    }
    Ok(clean)
}

/// The backend's state, read with `sql`'s state statement (prepared as [`STATE_STATEMENT`]).
pub async fn ask_state(b: &mut Backend, sql: &OwnSql) -> io::Result<Option<OriginState>> {
    Ok(b.query_prepared(STATE_STATEMENT, sql.state())
        .await?
        .flatten()
        .as_deref()
        .and_then(OriginState::from_columns))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cols(v: &[&str]) -> Vec<Option<String>> {
        v.iter().map(|s| Some((*s).to_owned())).collect()
    }

    /// The clean state's [`UNREPORTED`] values (columns 4-7 and 15 on).
    fn baseline() -> Baseline {
        [4, 5, 6, 7, 15, 16, 17, 18, 19, 20, 21, 22].map(|i| CLEAN_COLUMNS[i].to_owned())
    }

    fn clean() -> Vec<Option<String>> {
        cols(&CLEAN_COLUMNS)
    }

    #[test]
    fn the_clean_state_serves_the_cache() {
        let s = OriginState::from_columns(&clean()).unwrap();
        assert!(s.serves_cache("app", &baseline()));
        assert!(!s.serves_cache("other", &baseline()));
    }

    #[test]
    fn a_statement_that_started_on_another_path_is_not_stored() {
        let r = |path: &str, temp: &str| {
            Resolution::from_columns(&cols(&["app", "app", path, temp])).unwrap()
        };
        assert!(r("pg_catalog,public", "false").serves_cache("app"));
        // An empty temporary schema hides nothing; one holding a relation or type may.
        assert!(r("pg_temp_3,pg_catalog,public", "false").serves_cache("app"));
        assert!(!r("pg_temp_3,pg_catalog,public", "true").serves_cache("app"));
        // A schema under the user's name, made after login ("$user" first on the path).
        assert!(!r("pg_catalog,app,public", "false").serves_cache("app"));
        assert!(!r("pg_catalog,public", "false").serves_cache("other"));
        assert_eq!(Resolution::from_columns(&cols(&["app", "app", "x"])), None);
    }

    #[test]
    fn each_difference_refuses() {
        for (i, v) in [
            (0, "bob"),
            (1, "bob"),
            (2, "shadow,pg_catalog,public"),
            (2, "pg_catalog,app,public"),
            (4, "3"),
            (5, "escape"),
            (6, "de_DE.UTF-8"),
            (7, "on"),
            (10, "Asia/Tokyo"),
            (13, "nowhere, public"),
            (14, "true"),
            (15, "de_DE.UTF-8"),
            (16, "de_DE.UTF-8"),
            (17, "on"),
            (18, "off"),
            (19, "pg_catalog.simple"),
            (20, "India"),
            (21, "100"),
        ] {
            let mut c = clean();
            c[i] = Some(v.to_owned());
            let s = OriginState::from_columns(&c).unwrap();
            // The reported settings are the core's to judge (ParameterStatus); the written
            // search path changes nothing the cache serves (the resolved one is checked).
            assert_eq!(
                s.serves_cache("app", &baseline()),
                (8..15).contains(&i),
                "column {i} = {v}"
            );
            assert_ne!(
                s.fingerprint(),
                OriginState::from_columns(&clean()).unwrap().fingerprint()
            );
        }
    }

    #[test]
    fn an_empty_temporary_schema_hides_nothing() {
        let mut c = clean();
        c[2] = Some("pg_temp_12,pg_catalog,public".into());
        let s = OriginState::from_columns(&c).unwrap();
        assert!(s.serves_cache("app", &baseline()));
        c[3] = Some("true".into());
        let s = OriginState::from_columns(&c).unwrap();
        assert!(!s.serves_cache("app", &baseline()));
    }

    /// The trigram threshold refuses the cache but leaves the fingerprint alone: a placeholder's
    /// spelling changes when the library loads.
    #[test]
    fn the_trigram_threshold_counts_for_the_verdict_only() {
        let mut c = clean();
        c[22] = Some("0.1".to_owned());
        let s = OriginState::from_columns(&c).unwrap();
        assert!(!s.serves_cache("app", &baseline()));
        assert_eq!(
            s.fingerprint(),
            OriginState::from_columns(&clean()).unwrap().fingerprint()
        );
    }

    #[test]
    fn the_state_query_reads_every_unreported_setting_in_order() {
        let mut at = 0;
        for n in UNREPORTED {
            let read = format!("pg_catalog.current_setting('{n}'");
            at += STATE_SQL[at..]
                .find(&read)
                .unwrap_or_else(|| panic!("{n} not read after byte {at} of the query"));
        }
    }

    /// The watched settings are read last, in [`WATCHED`]'s order and as one text.
    #[test]
    fn the_watched_settings_are_read_last_as_one_text() {
        let joined = STATE_SQL.find("(ARRAY[").expect("one watched column");
        let mut at = joined;
        for n in WATCHED {
            let read = format!("pg_catalog.current_setting('{n}', true)");
            at += STATE_SQL[at..]
                .find(&read)
                .unwrap_or_else(|| panic!("{n} not read after byte {at} of the query"));
        }
        assert_eq!(
            STATE_SQL[joined..].matches("current_setting(").count(),
            WATCHED.len()
        );
    }

    /// The watched settings are not in the fingerprint (a reload changes them on every
    /// backend at once; `settings_clean` tells a reload's values from a session's).
    #[test]
    fn the_watched_settings_are_read_but_not_fingerprinted() {
        let clean = OriginState::from_columns(&clean()).unwrap();
        // PostgreSQL 15's values: it has no `transaction_timeout` (NULL).
        let values: Vec<&str> = clean.watched[1..clean.watched.len() - 1]
            .split(',')
            .collect();
        assert_eq!(values.len(), WATCHED.len());
        assert_eq!(values[9], "NULL");
        let mut c = super::tests::clean();
        c[23] = Some(clean.watched.replacen("0", "5000", 1));
        let moved = OriginState::from_columns(&c).unwrap();
        assert_ne!(moved.watched, clean.watched);
        assert_eq!(moved.fingerprint(), clean.fingerprint());
        assert!(moved.serves_cache("app", &baseline()));
        c[23] = None;
        assert!(OriginState::from_columns(&c).is_none());
    }

    /// A followed custom setting is one more column of each of pgline's statements, and part
    /// of the fingerprint, where NULL (never defined on the backend) is not '' (what `DISCARD
    /// ALL` leaves); it does not touch the cache verdict (`current_setting` is never cached).
    #[test]
    fn custom_settings_are_read_and_fingerprinted() {
        let sql = OwnSql::new(&["app.tenant".to_owned(), "app.region".to_owned()]);
        let (name, fence) = sql.fence(false);
        assert_eq!(name, FENCE_STATEMENT);
        for text in [fence, sql.fence(true).1, sql.state()] {
            assert!(text.ends_with(
                ", pg_catalog.current_setting('app.tenant', true), \
                 pg_catalog.current_setting('app.region', true)"
            ));
        }
        assert_eq!(OwnSql::default().state(), STATE_SQL);
        let with = |custom: &[Option<&str>]| {
            let mut c = clean();
            c.extend(custom.iter().map(|v| v.map(str::to_owned)));
            OriginState::from_columns(&c).unwrap()
        };
        let login = with(&[None, Some("eu")]);
        assert_eq!(login.custom, [None, Some("eu".to_owned())]);
        assert!(login.serves_cache("app", &baseline()));
        for other in [
            with(&[Some(""), Some("eu")]),
            with(&[Some("42"), Some("eu")]),
            with(&[None, Some("us")]),
            with(&[None, None]),
        ] {
            assert_ne!(
                other.fingerprint(),
                login.fingerprint(),
                "{:?}",
                other.custom
            );
            assert!(other.serves_cache("app", &baseline()));
        }
        assert_eq!(with(&[None, Some("eu")]).fingerprint(), login.fingerprint());
        // Values cannot run into each other.
        assert_ne!(
            with(&[Some("a"), Some("b")]).fingerprint(),
            with(&[Some("a\u{1e}1:b"), None]).fingerprint()
        );
    }

    #[test]
    fn unlisted_custom_settings_compare_without_case() {
        let found = ["app.region".to_owned(), "app.tenant".to_owned()];
        let listed = ["App.Tenant".to_owned()];
        assert_eq!(unlisted_custom_settings(&found, &listed), ["app.region"]);
        assert!(unlisted_custom_settings(&found, &found).is_empty());
    }

    #[test]
    fn missing_or_null_columns_are_no_state() {
        assert!(OriginState::from_columns(&clean()[..23]).is_none());
        let mut c = clean();
        c[1] = None;
        assert!(OriginState::from_columns(&c).is_none());
    }

    #[test]
    fn data_rows_are_read_column_by_column() {
        let mut buf = bytes::BytesMut::new();
        let body: Vec<u8> = [
            &2i16.to_be_bytes()[..],
            &3i32.to_be_bytes(),
            b"0/1",
            &(-1i32).to_be_bytes(),
        ]
        .concat();
        buf.extend_from_slice(b"D");
        buf.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        buf.extend_from_slice(&body);
        assert_eq!(
            super::super::backend::row_texts(&buf).unwrap(),
            vec![Some("0/1".to_owned()), None]
        );
        assert!(super::super::backend::row_texts(&buf[..buf.len() - 1]).is_none());
    }
}
