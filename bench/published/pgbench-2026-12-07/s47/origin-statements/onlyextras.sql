\set aid random(1, 1000000)
SELECT pg_current_snapshot()::text AS snap, to_regclass('public.pgbench_accounts')::oid = 16397::oid AS same, (CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn() ELSE pg_catalog.pg_current_wal_lsn() END)::text AS lsn;
