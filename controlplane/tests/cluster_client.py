"""redis-py's RedisCluster against a pgline fleet (cluster_e2e.rs).

Usage: cluster_client.py HOST PORT ROWS_FILE {primaries|replicas}
ROWS_FILE: one `id<TAB>json` line per row of table `t` (the origin's row_to_json). Connects to one
node, learns the topology from CLUSTER SLOTS as redis-py does, then reads every row with GET
(`replicas`: with READONLY from the shards' replicas), a missing id, and all rows again with MGET
split by slot (mget_nonatomic). Prints `ok gets=N mgets=M nodes=K` or exits 1 at the first
wrong answer.
"""
import sys

from redis.cluster import RedisCluster

host, port, rows_file, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = {}
with open(rows_file, "rb") as f:
    for line in f:
        k, v = line.rstrip(b"\n").split(b"\t", 1)
        rows[int(k)] = v

rc = RedisCluster(host=host, port=port, read_from_replicas=(mode == "replicas"))
nodes = rc.get_nodes()
for i, want in rows.items():
    got = rc.get(f"t:{i}")
    if got != want:
        print(f"GET t:{i}: {got!r} != {want!r}")
        sys.exit(1)
if rc.get("t:999999") is not None:
    print("GET of a missing row is not nil")
    sys.exit(1)
keys = [f"t:{i}" for i in rows]
got = rc.mget_nonatomic(keys)
for k, g in zip(keys, got):
    if g != rows[int(k[2:])]:
        print(f"MGET {k}: {g!r}")
        sys.exit(1)
print(f"ok gets={len(rows)} mgets={len(keys)} nodes={len(nodes)}")
