//! The `[nic]` section: which transport carries client traffic and, for the userspace paths,
//! the interface's address, TCP settings and DPDK EAL settings.
//!
//! - `kernel` (default): kernel sockets; `resp.listen` is the address. Nothing else here is used.
//! - `dpdk`: the client NIC is a DPDK port (`port`, with `vdevs` and `eal_args` for the EAL); the
//!   userspace TCP stack answers on `ip` at `resp.listen`'s port. Needs the `dpdk` build feature.
//! - `mem`: the in-memory port pair, for in-process tests and benchmarks (the other end belongs
//!   to the test); `pgline serve` refuses it.
//!
//! Validation is strict whatever the mode (a typo in an unused key is still a typo); the values
//! the userspace modes need are required only in those modes.

use std::net::Ipv4Addr;

use pgline_dataplane::net::NetConfig;
use serde::{Deserialize, Serialize};

use super::{check, ByteSize, ConfigError};

pub const DEFAULT_PREFIX_LEN: u8 = 24;
pub const DEFAULT_MSS: u16 = 1460;
pub const DEFAULT_TCP_BUFFER: u64 = 64 * 1024;
pub const DEFAULT_RX_BURST: usize = 32;
/// Address space one core's connection buffer pools may reserve (`nic.conn_buffers`).
const MAX_CONN_POOLS: u64 = 16 << 30;
/// Connections a core's stack accepts beyond `resp.max_connections` per core, to answer them
/// "max number of clients reached" rather than reset them.
const REJECT_SLACK: usize = 16;

/// Which transport carries client connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum NicMode {
    #[default]
    Kernel,
    Dpdk,
    Mem,
}

impl std::str::FromStr for NicMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "kernel" => Ok(NicMode::Kernel),
            "dpdk" => Ok(NicMode::Dpdk),
            "mem" => Ok(NicMode::Mem),
            other => Err(format!("{other:?} is not one of kernel, dpdk, mem")),
        }
    }
}

impl std::fmt::Display for NicMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NicMode::Kernel => "kernel",
            NicMode::Dpdk => "dpdk",
            NicMode::Mem => "mem",
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct NicConfig {
    pub mode: NicMode,
    /// The appliance's IPv4 address on the client network (userspace modes).
    pub ip: String,
    pub prefix_len: u8,
    /// Next hop for clients outside `ip/prefix_len`; empty: none.
    pub gateway: String,
    /// `aa:bb:cc:dd:ee:ff`; empty: the port's own address.
    pub mac: String,
    /// TCP maximum segment size announced and used.
    pub mss: u16,
    /// TCP receive and send buffer per connection.
    #[schema(value_type = u64)]
    pub rx_buffer: ByteSize,
    #[schema(value_type = u64)]
    pub tx_buffer: ByteSize,
    /// Frames received per burst.
    pub rx_burst: usize,
    /// Our own TCP with its fast path (the default) instead of smoltcp's (userspace modes; issue
    /// 16).
    pub owned_tcp: bool,
    /// With `owned_tcp`: receive buffers (`rx_buffer` each), and as many send buffers, per
    /// core, taken by connections only while they move bytes; when they run out, connections
    /// wait (zero window, `send` refused) rather than fail.
    pub conn_buffers: usize,
    /// With `owned_tcp`: a connection whose client acknowledges none of its reply for this long
    /// (a client that stopped reading) is reset, so that it gives its pooled send buffer back.
    pub send_stall_timeout_ms: u64,
    /// Extra EAL arguments (dpdk), e.g. `["--no-huge", "-m", "256"]`.
    pub eal_args: Vec<String>,
    /// Virtual devices (dpdk), e.g. `["net_af_packet0,iface=veth0"]`. A `net_af_packet` with
    /// `qpairs` > 1 and no `framecnt` is given `framecnt=4096` (its fanout group moves frames
    /// to another core's queue when one ring is full; see `dpdk_port::vdev_with_defaults`).
    pub vdevs: Vec<String>,
    /// The DPDK port by device name (dpdk), e.g. `net_af_packet0`.
    pub port: String,
    /// Pass `--no-pci` to the EAL (dpdk): only the configured vdevs are probed.
    pub no_pci: bool,
}

