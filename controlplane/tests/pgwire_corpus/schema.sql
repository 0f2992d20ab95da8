-- The differential suite's schema and data (deterministic: no now(), random() or sequences in
-- the rows the corpus reads). Every table has a primary key, so pgline caches all of them.
CREATE DOMAIN short_name AS varchar(16);
CREATE DOMAIN positive AS int CHECK (VALUE > 0);
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');

CREATE TABLE users (
    id int PRIMARY KEY, name text NOT NULL, email varchar(50), balance numeric(12,2),
    score float8, active bool, created timestamptz, birthday date, tags text[], meta jsonb,
    avatar bytea, nick short_name, level positive, feeling mood);
INSERT INTO users
SELECT g, 'user ' || g, CASE WHEN g % 7 = 0 THEN NULL ELSE 'u' || g || '@example.com' END,
       (g * 12.5)::numeric(12,2), CASE WHEN g % 5 = 0 THEN NULL ELSE g / 3.0 END, g % 2 = 0,
       timestamptz '2024-01-01 00:00:00+00' + g * interval '37 minutes',
       date '1990-01-01' + g * 11, ARRAY['t' || (g % 3), 'x'],
       jsonb_build_object('plan', CASE WHEN g % 2 = 0 THEN 'pro' ELSE 'free' END, 'n', g),
       decode(lpad(to_hex(g), 4, '0'), 'hex'), 'nick' || g, g,
       (ARRAY['sad', 'ok', 'happy'])[g % 3 + 1]::mood
FROM generate_series(1, 60) g;
ALTER TABLE users ADD COLUMN dropped_later int;
ALTER TABLE users DROP COLUMN dropped_later;

CREATE TABLE orders (
    id int8 PRIMARY KEY, user_id int NOT NULL REFERENCES users(id), amount numeric(10,2),
    status text NOT NULL, placed_at timestamp, note text);
INSERT INTO orders
SELECT g, (g % 60) + 1, (g * 3.25)::numeric(10,2),
       (ARRAY['new', 'paid', 'shipped', 'cancelled'])[g % 4 + 1],
       timestamp '2024-02-01 08:00' + g * interval '5 hours',
       CASE WHEN g % 10 = 0 THEN 'gift' END
FROM generate_series(1, 300) g;

CREATE TABLE items (
    sku text PRIMARY KEY, title varchar(40), price numeric, qty int2, weight float4,
    attrs json, ids int[], code char(4));
INSERT INTO items
SELECT 'sku-' || lpad(g::text, 3, '0'), 'Item ' || g, g * 1.1, (g * 3)::int2,
       (g / 7.0)::float4, json_build_object('color', (ARRAY['red', 'blue'])[g % 2 + 1]),
       ARRAY[g, g + 1, NULL], 'c' || (g % 10)
FROM generate_series(1, 40) g;

CREATE TABLE sessions (
    id uuid PRIMARY KEY, user_id int, started time, dur interval, at_tz timetz, ip inet);
INSERT INTO sessions
SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, g % 60 + 1,
       time '00:00' + g * interval '17 minutes', g * interval '1 day 3 hours 7 seconds',
       timetz '12:00+02' + g * interval '1 minute', ('10.0.0.' || g)::inet
FROM generate_series(1, 30) g;

CREATE TABLE numbers (
    id int PRIMARY KEY, f8 float8, f4 float4, n numeric, i2 int2, i8 int8);
INSERT INTO numbers VALUES
    (1, 'NaN', 'NaN', 'NaN', 0, 0),
    (2, 'Infinity', 'Infinity', 1.5, 32767, 9223372036854775807),
    (3, '-Infinity', '-Infinity', -0.000001, -32768, -9223372036854775808),
    (4, 0.1, 0.1, 123456789012345678901234567890.123456789, 1, 1),
    (5, -0.0, -0.0, 0, 2, 2),
    (6, 1e300, 3.4e38, 1e-20, 3, 3),
    (7, NULL, NULL, NULL, NULL, NULL);

CREATE TABLE accounts (
    tenant int, id int, name text, balance numeric(12,2), PRIMARY KEY (tenant, id));
INSERT INTO accounts SELECT t, i, 'acct ' || t || '/' || i, t * 100 + i
FROM generate_series(1, 3) t, generate_series(1, 10) i;

CREATE TABLE kv (k text PRIMARY KEY, v text, n int);
INSERT INTO kv SELECT 'k' || g, 'v' || g, g FROM generate_series(1, 20) g;

CREATE SCHEMA app;
CREATE TABLE app.profiles (user_id int PRIMARY KEY, bio text, "Display Name" varchar(30));
INSERT INTO app.profiles SELECT g, CASE WHEN g % 2 = 0 THEN 'bio ' || g END, 'D' || g
FROM generate_series(1, 10) g;
