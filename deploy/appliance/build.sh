#!/usr/bin/env bash
# Builds the pgline appliance image from Debian packages only (mmdebstrap, Debian 12 "bookworm"):
# a BIOS-bootable disk (MBR: a FAT /boot partition with SYSLINUX and the kernel, an ext4 root),
# as raw and qcow2, with the pgline .deb installed. Serial console, root locked, no password
# anywhere; cloud-init (NoCloud) configures the first boot (see docs/appliance.md).
#
#   deploy/appliance/build.sh [--deb PATH] [--hugepage-size 2M|1G] [--hugepages N]
#                             [--isolate-cpus LIST] [--disk-size 3G] [--out DIR]
#
# Without --deb, deploy/package/build-deb.sh builds the package. Two cached stages, under --out
# (default /var/tmp/pgline-appliance):
#   base   base-<hash>.tar: the mmdebstrap root filesystem with every package of the image and
#          every dependency of the .deb (its Depends line, through `apt-get satisfy`), but not
#          pgline itself. Keyed by the suite, the mirror, the package list, the .deb's Depends and
#          this script: a change of pgline's code does not rebuild it (minutes).
#   image  image-<hash>/: the base unpacked, the .deb installed with dpkg inside it (chroot,
#          no network), the first-boot files, then the disk: /boot made with mtools and
#          SYSLINUX's mtools installer, the root with `mkfs.ext4 -d` (no loop devices), raw and
#          qcow2. Keyed by the base, files/, the .deb and the parameters (tens of seconds).
# An unchanged input set reuses either stage; only the newest few of each are kept. Prints the
# image directory on the last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
deb="" hp_size=2M hp_count=256 isolate="" disk_size=3G out=/var/tmp/pgline-appliance
suite=bookworm mirror=${PGLINE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
while [ $# -gt 0 ]; do
    case "$1" in
    --deb) deb=$2; shift 2 ;;
    --hugepage-size) hp_size=$2; shift 2 ;;
    --hugepages) hp_count=$2; shift 2 ;;
    --isolate-cpus) isolate=$2; shift 2 ;;
    --disk-size) disk_size=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) sed -n '2,21p' "$0" >&2; exit 2 ;;
    esac
done
case "$hp_size" in 2M | 1G) ;; *) echo "--hugepage-size: 2M or 1G" >&2; exit 2 ;; esac
case "$hp_count" in '' | *[!0-9]*) echo "--hugepages: a number" >&2; exit 2 ;; esac
for t in mmdebstrap mkfs.ext4 mkfs.vfat mcopy syslinux sfdisk qemu-img; do
    command -v "$t" >/dev/null || {
        echo "missing $t: apt-get install mmdebstrap e2fsprogs dosfstools mtools syslinux fdisk qemu-utils" >&2
        exit 1
    }
done
[ -n "$deb" ] || deb=$("$root/deploy/package/build-deb.sh" | tail -1)
deb=$(readlink -f "$deb")

# Packages of the image besides pgline and its dependencies.
packages=linux-image-amd64,systemd-sysv,dbus,udev,kmod,initramfs-tools,cloud-init,openssh-server
packages=$packages,ifupdown,isc-dhcp-client,iproute2,netbase,ca-certificates,procps,sudo,pciutils
packages=$packages,postgresql-client,less

cmdline="console=ttyS0,115200 console=tty0 net.ifnames=0 no_timer_check intel_iommu=on iommu=pt"
cmdline="$cmdline default_hugepagesz=$hp_size hugepagesz=$hp_size hugepages=$hp_count"
[ -z "$isolate" ] || cmdline="$cmdline isolcpus=$isolate nohz_full=$isolate rcu_nocbs=$isolate"

