//! The fleet's topology at run time (`GET` and `PUT /v1/cluster`, issue 17).
//!
//! A change replaces the `[cluster]` section's `nodes` and `shards` (this node's name and the
//! health settings stay). It is checked as the configuration file is, then handed to the
//! health task (`crate::cluster::watch_health`), which publishes it to the cores with the next
//! epoch. Slots this node's shard gains are filled on demand, as any miss. When its shard loses
//! slots, the node flushes its store once the cores route by the new topology: an entry does not
//! say which slot its key was read under (one row has a key per prefix, tagged or not), so the
//! only entries sure to belong to kept slots are none. The slots kept refill on demand.
//!
//! Nothing is written back to the configuration file: a node restarted with its old file comes
//! back with the old topology (the docs say to change the file too).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::Admin;
use crate::admin::AdminError;
use crate::config::{ClusterNodeConfig, ClusterShardConfig};

/// How long a change waits for the cores' topology to be the new one before flushing.
const PUBLISH_WAIT: Duration = Duration::from_secs(2);

/// `GET /v1/cluster`: the topology this node routes by.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ClusterView {
    /// This node's name.
    pub node: String,
    /// Bumped with every health or topology change (`cluster_current_epoch`).
    pub epoch: u64,
    pub nodes: Vec<ClusterNodeView>,
    pub shards: Vec<ClusterShardView>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ClusterNodeView {
    pub name: String,
    /// 40 hex digits (`CLUSTER MYID` on that node).
    pub id: String,
    /// Where clients reach its RESP port.
    pub addr: String,
    /// Where its health is checked (empty: not checked).
    pub api: String,
    /// As this node judges it (itself: always true).
    pub healthy: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ClusterShardView {
    pub name: String,
    pub slots: Vec<String>,
    /// Its nodes, the configured primary first.
    pub nodes: Vec<String>,
    /// The node that answers its keys without `READONLY`: the first healthy one (none when
    /// all are failed).
    pub acting_primary: Option<String>,
}

/// Body of `PUT /v1/cluster`: the fleet's nodes and shards, as in `[cluster]`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterChangeRequest {
    pub nodes: Vec<ClusterNodeConfig>,
    pub shards: Vec<ClusterShardConfig>,
}

/// Answer of `PUT /v1/cluster`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ClusterChange {
    /// Slots this node's shard serves now.
    pub slots: u32,
    /// Slots it serves now and did not before (filled on demand).
    pub slots_gained: u32,
    /// Slots it served before and does not now.
    pub slots_lost: u32,
    /// Entries dropped because slots were lost (the whole store; 0 when none were).
    pub flushed: u64,
    /// The epoch the cores route by after the change.
    pub epoch: u64,
}

impl Admin {
    /// The topology this node routes by; `None` when cluster mode is off.
    pub fn cluster(&self) -> Option<ClusterView> {
        let topology = self.shared.topology().snapshot()?;
        let cfg = self.config_read().cluster.clone();
        let healthy = |name: &str| {
            topology
                .nodes()
                .iter()
                .find(|n| &*n.name == name)
                .is_none_or(|n| n.healthy)
        };
        let nodes = cfg
            .nodes
            .iter()
            .map(|n| ClusterNodeView {
                name: n.name.clone(),
                id: topology
                    .nodes()
                    .iter()
                    .find(|t| *t.name == *n.name)
                    .map_or_else(String::new, |t| t.id.to_string()),
                addr: n.addr.clone(),
                api: n.api.clone(),
                healthy: healthy(&n.name),
            })
            .collect();
        let shards = cfg
            .shards
            .iter()
            .map(|s| ClusterShardView {
                name: s.name.clone(),
                slots: s.slots.clone(),
                nodes: s.nodes.clone(),
                acting_primary: s.nodes.iter().find(|n| healthy(n)).cloned(),
            })
            .collect();
        Some(ClusterView {
            node: cfg.node,
            epoch: topology.epoch(),
            nodes,
            shards,
        })
    }

    /// Replaces the fleet's nodes and shards (see the module doc). `Conflict` when cluster mode
    /// is off (it is chosen at start), `BadRequest` with the reason when the topology is
    /// invalid (nothing changes then).
    pub async fn set_cluster(
        &self,
        req: ClusterChangeRequest,
    ) -> Result<ClusterChange, AdminError> {
        let Some(configs) = &self.cluster else {
            return Err(AdminError::Conflict(
                "cluster mode is off: it is chosen at start ([cluster] node)".into(),
            ));
        };
        let _serial = self.admin_lock.lock().await;
        let old = self.config_read().cluster.clone();
        let mut new = old.clone();
        new.nodes = req.nodes;
        new.shards = req.shards;
        new.validate()
            .map_err(|e| AdminError::BadRequest(e.to_string()))?;
        let (before, after) = (old.my_slots(), new.my_slots());
        let count = |f: &dyn Fn(usize) -> bool| (0..before.len()).filter(|&i| f(i)).count() as u32;
        let change = ClusterChange {
            slots: count(&|i| after[i]),
            slots_gained: count(&|i| after[i] && !before[i]),
            slots_lost: count(&|i| before[i] && !after[i]),
            flushed: 0,
            epoch: 0,
        };
        let published = self.shared.topology().generation();
        configs
            .send(new.clone())
            .map_err(|_| AdminError::Conflict("pgline is shutting down".into()))?;
        self.config_write().cluster = new;
        // The cores must route by the new topology before the flush, or a read of a lost slot
        // between the two could fill it again.
        let since = Instant::now();
        while self.shared.topology().generation() == published && since.elapsed() < PUBLISH_WAIT {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let flushed = if change.slots_lost > 0 {
            self.flush_all().await
        } else {
            0
        };
        let epoch = self.shared.topology().snapshot().map_or(0, |t| t.epoch());
        tracing::info!(
            slots = change.slots,
            gained = change.slots_gained,
            lost = change.slots_lost,
            flushed,
            epoch,
            "cluster: topology changed through the API"
        );
        Ok(ClusterChange {
            flushed,
            epoch,
            ..change
        })
    }
}
