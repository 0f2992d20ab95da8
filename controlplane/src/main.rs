//! The `pgline` binary.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use pgline_controlplane::config::Config;
use pgline_controlplane::server::Pgline;

#[derive(Parser)]
#[command(
    name = "pgline",
    version,
    about = "PostgreSQL read cache: rows over the Redis protocol, kept coherent from the WAL"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the cache.
    Serve(ServeArgs),
    /// Print the effective configuration (file + PGLINE_* environment + flags) and exit.
    Config(ServeArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, short, env = "PGLINE_CONFIG")]
    config: Option<PathBuf>,
    /// Origin connection string (`origin.url`).
    #[arg(long)]
    origin: Option<String>,
    /// RESP listen address (`resp.listen`).
    #[arg(long)]
    listen: Option<String>,
    /// Dataplane cores (`resp.cores`).
    #[arg(long)]
    cores: Option<usize>,
    /// Store memory, e.g. 1GiB (`store.memory`).
    #[arg(long)]
    memory: Option<String>,
    /// Any setting: `--set section.key=value` (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    set: Vec<String>,
}

impl ServeArgs {
    fn load(&self) -> Result<Config, pgline_controlplane::config::ConfigError> {
        let mut sets = Vec::new();
        let quote = |s: &str| toml::Value::String(s.to_string()).to_string();
        if let Some(o) = &self.origin {
            sets.push(format!("origin.url={}", quote(o)));
        }
        if let Some(l) = &self.listen {
            sets.push(format!("resp.listen={}", quote(l)));
        }
        if let Some(c) = self.cores {
            sets.push(format!("resp.cores={c}"));
        }
        if let Some(m) = &self.memory {
            sets.push(format!("store.memory={}", quote(m)));
        }
        sets.extend(self.set.iter().cloned());
        Config::load(self.config.as_deref(), std::env::vars(), &sets)
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let (Command::Serve(args) | Command::Config(args)) = &cli.command;
    let cfg = match args.load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pgline: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if let Command::Config(_) = cli.command {
        print!("{}", toml::to_string(&cfg.redacted()).unwrap_or_default());
        return std::process::ExitCode::SUCCESS;
    }
    let log_reload = init_logging(&cfg);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("pgline-control")
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pgline: cannot start the control-plane runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let pgline = match Pgline::start(cfg).await {
            Ok(p) => p,
            Err(e) => {
                tracing::error!("{e}");
                eprintln!("pgline: {e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        pgline.set_log_reload(log_reload);
        let addr = pgline.local_addr();
        println!(
            "pgline is serving. Connect with: redis-cli -h {} -p {}",
            addr.ip(),
            addr.port()
        );
        println!(
            "  e.g. redis-cli -p {} GET <table>:<primary key>",
            addr.port()
        );
        if let Some(api) = pgline.api_addr() {
            println!("  HTTP API: http://{api}/v1/status (GET /v1/openapi.json describes it)");
        }
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutting down");
        pgline.shutdown().await;
        std::process::ExitCode::SUCCESS
    })
}

/// Installs the log subscriber; returns the hook that makes `log.level` changeable at run time.
fn init_logging(cfg: &Config) -> pgline_controlplane::server::LogReload {
    use pgline_controlplane::admin::env_filter_reload;
    let filter = tracing_subscriber::EnvFilter::try_new(&cfg.log.level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_writer(std::io::stderr);
    if cfg.log.json {
        let builder = builder
            .json()
            .with_env_filter(filter)
            .with_filter_reloading();
        let reload = env_filter_reload(builder.reload_handle());
        builder.init();
        reload
    } else {
        let builder = builder.with_env_filter(filter).with_filter_reloading();
        let reload = env_filter_reload(builder.reload_handle());
        builder.init();
        reload
    }
}
