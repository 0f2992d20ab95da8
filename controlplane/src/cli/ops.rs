//! `pgline status`, `tables`, `flush`, `queries` and `config get|set`: thin clients of the HTTP API.

use std::process::ExitCode;
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::api::{encode_segment, ApiClient, ApiError};
use super::{print_json, print_table, ClientArgs};

#[derive(clap::Subcommand, Debug)]
pub enum TablesAction {
    /// List the cached tables, their key template and state.
    List(ClientArgs),
    /// Start caching a table of the origin.
    Add {
        /// `table` or `schema.table`.
        name: String,
        /// Load the table's rows now (shows progress until it is active).
        #[arg(long)]
        warm: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Stop caching a table and drop its entries.
    Remove {
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(clap::Args, Debug)]
pub struct FlushArgs {
    /// Flush one table's entries only.
    #[arg(long, conflicts_with = "key")]
    pub table: Option<String>,
    /// Flush one key, e.g. users:42.
    #[arg(long)]
    pub key: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(clap::Args, Debug)]
pub struct ConfigGetArgs {
    /// Settings to print (`section.key`); none: the whole effective configuration.
    pub keys: Vec<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(clap::Args, Debug)]
pub struct ConfigSetArgs {
    /// `section.key=value` (TOML value syntax; a bare word is a string).
    #[arg(required = true, value_name = "SECTION.KEY=VALUE")]
    pub settings: Vec<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Runs `f` with a client; maps API errors to exit 1 with their text.
fn with_client(args: &ClientArgs, f: impl FnOnce(&ApiClient) -> Result<(), ApiError>) -> ExitCode {
    let client = match args.client() {
        Ok(c) => c,
        Err(code) => return code,
    };
    match f(&client) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pgline: {e}");
            ExitCode::FAILURE
        }
    }
}

fn s(v: &Value, ptr: &str) -> String {
    match v.pointer(ptr) {
        Some(Value::String(t)) => t.clone(),
        Some(Value::Null) | None => "-".into(),
        Some(Value::Bool(b)) => if *b { "yes" } else { "no" }.into(),
        Some(other) => other.to_string(),
    }
}

fn n(v: &Value, ptr: &str) -> u64 {
    v.pointer(ptr).and_then(Value::as_u64).unwrap_or(0)
}

/// `1536` → `1.5 KiB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

pub fn status(args: &ClientArgs) -> ExitCode {
    with_client(args, |c| {
        let v = c.get("/v1/status")?;
        if args.json {
            print_json(&v);
            return Ok(());
        }
        let up = n(&v, "/uptime_s");
        println!(
            "pgline {}  up {}h {}m {}s  ({})",
            s(&v, "/version"),
            up / 3600,
            up / 60 % 60,
            up % 60,
            c.base()
        );
        println!(
            "memory       {} used of {} (region {}, {} x {} pages)",
            human_bytes(n(&v, "/memory/used_bytes")),
            human_bytes(n(&v, "/memory/budget_bytes")),
            human_bytes(n(&v, "/memory/region_bytes")),
            s(&v, "/memory/pages"),
            s(&v, "/memory/page_level"),
        );
        println!(
            "store        {} entries ({} negative), {} inserts, evicted {} entries / {} segments, {} of {} segments free",
            n(&v, "/store/entries"),
            n(&v, "/store/negative_entries"),
            n(&v, "/store/inserts"),
            n(&v, "/store/evicted_entries"),
            n(&v, "/store/evicted_segments"),
            n(&v, "/store/segments_free"),
            n(&v, "/store/segments_total"),
        );
        println!(
            "replication  slot {} publication {}  streaming {}  confirmed {}  applied {}  lag {} / {} ms",
            s(&v, "/replication/slot"),
            s(&v, "/replication/publication"),
            s(&v, "/replication/streaming"),
            s(&v, "/replication/confirmed_lsn"),
            s(&v, "/replication/applied_lsn"),
            human_bytes(n(&v, "/replication/lag_bytes")),
            n(&v, "/replication/lag_ms"),
        );
        println!(
            "origin pool  {} of {} open, {} idle, {} waiting",
            n(&v, "/origin_pool/size"),
            n(&v, "/origin_pool/max_size"),
            n(&v, "/origin_pool/available"),
            n(&v, "/origin_pool/waiting"),
        );
        println!();
        let cores = v.get("cores").and_then(Value::as_array).cloned();
        let rows: Vec<Vec<String>> = cores
            .unwrap_or_default()
            .iter()
            .map(|c| {
                [
                    "/core",
                    "/transport",
                    "/connections_open",
                    "/commands",
                    "/keys_hit",
                    "/keys_miss",
                ]
                .iter()
                .map(|p| s(c, p))
                .collect()
            })
            .collect();
        print_table(
            &[
                "CORE",
                "TRANSPORT",
                "CONNECTIONS",
                "COMMANDS",
                "HITS",
                "MISSES",
            ],
            &rows,
        );
        Ok(())
    })
}

fn state_text(t: &Value) -> String {
    match t.pointer("/state/state").or_else(|| t.get("state")) {
        Some(Value::String(st)) if st == "warming" => {
            format!("warming {}/{}", n(t, "/state/done"), n(t, "/state/total"))
        }
        Some(Value::String(st)) if st == "failed" => format!("failed: {}", s(t, "/state/detail")),
        Some(Value::String(st)) => st.clone(),
        Some(Value::Object(o)) => o
            .get("state")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string(),
        _ => "-".into(),
    }
}

/// The TableState tag: `active`, `warming` or `failed`.
fn state_tag(t: &Value) -> &str {
    t.pointer("/state/state")
        .or_else(|| t.get("state"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn table_row(t: &Value) -> Vec<String> {
    let pk = t
        .get("primary_key")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    vec![
        s(t, "/name"),
        s(t, "/key_template"),
        state_text(t),
        s(t, "/entries"),
        s(t, "/enabled"),
        pk,
    ]
}

const TABLE_HEADERS: [&str; 6] = ["NAME", "KEY", "STATE", "ENTRIES", "ENABLED", "PRIMARY KEY"];

pub fn tables(action: &TablesAction) -> ExitCode {
    match action {
        TablesAction::List(args) => with_client(args, |c| {
            let v = c.get("/v1/tables")?;
            if args.json {
                print_json(&v);
            } else {
                let rows: Vec<_> = v
                    .as_array()
                    .map(|a| a.iter().map(table_row).collect())
                    .unwrap_or_default();
                print_table(&TABLE_HEADERS, &rows);
            }
            Ok(())
        }),
        TablesAction::Add { name, warm, client } => with_client(client, |c| {
            let path = format!("/v1/tables?warm={warm}");
            let mut t = c.call("POST", &path, Some(&json!({ "name": name })))?;
            if *warm && state_tag(&t) == "warming" {
                t = wait_warm(c, name, &t)?;
            }
            if client.json {
                print_json(&t);
            } else {
                print_table(&TABLE_HEADERS, &[table_row(&t)]);
            }
            if state_tag(&t) == "failed" {
                return Err(ApiError::BadResponse {
                    method: "POST",
                    path,
                    detail: format!("warming {name} failed: {}", s(&t, "/state/detail")),
                });
            }
            Ok(())
        }),
        TablesAction::Remove { name, client } => with_client(client, |c| {
            let path = format!("/v1/tables/{}", encode_segment(name));
            let v = c.call("DELETE", &path, None)?;
            if client.json {
                print_json(&v);
            } else {
                println!(
                    "removed {}, flushed {} entries",
                    s(&v, "/removed"),
                    n(&v, "/flushed")
                );
            }
            Ok(())
        }),
    }
}

/// Polls the table until it leaves `warming`, drawing a progress bar on stderr (hidden when
/// stderr is not a terminal).
fn wait_warm(c: &ApiClient, name: &str, first: &Value) -> Result<Value, ApiError> {
    let bar = indicatif::ProgressBar::new(n(first, "/state/total").max(1));
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "warming {msg} [{bar:40}] {pos}/{len} rows ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(name.to_string());
    let path = format!("/v1/tables/{}", encode_segment(name));
    loop {
        let t = c.get(&path)?;
        if state_tag(&t) != "warming" {
            if state_tag(&t) == "active" {
                bar.set_position(bar.length().unwrap_or(0));
                bar.finish();
            } else {
                bar.abandon();
            }
            return Ok(t);
        }
        bar.set_length(n(&t, "/state/total").max(1));
        bar.set_position(n(&t, "/state/done"));
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn flush(args: &FlushArgs) -> ExitCode {
    with_client(&args.client, |c| {
        let body = match (&args.table, &args.key) {
            (Some(t), _) => json!({ "table": t }),
            (None, Some(k)) => json!({ "key": k }),
            (None, None) => json!({}),
        };
        let v = c.call("POST", "/v1/flush", Some(&body))?;
        if args.client.json {
            print_json(&v);
        } else {
            println!("flushed {} entries", n(&v, "/flushed"));
        }
        Ok(())
    })
}

/// Removes nulls (unset options) so the value converts to TOML.
fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_nulls).collect()),
        other => other.clone(),
    }
}

fn toml_text(v: &Value) -> String {
    toml::Value::try_from(strip_nulls(v))
        .map(|t| t.to_string())
        .unwrap_or_else(|_| v.to_string())
}

fn lookup<'a>(cfg: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.').try_fold(cfg, |v, part| v.get(part))
}

