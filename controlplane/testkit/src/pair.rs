//! A primary + physical standby pair (`deploy/lab/pair.sh`) for the failover and
//! standby-tailing tests, and connection strings for it.
//!
//! Purpose: start a fresh pair with given server binaries, give tests its multi-host URL
//! (`target_session_attrs=read-write`, so clients follow a promotion), direct clients of
//! either server, and the crash/promotion steps.
//!
//! Invariants: the pair is stopped and its data removed when the guard drops; its ports
//! and data directory are the caller's (one pair per test binary at a time).
//!
//! Thread model: blocking `pair.sh` calls run on the blocking pool; clients run on the
//! caller's runtime.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::origin::connect;

/// Where `pair.sh` is, from this crate's manifest directory.
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/lab/pair.sh")
}

/// The PostgreSQL 18 bin directory (`deploy/lab/pg18.sh`, which installs it once), or why not.
pub fn pg18_bin() -> Result<String, String> {
    let pg18 = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/lab/pg18.sh");
    let out = Command::new(&pg18)
        .output()
        .map_err(|e| format!("{}: {e}", pg18.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            pg18.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A running pair.
pub struct Pair {
    pub bin: String,
    pub dir: String,
    pub primary_port: u16,
    pub standby_port: u16,
    sync_slots: bool,
}

impl Pair {
    /// Starts a fresh pair (a previous one in `dir` is removed) with the server binaries in
    /// `bin`; `sync_slots` sets the standby's `sync_replication_slots` (PostgreSQL 17+).
    pub async fn start(
        bin: &str,
        dir: &str,
        primary_port: u16,
        standby_port: u16,
        sync_slots: bool,
    ) -> Pair {
        let pair = Pair {
            bin: bin.to_string(),
            dir: dir.to_string(),
            primary_port,
            standby_port,
            sync_slots,
        };
        pair.run("start").await;
        pair
    }

    fn command(&self, action: &str) -> Command {
        let mut c = Command::new(script());
        c.arg(action)
            .env("PGLINE_PAIR_BIN", &self.bin)
            .env("PGLINE_PAIR_DIR", &self.dir)
            .env("PGLINE_PAIR_PRIMARY_PORT", self.primary_port.to_string())
            .env("PGLINE_PAIR_STANDBY_PORT", self.standby_port.to_string())
            .env(
                "PGLINE_PAIR_SYNC_SLOTS",
                if self.sync_slots { "on" } else { "off" },
            );
        c
    }

    async fn run(&self, action: &str) {
        let mut c = self.command(action);
        let out = tokio::task::spawn_blocking(move || c.output())
            .await
            .expect("pair.sh task")
            .expect("run pair.sh");
        assert!(
            out.status.success(),
            "pair.sh {action} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Crashes the primary (`pg_ctl -m immediate stop`).
    pub async fn kill_primary(&self) {
        self.run("kill-primary").await;
    }

    /// Promotes the standby and waits until it accepts writes.
    pub async fn promote(&self) {
        self.run("promote").await;
    }

    /// A connection string for database `db` on the server at `port`.
    pub fn url_at(&self, port: u16, db: &str) -> String {
        format!("host=127.0.0.1 port={port} user=postgres password=pgline dbname={db}")
    }

    /// The multi-host connection string for database `db`: whichever server accepts writes.
    pub fn url(&self, db: &str) -> String {
        format!(
            "host=127.0.0.1,127.0.0.1 port={},{} user=postgres password=pgline dbname={db} \
             target_session_attrs=read-write connect_timeout=2",
            self.primary_port, self.standby_port
        )
    }

    /// A client of the (first) primary.
    pub async fn primary(&self, db: &str) -> tokio_postgres::Client {
        connect(&self.url_at(self.primary_port, db)).await
    }

    /// A client of the standby (or of the new primary once it is promoted).
    pub async fn standby(&self, db: &str) -> tokio_postgres::Client {
        connect(&self.url_at(self.standby_port, db)).await
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = self.command("stop").output();
    }
}
