//! The DPDK backend: EAL set-up, mbuf pools, ports and per-core queue pairs over the system
//! `libdpdk` (through `pgline-dpdk-sys`).
//!
//! Purpose: own a NIC (or a virtual device) from userspace and hand each dataplane core one
//! [`DpdkQueue`] (an RX/TX queue pair) implementing [`crate::Queue`], with [`Mbuf`] as its
//! [`crate::Packet`]. On the hit path only `rx_burst`, `alloc`, `tx_burst` and the mbuf accessors
//! run: no allocation, no lock, no system call (for poll-mode drivers; `net_af_packet` makes a
//! `sendto` per TX burst by design).
//!
//! Set-up order: [`Eal::init`] once per process, then [`Mempool::create`], then
//! [`Port::configure`] (by id, or by name through [`Eal::port_by_name`]), [`Port::start`], and
//! [`Port::queue`] once per queue index, each moved to its core.
//!
//! Invariants:
//! - `rte_eal_init` runs at most once per process: a second [`Eal::init`] (even after a failed
//!   first one, which DPDK does not allow to be retried) returns [`DpdkError::AlreadyInitialized`];
//! - one [`Port`] per device at a time, and a queue index is handed out once at a time, so
//!   exactly one thread polls an RX/TX queue;
//! - mempools live until the process exits (as in DPDK's own applications): an [`Mbuf`] never
//!   outlives its pool, without a reference count per packet;
//! - a port is stopped and closed when the [`Port`] and all its queues are gone; [`Port::stop`]
//!   refuses while queues are out.
//!
//! Thread model: [`Eal`], [`Mempool`] and [`Port`] may be shared; a [`DpdkQueue`] and its
//! [`Mbuf`]s move between threads but are used by one at a time. A [`DpdkQueue`] registers the
//! thread of its first RX burst with the EAL (and unregisters it when dropped there), so the
//! mempool's per-lcore cache serves the polling core; [`Eal::register_thread`] does the same by
//! hand for other threads (unregistered threads still work, through the pool's shared ring).
//!
//! Pools for `net_af_xdp` must be made with [`Mempool::create_packed`]: the PMD's AF_XDP UMEM
//! covers only `capacity * buffer size` bytes from the pool's start.
//!
//! Limitations: single-segment frames only (no scatter RX, no TSO); at most 64 queue pairs per
//! port; RSS uses DPDK's default key; per-queue device counters exist for the first
//! `RTE_ETHDEV_QUEUE_STAT_CNTRS` (16) queues and only where the driver fills them.

#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod eal;
mod mbuf;
mod port;
mod queue;

pub use eal::{Eal, EalConfig};
pub use mbuf::{Mbuf, Mempool};
pub use port::{Link, Port, PortConfig, PortStats, PortStatsHandle, QueueStats};
pub use queue::{DpdkQueue, QueueCounters};

use std::ffi::CStr;
use std::fmt;

use pgline_dpdk_sys as sys;

/// What went wrong in the DPDK backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DpdkError {
    /// [`Eal::init`] was already called in this process.
    AlreadyInitialized,
    /// An argument or configuration value is out of range; the text says which.
    Invalid(&'static str),
    /// No port has this id or name.
    NoSuchPort,
    /// Another [`Port`] already configured this device.
    PortInUse,
    /// The queue index is out of range or already handed out.
    QueueTaken(u16),
    /// [`Port::stop`] while queues are still out.
    QueuesInUse,
    /// A DPDK call failed: the function and the (positive) errno it gave.
    Call { op: &'static str, errno: i32 },
}

impl DpdkError {
    /// A failed call: `ret` is DPDK's negative return (or -1 with `rte_errno` set).
    pub(crate) fn call(op: &'static str, ret: i32) -> Self {
        let errno = if ret == -1 || ret >= 0 {
            sys::rte_errno()
        } else {
            -ret
        };
        DpdkError::Call { op, errno }
    }
}

impl fmt::Display for DpdkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DpdkError::AlreadyInitialized => f.write_str("the DPDK EAL is already initialized"),
            DpdkError::Invalid(what) => write!(f, "invalid DPDK configuration: {what}"),
            DpdkError::NoSuchPort => f.write_str("no such DPDK port"),
            DpdkError::QueueTaken(q) => write!(f, "queue {q} is out of range or already taken"),
            DpdkError::PortInUse => f.write_str("the DPDK port is already configured"),
            DpdkError::QueuesInUse => f.write_str("the port still has queues in use"),
            DpdkError::Call { op, errno } => {
                // SAFETY: `rte_strerror` returns a pointer to a NUL-terminated string, static or
                // in a thread-local buffer that stays valid until the next call on this thread;
                // it is copied before returning.
                let text = unsafe { CStr::from_ptr(sys::rte_strerror(*errno)) };
                write!(f, "{op} failed: {} (errno {errno})", text.to_string_lossy())
            }
        }
    }
}

impl std::error::Error for DpdkError {}
