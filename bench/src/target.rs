//! One load connection per target: send a batch of requests, report each one's outcome.
//!
//! - `resp`: GET/MGET pipelined on one connection; hits are non-nil values, misses nils.
//! - `cache-aside`: the same reads, then for each nil the application's fill: SELECT the row
//!   from the origin (shared [`OriginPool`]) and SET it; a request completes when its last fill
//!   has been SET. Misses count fills.
//! - `pg-prepared` / `pg-simple`: one lookup per request (`id = $1` in the `--pg-query` form,
//!   or `id = ANY($1)` for several ids), a batch issued concurrently so tokio-postgres
//!   pipelines it; with `--op dashboard` (prepared only) a request is one SaaS dashboard page
//!   (`saas`: 8 statements one after the other), the key being the tenant. The connection goes
//!   to `--pg` (pgline's PostgreSQL front or the origin).
//!
//! # Thread model
//! A [`Conn`] is owned by one client task; the origin pool is shared.

#![deny(unsafe_code)]

use crate::cli::{Op, PgQuery, RespClient, Target};
use crate::error::BenchError;
use crate::pg::{self, OriginPool};
use crate::resp::{compose_command, compose_get, RespConn, RespError, Value};
use futures_util::future::join_all;
use std::sync::Arc;
use std::time::Instant;
use tokio_postgres::{Client, Statement};

/// The outcome of one request of a batch.
#[derive(Clone, Copy, Debug)]
pub struct Outcome {
    /// When its reply (and for cache-aside its fills) completed.
    pub done: Instant,
    /// Keys found.
    pub found: u32,
    /// Keys not found (cache-aside: filled from the origin).
    pub missing: u32,
    /// It failed.
    pub error: bool,
}

/// What a connection needs to know to open.
#[derive(Clone)]
pub struct ConnSpec {
    /// The target kind.
    pub target: Target,
    /// RESP server address.
    pub resp: String,
    /// Where pg targets' load connections go (`--pg`, else the origin).
    pub pg: String,
    /// The pg point lookup's form.
    pub pg_query: PgQuery,
    /// Dashboard pages: task-list page size.
    pub page_size: i64,
    /// Table name (and key prefix `<table>:`).
    pub table: String,
    /// RESP read command.
    pub op: Op,
    /// Shared origin for cache-aside fills.
    pub pool: Option<Arc<OriginPool>>,
    /// RESP client implementation (`resp` target).
    pub resp_client: RespClient,
    /// Send `READONLY` first on each RESP connection (a cluster replica).
    pub readonly: bool,
}

/// A load connection.
pub enum Conn {
    /// A RESP server read directly.
    Resp {
        conn: RespConn,
        prefix: Vec<u8>,
        mget: bool,
    },
    /// A RESP server read through the `redis` crate (a batch is one `redis::pipe()`).
    RedisRs {
        conn: redis::aio::MultiplexedConnection,
        prefix: String,
        mget: bool,
    },
    /// Valkey/Redis with cache-aside fills.
    CacheAside {
        conn: RespConn,
        prefix: Vec<u8>,
        mget: bool,
        pool: Arc<OriginPool>,
    },
    /// PostgreSQL.
    Pg {
        client: Client,
        one: Statement,
        any: Statement,
        simple: bool,
        table: String,
        /// The single-id lookup's SQL (`$1` the id; inlined for `pg-simple`).
        point: String,
        /// `--op dashboard`: the page's prepared statements.
        page: Option<Vec<Statement>>,
        /// Pages run so far (picks the task-list page).
        pages_run: u64,
        page_size: i64,
    },
}