impl Default for NicConfig {
    fn default() -> Self {
        NicConfig {
            mode: NicMode::Kernel,
            ip: String::new(),
            prefix_len: DEFAULT_PREFIX_LEN,
            gateway: String::new(),
            mac: String::new(),
            mss: DEFAULT_MSS,
            rx_buffer: ByteSize(DEFAULT_TCP_BUFFER),
            tx_buffer: ByteSize(DEFAULT_TCP_BUFFER),
            rx_burst: DEFAULT_RX_BURST,
            owned_tcp: true,
            conn_buffers: pgline_dataplane::net::DEFAULT_CONN_BUFFERS,
            send_stall_timeout_ms: pgline_dataplane::net::DEFAULT_SEND_STALL_TIMEOUT.as_millis()
                as u64,
            eal_args: Vec::new(),
            vdevs: Vec::new(),
            port: String::new(),
            no_pci: true,
        }
    }
}

impl NicConfig {
    /// `ip`, parsed (validated: present in the userspace modes).
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        self.ip.parse().ok()
    }

    /// `gateway`, parsed; `None` when empty.
    pub fn gateway_v4(&self) -> Option<Ipv4Addr> {
        self.gateway.parse().ok()
    }

    /// `mac`, parsed; `None` when empty (use the port's).
    pub fn mac_bytes(&self) -> Option<[u8; 6]> {
        parse_mac(&self.mac).ok()
    }

    /// The userspace stack's settings for one core that serves `max_connections` clients (the
    /// stack takes a few more, so a client over the limit still gets the error reply).
    pub fn net_config(&self, max_connections: usize) -> Option<NetConfig> {
        Some(NetConfig {
            mac: self.mac_bytes(),
            ip: self.ipv4()?,
            prefix_len: self.prefix_len,
            gateway: self.gateway_v4(),
            mss: self.mss,
            rx_buffer: self.rx_buffer.0 as usize,
            tx_buffer: self.tx_buffer.0 as usize,
            max_connections: max_connections + REJECT_SLACK,
            rx_burst: self.rx_burst,
            owned_tcp: self.owned_tcp,
            conn_buffers: self.conn_buffers,
            send_stall_timeout: std::time::Duration::from_millis(self.send_stall_timeout_ms),
            ..NetConfig::new(self.ipv4()?, self.prefix_len)
        })
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let userspace = self.mode != NicMode::Kernel;
        let ip = if self.ip.is_empty() {
            check(
                !userspace,
                "nic.ip",
                "required when nic.mode is dpdk or mem",
            )?;
            None
        } else {
            Some(
                self.ip
                    .parse::<Ipv4Addr>()
                    .map_err(|_| ConfigError::Invalid {
                        key: "nic.ip",
                        reason: format!("{:?} is not an IPv4 address", self.ip),
                    })?,
            )
        };
        check(
            (1..=32).contains(&self.prefix_len),
            "nic.prefix_len",
            "must be 1..=32",
        )?;
        if !self.gateway.is_empty() {
            let gw = self
                .gateway
                .parse::<Ipv4Addr>()
                .map_err(|_| ConfigError::Invalid {
                    key: "nic.gateway",
                    reason: format!("{:?} is not an IPv4 address", self.gateway),
                })?;
            if let Some(ip) = ip {
                check(
                    same_subnet(ip, gw, self.prefix_len),
                    "nic.gateway",
                    "must be inside nic.ip/nic.prefix_len",
                )?;
            }
        }
        if !self.mac.is_empty() {
            let mac = parse_mac(&self.mac).map_err(|reason| ConfigError::Invalid {
                key: "nic.mac",
                reason,
            })?;
            check(
                mac[0] & 1 == 0,
                "nic.mac",
                "must be a unicast address (first octet even)",
            )?;
        }
        check(
            (536..=9000).contains(&self.mss),
            "nic.mss",
            "must be 536..=9000",
        )?;
        for (key, size) in [
            ("nic.rx_buffer", self.rx_buffer),
            ("nic.tx_buffer", self.tx_buffer),
        ] {
            check(
                (4096..=16 << 20).contains(&size.0),
                key,
                "must be 4KiB..=16MiB",
            )?;
        }
        check(
            (1..=512).contains(&self.rx_burst),
            "nic.rx_burst",
            "must be 1..=512",
        )?;
        check(
            (1..=1 << 20).contains(&self.conn_buffers),
            "nic.conn_buffers",
            "must be 1..=1048576",
        )?;
        check(
            (1000..=3_600_000).contains(&self.send_stall_timeout_ms),
            "nic.send_stall_timeout_ms",
            "must be 1000..=3600000 (1 s to 1 h)",
        )?;
        // The pools are one allocation each, reserved at start (resident only where used): a
        // product the machine cannot reserve would abort start-up instead of naming the key.
        let pools = self.conn_buffers as u64 * (self.rx_buffer.0 + self.tx_buffer.0);
        check(
            !self.owned_tcp || pools <= MAX_CONN_POOLS,
            "nic.conn_buffers",
            "with owned_tcp, conn_buffers x (rx_buffer + tx_buffer) must be at most 16GiB per core",
        )?;
        self.validate_dpdk()
    }

    fn validate_dpdk(&self) -> Result<(), ConfigError> {
        if self.mode == NicMode::Dpdk {
            check(
                !self.port.is_empty(),
                "nic.port",
                "required when nic.mode is dpdk (a device name such as net_af_packet0)",
            )?;
        }
        check(
            self.vdevs.iter().all(|v| !v.trim().is_empty()),
            "nic.vdevs",
            "an entry is empty",
        )?;
        check(
            self.eal_args.iter().all(|a| !a.is_empty()),
            "nic.eal_args",
            "an entry is empty",
        )?;
        check(
            !self
                .eal_args
                .iter()
                .any(|a| a == "--no-pci" || a == "--vdev"),
            "nic.eal_args",
            "use nic.no_pci and nic.vdevs for --no-pci and --vdev",
        )
    }
}

