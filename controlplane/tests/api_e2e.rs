//! End to end over the HTTP management API against a running pgline with a real origin: every
//! route, auth failures, error shapes (bad JSON, oversized bodies, unknown routes and tables,
//! wrong methods), the OpenAPI document, and that the token never leaks into logs or config.

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use pgline_controlplane::server::Pgline;
use pgline_testkit::TestDb;
use pgline_testkit::{lab, origin};
use redis::AsyncCommands;
use reqwest::header;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const SCHEMA: &str = "
CREATE TABLE users (id int8 PRIMARY KEY, name text NOT NULL);
INSERT INTO users SELECT g, 'user ' || g FROM generate_series(1, 50) g;
CREATE TABLE orders (id int4 PRIMARY KEY, total numeric);
INSERT INTO orders SELECT g, g * 10 FROM generate_series(1, 30) g;
CREATE TABLE nopk (a int4, b text);
";

/// Every route the API serves, as (method, OpenAPI path).
const ROUTES: &[(&str, &str)] = &[
    ("get", "/v1/health"),
    ("get", "/v1/ready"),
    ("get", "/v1/status"),
    ("get", "/v1/config"),
    ("patch", "/v1/config"),
    ("get", "/v1/tables"),
    ("post", "/v1/tables"),
    ("get", "/v1/tables/{name}"),
    ("delete", "/v1/tables/{name}"),
    ("post", "/v1/flush"),
    ("get", "/v1/keys/{key}"),
    ("get", "/v1/queries"),
    ("get", "/v1/advice"),
    ("post", "/v1/tls/reload"),
    ("get", "/v1/cluster"),
    ("put", "/v1/cluster"),
    ("get", "/v1/openapi.json"),
];

/// Everything any test of this binary logs, to check that no token reaches a log line.
fn log_buffer() -> Arc<Mutex<Vec<u8>>> {
    static BUF: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    BUF.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = LogWriter(buf.clone());
        let _ = tracing_subscriber::fmt()
            .with_env_filter("debug")
            .with_writer(move || writer.clone())
            .try_init();
        buf
    })
    .clone()
}

#[derive(Clone)]
struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn assert_token_not_logged(token: &str) {
    let logs = log_buffer();
    let logs = logs.lock().unwrap();
    assert!(!logs.is_empty(), "the log capture saw nothing");
    let text = String::from_utf8_lossy(&logs);
    assert!(text.contains("API call"), "requests are not logged at all");
    assert!(!text.contains(token), "the API token appears in the logs");
}

/// A client for one pgline's API.
struct Api {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

/// One answer: status, headers, body as JSON (Null when not JSON).
struct Answer {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Value,
    text: String,
}

impl Api {
    fn new(p: &Pgline, token: Option<&str>) -> Api {
        let addr = p.api_addr().expect("the API is enabled");
        Api {
            base: format!("http://{addr}"),
            token: token.map(String::from),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
        }
    }

    fn with_token(&self, token: Option<&str>) -> Api {
        Api {
            base: self.base.clone(),
            token: token.map(String::from),
            http: self.http.clone(),
        }
    }

    async fn send(&self, method: Method, path: &str, body: Option<(&str, Vec<u8>)>) -> Answer {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some((ctype, bytes)) = body {
            req = req.header("content-type", ctype).body(bytes);
        }
        let resp = req.send().await.expect("HTTP request");
        let status = resp.status();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Answer {
            status,
            headers,
            body,
            text,
        }
    }

    async fn get(&self, path: &str) -> Answer {
        self.send(Method::GET, path, None).await
    }

