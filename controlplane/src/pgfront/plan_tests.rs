use super::*;
use crate::pgfront::state::OwnSql;

fn msgs(f: impl FnOnce(&mut BytesMut)) -> Vec<u8> {
    let mut b = BytesMut::new();
    f(&mut b);
    b.to_vec()
}

fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut b = BytesMut::new();
    put_frame(&mut b, tag, body);
    b.to_vec()
}

/// A DataRow's body: the columns as texts.
fn data_row(cols: &[&str]) -> Vec<u8> {
    let mut row = (cols.len() as i16).to_be_bytes().to_vec();
    for c in cols {
        row.extend_from_slice(&(c.len() as i32).to_be_bytes());
        row.extend_from_slice(c.as_bytes());
    }
    row
}

fn tags(out: &[u8]) -> Vec<u8> {
    parse_frames(out).unwrap().iter().map(|f| f.tag).collect()
}

#[test]
fn named_parse_is_rewritten_then_deduplicated() {
    let mut stmts = HashMap::new();
    let mut prepared = HashSet::new();
    let m = msgs(|b| {
        frontend::parse("s1", "SELECT $1::int", [23u32], b).unwrap();
        frontend::sync(b);
    });
    let plan = plan_batch(&m, &mut stmts, &Unnamed::default(), &mut prepared).unwrap();
    let bname = backend_name("SELECT $1::int", &[23]);
    assert!(prepared.contains(&bname));
    let frames = parse_frames(&plan.out).unwrap();
    assert_eq!(cstr(frames[0].body).unwrap().0, bname);
    // Same statement again under another client name: the Parse is dropped, answered locally.
    let m2 = msgs(|b| {
        frontend::parse("s2", "SELECT $1::int", [23u32], b).unwrap();
        frontend::sync(b);
    });
    let plan = plan_batch(&m2, &mut stmts, &Unnamed::default(), &mut prepared).unwrap();
    assert_eq!(tags(&plan.out), b"S");
    assert_eq!(plan.acts, vec![Act::Local(PARSE_COMPLETE), Act::Sync]);
    let mut t = Tracker::new(plan.acts);
    let mut out = Vec::new();
    let step = t.on_message(&frame(b'Z', b"I"), &mut out, &mut prepared);
    assert_eq!(step, Step::ClientDone(b'I'));
    assert_eq!(tags(&out), b"1Z");
}

#[test]
fn bind_on_fresh_backend_injects_hidden_parse_and_close_is_local() {
    let mut stmts = HashMap::new();
    let mut first = HashSet::new();
    let m = msgs(|b| {
        frontend::parse("s", "SELECT 1", [], b).unwrap();
        frontend::sync(b);
    });
    plan_batch(&m, &mut stmts, &Unnamed::default(), &mut first).unwrap();
    let mut fresh = HashSet::new();
    let m = msgs(|b| {
        b.extend_from_slice(&frame(b'B', b"\0s\0\0\0\0\0\0\0"));
        frontend::execute("", 0, b).unwrap();
        frontend::close(b'S', "s", b).unwrap();
        frontend::sync(b);
    });
    let plan = plan_batch(&m, &mut stmts, &Unnamed::default(), &mut fresh).unwrap();
    assert_eq!(tags(&plan.out), b"PBES");
    assert!(stmts.is_empty());
    let mut t = Tracker::new(plan.acts);
    let mut out = Vec::new();
    for (tag, body) in [
        (b'1', &b""[..]),
        (b'2', b""),
        (b'D', b"\0\x01\0\0\0\x011"),
        (b'C', b"SELECT 1\0"),
    ] {
        assert_eq!(
            t.on_message(&frame(tag, body), &mut out, &mut fresh),
            Step::Continue
        );
    }
    assert_eq!(
        t.on_message(&frame(b'Z', b"I"), &mut out, &mut fresh),
        Step::ClientDone(b'I')
    );
    assert_eq!(tags(&out), b"2DC3Z");
}