pub fn config_get(args: &super::ops::ConfigGetArgs) -> ExitCode {
    with_client(&args.client, |c| {
        let cfg = c.get("/v1/config")?;
        if args.keys.is_empty() {
            if args.client.json {
                print_json(&cfg);
            } else {
                // A document (one [section] per table), like `pgline config show`.
                match toml::to_string(&strip_nulls(&cfg)) {
                    Ok(doc) => print!("{doc}"),
                    Err(_) => print_json(&cfg),
                }
            }
            return Ok(());
        }
        let mut picked = Map::new();
        for key in &args.keys {
            let v = lookup(&cfg, key).ok_or_else(|| ApiError::BadResponse {
                method: "GET",
                path: "/v1/config".into(),
                detail: format!("no setting {key:?} (`pgline config get` lists them all)"),
            })?;
            picked.insert(key.clone(), v.clone());
        }
        for (k, v) in &picked {
            if !args.client.json {
                println!("{k} = {}", toml_text(v));
            }
        }
        if args.client.json {
            print_json(&Value::Object(picked));
        }
        Ok(())
    })
}

/// `section.key=value` settings as a nested JSON patch (values in TOML syntax).
pub fn compose_patch(settings: &[String]) -> Result<Value, String> {
    let mut patch = Map::new();
    for s in settings {
        let (key, raw) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: expected section.key=value"))?;
        let parts: Vec<&str> = key.trim().split('.').collect();
        if parts.len() < 2 || parts.iter().any(|p| p.is_empty()) {
            return Err(format!("{key:?} is not section.key"));
        }
        let value = format!("v = {raw}")
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(raw.to_string()));
        let value = serde_json::to_value(value).map_err(|e| format!("{key}: {e}"))?;
        let mut node = &mut patch;
        for part in &parts[..parts.len() - 1] {
            let entry = node
                .entry(part.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            node = entry
                .as_object_mut()
                .ok_or_else(|| format!("{key:?}: {part} is set as a value and as a section"))?;
        }
        node.insert(parts[parts.len() - 1].to_string(), value);
    }
    Ok(Value::Object(patch))
}

