//! `pgline check`: pre-flight checks of this host and the origin, with no pgline running.
//!
//! Each check prints `PASS|FAIL|WARN|SKIP  <check>  <detail>`; a FAIL (and a WARN where there is
//! something to do) is followed by `fix: <what to do>`. Exit 1 if anything FAILed. Checks that
//! need a previous one (everything on the origin needs a connection) SKIP with the reason.
//!
//! Limitations: the hugepage check reads the default hugepage size's pool from /proc/meminfo
//! (a 1 GiB pool that is not the default size is not seen); the slot/publication checks say what
//! `pgline serve` would do, they do not try it; with `--nic dpdk` (`nic.mode = "dpdk"`) the
//! NIC line checks the build and the vdev's interface without starting the EAL.

use std::process::ExitCode;
use std::time::Duration;

use pgline_controlplane::config::{Config, NicMode};
use pgline_controlplane::{origin, pgfront};
use serde::Serialize;
use tokio_postgres::Client;

use super::ServeArgs;

/// The client transport being checked, from `nic.mode` (`--nic` sets it like for `serve`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Nic {
    Kernel,
    Dpdk,
}

#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verdict {
    Pass,
    Fail,
    Warn,
    Skip,
}

#[derive(Debug, Serialize)]
pub struct CheckLine {
    pub status: Verdict,
    pub check: String,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

#[derive(Default)]
struct Report(Vec<CheckLine>);

impl Report {
    fn add(
        &mut self,
        status: Verdict,
        check: &str,
        detail: impl Into<String>,
        fix: Option<String>,
    ) {
        self.0.push(CheckLine {
            status,
            check: check.into(),
            detail: detail.into(),
            fix,
        });
    }
    fn pass(&mut self, check: &str, detail: impl Into<String>) {
        self.add(Verdict::Pass, check, detail, None);
    }
    fn skip(&mut self, check: &str, detail: impl Into<String>) {
        self.add(Verdict::Skip, check, detail, None);
    }
    fn fail(&mut self, check: &str, detail: impl Into<String>, fix: impl Into<String>) {
        self.add(Verdict::Fail, check, detail, Some(fix.into()));
    }
    fn warn(&mut self, check: &str, detail: impl Into<String>, fix: impl Into<String>) {
        self.add(Verdict::Warn, check, detail, Some(fix.into()));
    }
}

pub fn run(args: &CheckArgs) -> ExitCode {
    let cfg = match args.serve.load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pgline: {e}");
            return ExitCode::from(2);
        }
    };
    let mut report = Report::default();
    let nic = match cfg.nic.mode {
        NicMode::Dpdk => Nic::Dpdk,
        _ => Nic::Kernel,
    };
    check_hugepages(&cfg, nic, &mut report);
    check_nic(&cfg, nic, &mut report);
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(check_origin(&cfg, &mut report)),
        Err(e) => report.fail(
            "origin reachable",
            format!("no runtime: {e}"),
            "report a bug",
        ),
    }
    let failed = report.0.iter().any(|l| l.status == Verdict::Fail);
    if args.json {
        let v = serde_json::json!({ "ok": !failed, "checks": report.0 });
        super::print_json(&v);
    } else {
        print_report(&report.0);
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn print_report(lines: &[CheckLine]) {
    let width = lines.iter().map(|l| l.check.len()).max().unwrap_or(0);
    let mut counts = [0usize; 4];
    for l in lines {
        let (tag, i) = match l.status {
            Verdict::Pass => ("PASS", 0),
            Verdict::Fail => ("FAIL", 1),
            Verdict::Warn => ("WARN", 2),
            Verdict::Skip => ("SKIP", 3),
        };
        counts[i] += 1;
        println!("{tag}  {:<width$}  {}", l.check, l.detail);
        if let Some(fix) = &l.fix {
            println!("      fix: {fix}");
        }
    }
    println!(
        "{} passed, {} failed, {} warnings, {} skipped",
        counts[0], counts[1], counts[2], counts[3]
    );
}

/// The default hugepage pool from /proc/meminfo: (total, free, reserved, page size in bytes).
pub fn parse_meminfo(text: &str) -> Option<(u64, u64, u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        line[name.len()..]
            .trim_start_matches(':')
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some((
        field("HugePages_Total")?,
        field("HugePages_Free")?,
        field("HugePages_Rsvd")?,
        field("Hugepagesize")? * 1024,
    ))
}

/// Mount points of hugetlbfs in /proc/mounts.
pub fn parse_hugetlbfs_mounts(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, kind) = (f.next()?, f.next()?, f.next()?);
            (kind == "hugetlbfs").then(|| dir.to_string())
        })
        .collect()
}

