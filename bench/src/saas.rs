//! The SaaS dashboard workload: a multi-table schema (`load --schema saas`) and one dashboard
//! "page" of 8 tenant-scoped prepared queries (`run --op dashboard`).
//!
//! Schema (all ids `int8`, every table carries `tenant_id`, deterministic: every value is a
//! function of the row number, so two loads with the same sizes hold the same bytes):
//!
//! ```text
//! tenants(id, name, plan, created)                         T rows, ids 0..T
//! users(id, tenant_id, name, email, role, created)         50 per tenant
//! projects(id, tenant_id, name, owner_id, status, created) 20 per tenant
//! tasks(id, tenant_id, project_id, assignee_id, title, status, priority, estimate_h,
//!       due, created, updated)                             --tasks, spread evenly (id % T)
//! comments(id, tenant_id, task_id, author_id, body, created)  2 per task
//! ```
//!
//! A page is the 8 statements of [`PAGE_SQL`], run one after the other on one connection (as
//! an ORM-backed page handler does), each filtered by `tenant_id = $1`: a tenant header join,
//! task counts by status, projects with open work (LEFT JOIN, sum, ORDER BY .. LIMIT), open
//! work per assignee, one page of the task list (3-way join, ORDER BY updated, LIMIT/OFFSET),
//! recent comments (3-way join), overdue totals (count, sum) and comment activity per project.
//! None uses a volatile function (`now()` is spelled as a fixed date), so a query-result cache
//! may serve all eight.
//!
//! # Thread model
//! `load` runs on the caller's task; a page runs on its client's task and connection.
//!
//! # Limitations
//! Latency is per page (8 round trips); the rows are counted, not decoded or checked.

#![deny(unsafe_code)]

use crate::error::BenchError;
use crate::pg;
use serde::Serialize;
use tokio_postgres::{Client, Statement};

/// Users per tenant.
pub const USERS_PER_TENANT: u64 = 50;
/// Projects per tenant.
pub const PROJECTS_PER_TENANT: u64 = 20;
/// Comments per task.
pub const COMMENTS_PER_TASK: u64 = 2;
/// Pages of the task list a dashboard request may show (`OFFSET` 0..PAGES × page size).
pub const PAGES: u64 = 10;

/// The page: `$1` is the tenant id; statement 4 also takes `$2`, the `OFFSET` (and `$3`, the
/// page size).
pub const PAGE_SQL: [&str; 8] = [
    "SELECT t.id, t.name, t.plan, count(u.id) AS users \
     FROM tenants t JOIN users u ON u.tenant_id = t.id \
     WHERE t.id = $1 AND u.tenant_id = $1 GROUP BY t.id, t.name, t.plan",
    "SELECT status, count(*) AS n FROM tasks WHERE tenant_id = $1 GROUP BY status ORDER BY status",
    "SELECT p.id, p.name, count(k.id) AS open_tasks, coalesce(sum(k.estimate_h), 0) AS hours \
     FROM projects p LEFT JOIN tasks k \
       ON k.project_id = p.id AND k.tenant_id = p.tenant_id AND k.status <> 'done' \
     WHERE p.tenant_id = $1 GROUP BY p.id, p.name ORDER BY open_tasks DESC, p.id LIMIT 10",
    "SELECT u.id, u.name, count(*) AS open_tasks, sum(k.estimate_h) AS hours \
     FROM tasks k JOIN users u ON u.id = k.assignee_id \
     WHERE k.tenant_id = $1 AND k.status <> 'done' \
     GROUP BY u.id, u.name ORDER BY open_tasks DESC, u.id LIMIT 10",
    "SELECT k.id, k.title, k.status, k.priority, k.due, u.name AS assignee, p.name AS project \
     FROM tasks k JOIN users u ON u.id = k.assignee_id JOIN projects p ON p.id = k.project_id \
     WHERE k.tenant_id = $1 ORDER BY k.updated DESC, k.id DESC LIMIT $3 OFFSET $2",
    "SELECT c.id, c.body, c.created, u.name AS author, k.title \
     FROM comments c JOIN users u ON u.id = c.author_id JOIN tasks k ON k.id = c.task_id \
     WHERE c.tenant_id = $1 ORDER BY c.created DESC, c.id DESC LIMIT 10",
    "SELECT count(*) AS overdue, coalesce(sum(estimate_h), 0) AS hours FROM tasks \
     WHERE tenant_id = $1 AND status <> 'done' AND due < DATE '2026-01-01'",
    "SELECT p.name, count(c.id) AS comments \
     FROM comments c JOIN tasks k ON k.id = c.task_id JOIN projects p ON p.id = k.project_id \
     WHERE c.tenant_id = $1 GROUP BY p.name ORDER BY comments DESC, p.name LIMIT 5",
];

