//! `run`: drive one load cell, then build and append its JSONL row.
//!
//! ```text
//!  t0 ──warmup──▶ measure_start ──duration──▶ end
//!  clients and writers run from t0 to end; only requests sent (closed loop) or due (open
//!  loop) at or after measure_start are recorded; server CPU is read at measure_start and end.
//! ```
//!
//! Closed loop: each client sends `pipeline` requests as one batch, waits for every reply,
//! repeats; latency is reply time minus batch send time.
//!
//! Open loop: client `c` of `C` follows [`Schedule`] (`rate / C` requests/s, interleaved with
//! the others). The pacer thread (`pacer`) wakes it at its next due time; it then sends that
//! request plus any later ones already due (up to `pipeline`) as one batch. Latency is reply time minus *due* time, so a connection that fell
//! behind charges the wait to every request it delayed. When the window closes, requests still
//! due but unsent are counted in `unsent` and recorded with their wait so far (a lower bound).
//!
//! Writers (origin UPDATE/INSERT, for cache-aside followed by DEL of the key) run from t0 to
//! end, unlimited (back to back) or at a fixed total rate on the same schedule.
//!
//! # Thread model
//! One tokio task per client and per writer on the runtime `main` builds (`--threads`); each
//! owns its connection, key sampler and [`Tally`]; tallies are merged after all tasks end.

#![deny(unsafe_code)]

use crate::cli::{Op, RespClient, RunArgs, Target, WriteOp, WriteRate};
use crate::env::{self, Env};
use crate::error::BenchError;
use crate::keys::KeySampler;
use crate::pg::{self, OriginPool};
use crate::record::{Row, RssSample};
use crate::resp::{compose_command, RespConn};
use crate::schedule::Schedule;
use crate::stats::{quantiles, Tally};
use crate::target::{is_broken, key_bytes, Conn, ConnSpec, Outcome};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The run's clock.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    /// Load starts (schedules are anchored here).
    pub t0: Instant,
    /// Recording starts.
    pub measure_start: Instant,
    /// Load stops.
    pub end: Instant,
}

impl Window {
    /// Whether `t` is inside the measured part.
    pub fn contains(&self, t: Instant) -> bool {
        t >= self.measure_start && t < self.end
    }
}

/// Runs one cell and returns its row (not yet appended).
pub async fn run(args: &RunArgs) -> Result<Row, BenchError> {
    validate(args)?;
    let mut env = env::host_env();
    if args.target.is_resp() {
        env::resp_versions(&mut env, &args.resp).await;
    }
    let admin = pg::connect(&args.data.origin).await?;
    env.postgres_version = Some(admin.query_one("SHOW server_version", &[]).await?.get(0));
    let spec = conn_spec(args).await?;
    let mut conns = Vec::with_capacity(args.clients);
    for _ in 0..args.clients {
        conns.push(Conn::open(&spec).await?);
    }
    let writers = open_writers(args, &admin).await?;

    let t0 = Instant::now() + Duration::from_millis(20);
    let measure_start = t0 + args.warmup;
    let w = Window {
        t0,
        measure_start,
        end: measure_start + args.duration,
    };
    let load = start_load(args, &spec, conns, writers, w)?;
    let m = measure(args, w).await;
    let (reads, writes) = load.join().await?;
    let stale = if args.stale_check {
        let sa = crate::cli::StaleArgs {
            data: args.data.clone(),
            resp: args.resp.clone(),
            batch: 500,
            settle: args.settle,
            catchup_timeout: std::time::Duration::from_secs(60),
            expect_zero: false,
        };
        Some(crate::stale::check(&sa).await?)
    } else {
        None
    };
    let server_cpu = cpu_delta(args, &m.cpu_before, &m.cpu_after);
    let mut row = build_row(
        args,
        &reads,
        &writes,
        server_cpu,
        stale.as_ref().map(|s| s.stale),
        env,
    );
    row.stale_catchup_ms = stale.and_then(|s| s.catchup_ms);
    row.client_cpu_s = m.client_cpu_s;
    row.rss_samples = m.rss_samples;
    row.server_rss_kib = args
        .server_pids
        .iter()
        .filter_map(|p| Some((p.name.clone(), env::rss_kib(p.pid)?)))
        .collect();
    if let (Some(b), Some(a)) = (m.ks_before, m.ks_after) {
        row.server_keyspace_hits = Some(a.0.saturating_sub(b.0));
        row.server_keyspace_misses = Some(a.1.saturating_sub(b.1));
    }
    Ok(row)
}

