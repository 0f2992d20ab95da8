//! `pgline-wire-bench`: one run of the in-process dataplane wire benchmark (see the crate docs).
//!
//! Prints a one-line summary, or with `--json` the JSONL row. Exits non-zero on any wrong reply,
//! a stall, or zero throughput.
#![deny(unsafe_code)]

use clap::Parser;
use pgline_wire_bench::{run, WireConfig};

#[derive(Parser, Debug)]
#[command(about = "One userspace dataplane core on an in-memory port: GET/MGET hits per second")]
struct Args {
    /// Client connections.
    #[arg(long, default_value_t = 16)]
    conns: usize,
    /// Requests in flight per connection.
    #[arg(long, default_value_t = 1)]
    depth: usize,
    /// Keys per MGET (0: GET).
    #[arg(long, default_value_t = 0)]
    mget: usize,
    /// Measured window, seconds.
    #[arg(long, default_value_t = 5.0)]
    secs: f64,
    /// Warm-up before the window, seconds.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Rows in the store (keys uniform over them).
    #[arg(long, default_value_t = 100_000)]
    rows: u32,
    /// Bytes of each row's JSON value.
    #[arg(long, default_value_t = 166)]
    value_bytes: usize,
    /// Compare every n-th reply in full.
    #[arg(long, default_value_t = 64)]
    sample_every: u64,
    /// Frames the server's stack takes per poll (default: the stack's, 32).
    #[arg(long)]
    server_rx_burst: Option<usize>,
    /// Compute and verify checksums in software (no checksum offload on the in-memory port).
    #[arg(long)]
    sw_checksum: bool,
    /// The server's TCP: `owned` (ours, the stack's default) or `smoltcp`.
    #[arg(long, value_parser = ["owned", "smoltcp"])]
    server_tcp: Option<String>,
    /// After the window, seconds without requests before the idle resident set is read (the
    /// server gives an idle session's buffers back after 1 s; 0: not read).
    #[arg(long, default_value_t = 0.0)]
    idle_secs: f64,
    /// Do not pin the server and client threads.
    #[arg(long)]
    no_pin: bool,
    /// Run server and client in one thread, turn for turn, until this many replies (for
    /// instruction counts under callgrind; see `lockstep.rs`).
    #[arg(long)]
    lockstep: Option<u64>,
    /// Print the JSONL row instead of the summary.
    #[arg(long)]
    json: bool,
}

fn main() {
    let a = Args::parse();
    let cfg = WireConfig {
        conns: a.conns,
        depth: a.depth,
        mget: a.mget,
        secs: a.secs,
        warmup: a.warmup,
        rows: a.rows,
        value_bytes: a.value_bytes,
        sample_every: a.sample_every,
        pin: !a.no_pin,
        server_rx_burst: a.server_rx_burst,
        sw_checksum: a.sw_checksum,
        server_owned_tcp: a.server_tcp.as_deref().map(|t| t == "owned"),
        idle_secs: a.idle_secs,
        ..WireConfig::default()
    };
    if let Some(n) = a.lockstep {
        match pgline_wire_bench::lockstep::run_lockstep(&cfg, n) {
            Ok(r) => println!(
                "lockstep conns {} depth {} mget {}: {} replies, {} busy server turns, server {:.0} ns/req; frames per reply: {:.2} to the server, {:.2} from it",
                cfg.conns, cfg.depth, cfg.mget, r.requests, r.server_turns, r.server_ns_per_req,
                r.frames_to_server_per_req, r.frames_from_server_per_req
            ),
            Err(e) => {
                eprintln!("pgline-wire-bench: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    let r = match run(&cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pgline-wire-bench: {e}");
            std::process::exit(1);
        }
    };
    if a.json {
        println!("{}", r.to_json());
    } else {
        let op = if cfg.mget == 0 {
            "GET".to_string()
        } else {
            format!("MGET {}", cfg.mget)
        };
        println!(
            "{op} conns {} depth {}: {:.0} req/s ({:.0} keys/s); server {:.0} ns/req ({:.0} cycles @ {:.0} MHz, busy {:.0} %, CPU share {:.0} %), client {:.0} ns/req (busy {:.0} %); {} replies verified in full",
            cfg.conns, cfg.depth, r.rps, r.keys_per_s, r.server_ns_per_req, r.server_cycles_per_req,
            r.mhz, r.server_busy * 100.0, r.server_cpu_share * 100.0, r.client_ns_per_req,
            r.client_busy * 100.0, r.verified
        );
    }
    if r.requests == 0 || r.verified == 0 {
        eprintln!("pgline-wire-bench: no throughput or nothing verified");
        std::process::exit(1);
    }
}
