//! The `[pgwire]` section: the PostgreSQL wire-protocol front (clients connect to the cores on
//! `listen`; the control plane's relay, `crate::pgfront`, runs their statements on pooled
//! origin connections).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use pgline_dataplane::engine::limits::{
    DEFAULT_MAX_PG_STATEMENTS, DEFAULT_MAX_PG_STATEMENT_BYTES, DEFAULT_PG_STARTUP_TIMEOUT_MS,
};

use super::{check, ConfigError, MAX_TIMEOUT_MS};

pub const DEFAULT_PG_LISTEN: &str = "127.0.0.1:6432";
pub const DEFAULT_PG_POOL_SIZE: usize = 20;
pub const DEFAULT_PG_CONNECT_TIMEOUT_MS: u64 = 3_000;
pub const DEFAULT_PG_MAX_SESSIONS: usize = 10_000;
pub const DEFAULT_PG_MAX_PENDING_STARTUPS: usize = 32;
pub const DEFAULT_PG_STARTUP_WAIT_MS: u64 = 3_000;
pub const DEFAULT_PG_AUTH_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_PG_POOL_IDLE_TIMEOUT_MS: u64 = 60_000;
pub const DEFAULT_PG_POOL_WAIT_MS: u64 = 30_000;
pub const DEFAULT_PG_MAX_POOLS: usize = 256;
pub const DEFAULT_PG_MAX_ORIGIN_STATEMENTS: usize = 1_000;
/// `pgwire.custom_settings` names at most: each is one more column of every fence and state
/// read.
pub const MAX_CUSTOM_SETTINGS: usize = 64;

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PgwireConfig {
    /// Serve the PostgreSQL protocol on `listen`.
    pub enabled: bool,
    pub listen: String,
    /// Origin connections kept per (user, database).
    pub pool_size: usize,
    /// Opening a TCP connection to the origin (authentication itself waits for the client).
    pub connect_timeout_ms: u64,
    /// Client connections open at once on `listen` (refused by the cores with SQLSTATE 53300
    /// past each core's share) and sessions the relay holds; apart from `resp.max_connections`.
    pub max_sessions: usize,
    /// Connections from one source address (0: no limit; both transports).
    pub max_connections_per_source: usize,
    /// A connection whose startup and authentication are not done this long after it
    /// connected is closed with FATAL 57014 (0: never).
    pub startup_timeout_ms: u64,
    /// A session that sent nothing this long, with nothing in flight, is closed with FATAL
    /// 57P05, as PostgreSQL's `idle_session_timeout` (0: never).
    pub idle_timeout_ms: u64,
    /// Users besides `origin.url`'s whose sessions may be answered from cache. The cache holds
    /// rows as `origin.url`'s role reads them: list only roles that may read every cached table
    /// whole (no missing privilege, no row-level security). Others always go to the origin.
    pub cache_users: Vec<String>,
    /// Origin connections in authentication at once (client startups relayed to the origin and
    /// not yet logged in); a startup past it waits up to `startup_wait_ms` for a slot, then is
    /// refused with SQLSTATE 53300.
    pub max_pending_startups: usize,
    /// How long a startup waits for one of the `max_pending_startups` slots.
    pub startup_wait_ms: u64,
    /// A relayed authentication (startup to ReadyForQuery, the client's password messages
    /// included) not finished in this time is ended: its origin connection is closed and the
    /// client gets FATAL 08006.
    pub auth_timeout_ms: u64,
    /// An origin connection idle in its pool for longer than this is closed; a pool left with
    /// no connection and no session is forgotten.
    pub pool_idle_timeout_ms: u64,
    /// How long a batch waits for a free origin connection of its pool before it is answered
    /// SQLSTATE 53300 (the session stays open; nothing of the batch ran).
    pub pool_wait_ms: u64,
    /// Backend pools (one per user, database and startup settings) at once; past it, pools
    /// no session uses are forgotten (their idle connections closed), and a startup that
    /// would need one more is refused with SQLSTATE 53300.
    pub max_pools: usize,
    /// Named prepared statements one session may hold; a batch that would prepare more ends
    /// the session with FATAL 53400.
    pub max_session_statements: usize,
    /// Bytes of one session's named statements (their Parse messages); as above.
    pub max_session_statement_bytes: usize,
    /// pgline's prepared statements on one origin connection: sessions that share it prepare
    /// theirs there, and a client's Close is answered by pgline, so past this many the
    /// connection's statements are closed (and prepared again when next used).
    pub max_origin_statements: usize,
    /// TLS on this front: `off` (SSLRequest → `N`), `on` (`S`), `required` (a plaintext
    /// StartupMessage is refused with PostgreSQL's hostssl-only FATAL 28000); needs `[tls]`.
    pub tls: super::PgwireTls,
    /// Custom settings (`app.tenant`) read with every backend's state, so that one a function
    /// sets with `set_config(.., false)` keeps the backend with its session and never reaches
    /// another: PostgreSQL lists no custom setting in `pg_settings`, so the relay finds only
    /// those it is told of. List those that row-level security policies or functions read
    /// (`pgline check` names the ones it finds). At most 64 names.
    pub custom_settings: Vec<String>,
}