async fn conn_spec(args: &RunArgs) -> Result<ConnSpec, BenchError> {
    let pool = if args.target == Target::CacheAside {
        let (origin, table) = (&args.data.origin, &args.data.table);
        Some(Arc::new(
            OriginPool::open(origin, table, args.origin_conns).await?,
        ))
    } else {
        None
    };
    Ok(ConnSpec {
        target: args.target,
        resp: args.resp.clone(),
        pg: args.pg.clone().unwrap_or_else(|| args.data.origin.clone()),
        pg_query: args.pg_query,
        page_size: args.page_size,
        table: args.data.table.clone(),
        op: args.op,
        pool,
        resp_client: args.resp_client,
        readonly: args.readonly,
    })
}

/// The running load: client and writer tasks, and the open-loop pacer.
struct Load {
    clients: Vec<tokio::task::JoinHandle<Tally>>,
    writers: Vec<tokio::task::JoinHandle<Tally>>,
    pacer: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    /// Waits for every task (they stop at the window's end) and merges their tallies.
    async fn join(self) -> Result<(Tally, Tally), BenchError> {
        let mut reads = Tally::new();
        for t in self.clients {
            let t = t
                .await
                .map_err(|e| BenchError::Config(format!("client task: {e}")))?;
            reads.merge(&t);
        }
        if let Some(p) = self.pacer {
            // The pacer stops at the window's end, which has passed.
            let _ = p.join();
        }
        let mut writes = Tally::new();
        for t in self.writers {
            let t = t
                .await
                .map_err(|e| BenchError::Config(format!("writer task: {e}")))?;
            writes.merge(&t);
        }
        Ok((reads, writes))
    }
}

fn start_load(
    args: &RunArgs,
    spec: &ConnSpec,
    conns: Vec<Conn>,
    writers: Vec<Writer>,
    w: Window,
) -> Result<Load, BenchError> {
    let notifies: Vec<Arc<Notify>> = (0..conns.len()).map(|_| Arc::new(Notify::new())).collect();
    let pacer = match args.rate {
        Some(rate) if !conns.is_empty() => {
            let spin = Duration::from_micros(args.spin_us);
            Some(crate::pacer::spawn(
                w.t0,
                w.end,
                rate,
                notifies.clone(),
                spin,
            )?)
        }
        _ => None,
    };
    // `--slots`: the readers draw from one shard's ids (writers too: rows of other shards
    // would change nothing this target serves).
    let ids: Option<Arc<[u64]>> = match args.slots {
        Some(range) => {
            let prefix = format!("{}:", args.data.table);
            let ids = crate::keys::ids_in_slots(&prefix, args.data.keyspace, range);
            if ids.is_empty() {
                return Err(BenchError::Config(format!(
                    "no id of 0..{} hashes into slots {}-{}",
                    args.data.keyspace, range.0, range.1
                )));
            }
            Some(ids.into())
        }
        None => None,
    };
    let mut clients = Vec::new();
    for (c, conn) in conns.into_iter().enumerate() {
        let sampler = sampler(args, &ids, args.seed.wrapping_add(c as u64))?;
        let notify = notifies[c].clone();
        let cfg = ClientCfg {
            args: args.clone(),
            spec: spec.clone(),
            c: c as u64,
            w,
            notify,
        };
        clients.push(tokio::spawn(client_loop(cfg, conn, sampler)));
    }
    let mut wtasks = Vec::new();
    let n = writers.len() as u64;
    for (i, wr) in writers.into_iter().enumerate() {
        let sampler = sampler(args, &ids, args.seed.wrapping_add(1_000_000 + i as u64))?;
        let task = writer_loop(args.clone(), wr, sampler, i as u64, n, w);
        wtasks.push(tokio::spawn(task));
    }
    Ok(Load {
        clients,
        writers: wtasks,
        pacer,
    })
}

/// What is read at the window's start and end.
struct Measured {
    cpu_before: Vec<Option<u64>>,
    cpu_after: Vec<Option<u64>>,
    client_cpu_s: Option<f64>,
    ks_before: Option<(u64, u64)>,
    ks_after: Option<(u64, u64)>,
    rss_samples: Vec<RssSample>,
}

