"""Stale probe through client-side caches (issue 18), run by client_tracking.rs.

Writers update random rows of `items` at the origin (psycopg) and note when each commit returned.
Readers read a hot set through redis-py's client cache (RESP3, CLIENT TRACKING in default mode)
and through valkey-glide's server-assisted cache (CLIENT TRACKING BCAST). A read is stale when a
newer version of its row had committed more than BOUND before the read began. After the writers
stop, every hot row read through each cache must equal the origin's.

Prints, per client: reads, stale, the largest age of an outdated read (how long a newer version
had been committed when a read still returned the old one: the invalidation delay as the
application sees it), and the share of reads answered from the local cache.
"""

import argparse
import asyncio
import bisect
import json
import random
import threading
import time

import psycopg
import redis
from redis.cache import CacheConfig

BOUND = 1.0  # seconds
HOT = 50


class Versions:
    """Committed versions per row: (v, time the commit returned), in commit order."""

    def __init__(self):
        self.lock = threading.Lock()
        self.rows = {}

    def committed(self, row, v, at):
        with self.lock:
            self.rows.setdefault(row, ([], []))
            vs, ts = self.rows[row]
            vs.append(v)
            ts.append(at)

    def judge(self, row, v_read, began):
        """(stale, age): age is how long the first version newer than v_read had been committed
        when the read began (0 if none had)."""
        with self.lock:
            vs, ts = self.rows.get(row, ([], []))
            i = bisect.bisect_right(vs, v_read)
            if i >= len(vs) or ts[i] >= began:
                return False, 0.0
            age = began - ts[i]
            return age > BOUND, age


def writer(dsn, versions, stop, count):
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            row = random.randint(1, HOT)
            v = conn.execute(
                "UPDATE items SET v = v + 1 WHERE id = %s RETURNING v", (row,)
            ).fetchone()[0]
            versions.committed(row, v, time.monotonic())
            count[0] += 1
            time.sleep(0.002)


def value(raw):
    if raw is None:
        return None
    if isinstance(raw, bytes):
        raw = raw.decode()
    return json.loads(raw)["v"]


def origin_values(dsn):
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT id, v FROM items WHERE id <= %s", (HOT,)).fetchall())


def info_commands(host, port):
    r = redis.Redis(host=host, port=port)
    n = int(r.info("stats")["total_commands_processed"])
    r.close()
    return n


def report(name, reads, stale, worst, commands_before, commands_after, final_stale):
    server = max(commands_after - commands_before, 0)
    local = 1 - min(server / reads, 1) if reads else 0
    print(
        f"{name}: stale {stale + final_stale} (during {stale}, at the end {final_stale}), "
        f"reads {reads}, largest age of an outdated read {worst * 1000:.1f} ms, "
        f"served from the local cache {local:.1%}"
    )


def read_loop(get, versions, stop):
    """Reads random hot rows through `get` until `stop`; returns (reads, stale, worst age)."""
    reads = stale = 0
    worst = 0.0
    while not stop.is_set():
        row = random.randint(1, HOT)
        began = time.monotonic()
        v = value(get(f"items:{row}"))
        bad, age = versions.judge(row, v, began)
        stale += bad
        worst = max(worst, age)
        reads += 1
    return reads, stale, worst


def bump_all(dsn):
    """Changes every hot row once more and returns the origin's values."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE items SET v = v + 1 WHERE id <= %s", (HOT,))
    return origin_values(dsn)


def start_writers(args, versions, stop, count):
    writers = [
        threading.Thread(target=writer, args=(args.dsn, versions, stop, count))
        for _ in range(2)
    ]
    for w in writers:
        w.start()
    threading.Timer(args.seconds, stop.set).start()
    return writers


def run_redis_py(args, versions):
    r = redis.Redis(host=args.host, port=args.port, protocol=3, cache_config=CacheConfig())
    stop, count = threading.Event(), [0]
    before = info_commands(args.host, args.port)
    writers = start_writers(args, versions, stop, count)
    reads, stale, worst = read_loop(r.get, versions, stop)
    for w in writers:
        w.join()
    after = info_commands(args.host, args.port)
    # Every hot row in the cache, changed once more: after the bound the cache has the change.
    for row in range(1, HOT + 1):
        r.get(f"items:{row}")
    want = bump_all(args.dsn)
    time.sleep(BOUND)
    final_stale = sum(1 for row in want if value(r.get(f"items:{row}")) != want[row])
    r.close()
    print(f"redis-py: {count[0]} updates committed")
    report("redis-py", reads, stale, worst, before, after, final_stale)


async def run_glide(args, versions):
    from glide import (
        ClientSideCache,
        GlideClient,
        GlideClientConfiguration,
        NodeAddress,
        ProtocolVersion,
    )

    cache = ClientSideCache.create(max_cache_kb=4096, entry_ttl_ms=0, server_assisted=True)
    client = await GlideClient.create(
        GlideClientConfiguration(
            [NodeAddress(args.host, args.port)],
            protocol=ProtocolVersion.RESP3,
            client_side_cache=cache,
            request_timeout=5000,
        )
    )
    stop, count = threading.Event(), [0]
    before = info_commands(args.host, args.port)
    writers = start_writers(args, versions, stop, count)
    reads = stale = 0
    worst = 0.0
    while not stop.is_set():
        row = random.randint(1, HOT)
        began = time.monotonic()
        v = value(await client.get(f"items:{row}"))
        bad, age = versions.judge(row, v, began)
        stale += bad
        worst = max(worst, age)
        reads += 1
    for w in writers:
        w.join()
    after = info_commands(args.host, args.port)
    for row in range(1, HOT + 1):
        await client.get(f"items:{row}")
    want = bump_all(args.dsn)
    await asyncio.sleep(BOUND)
    final_stale = 0
    for row in range(1, HOT + 1):
        final_stale += value(await client.get(f"items:{row}")) != want[row]
    await client.close()
    print(f"glide: {count[0]} updates committed")
    report("glide", reads, stale, worst, before, after, final_stale)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--seconds", type=float, default=6)
    args = ap.parse_args()
    versions = Versions()
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        for row, v in conn.execute("SELECT id, v FROM items").fetchall():
            versions.committed(row, v, time.monotonic() - 3600)
    run_redis_py(args, versions)
    asyncio.run(run_glide(args, versions))


if __name__ == "__main__":
    main()
