//! The `[cluster]` section (issue 17): a fleet of appliances that Redis Cluster clients see as
//! one cluster. Every node of the fleet has the same `nodes` and `shards` and names itself in
//! `node`; [`ClusterConfig::topology`] turns them into the dataplane's
//! [`pgline_dataplane::cluster::Topology`].
//!
//! ```toml
//! [cluster]
//! node = "a1"
//! nodes = [
//!   { name = "a1", addr = "10.0.0.1:6379" },
//!   { name = "a2", addr = "10.0.0.2:6379" },
//!   { name = "b1", addr = "10.0.0.3:6379" },
//! ]
//! shards = [
//!   { name = "a", slots = ["0-8191"], nodes = ["a1", "a2"] },   # a1 primary, a2 replica
//!   { name = "b", slots = ["8192-16383"], nodes = ["b1"] },
//! ]
//! ```
//!
//! Node and shard ids (`CLUSTER MYID`, `MYSHARDID`) are 40 hex digits, as Redis's are: the
//! node's `id` when given, else derived from its name by [`derived_id`], so every node of a
//! fleet computes the same ids from the same file, whatever its version.

use std::net::SocketAddr;

use pgline_dataplane::cluster::{ClusterNode, ClusterShard, Topology, SLOTS};
use serde::{Deserialize, Serialize};