impl Conn {
    /// Opens a connection for `spec`.
    pub async fn open(spec: &ConnSpec) -> Result<Conn, BenchError> {
        let prefix = format!("{}:", spec.table).into_bytes();
        let mget = spec.op == Op::Mget;
        Ok(match spec.target {
            Target::Resp if spec.resp_client == RespClient::RedisRs => {
                let client = redis::Client::open(format!("redis://{}/", spec.resp))
                    .map_err(|e| BenchError::Config(format!("redis-rs: {e}")))?;
                let conn = client
                    .get_multiplexed_tokio_connection()
                    .await
                    .map_err(|e| BenchError::Config(format!("redis-rs connect: {e}")))?;
                Conn::RedisRs {
                    conn,
                    prefix: format!("{}:", spec.table),
                    mget,
                }
            }
            Target::Resp => {
                let mut conn = RespConn::connect(&spec.resp).await?;
                if spec.readonly {
                    conn.command(&[b"READONLY"]).await?;
                }
                Conn::Resp { conn, prefix, mget }
            }
            Target::CacheAside => Conn::CacheAside {
                conn: RespConn::connect(&spec.resp).await?,
                prefix,
                mget,
                pool: spec
                    .pool
                    .clone()
                    .ok_or_else(|| BenchError::Config("cache-aside needs an origin pool".into()))?,
            },
            Target::PgPrepared | Target::PgSimple => {
                let client = pg::connect(&spec.pg).await?;
                let point = pg::point_sql(&spec.table, spec.pg_query);
                let one = client.prepare(&point).await?;
                let any = client.prepare(&pg::lookup_any_sql(&spec.table)).await?;
                let simple = spec.target == Target::PgSimple;
                let page = if spec.op == Op::Dashboard {
                    Some(crate::saas::prepare(&client).await?)
                } else {
                    None
                };
                Conn::Pg {
                    client,
                    one,
                    any,
                    simple,
                    table: spec.table.clone(),
                    point,
                    page,
                    pages_run: 0,
                    page_size: spec.page_size,
                }
            }
        })
    }

    /// Runs one batch: `ids` holds `ids.len() / per_req` requests of `per_req` ids each.
    /// Pushes one outcome per request, in order. An `Err` means the connection is broken;
    /// requests without an outcome then count as errors.
    pub async fn exec_batch(
        &mut self,
        ids: &[u64],
        per_req: usize,
        out: &mut Vec<Outcome>,
    ) -> Result<(), BenchError> {
        match self {
            Conn::Resp { conn, prefix, mget } => {
                for req in ids.chunks(per_req) {
                    compose_get(&mut conn.wbuf, prefix, req, *mget);
                }
                conn.flush().await?;
                for _ in ids.chunks(per_req) {
                    let t = conn.read_tally().await?;
                    let done = Instant::now();
                    out.push(Outcome {
                        done,
                        found: t.found,
                        missing: t.nil,
                        error: t.error,
                    });
                }
                Ok(())
            }
            Conn::RedisRs { conn, prefix, mget } => {
                exec_redis_rs(conn, prefix, *mget, ids, per_req, out).await
            }
            Conn::CacheAside {
                conn,
                prefix,
                mget,
                pool,
            } => exec_cache_aside(conn, prefix, *mget, pool, ids, per_req, out).await,
            Conn::Pg {
                page: Some(stmts),
                client,
                pages_run,
                page_size,
                ..
            } => {
                let first = *pages_run;
                *pages_run += ids.len() as u64;
                let (client, stmts, size) = (&*client, &stmts[..], *page_size);
                let futs = ids.iter().enumerate().map(|(i, &tenant)| async move {
                    let page = first + i as u64;
                    let r = crate::saas::exec_page(client, stmts, tenant, page, size).await;
                    (Instant::now(), r)
                });
                for (done, r) in join_all(futs).await {
                    out.push(Outcome {
                        done,
                        found: u32::from(r.is_ok()),
                        missing: 0,
                        error: r.is_err(),
                    });
                }
                Ok(())
            }
            Conn::Pg {
                client,
                one,
                any,
                simple,
                table,
                point,
                ..
            } => {
                let futs = ids
                    .chunks(per_req)
                    .map(|req| pg_lookup(client, (one, any), *simple, (table, point), req));
                for (done, r) in join_all(futs).await {
                    out.push(match r {
                        Ok((found, missing)) => Outcome {
                            done,
                            found,
                            missing,
                            error: false,
                        },
                        Err(_) => Outcome {
                            done,
                            found: 0,
                            missing: 0,
                            error: true,
                        },
                    });
                }
                Ok(())
            }
        }
    }
}

/// A batch through the `redis` crate: one pipeline, every reply built as a `redis::Value`.
async fn exec_redis_rs(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    mget: bool,
    ids: &[u64],
    per_req: usize,
    out: &mut Vec<Outcome>,
) -> Result<(), BenchError> {
    let mut pipe = redis::pipe();
    for req in ids.chunks(per_req) {
        let mut cmd = redis::cmd(if mget { "MGET" } else { "GET" });
        for &id in req {
            cmd.arg(format!("{prefix}{id}"));
        }
        pipe.add_command(cmd);
    }
    let replies: Vec<redis::Value> = match pipe.query_async(conn).await {
        Ok(v) => v,
        Err(e) if e.is_io_error() || e.is_connection_dropped() => {
            return Err(BenchError::Resp(RespError::Closed));
        }
        Err(_) => Vec::new(), // an error reply: the requests count as errors
    };
    let done = Instant::now();
    for v in replies {
        let mut o = Outcome {
            done,
            found: 0,
            missing: 0,
            error: false,
        };
        let items = match v {
            redis::Value::Array(items) => items,
            other => vec![other],
        };
        for item in items {
            match item {
                redis::Value::Nil => o.missing += 1,
                redis::Value::ServerError(_) => o.error = true,
                _ => o.found += 1,
            }
        }
        out.push(o);
    }
    Ok(())
}

