"""valkey-glide's cluster client against a pgline fleet (cluster_e2e.rs), beside redis-py's.

Usage: cluster_glide.py HOST PORT ROWS_FILE {primaries|replicas}
ROWS_FILE: one `id<TAB>json` line per row of table `t` (the origin's row_to_json). Connects to one
node; glide learns the topology from CLUSTER SLOTS itself (RESP3), then every row is read with
GET (`replicas`: ReadFrom.PREFER_REPLICA, so glide sends READONLY and reads from the shards'
replicas), a missing id, and all rows again with one MGET, which glide splits by slot. Prints
`ok gets=N mgets=M nodes=K` (K: the nodes of CLUSTER NODES not flagged `fail`) or exits 1 at the first wrong answer.
"""
import asyncio
import sys

from glide import (
    GlideClusterClient,
    GlideClusterClientConfiguration,
    NodeAddress,
    ReadFrom,
)


async def main(host, port, rows_file, mode):
    rows = {}
    with open(rows_file, "rb") as f:
        for line in f:
            k, v = line.rstrip(b"\n").split(b"\t", 1)
            rows[int(k)] = v
    read_from = ReadFrom.PREFER_REPLICA if mode == "replicas" else ReadFrom.PRIMARY
    config = GlideClusterClientConfiguration(
        [NodeAddress(host, port)], read_from=read_from, request_timeout=5000
    )
    client = await GlideClusterClient.create(config)
    for i, want in rows.items():
        got = await client.get(f"t:{i}")
        if got != want:
            print(f"GET t:{i}: {got!r} != {want!r}")
            return 1
    if await client.get("t:999999") is not None:
        print("GET of a missing row is not nil")
        return 1
    keys = [f"t:{i}" for i in rows]
    got = await client.mget(keys)
    for k, g in zip(keys, got):
        if g != rows[int(k[2:])]:
            print(f"MGET {k}: {g!r}")
            return 1
    nodes = await client.custom_command(["CLUSTER", "NODES"])
    if isinstance(nodes, dict):  # one answer per node when glide routes it to all
        nodes = next(iter(nodes.values()))
    # Nodes not flagged as failed (the flags are the third field).
    count = len(
        [l for l in nodes.decode().splitlines() if l.strip() and "fail" not in l.split()[2]]
    )
    await client.close()
    print(f"ok gets={len(rows)} mgets={len(keys)} nodes={count}")
    return 0


sys.exit(asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])))