#[test]
fn error_skips_to_sync_and_forgets_failed_parse() {
    let mut stmts = HashMap::new();
    let mut prepared = HashSet::new();
    let m = msgs(|b| {
        frontend::parse("bad", "SELEC 1", [], b).unwrap();
        frontend::parse("other", "SELECT 2", [], b).unwrap();
        frontend::sync(b);
    });
    let mut plan = plan_batch(&m, &mut stmts, &Unnamed::default(), &mut prepared).unwrap();
    add_fence(&mut plan, &mut prepared, &OwnSql::default(), false);
    // The fence is pgline's prepared statement: parsed once, then bound and executed.
    assert!(plan.out.windows(9).any(|w| w == b"pgl_fence"));
    let mut again = Plan::default();
    let mut fenced = prepared.clone();
    add_fence(&mut again, &mut fenced, &OwnSql::default(), false);
    assert_eq!(tags(&again.out), b"BES");
    // A session that may have committed asynchronously has its own fence statement, parsed
    // once on the backend beside the other.
    let mut other = Plan::default();
    add_fence(&mut other, &mut fenced, &OwnSql::default(), true);
    assert!(tags(&other.out).ends_with(b"PBES"));
    assert!(other.out.windows(15).any(|w| w == b"pgl_fence_async"));
    assert!(fenced.contains("pgl_fence") && fenced.contains("pgl_fence_async"));
    let mut t = Tracker::new(plan.acts);
    assert!(t.has_hidden_tail());
    let mut out = Vec::new();
    t.on_message(&frame(b'E', b"C42601\0\0"), &mut out, &mut prepared);
    assert_eq!(
        t.on_message(&frame(b'Z', b"I"), &mut out, &mut prepared),
        Step::ClientDone(b'I')
    );
    assert_eq!(
        prepared,
        HashSet::from(["pgl_fence".to_owned()]),
        "the failed Parse is forgotten"
    );
    assert_eq!(tags(&out), b"EZ");
    // The fence's reply is hidden; its LSN is kept.
    let mut out = Vec::new();
    t.on_message(&frame(b'3', b""), &mut out, &mut prepared);
    t.on_message(&frame(b'1', b""), &mut out, &mut prepared);
    t.on_message(&frame(b'2', b""), &mut out, &mut prepared);
    t.on_message(
        &frame(b'D', b"\0\x01\0\0\0\x0916/B374D8"),
        &mut out,
        &mut prepared,
    );
    t.on_message(&frame(b'C', b"SELECT 1\0"), &mut out, &mut prepared);
    assert_eq!(
        t.on_message(&frame(b'Z', b"I"), &mut out, &mut prepared),
        Step::HiddenDone
    );
    assert!(out.is_empty());
    assert_eq!(t.fence, Some(0x16_00B3_74D8));
}

#[test]
fn unterminated_and_malformed_batches_are_refused() {
    let mut s = HashMap::new();
    let mut p = HashSet::new();
    let m = msgs(|b| frontend::execute("", 0, b).unwrap());
    assert_eq!(
        plan_batch(&m, &mut s, &Unnamed::default(), &mut p).unwrap_err(),
        PlanError::Unterminated
    );
    assert_eq!(
        plan_batch(b"S\0\0\0\x09", &mut s, &Unnamed::default(), &mut p).unwrap_err(),
        PlanError::Malformed
    );
}

#[test]
fn session_state_detection() {
    for sql in [
        "SET search_path = x",
        "set statement_timeout to 5",
        "LISTEN ch",
        "PREPARE p AS SELECT 1",
        "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
        "CREATE TEMP TABLE t (a int)",
        "select 1; create temporary table t (a int)",
        "SELECT pg_advisory_lock(1)",
        "SELECT set_config('a.b', 'c', false)",
        "/* app */ SET search_path = x",
        "-- why\nSET TimeZone = 'UTC'",
        "SELECT * INTO TEMP t FROM users",
        "CREATE OR REPLACE TEMP VIEW v AS SELECT 1",
        "CREATE TABLE pg_temp.x (a int)",
        "SELECT set_config ('a.b', 'c', false)",
        "(SET x = 1)",
        "declare c cursor\nwith\thold for select 1",
    ] {
        assert!(leaves_session_state(sql), "{sql}");
    }
    for sql in [
        "SET LOCAL search_path = x",
        "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        "SELECT pg_advisory_xact_lock(1)",
        "DECLARE c CURSOR FOR SELECT 1",
        "RESET ALL",
        "SELECT * FROM settings",
        "SELECT temperature FROM t -- set x = 1",
        "SELECT 1 /* SET search_path = x */",
    ] {
        assert!(!leaves_session_state(sql), "{sql}");
    }
    assert!(clears_prepared("DISCARD ALL"));
    assert!(clears_prepared("deallocate all"));
    assert!(!clears_prepared("DEALLOCATE foo"));
}