/// Sleeps through the window, reading server and client CPU and the server's INFO counters
/// at its start and end.
async fn measure(args: &RunArgs, w: Window) -> Measured {
    let info_addr = if args.target.is_resp() {
        Some(&args.resp)
    } else {
        args.info.as_ref()
    };
    let mut info = match info_addr {
        Some(a) => RespConn::connect(a).await.ok(),
        None => None,
    };
    tokio::time::sleep_until(w.measure_start.into()).await;
    let cpu_before = cpu_snapshot(args);
    let ks_before = keyspace_stats(info.as_mut()).await;
    let me_before = env::cpu_ticks(std::process::id()).ok();
    let mut rss_samples = Vec::new();
    if let Some(every) = args.rss_every.filter(|d| !d.is_zero()) {
        let mut next = w.measure_start + every;
        while next < w.end {
            tokio::time::sleep_until(next.into()).await;
            let t_s = (next - w.measure_start).as_secs_f64();
            rss_samples.extend(args.server_pids.iter().filter_map(|p| {
                let rss_kib = env::rss_kib(p.pid)?;
                Some(RssSample {
                    t_s,
                    server: p.name.clone(),
                    rss_kib,
                })
            }));
            next += every;
        }
    }
    tokio::time::sleep_until(w.end.into()).await;
    let cpu_after = cpu_snapshot(args);
    let me_after = env::cpu_ticks(std::process::id()).ok();
    let ks_after = keyspace_stats(info.as_mut()).await;
    let client_cpu_s = match (me_before, me_after) {
        (Some(b), Some(a)) => Some(a.saturating_sub(b) as f64 / env::clk_tck()),
        _ => None,
    };
    Measured {
        cpu_before,
        cpu_after,
        client_cpu_s,
        ks_before,
        ks_after,
        rss_samples,
    }
}

fn validate(args: &RunArgs) -> Result<(), BenchError> {
    pg::check_table(&args.data.table)?;
    let bad = |m: &str| Err(BenchError::Config(m.into()));
    if args.mget == 0 || args.pipeline == 0 || args.threads == 0 {
        return bad("--mget, --pipeline and --threads must be at least 1");
    }
    if args.target.is_resp() && args.op == Op::Get && args.mget != 1 {
        return bad("--op get reads one key: use --op mget with --mget N");
    }
    if args.op == Op::Dashboard && (args.target != Target::PgPrepared || args.mget != 1) {
        return bad("--op dashboard runs on --target pg-prepared with --mget 1");
    }
    if args.page_size < 1 {
        return bad("--page-size must be at least 1");
    }
    if args.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        return bad("--rate must be positive");
    }
    if args.clients == 0 && args.write_rate == WriteRate::Off {
        return bad("nothing to do: --clients 0 and --write-rate 0");
    }
    if args.readonly && !(args.target == Target::Resp && args.resp_client == RespClient::Own) {
        return bad("--readonly needs --target resp with the own RESP client");
    }
    if args.stale_check && !args.target.is_resp() {
        return bad("--stale-check needs a RESP target");
    }
    Ok(())
}

fn sampler(args: &RunArgs, ids: &Option<Arc<[u64]>>, seed: u64) -> Result<KeySampler, BenchError> {
    match ids {
        Some(ids) => KeySampler::over(args.keys, ids.clone(), args.zipf_s, seed),
        None => KeySampler::new(args.keys, args.data.keyspace, args.zipf_s, seed),
    }
    .map_err(BenchError::Config)
}

struct ClientCfg {
    args: RunArgs,
    spec: ConnSpec,
    c: u64,
    w: Window,
    /// Open loop: woken by the pacer at this connection's due times.
    notify: Arc<Notify>,
}

/// Sleeps until `due` on tokio's timer (1 ms resolution: used for t0 and rate-limited
/// writers only; open-loop readers are woken by the pacer).
async fn wait_until(due: Instant) {
    tokio::time::sleep_until(due.into()).await;
}

