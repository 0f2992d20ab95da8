//! A blocking JSON client for pgline's HTTP API (`ureq`): one request per CLI command, errors
//! turned into text an operator can act on.

use std::time::Duration;

use serde_json::Value;

/// Default API address when neither `--api`, `PGLINE_API_URL` nor `api.listen` says otherwise.
pub const DEFAULT_API_LISTEN: &str = "127.0.0.1:6381";

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(
        "cannot reach the pgline API at {url}: {detail}\n  \
         is `pgline serve` running with api.enabled = true? \
         Point --api (or PGLINE_API_URL) at its api.listen address."
    )]
    Unreachable { url: String, detail: String },
    #[error("{method} {path}: HTTP {status} {error}: {detail}{hint}")]
    Api {
        method: &'static str,
        path: String,
        status: u16,
        error: String,
        detail: String,
        hint: &'static str,
    },
    #[error("{method} {path}: unexpected answer: {detail}")]
    BadResponse {
        method: &'static str,
        path: String,
        detail: String,
    },
}

/// The API's base URL and credentials.
pub struct ApiClient {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl ApiClient {
    /// `base` is `http://host:port` or `host:port`.
    pub fn new(base: &str, token: Option<String>) -> ApiClient {
        let base = base.trim_end_matches('/');
        let base = if base.contains("://") {
            base.to_string()
        } else {
            format!("http://{base}")
        };
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(3))
            .timeout(Duration::from_secs(60))
            .build();
        ApiClient {
            base,
            token: token.filter(|t| !t.is_empty()),
            agent,
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn get(&self, path: &str) -> Result<Value, ApiError> {
        self.call("GET", path, None)
    }

    /// Sends one request; a JSON body for POST/PATCH/DELETE when given.
    pub fn call(
        &self,
        method: &'static str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ApiError> {
        let url = format!("{}{path}", self.base);
        let mut req = self.agent.request(method, &url);
        if let Some(t) = &self.token {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        let result = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        let response = match result {
            Ok(r) => r,
            Err(ureq::Error::Status(status, r)) => {
                let text = r.into_string().unwrap_or_default();
                let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                let field = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
                let hint = match status {
                    401 => "\n  pass the API token with --token or PGLINE_API_TOKEN",
                    403 => "\n  mutating calls need api.token set on the server and passed here",
                    _ => "",
                };
                return Err(ApiError::Api {
                    method,
                    path: path.to_string(),
                    status,
                    error: field("error").unwrap_or_else(|| "error".into()),
                    detail: field("detail").unwrap_or(text),
                    hint,
                });
            }
            Err(ureq::Error::Transport(t)) => {
                let text = t.to_string();
                let detail = text
                    .strip_prefix(&format!("{url}: "))
                    .unwrap_or(&text)
                    .to_string();
                return Err(ApiError::Unreachable { url, detail });
            }
        };
        let text = response.into_string().map_err(|e| ApiError::BadResponse {
            method,
            path: path.to_string(),
            detail: e.to_string(),
        })?;
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).map_err(|e| ApiError::BadResponse {
            method,
            path: path.to_string(),
            detail: format!("not JSON ({e})"),
        })
    }
}

/// Percent-encodes one path segment (table names, keys).
pub fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(encode_segment("public.users"), "public.users");
        assert_eq!(encode_segment("users:4 2/x"), "users%3A4%202%2Fx");
    }

    #[test]
    fn unreachable_api_names_the_url() {
        let c = ApiClient::new("127.0.0.1:1", None);
        let e = c.get("/v1/status").unwrap_err();
        assert!(matches!(e, ApiError::Unreachable { .. }), "{e}");
        assert!(
            e.to_string().contains("http://127.0.0.1:1/v1/status"),
            "{e}"
        );
    }
}