fn mib(b: u64) -> String {
    format!("{} MiB", b >> 20)
}

fn check_hugepages(cfg: &Config, nic: Nic, r: &mut Report) {
    let memory = cfg.store.memory.0;
    let max_page = cfg.store.max_page.to_ascii_lowercase();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    match parse_meminfo(&meminfo) {
        _ if nic == Nic::Kernel && (max_page == "thp" || max_page.starts_with("4k")) => r.skip(
            "hugepages reserved",
            format!(
                "store.max_page = {}: the store does not ask for hugetlb pages",
                cfg.store.max_page
            ),
        ),
        None => r.warn(
            "hugepages reserved",
            "no hugepage fields in /proc/meminfo (kernel without hugetlb?)",
            "use a kernel with CONFIG_HUGETLBFS, or set store.max_page = \"THP\"",
        ),
        Some((total, free, rsvd, size)) => {
            let need = memory.div_ceil(size.max(1));
            let usable = free.saturating_sub(rsvd);
            let detail = format!(
                "{total} x {} reserved, {usable} usable; store.memory {} needs {need}",
                mib(size),
                mib(memory)
            );
            let fix = format!(
                "reserve them: echo {} > /proc/sys/vm/nr_hugepages (persist with vm.nr_hugepages \
                 in /etc/sysctl.d/); without them the store falls back to THP or 4KiB pages",
                total + need.saturating_sub(usable)
            );
            if usable >= need {
                r.pass("hugepages reserved", detail);
            } else {
                r.warn("hugepages reserved", detail, fix);
            }
        }
    }
    let mounts =
        parse_hugetlbfs_mounts(&std::fs::read_to_string("/proc/mounts").unwrap_or_default());
    let fix = "mkdir -p /dev/hugepages && mount -t hugetlbfs nodev /dev/hugepages (or enable dev-hugepages.mount)";
    match (mounts.is_empty(), nic) {
        (false, _) => r.pass("hugetlbfs mounted", mounts.join(", ")),
        (true, Nic::Kernel) => r.warn(
            "hugetlbfs mounted",
            "no hugetlbfs mount (the store's anonymous hugetlb mapping does not need one; DPDK does)",
            fix,
        ),
        (true, Nic::Dpdk) => r.fail("hugetlbfs mounted", "no hugetlbfs mount; DPDK needs one", fix),
    }
}

fn check_bind(r: &mut Report, check: &str, key: &str, addr: &str) {
    match std::net::TcpListener::bind(addr) {
        Ok(_) => r.pass(check, format!("{key} {addr} can be bound")),
        Err(e) => {
            let fix = match e.kind() {
                std::io::ErrorKind::AddrInUse => format!(
                    "something already listens there (a running pgline?): find it with \
                     `ss -ltnp 'sport = :{}'` and stop it, or set {key} to a free address",
                    addr.rsplit(':').next().unwrap_or("")
                ),
                std::io::ErrorKind::PermissionDenied => {
                    format!("use a port >= 1024 in {key}, or give pgline CAP_NET_BIND_SERVICE")
                }
                _ => format!("set {key} to an address of this host (see `ip -br addr`)"),
            };
            r.fail(check, format!("{key} {addr}: {e}"), fix);
        }
    }
}

