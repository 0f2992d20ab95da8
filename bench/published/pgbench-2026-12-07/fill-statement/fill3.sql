\set aid random(1, 100000 * 10)
SELECT s.snap, t.aid, t.bid, t.abalance, t.filler, s.lsn FROM (SELECT pg_current_snapshot()::text AS snap, pg_catalog.pg_current_wal_lsn()::text AS lsn) s LEFT JOIN (public.pgbench_accounts t JOIN unnest(ARRAY[(:aid)::text]) AS k(k0) ON t.aid = k.k0::int4) ON true;
