//! Reading rows from the origin for misses: batched, one query per table per batch.
//!
//! A batch reads every requested key of one table with one statement,
//! `SELECT format('%s', col)... FROM t JOIN unnest($1::text[], ...) AS k ON t.pk = k.k0::type ...`
//! (each column as its output-function text, what pgoutput sends), so
//! concurrent misses cost one round trip. Keys are matched back by the row's own pk text: a key
//! that is not the canonical text of its value (`users:042`) never matches and reads as absent,
//! which keeps one row under one key (see `keytext`). Keys whose text would make the cast fail
//! are answered without asking the origin, or, for types we cannot check locally, read one by one
//! so that one bad key cannot fail its neighbours.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pgline_dataplane::plane::RowBytes;
use pgline_dataplane::row::{encode_columns, encode_resp_json};

use crate::catalog::{quote_ident, TableInfo};
use crate::keytext::{check_key_text, KeyCheck};
use crate::rowjson::encode_row_json;

#[derive(Debug, thiserror::Error, Clone)]
pub enum FillError {
    /// No connection to the origin (down, refused, auth): a retry may help later.
    #[error("origin unavailable: {0}")]
    Unavailable(String),
    /// The origin answered with an error.
    #[error("origin error: {0}")]
    Query(String),
    #[error("origin query timed out after {0} ms")]
    Timeout(u64),
    /// The table's name now names another relation (or none): it was dropped or renamed since it
    /// was cached. The catalog check removes it; a retry reads whatever then has the name.
    #[error("table {0} was dropped or renamed since it was cached")]
    TableChanged(String),
}

/// What a fill found for one key.
#[derive(Debug, Clone)]
pub enum Fetched {
    Row(Arc<RowBytes>),
    /// No such row. `cacheable` is false when the answer came without a clean origin read (e.g.
    /// a key text the type rejects), so no negative entry is installed for it.
    Absent {
        cacheable: bool,
    },
}

/// The origin snapshot a fill read under (`pg_current_snapshot()` of the same statement), with
/// transaction ids cut to the 32 bits pgoutput sends.
///
/// A transaction's commit record reaches the WAL (and so the WAL consumer) before the committing
/// backend leaves the proc array, so a snapshot taken after the writer applied a change may
/// still not see it. The writer uses [`Snapshot::sees`] to refuse such a read (see
/// `docs/consistency.md`, "commit visibility").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub xmin: u32,
    pub xmax: u32,
    pub xip: Vec<u32>,
}

impl Snapshot {
    /// Whether the (committed) top-level transaction `xid` is visible to this snapshot.
    pub fn sees(&self, xid: u32) -> bool {
        xid_precedes(xid, self.xmax) && !self.xip.contains(&xid)
    }
}