#[test]
fn reused_open_name_fails_locally_and_skips_to_sync() {
    let mut stmts = HashMap::new();
    let mut prepared = HashSet::new();
    let m = msgs(|b| {
        frontend::parse("s", "SELECT 1", [], b).unwrap();
        frontend::sync(b);
    });
    plan_batch(&m, &mut stmts, &Unnamed::default(), &mut prepared).unwrap();
    let m = msgs(|b| {
        frontend::parse("s", "SELECT 2", [], b).unwrap();
        b.extend_from_slice(&frame(b'B', b"\0s\0\0\0\0\0\0\0"));
        frontend::execute("", 0, b).unwrap();
        frontend::close(b'S', "s", b).unwrap();
        frontend::sync(b);
    });
    let plan = plan_batch(&m, &mut stmts, &Unnamed::default(), &mut prepared).unwrap();
    assert_eq!(tags(&plan.out), b"S", "the backend sees only the Sync");
    assert_eq!(stmts["s"].text, "SELECT 1", "the skipped Close did not run");
    let mut t = Tracker::new(plan.acts);
    let mut out = Vec::new();
    assert_eq!(
        t.on_message(&frame(b'Z', b"I"), &mut out, &mut prepared),
        Step::ClientDone(b'I')
    );
    assert_eq!(tags(&out), b"EZ");
    assert!(t.failed);
}

#[test]
fn snapshot_query_and_added_describe_are_hidden_and_kept() {
    let mut stmts = HashMap::new();
    let mut prepared = HashSet::new();
    let m = msgs(|b| {
        frontend::parse("", "SELECT 1", [], b).unwrap();
        b.extend_from_slice(&frame(b'B', b"\0\0\0\0\0\0\0\0"));
        frontend::describe(b'P', "", b).unwrap();
        frontend::execute("", 0, b).unwrap();
        frontend::sync(b);
    });
    let mut plan = plan_batch(&m, &mut stmts, &Unnamed::default(), &mut prepared).unwrap();
    hide_added_describe(&mut plan);
    add_snapshot(&mut plan);
    assert_eq!(tags(&plan.out), b"QPBDES");
    let mut t = Tracker::new(plan.acts);
    let mut out = Vec::new();
    let row = data_row(&["10:12:11"]);
    let replies = [
        frame(b'T', b"\0\x01x\0"),
        frame(b'D', &row),
        frame(b'C', b"SELECT 1\0"),
        frame(b'Z', b"I"),
        frame(b'1', b""),
        frame(b'2', b""),
        frame(b'T', b"\0\x01y\0"),
        frame(b'D', b"\0\x01\0\0\0\x011"),
        frame(b'C', b"SELECT 1\0"),
    ];
    for r in &replies {
        assert_eq!(t.on_message(r, &mut out, &mut prepared), Step::Continue);
    }
    let z = frame(b'Z', b"I");
    assert_eq!(
        t.on_message(&z, &mut out, &mut prepared),
        Step::ClientDone(b'I')
    );
    assert_eq!(
        tags(&out),
        b"12DCZ",
        "the snapshot and the added Describe are hidden"
    );
    assert_eq!(t.snapshot.as_deref(), Some("10:12:11"));
    assert_eq!(t.described.as_deref(), Some(&replies[6][..]));
}

/// Issue 11 "Minor": an error about a Bind of a named statement names the client's statement,
/// not pgline's backend name.
#[test]
fn a_bind_error_names_the_clients_statement() {
    let mut stmts = HashMap::new();
    let mut prepared = HashSet::new();
    let m = msgs(|b| {
        frontend::parse("mine", "SELECT $1::int + $2::int", [], b).unwrap();
        b.extend_from_slice(&frame(b'B', b"\0mine\0\0\0\0\x01\0\0\0\x011\0\0"));
        frontend::execute("", 0, b).unwrap();
        frontend::sync(b);
    });
    let plan = plan_batch(&m, &mut stmts, &Unnamed::default(), &mut prepared).unwrap();
    let ours = backend_name("SELECT $1::int + $2::int", &[]);
    let mut t = Tracker::new(plan.acts);
    let mut out = Vec::new();
    let origin = |name: &str| {
        let text = format!(
            "SERROR\0VERROR\0C08P01\0Mbind message supplies 1 parameters, but prepared \
             statement \"{name}\" requires 2\0Fpostgres.c\0L1717\0Rexec_bind_message\0\0"
        );
        frame(b'E', text.as_bytes())
    };
    t.on_message(&frame(b'1', b""), &mut out, &mut prepared);
    t.on_message(&origin(&ours), &mut out, &mut prepared);
    let step = t.on_message(&frame(b'Z', b"I"), &mut out, &mut prepared);
    assert_eq!(step, Step::ClientDone(b'I'));
    let want = [frame(b'1', b""), origin("mine"), frame(b'Z', b"I")].concat();
    assert_eq!(out, want);
    // Not an ErrorResponse that parses: passed as it is.
    assert_eq!(
        rename_statement(b"E\0\0\0\x06M", &ours, "x"),
        b"E\0\0\0\x06M"
    );
}

