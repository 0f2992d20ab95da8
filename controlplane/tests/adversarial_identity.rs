//! Issue 11, F1-F3: the cache never answers what the origin, in the session's exact state,
//! would answer otherwise. Each test changes a session's state the way an attacker or a
//! careless client would (SET ROLE, SET SESSION AUTHORIZATION, set_config under any spelling,
//! a function, a role default, startup options, a temporary table made by a function) and
//! asserts that every answer through pgline equals the origin's own in the same state, after
//! the cache was warmed by a clean session (so the old text-matching guard fails these).

use std::time::{Duration, Instant};

use pgline_controlplane::server::Pgline;
use pgline_testkit::TestDb;
use pgline_testkit::{lab, origin};
use tokio_postgres::{Client, SimpleQueryMessage};

/// Rows as text, or the SQLSTATE of the error.
type Answer = Result<Vec<Vec<Option<String>>>, String>;

async fn answer(c: &Client, sql: &str) -> Answer {
    match c.simple_query(sql).await {
        Ok(msgs) => Ok(msgs
            .into_iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) => {
                    Some((0..r.len()).map(|i| r.get(i).map(str::to_owned)).collect())
                }
                _ => None,
            })
            .collect()),
        Err(e) => Err(e
            .code()
            .map_or_else(|| format!("{e}"), |c| c.code().to_owned())),
    }
}

fn hits(p: &Pgline) -> u64 {
    p.shared.total(|s| &s.keys_hit)
}

/// A client through pgline's PostgreSQL port as `user`, with extra connection settings.
async fn via_pgline(p: &Pgline, db: &str, user: &str, password: &str, extra: &str) -> Client {
    let addr = p.pg_addr().expect("pg port");
    let conn = format!(
        "host={} port={} user={user} password={password} dbname={db} {extra}",
        addr.ip(),
        addr.port()
    );
    origin::connect(&conn).await
}

/// A client straight at the origin.
async fn at_origin(db: &str, user: &str, password: &str, extra: &str) -> Client {
    let (host, port, _, _) = origin::origin_base();
    origin::connect(&format!(
        "host={host} port={port} user={user} password={password} dbname={db} {extra}"
    ))
    .await
}

/// Runs `sql` through `c` until the answer comes from cache; every answer must be `expected`.
async fn warm(p: &Pgline, c: &Client, sql: &str, expected: &Answer) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let before = hits(p);
        assert_eq!(&answer(c, sql).await, expected, "warming {sql}");
        if hits(p) > before {
            return;
        }
        assert!(Instant::now() < until, "{sql} never served from cache");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

const SCHEMA: &str = "
CREATE TABLE secrets (id int PRIMARY KEY, v text NOT NULL);
INSERT INTO secrets VALUES (1, 'one'), (2, 'two'), (3, 'the secret');
CREATE TABLE public_info (id int PRIMARY KEY, v text NOT NULL, f float8, b bytea);
INSERT INTO public_info VALUES (1, 'public row', 0.1, '\\x00ff'), (2, 'public two', 1.5, '\\x41');
CREATE SCHEMA shadow;
CREATE TABLE shadow.public_info (id int PRIMARY KEY, v text NOT NULL, f float8, b bytea);
INSERT INTO shadow.public_info VALUES (1, 'SHADOW row', 9.9, '\\x01'), (2, 'a', 1, '\\x02'),
  (3, 'b', 2, '\\x03');
GRANT USAGE ON SCHEMA shadow TO PUBLIC;
GRANT SELECT ON public_info, shadow.public_info TO PUBLIC;
";

const LOOKUP: &str = "SELECT * FROM public_info WHERE id = 1";
const COUNT: &str = "SELECT count(*) AS n, max(v) AS m FROM public_info";

/// A test database and the roles a test made: roles are cluster-wide and hold privileges in
/// the database, so they are dropped once the database is gone.
struct Scope {
    db: Option<TestDb>,
    roles: Vec<String>,
}

impl Scope {
    fn new(db: TestDb) -> Scope {
        Scope {
            db: Some(db),
            roles: Vec::new(),
        }
    }

    fn db(&self) -> &TestDb {
        self.db.as_ref().expect("dropped only at the end")
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        drop(self.db.take());
        let roles = std::mem::take(&mut self.roles);
        origin::run_cleanup(async move {
            let admin = origin::admin_client().await;
            for r in roles {
                let _ = admin
                    .batch_execute(&format!("DROP ROLE IF EXISTS {r}"))
                    .await;
            }
        });
    }
}

