-- The table bench/pgwire-write-read.pgbench writes and reads (1,000 rows, cached by pgline).
SET client_min_messages = warning;
CREATE TABLE IF NOT EXISTS write_read (id int PRIMARY KEY, n int8 NOT NULL);
INSERT INTO write_read SELECT g, 0 FROM generate_series(1, 1000) g ON CONFLICT DO NOTHING;