async fn client_loop(cfg: ClientCfg, mut conn: Conn, mut keys: KeySampler) -> Tally {
    let (args, w) = (&cfg.args, cfg.w);
    let per_req = args.mget;
    let sched = args
        .rate
        .map(|r| Schedule::new(w.t0, r, args.clients as u64, cfg.c));
    let mut tally = Tally::new();
    let mut ids = Vec::with_capacity(args.pipeline * per_req);
    let mut out: Vec<Outcome> = Vec::with_capacity(args.pipeline);
    let mut due = Vec::with_capacity(args.pipeline);
    let mut i = 0u64; // open loop: index of the next request in this client's schedule
    wait_until(w.t0).await;
    loop {
        due.clear();
        if let Some(s) = &sched {
            if s.due(i) >= w.end {
                break;
            }
            while s.due(i) > Instant::now() {
                cfg.notify.notified().await;
            }
            let now = Instant::now();
            if now >= w.end {
                count_unsent(s, i, now, w, &mut tally);
                break;
            }
            let n = take_due(s, i, now, w.end, args.pipeline);
            due.extend((i..i + n).map(|k| s.due(k)));
            i += n;
        } else if Instant::now() >= w.end {
            break;
        }
        let n = if sched.is_some() {
            due.len()
        } else {
            args.pipeline
        };
        ids.clear();
        ids.extend((0..n * per_req).map(|_| keys.next_id()));
        out.clear();
        let sent = Instant::now();
        let res = conn.exec_batch(&ids, per_req, &mut out).await;
        for j in 0..n {
            let start = due.get(j).copied().unwrap_or(sent);
            let o = out.get(j).copied().unwrap_or(Outcome {
                done: Instant::now(),
                found: 0,
                missing: 0,
                error: true,
            });
            if w.contains(o.done) {
                tally.requests += u64::from(!o.error);
                tally.errors += u64::from(o.error);
                tally.hits += u64::from(o.found);
                tally.misses += u64::from(o.missing);
            }
            if start >= w.measure_start && !o.error {
                tally.record(o.done.saturating_duration_since(start));
            }
        }
        if let Some(&first) = due.first() {
            if first >= w.measure_start {
                tally.record_lag(sent.saturating_duration_since(first));
            }
        }
        if let Err(e) = res {
            if is_broken(&e) {
                match reconnect(&cfg.spec, w.end).await {
                    Some(c) => conn = c,
                    None => break,
                }
            }
        }
    }
    tally
}

/// How many requests from index `i` on are due by `now` (and before `end`), at most `max`:
/// the batch an open-loop client sends now. At least 1 when request `i` is due.
pub fn take_due(s: &Schedule, i: u64, now: Instant, end: Instant, max: usize) -> u64 {
    let mut n = 0u64;
    while (n as usize) < max && s.due(i + n) <= now && s.due(i + n) < end {
        n += 1;
    }
    n
}

/// Counts (and records the wait so far of) every request due in the window but never sent.
fn count_unsent(s: &Schedule, from: u64, now: Instant, w: Window, tally: &mut Tally) {
    for k in from..s.count_before(w.end - w.t0) {
        if s.due(k) >= w.measure_start {
            tally.unsent += 1;
            tally.latency.saturating_record(
                u64::try_from(now.saturating_duration_since(s.due(k)).as_nanos())
                    .unwrap_or(u64::MAX),
            );
        }
    }
}

/// Reconnects, retrying every 100 ms; `None` once the run has ended.
async fn reconnect(spec: &ConnSpec, end: Instant) -> Option<Conn> {
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if Instant::now() >= end {
            return None;
        }
        match Conn::open(spec).await {
            Ok(c) => return Some(c),
            Err(e) => eprintln!("reconnect: {e}"),
        }
    }
}

/// A writer's connections.
pub struct Writer {
    client: tokio_postgres::Client,
    stmt: tokio_postgres::Statement,
    del: Option<RespConn>,
    next_insert: Arc<AtomicU64>,
}

async fn open_writers(
    args: &RunArgs,
    admin: &tokio_postgres::Client,
) -> Result<Vec<Writer>, BenchError> {
    if args.write_rate == WriteRate::Off {
        return Ok(Vec::new());
    }
    let table = &args.data.table;
    let max: i64 = admin
        .query_one(&format!("SELECT coalesce(max(id), -1) FROM {table}"), &[])
        .await?
        .get(0);
    let next_insert = Arc::new(AtomicU64::new((max + 1) as u64));
    let sql = match args.write_op {
        WriteOp::Update => format!("UPDATE {table} SET rev = rev + 1 WHERE id = $1"),
        WriteOp::Insert => {
            format!(
                "INSERT INTO {table} {}",
                pg::row_select("(SELECT $1::int8 AS g) s")
            )
        }
    };
    let mut out = Vec::with_capacity(args.writers);
    for _ in 0..args.writers.max(1) {
        let client = pg::connect(&args.data.origin).await?;
        if let Some(sc) = &args.synchronous_commit {
            client
                .simple_query(&format!(
                    "SET synchronous_commit = '{}'",
                    sc.replace('\'', "")
                ))
                .await?;
        }
        let stmt = client.prepare(&sql).await?;
        let del = if args.target == Target::CacheAside {
            Some(RespConn::connect(&args.resp).await?)
        } else {
            None
        };
        out.push(Writer {
            client,
            stmt,
            del,
            next_insert: next_insert.clone(),
        });
    }
    Ok(out)
}

