//! pgline's configuration: a TOML file, overridden by `PGLINE_<SECTION>_<KEY>` environment
//! variables, overridden by command-line flags (`--set section.key=value` and a few named ones).
//!
//! Every section has its own struct with `deny_unknown_fields`, defaults as named constants and a
//! `validate()`; an unknown key or a bad value stops start-up with a message naming it. The
//! dataplane never reads files or the environment: [`Config::engine`] and [`Config::store`] hand
//! it plain structs.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use pgline_dataplane::engine::{self, limits, ConnLimits, EngineConfig};
use pgline_dataplane::resp::Limits;
use pgline_dataplane::store::StoreConfig;
use pgline_hugepages::PageLevel;
use serde::{Deserialize, Serialize};

mod cluster;
mod nic;
mod pgwire;
mod tls;
pub use cluster::{ClusterConfig, ClusterNodeConfig, ClusterShardConfig};
pub use nic::{NicConfig, NicMode};
pub use pgwire::PgwireConfig;
pub use tls::{CertInfo, FrontTls, PgwireTls, TlsAuthClients, TlsConfig, TlsError};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config: {0}")]
    Parse(String),
    #[error("config: {key}: {reason}")]
    Invalid { key: &'static str, reason: String },
}

/// Sections that `PGLINE_<SECTION>_<KEY>` variables may set.
pub const SECTIONS: &[&str] = &[
    "origin",
    "resp",
    "nic",
    "store",
    "replication",
    "catalog",
    "log",
    "api",
    "pgwire",
    "tls",
    "cluster",
];

/// Keys whose value is always a string when it comes from an environment variable, even if it
/// happens to read as a TOML number or boolean (a token `12345678` stays a string).
const STRING_KEYS: &[&str] = &["api.token", "resp.password"];

#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub origin: OriginConfig,
    pub resp: RespConfig,
    pub nic: NicConfig,
    pub store: StoreSection,
    pub replication: ReplicationConfig,
    pub catalog: CatalogConfig,
    pub log: LogConfig,
    pub api: ApiConfig,
    pub pgwire: PgwireConfig,
    pub tls: TlsConfig,
    pub cluster: ClusterConfig,
}

pub const DEFAULT_ORIGIN_URL: &str = "host=127.0.0.1 port=5432 user=postgres dbname=postgres";
pub const DEFAULT_POOL_SIZE: usize = 8;
pub const DEFAULT_FILL_BATCH: usize = 256;
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 3_000;
pub const DEFAULT_QUERY_TIMEOUT_MS: u64 = 5_000;

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OriginConfig {
    /// libpq-style `key=value` string or `postgres://` URL.
    pub url: String,
    /// Connections used for fills.
    pub pool_size: usize,
    /// Most keys of one table read by one batched origin query.
    pub fill_batch: usize,
    pub connect_timeout_ms: u64,
    pub query_timeout_ms: u64,
    /// Fault injection for tests: hold every fill this long after its origin read, widening the
    /// fill-vs-write race window. Must be 0 unless built with the `fault-injection` feature (the
    /// tests enable it); at most [`MAX_FILL_DELAY_MS`], and a fill, delay included, never
    /// outlives `query_timeout_ms`.
    pub fill_delay_ms: u64,
}

impl Default for OriginConfig {
    fn default() -> Self {
        OriginConfig {
            url: DEFAULT_ORIGIN_URL.into(),
            pool_size: DEFAULT_POOL_SIZE,
            fill_batch: DEFAULT_FILL_BATCH,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            query_timeout_ms: DEFAULT_QUERY_TIMEOUT_MS,
            fill_delay_ms: 0,
        }
    }
}

impl OriginConfig {
    /// The parsed connection settings (`tokio-postgres`'s, the TLS settings, the session
    /// attributes; see `origin::url`), with the session settings pgline's text formats rely on.
    pub fn pg_config(&self) -> Result<crate::origin::Settings, ConfigError> {
        let mut s =
            crate::origin::Settings::parse(&self.url).map_err(|reason| ConfigError::Invalid {
                key: "origin.url",
                reason,
            })?;
        s.pg.options(SESSION_OPTIONS);
        s.pg.application_name("pgline");
        s.pg.connect_timeout(Duration::from_millis(self.connect_timeout_ms));
        Ok(s)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.pg_config()?;
        check(
            self.pool_size >= 1 && self.pool_size <= 256,
            "origin.pool_size",
            "must be 1..=256",
        )?;
        check(
            self.fill_batch >= 1 && self.fill_batch <= 10_000,
            "origin.fill_batch",
            "must be 1..=10000",
        )?;
        check(
            self.connect_timeout_ms >= 1,
            "origin.connect_timeout_ms",
            "must be > 0",
        )?;
        check(
            self.query_timeout_ms >= 1,
            "origin.query_timeout_ms",
            "must be > 0",
        )?;
        check(
            self.fill_delay_ms == 0 || cfg!(feature = "fault-injection"),
            "origin.fill_delay_ms",
            "is a fault-injection knob for tests: this build has no `fault-injection` feature, \
             so it must be 0",
        )?;
        check(
            self.fill_delay_ms <= MAX_FILL_DELAY_MS,
            "origin.fill_delay_ms",
            "must be 0..=10000",
        )
    }
}