fn same_subnet(a: Ipv4Addr, b: Ipv4Addr, prefix_len: u8) -> bool {
    let mask = u32::MAX
        .checked_shl(32 - u32::from(prefix_len))
        .unwrap_or(0);
    u32::from(a) & mask == u32::from(b) & mask
}

fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let mut mac = [0u8; 6];
    let mut parts = s.split([':', '-']);
    for byte in mac.iter_mut() {
        let part = parts.next().unwrap_or("");
        if part.len() != 2 {
            return Err(format!("{s:?} is not a MAC address (aa:bb:cc:dd:ee:ff)"));
        }
        *byte = u8::from_str_radix(part, 16)
            .map_err(|_| format!("{s:?} is not a MAC address (aa:bb:cc:dd:ee:ff)"))?;
    }
    if parts.next().is_some() {
        return Err(format!("{s:?} is not a MAC address (aa:bb:cc:dd:ee:ff)"));
    }
    Ok(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nic(f: impl FnOnce(&mut NicConfig)) -> Result<(), ConfigError> {
        let mut n = NicConfig::default();
        f(&mut n);
        n.validate()
    }

    fn err_names(r: Result<(), ConfigError>, key: &str) {
        let e = r.expect_err(key);
        assert!(e.to_string().contains(key), "{e}");
    }

    #[test]
    fn kernel_mode_needs_nothing() {
        nic(|_| {}).unwrap();
    }

    #[test]
    fn userspace_modes_need_an_address_and_dpdk_a_port() {
        err_names(nic(|n| n.mode = NicMode::Mem), "nic.ip");
        nic(|n| {
            n.mode = NicMode::Mem;
            n.ip = "10.0.0.1".into();
        })
        .unwrap();
        err_names(
            nic(|n| {
                n.mode = NicMode::Dpdk;
                n.ip = "10.0.0.1".into();
            }),
            "nic.port",
        );
    }

    #[test]
    fn bad_values_are_named() {
        err_names(nic(|n| n.ip = "10.0.0".into()), "nic.ip");
        err_names(nic(|n| n.prefix_len = 0), "nic.prefix_len");
        err_names(
            nic(|n| {
                n.ip = "10.0.0.1".into();
                n.gateway = "10.0.1.1".into();
            }),
            "nic.gateway",
        );
        err_names(nic(|n| n.mac = "01:00:5e:00:00:01".into()), "nic.mac");
        err_names(nic(|n| n.mac = "02:00:00:00:00".into()), "nic.mac");
        err_names(nic(|n| n.mss = 100), "nic.mss");
        err_names(nic(|n| n.rx_buffer = ByteSize(100)), "nic.rx_buffer");
        err_names(nic(|n| n.rx_burst = 0), "nic.rx_burst");
        err_names(nic(|n| n.conn_buffers = 0), "nic.conn_buffers");
        err_names(
            nic(|n| n.send_stall_timeout_ms = 0),
            "nic.send_stall_timeout_ms",
        );
        err_names(
            nic(|n| {
                n.owned_tcp = true;
                n.conn_buffers = 1 << 20;
            }),
            "nic.conn_buffers",
        );
        // The defaults (4,096 x 64 KiB x 2 = 512 MiB) are within it, and smoltcp ignores the pools.
        nic(|_| {}).expect("owned_tcp (the default) with default pools");
        nic(|n| {
            n.owned_tcp = false;
            n.conn_buffers = 1 << 20;
        })
        .expect("the pools' bound with smoltcp");
        err_names(
            nic(|n| n.eal_args = vec!["--no-pci".into()]),
            "nic.eal_args",
        );
        err_names(nic(|n| n.vdevs = vec![" ".into()]), "nic.vdevs");
    }

    #[test]
    fn loads_from_env_and_flags() {
        let env = vec![("PGLINE_NIC_MODE".to_string(), "mem".to_string())];
        let sets = [
            "nic.ip=\"10.9.0.1\"".to_string(),
            "nic.vdevs=[\"net_null0\"]".to_string(),
        ];
        let cfg = super::super::Config::load(None, env, &sets).unwrap();
        assert_eq!(cfg.nic.mode, NicMode::Mem);
        assert_eq!(cfg.nic.ipv4(), Some(Ipv4Addr::new(10, 9, 0, 1)));
        assert_eq!(cfg.nic.vdevs, vec!["net_null0".to_string()]);
        assert!(cfg.nic.no_pci);
        let env = vec![("PGLINE_NIC_MODE".to_string(), "rdma".to_string())];
        let err = super::super::Config::load(None, env, &[]).unwrap_err();
        assert!(err.to_string().contains("rdma"), "{err}");
    }

    #[test]
    fn parses_mac_and_subnet() {
        assert_eq!(
            parse_mac("02:0a:0B:00:ff:01").unwrap(),
            [2, 0x0a, 0x0b, 0, 0xff, 1]
        );
        assert!(parse_mac("02:0a:0b:00:ff:01:02").is_err());
        assert!(same_subnet(
            "10.1.2.3".parse().unwrap(),
            "10.1.2.254".parse().unwrap(),
            24
        ));
        assert!(!same_subnet(
            "10.1.2.3".parse().unwrap(),
            "10.1.3.1".parse().unwrap(),
            24
        ));
    }
}
