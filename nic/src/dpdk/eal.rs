//! The Environment Abstraction Layer: initialized once per process from an [`EalConfig`].

use std::ffi::{c_char, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use pgline_dpdk_sys as sys;

use super::DpdkError;

/// Default lcore list: the main lcore alone (dataplane threads register themselves).
pub const DEFAULT_LCORES: &str = "0";

/// EAL arguments, turned into an `argv` by [`EalConfig::args`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EalConfig {
    /// `--lcores`: lcore list, e.g. `"0"` or `"0-3"`, or with CPU sets, e.g. `"0@(0-7)"` (the
    /// main lcore may then run on any of CPUs 0-7).
    pub lcores: String,
    /// `--main-lcore`.
    pub main_lcore: Option<u32>,
    /// `--file-prefix`: keeps runtime files of separate DPDK processes apart.
    pub file_prefix: Option<String>,
    /// `--vdev` each: virtual devices, e.g. `net_af_packet0,iface=veth0`.
    pub vdevs: Vec<String>,
    /// `--no-pci`: do not probe PCI devices (tests: virtual devices only).
    pub no_pci: bool,
    /// `--no-huge`: anonymous 4 KiB memory instead of hugepages (tests; not for PMDs doing DMA).
    pub no_huge: bool,
    /// `--in-memory`: no shared runtime files, no multi-process.
    pub in_memory: bool,
    /// `-m`: memory to preallocate, in MiB.
    pub memory_mb: Option<u32>,
    /// `--log-level`, e.g. `"notice"` or `"pmd.net.af_packet:debug"`.
    pub log_level: Option<String>,
    /// Appended verbatim (e.g. `-a 0000:01:00.0`, `-d /path/to/pmd.so`).
    pub extra_args: Vec<String>,
}

impl Default for EalConfig {
    fn default() -> Self {
        EalConfig {
            lcores: DEFAULT_LCORES.to_owned(),
            main_lcore: None,
            file_prefix: None,
            vdevs: Vec::new(),
            no_pci: false,
            no_huge: false,
            in_memory: false,
            memory_mb: None,
            log_level: None,
            extra_args: Vec::new(),
        }
    }
}

impl EalConfig {
    /// The EAL command line, program name first.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "pgline".to_owned(),
            "--lcores".to_owned(),
            self.lcores.clone(),
        ];
        if let Some(main) = self.main_lcore {
            args.extend(["--main-lcore".to_owned(), main.to_string()]);
        }
        if let Some(prefix) = &self.file_prefix {
            args.push(format!("--file-prefix={prefix}"));
        }
        for vdev in &self.vdevs {
            args.extend(["--vdev".to_owned(), vdev.clone()]);
        }
        if self.no_pci {
            args.push("--no-pci".to_owned());
        }
        if self.no_huge {
            args.push("--no-huge".to_owned());
        }
        if self.in_memory {
            args.push("--in-memory".to_owned());
        }
        if let Some(mb) = self.memory_mb {
            args.extend(["-m".to_owned(), mb.to_string()]);
        }
        if let Some(level) = &self.log_level {
            args.push(format!("--log-level={level}"));
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }

    /// Checks what DPDK would otherwise reject obscurely.
    pub fn validate(&self) -> Result<(), DpdkError> {
        if self.lcores.is_empty() {
            return Err(DpdkError::Invalid("lcores is empty"));
        }
        if self.args().iter().any(|a| a.as_bytes().contains(&0)) {
            return Err(DpdkError::Invalid("an EAL argument contains a NUL byte"));
        }
        if self.no_huge && self.memory_mb == Some(0) {
            return Err(DpdkError::Invalid("memory_mb is 0"));
        }
        Ok(())
    }
}

/// Proof that the EAL is up; obtained once per process from [`Eal::init`], then [`Eal::get`].
#[derive(Debug)]
pub struct Eal {
    args: Vec<String>,
}

/// Set by the first [`Eal::init`], before it calls DPDK: DPDK allows one attempt per process.
static ATTEMPTED: AtomicBool = AtomicBool::new(false);
static EAL: OnceLock<Eal> = OnceLock::new();