#[test]
fn transaction_starts_and_what_is_not_one() {
    for sql in [
        "BEGIN",
        "begin;",
        "  Begin Work ; ",
        "BEGIN TRANSACTION ISOLATION LEVEL SERIALIZABLE, READ ONLY, DEFERRABLE",
        "START TRANSACTION",
        "start transaction read write;",
    ] {
        assert!(is_transaction_start(sql), "{sql}");
    }
    for sql in [
        "",
        ";",
        "BEGINX",
        "START",
        "STARTED TRANSACTION",
        "COMMIT",
        "BEGIN; SELECT 1",
        "BEGIN; DO $$ BEGIN PERFORM 1; END $$",
        "BEGIN /* x */",
        "BEGIN -- x",
        "BEGIN ISOLATION LEVEL \"serializable\"",
        "SELECT 1; BEGIN",
        "begin\u{a0}work",
        &format!("BEGIN{}", " ".repeat(200)),
    ] {
        assert!(!is_transaction_start(sql), "{sql:?}");
    }
}

/// A Bind of the unnamed portal to `stmt`, without parameters.
fn bind(b: &mut BytesMut, stmt: &str) {
    let mut body = format!("\0{stmt}\0").into_bytes();
    body.extend_from_slice(&[0; 6]);
    b.extend_from_slice(&frame(b'B', &body));
}

#[test]
fn a_batch_that_only_starts_a_transaction() {
    let mut stmts = HashMap::new();
    let ext = |parse: Option<(&str, &str)>, bind_stmt: &str| {
        msgs(|b| {
            if let Some((name, sql)) = parse {
                frontend::parse(name, sql, [], b).unwrap();
            }
            bind(b, bind_stmt);
            frontend::describe(b'P', "", b).unwrap();
            frontend::execute("", 0, b).unwrap();
            frontend::sync(b);
        })
    };
    let query = |sql: &str| msgs(|b| frontend::query(sql, b).unwrap());
    assert!(only_starts_transaction(&query("BEGIN;"), &stmts));
    assert!(!only_starts_transaction(&query("SELECT 1"), &stmts));
    assert!(only_starts_transaction(
        &ext(Some(("", "BEGIN")), ""),
        &stmts
    ));
    assert!(only_starts_transaction(
        &ext(Some(("b", "BEGIN")), "b"),
        &stmts
    ));
    assert!(!only_starts_transaction(
        &ext(Some(("", "SELECT 1")), ""),
        &stmts
    ));
    // A Bind of a statement not parsed here: only a named one the session prepared as one.
    assert!(!only_starts_transaction(&ext(None, ""), &stmts));
    assert!(!only_starts_transaction(&ext(None, "b"), &stmts));
    let m = msgs(|b| {
        frontend::parse("b", "BEGIN", [], b).unwrap();
        frontend::parse("s", "SELECT shift_path()", [], b).unwrap();
        frontend::sync(b);
    });
    plan_batch(&m, &mut stmts, &Unnamed::default(), &mut HashSet::new()).unwrap();
    assert!(only_starts_transaction(&ext(None, "b"), &stmts));
    assert!(!only_starts_transaction(&ext(None, "s"), &stmts));
    // Anything more than one Execute of the unnamed portal, or no Sync at the end.
    let two = msgs(|b| {
        frontend::parse("", "BEGIN", [], b).unwrap();
        for _ in 0..2 {
            bind(b, "");
            frontend::execute("", 0, b).unwrap();
        }
        frontend::sync(b);
    });
    assert!(!only_starts_transaction(&two, &stmts));
    let mut tail = ext(Some(("", "BEGIN")), "");
    tail.truncate(tail.len() - 5);
    assert!(!only_starts_transaction(&tail, &stmts));
    // A Parse that `plan_batch` refuses (two parameter types announced, none given).
    let m = msgs(|b| {
        let mut body = b"b2\0BEGIN\0".to_vec();
        body.extend_from_slice(&2u16.to_be_bytes());
        b.extend_from_slice(&frame(b'P', &body));
        bind(b, "b2");
        frontend::execute("", 0, b).unwrap();
        frontend::sync(b);
    });
    assert!(plan_batch(
        &m,
        &mut stmts.clone(),
        &Unnamed::default(),
        &mut HashSet::new()
    )
    .is_err());
    assert!(!only_starts_transaction(&m, &stmts));
    let plus = [query("BEGIN"), query("SELECT shift_path()")].concat();
    assert!(!only_starts_transaction(&plus, &stmts));
    let closes = [
        ext(Some(("", "BEGIN")), ""),
        msgs(|b| frontend::close(b'S', "s", b).unwrap()),
    ]
    .concat();
    assert!(!only_starts_transaction(&closes, &stmts));
}

