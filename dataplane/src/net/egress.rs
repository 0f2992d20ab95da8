//! Egress and timers: the dirty list, the timer heap, ARP resolution for connections, the TX
//! burst.
//!
//! A connection is visited by `flush` only when it is on the dirty list: something arrived for
//! it, the owner sent/received/closed, or its timer fell due. After its socket emitted what it
//! could, the next time smoltcp wants it (`poll_at`: delayed ACK, retransmission, timeout) goes on
//! a min-heap. The heap holds at most one live entry per connection plus superseded ones: an
//! entry is pushed only when the new deadline is earlier than the pending one; a later deadline
//! waits for the pending entry to fire, which re-reads `poll_at` (a cheap no-op egress). Stale
//! entries are recognised by slot generation and deadline and skipped.

use std::cmp::Reverse;
use std::net::Ipv4Addr;

use pgline_nic::Queue;
use smoltcp::socket::tcp::State;
use smoltcp::time::Instant as SInstant;

use super::conn::{Origin, TxOut};
use super::{arp, wire, Stack, MAX_SEGMENTS_PER_FLUSH, MAX_TX_BACKLOG};

impl<Q: Queue> Stack<Q> {
    /// Runs egress for every dirty connection.
    pub(super) fn dispatch_dirty(&mut self, t: u64) {
        let now = SInstant::from_micros(t as i64);
        let mut list = std::mem::take(&mut self.dirty);
        std::mem::swap(&mut self.dirty, &mut self.dirty_spare);
        for &slot in &list {
            let c = &mut self.conns[slot as usize];
            if c.key.is_none() || !c.dirty {
                continue;
            }
            c.dirty = false;
            self.dispatch_conn(slot, now, t);
        }
        list.clear();
        self.dirty_spare = list;
    }

    /// Egress for one connection, then its timer or its release.
    fn dispatch_conn(&mut self, slot: u32, now: SInstant, t: u64) {
        let c = &mut self.conns[slot as usize];
        if c.mac.is_none() {
            c.mac = self.arp.lookup(c.next_hop);
            if c.mac.is_none() {
                self.wait_for_arp(slot, t);
                return;
            }
        }
        let returned = self.stats.tcp_rx_grants_returned;
        let at = self.egress_conn(slot, now, t);
        // It announced a zero window for want of a receive buffer, or gave back a buffer it was
        // granted and did not use.
        let starved = self.wait_if_rx_starved(slot);
        if (starved || self.stats.tcp_rx_grants_returned != returned)
            && self.pools.rx.available() > 0
        {
            // A buffer came back in this same flush.
            self.serve_waiters();
        }
        let c = &mut self.conns[slot as usize];
        let state = c.state();
        if matches!(state, State::Closed | State::TimeWait) {
            let report = c.announced || c.origin == Origin::Active;
            self.release(slot, report);
            return;
        }
        self.schedule(slot, at, t);
    }

    /// Lets the socket emit up to [`MAX_SEGMENTS_PER_FLUSH`] segments (smoltcp emits one per
    /// call); returns when smoltcp next wants to run (`poll_at`).
    ///
    /// After each segment `poll_at` says whether another is due now; only then is egress called
    /// again. (Calling egress until it emits nothing costs a full no-op `dispatch` per visit,
    /// more than `poll_at`, and the deadline is needed for the timer anyway.)
    pub(super) fn egress_conn(&mut self, slot: u32, now: SInstant, t: u64) -> Option<u64> {
        let c = &mut self.conns[slot as usize];
        for _ in 0..MAX_SEGMENTS_PER_FLUSH {
            let out = TxOut {
                queue: &mut self.queue,
                tx: &mut self.tx,
                scratch: &mut self.scratch,
                stats: &mut self.stats,
                link: self.link,
                pools: &mut self.pools,
            };
            let sent = c.egress(now, out);
            let at = c.poll_at(now);
            if !sent || at.is_none_or(|at| at > t) {
                return at;
            }
        }
        c.poll_at(now)
    }

    /// Puts the connection's next deadline on the heap (or back on the dirty list if it is due).
    fn schedule(&mut self, slot: u32, at: Option<u64>, t: u64) {
        let Some(at) = at else {
            return;
        };
        if at <= t {
            // smoltcp still has something to send now (segment budget used up): next flush.
            self.mark_dirty(slot);
            return;
        }
        let c = &mut self.conns[slot as usize];
        if c.timer.is_none_or(|cur| at < cur || cur < t) {
            c.timer = Some(at);
            self.timers.push(Reverse((at, slot, c.gen)));
        }
    }

