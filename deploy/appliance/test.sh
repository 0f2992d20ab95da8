#!/usr/bin/env bash
# End-to-end test of the pgline appliance under QEMU: builds the .deb and the image (cached when
# the inputs are unchanged), boots it with a NoCloud seed and checks it from the host.
#
#   deploy/appliance/test.sh [--nic dpdk|kernel] [--queues N] [--no-iommu] [--deb PATH]
#                            [--image DIR] [--keep]
#
# NICs: management = QEMU user networking with port forwards on 127.0.0.1 (SSH, API); client
# (--nic dpdk, the default) = virtio-net-pci on a tap that is moved into a network namespace
# this test creates, driven in the guest by DPDK's net_virtio PMD on vfio-pci behind the
# emulated Intel IOMMU. With --nic kernel the client ports are forwarded on the management NIC.
# --queues N (dpdk): a multi-queue virtio NIC (tap multi_queue, mq=on, rss=on) and N dataplane
# cores, one queue pair each; the guest gets N + 1 vCPUs. --no-iommu: no emulated IOMMU, so
# `pgline nic bind` picks uio_pci_generic.
# PGLINE_APPLIANCE_PROFILE=1 prints where the guest's boot time goes (systemd-analyze).
# KVM is used when a probe guest gets past the kernel decompressor, TCG otherwise.
#
# The origin is the lab PostgreSQL (deploy/lab/pg.sh, 127.0.0.1:54329), which the guest reaches
# as 10.0.2.2. The test creates its own database and slot and drops them at the end.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
nic_mode=dpdk deb="" image="" keep=0 queues=1 iommu=1
while [ $# -gt 0 ]; do
    case "$1" in
    --nic) nic_mode=$2; shift 2 ;;
    --queues) queues=$2; shift 2 ;;
    --deb) deb=$2; shift 2 ;;
    --image) image=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --no-iommu) iommu=0; shift ;;
    *) sed -n '2,19p' "$0" >&2; exit 2 ;;
    esac
done

# The host tools for the image and the VM (deploy/appliance/packages.txt). On a machine whose
# qemu-utils comes from backports, qemu-system-x86 may need Debian 12's qemu-utils first.
need=""
for pkg in $(cat "$here/packages.txt"); do
    dpkg -s "$pkg" >/dev/null 2>&1 || need="$need $pkg"
