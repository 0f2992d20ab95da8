//! The replication connection and slot helpers against the lab PostgreSQL.

use pgline_controlplane::wal::{slot, PublicationScope, ReplicationConn, WalError};
use pgline_testkit::TestDb;

fn origin(db: &TestDb) -> pgline_controlplane::origin::Settings {
    pgline_controlplane::origin::Settings::parse(&db.conn_string()).expect("test conn string")
}

#[tokio::test]
async fn identify_system_over_scram() {
    let db = TestDb::create("walconn_ident").await;
    let mut conn = ReplicationConn::connect(&origin(&db))
        .await
        .expect("connect");
    let info = conn.identify_system().await.expect("IDENTIFY_SYSTEM");
    assert_eq!(info.dbname.as_deref(), Some(db.name.as_str()));
    assert!(info.timeline >= 1);
    assert!(info.xlogpos > 0);
    assert!(!info.system_id.is_empty());
}

#[tokio::test]
async fn wrong_password_is_a_server_error() {
    let db = TestDb::create("walconn_pw").await;
    let mut cfg = origin(&db);
    cfg.pg.password("wrong");
    match ReplicationConn::connect(&cfg).await {
        Err(e) => assert_eq!(e.sqlstate(), Some("28P01"), "{e}"),
        Ok(_) => panic!("connected with a wrong password"),
    }
}

/// A FATAL the origin sends after AuthenticationOk (here: no such database) is the error, not
/// the closed connection that follows it.
#[tokio::test]
async fn a_missing_database_is_the_origins_fatal() {
    let db = TestDb::create("walconn_nodb").await;
    let mut cfg = origin(&db);
    cfg.pg.dbname("pgline_no_such_database");
    match ReplicationConn::connect(&cfg).await {
        Err(e) => assert_eq!(e.sqlstate(), Some("3D000"), "{e}"),
        Ok(_) => panic!("connected to a database that does not exist"),
    }
}

#[tokio::test]
async fn missing_slot_surfaces_sqlstate() {
    let db = TestDb::create("walconn_noslot").await;
    let mut conn = ReplicationConn::connect(&origin(&db))
        .await
        .expect("connect");
    let err = conn
        .start_logical("no_such_slot", "no_such_pub", 0)
        .await
        .expect_err("start on a missing slot");
    assert!(matches!(err, WalError::Server { .. }), "{err}");
    assert_eq!(err.sqlstate(), Some("42704"), "{err}");
    // The connection is still usable after the error.
    conn.identify_system().await.expect("usable after error");
}

#[tokio::test]
async fn publication_and_slot_management() {
    let db = TestDb::create("walconn_pub").await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE a (id int primary key); CREATE SCHEMA s; \
             CREATE TABLE s.\"B b\" (id int primary key);",
        )
        .await
        .expect("tables");
    slot::check_wal_level(&client).await.expect("wal_level");

    let scope = PublicationScope::Tables(vec!["a".into()]);
    slot::ensure_publication(&client, "p\"1", &scope)
        .await
        .expect("create");
    slot::ensure_publication(&client, "p\"1", &scope)
        .await
        .expect("idempotent");
    let scope2 = PublicationScope::Tables(vec!["a".into(), "s.\"B b\"".into()]);
    slot::ensure_publication(&client, "p\"1", &scope2)
        .await
        .expect("extend");
    let rows = client
        .query(
            "SELECT schemaname || '.' || tablename FROM pg_publication_tables \
             WHERE pubname = 'p\"1' ORDER BY 1",
            &[],
        )
        .await
        .expect("publication tables");
    let names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(names, vec!["public.a".to_string(), "s.B b".to_string()]);

    // A table dropped since start-up is skipped (the writer's catalog check removes it).
    let missing = PublicationScope::Tables(vec!["nope".into(), "a".into()]);
    slot::ensure_publication(&client, "p\"1", &missing)
        .await
        .expect("an unknown table is skipped");

    let slot_name = format!("{}_slot", db.name);
    assert!(!slot::slot_exists(&client, &slot_name)
        .await
        .expect("exists"));
    let lsn = slot::create_slot(&client, &slot_name)
        .await
        .expect("create slot");
    assert!(lsn > 0);
    assert!(slot::slot_exists(&client, &slot_name)
        .await
        .expect("exists"));
    let confirmed = slot::confirmed_flush_lsn(&client, &slot_name)
        .await
        .expect("confirmed");
    assert_eq!(confirmed, Some(lsn));

    // Streaming from it works with a quoted publication name.
    let mut conn = ReplicationConn::connect(&origin(&db))
        .await
        .expect("connect");
    conn.start_logical(&slot_name, "p\"1", 0)
        .await
        .expect("start");
    conn.send_status(lsn, lsn, lsn, true).await.expect("status");
    let ev = tokio::time::timeout(std::time::Duration::from_secs(10), conn.recv())
        .await
        .expect("keepalive in time")
        .expect("recv");
    assert!(
        matches!(
            ev,
            pgline_controlplane::wal::ReplicationEvent::Keepalive { .. }
        ),
        "{ev:?}"
    );
    drop(conn);

    // Dropping needs the walsender gone; retry briefly.
    let mut dropped = false;
    for _ in 0..100 {
        if slot::drop_slot(&client, &slot_name).await.is_ok() {
            dropped = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(dropped);
    assert!(!slot::slot_exists(&client, &slot_name)
        .await
        .expect("exists"));
}
