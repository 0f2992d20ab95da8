//! DPDK backend tests, with virtual devices only (`--no-pci`, `--no-huge`; `--in-memory` is
//! refused with `--no-huge`, so a per-process `--file-prefix` keeps runs apart).
//!
//! `rte_eal_init` runs once per process, so every test shares one EAL brought up by [`eal`]
//! (with `net_ring0` and `net_null0`); devices a test creates later (the veth for
//! `net_af_packet`) are hot-plugged with `Port::attach_vdev`. Needs root (DPDK's memory set-up,
//! network namespaces): as another user each test prints why and returns.
//!
//! Run: `cargo test -p pgline-nic --features dpdk --test dpdk` (add
//! `PGLINE_DPDK_TEST_HUGEPAGES=1` to run on hugepages instead of `--no-huge`).
#![cfg(feature = "dpdk")]

mod offload;
mod veth;

use std::sync::OnceLock;

use pgline_nic::dpdk::{DpdkError, Eal, EalConfig, Mempool, Port, PortConfig};
use pgline_nic::{Packet, Queue};

const DATA_ROOM: u16 = 2048 + 128;

/// The process's EAL, or `None` (after saying why) when not root.
fn eal() -> Option<&'static Eal> {
    static EAL: OnceLock<Option<&'static Eal>> = OnceLock::new();
    *EAL.get_or_init(|| {
        if !veth::is_root() {
            eprintln!("skipped: the DPDK tests need root");
            return None;
        }
        remove_stale_runtime_dirs();
        // PGLINE_DPDK_TEST_HUGEPAGES=1: the production memory path (hugepages, --in-memory).
        let huge = std::env::var_os("PGLINE_DPDK_TEST_HUGEPAGES").is_some_and(|v| v == "1");
        let cfg = EalConfig {
            lcores: "0".into(),
            file_prefix: Some(format!("{RUNTIME_PREFIX}{}", std::process::id())),
            vdevs: vec!["net_ring0".into(), "net_null0".into()],
            no_pci: true,
            no_huge: !huge,
            in_memory: huge,
            memory_mb: (!huge).then_some(256),
            log_level: Some("notice".into()),
            ..EalConfig::default()
        };
        Some(Eal::init(&cfg).expect("rte_eal_init with virtual devices"))
    })
}

/// DPDK leaves `/var/run/dpdk/<file-prefix>` behind; remove those of earlier test processes.
fn remove_stale_runtime_dirs() {
    let Ok(dirs) = std::fs::read_dir("/var/run/dpdk") else {
        return;
    };
    for dir in dirs.flatten() {
        let name = dir.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(RUNTIME_PREFIX)) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(dir.path());
        }
    }
}

const RUNTIME_PREFIX: &str = "pgline-nic-test-";

fn frame(seq: u16, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes()); // local experimental ethertype
    f[14..16].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in f[16..].iter_mut().enumerate() {
        *b = (i as u8) ^ (seq as u8);
    }
    f
}

#[test]
fn second_eal_init_is_an_error() {
    let Some(_eal) = eal() else { return };
    assert_eq!(
        Eal::init(&EalConfig::default()).err(),
        Some(DpdkError::AlreadyInitialized)
    );
    assert!(Eal::get().is_some());
}