/// The origin's replies to the state read in front of a batch (`add_check`), showing the
/// clean state: CloseComplete, ParseComplete, BindComplete, the row, CommandComplete,
/// ReadyForQuery.
fn check_replies() -> Vec<Vec<u8>> {
    let row = data_row(&super::super::state::CLEAN_COLUMNS);
    vec![
        frame(b'3', b""),
        frame(b'1', b""),
        frame(b'2', b""),
        frame(b'D', &row),
        frame(b'C', b"SELECT 1\0"),
        frame(b'Z', b"I"),
    ]
}

#[test]
fn the_check_goes_first_and_its_state_is_kept_hidden() {
    let mut prepared = HashSet::new();
    let m = msgs(|b| frontend::query("BEGIN", b).unwrap());
    let mut plan = plan_batch(&m, &mut HashMap::new(), &Unnamed::default(), &mut prepared).unwrap();
    add_check(&mut plan, &mut prepared, &OwnSql::default());
    // Close first: whatever a client's SQL-level PREPARE put under the name goes.
    assert_eq!(tags(&plan.out), b"CPBESQ");
    assert!(prepared.contains(super::super::state::STATE_STATEMENT));
    let mut t = Tracker::new(plan.acts);
    let mut out = Vec::new();
    let cols = super::super::state::CLEAN_COLUMNS;
    let mut replies = check_replies();
    replies.insert(5, frame(b'S', b"x\0y\0"));
    replies.push(frame(b'C', b"BEGIN\0"));
    for r in replies {
        assert_eq!(t.on_message(&r, &mut out, &mut prepared), Step::Continue);
    }
    assert_eq!(
        t.on_message(&frame(b'Z', b"T"), &mut out, &mut prepared),
        Step::ClientDone(b'T')
    );
    assert_eq!(tags(&out), b"CZ", "the check is hidden");
    let s = t.checked.expect("the state read");
    assert_eq!(s.fingerprint(), {
        let cols: Vec<Option<String>> = cols.iter().map(|c| Some(c.to_string())).collect();
        super::super::state::OriginState::from_columns(&cols)
            .unwrap()
            .fingerprint()
    });
}

/// Feeds a plan's tracker the backend's `replies` (tag, body); returns it and what the client got.
fn replay(
    acts: Vec<Act>,
    replies: &[(u8, &[u8])],
    prepared: &mut HashSet<String>,
) -> (Tracker, Vec<u8>) {
    let mut t = Tracker::new(acts);
    let mut out = Vec::new();
    for (tag, body) in replies {
        t.on_message(&frame(*tag, body), &mut out, prepared);
    }
    (t, out)
}

