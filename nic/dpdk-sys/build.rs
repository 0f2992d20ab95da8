//! Builds the bindings to the system DPDK.
//!
//! 1. `pkg-config libdpdk` (>= 22.11) gives the compiler flags; its `-l` list is emitted last so
//!    that the C objects linked before it keep their `DT_NEEDED` entries under `--as-needed`.
//! 2. bindgen reads `wrapper.h` with an allowlist and writes Rust wrappers for the allowlisted
//!    `static inline` functions (`wrap_static_fns`): the burst, alloc and free fast paths.
//! 3. `cc` compiles the generated C wrappers together with `shim.c` into one static library.
//!
//! PMDs are not linked: Debian's `librte_eal` loads every driver in its built-in plugin directory
//! (`pkg-config --variable=pmdsdir libdpdk`) at `rte_eal_init`.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const MIN_VERSION: &str = "22.11";

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=shim.c");
    for var in [
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    println!("cargo:rustc-check-cfg=cfg(pgline_dpdk)");

    let lib = match pkg_config::Config::new()
        .atleast_version(MIN_VERSION)
        .cargo_metadata(false)
        .probe("libdpdk")
    {
        Ok(lib) => lib,
        Err(e) => {
            // Build an empty crate so the workspace builds without DPDK; the `dpdk` feature of
            // pgline-nic then fails to compile, which is the place to say it is needed.
            println!(
                "cargo:warning=libdpdk >= {MIN_VERSION} not found, pgline-dpdk-sys is empty: {e}"
            );
            return;
        }
    };
    println!("cargo:rustc-cfg=pgline_dpdk");
    let cflags = pkg_config_cflags();
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let wrappers = out.join("static_wrappers");

    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_args(&cflags)
        .allowlist_function("rte_eal_.*")
        .allowlist_function("rte_eth_.*")
        .allowlist_function("rte_pktmbuf_.*")
        .allowlist_function("rte_mempool_(create|free|lookup|avail_count|in_use_count|full|empty)")
        .allowlist_function("rte_lcore_.*")
        .allowlist_function("rte_socket_id")
        .allowlist_function("rte_thread_(register|unregister)")
        .allowlist_function("rte_strerror")
        .allowlist_function("pgline_.*")
        .allowlist_var(
            "RTE_(MAX_ETHPORTS|ETHDEV_QUEUE_STAT_CNTRS|PKTMBUF_HEADROOM|MBUF_DEFAULT_.*|ETHER_.*)",
        )
        .allowlist_var("RTE_ETH_(LINK|MQ|SPEED)_.*")
        .allowlist_var("RTE_MBUF_F_.*")
        .allowlist_var("SOCKET_ID_ANY|LCORE_ID_ANY")
        .blocklist_function(
            "rte_eth_dev_(fw_version_get|get_reg_info|get_module.*|get_eeprom.*|set_eeprom)",
        )
        .derive_default(true)
        .layout_tests(true)
        .wrap_static_fns(true)
        .wrap_static_fns_path(&wrappers)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .expect("bindgen failed on wrapper.h");
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("cannot write bindings.rs");

    let mut build = cc::Build::new();
    build
        .file(wrappers.with_extension("c"))
        .file("shim.c")
        .include(env::current_dir().expect("cwd"))
        .warnings(false)
        .opt_level(3);
    for flag in &cflags {
        build.flag(flag);
    }
    // Inline wrappers may call experimental inline APIs; they only forward.
    build.define("ALLOW_EXPERIMENTAL_API", None);
    build.compile("pgline_dpdk_shim");

    for path in &lib.link_paths {
        println!("cargo:rustc-link-search=native={}", path.display());
    }
    for name in &lib.libs {
        println!("cargo:rustc-link-lib=dylib={name}");
    }
}

/// `pkg-config --cflags libdpdk`, split on whitespace (DPDK's flags carry no quoted spaces).
fn pkg_config_cflags() -> Vec<String> {
    let pc = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".into());
    let output = Command::new(pc)
        .args(["--cflags", "libdpdk"])
        .output()
        .expect("run pkg-config --cflags libdpdk");
    assert!(
        output.status.success(),
        "pkg-config --cflags libdpdk failed"
    );
    String::from_utf8(output.stdout)
        .expect("pkg-config output is UTF-8")
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}
