-- The pgwire differential corpus: one statement per line, run in order by every client against
-- the origin and through pgline (controlplane/tests/pgwire_diff.rs, deploy/lab/pgwire_diff.py).
-- `--@params ["a", null]` at the end of a line gives $1.. as text (null = SQL NULL); psql,
-- which cannot bind, gets them inlined as quoted literals. Lines starting with INSERT, UPDATE or
-- DELETE are writes: run once through pgline; the origin side runs them in a transaction it
-- rolls back, to know the expected answer. Every write is undone further down, so the corpus
-- can run again (the next client) on the same data. Transaction control lines (BEGIN, COMMIT,
-- ROLLBACK, SAVEPOINT, ...) run once on each side; a write inside a transaction block is refused.
-- point lookups by literal
SELECT * FROM users WHERE id = 1;
SELECT * FROM users WHERE id = 7;
SELECT * FROM users WHERE id = 10;
SELECT * FROM users WHERE id = 60;
SELECT * FROM users WHERE id = 61;
SELECT * FROM users WHERE id = -1;
SELECT name, email FROM users WHERE id = 3;
SELECT email, name, id FROM users WHERE id = 4;
SELECT id FROM users WHERE id = 5;
SELECT * FROM orders WHERE id = 1;
SELECT * FROM orders WHERE id = 10;
SELECT * FROM orders WHERE id = 300;
SELECT * FROM orders WHERE id = 301;
SELECT * FROM items WHERE sku = 'sku-001';
SELECT * FROM items WHERE sku = 'sku-040';
SELECT * FROM items WHERE sku = 'nope';
SELECT title, price FROM items WHERE sku = 'sku-017';
SELECT * FROM sessions WHERE id = '00000000-0000-4000-8000-000000000001';
SELECT * FROM sessions WHERE id = '00000000-0000-4000-8000-00000000001E';
SELECT * FROM sessions WHERE id = '00000000-0000-4000-8000-0000000000ff';
SELECT * FROM numbers WHERE id = 1;
SELECT * FROM numbers WHERE id = 2;
SELECT * FROM numbers WHERE id = 3;
SELECT * FROM numbers WHERE id = 4;
SELECT * FROM numbers WHERE id = 5;
SELECT * FROM numbers WHERE id = 6;
SELECT * FROM numbers WHERE id = 7;
SELECT * FROM kv WHERE k = 'k1';
SELECT * FROM kv WHERE k = 'k20';
SELECT * FROM public.users WHERE id = 2;
SELECT * FROM "users" WHERE "id" = 8;
select * from users where id = 9;
SELECT * FROM users WHERE id=11;
SELECT * FROM users u WHERE u.id = 12;
SELECT * FROM accounts WHERE tenant = 1 AND id = 1;
SELECT * FROM accounts WHERE tenant = 3 AND id = 10;
-- point lookup shapes a key cache must not get wrong
SELECT * FROM users WHERE id = '5';
SELECT * FROM users WHERE id = 5.0;
SELECT * FROM users WHERE id = +5;
SELECT * FROM users WHERE id = 05;
SELECT * FROM users WHERE 6 = id;
SELECT * FROM users WHERE id = 6 AND true;
SELECT * FROM users WHERE id = 6 LIMIT 1;
SELECT * FROM users WHERE id = 6 ORDER BY id;
SELECT id AS x, name AS "Y" FROM users WHERE id = 6;
SELECT users.* FROM users WHERE id = 6;
SELECT *, id FROM users WHERE id = 6;
SELECT name, name FROM users WHERE id = 6;
SELECT ID, NAME FROM USERS WHERE ID = 6;
SELECT "Name" FROM users WHERE id = 6;
SELECT * FROM kv WHERE k = 'k1 ';
SELECT * FROM kv WHERE k = 'K1';
SELECT * FROM kv WHERE k = E'k\x31';
SELECT * FROM app.profiles WHERE user_id = 2;
SELECT * FROM app.profiles WHERE user_id = 3;
SELECT "Display Name" FROM app.profiles WHERE user_id = $1; --@params ["4"]
SELECT * FROM profiles WHERE user_id = 2;
SELECT 1; SELECT * FROM users WHERE id = 1;
SELECT * FROM users WHERE id = $1; --@params [" 7 "]
SELECT * FROM users WHERE id = $1; --@params ["+7"]
SELECT * FROM users WHERE id = $1; --@params ["007"]
SELECT * FROM kv WHERE k = $1; --@params ["k1 "]
SELECT * FROM kv WHERE k = $1; --@params [""]
SELECT * FROM users WHERE id = $1::int8; --@params ["8"]
SELECT * FROM users WHERE id = $1::text::int; --@params ["8"]
SELECT * FROM sessions WHERE id = $1; --@params ["{00000000-0000-4000-8000-000000000004}"]
-- point lookups by parameter
SELECT * FROM users WHERE id = $1; --@params ["1"]
SELECT * FROM users WHERE id = $1; --@params ["2"]
SELECT * FROM users WHERE id = $1; --@params ["14"]
SELECT * FROM users WHERE id = $1; --@params ["15"]
SELECT * FROM users WHERE id = $1; --@params ["999"]
SELECT * FROM users WHERE id = $1; --@params [null]
SELECT name FROM users WHERE id = $1; --@params ["20"]
SELECT * FROM orders WHERE id = $1; --@params ["42"]
SELECT * FROM orders WHERE id = $1; --@params ["9999999999"]
SELECT * FROM items WHERE sku = $1; --@params ["sku-005"]
SELECT * FROM items WHERE sku = $1; --@params ["sku-5"]
SELECT * FROM items WHERE sku = $1; --@params ["ünïcødé"]
SELECT * FROM sessions WHERE id = $1; --@params ["00000000-0000-4000-8000-000000000002"]
SELECT * FROM sessions WHERE id = $1; --@params ["00000000-0000-4000-8000-00000000000A"]
SELECT * FROM sessions WHERE id = $1; --@params ["00000000000040008000000000000003"]
SELECT * FROM kv WHERE k = $1; --@params ["k3"]
SELECT * FROM accounts WHERE tenant = $1 AND id = $2; --@params ["2", "5"]
SELECT * FROM numbers WHERE id = $1; --@params ["1"]
SELECT * FROM numbers WHERE id = $1; --@params ["6"]
-- bad parameters and keys
SELECT * FROM users WHERE id = $1; --@params ["abc"]
SELECT * FROM users WHERE id = $1; --@params ["99999999999"]
SELECT * FROM sessions WHERE id = $1; --@params ["not-a-uuid"]
SELECT * FROM users WHERE id = 'x';
SELECT * FROM users WHERE id = 2147483648;
-- range scans
SELECT id, name FROM users WHERE id BETWEEN 10 AND 15 ORDER BY id;
SELECT id, name FROM users WHERE id > 55 ORDER BY id DESC;
SELECT id FROM users WHERE id < 0;
SELECT * FROM orders WHERE user_id = 5 ORDER BY id;
SELECT * FROM orders WHERE user_id = $1 ORDER BY id; --@params ["6"]
SELECT id, status FROM orders WHERE id IN (1, 2, 3, 500) ORDER BY id;
SELECT sku FROM items WHERE sku LIKE 'sku-01%' ORDER BY sku;
SELECT sku, price FROM items WHERE price > 40 ORDER BY price DESC LIMIT 3;
SELECT * FROM users ORDER BY id LIMIT 5;
SELECT * FROM users ORDER BY id LIMIT 5 OFFSET 50;
SELECT id FROM users WHERE email IS NULL ORDER BY id;
SELECT id FROM users WHERE score IS NULL ORDER BY id;
SELECT id, name FROM users WHERE active AND id < 10 ORDER BY id;
SELECT id FROM users WHERE created > '2024-01-01 12:00:00+00' AND created < '2024-01-01 14:00:00+00' ORDER BY id;
SELECT id FROM users WHERE birthday BETWEEN '1990-06-01' AND '1991-01-01' ORDER BY id;
SELECT id FROM users WHERE 't1' = ANY(tags) ORDER BY id;
SELECT id FROM users WHERE meta @> '{"plan": "pro"}' ORDER BY id LIMIT 5;
SELECT id FROM users WHERE meta->>'n' = '33';
SELECT * FROM accounts WHERE tenant = 2 ORDER BY id;
SELECT * FROM accounts WHERE tenant = $1 ORDER BY id DESC LIMIT 3; --@params ["3"]
SELECT id FROM users WHERE feeling = 'happy' ORDER BY id LIMIT 4;
SELECT k, v FROM kv ORDER BY k;
-- joins
SELECT u.id, u.name, o.id AS order_id, o.amount FROM users u JOIN orders o ON o.user_id = u.id WHERE u.id = 3 ORDER BY o.id;
SELECT u.name, count(o.id) FROM users u LEFT JOIN orders o ON o.user_id = u.id WHERE u.id <= 5 GROUP BY u.name ORDER BY u.name;
SELECT o.id, u.email FROM orders o JOIN users u USING (id) WHERE o.id < 4 ORDER BY o.id;
SELECT u.id, s.id AS session FROM users u JOIN sessions s ON s.user_id = u.id ORDER BY s.id LIMIT 5;
SELECT a.tenant, a.id, u.name FROM accounts a CROSS JOIN users u WHERE u.id = a.id AND a.tenant = 1 ORDER BY a.id;
SELECT u.id FROM users u WHERE EXISTS (SELECT 1 FROM orders o WHERE o.user_id = u.id AND o.status = 'cancelled' AND o.amount > 900) ORDER BY u.id;
SELECT u.id FROM users u WHERE u.id NOT IN (SELECT user_id FROM orders) ORDER BY u.id;
SELECT u.id, x.total FROM users u, LATERAL (SELECT sum(amount) AS total FROM orders o WHERE o.user_id = u.id) x WHERE u.id < 4 ORDER BY u.id;
SELECT * FROM users u FULL JOIN sessions s ON s.user_id = u.id AND u.id < 0 WHERE s.id IS NULL AND u.id < 3 ORDER BY u.id;
SELECT i.sku, o.id FROM items i LEFT JOIN orders o ON o.id = i.qty WHERE i.sku < 'sku-004' ORDER BY i.sku;
-- aggregates
SELECT count(*) FROM users;
SELECT count(*), count(email), count(DISTINCT active) FROM users;
SELECT sum(balance), avg(balance), min(balance), max(balance) FROM users;
SELECT sum(score), avg(score) FROM users;
SELECT status, count(*), sum(amount) FROM orders GROUP BY status ORDER BY status;
SELECT user_id, count(*) FROM orders GROUP BY user_id HAVING count(*) > 5 ORDER BY user_id;
SELECT active, avg(balance)::numeric(12,4) FROM users GROUP BY active ORDER BY active;
SELECT string_agg(name, ',' ORDER BY id) FROM users WHERE id < 6;
SELECT array_agg(id ORDER BY id) FROM users WHERE id % 10 = 0;
SELECT json_agg(k ORDER BY k) FROM kv WHERE n < 4;
SELECT jsonb_object_agg(k, n) FROM kv WHERE n < 4;
SELECT bool_and(active), bool_or(active) FROM users;
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY balance) FROM users;
SELECT count(*) FILTER (WHERE status = 'paid') FROM orders;
SELECT max(f8), min(f8), max(f4), min(n), max(n) FROM numbers;
SELECT sum(i8) FROM numbers WHERE id > 3;
SELECT sum(i8) FROM numbers;
SELECT tenant, sum(balance) FROM accounts GROUP BY ROLLUP (tenant) ORDER BY tenant;
SELECT count(*) FROM orders WHERE placed_at >= '2024-03-01';
-- window functions
SELECT id, row_number() OVER (ORDER BY balance DESC) FROM users WHERE id < 8 ORDER BY id;
SELECT id, user_id, rank() OVER (PARTITION BY user_id ORDER BY amount DESC) FROM orders WHERE user_id < 3 ORDER BY user_id, id;
SELECT id, amount, sum(amount) OVER (ORDER BY id) FROM orders WHERE id <= 6 ORDER BY id;
SELECT id, lag(amount) OVER (ORDER BY id), lead(amount, 2) OVER (ORDER BY id) FROM orders WHERE id <= 5 ORDER BY id;
SELECT id, ntile(3) OVER (ORDER BY id) FROM users WHERE id <= 9 ORDER BY id;
SELECT tenant, id, first_value(name) OVER w, last_value(name) OVER w FROM accounts WHERE id < 3 WINDOW w AS (PARTITION BY tenant ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) ORDER BY tenant, id;
SELECT id, avg(amount) OVER (ORDER BY id ROWS 2 PRECEDING)::numeric(10,3) FROM orders WHERE id < 6 ORDER BY id;
SELECT status, id, dense_rank() OVER (PARTITION BY status ORDER BY amount) FROM orders WHERE id < 10 ORDER BY status, id;
SELECT id, percent_rank() OVER (ORDER BY score), cume_dist() OVER (ORDER BY score) FROM users WHERE id < 6 ORDER BY id;
-- NULLs
SELECT NULL;
SELECT NULL::int, NULL::text, NULL::jsonb;
SELECT id, email, score, nick FROM users WHERE id = 35;
SELECT coalesce(email, 'none') FROM users WHERE id = 14;
SELECT nullif(1, 1), nullif(1, 2);
SELECT id, note FROM orders WHERE note IS NOT NULL ORDER BY id LIMIT 3;
SELECT NULL = NULL, NULL IS NULL, NULL IS DISTINCT FROM 1;
SELECT count(note), count(*) FROM orders;
SELECT ids FROM items WHERE sku = 'sku-002';
SELECT ''::text, ' '::text, NULL::text;
-- every common type
SELECT 1::int2, 2::int4, 3::int8, -32768::int2;
SELECT 1.5::numeric, 1.50::numeric(10,2), 'NaN'::numeric, 1e-30::numeric;
SELECT 1.5::float8, 0.1::float4, 'NaN'::float8, 'Infinity'::float8, '-Infinity'::float4;
SELECT 1e308::float8 * 10;
SELECT 'abc'::text, 'abc'::varchar(2), 'ab'::char(5), 'x'::"char", 'y'::name;
SELECT true, false, 't'::bool, 'off'::bool;
SELECT date '2024-02-29', time '13:14:15.123456', timetz '01:02:03+05:30';
SELECT timestamp '2024-01-02 03:04:05.678', timestamptz '2024-01-02 03:04:05+01';
SELECT interval '1 year 2 months 3 days 04:05:06.789', interval '-1 day';
SELECT 'infinity'::timestamp, '-infinity'::date;
SELECT date '2024-01-31' + 1, timestamptz '2024-03-31 12:00+00' - interval '1 month';
SELECT extract(epoch FROM timestamptz '2024-01-01 00:00:00+00');
SELECT 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid;
SELECT '{"a": [1, 2, {"b": null}]}'::json, '{"b": 2, "a": 1}'::jsonb;
SELECT '{"a": 1}'::jsonb -> 'a', '{"a": "x"}'::jsonb ->> 'a', '[1,2,3]'::jsonb #> '{1}';
SELECT ARRAY[1, 2, NULL], ARRAY['a', 'b c', '"q"'], ARRAY[[1, 2], [3, 4]];
SELECT '{}'::int[], ARRAY[true, false], ARRAY[1.5, 2]::numeric[];
SELECT '\x00ff10'::bytea, 'abc'::bytea, ''::bytea;
SELECT avatar FROM users WHERE id = 255;
SELECT avatar, tags, meta FROM users WHERE id = 16;
SELECT '192.168.0.1/24'::inet, '10.0.0.0/8'::cidr, '08:00:2b:01:02:03'::macaddr;
SELECT 'happy'::mood, 12.34::money;
SELECT '(1,2)'::point, '[1,5)'::int4range, 'fat & rat'::tsquery;
SELECT 'a b c'::tsvector, B'1010'::bit(4), B'11'::varbit;
SELECT 1::oid, 'pg_class'::regclass, 'int4'::regtype;
SELECT row(1, 'a', NULL), (1, 2);
SELECT x FROM generate_series(1, 5) x;
SELECT * FROM (VALUES (1, 'one'), (2, 'two')) AS v(n, word) ORDER BY n;
SELECT * FROM sessions WHERE id = '00000000-0000-4000-8000-000000000005';
SELECT dur, started, at_tz, ip FROM sessions WHERE user_id = 8 ORDER BY id;
SELECT n, i2, i8 FROM numbers ORDER BY id;
SELECT f8, f4 FROM numbers ORDER BY id;
SELECT f8 = 'NaN'::float8, f8 > 0 FROM numbers WHERE id <= 3 ORDER BY id;
SELECT weight, attrs, ids, code FROM items WHERE sku = 'sku-007';
SELECT level, nick, feeling FROM users WHERE id = 22;
SELECT 'é'::text, length('é'), octet_length('é');
SELECT repeat('x', 3000);
SELECT E'line1\nline2\ttab';
SELECT 'quote''s', '"dq"', '\';
SELECT 123456789012345678901234567890::numeric * 10;
SELECT 7 / 2, 7 / 2.0, 7 % 3, -7 / 2, 2 ^ 10;
SELECT round(2.5), round(-2.5), round(2.5::float8), trunc(2.99);
SELECT to_char(date '2024-05-06', 'YYYY/MM/DD'), to_char(1234.5, '9G999D99');
SELECT md5('pgline'), upper('abc'), lower('ÀB'), initcap('hello world');
SELECT split_part('a,b,c', ',', 2), substr('pgline', 3), position('l' in 'pgline');
SELECT format('%s-%s', 1, NULL), concat('a', NULL, 'b'), 'a' || NULL;
SELECT CASE WHEN 1 > 2 THEN 'x' ELSE 'y' END, greatest(1, 5, 3), least('b', 'a');
SELECT array_length(ARRAY[1, 2, 3], 1), cardinality(ARRAY[[1], [2]]), unnest(ARRAY[7, 8]);
SELECT jsonb_pretty('{"a": {"b": 1}}');
SELECT generate_series(timestamptz '2024-01-01 00:00+00', timestamptz '2024-01-01 02:00+00', interval '1 hour');
-- errors
SELECT nosuchcolumn FROM users WHERE id = 1;
SELECT * FROM nosuchtable;
SELECT * FROM users WHERE nosuch = 1;
SELECT 1 / 0;
SELECT 1.0 / 0;
SELECT 1::float8 / 0;
SELECT 5 % 0;
SELEC 1;
SELECT * FROM users WHERE;
SELECT 'abc'::int;
SELECT 32768::int2;
SELECT 9223372036854775807::int8 + 1;
SELECT '2024-02-30'::date;
SELECT '{"a": }'::jsonb;
SELECT 'xyz'::uuid;
SELECT ARRAY[1, 2][5], (ARRAY[1, 2])[5];
SELECT sqrt(-1);
SELECT log(0);
SELECT 'sad'::mood < 'nope'::mood;
SELECT id FROM users, orders WHERE id = 1;
SELECT count(*) FROM users GROUP BY nosuch;
SELECT name FROM users GROUP BY id HAVING name = 'x' ORDER BY 1;
SELECT * FROM users ORDER BY 99;
SELECT nosuchfunction(1);
SELECT $1; --@params ["1"]
SELECT 1 FROM users WHERE id = 1 FOR UPDATE;
SELECT pg_catalog.current_setting('nosuch.setting');
SELECT (SELECT id FROM users);
-- transaction blocks (read-only: see the header)
BEGIN;
SELECT * FROM users WHERE id = 1;
SELECT * FROM kv WHERE k = $1; --@params ["k4"]
SELECT count(*) FROM orders;
COMMIT;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT * FROM users WHERE id = 2;
SELECT current_setting('transaction_isolation');
COMMIT;
BEGIN;
SELECT 1 / 0;
SELECT * FROM users WHERE id = 1;
ROLLBACK;
SELECT * FROM users WHERE id = 1;
BEGIN READ ONLY;
SELECT * FROM kv WHERE k = 'k5';
SAVEPOINT s1;
SELECT nosuch FROM kv;
SELECT * FROM kv WHERE k = 'k5';
ROLLBACK TO SAVEPOINT s1;
SELECT * FROM kv WHERE k = 'k5';
RELEASE SAVEPOINT s1;
COMMIT;
COMMIT;
START TRANSACTION;
SELECT * FROM sessions WHERE id = '00000000-0000-4000-8000-000000000009';
END;
-- writes interleaved with reads of the same rows
INSERT INTO kv VALUES ('w1', 'first', 100) RETURNING *;
SELECT * FROM kv WHERE k = 'w1';
SELECT * FROM kv WHERE k = $1; --@params ["w1"]
UPDATE kv SET v = 'second' WHERE k = 'w1' RETURNING v, n;
SELECT * FROM kv WHERE k = 'w1';
SELECT v FROM kv WHERE k = $1; --@params ["w1"]
DELETE FROM kv WHERE k = 'w1' RETURNING k;
SELECT * FROM kv WHERE k = 'w1';
SELECT * FROM kv WHERE k = $1; --@params ["w1"]
INSERT INTO kv VALUES ('k1', 'dup', 1);
INSERT INTO kv VALUES (NULL, 'nullkey', 1);
INSERT INTO kv VALUES ('w2', 'x', 'notanint');
UPDATE users SET balance = balance + 1, score = NULL WHERE id = 1 RETURNING id, balance, score;
SELECT * FROM users WHERE id = 1;
SELECT balance FROM users WHERE id = $1; --@params ["1"]
UPDATE users SET balance = balance - 1, score = 1 / 3.0 WHERE id = 1;
SELECT * FROM users WHERE id = 1;
UPDATE users SET email = NULL, tags = ARRAY['z'], meta = '{"plan": "gold"}' WHERE id = 2 RETURNING *;
SELECT * FROM users WHERE id = 2;
UPDATE users SET email = 'u2@example.com', tags = ARRAY['t2', 'x'], meta = '{"n": 2, "plan": "pro"}' WHERE id = 2;
SELECT * FROM users WHERE id = 2;
UPDATE users SET level = 0 WHERE id = 3;
SELECT level FROM users WHERE id = 3;
UPDATE orders SET status = 'paid', note = 'updated' WHERE user_id = 7 RETURNING id, status;
SELECT * FROM orders WHERE id = 6;
SELECT status, count(*) FROM orders WHERE user_id = 7 GROUP BY status;
UPDATE orders SET status = (ARRAY['new', 'paid', 'shipped', 'cancelled'])[id % 4 + 1], note = CASE WHEN id % 10 = 0 THEN 'gift' END WHERE user_id = 7;
SELECT * FROM orders WHERE id = 6;
UPDATE numbers SET f8 = 'NaN', f4 = '-Infinity' WHERE id = 5 RETURNING f8, f4;
SELECT * FROM numbers WHERE id = 5;
UPDATE numbers SET f8 = -0.0, f4 = -0.0 WHERE id = 5;
SELECT * FROM numbers WHERE id = 5;
INSERT INTO sessions VALUES ('ffffffff-0000-4000-8000-000000000001', 1, '23:59:59.999999', '-1 mons +2 days', '00:00+14', '::1') RETURNING *;
SELECT * FROM sessions WHERE id = 'FFFFFFFF-0000-4000-8000-000000000001';
SELECT * FROM sessions WHERE id = $1; --@params ["ffffffff-0000-4000-8000-000000000001"]
DELETE FROM sessions WHERE id = 'ffffffff-0000-4000-8000-000000000001';
SELECT * FROM sessions WHERE id = $1; --@params ["ffffffff-0000-4000-8000-000000000001"]
INSERT INTO accounts VALUES (9, 1, 'new tenant', 0), (9, 2, NULL, NULL);
SELECT * FROM accounts WHERE tenant = 9 AND id = 2;
SELECT * FROM accounts WHERE tenant = 9 ORDER BY id;
UPDATE accounts SET id = 3 WHERE tenant = 9 AND id = 2;
SELECT * FROM accounts WHERE tenant = 9 AND id = 2;
SELECT * FROM accounts WHERE tenant = 9 AND id = 3;
DELETE FROM accounts WHERE tenant = 9;
SELECT count(*) FROM accounts WHERE tenant = 9;
INSERT INTO items (sku, title) VALUES ('sku-new', 'New') ON CONFLICT (sku) DO UPDATE SET title = 'Again' RETURNING sku, title, price;
SELECT * FROM items WHERE sku = 'sku-new';
INSERT INTO items (sku, title) VALUES ('sku-new', 'New') ON CONFLICT (sku) DO UPDATE SET title = 'Again' RETURNING sku, title, price;
SELECT * FROM items WHERE sku = 'sku-new';
DELETE FROM items WHERE sku = 'sku-new';
SELECT * FROM items WHERE sku = 'sku-new';
UPDATE kv SET n = n WHERE k = 'nosuch';
DELETE FROM kv WHERE k = 'nosuch';
UPDATE kv SET n = n / 0 WHERE k = 'k2';
SELECT * FROM kv WHERE k = 'k2';
UPDATE kv SET nosuch = 1 WHERE k = 'k2';
UPDATE kv SET v = upper(v) WHERE n <= 3;
SELECT * FROM kv WHERE k = 'k3';
SELECT k, v FROM kv WHERE n <= 3 ORDER BY k;
UPDATE kv SET v = lower(v) WHERE n <= 3;
SELECT * FROM kv WHERE k = 'k3';
-- reads after all of that
SELECT * FROM users WHERE id = 1;
SELECT * FROM users WHERE id = 2;
SELECT * FROM kv ORDER BY k;
SELECT count(*), sum(amount) FROM orders;
SELECT * FROM sessions ORDER BY id LIMIT 3;
SELECT * FROM numbers ORDER BY id;
