"""Reads/s of a hot key set through redis-py, with and without its client-side cache (issue 18).

Run by bench/tracking.sh, one cell at a time:

    tracking.py read  --server pgline|valkey --port P --dsn DSN --cache 0|1 --seconds S ...
    tracking.py write --server pgline|valkey --port P --dsn DSN --rate R --seconds S ...

`read` reads random keys of the hot set for S seconds with one redis-py client (RESP3), then
checks every hot key against the origin and prints one JSON line. Against pgline a GET is the
whole read: pgline fills misses from the origin and its WAL apply invalidates. Against Valkey it
is cache-aside code: GET, and on a miss the row from the origin (psycopg) and SET.

`write` updates random hot rows at the origin at R per second. Against Valkey it also DELs the
key after each commit, as cache-aside code must: Valkey invalidates client caches only on its
own writes.

redis-py 5.2 enables its client cache only when the server says it is "redis" in HELLO; for
Valkey the check is pointed at "valkey" (`CacheProxyConnection.DEFAULT_SERVER_NAME`), nothing
else changes.
"""

import argparse
import json
import random
import sys
import time

import psycopg
import redis
from redis.cache import CacheConfig
from redis.connection import CacheProxyConnection

ROW_SQL = "SELECT row_to_json(items)::text FROM items WHERE id = %s"


def key(i):
    return f"items:{i}"


def client(args, cache):
    if args.server == "valkey":
        CacheProxyConnection.DEFAULT_SERVER_NAME = "valkey"
    kwargs = {"port": args.port, "protocol": 3}
    if cache:
        kwargs["cache_config"] = CacheConfig(max_size=args.hot * 2)
    return redis.Redis(**kwargs)


def server_reads(port):
    """GETs the server has answered (hits and misses), from its INFO."""
    stats = redis.Redis(port=port).info("stats")
    return stats["keyspace_hits"] + stats["keyspace_misses"]


def read(args):
    r = client(args, args.cache)
    origin = psycopg.connect(args.dsn, autocommit=True)
    rng = random.Random(args.seed)
    hot = args.hot
    reads = fills = 0
    served_before = server_reads(args.port)
    deadline = time.monotonic() + args.seconds
    began = time.monotonic()
    while True:
        # Check the clock every 256 reads: time.monotonic() would be a fifth of a cached read.
        for _ in range(256):
            k = key(rng.randint(1, hot))
            v = r.get(k)
            if v is None:
                if args.server == "pgline":
                    sys.exit(f"pgline returned nil for {k}")
                row = origin.execute(ROW_SQL, (int(k[6:]),)).fetchone()
                r.set(k, row[0])
                fills += 1
            reads += 1
        if time.monotonic() >= deadline:
            break
    elapsed = time.monotonic() - began
    # Reads the server answered; the rest came from the client's cache.
    served = server_reads(args.port) - served_before
    # After the writers stop (the caller waits for the last invalidation): every hot key read
    # through this client must equal the origin's row.
    time.sleep(args.settle)
    stale = 0
    for i in range(1, hot + 1):
        v = r.get(key(i))
        want = origin.execute(ROW_SQL, (i,)).fetchone()[0]
        if v is not None and json.loads(v)["v"] != json.loads(want)["v"]:
            stale += 1
    print(
        json.dumps(
            {
                "server": args.server,
                "client_cache": bool(args.cache),
                "reads": reads,
                "seconds": round(elapsed, 3),
                "reads_per_s": round(reads / elapsed),
                "origin_fills": fills,
                "local_share": round(1 - served / reads, 4),
                "stale_after_settle": stale,
            }
        )
    )


def write(args):
    r = redis.Redis(port=args.port) if args.server == "valkey" else None
    rng = random.Random(args.seed + 1)
    writes = 0
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        began = time.monotonic()
        while time.monotonic() - began < args.seconds:
            i = rng.randint(1, args.hot)
            conn.execute("UPDATE items SET v = v + 1 WHERE id = %s", (i,))
            if r is not None:
                r.delete(key(i))
            writes += 1
            pause = began + writes / args.rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
    print(json.dumps({"server": args.server, "writes": writes}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["read", "write"])
    p.add_argument("--server", choices=["pgline", "valkey"], required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dsn", required=True)
    p.add_argument("--hot", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--cache", type=int, default=0)
    p.add_argument("--rate", type=float, default=50)
    p.add_argument("--settle", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=18)
    args = p.parse_args()
    read(args) if args.mode == "read" else write(args)


if __name__ == "__main__":
    main()