/// `nic.mode = "dpdk"`: this build has the DPDK transport, the port is named among the vdevs,
/// and a vdev bound to a kernel interface (`iface=`) finds it. Nothing is opened: the EAL is not
/// started by a check.
fn check_dpdk(cfg: &Config, r: &mut Report) {
    if !cfg!(feature = "dpdk") {
        r.fail(
            "nic (dpdk)",
            "this pgline was built without the dpdk feature",
            "install libdpdk-dev (>= 22.11) and rebuild: cargo build --release --features dpdk",
        );
        return;
    }
    let nic = &cfg.nic;
    let Some(vdev) = nic
        .vdevs
        .iter()
        .find(|v| v.split(',').next() == Some(nic.port.as_str()))
    else {
        // Not a vdev: a PCI device, which must be on a userspace I/O driver (`pgline nic bind`).
        match super::nic::pci_check(&nic.port) {
            Ok(detail) => r.pass(
                "nic (dpdk)",
                format!("{detail}, appliance address {}/{}", nic.ip, nic.prefix_len),
            ),
            Err((detail, fix)) => r.fail("nic (dpdk)", detail, fix),
        }
        return;
    };
    let iface = vdev.split(',').find_map(|kv| kv.strip_prefix("iface="));
    match iface {
        Some(i) if !std::path::Path::new("/sys/class/net").join(i).exists() => r.fail(
            "nic (dpdk)",
            format!("{vdev}: no interface {i:?} on this host"),
            "create or name an existing interface (ip -br link); then set nic.vdevs",
        ),
        _ => r.pass(
            "nic (dpdk)",
            format!(
                "port {} = {vdev}, appliance address {}/{}",
                nic.port, nic.ip, nic.prefix_len
            ),
        ),
    }
}

fn check_nic(cfg: &Config, nic: Nic, r: &mut Report) {
    match nic {
        Nic::Kernel => check_bind(r, "nic (kernel sockets)", "resp.listen", &cfg.resp.listen),
        Nic::Dpdk => check_dpdk(cfg, r),
    }
    // The API section may not exist in every build: read it as a TOML value.
    let api = toml::Value::try_from(cfg)
        .ok()
        .and_then(|v| v.get("api").cloned());
    if let Some(api) = api {
        let enabled = api
            .get("enabled")
            .and_then(toml::Value::as_bool)
            .unwrap_or(true);
        match api.get("listen").and_then(toml::Value::as_str) {
            Some(listen) if enabled => check_bind(r, "api listen", "api.listen", listen),
            _ => r.skip("api listen", "api.enabled = false"),
        }
    }
}

const ORIGIN_CHECKS: [&str; 8] = [
    "wal_level",
    "replication privilege",
    "replication slots free",
    "wal senders free",
    "slot",
    "failover",
    "publication",
    "tables",
];

/// `origin TLS`: opens a connection to the origin's first reachable host and negotiates TLS as
/// `sslmode` says (no login), naming the cause of a failed handshake.
async fn check_origin_tls(cfg: &Config, r: &mut Report) {
    const CHECK: &str = "origin TLS";
    let settings = match cfg.origin.pg_config() {
        Ok(s) => s,
        Err(e) => return r.fail(CHECK, e.to_string(), "fix origin.url"),
    };
    let tls = &settings.tls;
    let mode = tls.mode.as_str();
    if !tls.wanted() {
        return r.warn(
            CHECK,
            "off (sslmode=disable): the origin connections are not encrypted",
            "set sslmode=verify-full and sslrootcert=<the origin's CA file> in origin.url",
        );
    }
    let timeout = Duration::from_millis(cfg.origin.connect_timeout_ms.max(100));
    let conn = match origin::open(&settings, Some(timeout), 0).await {
        Ok((conn, _)) => conn,
        Err(e) => {
            let detail = e.to_string();
            let fix = if detail.contains("not signed by a trusted CA") {
                "sslrootcert must name the CA that signed the origin's certificate                  (sslrootcert=system for a public CA)"
            } else if detail.contains("not valid for host") {
                "connect by a name the origin's certificate carries (origin.url host=), or                  use sslmode=verify-ca"
            } else if detail.contains("expired") || detail.contains("not valid yet") {
                "renew the origin's certificate (ssl_cert_file) and reload PostgreSQL                  (SELECT pg_reload_conf())"
            } else if detail.contains("does not support SSL") {
                "turn TLS on at the origin (ssl = on in postgresql.conf), or lower sslmode"
            } else {
                "check origin.url (host, port) and its TLS keys (sslmode, sslrootcert, sslcert,                  sslkey)"
            };
            return r.fail(CHECK, detail, fix);
        }
    };
    let Some(summary) = conn.tls_summary() else {
        return r.warn(
            CHECK,
            format!("the origin does not offer TLS (sslmode={mode}): connections are plaintext"),
            "turn TLS on at the origin (ssl = on) and set sslmode=verify-full",
        );
    };
    let what = format!("{summary}, sslmode={mode}");
    match tls.check {
        origin::tls::Check::None => r.warn(
            CHECK,
            format!("{what}: TLS without server verification"),
            "set sslmode=verify-full and sslrootcert=<the origin's CA file> in origin.url",
        ),
        _ => r.pass(CHECK, format!("{what}, CA {}", tls.roots)),
    }
}

