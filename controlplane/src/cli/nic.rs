//! `pgline nic bind|show`: hands the client NIC (a PCI device, `nic.port`) from its kernel
//! driver to a userspace I/O driver DPDK can use, and reports which driver holds it.
//!
//! Driver choice (`--driver auto`, the default): `vfio-pci` when the host has an IOMMU (a
//! non-empty `/sys/kernel/iommu_groups`), else `uio_pci_generic`. Debian 12's kernel has no
//! VFIO no-IOMMU mode, so without an IOMMU `uio_pci_generic` is the only choice (and DPDK then
//! needs physical addresses, i.e. root).
//!
//! Binding goes through sysfs only: `driver_override`, `unbind` from the current driver,
//! `drivers_probe`. With `vfio-pci`, `--owner USER` hands the device's `/dev/vfio/<group>` to
//! the unprivileged service user (the appliance's `pgline` user), so `pgline serve` needs no
//! root. Needs root; run once per boot (the appliance's `pgline-nic-bind.service` does it).
//!
//! `pgline check` calls [`pci_check`] when `nic.port` is a PCI address.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::ServeArgs;

const PCI_DEVICES: &str = "/sys/bus/pci/devices";
const IOMMU_GROUPS: &str = "/sys/kernel/iommu_groups";
/// The userspace I/O drivers DPDK's PCI PMDs accept.
pub const USERSPACE_DRIVERS: [&str; 2] = ["vfio-pci", "uio_pci_generic"];

#[derive(clap::Subcommand, Debug)]
pub enum NicAction {
    /// Bind the client NIC (nic.port, a PCI address) to vfio-pci or uio_pci_generic.
    Bind(BindArgs),
    /// Print the client NIC's PCI address, its driver and the IOMMU state.
    Show(BindArgs),
}

#[derive(clap::Args, Debug)]
pub struct BindArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    /// PCI address (default: nic.port), e.g. 0000:00:03.0.
    #[arg(long)]
    pub device: Option<String>,
    /// auto (vfio-pci with an IOMMU, else uio_pci_generic), vfio-pci or uio_pci_generic.
    #[arg(long, default_value = "auto", value_parser = ["auto", "vfio-pci", "uio_pci_generic"])]
    pub driver: String,
    /// With vfio-pci: give this user the device's /dev/vfio/<group>.
    #[arg(long)]
    pub owner: Option<String>,
}