pub fn config_set(args: &ConfigSetArgs) -> ExitCode {
    let patch = match compose_patch(&args.settings) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("pgline: config set: {e}");
            return ExitCode::from(2);
        }
    };
    with_client(&args.client, |c| {
        let cfg = c.call("PATCH", "/v1/config", Some(&patch))?;
        if args.client.json {
            print_json(&cfg);
            return Ok(());
        }
        for s in &args.settings {
            let key = s.split_once('=').map_or(s.as_str(), |(k, _)| k.trim());
            let now = lookup(&cfg, key).map_or("-".into(), toml_text);
            println!("{key} = {now}");
        }
        Ok(())
    })
}

/// Widest query text `pgline queries` prints in its table (the JSON has it whole).
const QUERY_WIDTH: usize = 100;

/// `pgline queries`: the PostgreSQL front's per-statement statistics (GET /v1/queries).
pub fn queries(args: &ClientArgs) -> ExitCode {
    with_client(args, |c| {
        let v = c.get("/v1/queries")?;
        if args.json {
            print_json(&v);
            return Ok(());
        }
        let list = v.as_array().cloned().unwrap_or_default();
        if list.is_empty() {
            println!("no statements forwarded yet (or the PostgreSQL front is off)");
            return Ok(());
        }
        let rows: Vec<Vec<String>> = list
            .iter()
            .map(|q| {
                let text = s(q, "/query");
                let text = match text.char_indices().nth(QUERY_WIDTH) {
                    Some((i, _)) => format!("{}…", &text[..i]),
                    None => text,
                };
                vec![
                    n(q, "/calls").to_string(),
                    n(q, "/errors").to_string(),
                    format_us(n(q, "/mean_us")),
                    format_us(n(q, "/p99_us")),
                    human_bytes(n(q, "/bytes")),
                    text,
                ]
            })
            .collect();
        print_table(&["CALLS", "ERRORS", "MEAN", "P99", "BYTES", "QUERY"], &rows);
        Ok(())
    })
}

/// `1500` → `1.5 ms`; under a millisecond in microseconds.
fn format_us(us: u64) -> String {
    if us < 1000 {
        format!("{us} us")
    } else if us < 1_000_000 {
        format!("{:.1} ms", us as f64 / 1e3)
    } else {
        format!("{:.2} s", us as f64 / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_become_a_nested_patch() {
        let p = compose_patch(&[
            "replication.max_lag_ms=500".into(),
            "log.level=debug".into(),
            "log.json=true".into(),
            "catalog.prefixes.users=\"u\"".into(),
        ])
        .unwrap();
        assert_eq!(
            p,
            json!({"replication":{"max_lag_ms":500},"log":{"level":"debug","json":true},
                   "catalog":{"prefixes":{"users":"u"}}})
        );
        assert!(compose_patch(&["nodot=1".into()]).is_err());
        assert!(compose_patch(&["a.b".into()]).is_err());
        assert!(compose_patch(&["a.b=1".into(), "a.b.c=2".into()]).is_err());
    }

    #[test]
    fn table_states_read_as_text() {
        let t = json!({"name":"public.users","state":{"state":"warming","done":3,"total":10}});
        assert_eq!(state_text(&t), "warming 3/10");
        assert_eq!(state_tag(&t), "warming");
        // With serde's internal tag flattened into the status object.
        let t = json!({"name":"public.users","state":"active"});
        assert_eq!(state_text(&t), "active");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(format_us(640), "640 us");
        assert_eq!(format_us(1500), "1.5 ms");
        assert_eq!(format_us(2_500_000), "2.50 s");
    }
}
