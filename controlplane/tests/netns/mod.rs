//! A network namespace holding the client end of a veth pair, for the DPDK end-to-end tests: the
//! namespace end has an address and the kernel's TCP stack (the clients); the root-namespace end
//! is up without an address, for a DPDK vdev (`net_af_packet`, `net_af_xdp`) to own. Names are
//! unique per process and per call; everything is removed on drop, also when a test panics.

use std::net::Ipv4Addr;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// True when running as root (network namespaces and DPDK need it).
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.trim_ascii() == b"0")
        .unwrap_or(false)
}

/// Runs a command; its output, or an error naming the command and its stderr.
pub fn run(args: &[&str]) -> Result<Output, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "`{}` failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out)
}

/// A namespace + veth pair; removed on drop.
pub struct Netns {
    pub ns: String,
    /// The root-namespace end (no address): the appliance's NIC.
    pub root_if: String,
    /// The namespace end.
    pub peer_if: String,
    /// The address the test gives the appliance (on `root_if`, through DPDK).
    pub app_ip: Ipv4Addr,
    /// The namespace end's address (the clients').
    pub client_ip: Ipv4Addr,
}

impl Netns {
    pub fn create(tag: &str) -> Result<Netns, String> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let net = Netns {
            ns: format!("pgline-e2e-{pid}-{tag}{n}"),
            root_if: format!("pge{}x{n}a", pid % 100_000),
            peer_if: format!("pge{}x{n}b", pid % 100_000),
            app_ip: Ipv4Addr::new(10, 216, n as u8, 2),
            client_ip: Ipv4Addr::new(10, 216, n as u8, 1),
        };
        // From here on, Drop removes whatever part was made.
        net.set_up()?;
        Ok(net)
    }

    fn set_up(&self) -> Result<(), String> {
        let (a, b) = (self.root_if.as_str(), self.peer_if.as_str());
        run(&["ip", "netns", "add", &self.ns])?;
        run(&["ip", "link", "add", a, "type", "veth", "peer", "name", b])?;
        run(&["ip", "link", "set", b, "netns", &self.ns])?;
        // No IPv6 chatter (router solicitations, MLD) on either end.
        let _ = run(&[
            "sysctl",
            "-qw",
            &format!("net.ipv6.conf.{a}.disable_ipv6=1"),
        ]);
        let _ = self.exec(&[
            "sysctl",
            "-qw",
            &format!("net.ipv6.conf.{b}.disable_ipv6=1"),
        ]);
        self.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", self.client_ip),
            "dev",
            b,
        ])?;
        // veth leaves TCP checksums to a device that does not exist; the appliance checks them.
        self.exec(&["ethtool", "-K", b, "tx", "off"])?;
        self.exec(&["ip", "link", "set", "lo", "up"])?;
        self.exec(&["ip", "link", "set", b, "up"])?;
        run(&["ip", "link", "set", a, "up"])?;
        Ok(())
    }

    /// Runs a command inside the namespace.
    pub fn exec(&self, args: &[&str]) -> Result<Output, String> {
        let mut full = vec!["ip", "netns", "exec", self.ns.as_str()];
        full.extend_from_slice(args);
        run(&full)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace deletes the peer and with it the root end; delete both anyway.
        let _ = run(&["ip", "netns", "del", &self.ns]);
        let _ = run(&["ip", "link", "del", &self.root_if]);
    }
}