/// Longest `origin.fill_delay_ms` (a fill is also cut at `origin.query_timeout_ms`).
pub const MAX_FILL_DELAY_MS: u64 = 10_000;

/// Session settings for every origin connection (fills and replication), so values arrive in the
/// text forms the row encoder expects.
pub const SESSION_OPTIONS: &str =
    "-c TimeZone=UTC -c DateStyle=ISO,MDY -c IntervalStyle=postgres -c extra_float_digits=1";

pub const DEFAULT_LISTEN: &str = "127.0.0.1:6380";
/// Longest connection timeout accepted (a day).
pub(crate) const MAX_TIMEOUT_MS: u64 = 86_400_000;

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RespConfig {
    pub listen: String,
    pub cores: usize,
    /// RESP connections open at once (the PostgreSQL port has `pgwire.max_sessions`).
    pub max_connections: usize,
    /// RESP connections from one source address (0: no limit; both transports).
    pub max_connections_per_source: usize,
    /// Empty: no AUTH needed.
    pub password: String,
    pub max_request_bytes: usize,
    pub max_reply_backlog: usize,
    /// Buffer memory of all client connections (RESP and PostgreSQL) beyond their initial
    /// buffers, in bytes. At the cap, connections with unwritten output are not read, and
    /// those holding the most are closed.
    pub max_reply_memory: usize,
    /// A connection not authenticated this long after it connected is closed (0: never; only
    /// with a `password`).
    pub auth_timeout_ms: u64,
    /// A connection that sent nothing this long, with nothing in flight, is closed (0: never).
    pub idle_timeout_ms: u64,
    /// Wrong passwords on one connection before it is closed (0: no limit).
    pub max_auth_failures: u32,
    pub max_args: usize,
    pub requests_per_turn: usize,
    pub spin_polls: u32,
    pub miss_queue: usize,
    /// `ip:port` of the RESP TLS listener beside `listen` (empty: none); needs `[tls]`.
    pub tls_listen: String,
    /// Client certificates on `tls_listen`: `no`, `optional`, `yes` (Redis's names; Redis's
    /// default is `yes`, pgline's `no`).
    pub tls_auth_clients: TlsAuthClients,
    /// Client-side caching (`CLIENT TRACKING`): keys remembered for tracking clients, per
    /// appliance, split over cores (Redis's `tracking-table-max-keys`); beyond it the oldest are
    /// invalidated. Key text is bounded too, at 128 bytes a key on average.
    pub tracking_table_max_keys: usize,
}

impl Default for RespConfig {
    fn default() -> Self {
        RespConfig {
            listen: DEFAULT_LISTEN.into(),
            cores: engine::DEFAULT_CORES,
            max_connections: engine::DEFAULT_MAX_CONNECTIONS,
            max_connections_per_source: 0,
            password: String::new(),
            max_request_bytes: engine::DEFAULT_MAX_REQUEST_BYTES,
            max_reply_backlog: engine::DEFAULT_MAX_REPLY_BACKLOG,
            max_reply_memory: limits::DEFAULT_MAX_REPLY_MEMORY,
            auth_timeout_ms: limits::DEFAULT_AUTH_TIMEOUT_MS,
            idle_timeout_ms: 0,
            max_auth_failures: limits::DEFAULT_MAX_AUTH_FAILURES,
            max_args: Limits::default().max_args,
            requests_per_turn: engine::DEFAULT_REQUESTS_PER_TURN,
            spin_polls: engine::DEFAULT_SPIN_POLLS,
            miss_queue: 4096,
            tls_listen: String::new(),
            tls_auth_clients: TlsAuthClients::No,
            tracking_table_max_keys: limits::DEFAULT_TRACKING_TABLE_MAX_KEYS,
        }
    }
}