/// What `load --schema saas` did.
#[derive(Debug, Serialize)]
pub struct SaasReport {
    /// Rows per table after the load.
    pub rows: Vec<(String, i64)>,
    /// Whether the tables were (re)created.
    pub created: bool,
}

/// The statements, in load order (children after parents).
fn create_sql(tenants: u64, tasks: u64) -> String {
    let (u, p, c) = (USERS_PER_TENANT, PROJECTS_PER_TENANT, COMMENTS_PER_TASK);
    let t = tenants;
    format!(
        "DROP TABLE IF EXISTS comments, tasks, projects, users, tenants;
         CREATE TABLE tenants (id int8 PRIMARY KEY, name text NOT NULL, plan text NOT NULL,
             created timestamptz NOT NULL);
         CREATE TABLE users (id int8 PRIMARY KEY, tenant_id int8 NOT NULL REFERENCES tenants,
             name text NOT NULL, email text NOT NULL, role text NOT NULL, created timestamptz NOT NULL);
         CREATE TABLE projects (id int8 PRIMARY KEY, tenant_id int8 NOT NULL REFERENCES tenants,
             name text NOT NULL, owner_id int8 NOT NULL REFERENCES users, status text NOT NULL,
             created timestamptz NOT NULL);
         CREATE TABLE tasks (id int8 PRIMARY KEY, tenant_id int8 NOT NULL REFERENCES tenants,
             project_id int8 NOT NULL REFERENCES projects, assignee_id int8 NOT NULL REFERENCES users,
             title text NOT NULL, status text NOT NULL, priority int4 NOT NULL,
             estimate_h numeric(5,1) NOT NULL, due date NOT NULL, created timestamptz NOT NULL,
             updated timestamptz NOT NULL);
         CREATE TABLE comments (id int8 PRIMARY KEY, tenant_id int8 NOT NULL REFERENCES tenants,
             task_id int8 NOT NULL REFERENCES tasks, author_id int8 NOT NULL REFERENCES users,
             body text NOT NULL, created timestamptz NOT NULL);
         INSERT INTO tenants SELECT g, 'Tenant ' || g, (ARRAY['free','pro','team','enterprise'])[1 + g % 4],
             '2024-01-01 00:00:00+00'::timestamptz + g * interval '1 day'
             FROM generate_series(0, {t} - 1) g;
         INSERT INTO users SELECT g, g / {u}, 'User ' || g, 'user' || g || '@tenant' || g / {u} || '.example',
             (ARRAY['admin','member','member','viewer'])[1 + g % 4],
             '2024-02-01 00:00:00+00'::timestamptz + g * interval '1 hour'
             FROM generate_series(0, {t} * {u} - 1) g;
         INSERT INTO projects SELECT g, g / {p}, 'Project ' || g, (g / {p}) * {u} + g % {u},
             (ARRAY['active','active','archived'])[1 + g % 3],
             '2024-03-01 00:00:00+00'::timestamptz + g * interval '1 hour'
             FROM generate_series(0, {t} * {p} - 1) g;
         INSERT INTO tasks SELECT g, g % {t}, (g % {t}) * {p} + (g / {t}) % {p},
             (g % {t}) * {u} + ((g / {t}) * 13) % {u}, 'Task ' || g || ': ship the next thing',
             (ARRAY['todo','doing','review','done','done'])[1 + (g * 7 + g / {t}) % 5],
             1 + ((g / {t}) * 3) % 4, (((g / {t}) % 16) + 1) / 2.0, DATE '2025-06-01' + ((g / {t}) % 400)::int,
             '2025-01-01 00:00:00+00'::timestamptz + g * interval '37 seconds',
             '2025-01-01 00:00:00+00'::timestamptz + g * interval '37 seconds' + ((g * 7919) % 1000000) * interval '1 second'
             FROM generate_series(0, {tasks} - 1) g;
         INSERT INTO comments SELECT g, (g % {tasks}) % {t}, g % {tasks},
             ((g % {tasks}) % {t}) * {u} + (g * 17) % {u},
             'Comment ' || g || ': looks good to me, one small question about the estimate',
             '2025-01-01 00:00:00+00'::timestamptz + (g % {tasks}) * interval '37 seconds' + (g / {tasks} + 1) * interval '3 hours'
             FROM generate_series(0, {tasks} * {c} - 1) g;
         CREATE INDEX ON users (tenant_id);
         CREATE INDEX ON projects (tenant_id);
         CREATE INDEX ON tasks (tenant_id, status);
         CREATE INDEX ON tasks (tenant_id, updated DESC, id DESC);
         CREATE INDEX ON tasks (project_id);
         CREATE INDEX ON comments (tenant_id, created DESC, id DESC);
         CREATE INDEX ON comments (task_id);"
    )
}

