//! Command line: `run`, `stale-check`, `load`, `report`.
//!
//! Every flag of `run` becomes a field of the JSONL row it writes (see `record`).

#![deny(unsafe_code)]

use crate::keys::KeyShape;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;

/// The origin used when `--origin` is not given (the lab PostgreSQL, database `pgline_bench`).
pub const DEFAULT_ORIGIN: &str =
    "host=127.0.0.1 port=54329 user=postgres password=pgline dbname=pgline_bench";

/// pgline-bench: load generator, stale checker and report writer.
#[derive(Parser, Debug)]
#[command(name = "pgline-bench", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run one load cell and append its JSONL row.
    Run(Box<RunArgs>),
    /// Compare every cached key of the table with the origin.
    StaleCheck(StaleArgs),
    /// Create and fill the bench table on the origin.
    Load(LoadArgs),
    /// Turn JSONL rows into Markdown tables and SVG charts.
    Report(ReportArgs),
    /// Check that every line of JSONL files is a complete row; exit 1 if not.
    CheckJsonl(CheckArgs),
}

/// `check-jsonl` flags.
#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// Also fail when a row of this target (or label) ran a stale check and found stale
    /// entries (repeatable; rows without a check pass).
    #[arg(long = "stale-zero-for")]
    pub stale_zero_for: Vec<String>,
    /// JSONL files.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
}

/// Where the data lives (shared by run, stale-check and load).
#[derive(Args, Debug, Clone)]
pub struct DataArgs {
    /// Origin PostgreSQL (libpq key=value or URL); the database is created by `load` if missing.
    #[arg(long, env = "PGLINE_BENCH_ORIGIN", default_value = DEFAULT_ORIGIN)]
    pub origin: String,
    /// Table name; keys are `<table>:<id>`.
    #[arg(long, default_value = "bench_rows")]
    pub table: String,
    /// Number of ids in the key space (`0..keyspace`).
    #[arg(long, default_value_t = 100_000)]
    pub keyspace: u64,
}

/// What the load generator talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Target {
    /// pgline or any Redis-compatible server answering GET/MGET from the table's keys.
    Resp,
    /// Valkey/Redis with application-side cache-aside: GET; on miss SELECT + SET; writers DEL.
    CacheAside,
    /// PostgreSQL, prepared point lookups (extended protocol).
    PgPrepared,
    /// PostgreSQL, simple-protocol point lookups (the id inlined into the SQL text).
    PgSimple,
}

impl Target {
    /// The name written to JSONL.
    pub fn name(self) -> &'static str {
        match self {
            Target::Resp => "resp",
            Target::CacheAside => "cache-aside",
            Target::PgPrepared => "pg-prepared",
            Target::PgSimple => "pg-simple",
        }
    }

    /// Whether the target speaks RESP.
    pub fn is_resp(self) -> bool {
        matches!(self, Target::Resp | Target::CacheAside)
    }
}

/// RESP read command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Op {
    /// `GET key` (requires `--mget 1`).
    Get,
    /// `MGET key...` with `--mget` keys.
    Mget,
    /// pg targets: one SaaS dashboard page (8 tenant-scoped prepared queries, `saas`); the key
    /// space is the tenant ids.
    Dashboard,
}

/// The SQL of pg point lookups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PgQuery {
    /// `SELECT row_to_json(t)::text FROM <table> t WHERE id = $1` (the JSON the RESP targets
    /// return; pgline's query-result cache answers it once the origin has).
    Json,
    /// `SELECT row_to_json(t)::text, random() FROM <table> t WHERE id = $1`: a volatile function,
    /// so pgline's PostgreSQL front always passes it through (the relay's cost per statement).
    Volatile,
    /// `SELECT id, name, email, plan, active, rev FROM <table> WHERE id = $1`: a point lookup
    /// pgline's PostgreSQL front serves from its store, also in binary (every column has an
    /// exact binary form).
    Columns,
    /// `SELECT * FROM <table> WHERE id = $1` (numeric and timestamptz columns: pgline serves
    /// binary results of those from the origin).
    Star,
}

