//! The in-memory port pair: two [`Queue`] ends joined by lock-free rings.
//!
//! Purpose: tests and the in-process dataplane benchmark run the userspace stack without a NIC.
//! [`pair`] returns two ends, A and B; frames A transmits arrive at B and the other way round.
//!
//! Layout: each direction has a ring (`crossbeam_queue::ArrayQueue`) of frames in flight, and each
//! end has a fixed pool of buffers allocated once at set-up. A frame's buffer comes from the pool of
//! the end that allocated it and goes back there when the frame is dropped (by the receiver, by the
//! fault injector, or by whoever holds it), so the steady state does not touch the heap.
//!
//! Fault injection, per direction ([`Faults`]), seeded and deterministic for one sequence of
//! calls: loss, duplication (a copy from the sender's pool, skipped when the pool is empty) and
//! reordering (a frame is held back and sent after the next one, or at the end of the next
//! `tx_burst`), each
//! in per mille of transmitted frames. Faults are applied on the sender's side in `tx_burst`.
//!
//! Offloads: when [`MemConfig::offloads`] has `tx_checksum`, frames that asked for it with
//! [`Packet::request_tx_checksum`] get their IPv4 header and TCP/UDP checksums computed on
//! transmit, as a device would, so the receiver sees valid frames. `rx_checksum` is only reported.
//! With [`MemConfig::checksum_partial`] (and both offloads on) such frames cross with their
//! checksums left partial, the way veth and virtio-net pass `CHECKSUM_PARTIAL` between two ends
//! of one host: the receiving end reports `rx_checksum`, so its stack trusts them, and no CPU
//! computes a checksum the hardware would. Only for pairs whose two ends both offload (the
//! in-process benchmark); a receiver that verifies would drop them.
//!
//! Thread model: each end is owned by one thread; the two ends may live on two threads. The only
//! shared state is the rings and the pools (lock-free) and one `Arc` per pool.
//!
//! Limitations: [`pairs`] gives one independent lane per core, not one port with RSS; a frame held for reordering waits for the
//! sender's next `tx_burst`; duplication needs a free buffer in the sender's pool.

use std::sync::Arc;

use crossbeam_queue::ArrayQueue;

use crate::{Offloads, Packet, Queue};

/// Default number of buffers in each end's pool.
pub const DEFAULT_POOL_FRAMES: usize = 8192;
/// Default ring capacity per direction.
pub const DEFAULT_RING: usize = 4096;
/// Default buffer size (a full 1514-byte frame fits).
pub const DEFAULT_FRAME_SIZE: usize = 2048;

/// Faults injected on one direction, in per mille of transmitted frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Frames dropped.
    pub loss_per_mille: u16,
    /// Frames sent twice.
    pub duplicate_per_mille: u16,
    /// Frames held back and sent after the next one.
    pub reorder_per_mille: u16,
    /// Seed of this direction's generator.
    pub seed: u64,
}

impl Faults {
    fn any(&self) -> bool {
        self.loss_per_mille + self.duplicate_per_mille + self.reorder_per_mille > 0
    }
}

/// How a pair is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemConfig {
    /// Buffers in each end's pool.
    pub pool_frames: usize,
    /// Bytes per buffer (the port's `max_frame` is `min(frame_size, 1514)`).
    pub frame_size: usize,
    /// Frames in flight per direction.
    pub ring: usize,
    /// End A's MAC address.
    pub mac_a: [u8; 6],
    /// End B's MAC address.
    pub mac_b: [u8; 6],
    /// Faults on frames A transmits.
    pub a_to_b: Faults,
    /// Faults on frames B transmits.
    pub b_to_a: Faults,
    /// What both ends report (and emulate, for `tx_checksum`).
    pub offloads: Offloads,
    /// With both offloads on: frames that asked for checksum offload cross with the checksums
    /// left partial instead of filled (see the module doc). Ignored otherwise.
    pub checksum_partial: bool,
}