async fn check_origin(cfg: &Config, r: &mut Report) {
    check_origin_tls(cfg, r).await;
    let client = match connect(cfg).await {
        Ok((client, detail)) => {
            r.pass("origin reachable", detail);
            client
        }
        Err(e) => {
            r.fail(
                "origin reachable",
                e,
                "check origin.url (host, port, user, password, dbname); PostgreSQL must listen \
                 there (listen_addresses) and admit this host and user in pg_hba.conf",
            );
            for c in ORIGIN_CHECKS {
                r.skip(c, "origin unreachable");
            }
            return;
        }
    };
    if let Err(e) = origin_checks(cfg, &client, r).await {
        r.fail(
            "origin query",
            e.to_string(),
            "the origin refused a catalog query: check the user's privileges on the database",
        );
    }
}

async fn connect(cfg: &Config) -> Result<(Client, String), String> {
    let settings = cfg.origin.pg_config().map_err(|e| e.to_string())?;
    let pg = &settings.pg;
    let timeout = Duration::from_millis(cfg.origin.connect_timeout_ms.max(100));
    let (client, conn) = tokio::time::timeout(timeout, pg.connect(settings.pg_tls()))
        .await
        .map_err(|_| format!("no answer within {} ms", timeout.as_millis()))?
        .map_err(|e| origin::describe_error(&e))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let row = client
        .query_one(
            "SELECT current_setting('server_version'), current_user::text, current_database()::text",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    let hosts = pg
        .get_hosts()
        .iter()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .collect::<Vec<_>>()
        .join(",");
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    let detail = format!(
        "PostgreSQL {} at {hosts}:{port}, database {} as {}",
        row.get::<_, String>(0),
        row.get::<_, String>(2),
        row.get::<_, String>(1)
    );
    Ok((client, detail))
}

async fn origin_checks(
    cfg: &Config,
    c: &Client,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    let level: String = c.query_one("SHOW wal_level", &[]).await?.get(0);
    if level == "logical" {
        r.pass("wal_level", "logical");
    } else {
        r.fail(
            "wal_level",
            format!("{level} (pgline needs logical)"),
            "set wal_level = logical in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) \
             and restart PostgreSQL",
        );
    }

    let row = c
        .query_one(
            "SELECT rolreplication, rolsuper, current_user::text FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await?;
    let (repl, superuser, user): (bool, bool, String) = (row.get(0), row.get(1), row.get(2));
    if repl || superuser {
        let how = if superuser {
            "superuser"
        } else {
            "REPLICATION"
        };
        r.pass("replication privilege", format!("{user} has {how}"));
    } else {
        r.fail(
            "replication privilege",
            format!("{user} has neither REPLICATION nor superuser"),
            format!("as a superuser: ALTER ROLE \"{user}\" WITH REPLICATION;"),
        );
    }
    check_capacity(cfg, c, r).await?;
    check_slot(cfg, c, r).await?;
    check_failover(cfg, c, r).await?;
    check_publication(cfg, c, r, superuser).await?;
    check_tables(cfg, c, r).await?;
    check_custom_settings(cfg, c, r).await?;
    check_session_functions(cfg, c, r).await
}

/// Functions of the origin database (not written in C, outside `pg_catalog` and
/// `information_schema`) whose bodies take a session-level advisory lock or prepare a
/// statement, schema-qualified, one per row. The relay pins a session whose own statement text
/// does either (`pgfront::leaves_session_state`) but cannot see it done inside a function, and
/// no state read finds it cheaply (`docs/pgwire.md`; a channel listened to or a cursor held
/// through a function is found by the state read).
const SESSION_FUNCTIONS_SQL: &str = r#"SELECT DISTINCT n.nspname || '.' || f.proname
      FROM pg_catalog.pg_proc f
      JOIN pg_catalog.pg_language l ON l.oid = f.prolang
      JOIN pg_catalog.pg_namespace n ON n.oid = f.pronamespace
     WHERE l.lanname NOT IN ('internal', 'c')
       AND n.nspname NOT IN ('pg_catalog', 'information_schema')
       AND f.prosrc ~* '\m(pg_try_advisory_lock|pg_advisory_lock)(_shared)?\s*\(|\mprepare\s+\w+\s*(\(|as\M)'
     ORDER BY 1"#;

/// The names `sql` reads (its first column) for a check of the PostgreSQL front; `None`, with
/// `check` marked skipped, when the front is off.
async fn pgwire_names(
    cfg: &Config,
    c: &Client,
    r: &mut Report,
    check: &str,
    sql: &str,
) -> Result<Option<Vec<String>>, tokio_postgres::Error> {
    if !cfg.pgwire.enabled {
        r.skip(check, "the PostgreSQL front is off (pgwire.enabled)");
        return Ok(None);
    }
    let rows = c.query(sql, &[]).await?;
    Ok(Some(rows.iter().map(|row| row.get(0)).collect()))
}

/// The functions [`SESSION_FUNCTIONS_SQL`] finds: through the relay's pool, what they leave on
/// an origin connection can reach another session.
async fn check_session_functions(
    cfg: &Config,
    c: &Client,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    const CHECK: &str = "session state in functions";
    let Some(found) = pgwire_names(cfg, c, r, CHECK, SESSION_FUNCTIONS_SQL).await? else {
        return Ok(());
    };
    if found.is_empty() {
        r.pass(
            CHECK,
            "no function takes a session-level advisory lock or prepares a statement",
        );
    } else {
        r.warn(
            CHECK,
            format!(
                "{} take a session-level advisory lock or prepare a statement in their bodies: \
                 through pgline a session calling them is not kept on its origin connection, so \
                 the lock or statement can stay with a connection another session gets next",
                found.join(", ")
            ),
            "take pg_advisory_xact_lock inside a transaction, or write the call so that \
             pg_advisory_lock or PREPARE is in the statement text (pgline then keeps \
             the session on its connection); docs/pgwire.md, \"What pins a session\"",
        );
    }
    Ok(())
}

/// Custom settings (`app.tenant`) that row-level security policies or functions of the origin
/// database name in `current_setting('..')` or `set_config('..', ..)` with a literal, against
/// `pgwire.custom_settings`: the relay follows only the settings listed there, and one a
/// function sets unseen on an unlisted name reaches the next session of its pool.
async fn check_custom_settings(
    cfg: &Config,
    c: &Client,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    const CHECK: &str = "custom settings";
    let Some(found) = pgwire_names(cfg, c, r, CHECK, pgfront::CUSTOM_SETTING_NAMES_SQL).await?
    else {
        return Ok(());
    };
    let listed = &cfg.pgwire.custom_settings;
    let missing = pgfront::unlisted_custom_settings(&found, listed);
    if found.is_empty() {
        r.pass(CHECK, "no policy or function names a custom setting");
    } else if missing.is_empty() {
        r.pass(
            CHECK,
            format!("followed (pgwire.custom_settings): {}", found.join(", ")),
        );
    } else {
        let all: Vec<String> = listed
            .iter()
            .map(String::as_str)
            .chain(missing.iter().copied())
            .map(|n| format!("\"{n}\""))
            .collect();
        r.warn(
            CHECK,
            format!(
                "policies or functions read or set {} but pgwire.custom_settings does not list \
                 them: a function that sets one with set_config(.., false) would hand it to the \
                 next session of its pool",
                missing.join(", ")
            ),
            format!("--set 'pgwire.custom_settings=[{}]'", all.join(", ")),
        );
    }
    Ok(())
}

async fn check_capacity(
    cfg: &Config,
    c: &Client,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    let slot = &cfg.replication.slot;
    let row = c
        .query_one(
            "SELECT current_setting('max_replication_slots')::int8, \
                    (SELECT count(*) FROM pg_replication_slots), \
                    EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1), \
                    current_setting('max_wal_senders')::int8, \
                    (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender')",
            &[slot],
        )
        .await?;
    let (max_slots, used_slots, exists): (i64, i64, bool) = (row.get(0), row.get(1), row.get(2));
    let (max_senders, senders): (i64, i64) = (row.get(3), row.get(4));
    let need = i64::from(!exists);
    let detail = format!("{used_slots} of max_replication_slots = {max_slots} in use");
    if max_slots - used_slots >= need {
        let note = if exists {
            ", pgline's slot among them"
        } else {
            ", pgline needs 1"
        };
        r.pass("replication slots free", format!("{detail}{note}"));
    } else {
        r.fail(
            "replication slots free",
            format!("{detail}; pgline needs 1 more"),
            format!(
                "raise max_replication_slots in postgresql.conf (to {}) and restart PostgreSQL, \
                 or drop a slot nobody uses: SELECT pg_drop_replication_slot('<name>');",
                used_slots + 1
            ),
        );
    }
    let detail = format!("{senders} of max_wal_senders = {max_senders} in use");
    if max_senders - senders >= 1 {
        r.pass("wal senders free", format!("{detail}, pgline needs 1"));
    } else {
        r.fail(
            "wal senders free",
            format!("{detail}; pgline needs 1 more"),
            format!(
                "raise max_wal_senders in postgresql.conf (to {}) and restart PostgreSQL",
                senders + 1
            ),
        );
    }
    Ok(())
}

async fn check_slot(cfg: &Config, c: &Client, r: &mut Report) -> Result<(), tokio_postgres::Error> {
    let slot = &cfg.replication.slot;
    let row = c
        .query_opt(
            "SELECT coalesce(plugin, '')::text, slot_type::text, coalesce(database, '')::text, \
                    active, active_pid, current_database()::text, \
                    coalesce(confirmed_flush_lsn::text, '') \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[slot],
        )
        .await?;
    let Some(row) = row else {
        r.pass(
            "slot",
            format!("{slot} does not exist; pgline serve will create it (pgoutput)"),
        );
        return Ok(());
    };
    let (plugin, kind, db): (String, String, String) = (row.get(0), row.get(1), row.get(2));
    let (active, pid, here, lsn): (bool, Option<i32>, String, String) =
        (row.get(3), row.get(4), row.get(5), row.get(6));
    let rename = "or set replication.slot to another name";
    if kind != "logical" || plugin != "pgoutput" {
        r.fail(
            "slot",
            format!("{slot} exists as a {kind} slot with plugin {plugin:?}, not a pgoutput logical slot"),
            format!("drop it (SELECT pg_drop_replication_slot('{slot}');) {rename}"),
        );
    } else if db != here {
        r.fail(
            "slot",
            format!("{slot} belongs to database {db}, pgline reads {here}"),
            format!("point origin.url at {db}, {rename}"),
        );
    } else if active {
        let pid = pid.map_or("?".into(), |p| p.to_string());
        r.fail(
            "slot",
            format!("{slot} is active, held by pid {pid}"),
            format!(
                "stop the other consumer (a running pgline?) or SELECT pg_terminate_backend({pid}); {rename}"
            ),
        );
    } else {
        r.pass(
            "slot",
            format!("{slot} exists (pgoutput, confirmed {lsn}); pgline resumes from it"),
        );
    }
    Ok(())
}

/// Whether a failover to a standby keeps the cache (docs/consistency.md, "Failover"): on
/// PostgreSQL 17+ the slot must be a failover slot and the primary must hold logical
/// walsenders back for its standbys (`synchronized_standby_slots`); before 17 a failover
/// always flushes.
async fn check_failover(
    cfg: &Config,
    c: &Client,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    let slot = &cfg.replication.slot;
    let version: i32 = c
        .query_one("SELECT current_setting('server_version_num')::int4", &[])
        .await?
        .get(0);
    if version < 170_000 {
        r.pass(
            "failover",
            format!(
                "PostgreSQL {}: no failover slots before 17; after a failover to a standby \
                 pgline flushes the cache and refills it",
                version / 10_000
            ),
        );
        return Ok(());
    }
    let row = c
        .query_one(
            "SELECT current_setting('synchronized_standby_slots'), pg_is_in_recovery(), \
                    (SELECT failover FROM pg_replication_slots WHERE slot_name = $1)",
            &[slot],
        )
        .await?;
    let (standby_slots, in_recovery, failover): (String, bool, Option<bool>) =
        (row.get(0), row.get(1), row.get(2));
    if in_recovery {
        r.pass(
            "failover",
            "origin.url is a standby: failover slots are a primary's (see replication.url)",
        );
        return Ok(());
    }
    let mut problems = Vec::new();
    let mut fixes = Vec::new();
    if failover == Some(false) {
        problems.push(format!("slot {slot} is not a failover slot"));
        fixes.push(format!(
            "pgline serve makes it one when it next connects (ALTER_REPLICATION_SLOT {slot} \
             (FAILOVER true))"
        ));
    }
    if standby_slots.trim().is_empty() {
        problems.push("synchronized_standby_slots is empty".to_string());
        fixes.push(
            "set synchronized_standby_slots to the standbys' physical slots in postgresql.conf \
             (and sync_replication_slots = on, hot_standby_feedback = on and a dbname in \
             primary_conninfo on the standby); without it a failover may flush the cache"
                .to_string(),
        );
    }
    if problems.is_empty() {
        let state = if failover == Some(true) {
            "is a failover slot"
        } else {
            "will be created as a failover slot"
        };
        r.pass(
            "failover",
            format!(
                "slot {slot} {state}, synchronized_standby_slots = {standby_slots}: a promoted \
                 standby keeps the cache"
            ),
        );
    } else {
        r.warn(
            "failover",
            format!(
                "{}: a failover to a standby may flush the cache",
                problems.join("; ")
            ),
            fixes.join("; "),
        );
    }
    Ok(())
}

async fn check_publication(
    cfg: &Config,
    c: &Client,
    r: &mut Report,
    superuser: bool,
) -> Result<(), tokio_postgres::Error> {
    let name = &cfg.replication.publication;
    let row = c
        .query_opt(
            "SELECT puballtables, (SELECT count(*) FROM pg_publication_rel pr WHERE pr.prpubid = p.oid) \
             FROM pg_publication p WHERE pubname = $1",
            &[name],
        )
        .await?;
    let _ = superuser;
    match row {
        Some(row) => {
            let (puball, n): (bool, i64) = (row.get(0), row.get(1));
            if puball {
                r.warn(
                    "publication",
                    format!("{name} exists FOR ALL TABLES"),
                    "pgline serve replaces it with a list of the cached tables (FOR ALL TABLES makes UPDATE and DELETE fail at the origin for tables without a replica identity)".to_string(),
                );
            } else {
                r.pass(
                    "publication",
                    format!("{name} exists ({n} tables); pgline keeps it to the cached tables"),
                );
            }
        }
        None => {
            let may: bool = c
                .query_one(
                    "SELECT has_database_privilege(current_database(), 'CREATE')",
                    &[],
                )
                .await?
                .get(0);
            if may || superuser {
                r.pass(
                    "publication",
                    format!(
                        "{name} does not exist; pgline serve will create it for the cached tables"
                    ),
                );
            } else {
                r.fail(
                    "publication",
                    format!("{name} does not exist and the user may not create it"),
                    format!("GRANT CREATE ON DATABASE <db> TO <user>; or create it yourself: CREATE PUBLICATION {name} FOR TABLE ..."),
                );
            }
        }
    }
    Ok(())
}

async fn check_tables(
    cfg: &Config,
    c: &Client,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    if cfg.catalog.tables.is_empty() {
        let row = c
            .query_one(
                "SELECT count(*) FILTER (WHERE pk), count(*) FILTER (WHERE NOT pk) FROM ( \
                   SELECT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary) AS pk \
                   FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                   WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
                     AND n.nspname NOT LIKE 'pg_toast%' AND n.nspname NOT LIKE 'pg_temp%') t",
                &[],
            )
            .await?;
        let (with_pk, without): (i64, i64) = (row.get(0), row.get(1));
        let detail = format!(
            "catalog.tables is empty: every table with a primary key is cached ({with_pk}; {without} without one are not)"
        );
        if with_pk > 0 {
            r.pass("tables", detail);
        } else {
            r.warn(
                "tables",
                detail,
                "create tables with primary keys, or list tables in catalog.tables",
            );
        }
        return Ok(());
    }
    for name in &cfg.catalog.tables {
        let check = format!("table {name}");
        let row = c
            .query_one(
                "SELECT r.oid IS NOT NULL, \
                        (SELECT string_agg(a.attname::text, ',' ORDER BY k.ord) \
                           FROM pg_index i CROSS JOIN unnest(i.indkey) WITH ORDINALITY k(att, ord) \
                           JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.att \
                          WHERE i.indrelid = r.oid AND i.indisprimary), \
                        CASE WHEN r.oid IS NULL THEN false ELSE has_table_privilege(r.oid, 'SELECT') END \
                 FROM (SELECT to_regclass($1) AS oid) r",
                &[name],
            )
            .await;
        let row = match row {
            Ok(row) => row,
            // A malformed name (to_regclass raises on bad syntax).
            Err(e) => {
                r.fail(
                    &check,
                    e.to_string(),
                    format!("fix the name {name:?} in catalog.tables"),
                );
                continue;
            }
        };
        let (exists, pk, select): (bool, Option<String>, bool) =
            (row.get(0), row.get(1), row.get(2));
        if !exists {
            r.fail(
                &check,
                "does not exist on the origin",
                format!("create it on the origin or remove {name:?} from catalog.tables"),
            );
        } else if pk.is_none() {
            r.fail(
                &check,
                "has no primary key (rows cannot be addressed as table:pk)",
                format!("ALTER TABLE {name} ADD PRIMARY KEY (<columns>); or remove it from catalog.tables"),
            );
        } else if !select {
            r.fail(
                &check,
                "the origin user may not SELECT from it",
                format!("GRANT SELECT ON {name} TO <origin user>;"),
            );
        } else {
            r.pass(&check, format!("primary key ({})", pk.unwrap_or_default()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_and_mounts_parse() {
        let m = "MemTotal: 1 kB\nHugePages_Total:     256\nHugePages_Free:      240\n\
                 HugePages_Rsvd:      130\nHugePages_Surp: 0\nHugepagesize:       2048 kB\n";
        assert_eq!(parse_meminfo(m), Some((256, 240, 130, 2 << 20)));
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
        let mounts = "proc /proc proc rw 0 0\nnodev /dev/hugepages hugetlbfs rw,pagesize=2M 0 0\n";
        assert_eq!(
            parse_hugetlbfs_mounts(mounts),
            vec!["/dev/hugepages".to_string()]
        );
    }
}
