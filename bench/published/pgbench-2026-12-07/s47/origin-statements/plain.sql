\set aid random(1, 1000000)
SELECT aid, bid, abalance, filler FROM pgbench_accounts WHERE aid = :aid;
