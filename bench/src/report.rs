//! `report`: JSONL rows → `report.md` (one table per scenario, in first-seen order, plus the
//! environments) and two SVG bar charts per scenario (`<scenario>-rps.svg`,
//! `<scenario>-p99.svg`).
//!
//! Charts use plotters' SVG backend only, without its `ttf` feature: text is written as SVG
//! `<text>` and laid out by the viewer, so no fontconfig/freetype is needed to build or run.

#![deny(unsafe_code)]

use crate::cli::ReportArgs;
use crate::error::BenchError;
use crate::record::{read_rows, Row};
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Writes the report; returns the files written.
pub fn report(args: &ReportArgs) -> Result<Vec<PathBuf>, BenchError> {
    let mut rows = Vec::new();
    for p in &args.inputs {
        rows.extend(read_rows(p)?);
    }
    std::fs::create_dir_all(&args.out)?;
    let groups = group_by_scenario(&rows);
    let mut md = String::from("# pgline-bench report\n\n");
    let mut written = Vec::new();
    for (scenario, rs) in &groups {
        let slug = slug(scenario);
        let _ = writeln!(md, "## {scenario}\n");
        md.push_str(&scenario_table(rs));
        let labels: Vec<String> = rs.iter().map(|r| row_label(r)).collect();
        let rps_path = args.out.join(format!("{slug}-rps.svg"));
        let rps: Vec<f64> = rs
            .iter()
            .map(|r| if r.clients > 0 { r.rps } else { r.write_rps })
            .collect();
        bar_chart(
            &rps_path,
            &format!("{scenario}: requests/s (writes/s without readers)"),
            &labels,
            &rps,
            "per second",
        )?;
        let p99_path = args.out.join(format!("{slug}-p99.svg"));
        let p99: Vec<f64> = rs
            .iter()
            .map(|r| {
                if r.clients > 0 {
                    r.p99_us
                } else {
                    r.write_p99_us
                }
            })
            .collect();
        bar_chart(
            &p99_path,
            &format!("{scenario}: p99 latency"),
            &labels,
            &p99,
            "microseconds",
        )?;
        let _ = writeln!(
            md,
            "\n![{scenario} req/s]({slug}-rps.svg)\n![{scenario} p99]({slug}-p99.svg)\n"
        );
        written.push(rps_path);
        written.push(p99_path);
    }
    md.push_str(&env_section(&rows));
    let md_path = args.out.join("report.md");
    std::fs::write(&md_path, md)?;
    written.push(md_path);
    Ok(written)
}

/// Rows grouped by scenario, groups and rows in input order.
pub fn group_by_scenario(rows: &[Row]) -> Vec<(String, Vec<&Row>)> {
    let mut groups: Vec<(String, Vec<&Row>)> = Vec::new();
    for r in rows {
        match groups.iter_mut().find(|(s, _)| *s == r.scenario) {
            Some((_, v)) => v.push(r),
            None => groups.push((r.scenario.clone(), vec![r])),
        }
    }
    groups
}

/// A short description of a row's cell.
pub fn row_label(r: &Row) -> String {
    if !r.label.is_empty() {
        return r.label.clone();
    }
    let mut s = format!("{} {}", r.target, r.op);
    if r.mget > 1 {
        let _ = write!(s, " {}", r.mget);
    }
    let _ = write!(s, " c{} p{} {}", r.clients, r.pipeline, r.keys);
    if let Some(rate) = r.rate {
        let _ = write!(s, " @{rate}/s");
    }
    if r.writers > 0 {
        let _ = write!(s, " w={}", json_plain(&r.write_rate));
    }
    s
}