pub fn run(action: &NicAction) -> ExitCode {
    let (args, bind) = match action {
        NicAction::Bind(a) => (a, true),
        NicAction::Show(a) => (a, false),
    };
    let device = match device_of(args) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("pgline: {e}");
            return ExitCode::from(2);
        }
    };
    if !bind {
        println!(
            "device {device}  driver {}  iommu {}",
            current_driver(&device).unwrap_or_else(|| "none".into()),
            if has_iommu() { "yes" } else { "no" }
        );
        return ExitCode::SUCCESS;
    }
    let driver = match args.driver.as_str() {
        "auto" if has_iommu() => "vfio-pci",
        "auto" => "uio_pci_generic",
        d => d,
    };
    match bind_device(&device, driver, args.owner.as_deref()) {
        Ok(msg) => {
            println!("pgline: {msg}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pgline: nic bind {device} to {driver}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The device to act on: `--device`, else `nic.port` of the configuration; normalized.
fn device_of(args: &BindArgs) -> Result<String, String> {
    let name = match &args.device {
        Some(d) => d.clone(),
        None => args.serve.load().map_err(|e| e.to_string())?.nic.port,
    };
    pci_address(&name).ok_or_else(|| {
        format!("{name:?} is not a PCI address (DDDD:BB:DD.F); set nic.port or --device")
    })
}

/// `name` as a full PCI address `DDDD:BB:DD.F` (a missing domain is `0000`), or `None`.
pub fn pci_address(name: &str) -> Option<String> {
    let full = if name.matches(':').count() == 1 {
        format!("0000:{name}")
    } else {
        name.to_string()
    };
    let (rest, func) = full.split_once('.')?;
    let parts: Vec<&str> = rest.split(':').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    let ok = parts.len() == 3
        && hex(parts[0], 4)
        && hex(parts[1], 2)
        && hex(parts[2], 2)
        && func.len() == 1
        && func.bytes().all(|b| (b'0'..=b'7').contains(&b));
    ok.then(|| full.to_ascii_lowercase())
}

fn has_iommu() -> bool {
    std::fs::read_dir(IOMMU_GROUPS)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

fn device_dir(addr: &str) -> PathBuf {
    Path::new(PCI_DEVICES).join(addr)
}

/// The name of the driver bound to `addr`, if any.
fn current_driver(addr: &str) -> Option<String> {
    let link = std::fs::read_link(device_dir(addr).join("driver")).ok()?;
    link.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// The device's IOMMU group number, if it has one.
fn iommu_group(addr: &str) -> Option<String> {
    let link = std::fs::read_link(device_dir(addr).join("iommu_group")).ok()?;
    link.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// Kernel network interfaces on the device (empty once it is unbound from its net driver).
fn netdevs(addr: &str) -> Vec<String> {
    std::fs::read_dir(device_dir(addr).join("net"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("write {value:?} to {}: {e}", path.display()))
}

/// Binds `addr` to `driver`; idempotent. Returns what was done.
fn bind_device(addr: &str, driver: &str, owner: Option<&str>) -> Result<String, String> {
    let dir = device_dir(addr);
    if !dir.exists() {
        return Err(format!("no PCI device {addr} (lspci -D lists them)"));
    }
    if driver == "vfio-pci" && iommu_group(addr).is_none() {
        return Err(
            "the device has no IOMMU group: boot with intel_iommu=on (or amd_iommu=on) \
                    on a machine with an IOMMU, or use --driver uio_pci_generic"
                .into(),
        );
    }
    let previous = current_driver(addr);
    if previous.as_deref() != Some(driver) {
        let module = driver.replace('-', "_");
        let status = std::process::Command::new("modprobe")
            .arg(&module)
            .status()
            .map_err(|e| format!("modprobe {module}: {e}"))?;
        if !status.success() {
            return Err(format!("modprobe {module} failed ({status})"));
        }
        let ifaces = netdevs(addr);
        write(&dir.join("driver_override"), driver)?;
        if previous.is_some() {
            write(&dir.join("driver/unbind"), addr)?;
        }
        write(Path::new("/sys/bus/pci/drivers_probe"), addr)?;
        if current_driver(addr).as_deref() != Some(driver) {
            return Err(format!(
                "the device is bound to {:?} after drivers_probe",
                current_driver(addr)
            ));
        }
        if !ifaces.is_empty() {
            println!("pgline: kernel interfaces {ifaces:?} removed from {addr}");
        }
    }
    let mut done = format!(
        "{addr} bound to {driver} (was {})",
        previous.unwrap_or_else(|| "unbound".into())
    );
    if let (Some(user), Some(group)) = (owner, iommu_group(addr)) {
        if driver == "vfio-pci" {
            let (uid, gid) = lookup_user(user)?;
            let node = Path::new("/dev/vfio").join(&group);
            std::os::unix::fs::chown(&node, Some(uid), Some(gid))
                .map_err(|e| format!("chown {}: {e}", node.display()))?;
            done.push_str(&format!("; {} owned by {user}", node.display()));
        }
    }
    Ok(done)
}

/// `user`'s uid and primary gid from /etc/passwd.
fn lookup_user(user: &str) -> Result<(u32, u32), String> {
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(|e| format!("/etc/passwd: {e}"))?;
    passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() > 3 && f[0] == user)
        .and_then(|f| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
        .ok_or_else(|| format!("no user {user:?} in /etc/passwd"))
}

/// `pgline check`'s line for a PCI `nic.port`: `Ok(detail)` when a userspace I/O driver holds
/// the device, else `Err((detail, fix))`.
pub fn pci_check(port: &str) -> Result<String, (String, String)> {
    let fix = "pgline nic bind --config /etc/pgline/pgline.toml (the appliance's \
               pgline-nic-bind.service runs it at boot)"
        .to_string();
    let Some(addr) = pci_address(port) else {
        return Err((
            format!("nic.port {port:?} is neither one of nic.vdevs nor a PCI address"),
            "set nic.port to a PCI address (lspci -D) or list the vdev in nic.vdevs".into(),
        ));
    };
    if !device_dir(&addr).exists() {
        return Err((
            format!("no PCI device {addr} on this host"),
            "lspci -D lists the devices; set nic.port".into(),
        ));
    }
    let iommu = has_iommu();
    match current_driver(&addr) {
        Some(d) if USERSPACE_DRIVERS.contains(&d.as_str()) => {
            let group = iommu_group(&addr).unwrap_or_else(|| "-".into());
            if d == "vfio-pci" && !Path::new("/dev/vfio").join(&group).exists() {
                return Err((
                    format!("{addr} on vfio-pci but /dev/vfio/{group} is missing"),
                    fix,
                ));
            }
            Ok(format!("PCI {addr} bound to {d} (IOMMU group {group})"))
        }
        other => Err((
            format!(
                "PCI {addr} is bound to {} (DPDK needs {})",
                other.unwrap_or_else(|| "no driver".into()),
                if iommu {
                    "vfio-pci"
                } else {
                    "uio_pci_generic: no IOMMU"
                }
            ),
            fix,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_are_normalized_and_checked() {
        assert_eq!(pci_address("00:03.0").as_deref(), Some("0000:00:03.0"));
        assert_eq!(pci_address("0000:AF:00.1").as_deref(), Some("0000:af:00.1"));
        assert_eq!(pci_address("net_af_packet0"), None);
        assert_eq!(pci_address("0000:00:03.8"), None);
        assert_eq!(pci_address("0000:00:3.0"), None);
        assert_eq!(pci_address(""), None);
    }

    #[test]
    fn a_missing_device_fails_the_check_with_a_fix() {
        let (detail, fix) = pci_check("0000:ff:1f.7").unwrap_err();
        assert!(detail.contains("no PCI device 0000:ff:1f.7"), "{detail}");
        assert!(fix.contains("lspci"), "{fix}");
        assert!(pci_check("eth1").is_err());
    }
}
