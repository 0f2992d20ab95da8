//! `pgline-bench`: the load generator, stale checker, table loader and report writer of the
//! pgline benchmark (pgline vs Valkey with application cache-aside vs PostgreSQL).
//!
//! - `run` drives one cell (target, op, clients, pipeline, closed/open loop, key space,
//!   writers) and appends one JSONL row with every parameter, the results and the environment
//!   (`runner`, `record`);
//! - `stale-check` compares a cache with the origin key by key (`stale`);
//! - `load` creates the `bench_rows` table (`load`) or the SaaS dashboard schema (`saas`);
//! - `report` turns JSONL into Markdown and SVG (`report`).
//!
//! # Thread model
//! One tokio multi-thread runtime with `--threads` workers (default 1, so on a 2-core machine
//! the client leaves the other core to the server); clients and writers are tasks on it.
//!
//! # Limitations
//! One process: the client's own CPU can bound a run. The JSONL says which servers' CPU was
//! measured, not the client's; compare `rps` with the open-loop offered `rate` and watch
//! `send_lag_p99_us` to see a client-bound run.

#![deny(unsafe_code)]

mod cli;
mod env;
mod error;
mod keys;
mod load;
mod pacer;
mod pg;
mod record;
mod report;
mod resp;
mod runner;
mod saas;
mod schedule;
mod stale;
mod stats;
mod target;

use clap::Parser;
use cli::{Cli, Command};
use error::BenchError;

fn main() {
    let cli = Cli::parse();
    if let Err(e) = dispatch(cli.command) {
        eprintln!("pgline-bench: {e}");
        std::process::exit(if matches!(e, BenchError::Stale(_)) {
            2
        } else {
            1
        });
    }
}

fn runtime(threads: usize) -> Result<tokio::runtime::Runtime, BenchError> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()?)
}

fn dispatch(cmd: Command) -> Result<(), BenchError> {
    match cmd {
        Command::Run(args) => {
            let row = runtime(args.threads)?.block_on(runner::run(&args))?;
            if let Some(out) = &args.out {
                record::append_row(out, &row)?;
            }
            println!("{}", serde_json::to_string(&row)?);
            Ok(())
        }
        Command::StaleCheck(args) => {
            let rep = runtime(1)?.block_on(stale::check(&args))?;
            println!("{}", serde_json::to_string(&rep)?);
            if args.expect_zero && rep.stale > 0 {
                return Err(BenchError::Stale(rep.stale));
            }
            Ok(())
        }
        Command::Load(args) if args.schema == cli::Schema::Saas => {
            let rep = runtime(1)?.block_on(saas::load(
                &args.data.origin,
                args.tenants,
                args.tasks,
                args.force,
            ))?;
            println!("{}", serde_json::to_string(&rep)?);
            Ok(())
        }
        Command::Load(args) => {
            let rep = runtime(1)?.block_on(load::load(&args))?;
            println!("{}", serde_json::to_string(&rep)?);
            Ok(())
        }
        Command::CheckJsonl(args) => check_jsonl(&args),
        Command::Report(args) => {
            for p in report::report(&args)? {
                println!("{}", p.display());
            }
            Ok(())
        }
    }
}

/// `check-jsonl`: every line complete; rows of the named targets/labels that ran a stale check
/// found 0.
fn check_jsonl(args: &cli::CheckArgs) -> Result<(), BenchError> {
    let mut bad = 0u64;
    let mut rows = 0u64;
    for p in &args.inputs {
        let text = std::fs::read_to_string(p)?;
        for (n, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            rows += 1;
            let missing = record::missing_keys(line);
            if !missing.is_empty() {
                bad += 1;
                eprintln!("{}:{}: missing {}", p.display(), n + 1, missing.join(", "));
                continue;
            }
            let row: record::Row = serde_json::from_str(line)?;
            let watched = args
                .stale_zero_for
                .iter()
                .any(|t| *t == row.target || *t == row.label);
            if watched && row.stale.is_some_and(|n| n > 0) {
                bad += 1;
                eprintln!(
                    "{}:{}: {} stale = {:?}",
                    p.display(),
                    n + 1,
                    row.target,
                    row.stale
                );
            }
        }
    }
    println!("{rows} rows, {bad} bad");
    if bad > 0 || rows == 0 {
        return Err(BenchError::Config(format!("{bad} bad rows of {rows}")));
    }
    Ok(())
}
