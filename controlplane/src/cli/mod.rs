//! The `pgline` operator commands other than `serve`: API clients (`status`, `tables`, `flush`,
//! `config get|set`) and the pre-flight `check`.
//!
//! Output: human-readable tables by default, the API's raw JSON with `--json`. Exit codes: 0
//! done, 1 the API (or a check) said no or could not be reached, 2 bad usage or configuration.

pub mod advise;
pub mod api;
pub mod check;
pub mod nic;
pub mod ops;

use std::path::PathBuf;
use std::process::ExitCode;

use pgline_controlplane::config::{Config, ConfigError};

/// Settings that build the effective configuration (shared by `serve`, `config show`, `check`).
#[derive(clap::Args, Debug, Default)]
pub struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, short, env = "PGLINE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Origin connection string (`origin.url`).
    #[arg(long)]
    pub origin: Option<String>,
    /// RESP listen address (`resp.listen`).
    #[arg(long)]
    pub listen: Option<String>,
    /// Dataplane cores (`resp.cores`).
    #[arg(long)]
    pub cores: Option<usize>,
    /// Store memory, e.g. 1GiB (`store.memory`).
    #[arg(long)]
    pub memory: Option<String>,
    /// Client transport (`nic.mode`): kernel sockets, or a DPDK port with the userspace TCP stack.
    #[arg(long, value_parser = ["kernel", "dpdk"])]
    pub nic: Option<String>,
    /// Any setting: `--set section.key=value` (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub set: Vec<String>,
}

impl ServeArgs {
    pub fn load(&self) -> Result<Config, ConfigError> {
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
        if let Some(n) = &self.nic {
            sets.push(format!("nic.mode={}", quote(n)));
        }
        sets.extend(self.set.iter().cloned());
        Config::load(self.config.as_deref(), std::env::vars(), &sets)
    }
}

/// How to reach the API: shared by every client command.
#[derive(clap::Args, Debug)]
pub struct ClientArgs {
    /// API base URL, e.g. http://127.0.0.1:6381 (default: api.listen from the configuration).
    #[arg(long, env = "PGLINE_API_URL")]
    pub api: Option<String>,
    /// Bearer token for the API (api.token on the server).
    #[arg(long, env = "PGLINE_API_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Configuration file to read api.listen from when --api is not given.
    #[arg(long, short, env = "PGLINE_CONFIG")]
    pub config: Option<PathBuf>,
}

impl ClientArgs {
    /// The client, or a configuration error (exit 2).
    pub fn client(&self) -> Result<api::ApiClient, ExitCode> {
        let base = match &self.api {
            Some(a) => a.clone(),
            None => {
                let cfg =
                    Config::load(self.config.as_deref(), std::env::vars(), &[]).map_err(|e| {
                        eprintln!("pgline: {e}");
                        ExitCode::from(2)
                    })?;
                api_listen(&cfg)
            }
        };
        Ok(api::ApiClient::new(&base, self.token.clone()))
    }
}

/// `api.listen` of `cfg` (read as a TOML value, so this works whatever the section looks like),
/// with an unspecified address replaced by loopback.
pub fn api_listen(cfg: &Config) -> String {
    let listen = toml::Value::try_from(cfg)
        .ok()
        .and_then(|v| v.get("api")?.get("listen")?.as_str().map(str::to_string))
        .unwrap_or_else(|| api::DEFAULT_API_LISTEN.to_string());
    match listen.parse::<std::net::SocketAddr>() {
        Ok(a) if a.ip().is_unspecified() => {
            let ip = if a.is_ipv4() { "127.0.0.1" } else { "[::1]" };
            format!("{ip}:{}", a.port())
        }
        _ => listen,
    }
}

/// Prints `rows` under `headers` in aligned columns (two spaces apart).
pub fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// Prints a JSON value for scripts.
pub fn print_json(v: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}