struct Lab {
    scope: Scope,
    p: std::sync::Arc<Pgline>,
    user: String,
    password: String,
    /// A role without any privilege on `secrets`.
    bob: String,
}

async fn lab(tag: &str) -> Lab {
    lab_with(tag, |_| {}).await
}

/// [`lab`] with pgline's configuration edited by `edit`.
async fn lab_with(tag: &str, edit: impl FnOnce(&mut pgline_controlplane::config::Config)) -> Lab {
    let mut scope = Scope::new(TestDb::create(tag).await);
    let db = scope.db();
    let origin = db.client().await;
    origin.batch_execute(SCHEMA).await.unwrap();
    let bob = format!("bob_{}", db.name);
    origin
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {bob}; CREATE ROLE {bob} LOGIN PASSWORD 'bobpw'; \
             GRANT CONNECT ON DATABASE {} TO {bob}",
            db.name
        ))
        .await
        .unwrap();
    let mut cfg = lab::config(db, 1);
    edit(&mut cfg);
    let p = lab::start(cfg).await;
    let (_, _, user, password) = origin::origin_base();
    scope.roles.push(bob.clone());
    Lab {
        scope,
        p,
        user,
        password,
        bob,
    }
}

impl Lab {
    async fn pgline(&self, extra: &str) -> Client {
        via_pgline(
            &self.p,
            &self.scope.db().name,
            &self.user,
            &self.password,
            extra,
        )
        .await
    }

    async fn origin(&self, extra: &str) -> Client {
        at_origin(&self.scope.db().name, &self.user, &self.password, extra).await
    }

    /// Warms `sql` through a clean session through pgline; returns the clean answer.
    async fn warm(&self, sql: &str) -> Answer {
        let expected = answer(&self.origin("").await, sql).await;
        warm(&self.p, &self.pgline("").await, sql, &expected).await;
        expected
    }
}

/// F1: after `SET ROLE`, `SET SESSION AUTHORIZATION` or `set_config('role', ...)` (also from a
/// function) a superuser's session gets what the role gets: permission denied, every time,
/// from both the store and the result cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_role_never_gets_cached_rows() {
    let lab = lab("adv_role").await;
    let bob = lab.bob.clone();
    let lookup = "SELECT * FROM secrets WHERE id = 3";
    let agg = "SELECT count(*), max(v) FROM secrets";
    let clean = lab.warm(lookup).await;
    assert!(clean.is_ok());
    assert!(lab.warm(agg).await.is_ok());
    lab.origin("")
        .await
        .batch_execute(&format!(
            "CREATE FUNCTION become(r text) RETURNS text LANGUAGE sql \
             AS $$ SELECT set_config('ro'||'le', r, false) $$; \
             GRANT EXECUTE ON FUNCTION become(text) TO PUBLIC; -- {bob}"
        ))
        .await
        .unwrap();
    for switch in [
        format!("SET ROLE {bob}"),
        format!("SET SESSION AUTHORIZATION {bob}"),
        format!("SELECT set_config('role', '{bob}', false)"),
        format!("SELECT become('{bob}')"),
    ] {
        let origin = lab.origin("").await;
        let c = lab.pgline("").await;
        answer(&origin, &switch).await.expect("origin switches");
        answer(&c, &switch).await.expect("pgline switches");
        for sql in [lookup, agg, lookup, agg] {
            let want = answer(&origin, sql).await;
            assert_eq!(
                want,
                Err("42501".to_string()),
                "{switch}: {sql} at the origin"
            );
            assert_eq!(
                answer(&c, sql).await,
                want,
                "{switch}: {sql} through pgline"
            );
        }
        // Back to the login role: the cache may serve again, and answers are right.
        answer(&c, "RESET ROLE").await.unwrap();
        answer(&c, "RESET SESSION AUTHORIZATION").await.unwrap();
        assert_eq!(answer(&c, lookup).await, clean, "{switch}: after RESET");
    }
    // Logged in as the role itself (not a cache user): never from cache either.
    let c = via_pgline(&lab.p, &lab.scope.db().name, &bob, "bobpw", "").await;
    for sql in [lookup, agg] {
        assert_eq!(
            answer(&c, sql).await,
            Err("42501".to_string()),
            "{sql} as {bob}"
        );
    }
}

