//! `GET/POST/DELETE /v1/tables[/{name}]`: which tables are cached, adding and removing them.
//!
//! Names are `table` or `schema.table`, resolved by the `Admin` service; adding with
//! `?warm=true` returns at once and the table's `state` shows the warming progress.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody, JsonBody};
use super::Node;
use crate::admin::TableStatus;

/// Body of `POST /v1/tables`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddTable {
    /// `table` or `schema.table` of an origin table with a primary key.
    #[schema(example = "public.users", min_length = 1, max_length = 255)]
    pub name: String,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AddTableQuery {
    /// Load every row now (progress in the table's `state`); default false.
    pub warm: Option<bool>,
}

/// Answer of `DELETE /v1/tables/{name}`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Removed {
    #[schema(example = "public.users")]
    pub removed: String,
    /// Entries dropped from the store.
    pub flushed: u64,
}

/// Longest table name accepted (two 63-byte identifiers, quoted, and a dot fit easily).
pub const MAX_TABLE_NAME: usize = 255;

/// Refuses names no PostgreSQL table can have (empty, too long, control characters such as
/// NUL), so they answer 400 here instead of reaching the origin as a failing query.
pub fn check_table_name(name: &str) -> Result<(), ApiError> {
    if name.is_empty() || name.len() > MAX_TABLE_NAME {
        return Err(ApiError::bad_request(format!(
            "a table name is 1..={MAX_TABLE_NAME} bytes"
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(ApiError::bad_request(
            "a table name cannot contain control characters",
        ));
    }
    Ok(())
}

/// A path parameter, with our error body when it cannot be decoded.
pub fn path_param(p: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    p.map(|Path(s)| s)
        .map_err(|r| ApiError::bad_request(r.body_text()))
}

/// Cached tables.
#[utoipa::path(get, path = "/v1/tables", tag = "tables", security(("bearer" = [])),
    responses(
        (status = 200, description = "Every cached table", body = [TableStatus]),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "No token configured", body = ErrorBody),
    ))]
pub async fn list_tables(Node(node): Node) -> Json<Vec<TableStatus>> {
    Json(node.tables())
}

/// One cached table.
#[utoipa::path(get, path = "/v1/tables/{name}", tag = "tables", security(("bearer" = [])),
    params(("name" = String, Path, description = "`table` or `schema.table`")),
    responses(
        (status = 200, description = "The table", body = TableStatus),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "No token configured", body = ErrorBody),
        (status = 404, description = "Not a cached table", body = ErrorBody),
    ))]
pub async fn get_table(
    Node(node): Node,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<TableStatus>, ApiError> {
    let name = path_param(name)?;
    node.table(&name)
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("{name:?} is not a cached table")))
}

/// Starts caching an origin table; `?warm=true` also loads its rows.
#[utoipa::path(post, path = "/v1/tables", tag = "tables", security(("bearer" = [])),
    params(AddTableQuery),
    request_body(content = AddTable),
    responses(
        (status = 201, description = "Cached from now on", body = TableStatus),
        (status = 400, description = "No primary key, a malformed name, or a bad body", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "No token configured", body = ErrorBody),
        (status = 404, description = "No such origin table", body = ErrorBody),
        (status = 409, description = "Already cached", body = ErrorBody),
        (status = 413, description = "Body over api.max_body_bytes", body = ErrorBody),
        (status = 502, description = "The origin failed", body = ErrorBody),
    ))]
pub async fn add_table(
    Node(node): Node,
    query: Result<Query<AddTableQuery>, QueryRejection>,
    JsonBody(body): JsonBody<AddTable>,
) -> Result<(StatusCode, Json<TableStatus>), ApiError> {
    let Query(q) = query.map_err(|r| ApiError::bad_request(r.body_text()))?;
    check_table_name(&body.name)?;
    let t = node.add_table(&body.name, q.warm.unwrap_or(false)).await?;
    Ok((StatusCode::CREATED, Json(t)))
}

/// Stops caching a table and drops its entries.
#[utoipa::path(delete, path = "/v1/tables/{name}", tag = "tables", security(("bearer" = [])),
    params(("name" = String, Path, description = "`table` or `schema.table`")),
    responses(
        (status = 200, description = "Removed", body = Removed),
        (status = 400, description = "A malformed name", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "No token configured", body = ErrorBody),
        (status = 404, description = "Not a cached table", body = ErrorBody),
        (status = 409, description = "Removed meanwhile, or pgline is shutting down", body = ErrorBody),
    ))]
pub async fn remove_table(
    Node(node): Node,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<Removed>, ApiError> {
    let name = path_param(name)?;
    check_table_name(&name)?;
    let qualified = node
        .table(&name)
        .map(|t| t.name)
        .unwrap_or_else(|| name.clone());
    let flushed = node.remove_table(&name).await?;
    Ok(Json(Removed {
        removed: qualified,
        flushed,
    }))
}