/// `a` is older than `b` in modulo-2^32 transaction id order.
pub fn xid_precedes(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// Applied xids kept for the check of a core's read: at 1,000 transactions a second, one
/// second of them. A read whose snapshot's xmin is not above every xid dropped from them is
/// not known current (forwarded).
pub const RECENT_XIDS: usize = 1024;

/// The transactions the writer applied, as a read made on a core must see them to answer
/// (`crate::corefill`): each applied xid below the snapshot's xmin, or below its xmax and not in
/// progress.
///
/// Thread model: the writer records, the cores' fill tasks check; both under one short lock,
/// once per applied transaction and once per landed read.
#[derive(Default)]
pub struct AppliedXids {
    inner: Mutex<Recent>,
}

#[derive(Default)]
struct Recent {
    /// The greatest xid applied (modulo-2^32 order), `None` before the first.
    greatest: Option<u32>,
    /// The last [`RECENT_XIDS`] applied, in apply order.
    ring: VecDeque<u32>,
    /// The greatest xid dropped from `ring`.
    dropped: Option<u32>,
}

/// The later of two xids in modulo-2^32 order.
fn later(a: Option<u32>, b: u32) -> u32 {
    match a {
        Some(a) if !xid_precedes(a, b) => a,
        _ => b,
    }
}

impl AppliedXids {
    /// The writer, before any change of transaction `xid` reaches the store.
    pub fn applying(&self, xid: u32) {
        let mut r = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        r.greatest = Some(later(r.greatest, xid));
        if r.ring.len() == RECENT_XIDS {
            let old = r.ring.pop_front().expect("the ring is full");
            r.dropped = Some(later(r.dropped, old));
        }
        r.ring.push_back(xid);
    }

    /// Whether `snap` sees every transaction applied so far.
    pub fn seen_by(&self, snap: &Snapshot) -> bool {
        let unsure: Vec<u32> = {
            let r = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            match r.greatest {
                None => return true,
                Some(g) if xid_precedes(g, snap.xmin) => return true,
                Some(_) => {}
            }
            if r.dropped.is_some_and(|d| !xid_precedes(d, snap.xmin)) {
                return false;
            }
            r.ring
                .iter()
                .copied()
                .filter(|&x| !xid_precedes(x, snap.xmin))
                .collect()
        };
        // At or above xmin: seen if below xmax and not in progress. Offsets from xmin order
        // the in-progress list for a binary search (it can be as long as the connections).
        let mut in_progress: Vec<u32> =
            snap.xip.iter().map(|x| x.wrapping_sub(snap.xmin)).collect();
        in_progress.sort_unstable();
        unsure.into_iter().all(|x| {
            xid_precedes(x, snap.xmax)
                && in_progress
                    .binary_search(&x.wrapping_sub(snap.xmin))
                    .is_err()
        })
    }
}

/// Parses `pg_snapshot` text output, `xmin:xmax:xip1,xip2,...` (64-bit ids, cut to 32 bits).
pub fn parse_snapshot(text: &str) -> Option<Snapshot> {
    let mut parts = text.split(':');
    let cut = |s: &str| s.trim().parse::<u64>().ok().map(|x| x as u32);
    let xmin = cut(parts.next()?)?;
    let xmax = cut(parts.next()?)?;
    let xip = match parts.next() {
        None | Some("") => Vec::new(),
        Some(list) => list.split(',').map(cut).collect::<Option<Vec<u32>>>()?,
    };
    Some(Snapshot { xmin, xmax, xip })
}

/// What one fill read: a result per key, and per key the snapshot it was read under (`None`
/// for keys answered without an origin read) and the origin's WAL position read in the same
/// statement (0 for keys answered without an origin read).
#[derive(Debug, Clone, Default)]
pub struct FetchedBatch {
    pub rows: Vec<Fetched>,
    pub snapshots: Vec<Option<Arc<Snapshot>>>,
    pub lsns: Vec<u64>,
}

/// What one statement of a fill returned besides its rows.
#[derive(Debug, Clone)]
struct Read {
    snapshot: Arc<Snapshot>,
    lsn: u64,
}

/// Encodes a row (column texts in table order) as the store holds it.
pub fn encode_row(table: &TableInfo, values: &[Option<&[u8]>]) -> RowBytes {
    let mut json = Vec::with_capacity(
        64 + values
            .iter()
            .map(|v| v.map_or(4, |v| v.len() + 8))
            .sum::<usize>(),
    );
    encode_row_json(&mut json, &table.json_columns, values);
    let mut resp_json = Vec::with_capacity(json.len() + 16);
    encode_resp_json(&mut resp_json, &json);
    let mut columns = Vec::new();
    encode_columns(
        &mut columns,
        table
            .columns
            .iter()
            .zip(values.iter())
            .map(|(c, v)| (c.name.as_bytes(), *v)),
    );
    RowBytes { resp_json, columns }
}

/// Each column as its type's *output function* text (what pgoutput sends), which is not always
/// what a `::text` cast gives (`bool` casts to `true`, outputs `t`). `format('%s', v)` calls the
/// output function; NULL must stay NULL.
fn select_list(table: &TableInfo) -> String {
    table
        .columns
        .iter()
        .map(|c| {
            let col = format!("t.{}", quote_ident(&c.name));
            format!("CASE WHEN {col} IS NULL THEN NULL ELSE format('%s', {col}) END")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The batched statement for `table`: one text[] parameter per key column. Its first column is
/// the statement's snapshot; the rows hang off it with a LEFT JOIN, so the snapshot comes back
/// even when no key matches (that row has NULL columns).
///
/// After the name check comes the origin's WAL position, evaluated while the statement runs,
/// so after its snapshot was taken: every commit the rows show is at or below it, as a commit's
/// record is flushed before it becomes visible, except one made with `synchronous_commit = off`
/// (visible once inserted; such a commit can lie above it for up to three `wal_writer_delay`s,
/// `docs/pgwire.md`, "Asynchronous commits"). A PostgreSQL session answered from the fill
/// raises its fence to it, as the relay's fence query after a forwarded read does; on a server
/// in recovery it is the replay position.
///
/// The table is named in the query, but cached under its OID: after a DROP and re-CREATE (or a
/// RENAME) the name reads another table. So the statement's last column is, on every row and on
/// the all-NULL row, whether the name still resolves to `table.id`. The relation read is locked
/// (`AccessShareLock`) from parse to the end of the statement, and DROP/RENAME need
/// `AccessExclusiveLock`, so `to_regclass` at execution resolves the name to the relation being
/// read.
pub fn batch_sql(table: &TableInfo) -> String {
    let params: Vec<String> = (0..table.key_columns.len())
        .map(|i| format!("${}::text[]", i + 1))
        .collect();
    let names: Vec<String> = (0..table.key_columns.len())
        .map(|i| format!("k{i}"))
        .collect();
    let on: Vec<String> = table
        .key_columns
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let col = &table.columns[c];
            format!("t.{} = k.k{i}::{}", quote_ident(&col.name), col.type_name)
        })
        .collect();
    let name = table.qualified().replace('\'', "''");
    format!(
        "SELECT s.snap, {}, s.same, s.lsn FROM (SELECT pg_current_snapshot()::text AS snap, \
         to_regclass('{name}')::oid = {}::oid AS same, \
         (CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn() \
         ELSE pg_catalog.pg_current_wal_lsn() END)::text AS lsn) s \
         LEFT JOIN ({} t JOIN unnest({}) AS k({}) ON {}) ON true",
        select_list(table),
        table.id,
        table.qualified(),
        params.join(", "),
        names.join(", "),
        on.join(" AND ")
    )
}

/// Reads `pks` of `table`; results in the order of `pks`.
pub async fn fetch(
    client: &deadpool_postgres::Client,
    table: &TableInfo,
    pks: &[Box<[u8]>],
    timeout_ms: u64,
) -> Result<FetchedBatch, FillError> {
    let mut out = FetchedBatch {
        rows: vec![Fetched::Absent { cacheable: true }; pks.len()],
        snapshots: vec![None; pks.len()],
        lsns: vec![0; pks.len()],
    };
    let results = &mut out.rows;
    let mut batch: Vec<usize> = Vec::new();
    let mut single: Vec<usize> = Vec::new();
    for (i, pk) in pks.iter().enumerate() {
        let Some(parts) = table.split_pk(pk) else {
            results[i] = Fetched::Absent { cacheable: true };
            continue;
        };
        let mut verdict = KeyCheck::Canonical;
        for (part, &c) in parts.iter().zip(&table.key_columns) {
            match check_key_text(table.columns[c].type_oid, part) {
                KeyCheck::Canonical => {}
                KeyCheck::NotCanonical => verdict = KeyCheck::NotCanonical,
                KeyCheck::Unknown if verdict == KeyCheck::Canonical => verdict = KeyCheck::Unknown,
                KeyCheck::Unknown => {}
            }
        }
        match verdict {
            KeyCheck::Canonical => batch.push(i),
            KeyCheck::Unknown => single.push(i),
            KeyCheck::NotCanonical => results[i] = Fetched::Absent { cacheable: false },
        }
    }
    if !batch.is_empty() {
        let read = run(client, table, pks, &batch, results, timeout_ms).await?;
        for &i in &batch {
            out.snapshots[i] = Some(read.snapshot.clone());
            out.lsns[i] = read.lsn;
        }
    }
    let results = &mut out.rows;
    for i in single {
        match run(client, table, pks, &[i], results, timeout_ms).await {
            Ok(read) => {
                out.snapshots[i] = Some(read.snapshot);
                out.lsns[i] = read.lsn;
            }
            // The origin rejected the key's text for its type: no such row can exist.
            Err(FillError::Query(_)) => results[i] = Fetched::Absent { cacheable: false },
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

async fn run(
    client: &deadpool_postgres::Client,
    table: &TableInfo,
    pks: &[Box<[u8]>],
    which: &[usize],
    results: &mut [Fetched],
    timeout_ms: u64,
) -> Result<Read, FillError> {
    let nkeys = table.key_columns.len();
    let mut params: Vec<Vec<String>> = vec![Vec::with_capacity(which.len()); nkeys];
    for &i in which {
        let parts = table.split_pk(&pks[i]).unwrap_or_default();
        for (k, part) in parts.iter().enumerate() {
            params[k].push(String::from_utf8_lossy(part).into_owned());
        }
    }
    let sql = batch_sql(table);
    let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params
        .iter()
        .map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect();
    let query = async {
        let stmt = prepare(client, &sql).await?;
        client.query(&stmt, &refs).await
    };
    let rows = match tokio::time::timeout(Duration::from_millis(timeout_ms), query).await {
        Err(_) => return Err(FillError::Timeout(timeout_ms)),
        Ok(Err(e)) => return Err(classify(e)),
        Ok(Ok(rows)) => rows,
    };
    let guard = table.columns.len() + 1;
    let mut read = None;
    for row in rows {
        if row.get::<_, Option<bool>>(guard) != Some(true) {
            return Err(FillError::TableChanged(table.qualified()));
        }
        if read.is_none() {
            let snap: String = row.get(0);
            let lsn: Option<String> = row.get(guard + 1);
            let snapshot = parse_snapshot(&snap).map(Arc::new);
            let lsn = lsn.as_deref().and_then(crate::lsn::parse_lsn);
            read = snapshot
                .zip(lsn)
                .map(|(snapshot, lsn)| Read { snapshot, lsn });
        }
        let texts: Vec<Option<&str>> = (1..=table.columns.len()).map(|c| row.get(c)).collect();
        let values: Vec<Option<&[u8]>> = texts.iter().map(|t| t.map(str::as_bytes)).collect();
        let Some(pk) = table.pk_text(&values) else {
            continue;
        };
        if let Some(&i) = which.iter().find(|&&i| *pks[i] == *pk) {
            results[i] = Fetched::Row(Arc::new(encode_row(table, &values)));
        }
    }
    // Without its snapshot a read cannot be checked against changes already applied, nor a
    // session fenced after it without its WAL position.
    read.ok_or_else(|| {
        FillError::Query("the fill statement returned no snapshot or WAL position".into())
    })
}

/// The fill statement, prepared once per origin connection; the connection is first told to
/// plan its prepared statements once (`plan_cache_mode = force_generic_plan`).
///
/// Left to choose, the origin plans a fill anew on every execution: `unnest($1)` is estimated
/// at 100 keys in the generic plan, so the generic plan never looks cheaper than a custom plan
/// for the one or few keys a fill carries, and the custom plan is made per execution (planning
/// took 0.1-0.4 ms where the read itself takes 0.02-0.05 ms; through pgbench the fill statement
/// ran at a quarter of the client's own `-S` lookup, generic at three quarters). The generic
/// plan is the same nested loop over the primary key index. Only fills prepare through the
/// connection's statement cache, so an empty cache means the setting was not made yet.
async fn prepare(
    client: &deadpool_postgres::Client,
    sql: &str,
) -> Result<tokio_postgres::Statement, tokio_postgres::Error> {
    if client.statement_cache.size() == 0 {
        client
            .batch_execute("SET plan_cache_mode = force_generic_plan")
            .await?;
    }
    client.prepare_cached(sql).await
}

pub fn classify(e: tokio_postgres::Error) -> FillError {
    if let Some(db) = e.as_db_error() {
        FillError::Query(format!("{} ({})", db.message(), db.code().code()))
    } else {
        FillError::Unavailable(e.to_string())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A snapshot for tests (also `writer::visibility`'s).
    pub(crate) fn snap(xmin: u32, xmax: u32, xip: &[u32]) -> Snapshot {
        Snapshot {
            xmin,
            xmax,
            xip: xip.to_vec(),
        }
    }

    fn applied(xids: &[u32]) -> AppliedXids {
        let a = AppliedXids::default();
        for &x in xids {
            a.applying(x);
        }
        a
    }

    #[test]
    fn applied_xids_below_the_xmin_are_seen() {
        assert!(applied(&[]).seen_by(&snap(5, 5, &[])), "nothing applied");
        assert!(applied(&[7, 9]).seen_by(&snap(10, 12, &[11])));
        // Modulo 2^32.
        assert!(applied(&[u32::MAX - 2]).seen_by(&snap(3, 3, &[])));
        assert!(!applied(&[4]).seen_by(&snap(u32::MAX - 2, u32::MAX - 1, &[])));
    }

    #[test]
    fn an_applied_xid_above_the_xmin_is_seen_unless_in_progress_or_past_xmax() {
        // Transaction 10 is open (another database's, say); 11 and 12 were applied after it.
        let a = applied(&[11, 12]);
        assert!(a.seen_by(&snap(10, 13, &[10])), "10 holds xmin back");
        assert!(!a.seen_by(&snap(10, 13, &[10, 12])), "12 still in progress");
        assert!(
            !a.seen_by(&snap(10, 12, &[10])),
            "12 at xmax: not begun then"
        );
        assert!(!a.seen_by(&snap(11, 12, &[11])), "xmin itself in progress");
        // Across the wrap, with a long in-progress list.
        let a = applied(&[u32::MAX, 1]);
        let xip: Vec<u32> = (2..400).chain([u32::MAX - 1]).collect();
        assert!(a.seen_by(&snap(u32::MAX - 1, 400, &xip)));
        let xip: Vec<u32> = (1..400).chain([u32::MAX - 1]).collect();
        assert!(!a.seen_by(&snap(u32::MAX - 1, 400, &xip)), "1 in progress");
    }

    #[test]
    fn an_xid_older_than_the_kept_ones_and_not_below_xmin_is_not_known_seen() {
        // 100 applied, then RECENT_XIDS more: 100 is no longer kept.
        let mut xids = vec![100];
        xids.extend((0..RECENT_XIDS as u32).map(|i| 200 + i));
        let a = applied(&xids);
        let xmax = 200 + RECENT_XIDS as u32;
        assert!(!a.seen_by(&snap(90, xmax, &[90])), "100 may be unseen");
        assert!(a.seen_by(&snap(101, xmax, &[101])), "100 is below xmin");
        // Applied out of xid order: the greatest dropped counts, not the last.
        let mut xids = vec![150, 100];
        xids.extend((0..RECENT_XIDS as u32 - 1).map(|i| 200 + i));
        let a = applied(&xids);
        assert!(
            !a.seen_by(&snap(120, xmax, &[120])),
            "150 dropped, above xmin"
        );
        assert!(a.seen_by(&snap(151, xmax, &[151])));
    }
}