/// F2: a search path the session did not SET is seen: a role default set after pgline
/// started, `set_config` under another spelling, startup options.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_path_from_any_source_is_followed() {
    let lab = lab("adv_path").await;
    let public = lab.warm(LOOKUP).await;
    let public_count = lab.warm(COUNT).await;
    let shadowed = answer(
        &lab.origin("options='-c search_path=shadow,public'").await,
        LOOKUP,
    )
    .await;
    assert_ne!(public, shadowed);

    // Startup options.
    let c = lab.pgline("options='-c search_path=shadow,public'").await;
    assert_eq!(answer(&c, LOOKUP).await, shadowed, "startup options");

    // set_config with a computed name, in a plain pooled session.
    let c = lab.pgline("").await;
    answer(
        &c,
        "SELECT set_config('search'||'_path', 'shadow,public', false)",
    )
    .await
    .unwrap();
    for _ in 0..3 {
        assert_eq!(
            answer(&c, LOOKUP).await,
            shadowed,
            "set_config spelled apart"
        );
        let origin_count = answer(
            &lab.origin("options='-c search_path=shadow,public'").await,
            COUNT,
        )
        .await;
        assert_eq!(
            answer(&c, COUNT).await,
            origin_count,
            "aggregate under shadow"
        );
    }
    drop(c);

    // A role default set while pgline runs: new sessions log in with it.
    lab.origin("")
        .await
        .batch_execute(&format!(
            "ALTER ROLE {} IN DATABASE {} SET search_path = shadow, public",
            lab.user,
            lab.scope.db().name
        ))
        .await
        .unwrap();
    let origin = lab.origin("").await;
    assert_eq!(answer(&origin, LOOKUP).await, shadowed);
    for _ in 0..3 {
        let c = lab.pgline("").await;
        assert_eq!(answer(&c, LOOKUP).await, shadowed, "role default");
        assert_eq!(
            answer(&c, COUNT).await,
            answer(&origin, COUNT).await,
            "role default, aggregate"
        );
    }
    lab.origin("")
        .await
        .batch_execute(&format!(
            "ALTER ROLE {} IN DATABASE {} RESET search_path",
            lab.user,
            lab.scope.db().name
        ))
        .await
        .unwrap();
    let c = lab.pgline("").await;
    assert_eq!(answer(&c, LOOKUP).await, public);
    assert_eq!(answer(&c, COUNT).await, public_count);
}

/// F3: a function that changes the pooled backend's session (search path, float and bytea
/// output, a temporary table hiding a cached one) affects only its own session: the state
/// does not spread through the pool or the result cache to later sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_cannot_poison_the_pool_or_the_result_cache() {
    let lab = lab("adv_poison").await;
    let public = lab.warm(LOOKUP).await;
    let public_count = lab.warm(COUNT).await;
    lab.origin("")
        .await
        .batch_execute(
            "CREATE FUNCTION poison() RETURNS text LANGUAGE sql AS \
             $$ SELECT set_config('search'||'_path', 'shadow,public', false) $$; \
             CREATE FUNCTION floats() RETURNS text LANGUAGE sql AS \
             $$ SELECT set_config('extra_float'||'_digits', '-3', false) $$; \
             CREATE FUNCTION bytes() RETURNS text LANGUAGE sql AS \
             $$ SELECT set_config('bytea'||'_output', 'escape', false) $$; \
             CREATE FUNCTION hide() RETURNS int LANGUAGE plpgsql AS \
             $$ BEGIN EXECUTE 'CREATE TEMP' || 'ORARY TABLE public_info AS \
                SELECT 1 AS id, ''hidden'' AS v'; RETURN 1; END $$;",
        )
        .await
        .unwrap();
    for (call, setting) in [
        ("SELECT poison()", "search_path=shadow,public"),
        ("SELECT floats()", "extra_float_digits=-3"),
        ("SELECT bytes()", "bytea_output=escape"),
        ("SELECT hide()", ""),
    ] {
        let origin = lab.origin("").await;
        answer(&origin, call).await.unwrap();
        let c = lab.pgline("").await;
        answer(&c, call).await.unwrap();
        for sql in [LOOKUP, COUNT, LOOKUP, COUNT] {
            assert_eq!(
                answer(&c, sql).await,
                answer(&origin, sql).await,
                "{call}: {sql} in the poisoned session ({setting})"
            );
        }
        // Meanwhile and afterwards, other sessions get the clean answers.
        for _ in 0..6 {
            let other = lab.pgline("").await;
            assert_eq!(
                answer(&other, LOOKUP).await,
                public,
                "{call}: another session"
            );
            assert_eq!(
                answer(&other, COUNT).await,
                public_count,
                "{call}: another count"
            );
        }
        drop(c);
        tokio::time::sleep(Duration::from_millis(50)).await;
        for _ in 0..6 {
            let other = lab.pgline("").await;
            assert_eq!(
                answer(&other, LOOKUP).await,
                public,
                "{call}: after it left"
            );
            assert_eq!(
                answer(&other, COUNT).await,
                public_count,
                "{call}: after it left"
            );
        }
    }
}

