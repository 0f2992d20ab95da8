//! The `pgline` binary's configuration handling, as an operator meets it.

use std::process::Command;

fn pgline(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgline"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run pgline");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn effective_config_layers_file_env_and_flags() {
    let dir = std::env::temp_dir().join(format!("pgline-cli-{}.toml", std::process::id()));
    std::fs::write(&dir, "[resp]\ncores = 2\n[store]\nmemory = \"64MiB\"\n").unwrap();
    let (code, out, err) = pgline(
        &[
            "config",
            "--config",
            dir.to_str().unwrap(),
            "--listen",
            "127.0.0.1:7777",
        ],
        &[
            ("PGLINE_STORE_MEMORY", "\"128MiB\""),
            ("PGLINE_REPLICATION_MAX_LAG_MS", "2500"),
        ],
    );
    let _ = std::fs::remove_file(&dir);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("listen = \"127.0.0.1:7777\""), "{out}");
    assert!(out.contains("cores = 2"), "{out}");
    assert!(out.contains(&format!("memory = {}", 128u64 << 20)), "{out}");
    assert!(out.contains("max_lag_ms = 2500"), "{out}");
}

#[test]
fn unknown_keys_and_bad_values_stop_start_up_naming_them() {
    let (code, _, err) = pgline(&["serve", "--set", "resp.corez=2"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("corez"), "{err}");
    let (code, _, err) = pgline(&["serve"], &[("PGLINE_RESP_LISTEN", "not-an-address")]);
    assert_eq!(code, 2);
    assert!(err.contains("resp.listen"), "{err}");
    let (code, _, err) = pgline(&["serve", "--memory", "12 parsecs"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("parsecs"), "{err}");
    let (code, _, err) = pgline(&["serve", "--config", "/nonexistent/pgline.toml"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/pgline.toml"), "{err}");
}

#[test]
fn unreachable_origin_is_reported_with_its_cause() {
    // Nothing listens on port 1.
    let (code, _, err) = pgline(
        &[
            "serve",
            "--origin",
            "host=127.0.0.1 port=1 user=x dbname=x",
            "--listen",
            "127.0.0.1:0",
        ],
        &[("PGLINE_ORIGIN_CONNECT_TIMEOUT_MS", "500")],
    );
    assert_ne!(code, 0);
    assert!(err.contains("origin unreachable"), "{err}");
}

#[test]
fn config_show_is_the_old_config_and_config_alone_still_works() {
    let (code, out, err) = pgline(&["config", "show", "--listen", "127.0.0.1:7778"], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("listen = \"127.0.0.1:7778\""), "{out}");
    let (code, out2, _) = pgline(&["config", "--listen", "127.0.0.1:7778"], &[]);
    assert_eq!(code, 0);
    assert_eq!(out, out2);
}

// ---- API clients against a scripted HTTP server -----------------------------------------------

mod fake_api {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    /// One request as the server saw it.
    #[derive(Debug, Clone)]
    pub struct Seen {
        pub method: String,
        pub path: String,
        pub auth: Option<String>,
        pub body: String,
    }

    pub type Handler = Box<dyn FnMut(&Seen) -> (u16, String) + Send>;

    /// Serves `handler` on a loopback port until the process ends; returns the base URL and the
    /// log of requests.
    pub fn serve(mut handler: Handler) -> (String, Arc<Mutex<Vec<Seen>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let seen_log = log.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut first = String::new();
                if reader.read_line(&mut first).is_err() {
                    continue;
                }
                let mut parts = first.split_whitespace();
                let method = parts.next().unwrap_or("").to_string();
                let path = parts.next().unwrap_or("").to_string();
                let (mut len, mut auth) = (0usize, None);
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    let (k, v) = h.split_once(':').unwrap_or((&h, ""));
                    match k.to_ascii_lowercase().as_str() {
                        "content-length" => len = v.trim().parse().unwrap_or(0),
                        "authorization" => auth = Some(v.trim().to_string()),
                        _ => {}
                    }
                }
                let mut body = vec![0u8; len];
                let _ = reader.read_exact(&mut body);
                let seen = Seen {
                    method,
                    path,
                    auth,
                    body: String::from_utf8_lossy(&body).into_owned(),
                };
                let (status, reply) = handler(&seen);
                seen_log.lock().unwrap().push(seen);
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
                    reply.len()
                );
            }
        });
        (url, log)
    }
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("{e}: {s}"))
}

