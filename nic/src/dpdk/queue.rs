//! One RX/TX queue pair of a port, owned by one dataplane core: the [`Queue`] implementation.
//!
//! EAL registration: the first `rx_burst` (only the polling core calls it) on a thread that has
//! no lcore id registers that thread with the EAL (`rte_thread_register`), so the mbuf pool's per-lcore
//! cache serves its allocations and frees (and drivers that index per-lcore state by
//! `rte_lcore_id()` see a real id). The queue gives the lcore back (`rte_thread_unregister`)
//! when it is dropped on that same thread, which is where a core drops its stack. The engine's
//! threads therefore need no DPDK-specific start hook. A registration that fails (all
//! `RTE_MAX_LCORE` slots taken) is counted in [`QueueCounters::register_failed`] and the queue
//! keeps working through the pool's shared ring.

use std::sync::Arc;
use std::thread::ThreadId;

use pgline_dpdk_sys as sys;

use super::port::PortShared;
use super::Mbuf;
use crate::{Offloads, Queue};

/// Most frames handed to one `rte_eth_rx_burst`/`rte_eth_tx_burst` call.
const MAX_BURST: usize = 64;

/// Software counters of one queue pair, kept by the owning core (plain integers, no atomics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueCounters {
    /// Frames received.
    pub rx_packets: u64,
    /// `rx_burst` calls that returned at least one frame.
    pub rx_bursts: u64,
    /// Frames the device took for transmission.
    pub tx_packets: u64,
    /// Frames offered to `tx_burst` and not taken (TX ring full), counted per attempt.
    pub tx_full: u64,
    /// `alloc` calls that found the pool empty.
    pub alloc_failed: u64,
    /// 1 when registering the polling thread with the EAL failed (no lcore slot left).
    pub register_failed: u64,
}

/// Whether the polling thread has been looked at for EAL registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lcore {
    /// Not polled yet.
    Unchecked,
    /// This queue registered `ThreadId`; it unregisters it on drop (on that thread).
    Registered(ThreadId),
    /// The thread already had an lcore id (an EAL thread), or registration failed.
    Left,
}

/// RX/TX queue pair `index` of a port. Dropping it gives the index back to the [`super::Port`].
#[derive(Debug)]
pub struct DpdkQueue {
    port: Arc<PortShared>,
    index: u16,
    counters: QueueCounters,
    lcore: Lcore,
}

impl DpdkQueue {
    pub(crate) fn new(port: Arc<PortShared>, index: u16) -> DpdkQueue {
        DpdkQueue {
            port,
            index,
            counters: QueueCounters::default(),
            lcore: Lcore::Unchecked,
        }
    }

    /// The polling thread's lcore id, registering the thread the first time (see the module
    /// doc). Cheap after the first call: one compare.
    #[inline]
    fn ensure_lcore(&mut self) {
        if self.lcore == Lcore::Unchecked {
            self.register_lcore();
        }
    }

    #[cold]
    fn register_lcore(&mut self) {
        // SAFETY: the EAL is initialized (a queue exists only after a port was configured);
        // both calls touch only the calling thread's lcore slot.
        let (had, ret) = unsafe {
            if sys::rte_lcore_id() != sys::LCORE_ID_ANY {
                (true, 0)
            } else {
                (false, sys::rte_thread_register())
            }
        };
        self.lcore = if had {
            Lcore::Left
        } else if ret == 0 {
            Lcore::Registered(std::thread::current().id())
        } else {
            self.counters.register_failed = 1;
            Lcore::Left
        };
    }

    /// True when this queue registered the thread that polls it with the EAL.
    pub fn registered_lcore(&self) -> bool {
        matches!(self.lcore, Lcore::Registered(_))
    }

    /// The queue index on its port.
    pub fn index(&self) -> u16 {
        self.index
    }

    /// The port id.
    pub fn port_id(&self) -> u16 {
        self.port.id
    }

    /// This queue's software counters.
    pub fn counters(&self) -> QueueCounters {
        self.counters
    }
}

impl Drop for DpdkQueue {
    fn drop(&mut self) {
        if let Lcore::Registered(id) = self.lcore {
            if std::thread::current().id() == id {
                // SAFETY: this thread was registered by this queue (register_lcore) and is the
                // calling thread; the lcore slot goes back to the EAL's pool.
                unsafe { sys::rte_thread_unregister() };
            }
        }
        self.port.release(self.index);
    }
}

impl Queue for DpdkQueue {
    type Packet = Mbuf;

    fn rx_burst(&mut self, out: &mut Vec<Mbuf>, max: usize) -> usize {
        self.ensure_lcore();
        let mut total = 0;
        while total < max {
            let want = (max - total).min(MAX_BURST);
            out.reserve(want);
            let spare = out.spare_capacity_mut();
            // SAFETY: this queue index is owned by this object alone (Port::queue hands it out
            // once), so one thread polls it; `spare` has room for `want` (<= u16::MAX) pointers,
            // and Mbuf is a transparent NonNull<rte_mbuf>, so DPDK's pointers fill its slots.
            let n = unsafe {
                sys::rte_eth_rx_burst(
                    self.port.id,
                    self.index,
                    spare.as_mut_ptr().cast(),
                    want as u16,
                )
            };
            let n = usize::from(n);
            let len = out.len() + n;
            // SAFETY: DPDK wrote `n` valid mbuf pointers, now owned by the caller through `out`.
            unsafe { out.set_len(len) };
            total += n;
            if n < want {
                break;
            }
        }
        if total > 0 {
            self.counters.rx_packets += total as u64;
            self.counters.rx_bursts += 1;
        }
        total
    }

    #[inline]
    fn alloc(&mut self) -> Option<Mbuf> {
        let m = self.port.pool.alloc();
        if m.is_none() {
            self.counters.alloc_failed += 1;
        }
        m
    }

    fn tx_burst(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        let mut sent = 0;
        while sent < pkts.len() {
            let want = (pkts.len() - sent).min(MAX_BURST);
            // SAFETY: as in rx_burst, one thread owns this queue; the `want` pointers from
            // `sent` on are owned mbufs (Mbuf is a transparent NonNull<rte_mbuf>). The device
            // takes ownership of the first `n` it returns; those are forgotten below.
            let n = unsafe {
                sys::rte_eth_tx_burst(
                    self.port.id,
                    self.index,
                    pkts.as_mut_ptr().add(sent).cast(),
                    want as u16,
                )
            };
            sent += usize::from(n);
            if usize::from(n) < want {
                break;
            }
        }
        // The device owns the first `sent` mbufs now: remove them without freeing.
        pkts.drain(..sent).for_each(std::mem::forget);
        self.counters.tx_packets += sent as u64;
        self.counters.tx_full += pkts.len() as u64;
        sent
    }

    fn offloads(&self) -> Offloads {
        self.port.offloads
    }

    fn mac(&self) -> [u8; 6] {
        self.port.mac
    }

    fn max_frame(&self) -> usize {
        self.port.max_frame
    }
}
