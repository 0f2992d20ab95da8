-- Demo data for pgline: a few thousand users and their orders.
DROP TABLE IF EXISTS orders;
DROP TABLE IF EXISTS users;
CREATE TABLE users (
    id      int8 PRIMARY KEY,
    name    text NOT NULL,
    email   text NOT NULL,
    plan    text NOT NULL DEFAULT 'free',
    credits numeric(12, 2) NOT NULL DEFAULT 0,
    active  bool NOT NULL DEFAULT true,
    tags    text[] NOT NULL DEFAULT '{}',
    created timestamptz NOT NULL DEFAULT now()
);
INSERT INTO users (id, name, email, plan, credits, tags, created)
SELECT g, 'User ' || g, 'user' || g || '@example.com',
       (ARRAY['free', 'pro', 'team'])[1 + g % 3], round((g * 7.31)::numeric % 1000, 2),
       ARRAY['cohort-' || (g % 12)], '2025-01-01'::timestamptz + g * interval '37 minutes'
FROM generate_series(1, 10000) g;
CREATE TABLE orders (
    tenant_id int4 NOT NULL,
    id        int4 NOT NULL,
    user_id   int8 NOT NULL REFERENCES users (id),
    total     numeric(12, 2) NOT NULL,
    status    text NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
INSERT INTO orders
SELECT 1 + g % 20, g, 1 + g % 10000, round((g * 3.7)::numeric % 500, 2),
       (ARRAY['new', 'paid', 'shipped'])[1 + g % 3]
FROM generate_series(1, 50000) g;