impl Default for MemConfig {
    fn default() -> Self {
        MemConfig {
            pool_frames: DEFAULT_POOL_FRAMES,
            frame_size: DEFAULT_FRAME_SIZE,
            ring: DEFAULT_RING,
            mac_a: [0x02, 0, 0, 0, 0, 0x0a],
            mac_b: [0x02, 0, 0, 0, 0, 0x0b],
            a_to_b: Faults::default(),
            b_to_a: Faults::default(),
            offloads: Offloads::default(),
            checksum_partial: false,
        }
    }
}

/// Counters of one end (plain integers: the end is owned by one thread).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemStats {
    pub rx_frames: u64,
    pub tx_frames: u64,
    /// Frames `tx_burst` left to the caller because the ring was full.
    pub tx_ring_full: u64,
    /// `alloc` calls that found the pool empty.
    pub alloc_failed: u64,
    pub fault_lost: u64,
    pub fault_duplicated: u64,
    pub fault_reordered: u64,
}

type Pool = ArrayQueue<Box<[u8]>>;

/// One frame of the in-memory port.
pub struct MemPacket {
    buf: Option<Box<[u8]>>,
    len: usize,
    csum: Option<(u16, u16)>,
    pool: Arc<Pool>,
}

impl MemPacket {
    fn bytes(&self) -> &[u8] {
        match &self.buf {
            Some(b) => &b[..self.len],
            None => &[],
        }
    }
}

impl Drop for MemPacket {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            // The pool was sized for every buffer it hands out, so a push cannot fail; if it
            // did, the buffer would simply be freed.
            let _ = self.pool.push(buf);
        }
    }
}

impl Packet for MemPacket {
    fn data(&self) -> &[u8] {
        self.bytes()
    }

    fn data_mut(&mut self) -> &mut [u8] {
        match &mut self.buf {
            Some(b) => &mut b[..self.len],
            None => &mut [],
        }
    }

    fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity());
    }

    fn capacity(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.len())
    }

    fn request_tx_checksum(&mut self, l2_len: u16, l3_len: u16) {
        self.csum = Some((l2_len, l3_len));
    }
}

/// A small deterministic generator (splitmix64).
#[derive(Clone, Copy, Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn per_mille(&mut self, p: u16) -> bool {
        p > 0 && (self.next() % 1000) < u64::from(p)
    }
}

/// One end of an in-memory pair.
pub struct MemQueue {
    rx: Arc<ArrayQueue<MemPacket>>,
    tx: Arc<ArrayQueue<MemPacket>>,
    pool: Arc<Pool>,
    mac: [u8; 6],
    max_frame: usize,
    offloads: Offloads,
    /// Fill requested checksums on transmit (tx offload on, checksums not left partial).
    fill_checksums: bool,
    faults: Faults,
    rng: Rng,
    held: Option<MemPacket>,
    stats: MemStats,
}

/// Builds a connected pair of ends (A, B).
pub fn pair(cfg: MemConfig) -> (MemQueue, MemQueue) {
    let ring = cfg.ring.max(1);
    let ab = Arc::new(ArrayQueue::new(ring));
    let ba = Arc::new(ArrayQueue::new(ring));
    let a = MemQueue::new(&cfg, ba.clone(), ab.clone(), cfg.mac_a, cfg.a_to_b);
    let b = MemQueue::new(&cfg, ab, ba, cfg.mac_b, cfg.b_to_a);
    (a, b)
}

/// Builds `n` independent pairs with the same MACs, one per dataplane core (queue `i` of end A
/// talks only to queue `i` of end B: there is no RSS, each lane is its own wire). Each lane's
/// fault generators get their own seeds.
pub fn pairs(cfg: MemConfig, n: usize) -> Vec<(MemQueue, MemQueue)> {
    (0..n as u64)
        .map(|i| {
            let mut c = cfg;
            c.a_to_b.seed = c.a_to_b.seed.wrapping_add(i.wrapping_mul(0x9e37_79b9));
            c.b_to_a.seed = c.b_to_a.seed.wrapping_add(i.wrapping_mul(0x9e37_79b9));
            pair(c)
        })
        .collect()
}

