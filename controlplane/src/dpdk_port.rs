//! `nic.mode = "dpdk"`: brings up the DPDK client port from the `[nic]` section and hands the
//! engine one RX/TX queue pair per dataplane core.
//!
//! Order: EAL (once per process, on a thread of its own), mbuf pool, port by name (`nic.port`),
//! configure with `resp.cores` queue pairs, start, log the link. The [`Port`] handle is dropped
//! after the queues are taken: each [`DpdkQueue`] keeps the device open, and the device is stopped
//! and closed when the engine's cores have exited and dropped their queues.
//!
//! EAL arguments: `--vdev` for each of `nic.vdevs` (a multi-queue `net_af_packet` without
//! `framecnt` gets `framecnt=4096`, see [`vdev_with_defaults`]), `--no-pci` when `nic.no_pci`
//! (the default), `--file-prefix=pgline-<pid>` unless `nic.eal_args` names one, then `nic.eal_args` verbatim
//! (e.g. `--no-huge -m 512`, `--in-memory`, `-a 0000:01:00.0`).
//!
//! Thread model: `rte_eal_init` pins its calling thread to the main lcore's CPU set (and threads
//! it spawns later inherit that), so it runs on a short-lived thread of its own; the caller's
//! and the engine's threads keep their affinity. Each core's thread registers with the EAL on
//! its first RX burst (`DpdkQueue` does it, see `pgline_nic::dpdk`), which gives it an lcore id
//! and the mbuf pool's per-lcore cache of `POOL_CACHE` buffers.
//!
//! Counters: [`open_queues`] returns, beside the queues, a [`PortCounters`] handle (which does
//! not keep the port open) for the `/metrics` scrape (`pgline_nic_*`); it reads nothing once
//! the engine's cores have dropped the port's queues.
//!
//! Errors: [`DpdkError`] says which step failed; the composition root turns it into its start
//! error. This module imports nothing of the node that uses it.
//!
//! Limitations: DPDK allows one `rte_eal_init` per process. A second start in the same process
//! (tests) reuses the running EAL: its arguments are not re-read, and the `nic.vdevs` entry named
//! `nic.port` is hot-plugged if no such port exists yet (other vdevs are then ignored). The
//! mbuf pool lives until the process exits (DPDK has no safe way to free it while mbufs may be
//! out).

use std::sync::atomic::{AtomicU32, Ordering};

use pgline_nic::dpdk::{DpdkQueue, Eal, EalConfig, Mempool, Port, PortConfig, PortStatsHandle};

use crate::config::NicConfig;
use crate::metrics::{NicCounters, NicPortSnapshot};

/// Why the DPDK port could not be brought up.
#[derive(Debug, thiserror::Error)]
pub enum DpdkError {
    /// One step of the bring-up failed (`what`: the EAL, the mbuf pool, the port, a queue).
    #[error("dpdk: {what}: {detail}")]
    Step { what: String, detail: String },
    /// `rte_eal_init` panicked on its thread.
    #[error("dpdk: rte_eal_init panicked")]
    EalPanicked,
    /// `nic.port` names no probed port and no `nic.vdevs` entry to hot-plug.
    #[error(
        "dpdk: no port named {port:?} (probed: {probed} ports; name a vdev from nic.vdevs or a \
         PCI address, and check nic.no_pci)"
    )]
    NoSuchPort { port: String, probed: u16 },
    /// More cores than a port can have queue pairs.
    #[error("dpdk: {0} cores is too many queues")]
    TooManyQueues(usize),
}

/// The device counters of one open port, for the `/metrics` scrape.
pub struct PortCounters {
    /// The device name (`nic.port`).
    name: String,
    handle: PortStatsHandle,
}

impl NicCounters for PortCounters {
    fn snapshot(&self) -> Option<NicPortSnapshot> {
        let s = match self.handle.stats()? {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(port = %self.name, error = %e, "dpdk: rte_eth_stats_get failed");
                return None;
            }
        };
        let link = match self.handle.link()? {
            Ok(link) => Some((link.up, link.speed_mbps)),
            Err(e) => {
                tracing::debug!(port = %self.name, error = %e, "dpdk: rte_eth_link_get_nowait failed");
                None
            }
        };
        Some(NicPortSnapshot {
            port: self.name.clone(),
            link,
            ipackets: s.ipackets,
            opackets: s.opackets,
            ibytes: s.ibytes,
            obytes: s.obytes,
            imissed: s.imissed,
            ierrors: s.ierrors,
            oerrors: s.oerrors,
            rx_nombuf: s.rx_nombuf,
            queues: s
                .queues
                .iter()
                .map(|q| [q.ipackets, q.opackets, q.ibytes, q.obytes, q.errors])
                .collect(),
        })
    }
}