impl RespConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        self.listen
            .parse::<SocketAddr>()
            .map_err(|e| ConfigError::Invalid {
                key: "resp.listen",
                reason: format!("{:?} is not an ip:port address ({e})", self.listen),
            })?;
        check(
            self.cores >= 1 && self.cores <= 256,
            "resp.cores",
            "must be 1..=256",
        )?;
        check(
            self.max_connections >= 1,
            "resp.max_connections",
            "must be >= 1",
        )?;
        check(
            self.max_request_bytes >= 1024,
            "resp.max_request_bytes",
            "must be >= 1024",
        )?;
        check(
            self.max_reply_backlog >= 64 * 1024,
            "resp.max_reply_backlog",
            "must be >= 65536",
        )?;
        check(
            self.max_reply_memory >= self.max_reply_backlog.max(1 << 20),
            "resp.max_reply_memory",
            "must be >= 1 MiB and >= resp.max_reply_backlog",
        )?;
        check(
            self.auth_timeout_ms <= MAX_TIMEOUT_MS,
            "resp.auth_timeout_ms",
            "must be <= 86400000 (0: off)",
        )?;
        check(
            self.idle_timeout_ms <= MAX_TIMEOUT_MS,
            "resp.idle_timeout_ms",
            "must be <= 86400000 (0: off)",
        )?;
        check(
            self.max_args >= 2 && self.max_args <= 1_000_000,
            "resp.max_args",
            "must be 2..=1000000",
        )?;
        check(
            self.requests_per_turn >= 1,
            "resp.requests_per_turn",
            "must be >= 1",
        )?;
        check(self.miss_queue >= 16, "resp.miss_queue", "must be >= 16")?;
        check(
            (1..=100_000_000).contains(&self.tracking_table_max_keys),
            "resp.tracking_table_max_keys",
            "must be 1..=100000000",
        )?;
        if !self.tls_listen.is_empty() {
            self.tls_listen
                .parse::<SocketAddr>()
                .map_err(|e| ConfigError::Invalid {
                    key: "resp.tls_listen",
                    reason: format!("{:?} is not an ip:port address ({e})", self.tls_listen),
                })?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSection {
    /// Total memory of the store (index + entries), e.g. `"256MiB"` or a number of bytes.
    #[schema(value_type = u64)]
    pub memory: ByteSize,
    #[schema(value_type = u64)]
    pub segment: ByteSize,
    /// Largest page size to try: `1GiB`, `2MiB`, `THP` or `4KiB`.
    pub max_page: String,
    pub prefault: bool,
}

impl Default for StoreSection {
    fn default() -> Self {
        let d = StoreConfig::default();
        StoreSection {
            memory: ByteSize(d.memory_bytes as u64),
            segment: ByteSize(d.segment_bytes as u64),
            max_page: "1GiB".into(),
            prefault: d.prefault,
        }
    }
}

impl StoreSection {
    pub fn page_level(&self) -> Result<PageLevel, ConfigError> {
        match self.max_page.to_ascii_lowercase().as_str() {
            "1gib" | "1g" => Ok(PageLevel::Huge1G),
            "2mib" | "2m" => Ok(PageLevel::Huge2M),
            "thp" => Ok(PageLevel::Transparent),
            "4kib" | "4k" => Ok(PageLevel::Base),
            other => Err(ConfigError::Invalid {
                key: "store.max_page",
                reason: format!("{other:?} is not one of 1GiB, 2MiB, THP, 4KiB"),
            }),
        }
    }
}

/// A byte count written as a number or as `"<n>[KiB|MiB|GiB]"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "toml::Value", into = "u64")]
pub struct ByteSize(pub u64);

impl From<ByteSize> for u64 {
    fn from(b: ByteSize) -> u64 {
        b.0
    }
}

impl TryFrom<toml::Value> for ByteSize {
    type Error = String;
    fn try_from(v: toml::Value) -> Result<Self, String> {
        match v {
            toml::Value::Integer(n) if n >= 0 => Ok(ByteSize(n as u64)),
            toml::Value::String(s) => parse_size(&s).map(ByteSize),
            other => Err(format!(
                "{other} is not a size (a number of bytes or e.g. \"256MiB\")"
            )),
        }
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a size"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit {unit:?} (use KiB, MiB or GiB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

pub const DEFAULT_SLOT: &str = "pgline";
pub const DEFAULT_PUBLICATION: &str = "pgline";
pub const DEFAULT_MAX_LAG_MS: u64 = 10_000;

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicationConfig {
    /// Where the WAL stream and the slot are, if not on the origin: a standby's connection
    /// string (PostgreSQL 16+, `hot_standby_feedback = on`, `wal_level = logical`). The
    /// publication, fills and the relay stay on `origin.url`. Same syntax as `origin.url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    pub slot: String,
    pub publication: String,
    /// Past this lag (or with the stream down) hits are not served: reads go to the origin.
    pub max_lag_ms: u64,
    pub status_interval_ms: u64,
    pub reconnect_backoff_ms: u64,
    /// Bound on the bytes of changes buffered for open transactions (Begin…Commit and
    /// streamed); past it the largest transaction is applied as a flush of its tables.
    pub max_txn_memory: usize,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        ReplicationConfig {
            url: None,
            slot: DEFAULT_SLOT.into(),
            publication: DEFAULT_PUBLICATION.into(),
            max_lag_ms: DEFAULT_MAX_LAG_MS,
            status_interval_ms: 1_000,
            reconnect_backoff_ms: 500,
            max_txn_memory: crate::wal::DEFAULT_MAX_TXN_MEMORY,
        }
    }
}

impl ReplicationConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let ident = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        check(
            ident(&self.slot),
            "replication.slot",
            "must be 1-63 of [a-z0-9_]",
        )?;
        check(
            ident(&self.publication),
            "replication.publication",
            "must be 1-63 of [a-z0-9_]",
        )?;
        check(
            self.status_interval_ms >= 10,
            "replication.status_interval_ms",
            "must be >= 10",
        )?;
        check(
            self.reconnect_backoff_ms >= 10,
            "replication.reconnect_backoff_ms",
            "must be >= 10",
        )?;
        check(
            self.max_txn_memory >= 1 << 20,
            "replication.max_txn_memory",
            "must be >= 1048576 (1 MiB)",
        )
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CatalogConfig {
    /// Tables to cache (`name` or `schema.name`); empty: every table with a primary key.
    pub tables: Vec<String>,
    /// Extra key prefixes: `prefixes = { users = "u" }` makes `u:42` name `users` row 42.
    pub prefixes: std::collections::BTreeMap<String, String>,
    /// Cached tables (`name`, `schema.name` or a prefix) switched off: their reads pass through
    /// to the origin and nothing of them is kept. Changes at run time.
    pub disabled: Vec<String>,
    /// How often the writer checks the cached tables' OIDs and names against the origin: DROP
    /// and RENAME are not in the WAL, so this bounds how long a dropped table's rows are served.
    pub check_interval_ms: u64,
}

impl Default for CatalogConfig {
    fn default() -> Self {
        CatalogConfig {
            tables: Vec::new(),
            prefixes: Default::default(),
            disabled: Vec::new(),
            check_interval_ms: 1000,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A `tracing` filter, e.g. `info` or `pgline=debug`.
    pub level: String,
    pub json: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".into(),
            json: false,
        }
    }
}

pub const DEFAULT_API_LISTEN: &str = "127.0.0.1:6381";
pub const DEFAULT_API_MAX_BODY_BYTES: usize = 64 * 1024;
/// What every output shows instead of a secret.
pub const REDACTED: &str = "***";

/// The HTTP management API (`controlplane/src/api`).
///
/// `Debug` is written by hand so that the token never reaches a log line.
#[derive(Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    pub enabled: bool,
    pub listen: String,
    /// Bearer token for mutating calls (and reads unless `open_reads`). None or empty: mutating
    /// calls answer 403. Left out of serialized output when unset (a patch cannot hold null).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Let GETs through without the token.
    pub open_reads: bool,
    /// Largest request body accepted; larger ones answer 413.
    pub max_body_bytes: usize,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            enabled: true,
            listen: DEFAULT_API_LISTEN.into(),
            token: None,
            open_reads: false,
            max_body_bytes: DEFAULT_API_MAX_BODY_BYTES,
        }
    }
}