impl Eal {
    /// Runs `rte_eal_init` with `cfg`'s arguments. Returns [`DpdkError::AlreadyInitialized`] on
    /// any later call.
    ///
    /// The calling thread becomes the main lcore and is pinned to its CPU set, and threads it
    /// spawns afterwards inherit that affinity: call this from a thread of its own (or the one
    /// that will poll), or give the main lcore a CPU set (`lcores: "0@(0-63)"`).
    pub fn init(cfg: &EalConfig) -> Result<&'static Eal, DpdkError> {
        cfg.validate()?;
        if ATTEMPTED.swap(true, Ordering::SeqCst) {
            return Err(DpdkError::AlreadyInitialized);
        }
        let args = cfg.args();
        // DPDK may keep pointers into argv (and getopt permutes it): both live for the process.
        let strings: Vec<CString> = args
            .iter()
            .map(|a| CString::new(a.as_str()).expect("validate() rejected NUL bytes"))
            .collect();
        let argv: &'static mut [*mut c_char] = Vec::leak(
            strings
                .into_iter()
                .map(CString::into_raw)
                .chain(std::iter::once(std::ptr::null_mut()))
                .collect(),
        );
        let argc =
            i32::try_from(argv.len() - 1).map_err(|_| DpdkError::Invalid("too many args"))?;
        // SAFETY: argv holds argc valid NUL-terminated strings and a terminating null, all leaked
        // so they outlive the EAL; ATTEMPTED guarantees this is the process's only call.
        let ret = unsafe { sys::rte_eal_init(argc, argv.as_mut_ptr()) };
        if ret < 0 {
            return Err(DpdkError::call("rte_eal_init", ret));
        }
        Ok(EAL.get_or_init(|| Eal { args }))
    }

    /// The EAL, if [`Eal::init`] succeeded in this process.
    pub fn get() -> Option<&'static Eal> {
        EAL.get()
    }

    /// The arguments `rte_eal_init` was given.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// Registers the calling (non-EAL) thread with DPDK so it gets an lcore id, and with it the
    /// mempools' per-lcore caches. Call once on each dataplane thread before polling.
    pub fn register_thread(&self) -> Result<(), DpdkError> {
        // SAFETY: the EAL is initialized (self exists); the call only touches this thread's
        // lcore slot.
        let ret = unsafe { sys::rte_thread_register() };
        if ret != 0 {
            return Err(DpdkError::call("rte_thread_register", ret));
        }
        Ok(())
    }

    /// Gives the calling thread's lcore id back (before the thread exits).
    pub fn unregister_thread(&self) {
        // SAFETY: the EAL is initialized; a no-op for threads that are not registered.
        unsafe { sys::rte_thread_unregister() }
    }

    /// The calling thread's lcore id, `None` for a thread neither EAL-made nor registered.
    pub fn lcore_id(&self) -> Option<u32> {
        // SAFETY: reads this thread's lcore id; the EAL is initialized.
        let id = unsafe { sys::rte_lcore_id() };
        (id != sys::LCORE_ID_ANY).then_some(id)
    }

    /// Ports DPDK probed (vdevs and, without `--no-pci`, bound PCI NICs).
    pub fn port_count(&self) -> u16 {
        // SAFETY: the EAL is initialized; reads the ethdev table.
        unsafe { sys::rte_eth_dev_count_avail() }
    }

    /// The port id of a device by its name (a vdev's name, e.g. `net_af_packet0`, or a PCI
    /// address).
    pub fn port_by_name(&self, name: &str) -> Result<u16, DpdkError> {
        let name = CString::new(name).map_err(|_| DpdkError::Invalid("NUL in port name"))?;
        let mut port = 0u16;
        // SAFETY: `name` is a valid C string and `port` a valid out-pointer for the call.
        let ret = unsafe { sys::rte_eth_dev_get_port_by_name(name.as_ptr(), &mut port) };
        if ret != 0 {
            return Err(DpdkError::NoSuchPort);
        }
        Ok(port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_are_in_eal_syntax() {
        let cfg = EalConfig {
            lcores: "0-1".into(),
            file_prefix: Some("t1".into()),
            vdevs: vec!["net_ring0".into(), "net_null0".into()],
            no_pci: true,
            no_huge: true,
            in_memory: true,
            memory_mb: Some(256),
            log_level: Some("notice".into()),
            extra_args: vec!["--huge-unlink".into()],
            ..EalConfig::default()
        };
        assert_eq!(
            cfg.args().join(" "),
            "pgline --lcores 0-1 --file-prefix=t1 --vdev net_ring0 --vdev net_null0 --no-pci --no-huge \
             --in-memory -m 256 --log-level=notice --huge-unlink"
        );
        assert_eq!(cfg.validate(), Ok(()));
    }

    #[test]
    fn validate_rejects_nul_and_empty_lcores() {
        let nul = EalConfig {
            vdevs: vec!["net_ring0\0".into()],
            ..EalConfig::default()
        };
        assert!(matches!(nul.validate(), Err(DpdkError::Invalid(_))));
        let empty = EalConfig {
            lcores: String::new(),
            ..EalConfig::default()
        };
        assert!(matches!(empty.validate(), Err(DpdkError::Invalid(_))));
    }
}
