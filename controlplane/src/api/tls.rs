//! `POST /v1/tls/reload`: reads the fronts' certificate and key again (as SIGHUP does).

use axum::http::StatusCode;
use axum::Json;

use super::error::{ApiError, ErrorBody};
use super::Node;
use crate::config::CertInfo;

/// Reloads `tls.cert_file` and `tls.key_file` (and `tls.client_ca_file`): connections accepted
/// from now on get the new certificate; open ones keep theirs. On error the old certificate
/// stays in use and the answer says why.
#[utoipa::path(post, path = "/v1/tls/reload", tag = "system", security(("bearer" = [])),
    responses(
        (status = 200, description = "Reloaded: the certificate new connections get", body = CertInfo),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "No token configured", body = ErrorBody),
        (status = 409, description = "No front serves TLS (no [tls] certificate in use)", body = ErrorBody),
        (status = 422, description = "The files could not be loaded; the old certificate stays", body = ErrorBody),
    ))]
pub async fn reload(Node(node): Node) -> Result<Json<CertInfo>, ApiError> {
    match node.reload_tls() {
        None => Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            "no front serves TLS: set [tls] cert_file/key_file with pgwire.tls or resp.tls_listen \
             (read at start)",
        )),
        Some(Ok(info)) => Ok(Json(info)),
        Some(Err(e)) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "tls_reload_failed",
            format!("{e}; the old certificate stays in use"),
        )),
    }
}