/// F1, row-level security: a cache user that RLS applies to never gets the rows pgline's own
/// role filled (the store's and the result cache's), neither on a table that had RLS from the
/// start nor on one whose RLS was enabled while pgline ran (once the catalog check saw it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_level_security_is_never_served_from_cache() {
    let mut scope = Scope::new(TestDb::create("adv_rls").await);
    let alice = format!("alice_{}", scope.db().name);
    scope.roles.push(alice.clone());
    let db = scope.db();
    let origin = db.client().await;
    origin
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {alice}; CREATE ROLE {alice} LOGIN PASSWORD 'alicepw';
             CREATE TABLE docs (id int PRIMARY KEY, owner text NOT NULL, body text);
             INSERT INTO docs VALUES (1, 'nobody', 'hidden'), (2, '{alice}', 'mine');
             ALTER TABLE docs ENABLE ROW LEVEL SECURITY;
             CREATE POLICY own ON docs USING (owner = current_user);
             CREATE TABLE notes (id int PRIMARY KEY, owner text NOT NULL, body text);
             INSERT INTO notes VALUES (1, 'nobody', 'hidden later'), (2, '{alice}', 'mine');
             GRANT SELECT ON docs, notes TO {alice};"
        ))
        .await
        .unwrap();
    let mut cfg = lab::config(db, 1);
    cfg.pgwire.cache_users = vec![alice.clone()];
    cfg.catalog.check_interval_ms = 100;
    let p = lab::start(cfg).await;
    let (_, _, user, password) = origin::origin_base();
    let su = via_pgline(&p, &db.name, &user, &password, "").await;
    let as_alice = via_pgline(&p, &db.name, &alice, "alicepw", "").await;
    let alice_origin = at_origin(&db.name, &alice, "alicepw", "").await;

    // `notes` has no RLS yet: warm to a hit for the superuser, and alice gets it too.
    let note = "SELECT * FROM notes WHERE id = 1";
    let expected = answer(&origin, note).await;
    warm(&p, &su, note, &expected).await;
    assert_eq!(answer(&as_alice, note).await, expected);

    let sqls = [
        "SELECT * FROM docs WHERE id = 1",
        "SELECT * FROM docs WHERE id = 2",
        "SELECT count(*), max(body) FROM docs",
    ];
    for _ in 0..5 {
        for sql in sqls {
            answer(&su, sql).await.unwrap();
        }
    }
    // The store holds both rows (RESP reads as pgline's role, which RLS does not filter).
    let mut r = lab::redis(&p).await;
    let until = Instant::now() + Duration::from_secs(20);
    for key in ["docs:1", "docs:2"] {
        while redis::cmd("GET")
            .arg(key)
            .query_async::<Option<String>>(&mut r)
            .await
            .unwrap()
            .is_none()
        {
            assert!(Instant::now() < until, "{key} never filled");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for sql in sqls {
        for _ in 0..3 {
            assert_eq!(
                answer(&as_alice, sql).await,
                answer(&alice_origin, sql).await,
                "{sql} as {alice}"
            );
        }
    }

    // RLS enabled while pgline runs: once the catalog check has seen it (the window is
    // `catalog.check_interval_ms`), alice gets the origin's answer.
    origin
        .batch_execute(
            "ALTER TABLE notes ENABLE ROW LEVEL SECURITY;
             CREATE POLICY own ON notes USING (owner = current_user);",
        )
        .await
        .unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while !p
        .shared
        .keyspace()
        .snapshot()
        .pg_table_named(None, "notes")
        .is_some_and(|t| t.row_security)
    {
        assert!(
            Instant::now() < until,
            "the catalog check never saw RLS on notes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for sql in [note, "SELECT count(*), max(body) FROM notes"] {
        for _ in 0..3 {
            assert_eq!(
                answer(&as_alice, sql).await,
                answer(&alice_origin, sql).await,
                "{sql} as {alice} after ENABLE ROW LEVEL SECURITY"
            );
        }
    }
}

/// A client cannot forge pgline's fence statement. Statements prepared by SQL `PREPARE` share
/// their name space with the protocol's, so a session can `DEALLOCATE pgl_fence` and `PREPARE`
/// its own under that name; through a function's `EXECUTE`, no rule on the statement's text
/// sees it. Before, the relay then ran the client's statement as its fence and trusted its
/// row: a session that hid `public_info` behind a temporary table and had the forged fence
/// report the clean state got its count of the temporary table stored in the shared result
/// cache, and every other session read it. Now a backend that ran anything the core did not
/// vouch for parses pgline's statements again (Close, then Parse) before their answers count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_fence_statement_is_never_trusted() {
    forge_then_count("adv_forge", "SELECT forge()", false).await;
}

/// [`a_forged_fence_statement_is_never_trusted`] for a session that named
/// `synchronous_commit`, whose fence is pgline's second statement, `pgl_fence_async`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_asynchronous_fence_statement_is_never_trusted() {
    forge_then_count("adv_forge_async", "SELECT forge()", true).await;
}