/// One PG lookup; returns its completion time and (found, missing).
async fn pg_lookup(
    client: &Client,
    (one, any): (&Statement, &Statement),
    simple: bool,
    (table, point): (&str, &str),
    ids: &[u64],
) -> (Instant, Result<(u32, u32), tokio_postgres::Error>) {
    // `IN`/`ANY` return a row once however often its id is listed: count distinct ids.
    let distinct = {
        let mut v = ids.to_vec();
        v.sort_unstable();
        v.dedup();
        v.len() as u32
    };
    let r = if simple {
        let list: Vec<String> = ids.iter().map(u64::to_string).collect();
        let sql = if ids.len() == 1 {
            point.replace("$1", &list[0])
        } else {
            format!(
                "SELECT row_to_json(t)::text FROM {table} t WHERE id IN ({})",
                list.join(",")
            )
        };
        client.simple_query(&sql).await.map(|msgs| {
            msgs.iter()
                .filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)))
                .count() as u32
        })
    } else if ids.len() == 1 {
        client
            .query(one, &[&(ids[0] as i64)])
            .await
            .map(|rows| rows.len() as u32)
    } else {
        let v: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
        client.query(any, &[&v]).await.map(|rows| rows.len() as u32)
    };
    let n = ids.len() as u32;
    (
        Instant::now(),
        r.map(|rows| {
            let missing = distinct.saturating_sub(rows);
            (n - missing.min(n), missing)
        }),
    )
}

/// Cache-aside reads: pipelined GET/MGET, then a fill (SELECT, SET) for each nil.
async fn exec_cache_aside(
    conn: &mut RespConn,
    prefix: &[u8],
    mget: bool,
    pool: &OriginPool,
    ids: &[u64],
    per_req: usize,
    out: &mut Vec<Outcome>,
) -> Result<(), BenchError> {
    for req in ids.chunks(per_req) {
        compose_get(&mut conn.wbuf, prefix, req, mget);
    }
    conn.flush().await?;
    let mut replies = Vec::with_capacity(ids.len() / per_req.max(1));
    for _ in ids.chunks(per_req) {
        replies.push((conn.read_value().await?, Instant::now()));
    }
    for (req, (reply, read_at)) in ids.chunks(per_req).zip(replies) {
        let values = match reply {
            Value::Array(items) => items,
            Value::Error(_) => {
                out.push(Outcome {
                    done: read_at,
                    found: 0,
                    missing: 0,
                    error: true,
                });
                continue;
            }
            v => vec![v],
        };
        let mut o = Outcome {
            done: read_at,
            found: 0,
            missing: 0,
            error: false,
        };
        for (&id, v) in req.iter().zip(&values) {
            if *v != Value::Nil {
                o.found += 1;
                continue;
            }
            o.missing += 1;
            match pool.fetch(id).await {
                Ok(Some(json)) => {
                    let key = key_bytes(prefix, id);
                    compose_command(&mut conn.wbuf, &[b"SET", &key, json.as_bytes()]);
                    conn.flush().await?;
                    if let Value::Error(_) = conn.read_value().await? {
                        o.error = true;
                    }
                }
                Ok(None) => {}
                Err(_) => o.error = true,
            }
            o.done = Instant::now();
        }
        out.push(o);
    }
    Ok(())
}

/// `<prefix><id>`.
pub fn key_bytes(prefix: &[u8], id: u64) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(itoa::Buffer::new().format(id).as_bytes());
    k
}

/// Whether an error is a broken connection (reconnect) rather than a failed request.
pub fn is_broken(e: &BenchError) -> bool {
    matches!(
        e,
        BenchError::Resp(RespError::Io(_) | RespError::Closed | RespError::Invalid(_))
    ) || matches!(e, BenchError::Pg(p) if p.is_closed())
}