impl PgQuery {
    /// The name written to JSONL.
    pub fn name(self) -> &'static str {
        match self {
            PgQuery::Json => "json",
            PgQuery::Volatile => "volatile",
            PgQuery::Columns => "columns",
            PgQuery::Star => "star",
        }
    }
}

/// What `load` creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Schema {
    /// `bench_rows` (`--table`, `--keyspace` rows).
    Rows,
    /// The multi-table SaaS schema of the dashboard workload (`saas`).
    Saas,
}

/// Which RESP client the load connections use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RespClient {
    /// This crate's minimal RESP2 writer/reader (the default).
    Own,
    /// The `redis` crate's multiplexed async connection (for comparing client overhead).
    RedisRs,
}

/// What writers do to the origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WriteOp {
    /// `UPDATE <table> SET rev = rev + 1 WHERE id = $1` (ids from the read key space).
    Update,
    /// `INSERT` of a new row above the current largest id.
    Insert,
}

/// Total writer rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum WriteRate {
    /// No writers.
    Off,
    /// A fixed total rate (transactions/s).
    PerSecond(f64),
    /// Each writer as fast as it can.
    Unlimited,
}

impl WriteRate {
    /// The JSONL spelling: a number, `"unlimited"` or 0.
    pub fn to_json(self) -> serde_json::Value {
        match self {
            WriteRate::Off => 0.into(),
            WriteRate::PerSecond(r) if r.fract() == 0.0 && r < 1e15 => (r as u64).into(),
            WriteRate::PerSecond(r) => serde_json::json!(r),
            WriteRate::Unlimited => "unlimited".into(),
        }
    }
}

/// Parses `--write-rate`: a number, `0` or `unlimited`.
pub fn parse_write_rate(s: &str) -> Result<WriteRate, String> {
    if s.eq_ignore_ascii_case("unlimited") {
        return Ok(WriteRate::Unlimited);
    }
    let r: f64 = s
        .parse()
        .map_err(|_| format!("not a rate: {s:?} (a number or 'unlimited')"))?;
    if r == 0.0 {
        Ok(WriteRate::Off)
    } else if r > 0.0 && r.is_finite() {
        Ok(WriteRate::PerSecond(r))
    } else {
        Err(format!("rate must be positive: {s}"))
    }
}