/// A fence statement a client replaced never returns its backend to the pool as clean. The
/// attacker's `forge()` hides `public_info` behind a temporary table and puts a statement
/// reporting the clean state under both fence names; its next point lookup is then fenced by
/// that statement, on its own backend. With one pool connection, the next session runs on the attacker's backend once it is back in the pool: it
/// must read the table, not the temporary one. No answer is stored on the way (a point lookup,
/// not a stored statement), so the snapshot read pipelined before a stored statement, which
/// catches the forgery in [`a_forged_fence_statement_is_never_trusted`] before the fence does,
/// plays no part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_fence_never_returns_its_backend_to_the_pool() {
    forge_then_reuse("adv_forge_pool", false).await;
}

/// [`a_forged_fence_never_returns_its_backend_to_the_pool`] for a session that named
/// `synchronous_commit`, whose fence is `pgl_fence_async`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_asynchronous_fence_never_returns_its_backend_to_the_pool() {
    forge_then_reuse("adv_forge_pool_async", true).await;
}

async fn forge_then_reuse(tag: &str, async_commits: bool) {
    let lab = lab_with(tag, |cfg| cfg.pgwire.pool_size = 1).await;
    let volatile = "SELECT count(*) AS n, max(v) AS m FROM public_info WHERE random() >= 0";
    let clean = answer(&lab.origin("").await, volatile).await;
    make_forge(&lab).await;
    let attacker = lab.pgline("").await;
    if async_commits {
        answer(&attacker, "SHOW synchronous_commit").await.unwrap();
    }
    let public = answer(&lab.origin("").await, LOOKUP).await;
    warm(&lab.p, &attacker, LOOKUP, &public).await;
    answer(&attacker, "SELECT forge()").await.unwrap();
    let forged = Ok(vec![vec![
        Some("1".into()),
        Some("zzz forged".into()),
        Some("0".into()),
        None,
    ]]);
    assert_eq!(
        answer(&attacker, LOOKUP).await,
        forged,
        "the attacker's own row"
    );
    drop(attacker);
    for session in 0..3 {
        let victim = lab.pgline("").await;
        assert_eq!(answer(&victim, volatile).await, clean, "session {session}");
        drop(victim);
    }
}

