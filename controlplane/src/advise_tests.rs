use super::*;
use pgline_dataplane::keyspace::{PgColumn, PgTable};

fn keyspace() -> KeySpace {
    let col = |name: &str, attnum, type_oid| PgColumn {
        name: name.into(),
        attnum,
        type_oid,
        typlen: -1,
        typmod: -1,
    };
    let mut ks = KeySpace::new();
    ks.add_pg_table(PgTable {
        id: 1,
        schema: "public".into(),
        name: "accounts".into(),
        columns: vec![
            col("aid", 1, 23),
            col("tenant", 2, 20),
            col("abalance", 3, 23),
        ]
        .into(),
        key_columns: vec![0].into(),
        key_names: vec!["aid".to_string()].into(),
        row_security: false,
    });
    ks
}

fn row(query: &str, calls: u64, ms: f64) -> StatementRow {
    StatementRow {
        query: query.into(),
        user: Some("app".into()),
        calls,
        total_exec_ms: ms,
        too_long: false,
    }
}

fn ctx() -> Context {
    Context {
        database: "db".into(),
        cache_users: vec!["app".into()],
        refused: [(
            "history".to_string(),
            "no primary key (its rows have no key)".to_string(),
        )]
        .into(),
        all: Totals {
            statements: 5,
            calls: 1000,
            exec_ms: 100.0,
        },
        ..Context::default()
    }
}

#[test]
fn sums_by_verdict_and_estimates_at_the_hit_ratio() {
    let rows = [
        row("SELECT abalance FROM accounts WHERE aid = $1", 600, 30.0),
        row("SELECT count(*) FROM accounts WHERE tenant = $1", 100, 40.0),
        row(
            "UPDATE accounts SET abalance = abalance + $1 WHERE aid = $2",
            200,
            20.0,
        ),
        row("SELECT * FROM history WHERE aid = $1", 50, 5.0),
        row(
            "SELECT now(), abalance FROM accounts WHERE aid = $1",
            50,
            5.0,
        ),
    ];
    let a = advise(&rows, &keyspace(), &ctx(), 0.9);
    assert_eq!((a.store.totals.statements, a.store.totals.calls), (1, 600));
    assert_eq!(
        (a.results.totals.statements, a.results.totals.calls),
        (1, 100)
    );
    assert_eq!((a.pass.totals.statements, a.pass.totals.calls), (3, 300));
    assert_eq!(a.served.totals.calls, 700);
    assert!((a.served.calls_pct - 70.0).abs() < 1e-9);
    assert!(
        (a.served.exec_pct - 70.0).abs() < 1e-9,
        "{}",
        a.served.exec_pct
    );
    assert!((a.estimate.exec_ms_saved - 63.0).abs() < 1e-9);
    assert!((a.estimate.exec_pct_saved - 63.0).abs() < 1e-9);
    assert!((a.estimate.calls_saved - 630.0).abs() < 1e-9);
    // Reasons, most origin time first; each statement's reason and the actions.
    let reasons: Vec<&str> = a.pass_reasons.iter().map(|r| r.reason.as_str()).collect();
    assert_eq!(reasons[0], "write");
    assert!(reasons.contains(&"table_not_cacheable") && reasons.contains(&"volatile_function"));
    let actions: Vec<&str> = a.actions.iter().map(|x| x.action.as_str()).collect();
    assert!(
        actions.contains(&"ALTER TABLE history ADD PRIMARY KEY (...)"),
        "{actions:?}"
    );
    assert!(
        actions.contains(&"avoid now in cached reads"),
        "{actions:?}"
    );
    // The equality on a non-key column without REPLICA IDENTITY FULL.
    assert!(
        actions.contains(&"ALTER TABLE public.accounts REPLICA IDENTITY FULL"),
        "{actions:?}"
    );
    let mut full = ctx();
    full.identity_full.insert("public.accounts".into());
    let b = advise(&rows, &keyspace(), &full, 0.9);
    assert!(b.actions.iter().all(|x| !x.action.contains("REPLICA")));
    assert_eq!(a.statements[0].verdict, Verdict::Results, "most time first");
    // Read 5 of 5 statements: no "raise limit" caveat.
    assert!(a.caveats.iter().all(|c| !c.contains("raise limit")));
}

#[test]
fn session_conditions_and_bounds() {
    let mut other = row("SELECT abalance FROM accounts WHERE aid = $1", 10, 1.0);
    other.user = Some("reporting".into());
    let mut long = row("SELECT abalance FROM accounts WHERE aid = $1", 10, 1.0);
    long.too_long = true;
    let rows = [
        other,
        long,
        row("BEGIN", 5, 0.1),
        row("SELECT abalance FROM accounts WHERE aid = $1", 10, 1.0),
    ];
    let mut c = ctx();
    c.all.statements = 400;
    c.disabled.insert("public.accounts".into());
    let a = advise(&rows, &keyspace(), &c, f64::NAN);
    assert_eq!(a.estimate.hit_ratio, DEFAULT_HIT_RATIO);
    let reasons: Vec<Option<&str>> = a.statements.iter().map(|s| s.reason.as_deref()).collect();
    assert!(reasons.contains(&Some("user_not_cached")), "{reasons:?}");
    assert!(reasons.contains(&Some("text_too_long")), "{reasons:?}");
    assert!(reasons.contains(&Some("table_disabled")), "{reasons:?}");
    assert_eq!(a.served.totals.calls, 0);
    assert!(a
        .caveats
        .iter()
        .any(|c| c.contains("5 calls of transaction control")));
    assert!(a.caveats.iter().any(|c| c.contains("raise limit")));
    // Transaction control beyond the statements read still counts for the caveat, and only
    // what the cores classify as such; it is not in the sums.
    c.beyond = vec![
        row("COMMIT", 7, 0.01),
        row("end_of_day_report()", 100, 0.01),
    ];
    let b = advise(&rows, &keyspace(), &c, 1.0);
    assert!(
        b.caveats
            .iter()
            .any(|c| c.contains("12 calls of transaction control")),
        "{:?}",
        b.caveats
    );
    assert_eq!(b.read, a.read);
    // Nothing read: no division by zero.
    let empty = advise(&[], &keyspace(), &ctx(), 2.0);
    assert_eq!(empty.estimate.hit_ratio, 1.0);
    assert_eq!(empty.served.calls_pct, 0.0);
}
