//! Cluster mode on RESP (issue 17): the hash slot of a key, the fleet's topology as a core sees
//! it, where a key's slot is served, and the `CLUSTER` replies Redis Cluster clients read.
//!
//! Purpose: a fleet of appliances looks to a client like a Redis Cluster. Every key hashes to
//! one of 16,384 slots (CRC16 of the key, or of its `{hash tag}`); each slot belongs to one
//! shard; a shard is served by a primary node and its replicas, every one of them a pgline with
//! its own store tailing the same origin. A node answers keys of its own shard's slots and
//! redirects the others (`-MOVED <slot> <ip>:<port>`), exactly as a Redis Cluster node does, so
//! cluster clients (redis-py `RedisCluster`, valkey-glide, lettuce, go-redis, Jedis) route by
//! themselves.
//!
//! Failover without an election: all nodes of a shard are equivalent caches of one origin, so
//! a shard's acting primary is simply its first healthy node in configured order. When the
//! configured primary is marked failed (by the control plane's health checks), the next node
//! is reported as the shard's master in `CLUSTER SLOTS`/`SHARDS`/`NODES`, answers without
//! `READONLY`, and is where `-MOVED` points. Nothing is promoted or copied: its store is warm
//! from its own reads.
//!
//! Place on the path: the control plane builds a [`Topology`] from its configuration and
//! health checks and publishes it through [`TopologyCell`] (in `plane::Shared`); each core
//! picks up a new one with one atomic load per turn, like the key space. `engine::execute`
//! routes every keyed command through [`Topology::route`] before it reads the store: one CRC16
//! per key and one table load, only in cluster mode.
//!
//! Invariants: a topology is immutable once built; every assigned slot names a shard with at
//! least one node; node and shard ids are unique and contain no whitespace (they appear in
//! `CLUSTER NODES` lines).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::resp::{
    compose_array_header, compose_bulk, compose_error, compose_integer, compose_map_header,
    compose_verbatim, Protocol,
};

/// Hash slots of the key space.
pub const SLOTS: usize = 16_384;
/// `slot_shard` entry of a slot no shard serves.
const UNASSIGNED: u16 = u16::MAX;

/// CRC16/XMODEM (polynomial 0x1021, initial value 0), the checksum Redis Cluster hashes keys
/// with, one table lookup per byte.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ b)]
    })
}

/// The hash slot of `key`: CRC16 of the key modulo 16,384, or of its hash tag, the bytes between
/// the first `{` and the first `}` after it when there is at least one byte between them (so
/// `orders:{7}:1001` and `customers:{7}:7` share a slot; `a{}b` hashes whole).
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) & (SLOTS as u16 - 1)
}

/// The key a tagged key names: `orders:{7}:1001` names the row `orders:7:1001`. The braces of
/// the hash tag that [`key_slot`] hashes by are routing only and are removed (into `buf`, reused);
/// the tag's bytes stay. A key without a tag is returned as it is.
pub fn untag<'k>(key: &'k [u8], buf: &'k mut Vec<u8>) -> &'k [u8] {
    let Some(open) = memchr::memchr(b'{', key) else {
        return key;
    };
    let Some(close) = memchr::memchr(b'}', &key[open + 1..]).filter(|&c| c > 0) else {
        return key;
    };
    let close = open + 1 + close;
    buf.clear();
    buf.extend_from_slice(&key[..open]);
    buf.extend_from_slice(&key[open + 1..close]);
    buf.extend_from_slice(&key[close + 1..]);
    buf
}

/// One node of the fleet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    /// 40 hex digits, as Redis node ids are (the control plane derives it from the node's name).
    pub id: Box<str>,
    /// The name it was configured with, reported as its hostname.
    pub name: Box<str>,
    /// Where clients reach its RESP port.
    pub ip: Box<str>,
    pub port: u16,
    /// Answering its health check (a node always counts itself healthy).
    pub healthy: bool,
}

/// A set of slots and the nodes that serve them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterShard {
    /// 40 hex digits (`CLUSTER MYSHARDID`).
    pub id: Box<str>,
    /// Inclusive slot ranges, sorted, not overlapping.
    pub ranges: Vec<(u16, u16)>,
    /// Indexes into the topology's nodes, the configured primary first.
    pub nodes: Vec<usize>,
}