/// Makes `forge()` (hides `public_info` behind a temporary table, replaces both fence
/// statements, `pgl_fence` and `pgl_fence_async`, with a statement reporting the clean state)
/// and the domain `forge_dom` whose check calls it; runs `trigger` on a session through pgline
/// (one that first named `synchronous_commit` when `async_commits`, so that its fence is
/// `pgl_fence_async`), then a cacheable count on it, and asserts that no other session ever
/// reads that count. (Tried as well: the forgery run while the origin only
/// parses `SELECT '{1}'::forge_dom[]`, in a batch that runs nothing. That test passed without
/// the per-run fence of stored answers too, so it proved nothing and is not kept.)
async fn forge_then_count(tag: &str, trigger: &str, async_commits: bool) {
    let lab = lab(tag).await;
    let clean_count = answer(&lab.origin("").await, COUNT).await;
    let attacker = lab.pgline("").await;
    if async_commits {
        answer(&attacker, "SHOW synchronous_commit").await.unwrap();
    }
    // A cached lookup first: the relay has run its fence statement on the session's backend.
    let public = answer(&lab.origin("").await, LOOKUP).await;
    warm(&lab.p, &attacker, LOOKUP, &public).await;
    make_forge(&lab).await;
    answer(&attacker, trigger).await.unwrap();
    let forged_count = Ok(vec![vec![Some("4".into()), Some("zzz forged".into())]]);
    for _ in 0..3 {
        assert_eq!(
            answer(&attacker, COUNT).await,
            forged_count,
            "the attacker's own count (its temporary table)"
        );
    }
    // The attacker's answer never reaches another session, now or once the writer ran.
    for _ in 0..10 {
        let other = lab.pgline("").await;
        assert_eq!(answer(&other, COUNT).await, clean_count, "another session");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(attacker);
}

/// Makes `forge()` and the domain `forge_dom` (see [`forge_then_count`]), with the clean state
/// read through pgline by a session of its own (pgline's fence text names
/// `synchronous_commit`, which marks the session that sends it).
async fn make_forge(lab: &Lab) {
    // The clean state, as the fence query reads it before the temporary table exists, read
    // by another session (the query names `synchronous_commit`: the attacker's own fence
    // statement stays the one `async_commits` chose).
    let reader = lab.pgline("").await;
    let Ok(rows) = answer(&reader, pgline_controlplane::pgfront::FENCE_SQL).await else {
        panic!("the fence query runs as a client's query");
    };
    let forged: Vec<String> = std::iter::once("'0/0'::text".to_string())
        .chain(rows[0][1..].iter().map(|v| match v {
            Some(v) => format!("'{}'::text", v.replace('\'', "''")),
            None => "NULL::text".to_string(),
        }))
        .collect();
    lab.origin("")
        .await
        .batch_execute(&format!(
            "CREATE FUNCTION forge() RETURNS bool LANGUAGE plpgsql AS $f$
             BEGIN
               EXECUTE 'CREATE TEMP TABLE IF NOT EXISTS public_info (id int PRIMARY KEY, \
                        v text NOT NULL, f float8, b bytea)';
               EXECUTE 'INSERT INTO public_info SELECT g, ''zzz forged'', 0, NULL \
                        FROM generate_series(1, 4) g ON CONFLICT DO NOTHING';
               BEGIN EXECUTE 'DEALLOCATE pgl_fence'; EXCEPTION WHEN OTHERS THEN NULL; END;
               EXECUTE $p$PREPARE pgl_fence AS SELECT {0}$p$;
               BEGIN EXECUTE 'DEALLOCATE pgl_fence_async'; EXCEPTION WHEN OTHERS THEN NULL; END;
               EXECUTE $p$PREPARE pgl_fence_async AS SELECT {0}$p$;
               RETURN true;
             END $f$;
             CREATE DOMAIN forge_dom AS int CHECK (forge());",
            forged.join(", ")
        ))
        .await
        .unwrap();
    drop(reader);
}

/// The clean answer to [`COUNT`], and a session through pgline logged in (and fenced) before any
/// redirecting schema exists, whose cache gate is open.
async fn gate_open_session(lab: &Lab) -> (Answer, Client) {
    let clean_count = answer(&lab.origin("").await, COUNT).await;
    let session = lab.pgline("").await;
    let public = answer(&lab.origin("").await, LOOKUP).await;
    warm(&lab.p, &session, LOOKUP, &public).await;
    (clean_count, session)
}

/// SQL that redirects `public_info` for sessions of `user`: `public.move_away()`, which renames
/// the schema named after the user away, and that schema with a view `public_info` whose rows
/// call it (and read `zzz redirected`).
fn redirect_sql(user: &str) -> (String, String) {
    let ident = quote_ident(user);
    let lit = format!("'{}'", user.replace('\'', "''"));
    let gone = format!("'{}_gone'", user.replace('\'', "''"));
    let function = format!(
        "CREATE FUNCTION public.move_away() RETURNS bool LANGUAGE plpgsql AS $f$
         BEGIN
           IF EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = {lit}) THEN
             EXECUTE pg_catalog.format('ALTER SCHEMA %I RENAME TO %I', {lit}, {gone});
           END IF;
           RETURN true;
         END $f$;"
    );
    let schema = format!(
        "CREATE SCHEMA {ident};
         CREATE VIEW {ident}.public_info AS
           SELECT id, 'zzz redirected'::text AS v, f, b FROM public.public_info
           WHERE public.move_away();"
    );
    (function, schema)
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// [`COUNT`] read from the redirecting view.
fn redirected_count() -> Answer {
    Ok(vec![vec![Some("2".into()), Some("zzz redirected".into())]])
}

/// A schema made under the session user's name (`"$user"`, first on the default path) by
/// another connection redirects an unqualified name in a cacheable read to a view of its own,
/// whose function moves the schema away while the statement runs, so the state read after the
/// statement shows the clean path again. Before, that answer was stored for every session of
/// the user; now the state is read before the statement too (with its snapshot), and an answer
/// is stored only if both reads serve the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_redirected_while_the_statement_ran_is_not_stored() {
    let lab = lab("adv_user_schema").await;
    let (clean_count, victim) = gate_open_session(&lab).await;
    let (function, schema) = redirect_sql(&lab.user);
    lab.origin("")
        .await
        .batch_execute(&format!("{function} {schema}"))
        .await
        .unwrap();
    assert_eq!(
        answer(&victim, COUNT).await,
        redirected_count(),
        "the session's count read the view (PostgreSQL's answer while the schema stood)"
    );
    assert_eq!(
        answer(&lab.origin("").await, COUNT).await,
        clean_count,
        "the schema moved away"
    );
    // The redirected answer never reaches another session, now or once the writer ran.
    for _ in 0..10 {
        let other = lab.pgline("").await;
        assert_eq!(answer(&other, COUNT).await, clean_count, "another session");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A schema another connection makes under the session user's name after the session logged in
/// changes how that session resolves names (`"$user"` comes first on the default path), though
/// the session runs nothing. Before, a session whose cache gate was open kept being served the
/// cached table's row, where PostgreSQL answers from the new schema's table. Now the catalog
/// check sees the origin's schema names change and publishes a new key space generation, which
/// closes every session's gate: the next cacheable read asks the origin, and the state read with
/// it shows the new path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_made_under_the_users_name_after_login_is_followed() {
    let lab = lab("adv_new_schema").await;
    let (_, session) = gate_open_session(&lab).await;
    let public = answer(&lab.origin("").await, LOOKUP).await;
    let ident = quote_ident(&lab.user);
    lab.origin("")
        .await
        .batch_execute(&format!(
            "CREATE SCHEMA {ident};
             CREATE TABLE {ident}.public_info (id int PRIMARY KEY, v text NOT NULL, f float8,
                                               b bytea);
             INSERT INTO {ident}.public_info VALUES (1, 'zzz in the user''s schema', 0, NULL);"
        ))
        .await
        .unwrap();
    let now = answer(&lab.origin("").await, LOOKUP).await;
    assert_ne!(
        now, public,
        "the new schema comes first on the origin's path"
    );
    // Within a catalog check interval (1 s here) of the DDL, as for DROP and RENAME.
    let until = Instant::now() + Duration::from_secs(10);
    while answer(&session, LOOKUP).await != now {
        assert!(
            Instant::now() < until,
            "still served the cached table's row 10 s after the schema was made"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..5 {
        assert_eq!(answer(&session, LOOKUP).await, now, "after the check");
    }
}

/// The digest the writer compares (`catalog::NAMES_SQL`) moves with every change that can move
/// a cache user's name resolution: a schema renamed, `USAGE` on a schema granted, or gained
/// through a role membership (a schema without it is left out of the resolved path). What
/// cannot move it, does not: a `GRANT` that grants nothing new, a role made for another user, a
/// session's temporary schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_names_digest_moves_with_what_can_move_name_resolution() {
    let mut lab = lab("adv_names").await;
    let group = format!("{}_group", lab.bob);
    let other = format!("{}_other", lab.bob);
    lab.scope.roles.extend([group.clone(), other.clone()]);
    let origin = lab.origin("").await;
    let bob = &lab.bob;
    // bob reads the cache here (`pgwire.cache_users`): not a superuser, so grants count.
    let users = vec![lab.user.clone(), bob.clone()];
    let digest = || async {
        pgline_controlplane::catalog::load_names(&lab.origin("").await, &users)
            .await
            .unwrap()
    };
    origin
        .batch_execute(&format!(
            "CREATE SCHEMA adv_names_x; DROP ROLE IF EXISTS {group}; CREATE ROLE {group}; \
             GRANT USAGE ON SCHEMA adv_names_x TO {group}"
        ))
        .await
        .unwrap();
    let d0 = digest().await;
    origin
        .batch_execute("ALTER SCHEMA adv_names_x RENAME TO adv_names_y")
        .await
        .unwrap();
    let renamed = digest().await;
    assert_ne!(d0, renamed, "a rename");
    origin
        .batch_execute("ALTER SCHEMA adv_names_y RENAME TO adv_names_x")
        .await
        .unwrap();
    let d1 = digest().await;
    assert_eq!(d0, d1, "renamed back");
    origin
        .batch_execute(&format!("GRANT USAGE ON SCHEMA adv_names_x TO {group}"))
        .await
        .unwrap();
    assert_eq!(digest().await, d1, "a GRANT that grants nothing new");
    origin
        .batch_execute(&format!("GRANT CREATE ON SCHEMA adv_names_x TO {group}"))
        .await
        .unwrap();
    assert_ne!(digest().await, d1, "a GRANT that does");
    origin
        .batch_execute(&format!("REVOKE CREATE ON SCHEMA adv_names_x FROM {group}"))
        .await
        .unwrap();
    assert_eq!(digest().await, d1, "revoked again");
    origin
        .batch_execute(&format!("GRANT {group} TO {bob}"))
        .await
        .unwrap();
    let d2 = digest().await;
    assert_ne!(d1, d2, "USAGE gained through a membership");
    origin
        .batch_execute(&format!("DROP ROLE IF EXISTS {other}; CREATE ROLE {other}"))
        .await
        .unwrap();
    assert_eq!(digest().await, d2, "a role nobody reads the cache as");
    // A session's temporary schema (new or reused) is its own.
    let temp = lab.origin("").await;
    temp.batch_execute("CREATE TEMP TABLE adv_names_t (id int)")
        .await
        .unwrap();
    assert_eq!(digest().await, d2, "a temporary table");
}

/// The window 31184ce leaves (DDL landing between the state read in front of a stored
/// statement and the statement) can be held open: another connection locks the cached table,
/// so the statement waits after its snapshot query read a clean state, then makes the
/// redirecting schema and commits; the statement, once it has the lock, looks its name up again
/// and reads the view, whose function moves the schema away. Its answer is stored. Since the
/// origin's schema names then change, the catalog check drops every stored answer: other
/// sessions read the view's answer for at most about one check interval (1 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_stored_under_a_redirected_name_goes_at_the_next_names_check() {
    let lab = lab("adv_lock_redirect").await;
    let (clean_count, victim) = gate_open_session(&lab).await;
    let (function, schema) = redirect_sql(&lab.user);
    let attacker = lab.origin("").await;
    attacker
        .batch_execute(&format!(
            "{function} BEGIN; LOCK TABLE public.public_info IN ACCESS EXCLUSIVE MODE;"
        ))
        .await
        .unwrap();
    let counting = tokio::spawn(async move { answer(&victim, COUNT).await });
    // The victim's statement waits for the lock (its snapshot query has run).
    let watcher = lab.origin("").await;
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND query LIKE 'SELECT count(*) AS n%'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0);
        if waiting > 0 {
            break;
        }
        assert!(
            Instant::now() < until,
            "the count never waited for the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    attacker
        .batch_execute(&format!("{schema} COMMIT;"))
        .await
        .unwrap();
    assert_eq!(
        counting.await.unwrap(),
        redirected_count(),
        "the count read the view, made while it waited"
    );
    assert_eq!(answer(&lab.origin("").await, COUNT).await, clean_count);
    // The answer may be stored after the victim has it (the writer installs it), and goes at the
    // first names check that reads the new names: past two check intervals, it is gone for good.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for _ in 0..10 {
        let other = lab.pgline("").await;
        assert_eq!(answer(&other, COUNT).await, clean_count, "another session");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