/// Mbufs per queue pair: RX and TX rings (1024 each by default) plus frames held by the stack.
const MBUFS_PER_QUEUE: u32 = 4096;
/// Per-lcore mbuf cache (used only by threads registered with the EAL).
const POOL_CACHE: u32 = 256;
/// Mbuf data room: a 1500-byte MTU frame plus DPDK's headroom.
const DATA_ROOM: u16 = 2048 + 128;

/// Pools made in this process, for unique pool names.
static POOLS: AtomicU32 = AtomicU32::new(0);

fn nic_error(what: &str, e: impl std::fmt::Display) -> DpdkError {
    DpdkError::Step {
        what: what.to_owned(),
        detail: e.to_string(),
    }
}

/// `framecnt` pgline gives a multi-queue `net_af_packet` vdev that names none.
pub const AF_PACKET_MULTIQUEUE_FRAMECNT: u32 = 4096;

/// A vdev entry (`name,key=value,...`) with pgline's defaults added: a `net_af_packet` with
/// `qpairs` > 1 and no `framecnt` gets `framecnt=4096`. Its queues form a `PACKET_FANOUT`
/// group with rollover: when one queue's ring (512 frames by default) is full the kernel hands
/// the frame to another queue, i.e. to another core, whose stack does not know the flow and
/// answers RST. 4,096 frames per queue absorb a 1,000-connection burst (measured in
/// `tests/dpdk_veth.rs`); an explicit `framecnt` is kept as given.
pub fn vdev_with_defaults(vdev: &str) -> String {
    let mut parts = vdev.split(',');
    let name = parts.next().unwrap_or("");
    let kv: Vec<(&str, &str)> = parts.filter_map(|p| p.split_once('=')).collect();
    let qpairs = kv
        .iter()
        .find(|(k, _)| *k == "qpairs")
        .and_then(|(_, v)| v.parse::<u32>().ok())
        .unwrap_or(1);
    if name.starts_with("net_af_packet") && qpairs > 1 && !kv.iter().any(|(k, _)| *k == "framecnt")
    {
        return format!("{vdev},framecnt={AF_PACKET_MULTIQUEUE_FRAMECNT}");
    }
    vdev.to_owned()
}

/// The EAL arguments `nic` asks for.
pub fn eal_config(nic: &NicConfig) -> EalConfig {
    let named = nic.eal_args.iter().any(|a| a.starts_with("--file-prefix"));
    EalConfig {
        file_prefix: (!named).then(|| format!("pgline-{}", std::process::id())),
        vdevs: nic.vdevs.iter().map(|v| vdev_with_defaults(v)).collect(),
        no_pci: nic.no_pci,
        extra_args: nic.eal_args.clone(),
        ..EalConfig::default()
    }
}

/// The process's EAL: initialized from `nic` on a dedicated thread, or the one already running.
fn eal(nic: &NicConfig) -> Result<(&'static Eal, bool), DpdkError> {
    if let Some(eal) = Eal::get() {
        return Ok((eal, false));
    }
    let cfg = eal_config(nic);
    tracing::info!(args = %cfg.args().join(" "), "dpdk: starting the EAL");
    let eal = std::thread::Builder::new()
        .name("pgline-eal-init".into())
        .spawn(move || Eal::init(&cfg))
        .map_err(|e| nic_error("EAL thread", e))?
        .join()
        .map_err(|_| DpdkError::EalPanicked)?
        .map_err(|e| nic_error("rte_eal_init", e))?;
    Ok((eal, true))
}

/// `nic.port`'s id, hot-plugging its `nic.vdevs` entry when the EAL was already running
/// without it. Returns the id, or a port already configured by the hot-plug.
fn find_port(
    eal: &'static Eal,
    nic: &NicConfig,
    fresh: bool,
    cfg: &PortConfig,
    pool: Mempool,
) -> Result<Port, DpdkError> {
    if let Ok(id) = eal.port_by_name(&nic.port) {
        return Port::configure(eal, id, cfg, pool).map_err(|e| nic_error(&nic.port, e));
    }
    let vdev = nic
        .vdevs
        .iter()
        .find(|v| v.split(',').next() == Some(nic.port.as_str()));
    match vdev {
        Some(vdev) if !fresh => {
            let vdev = &vdev_with_defaults(vdev);
            let args = vdev.split_once(',').map_or("", |(_, a)| a);
            tracing::info!(port = %nic.port, args, "dpdk: EAL already up, hot-plugging the vdev");
            Port::attach_vdev(eal, &nic.port, args, cfg, pool)
                .map_err(|e| nic_error(&format!("hot-plug {vdev}"), e))
        }
        _ => Err(DpdkError::NoSuchPort {
            port: nic.port.clone(),
            probed: eal.port_count(),
        }),
    }
}

