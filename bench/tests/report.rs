//! `report` turns a sample JSONL into report.md and SVG charts.

#![recursion_limit = "256"]

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_pgline-bench");

fn row(
    scenario: &str,
    target: &str,
    clients: u64,
    rps: f64,
    p99: f64,
    stale: Option<u64>,
) -> String {
    serde_json::json!({
        "scenario": scenario, "label": "", "target": target, "op": "get", "mget": 1,
        "clients": clients, "pipeline": 1, "mode": "closed", "rate": null, "keys": "uniform",
        "keyspace": 100000, "zipf_s": 0.99, "write_rate": "unlimited", "writers": 4,
        "write_op": "update", "synchronous_commit": null, "duration_s": 10.0, "warmup_s": 2.0,
        "threads": 1, "requests": (rps * 10.0) as u64, "errors": 0, "hits": 900, "misses": 100,
        "unsent": 0, "rps": rps, "p50_us": 50.0, "p99_us": p99, "p999_us": 300.0,
        "max_us": 900.0, "send_lag_p99_us": null, "writes": 5000, "write_errors": 0,
        "write_rps": 500.0, "write_p50_us": 700.0, "write_p99_us": 2000.0,
        "server_cpu_s": {"pgline": 9.5}, "rps_per_server_cpu": rps / 0.95, "client_cpu_s": 9.9, "server_keyspace_hits": null, "server_keyspace_misses": null, "stale": stale,
        "env": {"cpu_model": "Test CPU", "cores": 2, "kernel": "6.1", "pgline_version": "0.1.0",
                "valkey_version": null, "postgres_version": "15.18", "git_rev": "abc1234",
                "started_at": "2026-11-30T22:00:00Z"}
    })
    .to_string()
}

#[test]
fn report_writes_markdown_tables_and_svg_charts() {
    let dir = std::env::temp_dir().join(format!("pgline-bench-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let jsonl = dir.join("runs.jsonl");
    let lines = [
        row("reads during writes", "resp", 64, 150_000.0, 120.0, Some(0)),
        row(
            "reads during writes",
            "cache-aside",
            64,
            42_000.0,
            900.0,
            Some(2),
        ),
        row("reads", "pg-prepared", 16, 30_000.0, 400.0, None),
    ];
    std::fs::write(&jsonl, lines.join("\n") + "\n").unwrap();
    let out = dir.join("out");
    let st = Command::new(BIN)
        .args([
            "report",
            "--out",
            out.to_str().unwrap(),
            jsonl.to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    // Scenarios in first-seen order, one table row per run, charts linked, environment listed.
    let a = md.find("## reads during writes").unwrap();
    let b = md.find("## reads\n").unwrap();
    assert!(a < b);
    assert!(
        md.contains("| resp get c64 uniform update w=unlimited | closed | 150000 | 50.0 | 120.0 |"),
        "{md}"
    );
    assert!(md.contains("| 0.900 |"));
    assert!(md.contains("pgline 9.50"));
    assert!(md.contains("![reads during writes req/s](reads-during-writes-rps.svg)"));
    assert!(md.contains("Test CPU (2 cores), kernel 6.1, pgline 0.1.0"));
    for f in [
        "reads-during-writes-rps.svg",
        "reads-during-writes-p99.svg",
        "reads-rps.svg",
        "reads-p99.svg",
    ] {
        let svg = std::fs::read_to_string(out.join(f)).unwrap();
        assert!(svg.starts_with("<svg"), "{f}");
        assert!(svg.contains("<rect"), "{f} has bars");
    }
    let svg = std::fs::read_to_string(out.join("reads-during-writes-rps.svg")).unwrap();
    assert!(
        svg.contains("cache-aside get c64 uniform update w=unlimited"),
        "labels are text"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_jsonl_flags_stale_rows_of_watched_targets_only() {
    let dir = std::env::temp_dir().join(format!("pgline-bench-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let jsonl = dir.join("runs.jsonl");
    let lines = [
        row("s", "resp", 64, 1.0, 1.0, Some(0)),
        row("s", "resp", 64, 1.0, 1.0, None),
        row("s", "cache-aside", 64, 1.0, 1.0, Some(2)),
    ];
    std::fs::write(&jsonl, lines.join("\n") + "\n").unwrap();
    let check = |watch: &str| {
        Command::new(BIN)
            .args([
                "check-jsonl",
                "--stale-zero-for",
                watch,
                jsonl.to_str().unwrap(),
            ])
            .output()
            .unwrap()
    };
    let ok = check("resp");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("3 rows, 0 bad"));
    let bad = check("cache-aside");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains(":3: cache-aside stale = Some(2)"));
    std::fs::remove_dir_all(&dir).unwrap();
}
