\set aid random(1, 100000 * 10)
SELECT t.aid, t.bid, t.abalance, t.filler FROM public.pgbench_accounts t JOIN unnest(ARRAY[(:aid)::text]) AS k(k0) ON t.aid = k.k0::int4;