#[test]
fn ring_loopback_bursts_frames_and_counts_them() {
    let Some(eal) = eal() else { return };
    let pool = Mempool::create(eal, "ring_loop", 1023, 0, DATA_ROOM).expect("pool");
    let id = eal.port_by_name("net_ring0").expect("net_ring0 exists");
    let cfg = PortConfig {
        queues: 2,
        ..PortConfig::default()
    };
    let mut port = Port::configure(eal, id, &cfg, pool).expect("configure net_ring0");
    assert_eq!(
        Port::configure(eal, id, &cfg, pool).err(),
        Some(DpdkError::PortInUse),
        "one Port per device"
    );
    port.start().expect("start");
    assert!(port.link().expect("link").up);
    assert!(!port.rss(), "net_ring has no RSS");
    assert!(
        !port.offloads().tx_checksum,
        "net_ring offers no checksum offload"
    );

    let mut q = port.queue(1).expect("queue 1");
    assert_eq!(port.queue(1).err(), Some(DpdkError::QueueTaken(1)));
    assert_eq!(port.queue(2).err(), Some(DpdkError::QueueTaken(2)));
    assert_eq!(q.mac(), port.mac());
    assert_eq!(q.max_frame(), 1514);

    // 100 frames: more than one 64-frame DPDK burst on each side.
    let sent: Vec<Vec<u8>> = (0..100u16)
        .map(|i| frame(i, 60 + usize::from(i) * 7))
        .collect();
    let mut tx = Vec::with_capacity(128);
    for f in &sent {
        let mut m = q.alloc().expect("mbuf");
        assert!(m.capacity() >= 2048);
        m.set_len(f.len());
        m.data_mut().copy_from_slice(f);
        tx.push(m);
    }
    assert_eq!(q.tx_burst(&mut tx), 100);
    assert!(tx.is_empty());

    let mut rx = Vec::with_capacity(128);
    assert_eq!(q.rx_burst(&mut rx, 128), 100);
    let got: Vec<&[u8]> = rx.iter().map(|m| m.data()).collect();
    assert_eq!(got, sent.iter().map(Vec::as_slice).collect::<Vec<_>>());
    assert_eq!(q.rx_burst(&mut rx, 128), 0, "nothing left on the ring");

    let c = q.counters();
    assert_eq!((c.rx_packets, c.tx_packets, c.tx_full), (100, 100, 0));
    let stats = port.stats().expect("stats");
    assert_eq!((stats.ipackets, stats.opackets), (100, 100));
    assert_eq!(stats.queues.len(), 2);
    assert_eq!(stats.queues[1].ipackets, 100);
    assert_eq!(stats.queues[0].ipackets, 0);

    drop(rx);
    assert_eq!(port.stop().err(), Some(DpdkError::QueuesInUse));
    drop(q);
    assert!(port.queue(1).is_ok(), "a dropped queue can be taken again");
    assert_eq!(pool.in_use(), 0, "received mbufs went back to the pool");
    port.stop().expect("stop with no queue out");
}