impl std::fmt::Debug for ApiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiConfig")
            .field("enabled", &self.enabled)
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| REDACTED))
            .field("open_reads", &self.open_reads)
            .field("max_body_bytes", &self.max_body_bytes)
            .finish()
    }
}

impl ApiConfig {
    /// The configured token; an empty string counts as none.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref().filter(|t| !t.is_empty())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.listen
            .parse::<SocketAddr>()
            .map_err(|e| ConfigError::Invalid {
                key: "api.listen",
                reason: format!("{:?} is not an ip:port address ({e})", self.listen),
            })?;
        check(
            self.token()
                .is_none_or(|t| t.bytes().all(|b| b.is_ascii_graphic())),
            "api.token",
            "must be printable ASCII without spaces (it travels in an HTTP header)",
        )?;
        check(
            (1024..=16 << 20).contains(&self.max_body_bytes),
            "api.max_body_bytes",
            "must be 1024..=16777216",
        )
    }
}

/// Whether a `catalog.tables` name is qualified by a system schema (`pg_catalog.pg_authid`,
/// `"information_schema".tables`). Unqualified names are checked on the origin at start-up
/// (`catalog::REFUSAL_SQL`), where `pg_authid` resolves to `pg_catalog`.
fn names_system_schema(table: &str) -> bool {
    let t = table.trim();
    let schema = if let Some(rest) = t.strip_prefix('"') {
        match rest.find('"') {
            Some(end) if rest[end + 1..].starts_with('.') => rest[..end].to_string(),
            _ => return false,
        }
    } else {
        match t.find('.') {
            Some(dot) => t[..dot].to_ascii_lowercase(),
            None => return false,
        }
    };
    schema == "information_schema" || schema.starts_with("pg_")
}

fn check(ok: bool, key: &'static str, reason: &str) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            key,
            reason: reason.into(),
        })
    }
}

