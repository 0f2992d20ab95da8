//! Ethernet ports: configure (queues, rings, MTU, RSS, checksum offloads), start/stop, link,
//! MAC, counters, and the per-core queue pairs.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use pgline_dpdk_sys as sys;

use super::{DpdkError, DpdkQueue, Eal, Mempool};
use crate::Offloads;

/// Ports configured through a live [`Port`] (bit = port id): one `Port` per device at a time,
/// so each queue index has one owner process-wide.
static CLAIMED: AtomicU64 = AtomicU64::new(0);

/// Claims port `id` for one [`Port`]; false if another holds it (or the id is out of range).
fn claim(id: u16) -> bool {
    let Some(bit) = 1u64.checked_shl(u32::from(id)) else {
        return false;
    };
    u32::from(id) < sys::RTE_MAX_ETHPORTS && CLAIMED.fetch_or(bit, Ordering::AcqRel) & bit == 0
}

fn unclaim(id: u16) {
    CLAIMED.fetch_and(!(1u64 << id), Ordering::AcqRel);
}

/// Queue pairs a port can have here (the taken-queue set is one `u64`).
pub const MAX_QUEUES: u16 = 64;
/// Default RX and TX ring sizes (descriptors), adjusted to the device's limits.
pub const DEFAULT_RING: u16 = 1024;
/// Default MTU.
pub const DEFAULT_MTU: u16 = 1500;
const VDEV_BUS: &std::ffi::CStr = c"vdev";
const ETHER_HDR_LEN: usize = sys::RTE_ETHER_HDR_LEN as usize;
/// RSS hash types pgline asks for (IPv4 and its TCP/UDP ports), masked by the device's.
const RSS_TYPES: u64 = sys::RSS_IPV4
    | sys::RSS_FRAG_IPV4
    | sys::RSS_NONFRAG_IPV4_TCP
    | sys::RSS_NONFRAG_IPV4_UDP
    | sys::RSS_NONFRAG_IPV4_OTHER;
const TX_CKSUM: u64 =
    sys::TX_OFFLOAD_IPV4_CKSUM | sys::TX_OFFLOAD_TCP_CKSUM | sys::TX_OFFLOAD_UDP_CKSUM;
const RX_CKSUM: u64 =
    sys::RX_OFFLOAD_IPV4_CKSUM | sys::RX_OFFLOAD_TCP_CKSUM | sys::RX_OFFLOAD_UDP_CKSUM;

/// How to set a port up. Offloads and RSS are wishes: each is used only where the device
/// reports it (see [`Port::offloads`], [`Port::rss`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortConfig {
    /// RX/TX queue pairs, one per dataplane core (1..=64, and within the device's limits).
    pub queues: u16,
    /// RX descriptors per queue.
    pub rx_ring: u16,
    /// TX descriptors per queue.
    pub tx_ring: u16,
    /// MTU (IP packet size); frames are up to MTU + 14 bytes.
    pub mtu: u16,
    /// Spread flows over the queues by RSS (only with more than one queue).
    pub rss: bool,
    /// IPv4/TCP/UDP checksums computed by the device on transmit.
    pub tx_checksum: bool,
    /// Checksums verified by the device on receive.
    pub rx_checksum: bool,
    /// Receive frames for any MAC (best effort; some drivers refuse).
    pub promiscuous: bool,
}

impl Default for PortConfig {
    fn default() -> Self {
        PortConfig {
            queues: 1,
            rx_ring: DEFAULT_RING,
            tx_ring: DEFAULT_RING,
            mtu: DEFAULT_MTU,
            rss: true,
            tx_checksum: true,
            rx_checksum: true,
            promiscuous: false,
        }
    }
}

/// Link state (`rte_eth_link_get_nowait`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Link {
    pub up: bool,
    /// Mbit/s (0 when unknown).
    pub speed_mbps: u32,
    pub full_duplex: bool,
    pub autoneg: bool,
}

/// Device counters for one queue (filled only by drivers that keep them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub ipackets: u64,
    pub opackets: u64,
    pub ibytes: u64,
    pub obytes: u64,
    pub errors: u64,
}

