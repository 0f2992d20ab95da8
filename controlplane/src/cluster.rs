//! Cluster mode's health checks (issue 17): every node asks each peer's `GET /v1/ready` and
//! publishes the topology again whenever a peer's health changes, so that the cores route by
//! who is serving.
//!
//! A peer is failed after `cluster.health_failures` checks in a row without a 200 (refused,
//! timed out after `cluster.health_timeout_ms`, or not ready: `/v1/ready` answers 503 while the
//! replication stream is down or lagging); one 200 makes it healthy again. A shard whose
//! configured primary is failed is then served by its next healthy node (see
//! `pgline_dataplane::cluster`), which every node reports as the shard's master, so clients
//! that refresh their slot map on `-MOVED` or on a connection error move to it.
//!
//! Each node judges on its own: no gossip, no election. Two nodes may disagree for up to one
//! check interval plus a timeout; a client sent between them by `-MOVED` meets a node that
//! serves the slot, or a second `-MOVED`, never a wrong row (every node reads the same origin).
//!
//! The configuration can change at run time (`PUT /v1/cluster`, `crate::admin`): the task gets
//! it through a watch channel and publishes the new topology at once with the next epoch,
//! keeping the health it knows of peers that stay (same name and API address).
//!
//! Thread model: one task per node; each check runs on the blocking pool (ureq), all peers at
//! once.

use std::collections::HashMap;
use std::time::Duration;

use pgline_dataplane::plane::ControlPort;
use tokio::sync::watch;

use crate::config::ClusterConfig;

/// A peer's health as the checks judged it: healthy, and checks in a row without a 200. Kept
/// by (name, api) so that a topology change keeps what is known of the peers it keeps.
type Health = HashMap<(String, String), (bool, u32)>;

/// Checks the peers of the current configuration (`configs`: the `[cluster]` section, changed
/// at run time by `PUT /v1/cluster`) until `shutdown` turns true, publishing the topology (with
/// a new epoch) through `plane` when a peer's health or the configuration changes.
pub async fn watch_health(
    mut configs: watch::Receiver<ClusterConfig>,
    plane: ControlPort,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut cfg = configs.borrow_and_update().clone();
    let mut agent = checker(&cfg);
    let mut health = Health::new();
    let mut epoch = 1u64;
    loop {
        let interval = Duration::from_millis(cfg.health_interval_ms);
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            changed = configs.changed() => {
                if changed.is_err() {
                    return; // the admin service is gone: the node is stopping
                }
                cfg = configs.borrow_and_update().clone();
                agent = checker(&cfg);
                health.retain(|(name, api), _| {
                    cfg.nodes.iter().any(|n| &n.name == name && &n.api == api)
                });
                epoch += 1;
                publish(&cfg, &health, epoch, &plane);
                tracing::info!(epoch, "cluster: topology changed");
                continue;
            }
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
        if check_peers(&cfg, &agent, &mut health).await {
            epoch += 1;
            publish(&cfg, &health, epoch, &plane);
        }
    }
}

/// The HTTP agent of the checks: kept from one round to the next, so its pooled connections
/// to the peers are reused.
fn checker(cfg: &ClusterConfig) -> ureq::Agent {
    let timeout = Duration::from_millis(cfg.health_timeout_ms);
    ureq::AgentBuilder::new().timeout(timeout).build()
}

/// Asks every peer's `/v1/ready` once, all at once; whether a peer's health changed.
async fn check_peers(cfg: &ClusterConfig, agent: &ureq::Agent, health: &mut Health) -> bool {
    let checks = cfg
        .nodes
        .iter()
        .filter(|n| n.name != cfg.node && !n.api.is_empty())
        .map(|n| {
            let key = (n.name.clone(), n.api.clone());
            let (agent, url) = (agent.clone(), format!("http://{}/v1/ready", n.api));
            tokio::task::spawn_blocking(move || {
                let ok = matches!(agent.get(&url).call(), Ok(r) if r.status() == 200);
                (key, ok)
            })
        });
    let mut changed = false;
    for check in futures_util::future::join_all(checks).await {
        let Ok((key, ok)) = check else { continue };
        let (healthy, misses) = health.entry(key.clone()).or_insert((true, 0));
        *misses = if ok { 0 } else { misses.saturating_add(1) };
        let now = *misses < cfg.health_failures;
        if now != *healthy {
            *healthy = now;
            changed = true;
            tracing::warn!(node = %key.0, healthy = now, "cluster: a peer's health changed");
        }
    }
    changed
}

/// Publishes `cfg`'s topology with the peers' health (a peer not yet checked is healthy).
fn publish(cfg: &ClusterConfig, health: &Health, epoch: u64, plane: &ControlPort) {
    let healthy = |i: usize| {
        let n = &cfg.nodes[i];
        health
            .get(&(n.name.clone(), n.api.clone()))
            .is_none_or(|h| h.0)
    };
    match cfg.topology(healthy, epoch) {
        Ok(t) => plane.publish_topology(t),
        Err(e) => tracing::error!(error = %e, "cluster: topology refused"),
    }
}
