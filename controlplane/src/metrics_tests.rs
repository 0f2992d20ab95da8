//! Tests of [`super::render`]: the output parses back, every family is declared, counters only
//! grow, histograms are cumulative and the values are the ones counted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use pgline_dataplane::keyspace::{KeySpace, KeySpaceCell};
use pgline_dataplane::plane::{ControlWakers, CoreStats, Shared};
use pgline_dataplane::store::{self, StoreConfig};
use pgline_hugepages::PageLevel;

use super::*;

fn shared(cores: usize) -> Arc<Shared> {
    let cfg = StoreConfig {
        memory_bytes: 8 << 20,
        segment_bytes: 256 << 10,
        max_page_level: PageLevel::Base,
        prefault: false,
    };
    let (writer, reader) = store::open(&cfg).expect("store");
    // The reader's region must outlive the test.
    std::mem::forget(writer);
    Arc::new(Shared::new(
        reader,
        KeySpaceCell::new(KeySpace::new()),
        cores,
        16,
        ControlWakers::none(),
    ))
}

fn snapshot<'a>(shared: &'a Shared, repl: &'a ReplicationState) -> MetricsSnapshot<'a> {
    MetricsSnapshot {
        shared,
        repl,
        store: StoreStats {
            budget_bytes: 4 << 20,
            used_bytes: 1234,
            entries: 7,
            evicted_entries: 3,
            ..StoreStats::default()
        },
        pool: deadpool_postgres::Status {
            max_size: 8,
            size: 2,
            available: 1,
            waiting: 0,
        },
        now_us: 0,
        api_refusals: ApiRefusals::default(),
    }
}

/// One parsed exposition: family name → type, and sample (name + labels) → value.
#[derive(Debug, Default)]
struct Parsed {
    types: BTreeMap<String, String>,
    samples: BTreeMap<String, f64>,
}

/// A small OpenMetrics text parser: checks the line grammar and that every sample belongs to a
/// family whose HELP and TYPE came first.
fn parse(text: &str) -> Parsed {
    let mut p = Parsed::default();
    let mut helped = BTreeSet::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "ends with # EOF");
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP name text");
            assert!(!help.is_empty(), "{line}");
            assert!(helped.insert(name.to_string()), "HELP twice for {name}");
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(helped.contains(name), "TYPE before HELP: {name}");
            assert!(
                ["counter", "gauge", "histogram", "info"].contains(&kind),
                "{line}"
            );
            p.types.insert(name.to_string(), kind.to_string());
        } else {
            assert!(!line.starts_with('#'), "unexpected comment {line}");
            let (series, value) = line.rsplit_once(' ').expect("sample value");
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("value in {line}"));
            let name = series.split('{').next().unwrap_or(series);
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':'),
                "{line}"
            );
            let family = family_of(name, &p.types).unwrap_or_else(|| panic!("no TYPE for {line}"));
            let kind = &p.types[&family];
            if kind == "counter" {
                assert!(name.ends_with("_total"), "counter sample {line}");
            }
            assert!(
                p.samples.insert(series.to_string(), value).is_none(),
                "{line}"
            );
        }
    }
    p
}

fn family_of(name: &str, types: &BTreeMap<String, String>) -> Option<String> {
    if types.contains_key(name) {
        return Some(name.to_string());
    }
    ["_total", "_bucket", "_sum", "_count", "_info"]
        .iter()
        .filter_map(|s| name.strip_suffix(s))
        .find(|f| types.contains_key(*f))
        .map(str::to_string)
}