impl Config {
    /// Loads `path` (if any), applies `PGLINE_*` variables from `env`, then `--set` overrides.
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: &[String],
    ) -> Result<Config, ConfigError> {
        let mut table = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.display().to_string(),
                    source,
                })?;
                text.parse::<toml::Table>()
                    .map_err(|e| ConfigError::Parse(format!("{}: {e}", p.display())))?
            }
            None => toml::Table::new(),
        };
        for (name, value) in env {
            let Some(rest) = name.strip_prefix("PGLINE_") else {
                continue;
            };
            let Some((section, key)) = rest.split_once('_') else {
                continue;
            };
            let section = section.to_ascii_lowercase();
            if !SECTIONS.contains(&section.as_str()) {
                continue;
            }
            let path = format!("{section}.{}", key.to_ascii_lowercase());
            if STRING_KEYS.contains(&path.as_str()) {
                set_string(&mut table, &path, &value, &name)?;
            } else {
                set_path(&mut table, &path, &value, &name)?;
            }
        }
        for o in overrides {
            let (key, value) = o.split_once('=').ok_or_else(|| {
                ConfigError::Parse(format!("--set {o:?}: expected section.key=value"))
            })?;
            set_path(&mut table, key.trim(), value, &format!("--set {key}"))?;
        }
        let cfg: Config = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Parse(e.message().to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.origin.validate()?;
        self.resp.validate()?;
        self.nic.validate()?;
        self.replication.validate()?;
        self.replication_pg_config()?;
        self.api.validate()?;
        self.pgwire.validate()?;
        tls::validate(self)?;
        self.cluster.validate()?;
        self.store.page_level()?;
        self.store().validate().map_err(|e| ConfigError::Invalid {
            key: "store",
            reason: e.to_string(),
        })?;
        check(
            (10..=3_600_000).contains(&self.catalog.check_interval_ms),
            "catalog.check_interval_ms",
            "must be between 10 and 3600000",
        )?;
        for t in &self.catalog.tables {
            check(
                !names_system_schema(t),
                "catalog.tables",
                "system catalogs (pg_catalog, information_schema, pg_toast, pg_temp) are never \
                 cached: list user tables only",
            )?;
        }
        for t in self.catalog.prefixes.values() {
            check(
                !t.is_empty() && !t.contains(':'),
                "catalog.prefixes",
                "a prefix must be non-empty and contain no ':'",
            )?;
        }
        Ok(())
    }

    /// The connection settings of `replication.url` (the origin's other settings apply to it
    /// too), or `None` when the stream is on the origin.
    pub fn replication_pg_config(&self) -> Result<Option<crate::origin::Settings>, ConfigError> {
        let Some(url) = &self.replication.url else {
            return Ok(None);
        };
        let origin = OriginConfig {
            url: url.clone(),
            ..self.origin.clone()
        };
        match origin.pg_config() {
            Ok(c) => Ok(Some(c)),
            Err(ConfigError::Invalid { reason, .. }) => Err(ConfigError::Invalid {
                key: "replication.url",
                reason,
            }),
            Err(e) => Err(e),
        }
    }

    /// A copy fit for output (API, `pgline config`, logs): secrets replaced by [`REDACTED`].
    pub fn redacted(&self) -> Config {
        let mut c = self.clone();
        c.origin.url = redact_conn_string(&c.origin.url);
        c.replication.url = c.replication.url.as_deref().map(redact_conn_string);
        if c.api.token.is_some() {
            c.api.token = Some(REDACTED.into());
        }
        if !c.resp.password.is_empty() {
            c.resp.password = REDACTED.into();
        }
        c
    }

    pub fn store(&self) -> StoreConfig {
        StoreConfig {
            memory_bytes: self.store.memory.0 as usize,
            segment_bytes: self.store.segment.0 as usize,
            max_page_level: self.store.page_level().unwrap_or(PageLevel::Base),
            prefault: self.store.prefault,
        }
    }

    /// The users whose sessions may read the cache: `origin.url`'s and `pgwire.cache_users`.
    pub fn pg_cache_users(&self) -> Vec<String> {
        let origin = crate::origin::Settings::parse_pg(&self.origin.url).ok();
        self.cache_users_with(origin.as_ref().and_then(|c| c.get_user()))
    }

    fn cache_users_with(&self, origin_user: Option<&str>) -> Vec<String> {
        origin_user
            .map(str::to_owned)
            .into_iter()
            .chain(self.pgwire.cache_users.iter().cloned())
            .collect()
    }

    pub fn engine(&self) -> EngineConfig {
        let limits = Limits {
            max_args: self.resp.max_args,
            ..Limits::default()
        };
        // Validated: origin.url parses. Its user (and database, defaulting to the user as in
        // libpq) is the identity the cache holds rows for.
        let origin = crate::origin::Settings::parse_pg(&self.origin.url).ok();
        let origin_user = origin.as_ref().and_then(|c| c.get_user());
        let pg_cache_database = origin
            .as_ref()
            .and_then(|c| c.get_dbname())
            .or(origin_user)
            .map(str::to_owned);
        let pg_cache_users = self.cache_users_with(origin_user);
        EngineConfig {
            pg_listen: self.pgwire.listen_addr(),
            pg_cache_users,
            pg_cache_database,
            listen: self
                .resp
                .listen
                .parse()
                .expect("validated by RespConfig::validate"),
            cores: self.resp.cores,
            max_connections: self.resp.max_connections,
            max_request_bytes: self.resp.max_request_bytes,
            max_reply_backlog: self.resp.max_reply_backlog,
            requests_per_turn: self.resp.requests_per_turn,
            max_pending_per_conn: engine::DEFAULT_MAX_PENDING_PER_CONN,
            spin_polls: self.resp.spin_polls,
            password: (!self.resp.password.is_empty()).then(|| self.resp.password.clone()),
            limits,
            conn_limits: self.conn_limits(),
        }
    }

    /// The engine's connection bounds from `[resp]` and `[pgwire]`.
    pub fn conn_limits(&self) -> ConnLimits {
        ConnLimits {
            max_pg_connections: self.pgwire.max_sessions,
            max_per_source: self.resp.max_connections_per_source,
            max_pg_per_source: self.pgwire.max_connections_per_source,
            max_reply_memory: self.resp.max_reply_memory,
            auth_timeout_ms: self.resp.auth_timeout_ms,
            idle_timeout_ms: self.resp.idle_timeout_ms,
            pg_startup_timeout_ms: self.pgwire.startup_timeout_ms,
            pg_idle_timeout_ms: self.pgwire.idle_timeout_ms,
            max_auth_failures: self.resp.max_auth_failures,
            tracking_table_max_keys: self.resp.tracking_table_max_keys,
            max_pg_statements: self.pgwire.max_session_statements,
            max_pg_statement_bytes: self.pgwire.max_session_statement_bytes,
        }
    }
}

