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
        let bars = |value: fn(&Row) -> f64| -> Vec<Bar> {
            rs.iter()
                .map(|r| Bar {
                    label: row_label(r),
                    value: value(r),
                    color: target_color(&r.target),
                })
                .collect()
        };
        let rps_path = args.out.join(format!("{slug}-rps.svg"));
        let rps = bars(|r| if r.clients > 0 { r.rps } else { r.write_rps });
        let title = format!("{scenario}: requests/s (writes/s without readers)");
        bar_chart(&rps_path, &title, &rps, "per second")?;
        let p99_path = args.out.join(format!("{slug}-p99.svg"));
        let p99 = bars(|r| {
            if r.clients > 0 {
                r.p99_us
            } else {
                r.write_p99_us
            }
        });
        bar_chart(
            &p99_path,
            &format!("{scenario}: p99 latency"),
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
    let cell = cell_params(r);
    if r.label.is_empty() {
        format!("{} {cell}", r.target)
    } else {
        format!("{} · {cell}", r.label)
    }
}

/// What distinguishes a cell of a scenario: the read op and load, the writers.
fn cell_params(r: &Row) -> String {
    let mut s = String::new();
    if r.clients > 0 {
        s.push_str(&r.op);
        if r.mget > 1 {
            let _ = write!(s, " {}", r.mget);
        }
        let _ = write!(s, " c{}", r.clients);
        if r.pipeline > 1 {
            let _ = write!(s, " p{}", r.pipeline);
        }
        let _ = write!(s, " {}", r.keys);
        if let Some(rate) = r.rate {
            let _ = write!(s, " @{rate}/s");
        }
    }
    if r.writers > 0 {
        if !s.is_empty() {
            s.push(' ');
        }
        let _ = write!(s, "{} w={}", r.write_op, json_plain(&r.write_rate));
        if let Some(sc) = &r.synchronous_commit {
            let _ = write!(s, " sync_commit={sc}");
        }
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
        "| cell | mode | req/s | p50 µs | p99 µs | p99.9 µs | max µs | hit ratio | server CPU s | req per CPU-s | server RSS MiB | writes/s | write p99 µs | stale | errors |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
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
        let rss = if r.server_rss_kib.is_empty() {
            "-".into()
        } else {
            let each = r
                .server_rss_kib
                .iter()
                .map(|(k, v)| format!("{k} {:.0}", *v as f64 / 1024.0));
            each.collect::<Vec<_>>().join(", ")
        };
        let mode = match r.rate {
            Some(rate) => format!("open {rate}/s"),
            None => "closed".into(),
        };
        let _ = writeln!(
            t,
            "| {} | {mode} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {hit} | {cpu} | {per_cpu} | {rss} | {:.0} | {:.1} | {stale} | {} |",
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

/// Bar colour by target: pgline/RESP blue, cache-aside orange, PostgreSQL green.
pub fn target_color(target: &str) -> RGBColor {
    match target {
        "resp" => RGBColor(31, 119, 180),
        "cache-aside" => RGBColor(255, 127, 14),
        _ => RGBColor(44, 160, 44),
    }
}

/// One bar of a chart.
pub struct Bar {
    /// Y-axis text.
    pub label: String,
    /// Length.
    pub value: f64,
    /// Fill.
    pub color: RGBColor,
}

/// A horizontal bar chart, bars top to bottom in the given order.
pub fn bar_chart(path: &Path, title: &str, bars: &[Bar], unit: &str) -> Result<(), BenchError> {
    let n = bars.len().max(1);
    let height = 90 + 26 * n as u32;
    let root = SVGBackend::new(path, (960, height)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let max = bars
        .iter()
        .map(|b| b.value)
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.1;
    // Segment k (0 at the bottom) shows bar n-1-k, so the first bar is on top.
    let slot = |i: usize| n - 1 - i;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(380)
        .build_cartesian_2d(0.0..max, (0..n - 1).into_segmented())
        .map_err(plot_err)?;
    let ylabel = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(k) if *k < n => bars
            .get(slot(*k))
            .map(|b| b.label.clone())
            .unwrap_or_default(),
        _ => String::new(),
    };
    let xlabel = |v: &f64| format!("{v:.0}");
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_labels(8)
        .max_light_lines(1)
        .y_labels(n)
        .y_label_formatter(&ylabel)
        .x_label_formatter(&xlabel)
        .x_desc(unit)
        .draw()
        .map_err(plot_err)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let k = slot(i);
            let mut bar = Rectangle::new(
                [
                    (0.0, SegmentValue::Exact(k)),
                    (b.value, SegmentValue::Exact(k + 1)),
                ],
                b.color.mix(0.75).filled(),
            );
            bar.set_margin(3, 3, 0, 0);
            bar
        }))
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}