#[test]
fn ring_tx_full_leaves_frames_with_the_caller() {
    let Some(eal) = eal() else { return };
    let pool = Mempool::create(eal, "ring_full", 4095, 0, DATA_ROOM).expect("pool");
    // A second ring device, hot-plugged: its rings hold 1023 frames.
    let mut port = Port::attach_vdev(eal, "net_ring1", "", &PortConfig::default(), pool)
        .expect("attach net_ring1");
    port.start().expect("start");
    let mut q = port.queue(0).expect("queue 0");
    let mut tx: Vec<_> = (0..1100).map(|_| q.alloc().expect("mbuf")).collect();
    for m in &mut tx {
        m.set_len(60);
    }
    let taken = q.tx_burst(&mut tx);
    assert!(taken < 1100, "the ring cannot take all 1100");
    assert_eq!(tx.len(), 1100 - taken);
    assert_eq!(q.counters().tx_full, tx.len() as u64);
    drop(tx);
    let mut rx = Vec::new();
    while q.rx_burst(&mut rx, 256) > 0 {}
    assert_eq!(rx.len(), taken);
    drop(rx);
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn null_device_receives_and_counts() {
    let Some(eal) = eal() else { return };
    let pool = Mempool::create(eal, "null_rx", 511, 0, DATA_ROOM).expect("pool");
    let id = eal.port_by_name("net_null0").expect("net_null0 exists");
    let mut port = Port::configure(eal, id, &PortConfig::default(), pool).expect("configure");
    port.start().expect("start");
    let mut q = port.queue(0).expect("queue 0");
    let mut rx = Vec::new();
    assert_eq!(q.rx_burst(&mut rx, 32), 32, "net_null always has frames");
    assert!(rx.iter().all(|m| m.data().len() == 64));
    assert_eq!(q.tx_burst(&mut rx), 32, "net_null takes every frame");
    let stats = port.stats().expect("stats");
    assert_eq!((stats.ipackets, stats.opackets), (32, 32));
    assert_eq!(pool.in_use(), 0, "net_null freed what it transmitted");
}

#[test]
fn exhausted_mempool_gives_none() {
    let Some(eal) = eal() else { return };
    let pool = Mempool::create(eal, "tiny", 63, 0, DATA_ROOM).expect("pool");
    let mut held = Vec::new();
    while let Some(m) = pool.alloc() {
        held.push(m);
        assert!(held.len() <= 63, "more mbufs than the pool has");
    }
    assert_eq!(held.len(), 63);
    assert_eq!(pool.available(), 0);
    assert!(pool.alloc().is_none(), "still exhausted");
    held.truncate(10);
    assert_eq!(pool.available(), 53);
    assert!(
        !pool.alloc_bulk(&mut held, 54),
        "bulk alloc is all or nothing"
    );
    assert_eq!(held.len(), 10);
    assert!(pool.alloc_bulk(&mut held, 53));
    assert_eq!(held.len(), 63);
    drop(held);
    assert_eq!(pool.available(), 63);
}

#[test]
fn bad_configurations_are_refused() {
    let Some(eal) = eal() else { return };
    assert_eq!(
        eal.port_by_name("net_nonexistent9").err(),
        Some(DpdkError::NoSuchPort)
    );
    assert!(Mempool::create(eal, "a_name_far_too_long_for_dpdk", 63, 0, DATA_ROOM).is_err());
    // Frames of MTU 1500 do not fit 1024-byte buffers; a failed attach unplugs the device
    // again, so the same name can be attached once more.
    let small = Mempool::create(eal, "small_room", 63, 0, 1024).expect("pool");
    let err = Port::attach_vdev(eal, "net_null2", "", &PortConfig::default(), small).err();
    assert!(matches!(err, Some(DpdkError::Invalid(_))), "{err:?}");
    let zero = PortConfig {
        queues: 0,
        ..PortConfig::default()
    };
    let err = Port::attach_vdev(eal, "net_null2", "", &zero, small).err();
    assert!(matches!(err, Some(DpdkError::Invalid(_))), "{err:?}");
    assert_eq!(
        eal.port_by_name("net_null2").err(),
        Some(DpdkError::NoSuchPort)
    );
}

#[test]
fn af_packet_on_veth_answers_arp_and_ping() {
    let Some(eal) = eal() else { return };
    let net = veth::Veth::create("af_packet").expect("netns + veth set-up");
    let pool = Mempool::create(eal, "afp", 1023, 0, DATA_ROOM).expect("pool");
    let args = format!("iface={}", net.root_if);
    let mut port = Port::attach_vdev(eal, "net_af_packet1", &args, &PortConfig::default(), pool)
        .expect("attach net_af_packet on the veth");
    port.start().expect("start");
    assert_eq!(port.mac(), net.root_mac().expect("veth mac"));
    let q = port.queue(0).expect("queue 0");
    veth::arp_and_ping_exchange(q, &net);
}

#[test]
fn af_xdp_on_veth_answers_arp_and_ping() {
    let Some(eal) = eal() else { return };
    let net = veth::Veth::create("af_xdp").expect("netns + veth set-up");
    let pool = Mempool::create_packed(eal, "afxdp", 4095, 0, DATA_ROOM).expect("pool");
    let args = format!("iface={}", net.root_if);
    let mut port = Port::attach_vdev(eal, "net_af_xdp1", &args, &PortConfig::default(), pool)
        .expect("attach net_af_xdp on the veth");
    port.start().expect("start");
    let q = port.queue(0).expect("queue 0");
    veth::arp_and_ping_exchange(q, &net);
}

/// net_af_xdp's UMEM covers `capacity * buffer size` bytes from the pool's start: a packed pool
/// fits inside it, DPDK's default layout without hugepages (one buffer per 4 KiB page) does not,
/// which is what stalled af_xdp RX once the buffers past the UMEM came round.
#[test]
fn packed_pools_fit_the_af_xdp_umem() {
    let Some(eal) = eal() else { return };
    let packed = Mempool::create_packed(eal, "packed", 4095, 0, DATA_ROOM).expect("pool");
    assert_eq!(packed.span(), 4094);
    assert_eq!(packed.data_room(), DATA_ROOM);
    let held: Vec<_> = (0..4095).map(|_| packed.alloc().expect("mbuf")).collect();
    assert!(packed.alloc().is_none());
    drop(held);
    assert_eq!(packed.in_use(), 0);
    let spread = Mempool::create(eal, "spread", 4095, 0, DATA_ROOM).expect("pool");
    if eal.args().iter().any(|a| a == "--no-huge") {
        assert!(spread.span() > 4095, "{}", spread.span());
    }
}

/// A core's thread becomes an EAL lcore on its first RX burst and gives the lcore back when it
/// drops the queue.
#[test]
fn polling_thread_registers_with_the_eal() {
    let Some(eal) = eal() else { return };
    let pool = Mempool::create(eal, "lcore_reg", 1023, 32, DATA_ROOM).expect("pool");
    let mut port = Port::attach_vdev(eal, "net_null7", "", &PortConfig::default(), pool)
        .expect("attach net_null");
    port.start().expect("start");
    let mut q = port.queue(0).expect("queue 0");
    assert!(!q.registered_lcore(), "not before the first burst");
    let (before, during, after) = std::thread::spawn(move || {
        let before = eal.lcore_id();
        let mut rx = Vec::new();
        q.rx_burst(&mut rx, 8);
        drop(rx);
        let during = (
            eal.lcore_id(),
            q.registered_lcore(),
            q.counters().register_failed,
        );
        drop(q);
        (before, during, eal.lcore_id())
    })
    .join()
    .expect("core thread");
    assert_eq!(before, None);
    assert!(
        during.0.is_some() && during.1 && during.2 == 0,
        "{during:?}"
    );
    assert_eq!(after, None, "the lcore is given back with the queue");
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn registered_threads_get_their_own_lcore() {
    let Some(eal) = eal() else { return };
    let pool = Mempool::create(eal, "cached", 1023, 32, DATA_ROOM).expect("pool");
    let ids: Vec<Option<u32>> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                assert_eq!(eal.lcore_id(), None, "a plain thread has no lcore");
                eal.register_thread().expect("register");
                let id = eal.lcore_id();
                let held: Vec<_> = (0..100).map(|_| pool.alloc().expect("mbuf")).collect();
                drop(held);
                eal.unregister_thread();
                id
            })
            .join()
            .expect("thread")
        })
        .collect();
    assert!(ids.iter().all(Option::is_some), "{ids:?}");
    assert_eq!(
        pool.in_use(),
        0,
        "mbufs freed through a per-lcore cache are counted free"
    );
}