/// Sets `section.key` in `table` to `raw` taken literally as a string.
fn set_string(
    table: &mut toml::Table,
    path: &str,
    raw: &str,
    origin: &str,
) -> Result<(), ConfigError> {
    let quoted = toml::Value::String(raw.to_string()).to_string();
    set_path(table, path, &quoted, origin)
}

/// Settings that change at run time without a restart, as atomics read where they are used
/// (the store writer reads them per fill and per gauge tick). Everything else in [`Config`] is
/// read once at start-up. The admin API writes them after a validated config patch; the list of
/// keys they cover is [`crate::admin::LIVE_KEYS`].
#[derive(Debug)]
pub struct Runtime {
    pub max_lag_ms: AtomicU64,
    pub fill_batch: AtomicUsize,
    pub query_timeout_ms: AtomicU64,
    pub fill_delay_ms: AtomicU64,
}

impl Runtime {
    pub fn new(cfg: &Config) -> Runtime {
        let rt = Runtime {
            max_lag_ms: AtomicU64::new(0),
            fill_batch: AtomicUsize::new(0),
            query_timeout_ms: AtomicU64::new(0),
            fill_delay_ms: AtomicU64::new(0),
        };
        rt.apply(cfg);
        rt
    }

    /// Takes the live values of a (validated) config.
    pub fn apply(&self, cfg: &Config) {
        let r = Ordering::Relaxed;
        self.max_lag_ms.store(cfg.replication.max_lag_ms, r);
        self.fill_batch.store(cfg.origin.fill_batch, r);
        self.query_timeout_ms.store(cfg.origin.query_timeout_ms, r);
        self.fill_delay_ms.store(cfg.origin.fill_delay_ms, r);
    }

    pub fn max_lag_ms(&self) -> u64 {
        self.max_lag_ms.load(Ordering::Relaxed)
    }

    pub fn fill_batch(&self) -> usize {
        self.fill_batch.load(Ordering::Relaxed)
    }

    pub fn query_timeout_ms(&self) -> u64 {
        self.query_timeout_ms.load(Ordering::Relaxed)
    }

    pub fn fill_delay_ms(&self) -> u64 {
        self.fill_delay_ms.load(Ordering::Relaxed)
    }
}

/// Sets `section.key` in `table` from a string: TOML syntax if it parses as a value, else a string.
fn set_path(
    table: &mut toml::Table,
    path: &str,
    raw: &str,
    origin: &str,
) -> Result<(), ConfigError> {
    let (section, key) = path
        .split_once('.')
        .ok_or_else(|| ConfigError::Parse(format!("{origin}: {path:?} is not section.key")))?;
    let value = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    let entry = table
        .entry(section.to_string())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    match entry {
        toml::Value::Table(t) => {
            t.insert(key.to_string(), value);
            Ok(())
        }
        _ => Err(ConfigError::Parse(format!(
            "{origin}: [{section}] is not a table"
        ))),
    }
}

