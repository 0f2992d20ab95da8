//! The `pgline` binary's configuration handling, as an operator meets it.

use std::process::Command;

fn pgline(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgline"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run pgline");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn effective_config_layers_file_env_and_flags() {
    let dir = std::env::temp_dir().join(format!("pgline-cli-{}.toml", std::process::id()));
    std::fs::write(&dir, "[resp]\ncores = 2\n[store]\nmemory = \"64MiB\"\n").unwrap();
    let (code, out, err) = pgline(
        &[
            "config",
            "--config",
            dir.to_str().unwrap(),
            "--listen",
            "127.0.0.1:7777",
        ],
        &[
            ("PGLINE_STORE_MEMORY", "\"128MiB\""),
            ("PGLINE_REPLICATION_MAX_LAG_MS", "2500"),
        ],
    );
    let _ = std::fs::remove_file(&dir);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("listen = \"127.0.0.1:7777\""), "{out}");
    assert!(out.contains("cores = 2"), "{out}");
    assert!(out.contains(&format!("memory = {}", 128u64 << 20)), "{out}");
    assert!(out.contains("max_lag_ms = 2500"), "{out}");
}

#[test]
fn unknown_keys_and_bad_values_stop_start_up_naming_them() {
    let (code, _, err) = pgline(&["serve", "--set", "resp.corez=2"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("corez"), "{err}");
    let (code, _, err) = pgline(&["serve"], &[("PGLINE_RESP_LISTEN", "not-an-address")]);
    assert_eq!(code, 2);
    assert!(err.contains("resp.listen"), "{err}");
    let (code, _, err) = pgline(&["serve", "--memory", "12 parsecs"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("parsecs"), "{err}");
    let (code, _, err) = pgline(&["serve", "--config", "/nonexistent/pgline.toml"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/pgline.toml"), "{err}");
}

#[test]
fn unreachable_origin_is_reported_with_its_cause() {
    // Nothing listens on port 1.
    let (code, _, err) = pgline(
        &[
            "serve",
            "--origin",
            "host=127.0.0.1 port=1 user=x dbname=x",
            "--listen",
            "127.0.0.1:0",
        ],
        &[("PGLINE_ORIGIN_CONNECT_TIMEOUT_MS", "500")],
    );
    assert_ne!(code, 0);
    assert!(err.contains("origin unreachable"), "{err}");
}

#[test]
fn nic_flag_selects_the_transport_and_dpdk_needs_its_feature() {
    let (code, out, err) = pgline(
        &[
            "config",
            "--nic",
            "dpdk",
            "--set",
            "nic.port=\"net_null0\"",
            "--set",
            "nic.ip=\"10.0.0.2\"",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("mode = \"dpdk\""), "{out}");
    assert!(out.contains("no_pci = true"), "{out}");
    let (code, _, err) = pgline(&["serve", "--nic", "dpdk"], &[]);
    assert_eq!(code, 2, "nic.ip and nic.port are required: {err}");
    assert!(err.contains("nic.ip"), "{err}");
    let (code, _, err) = pgline(
        &[
            "serve",
            "--nic",
            "dpdk",
            "--set",
            "nic.ip=\"10.0.0.2\"",
            "--set",
            "nic.port=\"net_null0\"",
        ],
        &[],
    );
    assert_ne!(code, 0);
    if cfg!(feature = "dpdk") {
        // Passes the transport check; the origin (connected before the port opens) is not up.
        assert!(err.contains("origin unreachable"), "{err}");
    } else {
        assert!(err.contains("built without the dpdk feature"), "{err}");
    }
    let (code, _, err) = pgline(&["serve", "--nic", "rdma"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("rdma"), "{err}");
    let (code, _, err) = pgline(
        &[
            "serve",
            "--set",
            "nic.mode=\"mem\"",
            "--set",
            "nic.ip=\"10.0.0.2\"",
        ],
        &[],
    );
    assert_eq!(code, 2);
    assert!(err.contains("in-process tests"), "{err}");
}