#[test]
fn tap_fills_in_checksums_on_request() {
    let Some(eal) = eal() else { return };
    let n = std::process::id() % 100_000;
    let t = offload::TapAddr {
        iface: format!("pgntap{n}"),
        kernel_ip: std::net::Ipv4Addr::new(10, 214, 0, 2),
        app_ip: std::net::Ipv4Addr::new(10, 214, 0, 1),
    };
    let pool = Mempool::create(eal, "tap", 4095, 0, DATA_ROOM).expect("pool");
    let args = format!("iface={}", t.iface);
    let mut port = Port::attach_vdev(eal, "net_tap1", &args, &PortConfig::default(), pool)
        .expect("attach net_tap");
    port.start().expect("start");
    offload::set_up_kernel_side(&t, port.mac());
    let kernel_mac = std::fs::read_to_string(format!("/sys/class/net/{}/address", t.iface))
        .ok()
        .and_then(|s| veth::parse_mac(s.trim()))
        .expect("tap MAC");
    let q = port.queue(0).expect("queue 0");
    offload::udp_and_tcp_checksums_offloaded(q, &t, kernel_mac);
}

/// Not a benchmark of record: a rough per-frame cost of alloc + TX + RX + free on `net_ring`.
#[test]
#[ignore = "timing figure; run with --ignored --nocapture in release"]
fn ring_loopback_rate() {
    let Some(eal) = eal() else { return };
    let pool = Mempool::create(eal, "ring_rate", 4095, 256, DATA_ROOM).expect("pool");
    let mut port = Port::attach_vdev(eal, "net_ring9", "", &PortConfig::default(), pool)
        .expect("attach net_ring9");
    port.start().expect("start");
    let mut q = port.queue(0).expect("queue 0");
    let (mut tx, mut rx) = (Vec::with_capacity(32), Vec::with_capacity(32));
    let rounds = 200_000u32;
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        for _ in 0..32 {
            let mut m = q.alloc().expect("mbuf");
            m.set_len(64);
            tx.push(m);
        }
        q.tx_burst(&mut tx);
        q.rx_burst(&mut rx, 32);
        rx.clear();
    }
    let frames = f64::from(rounds) * 32.0;
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "net_ring loopback: {:.1} M frames/s, {:.1} ns/frame",
        frames / secs / 1e6,
        secs * 1e9 / frames
    );
    assert_eq!(q.counters().rx_packets, u64::from(rounds) * 32);
}

#[test]
fn rss_and_offloads_follow_the_device_and_the_config() {
    let Some(eal) = eal() else { return };
    let pool = Mempool::create(eal, "tap_rss", 8191, 0, DATA_ROOM).expect("pool");
    let n = std::process::id() % 100_000;
    let attach = |cfg: &PortConfig| {
        let port = Port::attach_vdev(eal, "net_tap2", &format!("iface=pgnrss{n}"), cfg, pool)
            .expect("attach net_tap");
        (
            port.rss(),
            port.offloads().tx_checksum,
            port.offloads().rx_checksum,
        )
    };
    let two = PortConfig {
        queues: 2,
        ..PortConfig::default()
    };
    assert_eq!(
        attach(&two),
        (true, true, true),
        "net_tap has RSS and checksum offloads"
    );
    let plain = PortConfig {
        rss: false,
        tx_checksum: false,
        rx_checksum: false,
        ..two
    };
    assert_eq!(
        attach(&plain),
        (false, false, false),
        "not used when not asked for"
    );
    assert!(!attach(&PortConfig::default()).0, "no RSS with one queue");
}