/// The row counts a load of these sizes leaves, per table.
pub fn expected_rows(tenants: u64, tasks: u64) -> [(&'static str, i64); 5] {
    [
        ("tenants", tenants as i64),
        ("users", (tenants * USERS_PER_TENANT) as i64),
        ("projects", (tenants * PROJECTS_PER_TENANT) as i64),
        ("tasks", tasks as i64),
        ("comments", (tasks * COMMENTS_PER_TASK) as i64),
    ]
}

/// Creates and fills the schema on `origin` unless it already holds exactly these sizes
/// (`force`: always). Analyzes every table.
pub async fn load(
    origin: &str,
    tenants: u64,
    tasks: u64,
    force: bool,
) -> Result<SaasReport, BenchError> {
    if tenants == 0 || tasks < tenants {
        return Err(BenchError::Config(
            "--schema saas needs --tenants >= 1 and --tasks >= --tenants".into(),
        ));
    }
    crate::load::ensure_database(origin).await?;
    let c = pg::connect(origin).await?;
    let expected = expected_rows(tenants, tasks);
    let keep = !force && counts(&c).await? == Some(expected.map(|(_, n)| n));
    if !keep {
        c.batch_execute(&create_sql(tenants, tasks)).await?;
    }
    c.batch_execute("ANALYZE tenants, users, projects, tasks, comments")
        .await?;
    let rows = match counts(&c).await? {
        Some(n) => expected
            .iter()
            .zip(n)
            .map(|((t, _), n)| (t.to_string(), n))
            .collect(),
        None => Vec::new(),
    };
    Ok(SaasReport {
        rows,
        created: !keep,
    })
}

/// Row counts of the five tables, or `None` when one is missing.
async fn counts(c: &Client) -> Result<Option<[i64; 5]>, BenchError> {
    let mut out = [0i64; 5];
    for (i, t) in ["tenants", "users", "projects", "tasks", "comments"]
        .iter()
        .enumerate()
    {
        let exists: bool = c
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[t])
            .await?
            .get(0);
        if !exists {
            return Ok(None);
        }
        out[i] = c
            .query_one(&format!("SELECT count(*) FROM {t}"), &[])
            .await?
            .get(0);
    }
    Ok(Some(out))
}

/// The page's statements prepared on `client`.
pub async fn prepare(client: &Client) -> Result<Vec<Statement>, BenchError> {
    let mut out = Vec::with_capacity(PAGE_SQL.len());
    for sql in PAGE_SQL {
        out.push(client.prepare(sql).await?);
    }
    Ok(out)
}

/// Runs one page for `tenant` showing task-list page `page` (of [`PAGES`]); returns the rows
/// of all eight results.
pub async fn exec_page(
    client: &Client,
    stmts: &[Statement],
    tenant: u64,
    page: u64,
    page_size: i64,
) -> Result<u64, tokio_postgres::Error> {
    let t = tenant as i64;
    let offset = (page % PAGES) as i64 * page_size;
    let mut rows = 0u64;
    for (i, s) in stmts.iter().enumerate() {
        let r = if i == 4 {
            client.query(s, &[&t, &offset, &page_size]).await?
        } else {
            client.query(s, &[&t]).await?
        };
        rows += r.len() as u64;
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_statement_is_tenant_scoped_and_non_volatile() {
        for sql in PAGE_SQL {
            assert!(sql.contains("tenant_id = $1"), "{sql}");
            let lower = sql.to_lowercase();
            for f in ["now()", "random()", "current_"] {
                assert!(!lower.contains(f), "{sql}");
            }
        }
        assert!(PAGE_SQL[4].contains("OFFSET $2"));
        assert_eq!(expected_rows(100, 100_000)[4], ("comments", 200_000));
    }
}
