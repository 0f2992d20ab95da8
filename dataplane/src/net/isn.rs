//! Initial sequence numbers as RFC 6528 makes them: a clock plus a keyed hash of the connection.
//!
//! Purpose: an off-path attacker who can guess a connection's sequence numbers can inject data
//! into it or reset it. `ISN = M + F(local address, local port, remote address, remote port,
//! secret)`, where `M` ticks every 4 µs and `F` is a pseudorandom function keyed by a secret
//! drawn from the operating system's randomness when the stack starts. Another connection's
//! numbers then say nothing about this one's, and a new incarnation of the same four-tuple still
//! starts past the old one's numbers (the clock moved on), as TIME-WAIT at the peer expects.
//!
//! `F` is the standard library's keyed SipHash ([`RandomState`]: keys from the OS, per
//! process). `M` is wall-clock based (microseconds since the Unix epoch at start plus the
//! stack's monotonic clock), so a restarted appliance does not start its numbers over.
//!
//! Place on the path: once per connection (a SYN accepted, or an active open); never per
//! segment. Thread model: owned by one core's stack.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::Ipv4Addr;
use std::time::{SystemTime, UNIX_EPOCH};

use super::conn::FlowKey;

/// The secret and the clock's base of one stack.
pub(super) struct IsnGen {
    secret: RandomState,
    /// Microseconds since the Unix epoch when the stack started.
    base_us: u64,
}

impl IsnGen {
    pub fn new() -> IsnGen {
        IsnGen {
            secret: RandomState::new(),
            base_us: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
        }
    }

    /// The initial sequence number of the connection `key` on `local`, `now_us` microseconds
    /// after the stack started.
    pub fn isn(&self, local: Ipv4Addr, key: FlowKey, now_us: u64) -> u32 {
        let f = self.secret.hash_one((
            u32::from(local),
            key.local_port,
            key.remote_ip,
            key.remote_port,
        )) as u32;
        let m = (self.base_us.wrapping_add(now_us) / 4) as u32;
        f.wrapping_add(m)
    }

    /// A 64-bit seed from the same secret (for a generator that needs one, such as smoltcp's).
    pub fn seed(&self, salt: u64) -> u64 {
        self.secret.hash_one(salt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(remote_port: u16) -> FlowKey {
        FlowKey {
            remote_ip: u32::from(Ipv4Addr::new(10, 0, 0, 2)),
            remote_port,
            local_port: 6379,
        }
    }

    const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

    #[test]
    fn the_same_connection_later_starts_past_its_earlier_numbers() {
        let g = IsnGen::new();
        let a = g.isn(LOCAL, key(40000), 1_000);
        let b = g.isn(LOCAL, key(40000), 1_000 + 400_000);
        // 400 ms at one tick per 4 µs.
        assert_eq!(b.wrapping_sub(a), 100_000);
    }

    #[test]
    fn two_stacks_on_the_same_address_do_not_share_numbers() {
        // The secret comes from the OS, not from the stack's address: two appliances (or one
        // restarted) configured alike do not give the same numbers to the same connection.
        let (g, h) = (IsnGen::new(), IsnGen::new());
        let same = (0..64u16)
            .filter(|&p| g.isn(LOCAL, key(40000 + p), 0) == h.isn(LOCAL, key(40000 + p), 0))
            .count();
        assert!(same <= 1, "{same} of 64 connections got the same number");
    }

    #[test]
    fn neighbouring_connections_do_not_reveal_each_other() {
        // Consecutive client ports at the same instant: the differences between their numbers
        // are not a constant step (a counter or a linear generator would show one).
        let g = IsnGen::new();
        let isns: Vec<u32> = (0..64u16)
            .map(|p| g.isn(LOCAL, key(40000 + p), 0))
            .collect();
        let steps: std::collections::HashSet<u32> =
            isns.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
        assert!(steps.len() > 60, "only {} distinct steps", steps.len());
    }
}
