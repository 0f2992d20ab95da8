//! Open-loop scheduling: when each request is *meant* to be sent.
//!
//! A run offers `rate` requests/s in total over `conns` connections. Connection `c` owns the
//! global slots `k = c, c + conns, c + 2*conns, ...`, and slot `k` is due at
//! `start + k / rate`: the union of all connections' schedules is one evenly spaced train, and
//! each connection's own train has period `conns / rate`. Times are computed from the slot index
//! (never by adding periods), so rounding does not drift over a long run.
//!
//! Latency in open loop is measured from the due time, not the send time: a connection that
//! is still waiting for an earlier reply sends late, and that lateness is counted as latency
//! (coordinated omission cannot hide queueing). See `runner` for how due requests are batched.
//!
//! # Thread model
//! Plain values; each client task owns its own [`Schedule`].

#![deny(unsafe_code)]

use std::time::{Duration, Instant};

/// One connection's share of an open-loop schedule.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    start: Instant,
    rate: f64,
    conns: u64,
    conn: u64,
}

impl Schedule {
    /// Connection `conn` of `conns` sharing `rate` requests/s from `start`.
    pub fn new(start: Instant, rate: f64, conns: u64, conn: u64) -> Self {
        debug_assert!(rate > 0.0 && conn < conns);
        Schedule {
            start,
            rate,
            conns,
            conn,
        }
    }

    /// Offset from `start` of this connection's `i`-th request.
    pub fn offset(&self, i: u64) -> Duration {
        let slot = self.conn + i * self.conns;
        Duration::from_secs_f64(slot as f64 / self.rate)
    }

    /// Due time of this connection's `i`-th request.
    pub fn due(&self, i: u64) -> Instant {
        self.start + self.offset(i)
    }

    /// How many of this connection's requests are due strictly before `start + elapsed`.
    pub fn count_before(&self, elapsed: Duration) -> u64 {
        let slots = (elapsed.as_secs_f64() * self.rate).ceil() as u64; // slots k < elapsed*rate
        if slots <= self.conn {
            0
        } else {
            (slots - self.conn).div_ceil(self.conns)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_interleave_into_one_even_train() {
        let start = Instant::now();
        let (rate, conns) = (10_000.0, 7u64);
        let mut offsets: Vec<Duration> = (0..conns)
            .flat_map(|c| {
                let s = Schedule::new(start, rate, conns, c);
                (0..100).map(move |i| s.offset(i))
            })
            .collect();
        offsets.sort();
        for (k, off) in offsets.iter().enumerate() {
            let want = k as f64 / rate;
            assert!(
                (off.as_secs_f64() - want).abs() < 1e-9,
                "slot {k}: {off:?} vs {want}"
            );
        }
    }

    #[test]
    fn per_connection_period_is_conns_over_rate() {
        let s = Schedule::new(Instant::now(), 1000.0, 4, 3);
        assert_eq!(s.offset(0), Duration::from_millis(3));
        assert_eq!(s.offset(1), Duration::from_millis(7));
        // No drift after a million requests (one hour at this rate).
        let far = s.offset(1_000_000).as_secs_f64();
        assert!((far - 4000.003).abs() < 1e-6, "{far}");
    }

    #[test]
    fn count_before_matches_the_due_times() {
        let start = Instant::now();
        for conns in [1u64, 3, 16] {
            for c in 0..conns {
                let s = Schedule::new(start, 2500.0, conns, c);
                for ms in [0u64, 1, 2, 5, 17, 1000] {
                    let e = Duration::from_millis(ms);
                    let brute = (0..10_000).take_while(|&i| s.offset(i) < e).count() as u64;
                    assert_eq!(s.count_before(e), brute, "conns {conns} c {c} at {ms} ms");
                }
            }
        }
    }

    /// Total offered load: over a window, all connections together schedule rate*window.
    #[test]
    fn offered_load_is_the_rate() {
        let start = Instant::now();
        let total: u64 = (0..64)
            .map(|c| Schedule::new(start, 30_000.0, 64, c).count_before(Duration::from_secs(2)))
            .sum();
        assert_eq!(total, 60_000);
    }
}