#[test]
fn status_prints_a_summary_and_raw_json_with_the_token() {
    let status = r#"{"version":"0.1.0","uptime_s":3723,
        "cores":[{"core":0,"transport":"kernel","connections_open":2,"commands":10,"keys_hit":7,"keys_miss":3}],
        "memory":{"budget_bytes":268435456,"used_bytes":1536,"region_bytes":268435456,"page_level":"2MiB","pages":128},
        "store":{"entries":5,"negative_entries":1,"inserts":6,"evicted_entries":0,"evicted_segments":0,"segments_total":256,"segments_free":250},
        "replication":{"slot":"pgline","publication":"pgline","streaming":true,"confirmed_lsn":"0/16B3748","applied_lsn":"0/16B3748","lag_bytes":0,"lag_ms":0},
        "origin_pool":{"max_size":8,"size":2,"available":1,"waiting":0}}"#;
    let (url, log) = fake_api::serve(Box::new(move |_| (200, status.to_string())));
    let env = [
        ("PGLINE_API_URL", url.as_str()),
        ("PGLINE_API_TOKEN", "s3cret"),
    ];
    let (code, out, err) = pgline(&["status"], &env);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("up 1h 2m 3s"), "{out}");
    assert!(out.contains("1.5 KiB used of 256.0 MiB"), "{out}");
    assert!(out.contains("streaming yes"), "{out}");
    let row = out.lines().find(|l| l.starts_with("0 ")).expect("core row");
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        ["0", "kernel", "2", "10", "7", "3"]
    );
    let (code, out, _) = pgline(&["status", "--json"], &env);
    assert_eq!(code, 0);
    assert_eq!(json(&out), json(status));
    let seen = log.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].method, "GET");
    assert_eq!(seen[0].path, "/v1/status");
    assert_eq!(seen[0].auth.as_deref(), Some("Bearer s3cret"));
}

