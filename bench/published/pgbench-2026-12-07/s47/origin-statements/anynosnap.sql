\set aid random(1, 1000000)
SELECT CASE WHEN t.aid IS NULL THEN NULL ELSE format('%s', t.aid) END, CASE WHEN t.bid IS NULL THEN NULL ELSE format('%s', t.bid) END, CASE WHEN t.abalance IS NULL THEN NULL ELSE format('%s', t.abalance) END, CASE WHEN t.filler IS NULL THEN NULL ELSE format('%s', t.filler) END FROM public.pgbench_accounts t WHERE t.aid = ANY(ARRAY[:aid::text]::integer[]);