use super::ConfigError;

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// This node's name, one of `nodes`. Empty: cluster mode off (the default).
    pub node: String,
    /// Every node of the fleet.
    pub nodes: Vec<ClusterNodeConfig>,
    /// Every shard: its slots and its nodes, the primary first.
    pub shards: Vec<ClusterShardConfig>,
    /// How often each peer's `/v1/ready` is asked (`50..=60000`).
    pub health_interval_ms: u64,
    /// How long one check may take (`50..=60000`).
    pub health_timeout_ms: u64,
    /// Checks in a row without a 200 before a peer counts as failed (`1..=100`).
    pub health_failures: u32,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            node: String::new(),
            nodes: Vec::new(),
            shards: Vec::new(),
            health_interval_ms: 500,
            health_timeout_ms: 1000,
            health_failures: 2,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterNodeConfig {
    /// Unique name (letters, digits, `-`, `_`, `.`), reported as the node's hostname.
    pub name: String,
    /// `ip:port` where clients reach its RESP port (what `-MOVED` and `CLUSTER SLOTS` name).
    pub addr: String,
    /// 40 hex digits; empty: derived from `name`.
    #[serde(default)]
    pub id: String,
    /// `ip:port` of its HTTP API, where its health is checked (`GET /v1/ready`); empty: not
    /// checked, always taken as healthy.
    #[serde(default)]
    pub api: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterShardConfig {
    /// Unique name; its id is derived from it.
    pub name: String,
    /// Slots, each `"n"` or `"lo-hi"` (inclusive), within 0-16383.
    pub slots: Vec<String>,
    /// Names of its nodes, the primary first.
    pub nodes: Vec<String>,
}

/// Most nodes in a fleet (as Redis Cluster advises at most 1,000): every node checks every
/// peer each interval, and `PUT /v1/cluster` must not make that unbounded.
pub const MAX_NODES: usize = 1000;

fn invalid(reason: String) -> ConfigError {
    ConfigError::Invalid {
        key: "cluster",
        reason,
    }
}

/// 40 hex digits from `name`: five rounds of 32-bit FNV-1a over the round number and the name.
/// Stable by construction (no std hasher, whose algorithm may change between Rust releases).
pub fn derived_id(kind: &str, name: &str) -> String {
    (0u8..5)
        .map(|round| {
            let h = [round]
                .iter()
                .chain(kind.as_bytes())
                .chain(b":")
                .chain(name.as_bytes())
                .fold(0x811c_9dc5u32, |h, &b| {
                    (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
                });
            format!("{h:08x}")
        })
        .collect()
}

fn parse_range(s: &str) -> Option<(u16, u16)> {
    let (lo, hi) = s.split_once('-').unwrap_or((s, s));
    let (lo, hi) = (
        lo.trim().parse::<u16>().ok()?,
        hi.trim().parse::<u16>().ok()?,
    );
    (lo <= hi && usize::from(hi) < SLOTS).then_some((lo, hi))
}

impl ClusterConfig {
    pub fn enabled(&self) -> bool {
        !self.node.is_empty()
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let range = |v: u64, lo: u64, hi: u64, key: &str| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(invalid(format!("{key} must be between {lo} and {hi}")))
            }
        };
        range(self.health_interval_ms, 50, 60_000, "health_interval_ms")?;
        range(self.health_timeout_ms, 50, 60_000, "health_timeout_ms")?;
        range(u64::from(self.health_failures), 1, 100, "health_failures")?;
        if self.nodes.len() > MAX_NODES || self.shards.len() > MAX_NODES {
            return Err(invalid(format!(
                "{} nodes and {} shards: at most {MAX_NODES} of each",
                self.nodes.len(),
                self.shards.len()
            )));
        }
        if let Some(n) = self
            .nodes
            .iter()
            .find(|n| !n.api.is_empty() && n.api.parse::<SocketAddr>().is_err())
        {
            return Err(invalid(format!(
                "node {}: api {:?} is not ip:port",
                n.name, n.api
            )));
        }
        if self.enabled() {
            self.topology(|_| true, 0)?;
        } else if !self.nodes.is_empty() || !self.shards.is_empty() {
            return Err(invalid(
                "nodes and shards are given but `node` (this node's name) is not".into(),
            ));
        }
        Ok(())
    }

    /// The slots this node's shard serves (as configured, whatever the nodes' health), one
    /// flag per slot; all false when cluster mode is off or the node is in no shard.
    pub fn my_slots(&self) -> Vec<bool> {
        let mut mine = vec![false; SLOTS];
        for s in self.shards.iter().filter(|s| s.nodes.contains(&self.node)) {
            for (lo, hi) in s.slots.iter().filter_map(|r| parse_range(r)) {
                mine[usize::from(lo)..=usize::from(hi)].fill(true);
            }
        }
        mine
    }

    /// The topology this node serves, with node `i` healthy as `healthy(i)` says (this node is
    /// always healthy to itself), at `epoch`. `None` when cluster mode is off.
    pub fn topology(
        &self,
        healthy: impl Fn(usize) -> bool,
        epoch: u64,
    ) -> Result<Option<Topology>, ConfigError> {
        if !self.enabled() {
            return Ok(None);
        }
        let name_ok = |n: &str| {
            !n.is_empty()
                && n.len() <= 64
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        };
        let mut nodes = Vec::with_capacity(self.nodes.len());
        for (i, n) in self.nodes.iter().enumerate() {
            if !name_ok(&n.name) {
                return Err(invalid(format!(
                    "node name {:?}: 1-64 letters, digits, '-', '_' or '.'",
                    n.name
                )));
            }
            let addr: SocketAddr = n.addr.parse().map_err(|_| {
                invalid(format!(
                    "node {}: addr {:?} is not ip:port (clients are sent there)",
                    n.name, n.addr
                ))
            })?;
            let id = if n.id.is_empty() {
                derived_id("node", &n.name)
            } else if n.id.len() == 40 && n.id.bytes().all(|b| b.is_ascii_hexdigit()) {
                n.id.to_ascii_lowercase()
            } else {
                return Err(invalid(format!(
                    "node {}: id must be 40 hex digits",
                    n.name
                )));
            };
            nodes.push(ClusterNode {
                id: id.into(),
                name: n.name.as_str().into(),
                ip: addr.ip().to_string().into(),
                port: addr.port(),
                healthy: healthy(i),
            });
        }
        let index = |name: &str| self.nodes.iter().position(|n| n.name == name);
        let Some(me) = index(&self.node) else {
            return Err(invalid(format!(
                "node {:?} is not among `nodes`",
                self.node
            )));
        };
        let mut shards = Vec::with_capacity(self.shards.len());
        for s in &self.shards {
            if !name_ok(&s.name) {
                return Err(invalid(format!("shard name {:?}", s.name)));
            }
            let mut ranges = Vec::with_capacity(s.slots.len());
            for r in &s.slots {
                ranges.push(parse_range(r).ok_or_else(|| {
                    invalid(format!(
                        "shard {}: slots {r:?} is not n or lo-hi within 0-16383",
                        s.name
                    ))
                })?);
            }
            ranges.sort_unstable();
            let mut members = Vec::with_capacity(s.nodes.len());
            for n in &s.nodes {
                members.push(index(n).ok_or_else(|| {
                    invalid(format!("shard {}: node {n:?} is not among `nodes`", s.name))
                })?);
            }
            shards.push(ClusterShard {
                id: derived_id("shard", &s.name).into(),
                ranges,
                nodes: members,
            });
        }
        Topology::new(nodes, shards, me, epoch)
            .map(Some)
            .map_err(|e| invalid(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet(node: &str) -> ClusterConfig {
        let n = |name: &str, port| ClusterNodeConfig {
            name: name.into(),
            addr: format!("127.0.0.1:{port}"),
            id: String::new(),
            api: String::new(),
        };
        let s = |name: &str, slots: &[&str], nodes: &[&str]| ClusterShardConfig {
            name: name.into(),
            slots: slots.iter().map(|s| s.to_string()).collect(),
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
        };
        ClusterConfig {
            node: node.into(),
            nodes: vec![n("a1", 7001), n("a2", 7002), n("b1", 7003)],
            shards: vec![
                s("a", &["0-8191"], &["a1", "a2"]),
                s("b", &["8192-16383"], &["b1"]),
            ],
            ..ClusterConfig::default()
        }
    }

    #[test]
    fn a_fleet_is_at_most_max_nodes() {
        let mut big = fleet("a1");
        let template = big.nodes[2].clone();
        let at = |i: usize| ClusterNodeConfig {
            name: format!("n{i}"),
            addr: format!("127.0.0.1:{}", 10_000 + i),
            ..template.clone()
        };
        // Extra nodes in shard b, up to the bound: valid.
        for i in big.nodes.len()..MAX_NODES {
            big.nodes.push(at(i));
            big.shards[1].nodes.push(format!("n{i}"));
        }
        assert!(big.validate().is_ok());
        big.nodes.push(at(MAX_NODES));
        big.shards[1].nodes.push(format!("n{MAX_NODES}"));
        let err = big.validate().unwrap_err().to_string();
        assert!(err.contains("at most 1000"), "{err}");
    }

    #[test]
    fn my_slots_are_those_of_the_nodes_shard() {
        let mine = fleet("a2").my_slots();
        assert_eq!(mine.len(), SLOTS);
        assert!(mine[..8192].iter().all(|&m| m) && !mine[8192..].iter().any(|&m| m));
        let mut off = fleet("a2");
        off.node.clear();
        assert!(!off.my_slots().iter().any(|&m| m));
    }

    #[test]
    fn a_fleet_becomes_a_topology() {
        let t = fleet("a2")
            .topology(|_| true, 1)
            .expect("valid")
            .expect("on");
        assert_eq!(&*t.me().name, "a2");
        assert_eq!(t.me().id.len(), 40);
        assert!(t.owns(0) && t.owns(8191) && !t.owns(8192));
        assert_eq!(
            t.me().id,
            fleet("a1").topology(|_| true, 1).unwrap().unwrap().nodes()[1].id,
            "every node derives the same ids"
        );
        assert_eq!(derived_id("node", "a1"), derived_id("node", "a1"));
        assert_ne!(derived_id("node", "a1"), derived_id("shard", "a1"));
        assert!(ClusterConfig::default()
            .topology(|_| true, 0)
            .unwrap()
            .is_none());
    }

    #[test]
    fn mistakes_are_named() {
        let reason = |c: ClusterConfig| match c.validate() {
            Err(ConfigError::Invalid { reason, .. }) => reason,
            other => panic!("{other:?}"),
        };
        assert!(reason(fleet("zz")).contains("not among"));
        let mut c = fleet("a1");
        c.nodes[0].addr = "localhost:7001".into();
        assert!(reason(c).contains("ip:port"));
        let mut c = fleet("a1");
        c.shards[1].slots = vec!["8000-16383".into()];
        assert!(reason(c).contains("two shards"));
        let mut c = fleet("a1");
        c.shards[1].slots = vec!["8192-16384".into()];
        assert!(reason(c).contains("0-16383"));
        let mut c = fleet("a1");
        c.shards[1].nodes = vec!["a2".into()];
        assert!(reason(c).contains("two shards"));
        let mut c = fleet("a1");
        c.node = String::new();
        assert!(reason(c).contains("`node`"));
        let mut c = fleet("a1");
        c.nodes[2].id = "xyz".into();
        assert!(reason(c).contains("40 hex"));
        let mut c = fleet("a1");
        c.nodes[2].api = "somewhere".into();
        assert!(reason(c).contains("api"));
        let mut c = fleet("a1");
        c.health_failures = 0;
        assert!(reason(c).contains("health_failures"));
    }
}