/// The unnamed statement outlives its batch: a later Bind of it gets it parsed again, hidden,
/// on whatever backend runs the batch; with none left (never parsed, its Parse failed, a Query
/// destroyed it) pgline raises PostgreSQL's 26000 and the backend sees nothing up to Sync.
#[test]
fn the_unnamed_statement_is_parsed_again_where_a_later_batch_binds_it() {
    let mut stmts = HashMap::new();
    let mut prepared = HashSet::new();
    let bind_execute = |b: &mut BytesMut| {
        bind(b, "");
        frontend::execute("", 0, b).unwrap();
    };
    let first = msgs(|b| {
        frontend::parse("", "SELECT 7", [], b).unwrap();
        bind_execute(b);
        frontend::sync(b);
    });
    let plan = plan_batch(&first, &mut stmts, &Unnamed::default(), &mut prepared).unwrap();
    assert_eq!(
        tags(&plan.out),
        b"PBES",
        "bound in its own batch: sent as it is"
    );
    let body = b"SELECT 7\0\0\0".to_vec();
    assert_eq!(plan.unnamed, vec![(0, Some(body.clone()))]);
    let (t, out) = replay(
        plan.acts,
        &[(b'1', b""), (b'2', b""), (b'C', b""), (b'Z', b"I")],
        &mut prepared,
    );
    assert_eq!(tags(&out), b"12CZ", "the client's own Parse is answered");
    let held = t.unnamed(plan.unnamed).expect("the batch set it");
    assert_eq!(held, Unnamed(Some(body.clone())));

    // A later batch binds it: parsed again first, its ParseComplete hidden.
    let later = msgs(|b| {
        bind_execute(b);
        frontend::sync(b);
    });
    let plan = plan_batch(&later, &mut stmts, &held, &mut prepared).unwrap();
    assert_eq!(tags(&plan.out), b"PBES");
    assert_eq!(
        &plan.out[5..5 + 1 + body.len()],
        &[&[0][..], &body].concat()[..]
    );
    let (t, out) = replay(
        plan.acts,
        &[(b'1', b""), (b'2', b""), (b'C', b""), (b'Z', b"I")],
        &mut prepared,
    );
    assert_eq!(tags(&out), b"2CZ");
    assert_eq!(t.unnamed(plan.unnamed), None, "unchanged");

    // A Query destroys it; a Bind after it in the same batch, or in a later one, fails.
    let query_then_bind = msgs(|b| {
        frontend::query("SELECT 1", b).unwrap();
        bind_execute(b);
        frontend::sync(b);
    });
    let plan = plan_batch(&query_then_bind, &mut stmts, &held, &mut prepared).unwrap();
    assert_eq!(
        tags(&plan.out),
        b"QS",
        "the backend sees nothing of the failed Bind"
    );
    assert!(matches!(&plan.acts[1], Act::Fail(e) if e.windows(5).any(|w| w == b"26000")));
    assert_eq!(plan.unnamed, vec![(0, None)]);
    let plan = plan_batch(&later, &mut stmts, &Unnamed(None), &mut prepared).unwrap();
    assert_eq!(tags(&plan.out), b"S");
    let (_, out) = replay(plan.acts, &[(b'Z', b"I")], &mut prepared);
    assert_eq!(tags(&out), b"EZ");

    // A Parse that fails leaves none; one skipped after an earlier error leaves the old one.
    let failing = msgs(|b| {
        frontend::parse("", "SELEC 7", [], b).unwrap();
        frontend::sync(b);
    });
    let plan = plan_batch(&failing, &mut stmts, &held, &mut prepared).unwrap();
    let (t, _) = replay(
        plan.acts,
        &[(b'E', b"C42601\0\0"), (b'Z', b"I")],
        &mut prepared,
    );
    assert_eq!(t.unnamed(plan.unnamed), Some(Unnamed(None)));
    let skipped = msgs(|b| {
        frontend::parse("x", "SELEC 7", [], b).unwrap();
        frontend::parse("", "SELECT 8", [], b).unwrap();
        frontend::sync(b);
    });
    let plan = plan_batch(&skipped, &mut stmts, &held, &mut prepared).unwrap();
    let (t, _) = replay(
        plan.acts,
        &[(b'E', b"C42601\0\0"), (b'Z', b"I")],
        &mut prepared,
    );
    assert_eq!(t.unnamed(plan.unnamed), None, "the old one stays");

    // Close destroys it; a re-parse puts its text among the batch's statements.
    let close = msgs(|b| {
        frontend::close(b'S', "", b).unwrap();
        frontend::sync(b);
    });
    let plan = plan_batch(&close, &mut stmts, &held, &mut prepared).unwrap();
    assert_eq!(plan.unnamed, vec![(0, None)]);
    let plan = plan_batch(&later, &mut stmts, &held, &mut prepared).unwrap();
    assert_eq!(plan.sql, vec!["SELECT 7".to_owned()]);
    // The core's word that a cached Query destroyed it.
    let mut u = held.clone();
    book_statements(&frame(b'C', b"S\0"), &mut stmts, &mut u).unwrap();
    assert_eq!(u, Unnamed(None));
    assert!(book_statements(&frame(b'C', b"Sx\0"), &mut stmts, &mut u).is_err());
}