async fn writer_loop(
    args: RunArgs,
    mut wr: Writer,
    mut keys: KeySampler,
    i: u64,
    n: u64,
    w: Window,
) -> Tally {
    let sched = match args.write_rate {
        WriteRate::PerSecond(r) => Some(Schedule::new(w.t0, r, n, i)),
        _ => None,
    };
    let prefix = format!("{}:", args.data.table).into_bytes();
    let mut tally = Tally::new();
    let mut k = 0u64;
    wait_until(w.t0).await;
    loop {
        let start = match &sched {
            Some(s) => {
                let due = s.due(k);
                k += 1;
                if due >= w.end {
                    break;
                }
                wait_until(due).await;
                due
            }
            None => Instant::now(),
        };
        if start >= w.end {
            break;
        }
        let id = match args.write_op {
            WriteOp::Update => keys.next_id(),
            WriteOp::Insert => wr.next_insert.fetch_add(1, Ordering::Relaxed),
        };
        let mut ok = wr.client.execute(&wr.stmt, &[&(id as i64)]).await.is_ok();
        if let (true, Some(del)) = (ok, wr.del.as_mut()) {
            compose_command(&mut del.wbuf, &[b"DEL", &key_bytes(&prefix, id)]);
            ok = del.flush().await.is_ok() && del.read_tally().await.is_ok_and(|t| !t.error);
        }
        let done = Instant::now();
        if w.contains(done) {
            tally.requests += u64::from(ok);
            tally.errors += u64::from(!ok);
        }
        if ok && start >= w.measure_start {
            tally.record(done - start);
        }
        if !ok && wr.client.is_closed() {
            break;
        }
    }
    tally
}

/// `keyspace_hits` and `keyspace_misses` from the server's INFO stats.
async fn keyspace_stats(conn: Option<&mut RespConn>) -> Option<(u64, u64)> {
    let conn = conn?;
    let Ok(crate::resp::Value::Bulk(info)) = conn.command(&[b"INFO", b"stats"]).await else {
        return None;
    };
    let info = String::from_utf8_lossy(&info);
    let field = |f: &str| crate::resp::info_field(&info, f).and_then(|v| v.parse().ok());
    Some((field("keyspace_hits")?, field("keyspace_misses")?))
}

fn cpu_snapshot(args: &RunArgs) -> Vec<Option<u64>> {
    args.server_pids
        .iter()
        .map(|p| env::cpu_ticks(p.pid).ok())
        .collect()
}

fn cpu_delta(
    args: &RunArgs,
    before: &[Option<u64>],
    after: &[Option<u64>],
) -> BTreeMap<String, f64> {
    let tck = env::clk_tck();
    let mut m = BTreeMap::new();
    for (p, (b, a)) in args.server_pids.iter().zip(before.iter().zip(after)) {
        if let (Some(b), Some(a)) = (b, a) {
            *m.entry(p.name.clone()).or_insert(0.0) += a.saturating_sub(*b) as f64 / tck;
        } else {
            eprintln!("warning: no CPU time for server pid {} ({})", p.pid, p.name);
        }
    }
    m
}

/// `host:port` (or the unparsed string) of the server pg load connections talked to.
fn pg_endpoint(args: &RunArgs) -> String {
    let s = args.pg.as_deref().unwrap_or(&args.data.origin);
    let Ok(cfg) = s.parse::<tokio_postgres::Config>() else {
        return s.to_string();
    };
    let host = match cfg.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}")
}

