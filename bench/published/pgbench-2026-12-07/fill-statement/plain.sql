\set aid random(1, 100000 * 10)
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
