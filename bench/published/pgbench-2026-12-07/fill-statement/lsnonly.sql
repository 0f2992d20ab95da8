\set aid random(1, 100000 * 10)
SELECT pg_current_wal_lsn()::text, aid, bid, abalance, filler FROM pgbench_accounts WHERE aid = :aid;