impl Default for PgwireConfig {
    fn default() -> Self {
        PgwireConfig {
            enabled: true,
            listen: DEFAULT_PG_LISTEN.into(),
            pool_size: DEFAULT_PG_POOL_SIZE,
            connect_timeout_ms: DEFAULT_PG_CONNECT_TIMEOUT_MS,
            max_sessions: DEFAULT_PG_MAX_SESSIONS,
            max_connections_per_source: 0,
            startup_timeout_ms: DEFAULT_PG_STARTUP_TIMEOUT_MS,
            idle_timeout_ms: 0,
            cache_users: Vec::new(),
            max_pending_startups: DEFAULT_PG_MAX_PENDING_STARTUPS,
            startup_wait_ms: DEFAULT_PG_STARTUP_WAIT_MS,
            auth_timeout_ms: DEFAULT_PG_AUTH_TIMEOUT_MS,
            pool_idle_timeout_ms: DEFAULT_PG_POOL_IDLE_TIMEOUT_MS,
            pool_wait_ms: DEFAULT_PG_POOL_WAIT_MS,
            max_pools: DEFAULT_PG_MAX_POOLS,
            max_session_statements: DEFAULT_MAX_PG_STATEMENTS,
            max_session_statement_bytes: DEFAULT_MAX_PG_STATEMENT_BYTES,
            max_origin_statements: DEFAULT_PG_MAX_ORIGIN_STATEMENTS,
            tls: super::PgwireTls::Off,
            custom_settings: Vec::new(),
        }
    }
}