/// Device counters (`rte_eth_stats_get`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    pub ipackets: u64,
    pub opackets: u64,
    pub ibytes: u64,
    pub obytes: u64,
    /// Dropped by the device: RX ring full.
    pub imissed: u64,
    pub ierrors: u64,
    pub oerrors: u64,
    /// RX mbuf allocation failures.
    pub rx_nombuf: u64,
    /// Per queue pair, for the first `min(queues, 16)`.
    pub queues: Vec<QueueStats>,
}

/// State shared by a [`Port`] and its [`DpdkQueue`]s; the device is closed when the last goes.
#[derive(Debug)]
pub(crate) struct PortShared {
    pub(crate) id: u16,
    pub(crate) pool: Mempool,
    pub(crate) offloads: Offloads,
    pub(crate) mac: [u8; 6],
    pub(crate) max_frame: usize,
    queues: u16,
    taken: AtomicU64,
    started: AtomicBool,
    /// The vdev name to hot-unplug after closing, for ports made by [`Port::attach_vdev`].
    vdev: Option<CString>,
}

impl PortShared {
    pub(crate) fn release(&self, queue: u16) {
        self.taken.fetch_and(!(1u64 << queue), Ordering::AcqRel);
    }

    /// `rte_eth_stats_get`. May run on any thread while the cores poll: drivers keep these as
    /// plain per-queue integers that only their polling core writes, so a reading can be a
    /// burst behind (DPDK's own telemetry reads them the same way).
    fn stats(&self) -> Result<PortStats, DpdkError> {
        let mut s = sys::rte_eth_stats::default();
        // SAFETY: valid port (self keeps it open); `s` is a valid out-pointer.
        let ret = unsafe { sys::rte_eth_stats_get(self.id, &mut s) };
        check("rte_eth_stats_get", ret)?;
        let n = usize::from(self.queues).min(s.q_ipackets.len());
        let queues = (0..n)
            .map(|q| QueueStats {
                ipackets: s.q_ipackets[q],
                opackets: s.q_opackets[q],
                ibytes: s.q_ibytes[q],
                obytes: s.q_obytes[q],
                errors: s.q_errors[q],
            })
            .collect();
        Ok(PortStats {
            ipackets: s.ipackets,
            opackets: s.opackets,
            ibytes: s.ibytes,
            obytes: s.obytes,
            imissed: s.imissed,
            ierrors: s.ierrors,
            oerrors: s.oerrors,
            rx_nombuf: s.rx_nombuf,
            queues,
        })
    }
}

/// Reads a port's device counters without keeping it open (see [`Port::stats_handle`]).
#[derive(Clone, Debug)]
pub struct PortStatsHandle {
    shared: Weak<PortShared>,
}

impl PortStatsHandle {
    /// The counters; `None` once the [`Port`] and all its queues are gone (the device closed).
    ///
    /// While the read runs it holds the port open; should the last queue go meanwhile, the
    /// device is stopped and closed on this thread when the read ends.
    pub fn stats(&self) -> Option<Result<PortStats, DpdkError>> {
        self.shared.upgrade().map(|p| p.stats())
    }

    /// Link state (`rte_eth_link_get_nowait`); `None` once the port is gone, like [`Self::stats`].
    pub fn link(&self) -> Option<Result<Link, DpdkError>> {
        self.shared.upgrade().map(|p| link_of(p.id))
    }

    /// Whether the port is still open.
    pub fn is_open(&self) -> bool {
        self.shared.strong_count() > 0
    }
}

impl Drop for PortShared {
    fn drop(&mut self) {
        // SAFETY: no queue of this port exists any more (each holds an Arc to self), so nothing
        // polls the device while it stops and closes; errors here are not actionable.
        unsafe {
            if self.started.load(Ordering::Acquire) {
                sys::rte_eth_dev_stop(self.id);
            }
            sys::rte_eth_dev_close(self.id);
            if let Some(name) = &self.vdev {
                sys::rte_eal_hotplug_remove(VDEV_BUS.as_ptr(), name.as_ptr());
            }
        }
        unclaim(self.id);
    }
}

/// A configured Ethernet port.
#[derive(Debug)]
pub struct Port {
    shared: Arc<PortShared>,
    rss: bool,
}