/// A connection string with its password replaced.
pub fn redact_conn_string(s: &str) -> String {
    if let Some(rest) = s
        .strip_prefix("postgres://")
        .or_else(|| s.strip_prefix("postgresql://"))
    {
        let scheme = &s[..s.len() - rest.len()];
        let Some(at) = rest.find('@') else {
            return s.to_string();
        };
        let (userinfo, host) = rest.split_at(at);
        return match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}{user}:{REDACTED}{host}"),
            None => s.to_string(),
        };
    }
    // key=value form: values may be quoted ('...' with \' escapes); rebuild token by token.
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while !rest.is_empty() {
        let ws = rest.len() - rest.trim_start().len();
        out.push_str(&rest[..ws]);
        rest = &rest[ws..];
        let key_end = rest.find('=').unwrap_or(rest.len());
        let key = rest[..key_end].trim();
        out.push_str(&rest[..key_end]);
        rest = &rest[key_end..];
        if rest.is_empty() {
            break;
        }
        out.push('=');
        rest = rest[1..].trim_start();
        let value_len = conn_value_len(rest);
        if key == "password" {
            out.push_str(REDACTED);
        } else {
            out.push_str(&rest[..value_len]);
        }
        rest = &rest[value_len..];
    }
    out
}

/// Length of one (possibly quoted) value at the start of a `key=value` connection string.
fn conn_value_len(s: &str) -> usize {
    let bytes = s.as_bytes();
    if bytes.first() == Some(&b'\'') {
        let mut i = 1;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' => i += 2,
                b'\'' => return i + 1,
                _ => i += 1,
            }
        }
        return s.len();
    }
    s.find(char::is_whitespace).unwrap_or(s.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(toml: &str, env: &[(&str, &str)], sets: &[&str]) -> Result<Config, ConfigError> {
        // One file per call: tests run in parallel and must not remove each other's files.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("pgline-cfg-{}-{n}", std::process::id()));
        std::fs::write(&dir, toml).unwrap();
        let env = env.iter().map(|(a, b)| (a.to_string(), b.to_string()));
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let r = Config::load(Some(&dir), env, &sets);
        let _ = std::fs::remove_file(&dir);
        r
    }

    /// F4 (issue 11): a system catalog in `catalog.tables` is a load error naming the key.
    #[test]
    fn system_catalogs_are_refused_in_catalog_tables() {
        for name in [
            "pg_catalog.pg_authid",
            "\"pg_toast\".x",
            "information_schema.tables",
        ] {
            let toml = format!("[catalog]\ntables = [{name:?}]\n");
            let err = load(&toml, &[], &[]).unwrap_err().to_string();
            assert!(err.contains("catalog.tables"), "{name}: {err}");
        }
        assert!(load(
            "[catalog]\ntables = [\"public.users\", \"pg_like\"]\n",
            &[],
            &[]
        )
        .is_ok());
    }

    /// C7 (issue 11): the fault-injection delay is bounded (4,000,000,000 was accepted).
    #[test]
    fn fill_delay_is_bounded() {
        for bad in ["10001", "4000000000"] {
            let err = load("", &[], &[&format!("origin.fill_delay_ms={bad}")])
                .unwrap_err()
                .to_string();
            assert!(err.contains("origin.fill_delay_ms"), "{err}");
        }
        let ok = load("", &[], &["origin.fill_delay_ms=10000"]);
        assert_eq!(ok.is_ok(), cfg!(feature = "fault-injection"));
    }

    #[test]
    fn file_env_and_flags_layer_in_order() {
        let cfg = load(
            "[resp]\nlisten = \"127.0.0.1:7000\"\ncores = 2\n[store]\nmemory = \"64MiB\"\n",
            &[
                ("PGLINE_RESP_CORES", "3"),
                ("PGLINE_TEST_PG_HOST", "ignored"),
            ],
            &["store.memory=\"128MiB\""],
        )
        .unwrap();
        assert_eq!(cfg.resp.listen, "127.0.0.1:7000");
        assert_eq!(cfg.resp.cores, 3);
        assert_eq!(cfg.store.memory.0, 128 << 20);
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = load("[resp]\nlisten = \"127.0.0.1:7000\"\ncorez = 2\n", &[], &[]).unwrap_err();
        assert!(err.to_string().contains("corez"), "{err}");
        let err = load("", &[("PGLINE_STORE_MEMROY", "1")], &[]).unwrap_err();
        assert!(err.to_string().contains("memroy"), "{err}");
        let err = load("[nope]\nx = 1\n", &[], &[]).unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn bad_values_are_named() {
        let err = load("[resp]\nlisten = \"localhost\"\n", &[], &[]).unwrap_err();
        assert!(err.to_string().contains("resp.listen"), "{err}");
        let err = load("[store]\nmemory = \"12 parsecs\"\n", &[], &[]).unwrap_err();
        assert!(err.to_string().contains("parsecs"), "{err}");
        let err = load("[resp]\ncores = 0\n", &[], &[]).unwrap_err();
        assert!(err.to_string().contains("resp.cores"), "{err}");
        let err = load("[store]\nmax_page = \"3MiB\"\n", &[], &[]).unwrap_err();
        assert!(err.to_string().contains("store.max_page"), "{err}");
        let err = load("[replication]\nslot = \"Bad-Slot\"\n", &[], &[]).unwrap_err();
        assert!(err.to_string().contains("replication.slot"), "{err}");
        let err = load("[catalog]\ncheck_interval_ms = 0\n", &[], &[]).unwrap_err();
        assert!(
            err.to_string().contains("catalog.check_interval_ms"),
            "{err}"
        );
        let cfg = load("", &[], &[]).unwrap();
        assert_eq!(cfg.catalog.check_interval_ms, 1000);
    }

    #[test]
    fn api_token_from_env_is_literal_and_never_printed() {
        let cfg = load(
            "[api]\nopen_reads = true\n",
            &[
                ("PGLINE_API_TOKEN", "12345678"),
                ("PGLINE_RESP_PASSWORD", "true"),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(cfg.api.token(), Some("12345678"));
        assert_eq!(cfg.resp.password, "true");
        assert!(cfg.api.open_reads);
        assert!(!format!("{cfg:?}").contains("12345678"));
        let shown = cfg.redacted();
        assert_eq!(shown.api.token.as_deref(), Some(REDACTED));
        assert_eq!(shown.resp.password, REDACTED);
        assert!(!toml::to_string(&shown).unwrap().contains("12345678"));
        let err = load("[api]\nlisten = \"nowhere\"\n", &[], &[]).unwrap_err();
        assert!(err.to_string().contains("api.listen"), "{err}");
        let err = load("[api]\nmax_body_bytes = 10\n", &[], &[]).unwrap_err();
        assert!(err.to_string().contains("api.max_body_bytes"), "{err}");
        let empty = load("", &[("PGLINE_API_TOKEN", "")], &[]).unwrap();
        assert_eq!(empty.api.token(), None);
    }

    #[test]
    fn connection_bounds_flow_to_the_engine_and_bad_ones_are_named() {
        let cfg = load(
            "[resp]\nmax_connections = 50\nmax_connections_per_source = 7\nmax_reply_memory = 33554432\nauth_timeout_ms = 1500\nidle_timeout_ms = 60000\nmax_auth_failures = 3\n[pgwire]\nmax_sessions = 40\nmax_connections_per_source = 4\nstartup_timeout_ms = 2500\nidle_timeout_ms = 0\nmax_session_statements = 30\nmax_session_statement_bytes = 4096\n",
            &[],
            &[],
        )
        .unwrap();
        let e = cfg.engine();
        assert_eq!(e.max_connections, 50);
        let want = ConnLimits {
            max_pg_connections: 40,
            max_per_source: 7,
            max_pg_per_source: 4,
            max_reply_memory: 32 << 20,
            auth_timeout_ms: 1500,
            idle_timeout_ms: 60_000,
            pg_startup_timeout_ms: 2500,
            pg_idle_timeout_ms: 0,
            max_auth_failures: 3,
            tracking_table_max_keys: limits::DEFAULT_TRACKING_TABLE_MAX_KEYS,
            max_pg_statements: 30,
            max_pg_statement_bytes: 4096,
        };
        assert_eq!(e.conn_limits, want);
        assert_eq!(
            load("", &[], &[]).unwrap().engine().conn_limits,
            ConnLimits::default()
        );
        let err = load("[resp]\nmax_reply_memory = 1000\n", &[], &[]).unwrap_err();
        assert!(err.to_string().contains("resp.max_reply_memory"), "{err}");
        let err = load("[resp]\nidle_timeout_ms = 100000000\n", &[], &[]).unwrap_err();
        assert!(err.to_string().contains("resp.idle_timeout_ms"), "{err}");
        let err = load("[pgwire]\nstartup_timeout_ms = 100000000\n", &[], &[]).unwrap_err();
        assert!(
            err.to_string().contains("pgwire.startup_timeout_ms"),
            "{err}"
        );
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("2MiB").unwrap(), 2 << 20);
        assert_eq!(parse_size("1 GiB").unwrap(), 1 << 30);
        assert!(parse_size("1TiB").is_err());
        assert!(parse_size("MiB").is_err());
    }
}