fn json_plain(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The Markdown table of one scenario.
pub fn scenario_table(rows: &[&Row]) -> String {
    let mut t = String::from(
        "| cell | mode | req/s | p50 µs | p99 µs | p99.9 µs | max µs | hit ratio | server CPU s | req per CPU-s | writes/s | write p99 µs | stale | errors |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let hit = hit_ratio(r).map_or("-".into(), |h| format!("{h:.3}"));
        let cpu = if r.server_cpu_s.is_empty() {
            "-".into()
        } else {
            r.server_cpu_s
                .iter()
                .map(|(k, v)| format!("{k} {v:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let per_cpu = r
            .rps_per_server_cpu
            .map_or("-".into(), |v| format!("{v:.0}"));
        let stale = r.stale.map_or("-".into(), |s| s.to_string());
        let mode = match r.rate {
            Some(rate) => format!("open {rate}/s"),
            None => "closed".into(),
        };
        let _ = writeln!(
            t,
            "| {} | {mode} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {hit} | {cpu} | {per_cpu} | {:.0} | {:.1} | {stale} | {} |",
            row_label(r), r.rps, r.p50_us, r.p99_us, r.p999_us, r.max_us, r.write_rps, r.write_p99_us,
            r.errors + r.write_errors + r.unsent,
        );
    }
    t
}

/// The cache hit ratio of a row: the server's own counters when it reported them (pgline
/// fills misses itself, so its replies are never nil), else found / (found + missing).
pub fn hit_ratio(r: &Row) -> Option<f64> {
    let (h, m) = match (r.server_keyspace_hits, r.server_keyspace_misses) {
        (Some(h), Some(m)) if r.target == "resp" && h + m > 0 => (h, m),
        _ => (r.hits, r.misses),
    };
    (h + m > 0).then(|| h as f64 / (h + m) as f64)
}

fn env_section(rows: &[Row]) -> String {
    let mut seen: Vec<String> = Vec::new();
    for r in rows {
        let e = &r.env;
        let line = format!(
            "- {} ({} cores), kernel {}, pgline {}, valkey {}, PostgreSQL {}, git {}",
            e.cpu_model,
            e.cores,
            e.kernel,
            e.pgline_version.as_deref().unwrap_or("-"),
            e.valkey_version.as_deref().unwrap_or("-"),
            e.postgres_version.as_deref().unwrap_or("-"),
            e.git_rev.as_deref().unwrap_or("-"),
        );
        if !seen.contains(&line) {
            seen.push(line);
        }
    }
    let first = rows
        .iter()
        .map(|r| r.env.started_at.as_str())
        .min()
        .unwrap_or("-");
    let last = rows
        .iter()
        .map(|r| r.env.started_at.as_str())
        .max()
        .unwrap_or("-");
    format!(
        "## Environment\n\nRuns from {first} to {last} (UTC).\n\n{}\n",
        seen.join("\n")
    )
}

/// A file-name-safe form of a scenario name.
pub fn slug(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    if out.is_empty() {
        "scenario".into()
    } else {
        out
    }
}

fn plot_err<E: std::fmt::Display>(e: E) -> BenchError {
    BenchError::Plot(e.to_string())
}

/// A horizontal bar chart, one bar per label.
pub fn bar_chart(
    path: &Path,
    title: &str,
    labels: &[String],
    values: &[f64],
    unit: &str,
) -> Result<(), BenchError> {
    let n = labels.len().max(1);
    let height = 90 + 26 * n as u32;
    let root = SVGBackend::new(path, (960, height)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let max = values.iter().copied().fold(0.0f64, f64::max).max(1e-9) * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(380)
        .build_cartesian_2d(0.0..max, (0..n).into_segmented())
        .map_err(plot_err)?;
    let fmt = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&fmt)
        .x_desc(unit)
        .draw()
        .map_err(plot_err)?;
    chart
        .draw_series(values.iter().enumerate().map(|(i, &v)| {
            let mut bar = Rectangle::new(
                [
                    (0.0, SegmentValue::Exact(i)),
                    (v, SegmentValue::Exact(i + 1)),
                ],
                BLUE.mix(0.6).filled(),
            );
            bar.set_margin(3, 3, 0, 0);
            bar
        }))
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}
