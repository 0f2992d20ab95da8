//! The `pgline` binary.
#![deny(unsafe_code)]

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pgline_controlplane::config::{Config, NicMode};
use pgline_controlplane::server::Pgline;

use cli::check::CheckArgs;
use cli::ops::{ConfigGetArgs, ConfigSetArgs, FlushArgs, TablesAction};
use cli::{ClientArgs, ServeArgs};

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
    /// The configuration: with no subcommand, print the effective one (like `config show`).
    Config(ConfigCmd),
    /// Show a running pgline's state (GET /v1/status).
    Status(ClientArgs),
    /// List, add or remove cached tables.
    Tables {
        #[command(subcommand)]
        action: TablesAction,
    },
    /// Drop cached entries: all, one table's or one key.
    Flush(FlushArgs),
    /// Per-statement statistics of the PostgreSQL front (GET /v1/queries).
    Queries(ClientArgs),
    /// What pgline would serve of the origin's workload (pg_stat_statements; GET /v1/advice).
    Advise(cli::advise::AdviseArgs),
    /// Pre-flight checks of this host and the origin (no running pgline needed).
    Check(CheckArgs),
    /// The client NIC's PCI device: bind it to vfio-pci/uio_pci_generic, or show its driver.
    Nic {
        #[command(subcommand)]
        action: cli::nic::NicAction,
    },
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct ConfigCmd {
    #[command(subcommand)]
    action: Option<ConfigAction>,
    #[command(flatten)]
    show: ServeArgs,
}

#[derive(Subcommand)]
enum ConfigAction {
    /// Print the effective configuration (file + PGLINE_* environment + flags) and exit.
    Show(ServeArgs),
    /// Print settings of a running pgline (GET /v1/config).
    Get(ConfigGetArgs),
    /// Change settings of a running pgline (PATCH /v1/config).
    Set(ConfigSetArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let args = match &cli.command {
        Command::Serve(args) => args,
        Command::Config(c) => {
            return match &c.action {
                None => config_show(&c.show),
                Some(ConfigAction::Show(args)) => config_show(args),
                Some(ConfigAction::Get(args)) => cli::ops::config_get(args),
                Some(ConfigAction::Set(args)) => cli::ops::config_set(args),
            }
        }
        Command::Status(args) => return cli::ops::status(args),
        Command::Tables { action } => return cli::ops::tables(action),
        Command::Flush(args) => return cli::ops::flush(args),
        Command::Queries(args) => return cli::ops::queries(args),
        Command::Advise(args) => return cli::advise::run(args),
        Command::Check(args) => return cli::check::run(args),
        Command::Nic { action } => return cli::nic::run(action),
    };
    let cfg = match args.load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pgline: {e}");
            return ExitCode::from(2);
        }
    };
    serve(cfg)
}

fn config_show(args: &ServeArgs) -> ExitCode {
    match args.load() {
        Ok(cfg) => {
            print!("{}", toml::to_string(&cfg.redacted()).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pgline: {e}");
            ExitCode::from(2)
        }
    }
}

fn serve(cfg: Config) -> ExitCode {
    if cfg.nic.mode == NicMode::Mem {
        eprintln!(
            "pgline: nic.mode = \"mem\" is the in-memory port for in-process tests and benches; \
             pgline serve needs kernel or dpdk"
        );
        return ExitCode::from(2);
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
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let pgline = match Pgline::start(cfg).await {
            Ok(p) => p,
            Err(e) => {
                tracing::error!("{e}");
                eprintln!("pgline: {e}");
                return ExitCode::FAILURE;
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
        wait_for_stop(&pgline).await;
        tracing::info!("shutting down");
        pgline.shutdown().await;
        ExitCode::SUCCESS
    })
}

/// Waits for Ctrl-C; SIGHUP meanwhile reloads the fronts' TLS
/// certificate (`[tls]`), as `POST /v1/tls/reload` does.
async fn wait_for_stop(pgline: &Pgline) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangup = match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!("SIGHUP not handled (no TLS reload by signal): {e}");
            None
        }
    };
    loop {
        let hup = async {
            match hangup.as_mut() {
                Some(s) => s.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return,
            _ = hup => {
                if pgline.reload_tls().is_none() {
                    tracing::info!("SIGHUP: no front serves TLS, nothing to reload");
                }
            }
        }
    }
}

/// Installs the log subscriber; returns the hook that makes `log.level` changeable at run time.
fn init_logging(cfg: &Config) -> pgline_controlplane::admin::LogReload {
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
