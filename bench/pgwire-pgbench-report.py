#!/usr/bin/env python3
"""Tables of bench/pgwire-pgbench.sh's rows (bench/results/pgbench-*.jsonl).

    bench/pgwire-pgbench-report.py RUN.jsonl                  # the run's table
    bench/pgwire-pgbench-report.py BEFORE.jsonl AFTER.jsonl   # each run's table, then the
                                                              # ratios of all runs side by side
    bench/pgwire-pgbench-report.py --check RUN.jsonl          # also exit 1 on a failed cell

A cell is (workload, protocol, clients); each round's figure is shown, separated by " / ",
ratios as the range over the rounds (each round's pgline cell divided by the same round's
origin or PgBouncer cell). "added p50" is a proxy's p50 minus the origin's p50 in the same round.
"""
import json
import sys
from collections import defaultdict

NAMES = {"tpcb": "pgbench TPC-B", "select1": "`select 1`", "txn10": "10-statement transaction",
         "cold": "`-S`, cold store", "coldx": "`-S`, cold store, extended",
         "coldw": "`-S`, cold store, writes beside",
         "warm": "`-S`, warm store"}


def load(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    cells, order = defaultdict(lambda: defaultdict(list)), []
    for r in rows:
        k = (r["cell"], r["protocol"], r["clients"])
        if k not in cells:
            order.append(k)
        cells[k][r["target"]].append(r)
    for k in cells:
        for t in cells[k]:
            cells[k][t].sort(key=lambda r: r["round"])
    return rows, cells, order


def each(rs, f):
    return " / ".join(f(r) for r in rs) if rs else "n/a"


def tps(r):
    return "{:,.0f}".format(r["tps"]) if r["tps"] is not None else "-"


def ms(v):
    return "%.3f" % v if v is not None else "-"


def span(xs, fmt):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "n/a"
    lo, hi = fmt(min(xs)), fmt(max(xs))
    return lo if lo == hi else "%s to %s" % (lo, hi) if lo.startswith("-") or hi.startswith("-") \
        else "%s-%s" % (lo, hi)


def ratios(a, b):
    return [x["tps"] / y["tps"] for x, y in zip(a, b) if x["tps"] and y["tps"]]


def added(a, o):
    return [x["p50_ms"] - y["p50_ms"] for x, y in zip(a, o)
            if x["p50_ms"] is not None and y["p50_ms"] is not None]


def cols(cells, k):
    return tuple(cells[k].get(t, []) for t in ("origin", "pgbouncer", "pgline"))


def run_table(path):
    rows, cells, order = load(path)
    label = rows[0].get("pgline", "?") if rows else "?"
    cpus = rows[0].get("server_cpus") if rows else None
    print(f"\n{path}: pgline = {label}; pgline and PgBouncer on CPUs {cpus or 'any (unpinned)'}")
    print("\n| workload | protocol | clients | origin tps | PgBouncer tps | pgline tps "
          "| pgline / PgBouncer | pgline / origin | p50 ms origin | p50 ms PgBouncer | p50 ms pgline "
          "| pgline store hits/misses |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rx = lambda v: "%.2fx" % v
    for k in order:
        cell, mode, c = k
        o, b, p = cols(cells, k)
        hm = ", ".join("%d/%d" % (r["store_hits"], r["store_misses"]) for r in p) or "n/a"
        print(f"| {NAMES.get(cell, cell)} | {mode} | {c} | {each(o, tps)} | {each(b, tps)} | "
              f"{each(p, tps)} | {span(ratios(p, b), rx)} | {span(ratios(p, o), rx)} | "
              f"{each(o, lambda r: ms(r['p50_ms']))} | {each(b, lambda r: ms(r['p50_ms']))} | "
              f"{each(p, lambda r: ms(r['p50_ms']))} | {hm} |")
    print("\nPgBouncer n/a: 1.18 has no prepared statements in transaction mode "
          "(1.21+: max_prepared_statements).")
    return rows, cells, order


def compare(runs):
    print("\n| workload | protocol | clients | "
          + " | ".join(f"pgline / PgBouncer ({i + 1}) | pgline / origin ({i + 1}) | "
                       f"added p50 ms PgBouncer / pgline ({i + 1})" for i in range(len(runs)))
          + " |")
    print("|---|---|---:|" + "---:|---:|---:|" * len(runs))
    order = []
    for _, cells, o in runs:
        order += [k for k in o if k not in order]
    rx = lambda v: "%.2fx" % v
    mx = lambda v: "%.3f" % v
    for k in order:
        cell, mode, c = k
        parts = []
        for _, cells, _ in runs:
            if k not in cells:
                parts += ["-", "-", "-"]
                continue
            o, b, p = cols(cells, k)
            parts += [span(ratios(p, b), rx) if b else "n/a", span(ratios(p, o), rx),
                      f"{span(added(b, o), mx) if b else 'n/a'} / {span(added(p, o), mx)}"]
        print(f"| {NAMES.get(cell, cell)} | {mode} | {c} | " + " | ".join(parts) + " |")
    for i, (path, _, _) in enumerate(runs):
        print(f"({i + 1}) {path}")


def main(argv):
    check = "--check" in argv
    paths = [a for a in argv if a != "--check"]
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    runs, bad = [], []
    for path in paths:
        rows, cells, order = run_table(path)
        runs.append((path, cells, order))
        print(f"rows: {len(rows)} in {path}")
        if not rows:
            bad.append(f"{path}: no rows")
        bad += [f"{r['cell']} {r['target']} {r['protocol']} c={r['clients']} r{r['round']}: "
                f"{r['error']}" for r in rows if r.get("error")]
    if len(runs) > 1:
        compare(runs)
    if bad:
        print("pgwire-pgbench: " + "; ".join(bad), file=sys.stderr)
        return 1 if check else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
