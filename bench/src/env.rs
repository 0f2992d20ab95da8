//! The environment of a run (CPU, kernel, versions, git revision) and per-process CPU time.
//!
//! CPU time is `utime + stime` of `/proc/PID/stat` (fields 14 and 15, counted after the
//! command name's closing parenthesis since the name may hold spaces), in clock ticks of
//! `getconf CLK_TCK` (USER_HZ, 100 on Linux).
//!
//! # Limitations
//! Threads of the process are included; children are not (a PostgreSQL origin's backends are
//! separate processes: pass each one, or the postmaster's children are not counted).

#![deny(unsafe_code)]

use crate::resp::{info_field, RespConn, Value};
use serde::{Deserialize, Serialize};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

/// The environment written into every JSONL row.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Env {
    /// `model name` of /proc/cpuinfo.
    pub cpu_model: String,
    /// The machine's CPUs (`processor` entries of /proc/cpuinfo), not the load generator's
    /// `taskset` share of them.
    pub cores: usize,
    /// Kernel release.
    pub kernel: String,
    /// `pgline_version` from INFO, when the RESP target is pgline.
    pub pgline_version: Option<String>,
    /// `valkey_version` (or `redis_version` of a non-pgline, non-Valkey server) from INFO.
    pub valkey_version: Option<String>,
    /// `server_version` of the origin.
    pub postgres_version: Option<String>,
    /// `git rev-parse --short HEAD` of the working directory.
    pub git_rev: Option<String>,
    /// UTC start of the run, RFC 3339.
    pub started_at: String,
}

/// Reads what the host says about itself (no servers).
pub fn host_env() -> Env {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    Env {
        cpu_model,
        cores: match cpuinfo
            .lines()
            .filter(|l| l.starts_with("processor"))
            .count()
        {
            0 => std::thread::available_parallelism().map_or(0, usize::from),
            n => n,
        },
        kernel,
        git_rev: command_line("git", &["rev-parse", "--short", "HEAD"]),
        started_at: rfc3339_utc(SystemTime::now()),
        ..Env::default()
    }
}

/// Fills the version fields from a RESP server's INFO.
pub async fn resp_versions(env: &mut Env, addr: &str) {
    let Ok(mut c) = RespConn::connect(addr).await else {
        return;
    };
    let Ok(Value::Bulk(info)) = c.command(&[b"INFO", b"server"]).await else {
        return;
    };
    let info = String::from_utf8_lossy(&info);
    if let Some(v) = info_field(&info, "pgline_version") {
        env.pgline_version = Some(v);
    } else {
        env.valkey_version =
            info_field(&info, "valkey_version").or_else(|| info_field(&info, "redis_version"));
    }
}

fn command_line(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

/// Clock ticks per second for /proc CPU times.
pub fn clk_tck() -> f64 {
    command_line("getconf", &["CLK_TCK"])
        .and_then(|s| s.parse().ok())
        .unwrap_or(100.0)
}

/// `utime + stime` of `pid` in clock ticks.
pub fn cpu_ticks(pid: u32) -> std::io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_cpu_ticks(&stat)
        .ok_or_else(|| std::io::Error::other(format!("unreadable /proc/{pid}/stat")))
}

/// Parses `utime + stime` out of a /proc/PID/stat line.
pub fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    // After the name: state(3) ppid(4) ... utime(14) stime(15); index 0 here is field 3.
    let mut f = after.split_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Resident set size of `pid` in KiB (`VmRSS` of /proc/PID/status).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Formats a time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339_utc(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil-from-days (proleptic Gregorian), days since 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_utc_dates() {
        assert_eq!(rfc3339_utc(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400 + 3661); // 2000-02-29 01:01:01
        assert_eq!(rfc3339_utc(t), "2000-02-29T01:01:01Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_798_761_599); // 2026-12-31 23:59:59
        assert_eq!(rfc3339_utc(t), "2026-12-31T23:59:59Z");
    }

    #[test]
    fn parses_proc_stat_with_spaces_in_the_name() {
        let stat = "42 (my (odd) proc) S 1 42 42 0 -1 4194560 100 0 0 0 250 17 0 0 20 0 1 0";
        assert_eq!(parse_cpu_ticks(stat), Some(267));
        let me = cpu_ticks(std::process::id()).unwrap();
        assert!(me < 1_000_000_000);
        let rss = rss_kib(std::process::id()).unwrap();
        assert!(rss > 100, "a test binary holds more than 100 KiB: {rss}");
    }

    #[test]
    fn host_env_has_cpu_and_kernel() {
        let e = host_env();
        assert!(e.cores >= 1);
        assert!(!e.kernel.is_empty());
        assert!(e.started_at.ends_with('Z'));
    }
}