    /// Due timers mark their connections dirty; ARP retries. True if anything fell due.
    pub(super) fn poll_timers(&mut self, t: u64) -> bool {
        let mut any = false;
        while let Some(&Reverse((at, slot, gen))) = self.timers.peek() {
            if at > t {
                break;
            }
            self.timers.pop();
            let c = &mut self.conns[slot as usize];
            if c.gen != gen || c.key.is_none() || c.timer != Some(at) {
                continue;
            }
            c.timer = None;
            any = true;
            self.mark_dirty(slot);
        }
        // Stale entries can pile up only if deadlines keep moving earlier; rebuild if so.
        if self.timers.len() > 4 * self.conns.len() + 1024 {
            self.rebuild_timers();
        }
        if self.arp.next_deadline().is_some_and(|d| d <= t) {
            self.retry_arp(t);
            any = true;
        }
        any
    }

    fn rebuild_timers(&mut self) {
        self.timers.clear();
        for (slot, c) in self.conns.iter().enumerate() {
            if let (Some(at), Some(_)) = (c.timer, c.key) {
                self.timers.push(Reverse((at, slot as u32, c.gen)));
            }
        }
    }

    /// One TX burst; frames the ring did not take wait for the next flush, within a bound.
    pub(super) fn dispatch_tx(&mut self) {
        if self.tx.is_empty() {
            return;
        }
        let sent = self.queue.tx_burst(&mut self.tx);
        self.stats.tx_frames += sent as u64;
        if self.tx.len() > MAX_TX_BACKLOG {
            self.stats.tx_dropped_ring += (self.tx.len() - MAX_TX_BACKLOG) as u64;
            self.tx.truncate(MAX_TX_BACKLOG);
        }
    }

    /// Parks a connection until its next hop answers ARP.
    fn wait_for_arp(&mut self, slot: u32, t: u64) {
        let id = self.id_of(slot);
        let c = &mut self.conns[slot as usize];
        if c.arp_wait {
            return;
        }
        let hop = c.next_hop;
        match self.arp.start(hop, t) {
            Ok(send) => {
                self.conns[slot as usize].arp_wait = true;
                self.arp_waiters.push(id);
                if send {
                    self.send_arp_request(hop);
                }
            }
            Err(()) => {
                self.stats.arp_failed += 1;
                self.release(slot, true);
            }
        }
    }

    fn send_arp_request(&mut self, ip: Ipv4Addr) {
        let req = wire::Arp {
            op: wire::ARP_REQUEST,
            sender_mac: self.mac,
            sender_ip: self.cfg.ip,
            target_mac: [0; 6],
            target_ip: ip,
        };
        if self.emit_arp(wire::BROADCAST, &req) {
            self.stats.arp_requests_sent += 1;
        }
    }

    /// Retries due ARP requests; gives up on next hops asked too often (their connections close).
    fn retry_arp(&mut self, t: u64) {
        let mut i = 0;
        while i < self.arp.resolving.len() {
            let r = self.arp.resolving[i];
            if r.next_try_us > t {
                i += 1;
                continue;
            }
            if r.tries >= arp::MAX_TRIES {
                self.arp.resolving.swap_remove(i);
                self.stats.arp_failed += 1;
                self.fail_arp_waiters(r.ip);
                continue;
            }
            self.arp.resolving[i].tries += 1;
            self.arp.resolving[i].next_try_us = t + arp::RETRY_US;
            self.send_arp_request(r.ip);
            i += 1;
        }
    }

    /// The next hop answered: its connections go back to egress.
    pub(super) fn wake_arp_waiters(&mut self, ip: Ipv4Addr, mac: [u8; 6]) {
        let mut waiters = std::mem::take(&mut self.arp_waiters);
        waiters.retain(|&id| {
            let Some(slot) = self.live(id) else {
                return false;
            };
            if self.conns[slot].next_hop != ip {
                return true;
            }
            let c = &mut self.conns[slot];
            c.mac = Some(mac);
            c.arp_wait = false;
            self.mark_dirty(slot as u32);
            false
        });
        self.arp_waiters = waiters;
    }

    fn fail_arp_waiters(&mut self, ip: Ipv4Addr) {
        let mut waiters = std::mem::take(&mut self.arp_waiters);
        waiters.retain(|&id| {
            let Some(slot) = self.live(id) else {
                return false;
            };
            if self.conns[slot].next_hop != ip {
                return true;
            }
            self.release(slot as u32, true);
            false
        });
        self.arp_waiters = waiters;
    }
}