impl MemQueue {
    fn new(
        cfg: &MemConfig,
        rx: Arc<ArrayQueue<MemPacket>>,
        tx: Arc<ArrayQueue<MemPacket>>,
        mac: [u8; 6],
        faults: Faults,
    ) -> Self {
        let frames = cfg.pool_frames.max(1);
        let pool = Arc::new(ArrayQueue::new(frames));
        for _ in 0..frames {
            let _ = pool.push(vec![0u8; cfg.frame_size].into_boxed_slice());
        }
        MemQueue {
            rx,
            tx,
            pool,
            mac,
            max_frame: cfg.frame_size.min(1514),
            offloads: cfg.offloads,
            fill_checksums: cfg.offloads.tx_checksum
                && !(cfg.checksum_partial && cfg.offloads.rx_checksum),
            faults,
            rng: Rng(faults.seed ^ 0x005e_ed0f_fa17),
            held: None,
            stats: MemStats::default(),
        }
    }

    /// This end's counters.
    pub fn stats(&self) -> MemStats {
        self.stats
    }

    /// Changes the faults injected on frames this end transmits (the generator keeps its state).
    pub fn set_faults(&mut self, faults: Faults) {
        self.faults = faults;
    }

    /// Free buffers in this end's pool (for leak checks in tests).
    pub fn pool_free(&self) -> usize {
        self.pool.len()
    }

    /// Pushes one frame on the ring; gives it back when the ring is full.
    fn push(&mut self, pkt: MemPacket) -> Result<(), MemPacket> {
        self.tx.push(pkt)?;
        self.stats.tx_frames += 1;
        Ok(())
    }

    /// Applies faults to one frame the ring has room for, then pushes it (and what it releases).
    fn send_faulty(&mut self, pkt: MemPacket) {
        if self.rng.per_mille(self.faults.loss_per_mille) {
            self.stats.fault_lost += 1;
            return;
        }
        if self.rng.per_mille(self.faults.duplicate_per_mille) {
            if let Some(mut dup) = self.alloc_raw() {
                let n = pkt.len;
                dup.set_len(n);
                dup.data_mut().copy_from_slice(pkt.bytes());
                self.stats.fault_duplicated += 1;
                let _ = self.push(dup);
            }
        }
        if self.held.is_none() && self.rng.per_mille(self.faults.reorder_per_mille) {
            self.stats.fault_reordered += 1;
            self.held = Some(pkt);
            return;
        }
        let _ = self.push(pkt);
        if let Some(held) = self.held.take() {
            let _ = self.push(held);
        }
    }

    fn alloc_raw(&mut self) -> Option<MemPacket> {
        let buf = self.pool.pop()?;
        Some(MemPacket {
            buf: Some(buf),
            len: 0,
            csum: None,
            pool: self.pool.clone(),
        })
    }
}

impl Queue for MemQueue {
    type Packet = MemPacket;

    fn rx_burst(&mut self, out: &mut Vec<MemPacket>, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            match self.rx.pop() {
                Some(p) => {
                    out.push(p);
                    n += 1;
                }
                None => break,
            }
        }
        self.stats.rx_frames += n as u64;
        n
    }

    fn alloc(&mut self) -> Option<MemPacket> {
        let p = self.alloc_raw();
        if p.is_none() {
            self.stats.alloc_failed += 1;
        }
        p
    }

    fn tx_burst(&mut self, pkts: &mut Vec<MemPacket>) -> usize {
        let faulty = self.faults.any();
        // Room for every frame taken (three slots when faulty: a duplicate and a held frame may
        // go with it). Only this end pushes on its ring, so the room cannot shrink meanwhile.
        let need = if faulty { 3 } else { 1 };
        let room = (self.tx.capacity() - self.tx.len()) / need;
        let take = pkts.len().min(room);
        // A frame held back during an earlier burst goes out at the end of this one at the latest.
        let held_before = self.held.is_some();
        if take < pkts.len() {
            self.stats.tx_ring_full += (pkts.len() - take) as u64;
        }
        for mut pkt in pkts.drain(..take) {
            if let Some((l2, l3)) = pkt.csum.take() {
                if self.fill_checksums {
                    let n = pkt.len;
                    if let Some(buf) = pkt.buf.as_mut() {
                        fill_checksums(&mut buf[..n], usize::from(l2), usize::from(l3));
                    }
                }
            }
            if faulty {
                self.send_faulty(pkt);
            } else {
                let _ = self.push(pkt);
            }
        }
        if held_before {
            if let Some(held) = self.held.take() {
                if let Err(p) = self.push(held) {
                    self.held = Some(p);
                }
            }
        }
        take
    }

    fn offloads(&self) -> Offloads {
        self.offloads
    }

    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn max_frame(&self) -> usize {
        self.max_frame
    }
}

