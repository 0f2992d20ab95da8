#!/usr/bin/env python3
"""The psycopg 3 client of pgline's pgwire differential suite.

Runs controlplane/tests/pgwire_corpus/corpus.sql (format in its header) in lockstep against the
origin and pgline over the same database: a read runs on both and the answers are compared
(the raw result: RowDescription fields, every value's bytes and the CommandComplete tag; the
same as psycopg loads it: description, Python values, statusmessage/rowcount; errors by
SQLSTATE and diagnostics), once with a text cursor and once with a binary cursor; a write runs once
through pgline, and on the origin in a transaction that is rolled back. Each read runs twice
through pgline (a cache miss, then likely a hit), both compared. One session per side.

psycopg prepares a statement server-side after it ran prepare_threshold (5) times, so repeated
corpus lines also go through named prepared statements.

Usage: pgwire_diff.py --origin DSN --pgline DSN --corpus FILE [--json]
Exit 0: no differences; 1: differences (printed, one per line; JSON with --json); 2: failure.
"""
import argparse
import json
import re
import sys

import psycopg


def parse_corpus(path):
    out = []
    in_block = False
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("--"):
                continue
            params = []
            if "--@params" in line:
                line, _, js = line.rpartition("--@params")
                line = line.strip()
                params = json.loads(js)
            head = line.split(None, 1)[0].upper().rstrip(";")
            if head in ("BEGIN", "START"):
                in_block = True
            elif head in ("COMMIT", "END", "ABORT") or (
                    head == "ROLLBACK" and not line.upper().startswith("ROLLBACK TO")):
                in_block = False
            out.append({"line": n, "sql": line, "params": params,
                        "write": head in ("INSERT", "UPDATE", "DELETE"),
                        "control": head in ("BEGIN", "START", "COMMIT", "END", "ROLLBACK",
                                            "ABORT", "SAVEPOINT", "RELEASE"),
                        "in_block": in_block})
    return out


def to_psycopg(sql, params):
    """$n placeholders to %s (psycopg's), with literal % doubled; params reordered to match."""
    if not params:
        return sql, None
    order = []

    def sub(m):
        order.append(int(m.group(1)) - 1)
        return "%s"

    text = re.sub(r"\$(\d+)", sub, sql.replace("%", "%%"))
    return text, [params[i] for i in order]


def value(v):
    if isinstance(v, memoryview):
        v = bytes(v)
    return repr(v)


def outcome(conn, sql, params, binary):
    try:
        cur = conn.cursor(binary=binary)
        cur.execute(sql, params)
        desc = None
        rows = None
        res = cur.pgresult
        raw = None
        if res is not None:
            n = res.nfields
            raw = ([(res.fname(i), res.ftable(i), res.ftablecol(i), res.ftype(i), res.fsize(i),
                     res.fmod(i), res.fformat(i)) for i in range(n)],
                   [[res.get_value(r, c) for c in range(n)] for r in range(res.ntuples)],
                   res.command_status)
        if cur.description is not None:
            desc = [(c.name, c.type_code, c.display_size, c.internal_size, c.precision,
                     c.scale) for c in cur.description]
            rows = [[value(v) for v in row] for row in cur.fetchall()]
        return (f"desc {desc} rows {rows} status {cur.statusmessage!r} rowcount {cur.rowcount} "
                f"raw {raw!r}")
    except psycopg.Error as e:
        d = e.diag
        return (f"ERROR {e.sqlstate} {d.severity_nonlocalized} {d.message_primary!r} "
                f"detail={d.message_detail!r} hint={d.message_hint!r} "
                f"position={d.statement_position!r} class={type(e).__name__}")


def rolled_back(conn, sql, params):
    conn.execute("BEGIN")
    try:
        return outcome(conn, sql, params, False)
    finally:
        conn.execute("ROLLBACK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--origin", required=True)
    ap.add_argument("--pgline", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    corpus = parse_corpus(args.corpus)
    origin = psycopg.connect(args.origin, autocommit=True)
    pgline = psycopg.connect(args.pgline, autocommit=True)
    diffs = 0
    runs = 0
    for s in corpus:
        sql, params = to_psycopg(s["sql"], s["params"])
        if s["control"]:
            pairs = [("psycopg-text", outcome(origin, sql, params, False),
                      outcome(pgline, sql, params, False))]
        elif s["write"]:
            pairs = [("psycopg", rolled_back(origin, sql, params),
                      outcome(pgline, sql, params, False))]
        else:
            pairs = []
            for b in (False, True):
                kind = f"psycopg-{'binary' if b else 'text'}"
                expected = outcome(origin, sql, params, b)
                pairs.append((kind, expected, outcome(pgline, sql, params, b)))
                if not s["in_block"]:
                    pairs.append((kind + "-repeat", expected, outcome(pgline, sql, params, b)))
        for client, expected, got in pairs:
            runs += 1
            if expected == got:
                continue
            diffs += 1
            d = {"client": client, "line": s["line"], "sql": s["sql"],
                 "expected": expected, "got": got}
            if args.json:
                print(json.dumps(d), flush=True)
            else:
                print(f"[{client}] corpus.sql:{s['line']}: {s['sql']}\n"
                      f"  expected (origin): {expected}\n  got (pgline):      {got}", flush=True)
    print(f"pgwire_diff.py: {len(corpus)} statements, {runs} comparisons, {diffs} differences",
          file=sys.stderr)
    return 1 if diffs else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # a harness failure, not a difference
        print(f"pgwire_diff.py: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