impl Port {
    /// Configures port `port_id` (from [`Eal::port_by_name`] or a count) with `cfg`, taking RX
    /// buffers from `pool`. The port is left stopped: call [`Port::start`].
    ///
    /// `pool` must hold more than `queues * rx_ring` mbufs (some drivers fill every RX ring at
    /// set-up, e.g. `net_tap`) plus those in flight on TX and in the stack.
    pub fn configure(
        _eal: &Eal,
        port_id: u16,
        cfg: &PortConfig,
        pool: Mempool,
    ) -> Result<Port, DpdkError> {
        // SAFETY: the EAL is initialized (`_eal`); a plain query.
        if unsafe { sys::rte_eth_dev_is_valid_port(port_id) } == 0 {
            return Err(DpdkError::NoSuchPort);
        }
        if !claim(port_id) {
            return Err(DpdkError::PortInUse);
        }
        let port = Port::configure_claimed(port_id, cfg, pool);
        if port.is_err() {
            unclaim(port_id);
        }
        port
    }

    fn configure_claimed(port_id: u16, cfg: &PortConfig, pool: Mempool) -> Result<Port, DpdkError> {
        let info = dev_info(port_id)?;
        validate(cfg, &info, pool)?;

        let mut conf = sys::rte_eth_conf::default();
        conf.rxmode.mtu = u32::from(cfg.mtu);
        let rss_hf = RSS_TYPES & info.flow_type_rss_offloads;
        let rss = cfg.rss && cfg.queues > 1 && rss_hf != 0;
        if rss {
            conf.rxmode.mq_mode = sys::rte_eth_rx_mq_mode_RTE_ETH_MQ_RX_RSS;
            conf.rx_adv_conf.rss_conf.rss_hf = rss_hf;
        }
        let offloads = Offloads {
            tx_checksum: cfg.tx_checksum && info.tx_offload_capa & TX_CKSUM == TX_CKSUM,
            rx_checksum: cfg.rx_checksum && info.rx_offload_capa & RX_CKSUM == RX_CKSUM,
        };
        if offloads.tx_checksum {
            conf.txmode.offloads |= TX_CKSUM;
        }
        if offloads.rx_checksum {
            conf.rxmode.offloads |= RX_CKSUM;
        }
        // SAFETY: valid port id; `conf` is a fully initialized config that outlives the call.
        let ret = unsafe { sys::rte_eth_dev_configure(port_id, cfg.queues, cfg.queues, &conf) };
        check("rte_eth_dev_configure", ret)?;
        setup_queues(port_id, cfg, &info, &conf, pool)?;
        if cfg.promiscuous {
            // SAFETY: valid, configured port. Best effort: some drivers do not support it.
            unsafe { sys::rte_eth_promiscuous_enable(port_id) };
        }
        let mac = mac_of(port_id)?;
        Ok(Port {
            shared: Arc::new(PortShared {
                id: port_id,
                pool,
                offloads,
                mac,
                max_frame: usize::from(cfg.mtu) + ETHER_HDR_LEN,
                queues: cfg.queues,
                taken: AtomicU64::new(0),
                started: AtomicBool::new(false),
                vdev: None,
            }),
            rss,
        })
    }

    /// Hot-plugs the virtual device `name` (e.g. `net_af_packet1`) with driver arguments `args`
    /// (e.g. `iface=veth0`) and configures it as [`Port::configure`] does. The device is closed
    /// and unplugged when the port and its queues are gone, so tests can attach vdevs to
    /// interfaces they create after `rte_eal_init`.
    pub fn attach_vdev(
        eal: &Eal,
        name: &str,
        args: &str,
        cfg: &PortConfig,
        pool: Mempool,
    ) -> Result<Port, DpdkError> {
        let cname = CString::new(name).map_err(|_| DpdkError::Invalid("NUL in vdev name"))?;
        let cargs = CString::new(args).map_err(|_| DpdkError::Invalid("NUL in vdev args"))?;
        // SAFETY: the EAL is initialized; all three are valid C strings that outlive the call.
        let ret =
            unsafe { sys::rte_eal_hotplug_add(VDEV_BUS.as_ptr(), cname.as_ptr(), cargs.as_ptr()) };
        check("rte_eal_hotplug_add", ret)?;
        let port = eal
            .port_by_name(name)
            .and_then(|id| Port::configure(eal, id, cfg, pool));
        match port {
            Ok(mut port) => {
                Arc::get_mut(&mut port.shared)
                    .expect("a new port has no queues")
                    .vdev = Some(cname);
                Ok(port)
            }
            Err(e) => {
                // SAFETY: the device was added above and no Port refers to it.
                unsafe { sys::rte_eal_hotplug_remove(VDEV_BUS.as_ptr(), cname.as_ptr()) };
                Err(e)
            }
        }
    }