#[test]
fn every_family_is_declared_and_values_are_the_counted_ones() {
    let shared = shared(2);
    let repl = ReplicationState::default();
    CoreStats::add(&shared.stats(1).keys_hit, 5);
    CoreStats::add(&shared.stats(0).keys_miss, 2);
    shared.stats(1).connections_open.store(3, Ordering::Relaxed);
    shared.control_port().set_serve_hits(true);
    repl.streaming.store(true, Ordering::Relaxed);
    repl.applied_lsn.store(0x16_B374_D848, Ordering::Relaxed);
    repl.server_wal_end
        .store(0x16_B374_D848 + 100, Ordering::Relaxed);
    let text = render(&snapshot(&shared, &repl));
    let p = parse(&text);
    let get = |k: &str| *p.samples.get(k).unwrap_or_else(|| panic!("{k} in\n{text}"));
    assert_eq!(get(r#"pgline_core_keys_hit_total{core="1"}"#), 5.0);
    assert_eq!(get(r#"pgline_core_keys_hit_total{core="0"}"#), 0.0);
    assert_eq!(get(r#"pgline_core_keys_miss_total{core="0"}"#), 2.0);
    assert_eq!(get(r#"pgline_core_connections_open{core="1"}"#), 3.0);
    assert_eq!(get(r#"pgline_core_queue_capacity{core="0"}"#), 16.0);
    assert_eq!(get("pgline_store_used_bytes"), 1234.0);
    assert_eq!(get("pgline_store_evicted_entries_total"), 3.0);
    assert_eq!(get("pgline_replication_serve_hits"), 1.0);
    assert_eq!(get("pgline_replication_lag_bytes"), 100.0);
    assert_eq!(get("pgline_origin_pool_max_size"), 8.0);
    assert_eq!(get(r#"pgline_store_page_info{level="4KiB"}"#), 1.0);
    assert_eq!(p.types["pgline_core_service_seconds"], "histogram");
    // Every family named in the docs table exists (the docs list is checked by hand).
    assert!(p.types.len() >= 40, "{} families", p.types.len());
}

#[test]
fn counters_are_monotone_and_histograms_cumulative() {
    let shared = shared(2);
    let repl = ReplicationState::default();
    let first = parse(&render(&snapshot(&shared, &repl)));
    for core in 0..2 {
        let s = &shared.stats(core);
        CoreStats::add(&s.resp_commands, 10);
        CoreStats::add(&s.bytes_in, 100);
        s.service_time.record(3_000, 4); // 4 requests in a 3 us turn
        s.service_time.record(400_000_000, 1); // one past the last bound
    }
    repl.txns.store(9, Ordering::Relaxed);
    let second = parse(&render(&snapshot(&shared, &repl)));
    assert_eq!(first.types, second.types, "same families on every scrape");
    let mut grew = 0;
    for (series, v1) in &first.samples {
        let family =
            family_of(series.split('{').next().unwrap_or(series), &first.types).expect("family");
        if first.types[&family] != "counter" && first.types[&family] != "histogram" {
            continue;
        }
        let v2 = second.samples[series];
        assert!(v2 >= *v1, "{series} went from {v1} to {v2}");
        if v2 > *v1 {
            grew += 1;
        }
    }
    assert!(grew >= 6, "the counters we moved grew ({grew})");
    // Buckets: cumulative, +Inf equals _count.
    let bucket = |le: &str| {
        second.samples[&format!(r#"pgline_core_service_seconds_bucket{{le="{le}",core="1"}}"#)]
    };
    assert_eq!(bucket("0.000002"), 0.0);
    assert_eq!(bucket("0.000005"), 4.0);
    assert_eq!(bucket("0.1"), 4.0);
    assert_eq!(bucket("+Inf"), 5.0);
    assert_eq!(
        second.samples[r#"pgline_core_service_seconds_count{core="1"}"#],
        5.0
    );
    let sum = second.samples[r#"pgline_core_service_seconds_sum{core="1"}"#];
    assert!((sum - 0.400_012).abs() < 1e-9, "{sum}");
}

fn pgwire() -> PgwireSnapshot {
    PgwireSnapshot {
        sessions: 3,
        pools: vec![PgPoolSnapshot {
            user: "app".into(),
            database: "shop".into(),
            idle: 2,
            reserved: 1,
            total: 6,
        }],
        batches: 40,
        batch_errors: 1,
        reply_bytes: 4096,
        origin_us: 1_500_000,
        origin: crate::pgfront::OriginStats {
            startup_pending: 4,
            startup_refused: 36,
            auth_timeout: 4,
            backend_idle_closed: 7,
            backend_dead: 9,
            pools: 2,
            pool_forgotten: 5,
            pool_refused: 1,
            backend_steals: 12,
            backend_steals_unread: 5,
            origin_statements_closed: 6,
        },
    }
}

#[test]
fn pgwire_families_carry_the_relay_figures() {
    let shared = shared(2);
    let repl = ReplicationState::default();
    let text = render_with_pgwire(&snapshot(&shared, &repl), &pgwire());
    let p = parse(&text);
    let get = |k: &str| *p.samples.get(k).unwrap_or_else(|| panic!("{k} in\n{text}"));
    assert_eq!(get("pgline_pgwire_sessions"), 3.0);
    assert_eq!(get("pgline_pgwire_batches_total"), 40.0);
    assert_eq!(get("pgline_pgwire_batch_errors_total"), 1.0);
    assert_eq!(get("pgline_pgwire_reply_bytes_total"), 4096.0);
    assert_eq!(get("pgline_pgwire_origin_seconds_total"), 1.5);
    for (name, v) in [
        ("pgline_pgwire_startup_pending", 4.0),
        ("pgline_pgwire_startup_refused_total", 36.0),
        ("pgline_pgwire_auth_timeout_total", 4.0),
        ("pgline_pgwire_backend_idle_closed_total", 7.0),
        ("pgline_pgwire_backend_dead_total", 9.0),
        ("pgline_pgwire_pools", 2.0),
        ("pgline_pgwire_pool_forgotten_total", 5.0),
        ("pgline_pgwire_pool_refused_total", 1.0),
        ("pgline_pgwire_backend_steals_total", 12.0),
        ("pgline_pgwire_backend_steals_unread_total", 5.0),
        ("pgline_pgwire_origin_statements_closed_total", 6.0),
    ] {
        assert_eq!(get(name), v, "{name}");
    }
    let pool = |state: &str| {
        get(&format!(
            r#"pgline_pgwire_pool_connections{{user="app",database="shop",state="{state}"}}"#
        ))
    };
    assert_eq!(
        (pool("idle"), pool("reserved"), pool("busy")),
        (2.0, 1.0, 3.0)
    );
    assert_eq!(get(r#"pgline_core_pg_request_queue_depth{core="1"}"#), 0.0);
    // The front off: the same families, zero and without pool samples.
    let off = parse(&render(&snapshot(&shared, &repl)));
    assert_eq!(off.types, p.types);
    assert_eq!(off.samples["pgline_pgwire_batches_total"], 0.0);
    assert!(!off.samples.keys().any(|k| k.contains("pool_connections")));
}

/// Every family name `render` emits, as the docs and dashboards use it (counters with `_total`,
/// info families with `_info`, histograms bare).
fn exported_names() -> BTreeSet<String> {
    let shared = shared(1);
    let repl = ReplicationState::default();
    let p = parse(&render_with_pgwire(&snapshot(&shared, &repl), &pgwire()));
    p.types
        .iter()
        .map(|(name, kind)| match kind.as_str() {
            "counter" => format!("{name}_total"),
            "info" => format!("{name}_info"),
            _ => name.clone(),
        })
        .collect()
}

/// `pgline_…` words in a text.
fn names_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("pgline_") {
        let word: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[i + word.len()..];
        out.insert(word);
    }
    out
}

#[test]
fn docs_describe_every_metric_and_the_dashboard_uses_only_real_ones() {
    let exported = exported_names();
    let docs = include_str!("../../docs/operations.md");
    for name in &exported {
        assert!(
            docs.contains(&format!("| `{name}")),
            "{name} has no row in docs/operations.md"
        );
    }
    let dashboard = include_str!("../../deploy/grafana/pgline-dashboard.json");
    let used = names_in(dashboard);
    assert!(used.len() >= 25, "{used:?}");
    for name in used {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name);
        assert!(
            exported.contains(&name) || exported.contains(family),
            "the dashboard uses {name}, which pgline does not export"
        );
    }
}