impl PgwireConfig {
    /// The listen address when the front is enabled.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        if self.enabled {
            self.listen.parse().ok()
        } else {
            None
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.listen
            .parse::<SocketAddr>()
            .map_err(|e| ConfigError::Invalid {
                key: "pgwire.listen",
                reason: format!("{:?} is not an ip:port address ({e})", self.listen),
            })?;
        check(
            (1..=10_000).contains(&self.pool_size),
            "pgwire.pool_size",
            "must be 1..=10000",
        )?;
        check(
            self.connect_timeout_ms >= 1,
            "pgwire.connect_timeout_ms",
            "must be > 0",
        )?;
        check(
            self.max_sessions >= 1,
            "pgwire.max_sessions",
            "must be >= 1",
        )?;
        check(
            self.startup_timeout_ms <= MAX_TIMEOUT_MS,
            "pgwire.startup_timeout_ms",
            "must be <= 86400000 (0: off)",
        )?;
        check(
            self.idle_timeout_ms <= MAX_TIMEOUT_MS,
            "pgwire.idle_timeout_ms",
            "must be <= 86400000 (0: off)",
        )?;
        check(
            (1..=1_000_000).contains(&self.max_session_statements),
            "pgwire.max_session_statements",
            "must be 1..=1000000",
        )?;
        check(
            (1024..=1 << 30).contains(&self.max_session_statement_bytes),
            "pgwire.max_session_statement_bytes",
            "must be 1024..=1073741824",
        )?;
        check(
            (16..=1_000_000).contains(&self.max_origin_statements),
            "pgwire.max_origin_statements",
            "must be 16..=1000000",
        )?;
        self.validate_custom_settings()?;
        self.validate_origin_protection()
    }

    /// Each a setting's name as PostgreSQL spells one (identifiers joined by `.`; the relay
    /// writes them into its state query as literals), none twice, at most
    /// [`MAX_CUSTOM_SETTINGS`].
    fn validate_custom_settings(&self) -> Result<(), ConfigError> {
        let names = &self.custom_settings;
        check(
            names.len() <= MAX_CUSTOM_SETTINGS,
            "pgwire.custom_settings",
            "at most 64 names",
        )?;
        for (i, name) in names.iter().enumerate() {
            let part_ok = |p: &str| {
                p.bytes()
                    .next()
                    .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                    && p.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$')
            };
            if name.len() > 128 || !name.contains('.') || !name.split('.').all(part_ok) {
                return Err(ConfigError::Invalid {
                    key: "pgwire.custom_settings",
                    reason: format!(
                        "{name:?} is not a custom setting's name (identifiers joined by '.', \
                         such as app.tenant; at most 128 bytes)"
                    ),
                });
            }
            if names[..i].iter().any(|n| n.eq_ignore_ascii_case(name)) {
                return Err(ConfigError::Invalid {
                    key: "pgwire.custom_settings",
                    reason: format!("{name:?} is listed twice"),
                });
            }
        }
        Ok(())
    }

    /// The keys that spare the origin: startups in authentication, idle pools.
    fn validate_origin_protection(&self) -> Result<(), ConfigError> {
        check(
            (1..=100_000).contains(&self.max_pending_startups),
            "pgwire.max_pending_startups",
            "must be 1..=100000",
        )?;
        check(
            self.startup_wait_ms <= 600_000,
            "pgwire.startup_wait_ms",
            "must be <= 600000",
        )?;
        check(
            (1..=600_000).contains(&self.auth_timeout_ms),
            "pgwire.auth_timeout_ms",
            "must be 1..=600000",
        )?;
        check(
            (1..=86_400_000).contains(&self.pool_idle_timeout_ms),
            "pgwire.pool_idle_timeout_ms",
            "must be 1..=86400000",
        )?;
        check(
            (1..=600_000).contains(&self.pool_wait_ms),
            "pgwire.pool_wait_ms",
            "must be 1..=600000",
        )?;
        check(
            (1..=100_000).contains(&self.max_pools),
            "pgwire.max_pools",
            "must be 1..=100000",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn custom_settings_are_names_of_custom_settings() {
        let with = |names: &[&str]| PgwireConfig {
            custom_settings: names.iter().map(|n| (*n).to_owned()).collect(),
            ..PgwireConfig::default()
        };
        assert!(with(&["app.tenant", "my_ext.x$1", "a.b.c"])
            .validate()
            .is_ok());
        for bad in [
            &["tenant"][..],
            &["app.ten'ant"],
            &["app."],
            &[".tenant"],
            &["1app.tenant"],
            &["app.tenant", "APP.Tenant"],
            &["app.tenant; DROP TABLE t"],
        ] {
            assert!(
                matches!(
                    with(bad).validate(),
                    Err(ConfigError::Invalid {
                        key: "pgwire.custom_settings",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        let long = format!("app.{}", "x".repeat(125));
        assert!(with(&[&long]).validate().is_err());
        let many: Vec<String> = (0..=MAX_CUSTOM_SETTINGS)
            .map(|i| format!("app.s{i}"))
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(with(&many).validate().is_err());
        assert!(with(&many[..MAX_CUSTOM_SETTINGS]).validate().is_ok());
    }

    #[test]
    fn defaults_validate_and_bad_values_are_named() {
        let d = PgwireConfig::default();
        assert!(d.validate().is_ok());
        assert_eq!(d.listen_addr(), Some("127.0.0.1:6432".parse().unwrap()));
        let off = PgwireConfig {
            enabled: false,
            ..PgwireConfig::default()
        };
        assert_eq!(off.listen_addr(), None);
        let bad = PgwireConfig {
            pool_size: 0,
            ..PgwireConfig::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::Invalid {
                key: "pgwire.pool_size",
                ..
            })
        ));
        for (bad, key) in [
            (
                PgwireConfig {
                    max_pending_startups: 0,
                    ..PgwireConfig::default()
                },
                "pgwire.max_pending_startups",
            ),
            (
                PgwireConfig {
                    auth_timeout_ms: 0,
                    ..PgwireConfig::default()
                },
                "pgwire.auth_timeout_ms",
            ),
            (
                PgwireConfig {
                    pool_idle_timeout_ms: 0,
                    ..PgwireConfig::default()
                },
                "pgwire.pool_idle_timeout_ms",
            ),
            (
                PgwireConfig {
                    max_pools: 0,
                    ..PgwireConfig::default()
                },
                "pgwire.max_pools",
            ),
            (
                PgwireConfig {
                    max_session_statements: 0,
                    ..PgwireConfig::default()
                },
                "pgwire.max_session_statements",
            ),
            (
                PgwireConfig {
                    max_session_statement_bytes: 100,
                    ..PgwireConfig::default()
                },
                "pgwire.max_session_statement_bytes",
            ),
            (
                PgwireConfig {
                    max_origin_statements: 1,
                    ..PgwireConfig::default()
                },
                "pgwire.max_origin_statements",
            ),
        ] {
            assert!(
                matches!(bad.validate(), Err(ConfigError::Invalid { key: k, .. }) if k == key),
                "{key}"
            );
        }
        let bad = PgwireConfig {
            listen: "nope".into(),
            ..PgwireConfig::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::Invalid {
                key: "pgwire.listen",
                ..
            })
        ));
    }
}