#[test]
fn a_batch_that_did_not_run_gives_back_what_the_core_booked() {
    let mut stmts = HashMap::new();
    let mut u = Unnamed::default();
    let held = msgs(|b| frontend::parse("a", "SELECT 1", [], b).unwrap());
    book_statements(&held, &mut stmts, &mut u).unwrap();
    let m = msgs(|b| {
        frontend::parse("b", "SELECT 2", [], b).unwrap();
        // Held: the core booked nothing for it.
        frontend::parse("a", "SELECT 3", [], b).unwrap();
        // Took the statement from before the batch: given back (place 0).
        frontend::close(b'S', "a", b).unwrap();
        // Free after the Close: booked.
        frontend::parse("a", "SELECT 4", [], b).unwrap();
        frontend::parse("b", "SELECT 5", [], b).unwrap();
        // Took what this batch's Parse made, which never existed: nothing back (place 1).
        frontend::close(b'S', "b", b).unwrap();
        // Held nothing here, but the core may hold a statement the relay never saw: place 2.
        frontend::close(b'S', "c", b).unwrap();
        frontend::close(b'P', "portal", b).unwrap();
        frontend::parse("", "SELECT 6", [], b).unwrap();
        frontend::sync(b);
    });
    let (unparsed, unclosed) = not_run(&m, &stmts);
    assert_eq!(unparsed, [&b"b"[..], b"a", b""]);
    assert_eq!(unclosed, [0, 2]);
    // Nothing of it was planned: the relay's own table is as it was.
    assert_eq!(stmts.keys().collect::<Vec<_>>(), ["a"]);
}

#[test]
fn acts_not_answered_when_the_connection_ends_count_as_not_done() {
    let mut stmts = HashMap::new();
    let mut prepared = HashSet::new();
    let m = msgs(|b| {
        frontend::parse("a", "SELECT 1", [], b).unwrap();
        frontend::parse("b", "SELECT 2", [], b).unwrap();
        frontend::sync(b);
    });
    let plan = plan_batch(&m, &mut stmts, &Unnamed::default(), &mut prepared).unwrap();
    let mut t = Tracker::new(plan.acts);
    let mut out = Vec::new();
    // `a` answered; then the connection ends.
    t.on_message(&frame(b'1', b""), &mut out, &mut prepared);
    t.drop_unanswered();
    let dropped: Vec<&str> = plan
        .named_parses
        .iter()
        .filter(|(i, _)| t.dropped.contains(i))
        .map(|(_, n)| n.as_str())
        .collect();
    assert_eq!(dropped, ["b"]);
}

/// `DISCARD SEQUENCES` goes before the batch, behind the state read of a stolen backend (which
/// must see the owner's state), and its replies are hidden.
#[test]
fn sequence_values_are_discarded_behind_the_check_and_hidden() {
    let mut prepared = HashSet::new();
    let m = msgs(|b| frontend::query("SELECT lastval()", b).unwrap());
    let mut plan = plan_batch(&m, &mut HashMap::new(), &Unnamed::default(), &mut prepared).unwrap();
    add_discard_sequences(&mut plan);
    add_check(&mut plan, &mut prepared, &OwnSql::default());
    assert_eq!(tags(&plan.out), b"CPBESQQ");
    assert!(plan.out.windows(17).any(|w| w == b"DISCARD SEQUENCES"));
    let mut t = Tracker::new(plan.acts);
    let mut out = Vec::new();
    let mut replies = check_replies();
    replies.extend([frame(b'C', b"DISCARD SEQUENCES\0"), frame(b'Z', b"I")]);
    for r in replies {
        assert_eq!(t.on_message(&r, &mut out, &mut prepared), Step::Continue);
    }
    assert!(out.is_empty(), "pgline's statements are hidden");
    let err = frame(
        b'E',
        b"SERROR\0C55000\0Mlastval is not yet defined in this session\0\0",
    );
    assert_eq!(t.on_message(&err, &mut out, &mut prepared), Step::Continue);
    assert_eq!(
        t.on_message(&frame(b'Z', b"I"), &mut out, &mut prepared),
        Step::ClientDone(b'I')
    );
    assert_eq!(tags(&out), b"EZ");
    assert!(t.checked.is_some());
}