    async fn json(&self, method: Method, path: &str, body: Value) -> Answer {
        let bytes = serde_json::to_vec(&body).unwrap();
        self.send(method, path, Some(("application/json", bytes)))
            .await
    }
}

impl Answer {
    /// Asserts the status and, for errors, the `{error, detail}` shape with `code`.
    #[track_caller]
    fn expect(&self, status: StatusCode, code: Option<&str>) -> &Value {
        assert_eq!(self.status, status, "body: {}", self.text);
        if let Some(code) = code {
            assert_eq!(
                self.headers["content-type"], "application/json",
                "error bodies are JSON"
            );
            assert_eq!(self.body["error"], code, "body: {}", self.text);
            assert!(
                self.body["detail"].as_str().is_some_and(|d| !d.is_empty()),
                "error without detail: {}",
                self.text
            );
            // The detail is the message alone: the CLI prints `{error}: {detail}`.
            let kind = format!("{}:", code.replace('_', " "));
            assert!(
                !self.body["detail"].as_str().unwrap().starts_with(&kind),
                "the detail repeats the code: {}",
                self.text
            );
        }
        &self.body
    }
}

async fn start(db: &TestDb, sets: &[&str]) -> Arc<Pgline> {
    log_buffer();
    let mut cfg = lab::config(db, 1);
    let mut sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    sets.insert(0, "api.listen=\"127.0.0.1:0\"".into());
    let layered =
        pgline_controlplane::config::Config::load(None, Vec::<(String, String)>::new(), &sets)
            .expect("test overrides");
    cfg.api = layered.api;
    cfg.catalog = layered.catalog;
    cfg.validate().expect("valid config");
    lab::start(cfg).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_and_error_shapes() {
    let token = "t0ken-auth-shapes-5f2c9a";
    let db = TestDb::create("api_auth").await;
    db.client().await.batch_execute(SCHEMA).await.unwrap();
    let p = start(
        &db,
        &[&format!("api.token=\"{token}\""), "api.max_body_bytes=2048"],
    )
    .await;
    let api = Api::new(&p, Some(token));

    check_open_and_auth(&api, token).await;
    check_bad_bodies(&api, token).await;
    check_routes_methods_and_names(&api).await;

    // The token never shows: not in the config, not in the logs.
    let c = api.get("/v1/config").await;
    assert!(!c.text.contains(token), "GET /v1/config shows the token");
    assert_eq!(c.expect(StatusCode::OK, None)["api"]["token"], "***");
    assert_token_not_logged(token);
    p.shutdown().await;
}

async fn check_open_and_auth(api: &Api, token: &str) {
    let anon = api.with_token(None);
    let wrong = api.with_token(Some(&format!("{token}x")));
    // Open without a token.
    let h = anon.get("/v1/health").await;
    assert_eq!(h.expect(StatusCode::OK, None), &json!({"status": "ok"}));
    // Readiness probes its checks with short timeouts (1 s for the origin, 300 ms for the
    // cores), so on a loaded machine it may say 503 for a moment: polled like a probe would.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let r = loop {
        let r = anon.get("/v1/ready").await;
        if r.status == StatusCode::OK || std::time::Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let r = r.expect(StatusCode::OK, None);
    assert_eq!(r["ready"], true, "{r}");
    assert_eq!(
        r["checks"],
        json!({"origin": true, "replication": true, "lag": true, "cores": true,
               "connections": true, "reply_memory": true})
    );
    anon.get("/v1/openapi.json")
        .await
        .expect(StatusCode::OK, None);

    // Reads need the token (open_reads is off), mutations too.
    for path in ["/v1/status", "/v1/config", "/v1/tables", "/v1/queries"] {
        let a = anon.get(path).await;
        a.expect(StatusCode::UNAUTHORIZED, Some("unauthorized"));
        let challenge = a.headers["www-authenticate"].to_str().unwrap();
        assert!(challenge.starts_with("Bearer"), "{challenge}");
        let w = wrong.get(path).await;
        w.expect(StatusCode::UNAUTHORIZED, Some("unauthorized"));
        assert!(w.headers["www-authenticate"]
            .to_str()
            .unwrap()
            .contains("invalid_token"));
        api.get(path).await.expect(StatusCode::OK, None);
    }
    // Refused with its body unread: the connection is not to be reused (a GET's error keeps it).
    let refused = anon.json(Method::POST, "/v1/flush", json!({})).await;
    assert_eq!(refused.headers[header::CONNECTION], "close");
    refused.expect(StatusCode::UNAUTHORIZED, Some("unauthorized"));
    let no_body = anon.get("/v1/status").await;
    assert!(!no_body.headers.contains_key(header::CONNECTION));
    wrong
        .json(Method::PATCH, "/v1/config", json!({}))
        .await
        .expect(StatusCode::UNAUTHORIZED, Some("unauthorized"));
    // A non-Bearer scheme is no token.
    let basic = api
        .http
        .get(format!("{}/v1/status", api.base))
        .header("authorization", format!("Basic {token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(basic.status(), StatusCode::UNAUTHORIZED);
}

async fn check_bad_bodies(api: &Api, token: &str) {
    // Bad JSON, wrong shapes, wrong content type: 400/415 with our body, not axum's text.
    let bad = api
        .send(
            Method::POST,
            "/v1/flush",
            Some(("application/json", b"{\"table\": ".to_vec())),
        )
        .await;
    bad.expect(StatusCode::BAD_REQUEST, Some("bad_request"));
    api.json(Method::POST, "/v1/flush", json!({"tabel": "users"}))
        .await
        .expect(StatusCode::BAD_REQUEST, Some("bad_request"));
    api.json(Method::POST, "/v1/flush", json!({"table": 42}))
        .await
        .expect(StatusCode::BAD_REQUEST, Some("bad_request"));
    api.json(Method::POST, "/v1/tables", json!([1, 2]))
        .await
        .expect(StatusCode::BAD_REQUEST, Some("bad_request"));
    api.send(
        Method::POST,
        "/v1/flush",
        Some(("text/plain", b"{}".to_vec())),
    )
    .await
    .expect(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        Some("unsupported_media_type"),
    );
    api.send(
        Method::POST,
        "/v1/tables?warm=maybe",
        Some(("application/json", b"{\"name\":\"users\"}".to_vec())),
    )
    .await
    .expect(StatusCode::BAD_REQUEST, Some("bad_request"));

    // Oversized bodies: with a Content-Length, and streamed without one.
    let big = format!("{{\"key\": \"{}\"}}", "x".repeat(4096));
    // The refused body is not read, so the connection cannot carry another request: the
    // answer says so, or a keep-alive client would send its next request into a closing socket.
    let too_large = api
        .send(
            Method::POST,
            "/v1/flush",
            Some(("application/json", big.clone().into_bytes())),
        )
        .await;
    assert_eq!(too_large.headers[header::CONNECTION], "close");
    too_large.expect(StatusCode::PAYLOAD_TOO_LARGE, Some("payload_too_large"));
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = big
        .into_bytes()
        .chunks(512)
        .map(|c| Ok(c.to_vec()))
        .collect();
    let streamed = api
        .http
        .post(format!("{}/v1/flush", api.base))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(streamed.headers()[header::CONNECTION], "close");
    let body: Value = streamed.json().await.unwrap();
    assert_eq!(body["error"], "payload_too_large");
}

async fn check_routes_methods_and_names(api: &Api) {
    // Unknown routes and wrong methods.
    api.get("/v1/nope")
        .await
        .expect(StatusCode::NOT_FOUND, Some("not_found"));
    api.get("/")
        .await
        .expect(StatusCode::NOT_FOUND, Some("not_found"));
    let m = api.send(Method::DELETE, "/v1/status", None).await;
    m.expect(StatusCode::METHOD_NOT_ALLOWED, Some("method_not_allowed"));
    assert!(m.headers.contains_key("allow"));
    api.send(Method::PUT, "/v1/flush", None)
        .await
        .expect(StatusCode::METHOD_NOT_ALLOWED, Some("method_not_allowed"));

    // Unknown tables, and names no table can have (they must not reach the origin as a
    // failing query: that would be a 502).
    api.json(Method::POST, "/v1/tables", json!({"name": "a\0b"}))
        .await
        .expect(StatusCode::BAD_REQUEST, Some("bad_request"));
    api.json(Method::POST, "/v1/tables", json!({"name": "x".repeat(300)}))
        .await
        .expect(StatusCode::BAD_REQUEST, Some("bad_request"));
    api.get("/v1/tables/no_such_table")
        .await
        .expect(StatusCode::NOT_FOUND, Some("not_found"));
    api.send(Method::DELETE, "/v1/tables/no_such_table", None)
        .await
        .expect(StatusCode::NOT_FOUND, Some("not_found"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_reads_may_be_open_and_mutations_are_forbidden() {
    let db = TestDb::create("api_notoken").await;
    db.client().await.batch_execute(SCHEMA).await.unwrap();
    let p = start(&db, &["api.open_reads=true"]).await;
    let api = Api::new(&p, None);
    api.get("/v1/status").await.expect(StatusCode::OK, None);
    api.get("/v1/tables").await.expect(StatusCode::OK, None);
    let f = api.json(Method::POST, "/v1/flush", json!({})).await;
    f.expect(StatusCode::FORBIDDEN, Some("forbidden"));
    assert_eq!(f.body["detail"], "set api.token to enable mutating calls");
    // A token sent anyway changes nothing: there is none to match.
    api.with_token(Some("whatever-token"))
        .json(
            Method::PATCH,
            "/v1/config",
            json!({"log": {"level": "info"}}),
        )
        .await
        .expect(StatusCode::FORBIDDEN, Some("forbidden"));
    api.send(Method::DELETE, "/v1/tables/users", None)
        .await
        .expect(StatusCode::FORBIDDEN, Some("forbidden"));
    assert_eq!(
        api.get("/v1/config").await.body["api"]["token"],
        Value::Null
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_lists_every_route() {
    let db = TestDb::create("api_openapi").await;
    let p = start(&db, &["api.token=\"openapi-token-123\""]).await;
    let api = Api::new(&p, None);
    let doc = api.get("/v1/openapi.json").await;
    let doc = doc.expect(StatusCode::OK, None);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."), "{doc}");
    let mut listed = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().unwrap().keys() {
            if ["get", "post", "patch", "delete", "put"].contains(&method.as_str()) {
                listed.insert((method.clone(), path.clone()));
            }
        }
    }
    let expected: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(listed, expected);
    // The document the server serves is the one the code generates.
    let generated = serde_json::to_value(pgline_controlplane::api::openapi()).unwrap();
    assert_eq!(doc, &generated);
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
    assert!(doc["components"]["schemas"]["ErrorBody"].is_object());
    // Every route answers something other than 404/405 (so none is documented but missing).
    let authed = api.with_token(Some("openapi-token-123"));
    for (m, path) in ROUTES {
        let path = path.replace("{name}", "users").replace("{key}", "users:1");
        let method = Method::from_bytes(m.to_uppercase().as_bytes()).unwrap();
        let a = authed.send(method, &path, None).await;
        assert_ne!(a.status, StatusCode::METHOD_NOT_ALLOWED, "{m} {path}");
        if !path.starts_with("/v1/tables/") {
            assert_ne!(a.status, StatusCode::NOT_FOUND, "{m} {path}: {}", a.text);
        }
    }
    // Outside cluster mode the topology routes say so (a valid body changes nothing).
    authed
        .get("/v1/cluster")
        .await
        .expect(StatusCode::CONFLICT, Some("conflict"));
    let body = json!({"nodes": [{"name": "a", "addr": "127.0.0.1:7000"}],
                      "shards": [{"name": "s", "slots": ["0-16383"], "nodes": ["a"]}]});
    authed
        .send(
            Method::PUT,
            "/v1/cluster",
            Some(("application/json", body.to_string().into_bytes())),
        )
        .await
        .expect(StatusCode::CONFLICT, Some("conflict"));
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_config_tables_flush_keys() {
    let token = "t0ken-every-route-77aa";
    let db = TestDb::create("api_routes").await;
    let origin = db.client().await;
    origin.batch_execute(SCHEMA).await.unwrap();
    let p = start(
        &db,
        &[
            &format!("api.token=\"{token}\""),
            "catalog.tables=[\"users\"]",
        ],
    )
    .await;
    let api = Api::new(&p, Some(token));
    let mut r = lab::redis(&p).await;
    let _: Option<String> = r.get("users:1").await.unwrap();
    let _: Option<String> = r.get("users:2").await.unwrap();

    check_status(&api, &db).await;
    check_config(&api).await;
    check_tables(&api, &mut r).await;
    check_keys_and_flush(&api, &mut r).await;
    assert_token_not_logged(token);
    p.shutdown().await;
    // After shutdown the API is gone.
    assert!(api
        .http
        .get(format!("{}/v1/health", api.base))
        .send()
        .await
        .is_err());
}

async fn check_status(api: &Api, db: &TestDb) {
    // Status.
    let s = api.get("/v1/status").await;
    let s = s.expect(StatusCode::OK, None);
    assert_eq!(s["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(s["cores"].as_array().unwrap().len(), 1);
    assert_eq!(s["cores"][0]["transport"], "kernel");
    assert!(s["cores"][0]["commands"].as_u64().unwrap() >= 2, "{s}");
    assert_eq!(s["memory"]["budget_bytes"], 64u64 << 20);
    assert_eq!(s["memory"]["page_level"], "4KiB");
    assert!(s["store"]["entries"].as_u64().unwrap() >= 2, "{s}");
    assert_eq!(s["replication"]["slot"], lab::slot_name(db));
    assert_eq!(s["replication"]["streaming"], true);
    let lsn = s["replication"]["applied_lsn"].as_str().unwrap();
    assert!(
        lsn.split_once('/').is_some_and(
            |(a, b)| u32::from_str_radix(a, 16).is_ok() && u32::from_str_radix(b, 16).is_ok()
        ),
        "{lsn}"
    );
    assert_eq!(s["origin_pool"]["max_size"], 4);
    // No statement went through the PostgreSQL port here (tests/pgwire_api.rs sends some).
    assert_eq!(api.get("/v1/queries").await.body, json!([]));
}

async fn check_config(api: &Api) {
    // Config: read, live change, restart-only change, bad keys.
    let c = api.get("/v1/config").await;
    assert_eq!(
        c.expect(StatusCode::OK, None)["replication"]["max_lag_ms"],
        10_000
    );
    let c = api
        .json(
            Method::PATCH,
            "/v1/config",
            json!({"replication": {"max_lag_ms": 500}}),
        )
        .await;
    assert_eq!(
        c.expect(StatusCode::OK, None)["replication"]["max_lag_ms"],
        500
    );
    assert_eq!(
        api.get("/v1/config").await.body["replication"]["max_lag_ms"],
        500
    );
    api.json(
        Method::PATCH,
        "/v1/config",
        json!({"resp": {"listen": "127.0.0.1:1"}}),
    )
    .await
    .expect(StatusCode::CONFLICT, Some("restart_required"));
    api.json(Method::PATCH, "/v1/config", json!({"nope": {"x": 1}}))
        .await
        .expect(StatusCode::BAD_REQUEST, Some("bad_request"));
    api.json(Method::PATCH, "/v1/config", json!([1]))
        .await
        .expect(StatusCode::BAD_REQUEST, Some("bad_request"));
    assert_eq!(api.get("/v1/config").await.body["api"]["token"], "***");
}

async fn check_tables(api: &Api, r: &mut redis::aio::MultiplexedConnection) {
    // Tables: list, one, add (warm), conflicts, missing, no primary key, remove.
    let t = api.get("/v1/tables").await;
    let names: Vec<&str> = t
        .expect(StatusCode::OK, None)
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["public.users"]);
    let u = api.get("/v1/tables/users").await;
    let u = u.expect(StatusCode::OK, None);
    assert_eq!(u["name"], "public.users");
    assert_eq!(u["primary_key"], json!(["id"]));
    assert_eq!(
        api.get("/v1/tables/public.users").await.status,
        StatusCode::OK
    );
    let added = api
        .json(
            Method::POST,
            "/v1/tables?warm=true",
            json!({"name": "orders"}),
        )
        .await;
    let added = added.expect(StatusCode::CREATED, None);
    assert_eq!(added["name"], "public.orders");
    api.json(Method::POST, "/v1/tables", json!({"name": "orders"}))
        .await
        .expect(StatusCode::CONFLICT, Some("conflict"));
    api.json(Method::POST, "/v1/tables", json!({"name": "no_such_table"}))
        .await
        .expect(StatusCode::NOT_FOUND, Some("not_found"));
    api.json(Method::POST, "/v1/tables", json!({"name": "nopk"}))
        .await
        .expect(StatusCode::BAD_REQUEST, Some("bad_request"));
    let mut warmed = false;
    for _ in 0..200 {
        let o = api.get("/v1/tables/orders").await;
        let st = &o.expect(StatusCode::OK, None)["state"];
        if st.to_string().contains("active") {
            warmed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(warmed, "orders never became active");
    let v: Option<String> = r.get("orders:7").await.unwrap();
    assert!(v.unwrap().contains("70"));
    let gone = api.send(Method::DELETE, "/v1/tables/orders", None).await;
    let gone = gone.expect(StatusCode::OK, None);
    assert_eq!(gone["removed"], "public.orders");
    assert!(gone["flushed"].as_u64().is_some());
    api.get("/v1/tables/orders")
        .await
        .expect(StatusCode::NOT_FOUND, Some("not_found"));
}

async fn check_keys_and_flush(api: &Api, r: &mut redis::aio::MultiplexedConnection) {
    // Keys and flushes: one key, one table, everything.
    let k = api.get("/v1/keys/users:1").await;
    let k = k.expect(StatusCode::OK, None);
    assert_eq!(k["cached"], true, "{k}");
    assert_eq!(k["table"], "public.users");
    assert!(
        k["lsn"].is_string() && k["size_bytes"].as_u64().unwrap() > 0,
        "{k}"
    );
    let f = api
        .json(Method::POST, "/v1/flush", json!({"key": "users:1"}))
        .await;
    assert_eq!(f.expect(StatusCode::OK, None)["flushed"], 1);
    let k = api.get("/v1/keys/users:1").await;
    let k = k.expect(StatusCode::OK, None);
    assert_eq!(k["cached"], false, "{k}");
    assert!(k["reason"].is_string(), "{k}");
    let k = api.get("/v1/keys/nosuchtable:1").await;
    assert_eq!(k.status, StatusCode::OK, "{}", k.text);
    assert_eq!(k.body["cached"], false);
    api.get("/v1/keys/nocolon")
        .await
        .expect(StatusCode::BAD_REQUEST, Some("bad_request"));
    let f = api
        .json(Method::POST, "/v1/flush", json!({"table": "users"}))
        .await;
    assert!(f.expect(StatusCode::OK, None)["flushed"].as_u64().unwrap() >= 1);
    api.json(Method::POST, "/v1/flush", json!({"table": "nope"}))
        .await
        .expect(StatusCode::NOT_FOUND, Some("not_found"));
    api.json(
        Method::POST,
        "/v1/flush",
        json!({"table": "users", "key": "users:1"}),
    )
    .await
    .expect(StatusCode::BAD_REQUEST, Some("bad_request"));
    let _: Option<String> = r.get("users:3").await.unwrap();
    let f = api.send(Method::POST, "/v1/flush", None).await;
    assert!(f.expect(StatusCode::OK, None)["flushed"].as_u64().unwrap() >= 1);
    let s = api.get("/v1/status").await;
    assert_eq!(s.body["store"]["entries"], 0, "{}", s.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_can_be_disabled() {
    let db = TestDb::create("api_off").await;
    let p = start(&db, &["api.enabled=false"]).await;
    assert_eq!(p.api_addr(), None);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_fails_while_the_origin_refuses_connections() {
    let db = TestDb::create("api_ready").await;
    db.client().await.batch_execute(SCHEMA).await.unwrap();
    let p = start(&db, &[]).await;
    let api = Api::new(&p, None);
    api.get("/v1/ready").await.expect(StatusCode::OK, None);

    let admin = origin::admin_client().await;
    let lock_out = format!(
        "ALTER DATABASE {0} ALLOW_CONNECTIONS false;
         SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{0}';",
        db.name
    );
    admin.batch_execute(&lock_out).await.unwrap();
    let r = api.get("/v1/ready").await;
    let body = r.expect(StatusCode::SERVICE_UNAVAILABLE, None);
    assert_eq!(body["ready"], false, "{body}");
    assert_eq!(body["checks"]["origin"], false, "{body}");
    assert_eq!(body["checks"]["cores"], true, "{body}");
    let detail = body["detail"].to_string();
    assert!(detail.contains("origin:"), "{detail}");

    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} ALLOW_CONNECTIONS true",
            db.name
        ))
        .await
        .unwrap();
    let mut back = false;
    for _ in 0..100 {
        if api.get("/v1/ready").await.status == StatusCode::OK {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(back, "never ready again after the origin came back");
    p.shutdown().await;
}
