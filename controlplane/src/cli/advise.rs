//! `pgline advise`: what a running pgline would serve of the origin's workload
//! (`GET /v1/advice`, computed by the server from the origin's `pg_stat_statements`). A summary
//! by verdict, the pass-through reasons, the operator's actions and the busiest statements; the
//! API's JSON with `--json`.

use std::process::ExitCode;

use pgline_controlplane::advise::{Advice, Share, Verdict};

use super::{print_json, print_table, ClientArgs};

/// Widest statement text in the table (the JSON has up to 2,000 characters).
const QUERY_WIDTH: usize = 80;

#[derive(clap::Args, Debug)]
pub struct AdviseArgs {
    /// Hit ratio assumed for the statements pgline would serve (0..=1).
    #[arg(long, default_value_t = 0.95)]
    pub hit_ratio: f64,
    /// Statements read from pg_stat_statements, busiest by origin time first (1..=10000).
    #[arg(long, default_value_t = 1000)]
    pub limit: u32,
    /// Statements listed in the text output (all of them are in --json).
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub fn run(args: &AdviseArgs) -> ExitCode {
    let client = match args.client.client() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let path = format!(
        "/v1/advice?hit_ratio={}&limit={}",
        args.hit_ratio, args.limit
    );
    let v = match client.get(&path) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("pgline: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.client.json {
        print_json(&v);
        return ExitCode::SUCCESS;
    }
    match serde_json::from_value::<Advice>(v) {
        Ok(a) => {
            print_advice(&a, args.top);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pgline: GET {path}: unexpected answer: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_advice(a: &Advice, top: usize) {
    println!(
        "database {}: {} statements read, {} calls, {} at the origin (of {} statements in \
         pg_stat_statements)",
        a.database,
        a.read.statements,
        a.read.calls,
        ms(a.read.exec_ms),
        a.all.statements
    );
    println!();
    let line = |name: &str, s: &Share| {
        vec![
            name.to_string(),
            s.totals.statements.to_string(),
            s.totals.calls.to_string(),
            format!("{:.1}%", s.calls_pct),
            ms(s.totals.exec_ms),
            format!("{:.1}%", s.exec_pct),
        ]
    };
    let rows = vec![
        line("store (point lookups)", &a.store),
        line("result cache", &a.results),
        line("served", &a.served),
        line("pass-through", &a.pass),
    ];
    print_table(
        &[
            "",
            "STATEMENTS",
            "CALLS",
            "OF CALLS",
            "ORIGIN TIME",
            "OF TIME",
        ],
        &rows,
    );
    println!();
    println!(
        "at a {:.0}% hit ratio pgline would save the origin {:.0} calls and {} ({:.1}% of its \
         time on these statements)",
        a.estimate.hit_ratio * 100.0,
        a.estimate.calls_saved,
        ms(a.estimate.exec_ms_saved),
        a.estimate.exec_pct_saved
    );
    if !a.pass_reasons.is_empty() {
        println!();
        let rows: Vec<Vec<String>> = a
            .pass_reasons
            .iter()
            .map(|r| line(&r.reason, &r.share))
            .collect();
        print_table(
            &[
                "PASS REASON",
                "STATEMENTS",
                "CALLS",
                "OF CALLS",
                "ORIGIN TIME",
                "OF TIME",
            ],
            &rows,
        );
    }
    if !a.actions.is_empty() {
        println!();
        println!("what you can change:");
        for x in &a.actions {
            println!(
                "  {}  ({} calls, {})\n      {}",
                x.action,
                x.totals.calls,
                ms(x.totals.exec_ms),
                x.detail
            );
        }
    }
    if top > 0 && !a.statements.is_empty() {
        println!();
        let rows: Vec<Vec<String>> = a
            .statements
            .iter()
            .take(top)
            .map(|s| {
                let verdict = match s.verdict {
                    Verdict::Store => "store".to_string(),
                    Verdict::Results => "results".to_string(),
                    Verdict::Pass => format!("pass: {}", s.reason.as_deref().unwrap_or("-")),
                };
                let text = s.query.split_whitespace().collect::<Vec<_>>().join(" ");
                let text = match text.char_indices().nth(QUERY_WIDTH) {
                    Some((i, _)) => format!("{}…", &text[..i]),
                    None => text,
                };
                vec![verdict, s.calls.to_string(), ms(s.total_exec_ms), text]
            })
            .collect();
        print_table(&["VERDICT", "CALLS", "ORIGIN TIME", "QUERY"], &rows);
    }
    println!();
    println!("caveats:");
    for c in &a.caveats {
        println!("  - {c}");
    }
}

/// Milliseconds as text: `0.4 ms`, `1,250.0 ms` → `1.25 s`.
fn ms(v: f64) -> String {
    if v < 1000.0 {
        format!("{v:.1} ms")
    } else {
        format!("{:.2} s", v / 1000.0)
    }
}
