//! CPU clocks, pinning and the machine description the report carries.
//!
//! Thread CPU time is read with `clock_gettime` on a thread's CPU clock: the calling thread's
//! (`CLOCK_THREAD_CPUTIME_ID`) or another thread's (the clock id `pthread_getcpuclockid` gives for
//! it), so the client thread can read the server thread's CPU time at the edges of the measured
//! window without the server doing anything. Time a thread spends preempted on a shared machine is
//! not counted, which is what makes per-request CPU figures usable on a noisy box.
//!
//! Cycles are CPU time x a nominal clock rate from `/proc/cpuinfo` (see [`nominal_mhz`]); no
//! hardware counters are needed. Memory is the process's resident set ([`rss_bytes`]).

use std::time::Duration;

/// A thread's CPU clock, readable from any thread of the process.
#[derive(Clone, Copy, Debug)]
pub struct ThreadClock(libc::clockid_t);

impl ThreadClock {
    /// The calling thread's clock.
    pub fn current() -> ThreadClock {
        ThreadClock(libc::CLOCK_THREAD_CPUTIME_ID)
    }

    /// The calling thread's clock as an id other threads can read (valid while it runs).
    pub fn of_current() -> Option<ThreadClock> {
        let mut id: libc::clockid_t = 0;
        // SAFETY: `pthread_self` is the live calling thread; `id` is a valid, writable
        // clockid_t.
        let rc = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) };
        (rc == 0).then_some(ThreadClock(id))
    }

    /// CPU time consumed so far (zero if the clock cannot be read).
    pub fn read(self) -> Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; an invalid clock id only makes the call
        // fail, which is checked.
        let rc = unsafe { libc::clock_gettime(self.0, &mut ts) };
        if rc != 0 {
            return Duration::ZERO;
        }
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }
}

/// Pins the calling thread to `cpu`; false if the kernel refused (e.g. the CPU is not allowed).
pub fn pin_current(cpu: usize) -> bool {
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it (cpu is below
    // CPU_SETSIZE); sched_setaffinity(0, ..) reads exactly size_of::<cpu_set_t>() bytes of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// CPUs this process may run on, in order (empty if unknown).
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity writes at most its size; CPU_ISSET
    // reads inside it for every index below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// The clock rate cycles are counted at, and where it came from.
///
/// `cpu MHz` of the first processor in `/proc/cpuinfo`; on a VM with `tsc_known_freq` (as here)
/// that is the TSC rate the hypervisor announces, i.e. nominal, not the boost clock. Falls back to
/// the `@ x.xxGHz` of the model name.
pub fn nominal_mhz() -> (f64, &'static str) {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    if let Some(mhz) = field("cpu MHz").and_then(|v| v.parse::<f64>().ok()) {
        let tsc = info.contains("tsc_known_freq");
        return (
            mhz,
            if tsc {
                "cpuinfo cpu MHz (TSC, tsc_known_freq)"
            } else {
                "cpuinfo cpu MHz"
            },
        );
    }
    let ghz = field("model name")
        .and_then(|m| m.rsplit_once('@').map(|(_, g)| g.trim().to_string()))
        .and_then(|g| g.trim_end_matches("GHz").trim().parse::<f64>().ok());
    match ghz {
        Some(g) => (g * 1000.0, "model name GHz"),
        None => (0.0, "unknown"),
    }
}

/// The process's resident set size (`VmRSS` of `/proc/self/status`), `None` where unreadable.
pub fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Where the figures were taken.
#[derive(Clone, Debug)]
pub struct Env {
    pub cpu_model: String,
    pub cores: usize,
    pub kernel: String,
}

impl Env {
    pub fn probe() -> Env {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = info
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|k| k.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        Env {
            cpu_model,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel,
        }
    }
}
