\set aid random(1, 100000 * 10)
SELECT to_regclass('public.pgbench_accounts')::oid = 'pgbench_accounts'::regclass::oid, aid, bid, abalance, filler FROM pgbench_accounts WHERE aid = :aid;