/// Whether the mbuf pool is made with its buffers packed back to back: for `net_af_xdp`, whose
/// AF_XDP UMEM covers only that much of the pool (see `Mempool::create_packed`), and whenever
/// the EAL runs without hugepages (no device can DMA into such memory, and DPDK's one buffer
/// per 4 KiB page layout wastes ~40 % of it).
fn packed_pool(nic: &NicConfig, eal: &Eal) -> bool {
    nic.port.starts_with("net_af_xdp") || eal.args().iter().any(|a| a == "--no-huge")
}

/// Brings the port up and returns one queue pair per core (core `i` gets queue `i`) and the
/// port's counters.
pub fn open_queues(
    nic: &NicConfig,
    cores: usize,
) -> Result<(Vec<DpdkQueue>, PortCounters), DpdkError> {
    let queues = u16::try_from(cores).map_err(|_| DpdkError::TooManyQueues(cores))?;
    let (eal, fresh) = eal(nic)?;
    let n = POOLS.fetch_add(1, Ordering::Relaxed);
    // A power of two minus one is the mempool's most memory-efficient size.
    let mbufs = (MBUFS_PER_QUEUE * u32::from(queues)).next_power_of_two() * 2 - 1;
    let name = format!("pgline_rx{n}");
    let pool = if packed_pool(nic, eal) {
        Mempool::create_packed(eal, &name, mbufs, POOL_CACHE, DATA_ROOM)
    } else {
        Mempool::create(eal, &name, mbufs, POOL_CACHE, DATA_ROOM)
    }
    .map_err(|e| nic_error("mbuf pool", e))?;
    let port_cfg = PortConfig {
        queues,
        ..PortConfig::default()
    };
    let mut port = find_port(eal, nic, fresh, &port_cfg, pool)?;
    port.start().map_err(|e| nic_error("port start", e))?;
    let counters = PortCounters {
        name: nic.port.clone(),
        handle: port.stats_handle(),
    };
    let mac = port.mac().map(|b| format!("{b:02x}")).join(":");
    match port.link() {
        Ok(link) => tracing::info!(
            port = %nic.port,
            id = port.id(),
            %mac,
            queues,
            rss = port.rss(),
            tx_checksum = port.offloads().tx_checksum,
            link_up = link.up,
            speed_mbps = link.speed_mbps,
            "dpdk: port started"
        ),
        Err(e) => {
            tracing::warn!(port = %nic.port, %mac, error = %e, "dpdk: port started, link unknown")
        }
    }
    let queues = (0..queues)
        .map(|i| port.queue(i).map_err(|e| nic_error("queue", e)))
        .collect::<Result<_, _>>()?;
    Ok((queues, counters))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_queue_af_packet_gets_a_bigger_ring() {
        assert_eq!(
            vdev_with_defaults("net_af_packet0,iface=v0,qpairs=2"),
            "net_af_packet0,iface=v0,qpairs=2,framecnt=4096"
        );
        for kept in [
            "net_af_packet0,iface=v0",
            "net_af_packet0,iface=v0,qpairs=1",
            "net_af_packet0,iface=v0,qpairs=4,framecnt=1024",
            "net_af_xdp0,iface=v0,queue_count=2",
        ] {
            assert_eq!(vdev_with_defaults(kept), kept);
        }
        let nic = NicConfig {
            vdevs: vec!["net_af_packet1,iface=v1,qpairs=2".into()],
            ..NicConfig::default()
        };
        assert!(eal_config(&nic)
            .args()
            .contains(&"net_af_packet1,iface=v1,qpairs=2,framecnt=4096".to_string()));
    }

    #[test]
    fn eal_args_come_from_the_nic_section() {
        let nic = NicConfig {
            vdevs: vec!["net_af_packet0,iface=veth0".into()],
            eal_args: vec!["--no-huge".into(), "-m".into(), "256".into()],
            ..NicConfig::default()
        };
        let args = eal_config(&nic).args().join(" ");
        let prefix = format!("--file-prefix=pgline-{}", std::process::id());
        assert_eq!(
            args,
            format!(
                "pgline --lcores 0 {prefix} --vdev net_af_packet0,iface=veth0 --no-pci \
                 --no-huge -m 256"
            )
        );
        let nic = NicConfig {
            no_pci: false,
            eal_args: vec!["--file-prefix=mine".into()],
            ..NicConfig::default()
        };
        assert_eq!(
            eal_config(&nic).args().join(" "),
            "pgline --lcores 0 --file-prefix=mine"
        );
    }
}