    /// Starts the device (RX and TX on every queue).
    pub fn start(&mut self) -> Result<(), DpdkError> {
        // SAFETY: the port is configured with all its queues set up.
        let ret = unsafe { sys::rte_eth_dev_start(self.shared.id) };
        check("rte_eth_dev_start", ret)?;
        self.shared.started.store(true, Ordering::Release);
        Ok(())
    }

    /// Stops the device. Refused ([`DpdkError::QueuesInUse`]) while any [`DpdkQueue`] exists,
    /// since DPDK forbids polling a queue while its port stops.
    pub fn stop(&mut self) -> Result<(), DpdkError> {
        if Arc::strong_count(&self.shared) > 1 {
            return Err(DpdkError::QueuesInUse);
        }
        // SAFETY: no queue exists (checked above; new ones need `&self`, which `&mut self`
        // excludes), so nothing polls the device.
        let ret = unsafe { sys::rte_eth_dev_stop(self.shared.id) };
        check("rte_eth_dev_stop", ret)?;
        self.shared.started.store(false, Ordering::Release);
        Ok(())
    }

    /// Queue pair `index`, for one core. Fails if out of range or already handed out (it comes
    /// back when the [`DpdkQueue`] drops).
    pub fn queue(&self, index: u16) -> Result<DpdkQueue, DpdkError> {
        if index >= self.shared.queues {
            return Err(DpdkError::QueueTaken(index));
        }
        let bit = 1u64 << index;
        if self.shared.taken.fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            return Err(DpdkError::QueueTaken(index));
        }
        Ok(DpdkQueue::new(Arc::clone(&self.shared), index))
    }

    /// The port id.
    pub fn id(&self) -> u16 {
        self.shared.id
    }

    /// Queue pairs configured.
    pub fn queues(&self) -> u16 {
        self.shared.queues
    }

    /// The MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.shared.mac
    }

    /// Offloads in use (those asked for that the device offers).
    pub fn offloads(&self) -> Offloads {
        self.shared.offloads
    }

    /// Whether RX is spread over the queues by RSS.
    pub fn rss(&self) -> bool {
        self.rss
    }

    /// The mbuf pool RX fills from.
    pub fn pool(&self) -> Mempool {
        self.shared.pool
    }

    /// Link state, without waiting for autonegotiation.
    pub fn link(&self) -> Result<Link, DpdkError> {
        link_of(self.shared.id)
    }

    /// Device counters, with per-queue figures where the driver keeps them.
    pub fn stats(&self) -> Result<PortStats, DpdkError> {
        self.shared.stats()
    }

    /// A handle that reads this port's counters from any thread (the metrics scrape) without
    /// keeping the device open: once the port and its queues are gone it reads `None`.
    pub fn stats_handle(&self) -> PortStatsHandle {
        PortStatsHandle {
            shared: Arc::downgrade(&self.shared),
        }
    }

    /// Zeroes the device counters.
    pub fn reset_stats(&self) -> Result<(), DpdkError> {
        // SAFETY: valid port.
        check("rte_eth_stats_reset", unsafe {
            sys::rte_eth_stats_reset(self.shared.id)
        })
    }
}

fn check(op: &'static str, ret: i32) -> Result<(), DpdkError> {
    if ret < 0 {
        return Err(DpdkError::call(op, ret));
    }
    Ok(())
}

fn dev_info(port_id: u16) -> Result<sys::rte_eth_dev_info, DpdkError> {
    let mut info = sys::rte_eth_dev_info::default();
    // SAFETY: valid port; `info` is a valid out-pointer.
    let ret = unsafe { sys::rte_eth_dev_info_get(port_id, &mut info) };
    check("rte_eth_dev_info_get", ret)?;
    Ok(info)
}