/// Parses `10`, `10s`, `500ms`, `2m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("not a duration: {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("unknown unit in {s:?} (ms, s, m, h)")),
    };
    if !(secs >= 0.0 && secs.is_finite()) {
        return Err(format!("bad duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A server process whose CPU time is read from /proc: `PID` or `NAME=PID`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerPid {
    /// Name in the JSONL map (the pid when not given).
    pub name: String,
    /// Process id.
    pub pid: u32,
}

/// Parses `--server-pid`.
pub fn parse_server_pid(s: &str) -> Result<ServerPid, String> {
    let (name, pid) = match s.split_once('=') {
        Some((n, p)) => (n.to_string(), p),
        None => (s.to_string(), s),
    };
    let pid = pid.parse().map_err(|_| format!("not a pid: {s:?}"))?;
    Ok(ServerPid { name, pid })
}

/// `LO-HI` (or one slot), within Redis Cluster's 16,384 slots.
fn parse_slots(s: &str) -> Result<(u16, u16), String> {
    let (lo, hi) = s.split_once('-').unwrap_or((s, s));
    let slot = |v: &str| match v.trim().parse::<u16>() {
        Ok(n) if n < 16_384 => Ok(n),
        _ => Err(format!("not a slot (0-16383): {v:?}")),
    };
    let (lo, hi) = (slot(lo)?, slot(hi)?);
    if lo > hi {
        return Err(format!("empty slot range {s:?}"));
    }
    Ok((lo, hi))
}

/// `run` flags.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub data: DataArgs,
    /// Scenario name (groups rows in the report).
    #[arg(long, default_value = "adhoc")]
    pub scenario: String,
    /// Free-text label for this cell (e.g. "valkey io-threads 2").
    #[arg(long, default_value = "")]
    pub label: String,
    /// What to load.
    #[arg(long, value_enum)]
    pub target: Target,
    /// RESP server address (resp and cache-aside targets).
    #[arg(long, default_value = "127.0.0.1:6390")]
    pub resp: String,
    /// pg targets: the PostgreSQL-protocol server the load connections talk to (libpq
    /// key=value or URL; pgline's `[pgwire] listen` or the origin). Absent: `--origin`.
    /// Writers, the row's server version and the data always use `--origin`.
    #[arg(long, env = "PGLINE_BENCH_PG")]
    pub pg: Option<String>,
    /// pg targets: the point lookup's SQL.
    #[arg(long, value_enum, default_value = "json")]
    pub pg_query: PgQuery,
    /// A pgline RESP address to read `INFO stats` keyspace hits/misses from in the window
    /// when the target is not RESP (a pg target served by pgline's PostgreSQL front).
    #[arg(long)]
    pub info: Option<String>,
    /// Dashboard pages: rows per task-list page (`LIMIT`); `OFFSET` walks pages 0..10.
    #[arg(long, default_value_t = 20)]
    pub page_size: i64,
    /// RESP read command (`dashboard`: pg targets only).
    #[arg(long, value_enum, default_value = "get")]
    pub op: Op,
    /// RESP client implementation for `--target resp`.
    #[arg(long, value_enum, default_value = "own")]
    pub resp_client: RespClient,
    /// Keys per request (MGET N; for pg targets `id = ANY($1)` with N ids).
    #[arg(long, default_value_t = 1)]
    pub mget: usize,
    /// Connections (each one task); 0 runs writers only.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Requests in flight per connection (closed loop: sent as one batch; open loop: at most
    /// this many due requests are sent together).
    #[arg(long, default_value_t = 1)]
    pub pipeline: usize,
    /// Open loop: total offered requests/s over all clients (absent: closed loop).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Key space shape.
    #[arg(long, value_enum, default_value = "uniform")]
    pub keys: KeyShape,
    /// Zipf exponent for `--keys zipf`.
    #[arg(long, default_value_t = 0.99)]
    pub zipf_s: f64,
    /// Cluster mode: read only the ids whose key (`<table>:<id>`) hashes into these Redis
    /// Cluster slots, `LO-HI` (one shard's keys; the key shape then applies to those ids).
    #[arg(long, value_parser = parse_slots)]
    pub slots: Option<(u16, u16)>,
    /// Cluster mode: send `READONLY` on every load connection first (reads from a replica).
    #[arg(long)]
    pub readonly: bool,
    /// Writer rate on the origin: transactions/s in total, `unlimited`, or 0 (none).
    #[arg(long, value_parser = parse_write_rate, default_value = "0")]
    pub write_rate: WriteRate,
    /// Writer connections (when `--write-rate` is not 0).
    #[arg(long, default_value_t = 4)]
    pub writers: usize,
    /// Writer statement.
    #[arg(long, value_enum, default_value = "update")]
    pub write_op: WriteOp,
    /// `SET synchronous_commit` on writer sessions (absent: server default).
    #[arg(long)]
    pub synchronous_commit: Option<String>,
    /// Measured time.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub duration: Duration,
    /// Unrecorded time before measuring (same load).
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    pub warmup: Duration,
    /// Tokio worker threads for the client.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Server process to charge CPU to: `PID` or `NAME=PID` (repeatable).
    #[arg(long = "server-pid", value_parser = parse_server_pid)]
    pub server_pids: Vec<ServerPid>,
    /// Sample each server's RSS this often during the window (soak runs); absent: only at the end.
    #[arg(long, value_parser = parse_duration)]
    pub rss_every: Option<Duration>,
    /// PostgreSQL connections shared by cache-aside fills.
    #[arg(long, default_value_t = 4)]
    pub origin_conns: usize,
    /// Open loop: the pacer thread busy-waits the last this-many microseconds before each due
    /// time (nanosleep alone is ~50 µs late; spinning costs a core). 0: sleep only.
    #[arg(long, default_value_t = 0)]
    pub spin_us: u64,
    /// After the run (writers stopped), run the stale check and record its count.
    #[arg(long)]
    pub stale_check: bool,
    /// Wait before re-checking stale candidates (WAL apply lag is not staleness).
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub settle: Duration,
    /// JSONL file to append the row to (also printed on stdout).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// RNG seed (client i uses seed + i).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// `stale-check` flags.
#[derive(Args, Debug, Clone)]
pub struct StaleArgs {
    #[command(flatten)]
    pub data: DataArgs,
    /// RESP server holding the cached rows.
    #[arg(long, default_value = "127.0.0.1:6390")]
    pub resp: String,
    /// Keys per MGET.
    #[arg(long, default_value_t = 500)]
    pub batch: usize,
    /// Wait before re-checking stale candidates.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub settle: Duration,
    /// Before comparing, wait at most this long for a pgline server to have applied the
    /// origin's WAL up to the origin's position when the check starts (`INFO replication`
    /// `applied_lsn_int`); a server without that field (Valkey) is compared at once.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub catchup_timeout: Duration,
    /// Exit non-zero when any entry is stale.
    #[arg(long)]
    pub expect_zero: bool,
}

/// `load` flags.
#[derive(Args, Debug, Clone)]
pub struct LoadArgs {
    #[command(flatten)]
    pub data: DataArgs,
    /// Recreate the table even if it already has `--keyspace` rows.
    #[arg(long)]
    pub force: bool,
    /// `rows` (`bench_rows`) or `saas` (tenants, users, projects, tasks, comments).
    #[arg(long, value_enum, default_value = "rows")]
    pub schema: Schema,
    /// `--schema saas`: tenants (users 50, projects 20 per tenant).
    #[arg(long, default_value_t = 100)]
    pub tenants: u64,
    /// `--schema saas`: tasks in all (spread evenly over tenants; 2 comments each).
    #[arg(long, default_value_t = 100_000)]
    pub tasks: u64,
    /// SET every row's `row_to_json` into this RESP server (Valkey preloaded the cache-aside
    /// way); repeatable.
    #[arg(long)]
    pub preload: Vec<String>,
    /// MGET every key once from this RESP server (warms pgline's read-through cache);
    /// repeatable.
    #[arg(long)]
    pub warm: Vec<String>,
}

/// `report` flags.
#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// Directory for report.md and the SVG charts (created).
    #[arg(long)]
    pub out: PathBuf,
    /// JSONL files.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations_rates_and_pids() {
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("3 parsecs").is_err());
        assert_eq!(parse_write_rate("0").unwrap(), WriteRate::Off);
        assert_eq!(parse_write_rate("unlimited").unwrap(), WriteRate::Unlimited);
        assert_eq!(
            parse_write_rate("30000").unwrap(),
            WriteRate::PerSecond(30000.0)
        );
        assert!(parse_write_rate("-1").is_err());
        assert_eq!(
            parse_server_pid("77").unwrap(),
            ServerPid {
                name: "77".into(),
                pid: 77
            }
        );
        assert_eq!(parse_server_pid("valkey=9").unwrap().name, "valkey");
    }

    #[test]
    fn every_run_flag_parses() {
        let cli = Cli::try_parse_from([
            "pgline-bench",
            "run",
            "--target",
            "cache-aside",
            "--op",
            "mget",
            "--mget",
            "16",
            "--clients",
            "64",
            "--pipeline",
            "2",
            "--rate",
            "50000",
            "--keys",
            "zipf",
            "--zipf-s",
            "1.1",
            "--write-rate",
            "unlimited",
            "--writers",
            "2",
            "--write-op",
            "insert",
            "--synchronous-commit",
            "off",
            "--duration",
            "1s",
            "--warmup",
            "0",
            "--threads",
            "2",
            "--server-pid",
            "pg=1",
            "--server-pid",
            "2",
            "--keyspace",
            "10",
            "--origin-conns",
            "3",
            "--spin-us",
            "0",
            "--stale-check",
            "--settle",
            "10ms",
            "--scenario",
            "s",
            "--label",
            "l",
            "--seed",
            "5",
            "--table",
            "t",
            "--resp",
            "x:1",
        ])
        .unwrap();
        let Command::Run(r) = cli.command else {
            panic!("not run")
        };
        assert_eq!(r.target, Target::CacheAside);
        assert_eq!(r.server_pids.len(), 2);
        assert_eq!(r.write_rate, WriteRate::Unlimited);
        assert_eq!(r.keys, KeyShape::Zipf);
    }
}