/// Builds the JSONL row from the merged tallies.
pub fn build_row(
    args: &RunArgs,
    reads: &Tally,
    writes: &Tally,
    server_cpu_s: BTreeMap<String, f64>,
    stale: Option<u64>,
    env: Env,
) -> Row {
    let secs = args.duration.as_secs_f64().max(1e-9);
    let q = quantiles(&reads.latency);
    let wq = quantiles(&writes.latency);
    let rps = reads.requests as f64 / secs;
    let write_rps = writes.requests as f64 / secs;
    let cpu: f64 = server_cpu_s.values().sum();
    let work = if args.clients > 0 { rps } else { write_rps };
    Row {
        scenario: args.scenario.clone(),
        label: args.label.clone(),
        target: args.target.name().into(),
        op: match (args.target.is_resp(), args.op) {
            (_, Op::Dashboard) => "dashboard".into(),
            (false, _) => "select".into(),
            (true, Op::Get) => "get".into(),
            (true, Op::Mget) => "mget".into(),
        },
        mget: args.mget,
        clients: args.clients,
        pipeline: args.pipeline,
        mode: if args.rate.is_some() {
            "open"
        } else {
            "closed"
        }
        .into(),
        rate: args.rate,
        keys: args.keys.name().into(),
        keyspace: args.data.keyspace,
        zipf_s: args.zipf_s,
        write_rate: args.write_rate.to_json(),
        writers: if args.write_rate == WriteRate::Off {
            0
        } else {
            args.writers.max(1)
        },
        write_op: format!("{:?}", args.write_op).to_lowercase(),
        synchronous_commit: args.synchronous_commit.clone(),
        duration_s: args.duration.as_secs_f64(),
        warmup_s: args.warmup.as_secs_f64(),
        threads: args.threads,
        requests: reads.requests,
        errors: reads.errors,
        hits: reads.hits,
        misses: reads.misses,
        unsent: reads.unsent,
        rps,
        p50_us: q.p50_us,
        p99_us: q.p99_us,
        p999_us: q.p999_us,
        max_us: q.max_us,
        send_lag_p99_us: args.rate.map(|_| quantiles(&reads.send_lag).p99_us),
        writes: writes.requests,
        write_errors: writes.errors,
        write_rps,
        write_p50_us: wq.p50_us,
        write_p99_us: wq.p99_us,
        rps_per_server_cpu: (cpu > 0.0).then(|| work * secs / cpu),
        client_cpu_s: None,
        server_keyspace_hits: None,
        server_keyspace_misses: None,
        server_rss_kib: BTreeMap::new(),
        rss_samples: Vec::new(),
        server_cpu_s,
        stale,
        stale_catchup_ms: None,
        pg: (!args.target.is_resp()).then(|| pg_endpoint(args)),
        pg_query: (!args.target.is_resp() && args.op != Op::Dashboard)
            .then(|| args.pg_query.name().to_string()),
        env,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(t0: Instant, warm_ms: u64, dur_ms: u64) -> Window {
        let measure_start = t0 + Duration::from_millis(warm_ms);
        Window {
            t0,
            measure_start,
            end: measure_start + Duration::from_millis(dur_ms),
        }
    }

    /// A client that fell behind sends the due backlog in pipeline-sized batches.
    #[test]
    fn due_requests_are_batched_up_to_the_pipeline() {
        let t0 = Instant::now();
        let w = window(t0, 0, 1000);
        let s = Schedule::new(t0, 1000.0, 1, 0); // one request per ms
        let now = t0 + Duration::from_micros(9_500); // requests 0..=9 are due
        assert_eq!(take_due(&s, 0, now, w.end, 1), 1);
        assert_eq!(take_due(&s, 0, now, w.end, 4), 4);
        assert_eq!(take_due(&s, 8, now, w.end, 16), 2);
        assert_eq!(take_due(&s, 10, now, w.end, 16), 0);
        // Nothing at or past the end of the window is taken.
        assert_eq!(take_due(&s, 995, t0 + Duration::from_secs(2), w.end, 16), 5);
    }

    /// When the window closes with a backlog, every unsent request inside the measured part
    /// is counted and charged its wait until `now`; warm-up requests are not.
    #[test]
    fn unsent_requests_are_counted_with_their_wait() {
        let t0 = Instant::now();
        let w = window(t0, 100, 100); // measure 100..200 ms
        let s = Schedule::new(t0, 1000.0, 2, 1); // this client: 1, 3, 5, ... ms
        let mut tally = Tally::new();
        // Stuck since request index 40 (due 81 ms, in warm-up); gave up at 250 ms.
        count_unsent(&s, 40, t0 + Duration::from_millis(250), w, &mut tally);
        // Due in 100..200 ms: 101, 103, ..., 199 ms = 50 requests.
        assert_eq!(tally.unsent, 50);
        assert_eq!(tally.requests, 0, "unsent are not completed requests");
        let q = quantiles(&tally.latency);
        assert!(
            (q.max_us - 149_000.0).abs() < 200.0,
            "oldest waited 250-101 ms: {q:?}"
        );
        assert!((q.p50_us - 101_000.0).abs() < 2_000.0, "{q:?}");
    }
}