fn mac_of(port_id: u16) -> Result<[u8; 6], DpdkError> {
    let mut addr = sys::rte_ether_addr::default();
    // SAFETY: valid port; `addr` is a valid out-pointer.
    let ret = unsafe { sys::rte_eth_macaddr_get(port_id, &mut addr) };
    check("rte_eth_macaddr_get", ret)?;
    Ok(addr.addr_bytes)
}

fn validate(
    cfg: &PortConfig,
    info: &sys::rte_eth_dev_info,
    pool: Mempool,
) -> Result<(), DpdkError> {
    if cfg.queues == 0 || cfg.queues > MAX_QUEUES {
        return Err(DpdkError::Invalid("queues must be 1..=64"));
    }
    if cfg.queues > info.max_rx_queues || cfg.queues > info.max_tx_queues {
        return Err(DpdkError::Invalid("more queues than the device has"));
    }
    if cfg.rx_ring == 0 || cfg.tx_ring == 0 {
        return Err(DpdkError::Invalid("ring sizes must be positive"));
    }
    if cfg.mtu < info.min_mtu || cfg.mtu > info.max_mtu {
        return Err(DpdkError::Invalid("mtu outside the device's range"));
    }
    let room = usize::from(pool.data_room()).saturating_sub(sys::RTE_PKTMBUF_HEADROOM as usize);
    if room < usize::from(cfg.mtu) + ETHER_HDR_LEN {
        return Err(DpdkError::Invalid(
            "mbuf data room below MTU + Ethernet header",
        ));
    }
    Ok(())
}

fn setup_queues(
    port_id: u16,
    cfg: &PortConfig,
    info: &sys::rte_eth_dev_info,
    conf: &sys::rte_eth_conf,
    pool: Mempool,
) -> Result<(), DpdkError> {
    let (mut rx_ring, mut tx_ring) = (cfg.rx_ring, cfg.tx_ring);
    // SAFETY: valid, configured port; both out-pointers are valid.
    let ret = unsafe { sys::rte_eth_dev_adjust_nb_rx_tx_desc(port_id, &mut rx_ring, &mut tx_ring) };
    check("rte_eth_dev_adjust_nb_rx_tx_desc", ret)?;
    // SAFETY: valid port; a plain query (-1 for "any socket", as vdevs report).
    let socket = unsafe { sys::rte_eth_dev_socket_id(port_id) } as u32;
    let mut rxconf = info.default_rxconf;
    rxconf.offloads = conf.rxmode.offloads;
    let mut txconf = info.default_txconf;
    txconf.offloads = conf.txmode.offloads;
    for q in 0..cfg.queues {
        // SAFETY: valid, configured, stopped port; `q` < the configured queue count; `rxconf`
        // outlives the call; `pool` is a live packet pool that is never freed.
        let ret = unsafe {
            sys::rte_eth_rx_queue_setup(port_id, q, rx_ring, socket, &rxconf, pool.as_ptr())
        };
        check("rte_eth_rx_queue_setup", ret)?;
        // SAFETY: as above, for the TX side.
        let ret = unsafe { sys::rte_eth_tx_queue_setup(port_id, q, tx_ring, socket, &txconf) };
        check("rte_eth_tx_queue_setup", ret)?;
    }
    Ok(())
}

/// Link state of the open port `id`, without waiting for autonegotiation.
fn link_of(id: u16) -> Result<Link, DpdkError> {
    let mut link = sys::rte_eth_link::default();
    // SAFETY: `id` is a port kept open by the caller's `PortShared`; `link` is a valid
    // out-pointer.
    let ret = unsafe { sys::rte_eth_link_get_nowait(id, &mut link) };
    check("rte_eth_link_get_nowait", ret)?;
    Ok(Link {
        up: link.link_status() != 0,
        // RTE_ETH_SPEED_NUM_UNKNOWN (u32::MAX, e.g. virtio) reads as 0, "unknown".
        speed_mbps: if link.link_speed == u32::MAX {
            0
        } else {
            link.link_speed
        },
        full_duplex: link.link_duplex() != 0,
        autoneg: link.link_autoneg() != 0,
    })
}