#[test]
fn tables_add_warm_polls_until_active_and_errors_are_reported() {
    let polls = std::sync::atomic::AtomicU32::new(0);
    let table = |state: &str| {
        format!(
            r#"{{"name":"public.users","key_template":"users:{{id}}","prefixes":["users"],
               "primary_key":["id"],"columns":3,"enabled":true,"state":{state},"entries":null}}"#
        )
    };
    let (url, log) = fake_api::serve(Box::new(move |req| {
        match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/v1/tables?warm=true") if req.body.contains("public.users") => {
                (201, table(r#"{"state":"warming","done":0,"total":3}"#))
            }
            ("POST", _) => (
                404,
                r#"{"error":"not_found","detail":"no table public.nope on the origin"}"#.into(),
            ),
            ("GET", "/v1/tables/public.users") => {
                let n = polls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n < 2 {
                    (
                        200,
                        table(&format!(
                            r#"{{"state":"warming","done":{},"total":3}}"#,
                            n + 1
                        )),
                    )
                } else {
                    (200, table(r#"{"state":"active"}"#))
                }
            }
            ("GET", "/v1/tables") => (200, format!("[{}]", table(r#"{"state":"active"}"#))),
            ("DELETE", "/v1/tables/public.users") => {
                (200, r#"{"removed":"public.users","flushed":42}"#.into())
            }
            _ => (500, r#"{"error":"internal","detail":"unexpected"}"#.into()),
        }
    }));
    let env = [("PGLINE_API_URL", url.as_str())];
    let (code, out, err) = pgline(&["tables", "add", "public.users", "--warm"], &env);
    assert_eq!(code, 0, "{err}");
    let row = out.lines().nth(1).expect("table row");
    assert!(row.starts_with("public.users  users:{id}  active"), "{out}");
    {
        let seen = log.lock().unwrap();
        assert_eq!(json(&seen[0].body), json(r#"{"name":"public.users"}"#));
        let gets = seen.iter().filter(|s| s.method == "GET").count();
        assert_eq!(gets, 3, "polled until active: {seen:?}");
    }
    let (code, out, _) = pgline(&["tables", "list"], &env);
    assert_eq!(code, 0);
    assert!(out.starts_with("NAME"), "{out}");
    assert!(out.contains("public.users  users:{id}  active"), "{out}");
    let (code, out, _) = pgline(&["tables", "remove", "public.users"], &env);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), "removed public.users, flushed 42 entries");
    let (code, out, err) = pgline(&["tables", "add", "public.nope"], &env);
    assert_eq!(code, 1, "{out}");
    assert!(
        err.contains("HTTP 404 not_found: no table public.nope on the origin"),
        "{err}"
    );
}

#[test]
fn flush_and_config_get_set_send_the_contract_bodies() {
    let cfg = r#"{"replication":{"max_lag_ms":500,"slot":"pgline"},"log":{"level":"debug","json":false},"api":{"token":"***"}}"#;
    let (url, log) = fake_api::serve(Box::new(move |req| match req.method.as_str() {
        "POST" => (200, r#"{"flushed":1}"#.into()),
        "PATCH" if req.body.contains("listen") => (
            409,
            r#"{"error":"restart_required","detail":"resp.listen needs a restart"}"#.into(),
        ),
        _ => (200, cfg.to_string()),
    }));
    let env = [("PGLINE_API_URL", url.as_str())];
    let (code, out, _) = pgline(&["flush", "--key", "users:42"], &env);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), "flushed 1 entries");
    let (code, _, _) = pgline(&["flush"], &env);
    assert_eq!(code, 0);
    let (code, _, err) = pgline(&["flush", "--key", "a:1", "--table", "a"], &env);
    assert_eq!(code, 2, "conflicting flags: {err}");

    let (code, out, err) = pgline(
        &[
            "config",
            "set",
            "replication.max_lag_ms=500",
            "log.level=debug",
        ],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "replication.max_lag_ms = 500\nlog.level = \"debug\"\n");
    let (code, _, err) = pgline(&["config", "set", "resp.listen=127.0.0.1:1"], &env);
    assert_eq!(code, 1);
    assert!(
        err.contains("409 restart_required: resp.listen needs a restart"),
        "{err}"
    );

    let (code, out, _) = pgline(&["config", "get", "replication.max_lag_ms"], &env);
    assert_eq!(code, 0);
    assert_eq!(out, "replication.max_lag_ms = 500\n");
    let (code, out, _) = pgline(&["config", "get"], &env);
    assert_eq!(code, 0);
    assert!(
        out.contains("[replication]") && out.contains("max_lag_ms = 500"),
        "{out}"
    );
    let (code, _, err) = pgline(&["config", "get", "replication.nope"], &env);
    assert_eq!(code, 1);
    assert!(err.contains("no setting \"replication.nope\""), "{err}");

    let seen = log.lock().unwrap();
    let bodies: Vec<(String, String, serde_json::Value)> = seen
        .iter()
        .filter(|s| s.method != "GET")
        .map(|s| (s.method.clone(), s.path.clone(), json(&s.body)))
        .collect();
    assert_eq!(
        bodies[0],
        (
            "POST".into(),
            "/v1/flush".into(),
            json(r#"{"key":"users:42"}"#)
        )
    );
    assert_eq!(bodies[1].2, json("{}"));
    assert_eq!(
        bodies[2],
        (
            "PATCH".into(),
            "/v1/config".into(),
            json(r#"{"replication":{"max_lag_ms":500},"log":{"level":"debug"}}"#)
        )
    );
}

#[test]
fn a_down_api_is_a_clear_error() {
    let (code, _, err) = pgline(&["status", "--api", "127.0.0.1:1"], &[]);
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot reach the pgline API at http://127.0.0.1:1/v1/status"),
        "{err}"
    );
    assert!(err.contains("api.listen"), "{err}");
}

#[test]
fn nic_flag_selects_the_transport_and_dpdk_needs_its_feature() {
    let (code, out, err) = pgline(
        &[
            "config",
            "--nic",
            "dpdk",
            "--set",
            "nic.port=\"net_null0\"",
            "--set",
            "nic.ip=\"10.0.0.2\"",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("mode = \"dpdk\""), "{out}");
    assert!(out.contains("no_pci = true"), "{out}");
    let (code, _, err) = pgline(&["serve", "--nic", "dpdk"], &[]);
    assert_eq!(code, 2, "nic.ip and nic.port are required: {err}");
    assert!(err.contains("nic.ip"), "{err}");
    let (code, _, err) = pgline(
        &[
            "serve",
            "--nic",
            "dpdk",
            "--set",
            "nic.ip=\"10.0.0.2\"",
            "--set",
            "nic.port=\"net_null0\"",
        ],
        &[],
    );
    assert_ne!(code, 0);
    if cfg!(feature = "dpdk") {
        // Passes the transport check; the origin (connected before the port opens) is not up.
        assert!(err.contains("origin unreachable"), "{err}");
    } else {
        assert!(err.contains("built without the dpdk feature"), "{err}");
    }
    let (code, _, err) = pgline(&["serve", "--nic", "rdma"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("rdma"), "{err}");
    let (code, _, err) = pgline(
        &[
            "serve",
            "--set",
            "nic.mode=\"mem\"",
            "--set",
            "nic.ip=\"10.0.0.2\"",
        ],
        &[],
    );
    assert_eq!(code, 2);
    assert!(err.contains("in-process tests"), "{err}");
}
