//! `GET/PATCH /v1/config`: the effective configuration, and live changes to it.
//!
//! The body and answer have the TOML file's nested shape. Secrets (`api.token`,
//! `resp.password`) always read `"***"`. Which keys can change live, and the validation, belong
//! to `Admin::patch_config`; this module only carries JSON in and out.

use axum::Json;
use serde::Deserialize;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody, JsonBody};
use super::Node;
use crate::config::Config;

/// A partial config in the file's nested shape, e.g.
/// `{"replication": {"max_lag_ms": 500}, "log": {"level": "debug"}}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(transparent)]
#[schema(value_type = Object, example = json!({"replication": {"max_lag_ms": 500}, "log": {"level": "debug"}}))]
pub struct ConfigPatch(pub serde_json::Value);

/// The effective configuration (live values; secrets as `"***"`).
#[utoipa::path(get, path = "/v1/config", tag = "config", security(("bearer" = [])),
    responses(
        (status = 200, description = "The effective configuration", body = Config),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "No token configured", body = ErrorBody),
    ))]
pub async fn get_config(Node(node): Node) -> Json<Config> {
    Json(node.effective_config().redacted())
}

/// Changes settings that can change at run time (log level, lag bound, per-table enable,
/// TTLs, limits); answers the new effective configuration. Any other setting answers 409
/// `restart_required` and nothing changes.
#[utoipa::path(patch, path = "/v1/config", tag = "config", security(("bearer" = [])),
    request_body(content = ConfigPatch, description = "Keys to change, in the file's nested shape"),
    responses(
        (status = 200, description = "Applied; the new effective configuration", body = Config),
        (status = 400, description = "Unknown key, bad value or bad JSON", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "No token configured", body = ErrorBody),
        (status = 409, description = "A setting that needs a restart", body = ErrorBody),
        (status = 413, description = "Body over api.max_body_bytes", body = ErrorBody),
    ))]
pub async fn patch_config(
    Node(node): Node,
    JsonBody(patch): JsonBody<ConfigPatch>,
) -> Result<Json<Config>, ApiError> {
    if !patch.0.is_object() {
        return Err(ApiError::bad_request(
            "the body must be a JSON object in the config's nested shape",
        ));
    }
    let cfg = node.patch_config(&patch.0)?;
    Ok(Json(cfg.redacted()))
}
