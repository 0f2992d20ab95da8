//! Errors of the HTTP API: every failure, ours or the framework's, leaves as
//! `{"error": "<short_snake_case>", "detail": "<human text>"}` with a fitting status.
//!
//! Three paths lead here: handlers return [`ApiError`]; the [`JsonBody`] extractor turns bad
//! bodies into 400/413/415 [`ApiError`]s; [`jsonify_errors`] rewrites the few plain-text or
//! empty error responses the layers produce on their own (405 from the router, 413 from the body
//! limit, 408 from the timeout) into the same shape, so a client never has to parse two forms.

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;
use utoipa::ToSchema;

use crate::admin::AdminError;

/// The body of every error response.
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema)]
pub struct ErrorBody {
    /// Short machine-readable code, e.g. `not_found`, `unauthorized`, `restart_required`.
    #[schema(example = "not_found")]
    pub error: String,
    /// What went wrong, for a human.
    #[schema(example = "no cached table public.nope")]
    pub detail: String,
}

/// An error answer: a status and an [`ErrorBody`].
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub error: &'static str,
    pub detail: String,
}

impl ApiError {
    pub fn new(status: StatusCode, error: &'static str, detail: impl Into<String>) -> ApiError {
        ApiError {
            status,
            error,
            detail: detail.into(),
        }
    }

    pub fn bad_request(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", detail)
    }

    pub fn not_found(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", detail)
    }

    pub fn unavailable(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail)
    }

    /// The code a framework-made error response of `status` gets.
    pub fn code_for(status: StatusCode) -> &'static str {
        match status {
            StatusCode::BAD_REQUEST => "bad_request",
            StatusCode::UNAUTHORIZED => "unauthorized",
            StatusCode::FORBIDDEN => "forbidden",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
            StatusCode::REQUEST_TIMEOUT => "timeout",
            StatusCode::CONFLICT => "conflict",
            StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
            StatusCode::UNPROCESSABLE_ENTITY => "unprocessable",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable",
            s if s.is_server_error() => "internal",
            _ => "error",
        }
    }
}

impl From<AdminError> for ApiError {
    fn from(e: AdminError) -> ApiError {
        // The code names the kind; the detail is the message alone (the CLI prints both).
        match e {
            AdminError::NotFound(detail) => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", detail)
            }
            AdminError::BadRequest(detail) => ApiError::bad_request(detail),
            AdminError::Conflict(detail) => ApiError::new(StatusCode::CONFLICT, "conflict", detail),
            AdminError::RestartRequired(detail) => {
                ApiError::new(StatusCode::CONFLICT, "restart_required", detail)
            }
            AdminError::Origin(detail) => {
                ApiError::new(StatusCode::BAD_GATEWAY, "origin_unavailable", detail)
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.error.to_string(),
            detail: self.detail,
        };
        (self.status, axum::Json(body)).into_response()
    }
}

/// A JSON request body, parsed with our errors: 400 for bad JSON or a wrong shape, 413 past
/// `api.max_body_bytes`, 415 for a non-JSON content type. An empty body reads as `{}`.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let json_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(is_json_content_type);
        let bytes = Bytes::from_request(req, state).await.map_err(|r| {
            let status = r.status();
            ApiError::new(status, ApiError::code_for(status), r.body_text())
        })?;
        let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else if json_type != Some(true) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send the body as Content-Type: application/json",
            ));
        } else {
            &bytes
        };
        serde_json::from_slice(bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::bad_request(format!("request body: {e}")))
    }
}

fn is_json_content_type(v: &str) -> bool {
    let mime = v.split(';').next().unwrap_or("").trim();
    mime.eq_ignore_ascii_case("application/json")
        || mime
            .rsplit_once('+')
            .is_some_and(|(_, suffix)| suffix.eq_ignore_ascii_case("json"))
}

/// Middleware (`axum::middleware::map_response`): an error response that is not JSON gets our
/// error body; headers such as `Allow` and `WWW-Authenticate` stay.
pub async fn jsonify_errors(resp: Response) -> Response {
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_json_content_type);
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (mut parts, _) = resp.into_parts();
    let detail = match status {
        StatusCode::METHOD_NOT_ALLOWED => "method not allowed on this path".to_string(),
        StatusCode::PAYLOAD_TOO_LARGE => "request body larger than api.max_body_bytes".to_string(),
        StatusCode::REQUEST_TIMEOUT => "the request took too long".to_string(),
        s => s.canonical_reason().unwrap_or("error").to_string(),
    };
    let body = ErrorBody {
        error: ApiError::code_for(status).to_string(),
        detail,
    };
    let bytes = serde_json::to_vec(&body).unwrap_or_default();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(bytes))
}

/// Middleware (`axum::middleware::from_fn`): an error answer to a request with a body says
/// `Connection: close`.
///
/// A refused request's body may be left unread (too large, no token, wrong content type), and
/// hyper drains it only if it has all arrived; otherwise it closes the connection after the
/// answer without saying so, and a keep-alive client that sends its next request on that
/// connection gets it cut off. Saying `close` makes hyper end the connection cleanly and tells
/// the client not to reuse it (RFC 9112, section 9.6). The cost is one new connection after an
/// error, never after a success.
pub async fn close_after_refused_body(req: Request, next: Next) -> Response {
    let has_body = req.headers().contains_key(header::TRANSFER_ENCODING)
        || req
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    let mut resp = next.run(req).await;
    let status = resp.status();
    if has_body && (status.is_client_error() || status.is_server_error()) {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// The router's fallback: 404 for any path that is not a route.
pub async fn no_route() -> ApiError {
    ApiError::not_found("no such route; GET /v1/openapi.json lists them")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_content_types() {
        assert!(is_json_content_type("application/json"));
        assert!(is_json_content_type("application/json; charset=utf-8"));
        assert!(is_json_content_type("application/merge-patch+json"));
        assert!(!is_json_content_type("text/plain"));
        assert!(!is_json_content_type(""));
    }

    #[tokio::test]
    async fn plain_errors_become_json() {
        let resp = Response::builder()
            .status(StatusCode::METHOD_NOT_ALLOWED)
            .header(header::ALLOW, "GET")
            .body(Body::empty())
            .unwrap();
        let resp = jsonify_errors(resp).await;
        assert_eq!(resp.headers()[header::ALLOW], "GET");
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
        let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        let e: ErrorBody = serde_json::from_slice(&body).unwrap();
        assert_eq!(e.error, "method_not_allowed");
    }
}
