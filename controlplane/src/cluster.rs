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
//! Thread model: one task per node; each check runs on the blocking pool (ureq), all peers at
//! once.

use std::time::Duration;

use pgline_dataplane::plane::ControlPort;
use tokio::sync::watch;

use crate::config::ClusterConfig;

/// Checks the peers of `cfg` until `shutdown` turns true, publishing the topology (with a new
/// epoch) through `plane` when a peer's health changes.
pub async fn watch_health(
    cfg: ClusterConfig,
    plane: ControlPort,
    mut shutdown: watch::Receiver<bool>,
) {
    let me = cfg.nodes.iter().position(|n| n.name == cfg.node);
    let peers: Vec<(usize, String)> = cfg
        .nodes
        .iter()
        .enumerate()
        .filter(|&(i, n)| Some(i) != me && !n.api.is_empty())
        .map(|(i, n)| (i, format!("http://{}/v1/ready", n.api)))
        .collect();
    if peers.is_empty() {
        return;
    }
    let interval = Duration::from_millis(cfg.health_interval_ms);
    let timeout = Duration::from_millis(cfg.health_timeout_ms);
    let agent = ureq::AgentBuilder::new().timeout(timeout).build();
    let mut healthy = vec![true; cfg.nodes.len()];
    let mut misses = vec![0u32; cfg.nodes.len()];
    let mut epoch = 1u64;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
        let checks = peers.iter().map(|(i, url)| {
            let (agent, url, i) = (agent.clone(), url.clone(), *i);
            tokio::task::spawn_blocking(move || {
                let ok = matches!(agent.get(&url).call(), Ok(r) if r.status() == 200);
                (i, ok)
            })
        });
        let mut changed = false;
        for check in futures_util::future::join_all(checks).await {
            let Ok((i, ok)) = check else { continue };
            misses[i] = if ok { 0 } else { misses[i].saturating_add(1) };
            let now = misses[i] < cfg.health_failures;
            if now != healthy[i] {
                healthy[i] = now;
                changed = true;
                tracing::warn!(
                    node = %cfg.nodes[i].name,
                    healthy = now,
                    "cluster: a peer's health changed"
                );
            }
        }
        if changed {
            epoch += 1;
            match cfg.topology(|i| healthy[i], epoch) {
                Ok(t) => plane.publish_topology(t),
                Err(e) => tracing::error!(error = %e, "cluster: topology refused"),
            }
        }
    }
}