/// Ones'-complement sum of `data` added to `sum` (not folded).
fn sum16(mut sum: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    sum
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// What a device does for a frame that requested checksum offload: the IPv4 header checksum and
/// the full TCP/UDP checksum (the field holds the pseudo-header sum, which is simply recomputed).
/// Frames too short or not IPv4 are left alone.
fn fill_checksums(frame: &mut [u8], l2: usize, l3: usize) {
    if frame.len() < l2 + l3 || l3 < 20 {
        return;
    }
    let ip = &mut frame[l2..];
    ip[10] = 0;
    ip[11] = 0;
    let c = fold(sum16(0, &ip[..l3]));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]])).min(ip.len());
    if total < l3 {
        return;
    }
    let proto = ip[9];
    let off = match proto {
        6 => 16,
        17 => 6,
        _ => return,
    };
    let l4_len = total - l3;
    if l4_len < off + 2 {
        return;
    }
    let mut pseudo = sum16(0, &ip[12..20]);
    pseudo += u32::from(proto) + l4_len as u32;
    let l4 = &mut ip[l3..total];
    l4[off] = 0;
    l4[off + 1] = 0;
    let c = fold(sum16(pseudo, l4));
    l4[off..off + 2].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(q: &mut MemQueue, tag: u8) {
        let mut p = q.alloc().expect("pool has room");
        p.set_len(60);
        p.data_mut()[0] = tag;
        let mut v = vec![p];
        q.tx_burst(&mut v);
    }

    fn recv_tags(q: &mut MemQueue) -> Vec<u8> {
        let mut v = Vec::new();
        q.rx_burst(&mut v, usize::MAX);
        v.iter().map(|p| p.data()[0]).collect()
    }

    #[test]
    fn frames_cross_and_buffers_return() {
        let cfg = MemConfig {
            pool_frames: 4,
            ..MemConfig::default()
        };
        let (mut a, mut b) = pair(cfg);
        for round in 0..10u8 {
            send(&mut a, round);
            send(&mut b, round + 100);
            assert_eq!(recv_tags(&mut b), vec![round]);
            assert_eq!(recv_tags(&mut a), vec![round + 100]);
        }
        assert_eq!(a.pool_free(), 4);
        assert_eq!(b.pool_free(), 4);
        assert_eq!(a.mac(), cfg.mac_a);
        assert_eq!(a.stats().tx_frames, 10);
    }

    #[test]
    fn lanes_are_independent() {
        let mut lanes = pairs(MemConfig::default(), 3);
        let (a0, _) = &mut lanes[0];
        send(a0, 7);
        let (_, b1) = &mut lanes[1];
        assert!(recv_tags(b1).is_empty());
        let (_, b0) = &mut lanes[0];
        assert_eq!(recv_tags(b0), vec![7]);
    }

    #[test]
    fn pool_exhaustion_and_full_ring() {
        let cfg = MemConfig {
            pool_frames: 3,
            ring: 2,
            ..MemConfig::default()
        };
        let (mut a, _b) = pair(cfg);
        let mut v: Vec<MemPacket> = (0..3).filter_map(|_| a.alloc()).collect();
        assert_eq!(v.len(), 3);
        assert!(a.alloc().is_none());
        assert_eq!(a.tx_burst(&mut v), 2);
        assert_eq!(
            v.len(),
            1,
            "the frame the ring had no room for is left to the caller"
        );
        assert_eq!(a.stats().tx_ring_full, 1);
        drop(v);
        assert_eq!(a.pool_free(), 1);
    }

    #[test]
    fn faults_are_seeded_and_counted() {
        let faults = Faults {
            loss_per_mille: 100,
            duplicate_per_mille: 100,
            reorder_per_mille: 100,
            seed: 7,
        };
        let run = || {
            let cfg = MemConfig {
                a_to_b: faults,
                ..MemConfig::default()
            };
            let (mut a, mut b) = pair(cfg);
            let mut got = Vec::new();
            for i in 0..200u8 {
                send(&mut a, i);
                got.extend(recv_tags(&mut b));
            }
            (got, a.stats())
        };
        let (got, st) = run();
        assert_eq!(run().0, got, "same seed, same faults");
        assert!(st.fault_lost > 5 && st.fault_duplicated > 5 && st.fault_reordered > 5);
        let in_order = got.windows(2).all(|w| w[0] <= w[1]);
        assert!(!in_order, "reordering happened");
        assert_eq!(
            got.len() as u64,
            200 - st.fault_lost + st.fault_duplicated,
            "{st:?}"
        );
    }

    #[test]
    fn tx_checksum_offload_is_emulated() {
        // IPv4 + UDP frame with zeroed checksums.
        let mut frame = vec![0u8; 14 + 20 + 8 + 4];
        frame[12] = 0x08;
        let ip = &mut frame[14..];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&32u16.to_be_bytes());
        ip[8] = 64;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
        ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
        ip[24..26].copy_from_slice(&12u16.to_be_bytes());
        ip[28..32].copy_from_slice(b"ping");
        let cfg = MemConfig {
            offloads: Offloads {
                tx_checksum: true,
                rx_checksum: false,
            },
            ..MemConfig::default()
        };
        let (mut a, mut b) = pair(cfg);
        let mut p = a.alloc().expect("room");
        p.set_len(frame.len());
        p.data_mut().copy_from_slice(&frame);
        p.request_tx_checksum(14, 20);
        a.tx_burst(&mut vec![p]);
        let mut v = Vec::new();
        b.rx_burst(&mut v, 8);
        let ip = &v[0].data()[14..];
        assert_eq!(fold(sum16(0, &ip[..20])), 0, "IPv4 header checksum valid");
        let mut pseudo = sum16(0, &ip[12..20]);
        pseudo += 17 + 12;
        assert_eq!(fold(sum16(pseudo, &ip[20..32])), 0, "UDP checksum valid");
    }

    #[test]
    fn checksum_partial_frames_cross_unfilled() {
        let frame = {
            let mut f = vec![0u8; 14 + 20 + 8];
            f[14] = 0x45;
            f[16..18].copy_from_slice(&28u16.to_be_bytes());
            f[23] = 17;
            f
        };
        let both = Offloads {
            tx_checksum: true,
            rx_checksum: true,
        };
        for (partial, offloads, filled) in [
            (true, both, false),
            (false, both, true),
            // Partial needs a receiver that trusts the frame: without rx offload it is ignored.
            (
                true,
                Offloads {
                    rx_checksum: false,
                    ..both
                },
                true,
            ),
        ] {
            let (mut a, mut b) = pair(MemConfig {
                offloads,
                checksum_partial: partial,
                ..MemConfig::default()
            });
            let mut p = a.alloc().expect("room");
            p.set_len(frame.len());
            p.data_mut().copy_from_slice(&frame);
            p.request_tx_checksum(14, 20);
            a.tx_burst(&mut vec![p]);
            let mut v = Vec::new();
            b.rx_burst(&mut v, 8);
            let ip = &v[0].data()[14..];
            assert_eq!(
                ip[10..12] != [0, 0],
                filled,
                "partial {partial}, {offloads:?}"
            );
        }
    }
}