# The .deb's run-time dependencies go into the base (apt-get satisfy takes the Depends syntax).
depends=$(dpkg-deb -f "$deb" Depends)
base_key=$( {
    echo "$suite $mirror $packages"
    echo "$depends"
    sha256sum "$0" | cut -d' ' -f1
} | sha256sum | cut -c1-16)
key=$( {
    echo "$base_key $cmdline $disk_size"
    sha256sum "$here"/files/* "$deb" | cut -d' ' -f1
} | sha256sum | cut -c1-16)
dir="$out/image-$key"
base="$out/base-$base_key.tar"
if [ -f "$dir/pgline-appliance.qcow2" ] && [ -f "$dir/pgline-appliance.raw" ]; then
    echo "image cached: $dir (inputs unchanged)" >&2
    touch "$dir"
    echo "$dir"
    exit 0
fi
start=$SECONDS
mkdir -p "$out"
work=$(mktemp -d /var/tmp/pgline-appliance-build.XXXXXX)
# mmdebstrap bind-mounts host paths (/dev/shm, device nodes, /proc, /sys) into the root while it
# runs, and the image stage mounts a proc there: if either is interrupted, unmount whatever is
# left before deleting, and never cross into another filesystem (a stray bind mount of the
# host's /dev/shm must not be emptied).
cleanup() {
    { grep -o " $work/[^ ]*" /proc/mounts || true; } | sort -r | while read -r m; do
        umount -l "$m" || true
    done
    rm -rf --one-file-system "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
rootfs="$work/rootfs"

# Units that only cost boot time on an appliance (TCG guests feel each one): filesystem scrubs,
# apt's timers (upgrades come as a new .deb or image) and module loads for hardware it has not.
masked="e2scrub_reap.service e2scrub_all.timer apt-daily.timer apt-daily-upgrade.timer"
masked="$masked modprobe@drm.service modprobe@fuse.service modprobe@efi_pstore.service"
masked="$masked modprobe@dm_mod.service modprobe@loop.service"

# Stage 1, the base: packages from the mirror. Downloaded .debs are kept in $out/apt-cache
# between builds (mmdebstrap's documented recipe).
if [ -f "$base" ]; then
    echo "base cached: $base" >&2
    touch "$base"
else
    base_start=$SECONDS
    mkdir -p "$out/apt-cache"
    mmdebstrap --variant=minbase --include="$packages" --format=tar \
        --components=main \
        --skip=download/empty --skip=essential/unlink \
        --setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
        --setup-hook="sync-in '$out/apt-cache' /var/cache/apt/archives/" \
        --customize-hook="chroot \"\$1\" apt-get satisfy -y -q '$depends'" \
        --customize-hook="sync-out /var/cache/apt/archives '$out/apt-cache'" \
        --customize-hook="chroot \"\$1\" systemctl mask $masked" \
        --customize-hook='chroot "$1" sh -c "passwd -l root; : >/etc/machine-id; rm -f /var/lib/dbus/machine-id /etc/ssh/ssh_host_*; apt-get clean; rm -rf /var/lib/apt/lists/*"' \
        "$suite" "$work/base.tar" \
        "deb $mirror $suite main" \
        "deb $mirror $suite-updates main" \
        "deb ${mirror%/debian}/debian-security $suite-security main"
    mv "$work/base.tar" "$base.tmp.$$"
    mv "$base.tmp.$$" "$base"
    echo "base built in $((SECONDS - base_start)) s: $base" >&2
fi
base_seconds=$((SECONDS - start))

# Stage 2, the image: the base, pgline's .deb (its dependencies are all in the base, so dpkg
# needs no network), the first-boot files.
layer_start=$SECONDS
mkdir "$rootfs"
tar -C "$rootfs" --numeric-owner --xattrs --xattrs-include='*' -xpf "$base"
[ -c "$rootfs/dev/null" ] || { rm -f "$rootfs/dev/null"; mknod -m 666 "$rootfs/dev/null" c 1 3; }
mount -t proc proc "$rootfs/proc"
cp "$deb" "$rootfs/tmp/pgline.deb"
chroot "$rootfs" dpkg -i /tmp/pgline.deb >&2
install -m 755 "$here/files/pgline-appliance-setup" "$rootfs/usr/lib/pgline/"
install -m 644 "$here/files/90-pgline.cfg" "$rootfs/etc/cloud/cloud.cfg.d/"
# pgline-appliance-setup enables them once the seed has configured pgline.
chroot "$rootfs" systemctl disable pgline.service pgline-nic-bind.service >&2
rm -f "$rootfs/tmp/pgline.deb"
umount "$rootfs/proc"

root_uuid=$(cat /proc/sys/kernel/random/uuid)
echo "UUID=$root_uuid / ext4 errors=remount-ro 0 1" >"$rootfs/etc/fstab"
echo pgline >"$rootfs/etc/hostname"
# The kernel's modules for the NIC drivers pgline binds (vfio-pci, uio_pci_generic) load on
# demand (`pgline nic bind` runs modprobe).
kernel=$(cd "$rootfs/boot" && ls vmlinuz-* | sort -V | tail -1)
initrd=initrd.img-${kernel#vmlinuz-}

# /boot: FAT16, 128 MiB, SYSLINUX + kernel + initrd.
boot_mb=128
mkfs.vfat -n BOOT -C "$work/boot.img" $((boot_mb * 1024)) >/dev/null
syslinux --install "$work/boot.img"
cat >"$work/syslinux.cfg" <<CFG
SERIAL 0 115200
DEFAULT pgline
PROMPT 0
TIMEOUT 10
LABEL pgline
    LINUX /vmlinuz
    INITRD /initrd.img
    APPEND root=UUID=$root_uuid ro $cmdline
CFG
mcopy -i "$work/boot.img" "$work/syslinux.cfg" ::/syslinux.cfg
mcopy -i "$work/boot.img" "$rootfs/boot/$kernel" ::/vmlinuz
mcopy -i "$work/boot.img" "$rootfs/boot/$initrd" ::/initrd.img

# The root filesystem image, from the directory (no mount).
total_mb=$(($(numfmt --from=iec "$disk_size") / 1024 / 1024))
root_mb=$((total_mb - boot_mb - 2))
mkfs.ext4 -q -L pgline-root -U "$root_uuid" -d "$rootfs" "$work/root.img" "${root_mb}M"

# The disk: MBR, partition 1 = /boot (bootable) from 1 MiB, partition 2 = root.
raw="$work/pgline-appliance.raw"
truncate -s "${total_mb}M" "$raw"
sfdisk -q "$raw" <<PARTS
label: dos
start=1MiB, size=${boot_mb}MiB, type=6, bootable
start=$((1 + boot_mb))MiB, size=${root_mb}MiB, type=83
PARTS
dd if=/usr/lib/syslinux/mbr/mbr.bin of="$raw" bs=440 count=1 conv=notrunc,sparse status=none
dd if="$work/boot.img" of="$raw" bs=1M seek=1 conv=notrunc,sparse status=none
dd if="$work/root.img" of="$raw" bs=1M seek=$((1 + boot_mb)) conv=notrunc,sparse status=none
qemu-img convert -c -f raw -O qcow2 "$raw" "$work/pgline-appliance.qcow2"

mkdir -p "$work/out"
mv "$raw" "$work/pgline-appliance.qcow2" "$work/out/"
cp "$deb" "$work/out/"
{
    echo "kernel=$kernel"
    echo "cmdline=$cmdline"
    echo "base=$(basename "$base")"
    echo "base_seconds=$base_seconds"
    echo "image_seconds=$((SECONDS - layer_start))"
    echo "build_seconds=$((SECONDS - start))"
    echo "raw_bytes=$(stat -c %s "$work/out/pgline-appliance.raw")"
    echo "raw_allocated_bytes=$(($(stat -c %b "$work/out/pgline-appliance.raw") * 512))"
    echo "qcow2_bytes=$(stat -c %s "$work/out/pgline-appliance.qcow2")"
    echo "rootfs_used_bytes=$(du -sb "$rootfs" | cut -f1)"
} >"$work/out/build-info"
rm -rf "$dir"
mv "$work/out" "$dir"
cat "$dir/build-info" >&2
# Keep the newest few of each stage (an image is about 1.3 GB, a base about 0.8 GB).
ls -1dt "$out"/image-* 2>/dev/null | tail -n +4 | while read -r old; do rm -rf --one-file-system "$old"; done
ls -1t "$out"/base-*.tar 2>/dev/null | tail -n +3 | while read -r old; do rm -f "$old"; done
echo "$dir"
