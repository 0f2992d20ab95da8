//! `GET` and `PUT /v1/cluster`: the fleet's topology as this node routes by it, and a new one
//! applied without a restart (cluster mode, `docs/scale-out.md`).

use axum::http::StatusCode;
use axum::Json;

use super::error::{ApiError, ErrorBody, JsonBody};
use super::Node;
use crate::admin::{ClusterChange, ClusterChangeRequest, ClusterView};

fn cluster_off() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "conflict",
        "cluster mode is off: it is chosen at start ([cluster] node)",
    )
}

/// The topology this node routes by: nodes with their health as this node judges it, shards
/// with their slots and acting primary, and the epoch.
#[utoipa::path(get, path = "/v1/cluster", tag = "cluster", security(("bearer" = [])),
    responses(
        (status = 200, description = "The topology", body = ClusterView),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "No token configured", body = ErrorBody),
        (status = 409, description = "Cluster mode is off", body = ErrorBody),
    ))]
pub async fn get_cluster(Node(node): Node) -> Result<Json<ClusterView>, ApiError> {
    node.cluster().map(Json).ok_or_else(cluster_off)
}

/// Replaces the fleet's nodes and shards on this node, without a restart: slots its shard
/// gains are filled on demand; if it loses slots its store is flushed (the slots it keeps
/// refill on demand). Send the same body to every node, and put it in their configuration
/// files too: nothing is written back.
#[utoipa::path(put, path = "/v1/cluster", tag = "cluster", security(("bearer" = [])),
    request_body(content = ClusterChangeRequest),
    responses(
        (status = 200, description = "Applied", body = ClusterChange),
        (status = 400, description = "An invalid topology (the reason; nothing changed) or a bad body", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "No token configured", body = ErrorBody),
        (status = 409, description = "Cluster mode is off, or pgline is shutting down", body = ErrorBody),
        (status = 413, description = "Body over api.max_body_bytes", body = ErrorBody),
    ))]
pub async fn put_cluster(
    Node(node): Node,
    JsonBody(req): JsonBody<ClusterChangeRequest>,
) -> Result<Json<ClusterChange>, ApiError> {
    Ok(Json(node.set_cluster(req).await?))
}
