//! `POST /v1/flush` and `GET /v1/keys/{key}`: dropping entries and looking at one.

use axum::extract::rejection::PathRejection;
use axum::extract::Path;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody, JsonBody};
use super::tables::path_param;
use super::Node;
use crate::admin::KeyInfo;

/// Body of `POST /v1/flush`: `{}` flushes everything, `{"table": "users"}` one table,
/// `{"key": "users:42"}` one key.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(max_properties = 1)]
pub struct FlushRequest {
    #[schema(example = "users")]
    pub table: Option<String>,
    #[schema(example = "users:42")]
    pub key: Option<String>,
}

/// Answer of `POST /v1/flush`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Flushed {
    /// Entries dropped.
    pub flushed: u64,
}

/// Drops cached entries: all, one table's, or one key's. The next read refills from the origin.
#[utoipa::path(post, path = "/v1/flush", tag = "cache", security(("bearer" = [])),
    request_body(content = FlushRequest),
    responses(
        (status = 200, description = "Flushed", body = Flushed),
        (status = 400, description = "Both table and key, a bad key, or a bad body", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "No token configured", body = ErrorBody),
        (status = 404, description = "Not a cached table or key prefix", body = ErrorBody),
        (status = 409, description = "pgline is shutting down", body = ErrorBody),
        (status = 413, description = "Body over api.max_body_bytes", body = ErrorBody),
    ))]
pub async fn flush(
    Node(node): Node,
    JsonBody(req): JsonBody<FlushRequest>,
) -> Result<Json<Flushed>, ApiError> {
    let flushed = match (req.table, req.key) {
        (None, None) => node.flush_all().await,
        (Some(t), None) => {
            super::tables::check_table_name(&t)?;
            node.flush_table(&t).await?
        }
        (None, Some(k)) => node.flush_key(&k).await?,
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request("give table or key, not both"));
        }
    };
    Ok(Json(Flushed { flushed }))
}

/// Whether a key is cached, and its LSN, size and age. An uncached key answers 200 with
/// `cached: false` and the reason.
#[utoipa::path(get, path = "/v1/keys/{key}", tag = "cache", security(("bearer" = [])),
    params(("key" = String, Path, pattern = "^[^:]+:.+$",
        description = "A RESP key, `<table or prefix>:<primary key>`, e.g. `users:42`")),
    responses(
        (status = 200, description = "What the cache holds for the key", body = KeyInfo),
        (status = 400, description = "Not a key pgline understands", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "No token configured", body = ErrorBody),
        (status = 409, description = "pgline is shutting down", body = ErrorBody),
    ))]
pub async fn key_info(
    Node(node): Node,
    key: Result<Path<String>, PathRejection>,
) -> Result<Json<KeyInfo>, ApiError> {
    let key = path_param(key)?;
    Ok(Json(node.key_info(&key).await?))
}
