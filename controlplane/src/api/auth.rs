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
//!
//! Refusals are counted by reason ([`REFUSALS`], exported as `pgline_api_request_refused_total`)
//! and logged as a summary at most once per [`REFUSAL_LOG_INTERVAL`] (issue 11, C8: a client
//! hammering the API with a wrong token wrote one INFO line per call).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

/// Shortest time between two refusal summaries in the log.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// API refusals by reason, for the metric and the rate-limited log (process-wide: one API).
#[derive(Debug, Default)]
pub struct Refusals {
    /// No bearer token (401).
    pub missing: AtomicU64,
    /// A wrong token (401).
    pub wrong: AtomicU64,
    /// No token configured (403).
    pub no_token: AtomicU64,
    /// When the last summary was logged, and the total then.
    logged: Mutex<Option<(Instant, u64)>>,
}

/// The process's API refusal counters.
pub static REFUSALS: Refusals = Refusals {
    missing: AtomicU64::new(0),
    wrong: AtomicU64::new(0),
    no_token: AtomicU64::new(0),
    logged: Mutex::new(None),
};

impl Refusals {
    /// `(reason label, count)` for each reason.
    pub fn by_reason(&self) -> [(&'static str, u64); 3] {
        let r = Ordering::Relaxed;
        [
            ("missing_token", self.missing.load(r)),
            ("wrong_token", self.wrong.load(r)),
            ("no_token_configured", self.no_token.load(r)),
        ]
    }

    /// The counts, for `/metrics`.
    pub fn snapshot(&self) -> crate::metrics::ApiRefusals {
        let [(_, missing_token), (_, wrong_token), (_, no_token_configured)] = self.by_reason();
        crate::metrics::ApiRefusals {
            missing_token,
            wrong_token,
            no_token_configured,
        }
    }

    fn total(&self) -> u64 {
        self.by_reason().iter().map(|(_, n)| n).sum()
    }

    /// Counts one refusal; returns the refusals since the last summary when a summary is due
    /// now (the first refusal, then at most one per `interval`).
    fn count(&self, denied: Denied, now: Instant, interval: Duration) -> Option<u64> {
        let counter = match denied {
            Denied::Missing => &self.missing,
            Denied::Wrong => &self.wrong,
            Denied::NoTokenConfigured { .. } => &self.no_token,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let mut logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        let total = self.total();
        match *logged {
            Some((at, _)) if now.duration_since(at) < interval => None,
            Some((_, before)) => {
                *logged = Some((now, total));
                Some(total - before)
            }
            None => {
                *logged = Some((now, total));
                Some(1)
            }
        }
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
            if let Some(n) = REFUSALS.count(denied, Instant::now(), REFUSAL_LOG_INTERVAL) {
                let [(_, missing), (_, wrong), (_, no_token)] = REFUSALS.by_reason();
                tracing::info!(method = %req.method(), path = req.uri().path(), ?denied,
                    since_last_summary = n, missing, wrong, no_token,
                    "API calls refused (summary: at most one line per {}s; \
                     pgline_api_request_refused_total counts them all)",
                    REFUSAL_LOG_INTERVAL.as_secs());
            }
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

    /// C8 (issue 11): 18,000 refusals give one summary per interval, and every one is counted.
    #[test]
    fn refusals_are_counted_and_summarised_at_a_bounded_rate() {
        let r = Refusals::default();
        let t0 = Instant::now();
        let interval = Duration::from_secs(10);
        let mut lines = Vec::new();
        for i in 0..18_000u64 {
            // 18,000 calls spread over 60 s.
            let now = t0 + Duration::from_millis(i * 60_000 / 18_000);
            let denied = if i % 2 == 0 {
                Denied::Wrong
            } else {
                Denied::Missing
            };
            if let Some(n) = r.count(denied, now, interval) {
                lines.push(n);
            }
        }
        assert!(lines.len() <= 7, "{} summary lines", lines.len());
        assert_eq!(r.wrong.load(Ordering::Relaxed), 9_000);
        assert_eq!(r.missing.load(Ordering::Relaxed), 9_000);
        assert_eq!(lines[0], 1, "the first refusal is logged at once");
        assert!(
            lines[1] > 2_000,
            "a summary counts what it stood for: {lines:?}"
        );
    }

    #[test]
    fn debug_hides_the_token() {
        let a = Auth::new(Some("s3cret-token"), false);
        assert!(!format!("{a:?}").contains("s3cret"));
    }
}
