//! Bearer-token access control for the API.
//!
//! Three kinds of request:
//! - open: `GET /v1/health`, `/v1/ready`, `/v1/openapi.json` (probes and tooling need them
//!   before they hold a token);
//! - reads (`GET`, `HEAD`): need the token unless `api.open_reads`;
//! - everything else mutates and always needs the token; with no token configured it answers
//!   403, so an appliance without a token can be watched but not changed.
//!
//! The token is compared in constant time (`subtle`); only its length can leak through timing,
//! which is accepted (a token is long and random). It is never logged: this module logs the
//! outcome and the path, never a header.

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::ApiState;

/// Paths that never need the token.
pub const OPEN_PATHS: &[&str] = &["/v1/health", "/v1/ready", "/v1/openapi.json"];

/// The access rules, fixed when the API starts.
pub struct Auth {
    token: Option<Vec<u8>>,
    open_reads: bool,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field(
                "token",
                &self.token.as_ref().map(|_| crate::config::REDACTED),
            )
            .field("open_reads", &self.open_reads)
            .finish()
    }
}

/// Why a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A token that does not match.
    Wrong,
    /// No token configured, and the call needs one.
    NoTokenConfigured { mutating: bool },
}

impl Auth {
    pub fn new(token: Option<&str>, open_reads: bool) -> Auth {
        Auth {
            token: token.map(|t| t.as_bytes().to_vec()),
            open_reads,
        }
    }

    /// Decides on a request from its method, path and `Authorization` header.
    pub fn check(
        &self,
        method: &Method,
        path: &str,
        authorization: Option<&HeaderValue>,
    ) -> Result<(), Denied> {
        let read = method == Method::GET || method == Method::HEAD;
        if read && OPEN_PATHS.contains(&path) {
            return Ok(());
        }
        if read && self.open_reads {
            return Ok(());
        }
        let Some(expected) = &self.token else {
            return Err(Denied::NoTokenConfigured { mutating: !read });
        };
        let presented = authorization
            .and_then(|v| parse_bearer(v.as_bytes()))
            .ok_or(Denied::Missing)?;
        if bool::from(presented.ct_eq(expected.as_slice())) {
            Ok(())
        } else {
            Err(Denied::Wrong)
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header value.
pub fn parse_bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

impl IntoResponse for Denied {
    fn into_response(self) -> Response {
        let (err, challenge) = match self {
            Denied::Missing => (
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "send Authorization: Bearer <api.token>",
                ),
                r#"Bearer realm="pgline""#,
            ),
            Denied::Wrong => (
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "the bearer token does not match api.token",
                ),
                r#"Bearer realm="pgline", error="invalid_token""#,
            ),
            Denied::NoTokenConfigured { mutating } => {
                let detail = if mutating {
                    "set api.token to enable mutating calls"
                } else {
                    "set api.token (or api.open_reads = true) to enable reads"
                };
                return ApiError::new(StatusCode::FORBIDDEN, "forbidden", detail).into_response();
            }
        };
        let mut resp = err.into_response();
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(challenge),
        );
        resp
    }
}

/// Middleware (`axum::middleware::from_fn_with_state`) applying [`Auth::check`].
pub async fn require_token(State(state): State<ApiState>, req: Request, next: Next) -> Response {
    let verdict = state.auth.check(
        req.method(),
        req.uri().path(),
        req.headers().get(header::AUTHORIZATION),
    );
    match verdict {
        Ok(()) => next.run(req).await,
        Err(denied) => {
            tracing::info!(method = %req.method(), path = req.uri().path(), ?denied, "API call refused");
            denied.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    #[test]
    fn bearer_parses() {
        assert_eq!(parse_bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(parse_bearer(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(parse_bearer(b"Basic abc"), None);
        assert_eq!(parse_bearer(b"Bearer "), None);
        assert_eq!(parse_bearer(b"Bear"), None);
    }

    #[test]
    fn rules() {
        let a = Auth::new(Some("s3cret-token"), false);
        let good = hv("Bearer s3cret-token");
        let bad = hv("Bearer s3cret-tokem");
        assert_eq!(a.check(&Method::GET, "/v1/health", None), Ok(()));
        assert_eq!(
            a.check(&Method::GET, "/v1/status", None),
            Err(Denied::Missing)
        );
        assert_eq!(
            a.check(&Method::GET, "/v1/status", Some(&bad)),
            Err(Denied::Wrong)
        );
        assert_eq!(a.check(&Method::GET, "/v1/status", Some(&good)), Ok(()));
        assert_eq!(a.check(&Method::POST, "/v1/flush", Some(&good)), Ok(()));
        assert_eq!(
            a.check(&Method::POST, "/v1/health", None),
            Err(Denied::Missing)
        );
        let a = Auth::new(Some("s3cret-token"), true);
        assert_eq!(a.check(&Method::GET, "/v1/status", None), Ok(()));
        assert_eq!(
            a.check(&Method::POST, "/v1/flush", None),
            Err(Denied::Missing)
        );
        let a = Auth::new(None, false);
        assert_eq!(
            a.check(&Method::GET, "/v1/status", Some(&good)),
            Err(Denied::NoTokenConfigured { mutating: false })
        );
        assert_eq!(
            a.check(&Method::DELETE, "/v1/tables/x", Some(&good)),
            Err(Denied::NoTokenConfigured { mutating: true })
        );
        let a = Auth::new(None, true);
        assert_eq!(a.check(&Method::GET, "/v1/status", None), Ok(()));
    }

    #[test]
    fn debug_hides_the_token() {
        let a = Auth::new(Some("s3cret-token"), false);
        assert!(!format!("{a:?}").contains("s3cret"));
    }
}
