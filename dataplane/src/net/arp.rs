//! The neighbor cache (IPv4 → MAC) and the list of next hops being resolved.
//!
//! Small and fixed: [`CACHE_SIZE`] entries (the oldest is replaced), [`MAX_RESOLVING`] next hops
//! resolved at once. A lookup is a linear scan of a few entries; it runs only when a connection
//! starts (accepted connections learn their peer's MAC from the SYN's frame) or an ARP message
//! arrives, never per data packet.
//!
//! Limitations: entries do not expire (a peer that changes MAC is learned again only from its
//! own ARP traffic); requests are retried every [`RETRY_US`] up to [`MAX_TRIES`] times.

use std::net::Ipv4Addr;

pub const CACHE_SIZE: usize = 64;
pub const MAX_RESOLVING: usize = 16;
pub const RETRY_US: u64 = 1_000_000;
pub const MAX_TRIES: u8 = 3;

#[derive(Clone, Copy, Debug)]
struct Entry {
    ip: Ipv4Addr,
    mac: [u8; 6],
    stamp: u64,
}

/// A next hop whose MAC is being asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resolving {
    pub ip: Ipv4Addr,
    pub next_try_us: u64,
    pub tries: u8,
}

#[derive(Debug, Default)]
pub struct Arp {
    entries: Vec<Entry>,
    clock: u64,
    pub resolving: Vec<Resolving>,
}

impl Arp {
    pub fn new() -> Arp {
        Arp {
            entries: Vec::with_capacity(CACHE_SIZE),
            clock: 0,
            resolving: Vec::with_capacity(MAX_RESOLVING),
        }
    }

    pub fn lookup(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        self.entries.iter().find(|e| e.ip == ip).map(|e| e.mac)
    }

    /// Records `ip → mac`; true if a resolution was waiting for it.
    pub fn learn(&mut self, ip: Ipv4Addr, mac: [u8; 6]) -> bool {
        if ip.is_unspecified() || ip.is_broadcast() || mac[0] & 1 != 0 {
            return false;
        }
        self.clock += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.ip == ip) {
            e.mac = mac;
            e.stamp = self.clock;
        } else if self.entries.len() < CACHE_SIZE {
            self.entries.push(Entry {
                ip,
                mac,
                stamp: self.clock,
            });
        } else if let Some(old) = self.entries.iter_mut().min_by_key(|e| e.stamp) {
            *old = Entry {
                ip,
                mac,
                stamp: self.clock,
            };
        }
        let before = self.resolving.len();
        self.resolving.retain(|r| r.ip != ip);
        self.resolving.len() != before
    }

    /// Starts resolving `ip`. Returns `Ok(true)` when a request should go out now, `Ok(false)`
    /// when one is already on its way, `Err(())` when too many next hops are being resolved.
    pub fn start(&mut self, ip: Ipv4Addr, now_us: u64) -> Result<bool, ()> {
        if self.resolving.iter().any(|r| r.ip == ip) {
            return Ok(false);
        }
        if self.resolving.len() >= MAX_RESOLVING {
            return Err(());
        }
        self.resolving.push(Resolving {
            ip,
            next_try_us: now_us + RETRY_US,
            tries: 1,
        });
        Ok(true)
    }

    /// Earliest retry deadline.
    pub fn next_deadline(&self) -> Option<u64> {
        self.resolving.iter().map(|r| r.next_try_us).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learn_lookup_replace_and_resolve() {
        let mut arp = Arp::new();
        let ip = |n: u32| Ipv4Addr::from(0x0a00_0000 + n);
        assert_eq!(arp.start(ip(1), 0), Ok(true));
        assert_eq!(arp.start(ip(1), 5), Ok(false));
        assert!(
            arp.learn(ip(1), [2, 0, 0, 0, 0, 1]),
            "a resolution was waiting"
        );
        assert!(arp.resolving.is_empty());
        assert_eq!(arp.lookup(ip(1)), Some([2, 0, 0, 0, 0, 1]));
        assert!(
            !arp.learn(ip(9), [1, 0, 0, 0, 0, 1]),
            "multicast MAC ignored"
        );
        assert_eq!(arp.lookup(ip(9)), None);
        for n in 2..=CACHE_SIZE as u32 + 1 {
            arp.learn(ip(n), [2, 0, 0, 0, 0, n as u8]);
        }
        assert_eq!(arp.lookup(ip(1)), None, "oldest replaced");
        assert_eq!(
            arp.lookup(ip(CACHE_SIZE as u32 + 1)).map(|m| m[5]),
            Some(65)
        );
        for n in 0..MAX_RESOLVING as u32 {
            assert_eq!(arp.start(ip(1000 + n), 0), Ok(true));
        }
        assert_eq!(arp.start(ip(5000), 0), Err(()));
    }
}