done
if [ -n "$need" ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null
fi
t0=$SECONDS
say() { printf '[appliance %4ss] %s\n' "$((SECONDS - t0))" "$*"; }
fail() { say "FAIL: $*"; exit 1; }

pg_port=54329
export PGPASSWORD=pgline
psql_origin() { psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p $pg_port -U postgres "$@"; }
psql_origin -d postgres -tAc 'select 1' >/dev/null || fail "no lab PostgreSQL on 127.0.0.1:$pg_port (deploy/lab/pg.sh)"

if [ -z "$image" ]; then
    args=()
    [ -z "$deb" ] || args=(--deb "$deb")
    image=$("$here/build.sh" "${args[@]}" | tail -1)
fi
base="$image/pgline-appliance.qcow2"
[ -f "$base" ] || fail "no image at $base"
say "image $image ($(grep build_seconds "$image/build-info" 2>/dev/null || echo cached))"

id=$$
work=$(mktemp -d /var/tmp/pgline-appliance-test.XXXXXX)
db=appliance_$id
slot=pgline_app_$id
ns=pgline-app-$id
tap=pgapp$((id % 100000))
qemu_pid=""
cleanup() {
    set +e
    [ -z "$qemu_pid" ] || { kill "$qemu_pid" 2>/dev/null; wait "$qemu_pid" 2>/dev/null; }
    ip -n "$ns" link del "$tap" 2>/dev/null
    ip netns del "$ns" 2>/dev/null
    ip link del "$tap" 2>/dev/null
    psql_origin -d postgres -c "select pg_drop_replication_slot('$slot') from pg_replication_slots where slot_name = '$slot'" >/dev/null 2>&1
    psql_origin -d postgres -c "drop database if exists $db" >/dev/null 2>&1
    if [ $keep = 1 ]; then echo "kept $work"; else rm -rf --one-file-system "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Origin data.
psql_origin -d postgres -c "create database $db"
psql_origin -d "$db" <<'SQL'
create table users (id int primary key, name text not null, plan text not null);
insert into users select g, 'user' || g, 'free' from generate_series(1, 100) g;
SQL

# Accelerator: KVM only if it is usable here (nested KVM may hang after the decompressor: a
# probe kernel must print to the serial port within 20 s).
accel=tcg
if [ -w /dev/kvm ]; then
    kernel=$(ls /boot/vmlinuz-* 2>/dev/null | tail -1 || true)
    if [ -n "$kernel" ] && timeout 20 qemu-system-x86_64 -enable-kvm -m 256 -nographic -no-reboot \
        -kernel "$kernel" -append "console=ttyS0 panic=-1" 2>/dev/null | grep -q "Linux version"; then
        accel=kvm
    fi
fi
say "accelerator: $accel"

ssh-keygen -q -t ed25519 -N '' -f "$work/key"
token=tok-$id-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
p_ssh=$(free_port) p_api=$(free_port) p_resp=$(free_port) p_pg=$(free_port)
client_ip=192.168.77.2 host_ip=192.168.77.1

# seed NAME ORIGIN_PASSWORD: a NoCloud seed (FAT, label CIDATA) in $work/NAME.img.
seed() {
    local d="$work/$1"
    mkdir -p "$d"
    printf 'instance-id: pgline-%s-%s\nlocal-hostname: pgline\n' "$1" "$id" >"$d/meta-data"
    cat >"$d/user-data" <<YAML
#cloud-config
ssh_authorized_keys:
  - $(cat "$work/key.pub")
write_files:
  - path: /etc/pgline/appliance.conf
    permissions: '0600'
    content: |
      ORIGIN_URL='host=10.0.2.2 port=$pg_port user=postgres dbname=$db connect_timeout=5'
      ORIGIN_PASSWORD='$2'
      API_TOKEN='$token'
      NIC_MODE=$nic_mode
      CLIENT_NIC=second
      CLIENT_IP=$client_ip
      CLIENT_PREFIX=24
      CORES=$queues
      STORE_MEMORY=128MiB
      SLOT=$slot
runcmd:
  - [ /usr/lib/pgline/pgline-appliance-setup ]
YAML
    cat >"$d/network-config" <<YAML
version: 2
ethernets:
  mgmt:
    match: { macaddress: "52:54:00:12:34:01" }
    set-name: eth0
    dhcp4: true
YAML
    mkfs.vfat -n CIDATA -C "$work/$1.img" 2048 >/dev/null
    mcopy -i "$work/$1.img" "$d/meta-data" "$d/user-data" "$d/network-config" ::/
}

# boot NAME: starts the guest on a fresh overlay of the image with seed NAME.
boot() {
    qemu-img create -q -f qcow2 -b "$base" -F qcow2 "$work/$1.qcow2"
    # TCG's default CPU (qemu64) lacks SSE4.2, which Debian's DPDK (-march=corei7) needs.
    local accel_args=(-accel tcg,thread=multi -cpu max) client=()
    [ $accel = kvm ] && accel_args=(-enable-kvm -cpu host)
    local fwd="hostfwd=tcp:127.0.0.1:$p_ssh-:22,hostfwd=tcp:127.0.0.1:$p_api-:6381"
    fwd="$fwd,hostfwd=tcp:127.0.0.1:$p_resp-:6380,hostfwd=tcp:127.0.0.1:$p_pg-:6432"
    if [ "$nic_mode" = dpdk ]; then
        ip link del "$tap" 2>/dev/null || true
        ip -n "$ns" link del "$tap" 2>/dev/null || true
        local mq="" qs=""
        if [ "$queues" -gt 1 ]; then
            mq=multi_queue qs=",queues=$queues"
            qs_dev=",mq=on,rss=on,vectors=$((2 * queues + 2))"
        fi
        ip tuntap add dev "$tap" mode tap $mq
        local platform=",iommu_platform=on"
        [ $iommu = 1 ] || platform=""
        client=(-netdev "tap,id=client,ifname=$tap,script=no,downscript=no,vhost=off$qs"
            -device "virtio-net-pci,netdev=client,mac=52:54:00:12:34:02,addr=0x4,disable-legacy=on$platform${qs_dev:-}")
    fi
    local machine=(-machine q35,kernel-irqchip=split -device intel-iommu,intremap=on)
    [ $iommu = 1 ] || machine=(-machine q35)
    qemu-system-x86_64 "${accel_args[@]}" "${machine[@]}" -m 2048 -smp $((queues + 1)) \
        -vga none -display none -no-user-config -nodefaults \
        -serial "file:$work/$1.serial" -monitor none \
        -drive "file=$work/$1.qcow2,if=virtio,format=qcow2" \
        -drive "file=$work/$1.img,if=virtio,format=raw,readonly=on" \
        -netdev "user,id=mgmt,$fwd" -device "virtio-net-pci,netdev=mgmt,mac=52:54:00:12:34:01,addr=0x3" \
        "${client[@]}" &
    qemu_pid=$!
    if [ "$nic_mode" = dpdk ]; then
        # The tap, opened by QEMU, goes into the test's namespace: the clients live there.
        sleep 1
        ip netns add "$ns" 2>/dev/null || true
        ip link set "$tap" netns "$ns"
        ip -n "$ns" addr add "$host_ip/24" dev "$tap"
        ip -n "$ns" link set "$tap" up
        ip -n "$ns" link set lo up
    fi
}
# stop_vm: ends QEMU at once. Its overlay is thrown away, so a clean guest shutdown would only
# cost time (the reboot check below is a clean one, from inside the guest).
stop_vm() {
    [ -z "$qemu_pid" ] && return
    kill "$qemu_pid" 2>/dev/null || true
    wait "$qemu_pid" 2>/dev/null || true
    qemu_pid=""
}
gssh() {
    ssh -q -i "$work/key" -p "$p_ssh" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
        -o ConnectTimeout=10 -o BatchMode=yes debian@127.0.0.1 "$@"
}
wait_for() { # SECONDS WHAT COMMAND...
    local limit=$1 what=$2
    shift 2
    local end=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $end ] || return 1
        kill -0 "$qemu_pid" 2>/dev/null || fail "QEMU exited while waiting for $what"
        sleep 2
    done
}
# Client commands: in the namespace (dpdk) or through the port forwards (kernel).
if [ "$nic_mode" = dpdk ]; then
    inns() { ip netns exec "$ns" "$@"; }
    resp_host=$client_ip resp_port=6380 pg_host=$client_ip pg_port_front=6432
else
    inns() { "$@"; }
    resp_host=127.0.0.1 resp_port=$p_resp pg_host=127.0.0.1 pg_port_front=$p_pg
fi
rcli() { inns redis-cli -h $resp_host -p $resp_port "$@"; }
get_has() { rcli GET "$1" | grep -q "$2"; }
api() { curl -sS -m 10 -H "Authorization: Bearer $token" "http://127.0.0.1:$p_api$1"; }

# ---------------------------------------------------------------------------------------------
say "boot 1: good seed ($nic_mode client NIC)"
seed good pgline
boot_start=$SECONDS
boot good
wait_for 420 "SSH" gssh true || fail "no SSH within 420 s (serial: $work/good.serial)"
say "SSH up after $((SECONDS - boot_start)) s"
wait_for 300 "pgline serving" get_has users:1 user1 ||
    { gssh sudo journalctl -b -u pgline -u pgline-nic-bind -u cloud-final --no-pager | tail -60; fail "pgline not serving"; }
serving=$((SECONDS - boot_start))
say "boot to serving: $serving s"
gssh sudo journalctl -b -u pgline --no-pager | grep -E "dpdk: port started|PASS|RESP listening" | sed 's/^/    /' || true
if [ "${PGLINE_APPLIANCE_PROFILE:-0}" = 1 ]; then
    # Where the boot time goes (under TCG each unit counts). Waits for the boot to finish.
    gssh systemd-analyze 2>/dev/null | sed 's/^/    /' || true
    gssh systemd-analyze blame 2>/dev/null | head -15 | sed 's/^/    /' || true
fi

say "check: redis-cli GET and MGET through the client NIC"
rcli GET users:42 | tee "$work/get.out"
grep -q '"name":"user42"' "$work/get.out" || fail "GET users:42"
rcli MGET users:1 users:2 users:999 | tee "$work/mget.out"
# Raw output: one line per key, an empty line for the missing one.
[ "$(sed -n 1p "$work/mget.out" | grep -c '"name":"user1"')$(sed -n 2p "$work/mget.out" | grep -c '"name":"user2"')" = 11 ] &&
    [ -z "$(sed -n 3p "$work/mget.out")" ] || fail "MGET"

say "check: psql through the PostgreSQL front"
out=$(inns env PGPASSWORD=pgline psql -X -h $pg_host -p $pg_port_front -U postgres -d "$db" -tAc "select name from users where id = 7")
echo "    $out"
[ "$out" = user7 ] || fail "psql via the front"

say "check: API and /metrics on the management NIC, with and without the token"
code=$(curl -s -o /dev/null -w '%{http_code}' -m 10 "http://127.0.0.1:$p_api/v1/status")
echo "    GET /v1/status without token: $code"
[ "$code" = 401 ] || [ "$code" = 403 ] || fail "status without the token answered $code"
api /v1/status >"$work/status.json"
head -c 300 "$work/status.json"; echo
grep -q '"version"' "$work/status.json" || fail "status with the token"
# Every core reports the transport it runs (nic.mode): dpdk here, not the kernel's sockets.
want_transport=$nic_mode
python3 -c 'import json,sys; t=[c["transport"] for c in json.load(open(sys.argv[1]))["cores"]]
print("    cores:", t); sys.exit(0 if t == [sys.argv[2]] * int(sys.argv[3]) else 1)' \
    "$work/status.json" "$want_transport" "$queues" || fail "/v1/status: cores' transport is not $want_transport"
api /metrics >"$work/metrics"
grep -q '^pgline_build_info' "$work/metrics" || fail "/metrics"
code=$(curl -s -o /dev/null -w '%{http_code}' -m 10 "http://127.0.0.1:$p_api/metrics")
echo "    GET /metrics without token: $code"
[ "$code" = 401 ] || [ "$code" = 403 ] || fail "/metrics without the token answered $code"
if [ "$nic_mode" = dpdk ]; then
    grep -E '^pgline_nic_(link|rx_packets|tx_packets)' "$work/metrics" | sed 's/^/    /'
    grep -q '^pgline_nic_rx_packets_total{port="0000:00:04.0"}' "$work/metrics" || fail "no NIC counters"
fi

say "check: an UPDATE at the origin is visible through the appliance"
psql_origin -d "$db" -c "update users set name = 'renamed42' where id = 42"
wait_for 30 "the update" get_has users:42 renamed42 || fail "update not visible"
rcli GET users:42

say "check: pgline check inside the guest (pgline stopped), then reboot"
gssh sudo systemctl stop pgline
gssh sudo /usr/lib/pgline/pgline-run check | sed 's/^/    /' || fail "pgline check failed in the guest"
gssh sudo systemctl reboot || true
psql_origin -d "$db" -c "update users set name = 'while-down' where id = 43"
sleep 5
reboot_start=$SECONDS
wait_for 420 "SSH after reboot" gssh true || fail "no SSH after reboot"
wait_for 300 "pgline serving after reboot" get_has users:43 while-down || fail "not serving after reboot"
say "reboot to serving: $((SECONDS - reboot_start)) s"
gssh sudo journalctl -b -u pgline --no-pager >"$work/journal-reboot"
grep -E "WAL streaming started|created replication slot|must be flushed" "$work/journal-reboot" | sed 's/^/    /'
grep -q "WAL streaming started" "$work/journal-reboot" || fail "no WAL stream after reboot"
! grep -q "created replication slot" "$work/journal-reboot" || fail "slot re-created after reboot"
! grep -q "must be flushed" "$work/journal-reboot" || fail "flush after reboot"
rcli GET users:43
stop_vm

# ---------------------------------------------------------------------------------------------
say "boot 2: wrong origin password in the seed"
seed bad wrong-password
boot bad
wait_for 420 "SSH" gssh true || fail "no SSH (boot 2)"
journal_has_fix() { gssh sudo journalctl -u pgline --no-pager | grep -q 'fix:'; }
wait_for 240 "the check's FAIL" journal_has_fix ||
    fail "no FAIL/fix in the journal"
# A bounded retry, not a tight loop: systemd restarts it after RestartSec=15s, once.
restarted() { [ "$(gssh sudo systemctl show pgline -p NRestarts --value)" -ge 1 ]; }
wait_for 90 "a restart after the back-off" restarted || fail "pgline was not restarted after its FAIL"
gssh sudo journalctl -u pgline --no-pager >"$work/journal-bad"
grep -E "FAIL|fix:|password|Failed|Scheduled restart" "$work/journal-bad" | head -12 | sed 's/^/    /'
grep -q "FAIL  origin reachable" "$work/journal-bad" || fail "no 'FAIL origin reachable' line"
restarts=$(gssh sudo systemctl show pgline -p NRestarts --value)
state=$(gssh sudo systemctl show pgline -p ActiveState --value)
echo "    restarts so far: $restarts, state: $state"
[ "$state" != active ] || fail "pgline active with a wrong password"
[ "$restarts" -le 5 ] || fail "$restarts restarts: a crash loop"
stop_vm

say "all appliance checks passed in $((SECONDS - t0)) s (boot to serving $serving s, $accel)"