/// Why a topology cannot be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyError(pub String);

impl std::fmt::Display for TopologyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TopologyError {}

/// The fleet as one node sees it.
#[derive(Debug)]
pub struct Topology {
    nodes: Vec<ClusterNode>,
    shards: Vec<ClusterShard>,
    /// This node's index in `nodes`, and its shard's index in `shards`.
    me: usize,
    my_shard: usize,
    /// Shard index of every slot ([`UNASSIGNED`] if none).
    slot_shard: Box<[u16]>,
    /// Bumped by the control plane with every change (`cluster_current_epoch`).
    epoch: u64,
}

/// Where a keyed command goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// This node serves the slot.
    Serve,
    /// Another node does: `-MOVED slot ip:port` to that node (index into the nodes).
    Moved { slot: u16, node: usize },
    /// The keys of one command hash to different slots.
    CrossSlot,
    /// No shard serves the slot.
    Unassigned,
}

impl Topology {
    /// A topology of `shards` over `nodes`, seen by node `me`. Checks that ids are unique and
    /// printable without spaces, that ranges are within the slots and do not overlap, that every
    /// shard has nodes and that every node is in exactly one shard.
    pub fn new(
        nodes: Vec<ClusterNode>,
        shards: Vec<ClusterShard>,
        me: usize,
        epoch: u64,
    ) -> Result<Topology, TopologyError> {
        let err = |m: String| Err(TopologyError(m));
        if me >= nodes.len() {
            return err(format!("node {me} of {}", nodes.len()));
        }
        if shards.len() >= usize::from(UNASSIGNED) {
            return err(format!("{} shards", shards.len()));
        }
        let word = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic());
        let mut ids: Vec<&str> = nodes.iter().map(|n| &*n.id).collect();
        ids.extend(shards.iter().map(|s| &*s.id));
        if let Some(bad) = ids.iter().find(|id| !word(id)) {
            return err(format!("id {bad:?}: empty or not printable"));
        }
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return err(format!("id {} used twice", w[0]));
        }
        if let Some(n) = nodes.iter().find(|n| !word(&n.ip) || !word(&n.name)) {
            return err(format!(
                "node {}: empty or unprintable address or name",
                n.name
            ));
        }
        let mut shard_of = vec![None; nodes.len()];
        let mut slot_shard = vec![UNASSIGNED; SLOTS].into_boxed_slice();
        for (si, shard) in shards.iter().enumerate() {
            if shard.nodes.is_empty() {
                return err(format!("shard {} has no node", shard.id));
            }
            for &n in &shard.nodes {
                match shard_of.get_mut(n) {
                    None => return err(format!("shard {}: node {n} unknown", shard.id)),
                    Some(Some(_)) => return err(format!("node {n} is in two shards")),
                    Some(s) => *s = Some(si),
                }
            }
            for &(lo, hi) in &shard.ranges {
                if lo > hi || usize::from(hi) >= SLOTS {
                    return err(format!("shard {}: slot range {lo}-{hi}", shard.id));
                }
                for slot in &mut slot_shard[usize::from(lo)..=usize::from(hi)] {
                    if *slot != UNASSIGNED {
                        return err(format!("slot range {lo}-{hi} served by two shards"));
                    }
                    *slot = si as u16;
                }
            }
        }
        let Some(my_shard) = shard_of[me] else {
            return err(format!("node {} is in no shard", nodes[me].name));
        };
        if let Some(i) = shard_of.iter().position(Option::is_none) {
            return err(format!("node {} is in no shard", nodes[i].name));
        }
        let mut nodes = nodes;
        nodes[me].healthy = true;
        Ok(Topology {
            nodes,
            shards,
            me,
            my_shard,
            slot_shard,
            epoch,
        })
    }

    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    pub fn shards(&self) -> &[ClusterShard] {
        &self.shards
    }

    pub fn me(&self) -> &ClusterNode {
        &self.nodes[self.me]
    }

    /// The control plane's change counter (`cluster_current_epoch`).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether this node serves `slot` (as acting primary, or as a replica of its shard): its
    /// store should hold only keys of such slots.
    pub fn owns(&self, slot: u16) -> bool {
        self.slot_shard.get(usize::from(slot)).copied() == Some(self.my_shard as u16)
    }

    /// The node that answers for `shard` without `READONLY`: its first healthy node in
    /// configured order, or the configured primary when none is healthy.
    fn acting_primary(&self, shard: &ClusterShard) -> usize {
        shard
            .nodes
            .iter()
            .copied()
            .find(|&n| self.nodes[n].healthy)
            .unwrap_or(shard.nodes[0])
    }

    /// Where a command on `keys` goes, for a connection in `READONLY` mode or not.
    pub fn route<'k>(&self, mut keys: impl Iterator<Item = &'k [u8]>, readonly: bool) -> Route {
        let Some(first) = keys.next() else {
            return Route::Serve;
        };
        let slot = key_slot(first);
        if keys.any(|k| key_slot(k) != slot) {
            return Route::CrossSlot;
        }
        let Some(&si) = self.slot_shard.get(usize::from(slot)) else {
            return Route::Unassigned;
        };
        let Some(shard) = self.shards.get(usize::from(si)) else {
            return Route::Unassigned;
        };
        let acting = self.acting_primary(shard);
        if usize::from(si) == self.my_shard && (acting == self.me || readonly) {
            Route::Serve
        } else {
            Route::Moved { slot, node: acting }
        }
    }

    /// The error reply of a route other than [`Route::Serve`].
    pub fn compose_redirect(&self, route: Route, out: &mut Vec<u8>) {
        match route {
            Route::Serve => {}
            Route::Moved { slot, node } => {
                let n = &self.nodes[node];
                let mut b = itoa::Buffer::new();
                out.extend_from_slice(b"-MOVED ");
                out.extend_from_slice(b.format(slot).as_bytes());
                out.push(b' ');
                out.extend_from_slice(n.ip.as_bytes());
                out.push(b':');
                out.extend_from_slice(b.format(n.port).as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            Route::CrossSlot => compose_error(
                out,
                b"CROSSSLOT Keys in request don't hash to the same slot",
            ),
            Route::Unassigned => compose_error(out, b"CLUSTERDOWN Hash slot not served"),
        }
    }

    /// The nodes of `shard` that `CLUSTER SLOTS` lists: the acting primary first, then the
    /// other healthy nodes (failed nodes are left out, as Redis leaves out failed replicas).
    fn serving(&self, shard: &ClusterShard) -> Vec<usize> {
        let acting = self.acting_primary(shard);
        let mut v = vec![acting];
        v.extend(
            shard
                .nodes
                .iter()
                .copied()
                .filter(|&n| n != acting && self.nodes[n].healthy),
        );
        v
    }

    /// `CLUSTER SLOTS`: per contiguous range, its start, end and serving nodes (ip, port, id,
    /// an empty metadata map).
    pub fn compose_slots(&self, proto: Protocol, out: &mut Vec<u8>) {
        let ranges: usize = self.shards.iter().map(|s| s.ranges.len()).sum();
        compose_array_header(out, ranges);
        for shard in &self.shards {
            let serving = self.serving(shard);
            for &(lo, hi) in &shard.ranges {
                compose_array_header(out, 2 + serving.len());
                compose_integer(out, i64::from(lo));
                compose_integer(out, i64::from(hi));
                for &n in &serving {
                    let node = &self.nodes[n];
                    compose_array_header(out, 4);
                    compose_bulk(out, node.ip.as_bytes());
                    compose_integer(out, i64::from(node.port));
                    compose_bulk(out, node.id.as_bytes());
                    compose_map_header(out, 0, proto);
                }
            }
        }
    }

    /// `CLUSTER SHARDS`: per shard, its slots (start and end pairs) and its nodes with role and
    /// health.
    pub fn compose_shards(&self, proto: Protocol, out: &mut Vec<u8>) {
        compose_array_header(out, self.shards.len());
        for shard in &self.shards {
            let acting = self.acting_primary(shard);
            compose_map_header(out, 2, proto);
            compose_bulk(out, b"slots");
            compose_array_header(out, shard.ranges.len() * 2);
            for &(lo, hi) in &shard.ranges {
                compose_integer(out, i64::from(lo));
                compose_integer(out, i64::from(hi));
            }
            compose_bulk(out, b"nodes");
            compose_array_header(out, shard.nodes.len());
            for &n in &shard.nodes {
                let node = &self.nodes[n];
                compose_map_header(out, 8, proto);
                compose_bulk(out, b"id");
                compose_bulk(out, node.id.as_bytes());
                compose_bulk(out, b"port");
                compose_integer(out, i64::from(node.port));
                compose_bulk(out, b"ip");
                compose_bulk(out, node.ip.as_bytes());
                compose_bulk(out, b"endpoint");
                compose_bulk(out, node.ip.as_bytes());
                compose_bulk(out, b"hostname");
                compose_bulk(out, node.name.as_bytes());
                compose_bulk(out, b"role");
                compose_bulk(out, if n == acting { b"master" } else { b"replica" });
                compose_bulk(out, b"replication-offset");
                compose_integer(out, 0);
                compose_bulk(out, b"health");
                compose_bulk(out, if node.healthy { b"online" } else { b"failed" });
            }
        }
    }

    /// `CLUSTER NODES`: one line per node in Redis's format
    /// (`id ip:port@cport,hostname flags master ping pong epoch link slots...`). pgline has no
    /// cluster bus: its port is reported as 0, ping and pong times as 0.
    pub fn compose_nodes(&self, proto: Protocol, out: &mut Vec<u8>) {
        let mut text = String::new();
        for shard in &self.shards {
            let acting = self.acting_primary(shard);
            for &n in &shard.nodes {
                let node = &self.nodes[n];
                let mut flags = String::new();
                if n == self.me {
                    flags.push_str("myself,");
                }
                flags.push_str(if n == acting { "master" } else { "slave" });
                if !node.healthy {
                    flags.push_str(",fail");
                }
                let master = if n == acting {
                    "-"
                } else {
                    &*self.nodes[acting].id
                };
                let link = if node.healthy {
                    "connected"
                } else {
                    "disconnected"
                };
                text.push_str(&format!(
                    "{} {}:{}@0,{} {flags} {master} 0 0 {} {link}",
                    node.id, node.ip, node.port, node.name, self.epoch
                ));
                if n == acting {
                    for &(lo, hi) in &shard.ranges {
                        if lo == hi {
                            text.push_str(&format!(" {lo}"));
                        } else {
                            text.push_str(&format!(" {lo}-{hi}"));
                        }
                    }
                }
                text.push('\n');
            }
        }
        compose_verbatim(out, b"txt", text.as_bytes(), proto);
    }

    /// `CLUSTER INFO`.
    pub fn compose_info(&self, proto: Protocol, out: &mut Vec<u8>) {
        let assigned = self.slot_shard.iter().filter(|&&s| s != UNASSIGNED).count();
        let failed: usize = self
            .shards
            .iter()
            .filter(|s| s.nodes.iter().all(|&n| !self.nodes[n].healthy))
            .flat_map(|s| s.ranges.iter())
            .map(|&(lo, hi)| usize::from(hi - lo) + 1)
            .sum();
        let state = if assigned == SLOTS && failed == 0 {
            "ok"
        } else {
            "fail"
        };
        let size = self.shards.iter().filter(|s| !s.ranges.is_empty()).count();
        let text = format!(
            "cluster_state:{state}\r\ncluster_slots_assigned:{assigned}\r\n\
             cluster_slots_ok:{}\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:{failed}\r\n\
             cluster_known_nodes:{}\r\ncluster_size:{size}\r\ncluster_current_epoch:{e}\r\n\
             cluster_my_epoch:{e}\r\ncluster_stats_messages_sent:0\r\n\
             cluster_stats_messages_received:0\r\ntotal_cluster_links_buffer_limit_exceeded:0\r\n",
            assigned - failed,
            self.nodes.len(),
            e = self.epoch,
        );
        compose_verbatim(out, b"txt", text.as_bytes(), proto);
    }

    /// `CLUSTER MYSHARDID`.
    pub fn my_shard_id(&self) -> &str {
        &self.shards[self.my_shard].id
    }
}

/// The published topology, swapped whole by the control plane and picked up by each core with
/// one atomic load per turn. `None`: cluster mode is off.
#[derive(Debug, Default)]
pub struct TopologyCell {
    generation: AtomicU64,
    current: RwLock<Option<Arc<Topology>>>,
}

impl TopologyCell {
    /// Publishes a new topology, or turns cluster mode off (control plane only).
    pub fn publish(&self, topology: Option<Topology>) {
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        *current = topology.map(Arc::new);
        self.generation.fetch_add(1, Ordering::Release);
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn snapshot(&self) -> Option<Arc<Topology>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_route_and_are_not_part_of_the_row_key() {
        let mut buf = Vec::new();
        assert_eq!(untag(b"orders:{7}:1001", &mut buf), b"orders:7:1001");
        assert_eq!(untag(b"{users}:42", &mut buf), b"users:42");
        assert_eq!(untag(b"users:42", &mut buf), b"users:42");
        assert_eq!(untag(b"a{}b", &mut buf), b"a{}b", "an empty tag is no tag");
        assert_eq!(untag(b"a{b", &mut buf), b"a{b");
        assert_eq!(
            untag(b"t:{1}{2}", &mut buf),
            b"t:1{2}",
            "only the first tag"
        );
        assert_eq!(key_slot(b"orders:{7}:1001"), key_slot(b"7"));
    }

    #[test]
    fn slots_match_redis() {
        // CRC16/XMODEM's check value, and slots Redis reports for these keys.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"hello"), 866);
        assert_eq!(key_slot(b""), 0);
        // Hash tags.
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"orders:{7}:1001"), key_slot(b"customers:{7}:7"));
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") & 16383);
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{bar"), crc16(b"foo{bar") & 16383);
    }

    fn node(name: &str, port: u16) -> ClusterNode {
        ClusterNode {
            id: format!("{name:0>40}").into(),
            name: name.into(),
            ip: "127.0.0.1".into(),
            port,
            healthy: true,
        }
    }

    /// Three shards of two nodes (a, b; c, d; e, f) over the whole slot space, seen by `me`.
    fn fleet(me: usize) -> Topology {
        let nodes = ["a", "b", "c", "d", "e", "f"]
            .iter()
            .enumerate()
            .map(|(i, n)| node(n, 7000 + i as u16))
            .collect();
        let shard = |id: &str, ranges: Vec<(u16, u16)>, nodes: Vec<usize>| ClusterShard {
            id: format!("{id:0>40}").into(),
            ranges,
            nodes,
        };
        let shards = vec![
            shard("s1", vec![(0, 5460)], vec![0, 1]),
            shard("s2", vec![(5461, 10922)], vec![2, 3]),
            shard("s3", vec![(10923, 16383)], vec![4, 5]),
        ];
        Topology::new(nodes, shards, me, 3).expect("topology")
    }

    fn keys<'k>(k: &'k [&'static str]) -> impl Iterator<Item = &'static [u8]> + 'k {
        k.iter().map(|s| s.as_bytes())
    }

    #[test]
    fn routes_like_a_redis_cluster_node() {
        let t = fleet(0);
        // "hello" is slot 866 (shard 1, ours), "foo" 12182 (shard 3), "bar" 5061 (ours).
        assert_eq!(t.route(keys(&["hello"]), false), Route::Serve);
        assert_eq!(
            t.route(keys(&["foo"]), false),
            Route::Moved {
                slot: 12182,
                node: 4
            }
        );
        assert_eq!(t.route(keys(&["hello", "bar"]), false), Route::CrossSlot);
        assert_eq!(
            t.route(keys(&["orders:{7}:1", "orders:{7}:2"]), false),
            t.route(keys(&["orders:{7}:3"]), false)
        );
        let mut out = Vec::new();
        t.compose_redirect(t.route(keys(&["foo"]), false), &mut out);
        assert_eq!(out, b"-MOVED 12182 127.0.0.1:7004\r\n");
        out.clear();
        t.compose_redirect(Route::CrossSlot, &mut out);
        assert_eq!(
            out,
            b"-CROSSSLOT Keys in request don't hash to the same slot\r\n"
        );
        assert!(t.owns(866) && !t.owns(12182));
    }

    #[test]
    fn a_replica_serves_its_slots_after_readonly_and_takes_over_when_the_primary_fails() {
        let t = fleet(1);
        assert_eq!(
            t.route(keys(&["hello"]), false),
            Route::Moved { slot: 866, node: 0 },
            "a replica sends writes-mode clients to its primary"
        );
        assert_eq!(t.route(keys(&["hello"]), true), Route::Serve);
        assert!(matches!(
            t.route(keys(&["foo"]), true),
            Route::Moved { node: 4, .. }
        ));
        // The primary fails: the replica is the shard's master and serves without READONLY;
        // other nodes point there.
        let mut nodes = t.nodes().to_vec();
        nodes[0].healthy = false;
        let t = Topology::new(nodes.clone(), t.shards().to_vec(), 1, 4).expect("topology");
        assert_eq!(t.route(keys(&["hello"]), false), Route::Serve);
        let other = Topology::new(nodes, t.shards().to_vec(), 2, 4).expect("topology");
        assert_eq!(
            other.route(keys(&["hello"]), false),
            Route::Moved { slot: 866, node: 1 }
        );
        let mut out = Vec::new();
        other.compose_nodes(Protocol::Resp2, &mut out);
        let text = String::from_utf8(out).expect("utf-8");
        assert!(text.contains(" slave,fail "), "{text}");
        assert!(
            text.contains(" master - 0 0 4 connected 0-5460\n"),
            "{text}"
        );
    }

    #[test]
    fn unassigned_slots_and_bad_topologies() {
        let nodes = vec![node("a", 7000)];
        let shard = ClusterShard {
            id: "s".repeat(40).into(),
            ranges: vec![(0, 99)],
            nodes: vec![0],
        };
        let t = Topology::new(nodes.clone(), vec![shard.clone()], 0, 1).expect("topology");
        assert_eq!(t.route(keys(&["foo"]), false), Route::Unassigned);
        let mut out = Vec::new();
        t.compose_info(Protocol::Resp2, &mut out);
        assert!(String::from_utf8_lossy(&out)
            .contains("cluster_state:fail\r\ncluster_slots_assigned:100\r\n"));
        let bad = |shards: Vec<ClusterShard>, nodes: Vec<ClusterNode>| {
            Topology::new(nodes, shards, 0, 1).expect_err("refused")
        };
        let mut overlap = shard.clone();
        overlap.id = "t".repeat(40).into();
        overlap.nodes = vec![1];
        bad(
            vec![shard.clone(), overlap],
            vec![node("a", 1), node("b", 2)],
        );
        let mut wide = shard.clone();
        wide.ranges = vec![(0, 16384)];
        bad(vec![wide], nodes.clone());
        let mut spaced = node("a", 1);
        spaced.id = "a b".into();
        bad(vec![shard.clone()], vec![spaced]);
        bad(vec![shard.clone()], vec![node("a", 1), node("b", 2)]); // b in no shard
    }

    #[test]
    fn slots_and_shards_replies() {
        let t = fleet(0);
        let mut out = Vec::new();
        t.compose_slots(Protocol::Resp2, &mut out);
        let text = String::from_utf8(out).expect("utf-8");
        assert!(
            text.starts_with(
                "*3\r\n*4\r\n:0\r\n:5460\r\n*4\r\n$9\r\n127.0.0.1\r\n:7000\r\n$40\r\n"
            ),
            "{text}"
        );
        let mut out = Vec::new();
        t.compose_shards(Protocol::Resp3, &mut out);
        let text = String::from_utf8(out).expect("utf-8");
        assert!(
            text.starts_with(
                "*3\r\n%2\r\n$5\r\nslots\r\n*2\r\n:0\r\n:5460\r\n$5\r\nnodes\r\n*2\r\n%8\r\n"
            ),
            "{text}"
        );
        assert!(text.contains("$6\r\nhealth\r\n$6\r\nonline\r\n"));
    }
}
