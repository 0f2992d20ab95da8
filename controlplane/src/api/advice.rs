//! `GET /v1/advice`: the workload advisor ([`crate::advise`]), computed here, where the cores'
//! key space and an origin connection are.

use axum::extract::rejection::QueryRejection;
use axum::extract::Query;
use axum::Json;
use serde::Deserialize;
use utoipa::IntoParams;

use super::error::{ApiError, ErrorBody};
use super::Node;
use crate::advise::{Advice, DEFAULT_HIT_RATIO, DEFAULT_LIMIT, MAX_LIMIT};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AdviceQuery {
    /// Hit ratio of the estimate, 0..=1 (default 0.95).
    #[param(minimum = 0.0, maximum = 1.0)]
    pub hit_ratio: Option<f64>,
    /// Statements read, the busiest by origin time first, 1..=10000 (default 1000).
    #[param(minimum = 1, maximum = 10000)]
    pub limit: Option<u32>,
}

/// What pgline would serve of the origin's workload: each statement of the origin's
/// `pg_stat_statements` (this database, top level) judged by the cores' own classification
/// against the cached tables, summed by calls and origin time, with the origin time saved at
/// `hit_ratio` and what the operator can change.
#[utoipa::path(get, path = "/v1/advice", tag = "cache", security(("bearer" = [])),
    params(AdviceQuery),
    responses(
        (status = 200, description = "The advice", body = Advice),
        (status = 400, description = "hit_ratio outside 0..=1 or limit outside 1..=10000", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "No token configured", body = ErrorBody),
        (status = 409, description = "pg_stat_statements is not installed or not loaded in the origin (the detail says how)", body = ErrorBody),
        (status = 502, description = "The origin failed", body = ErrorBody),
    ))]
pub async fn advice(
    Node(node): Node,
    query: Result<Query<AdviceQuery>, QueryRejection>,
) -> Result<Json<Advice>, ApiError> {
    let Query(q) = query.map_err(|r| ApiError::bad_request(r.body_text()))?;
    let hit_ratio = q.hit_ratio.unwrap_or(DEFAULT_HIT_RATIO);
    if !(0.0..=1.0).contains(&hit_ratio) {
        return Err(ApiError::bad_request("hit_ratio is a number in 0..=1"));
    }
    let limit = q.limit.map_or(DEFAULT_LIMIT, |l| l as usize);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit is an integer in 1..={MAX_LIMIT}"
        )));
    }
    Ok(Json(node.advise(hit_ratio, limit).await?))
}
