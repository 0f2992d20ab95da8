//! Per-task counters and latency histograms, merged at the end of a run.
//!
//! Latencies are recorded in nanoseconds (hdrhistogram, 3 significant digits, 1 ns .. 100 s;
//! longer values saturate) and reported in microseconds.
//!
//! # Thread model
//! Each client or writer task owns a [`Tally`]; the runner merges them after the tasks end.

#![deny(unsafe_code)]

use hdrhistogram::Histogram;
use std::time::Duration;

const HIGHEST_NS: u64 = 100_000_000_000;

/// Counters and histograms of one task.
pub struct Tally {
    /// Requests completed inside the measured window (the throughput basis).
    pub requests: u64,
    /// Requests that failed (error reply, protocol or I/O error).
    pub errors: u64,
    /// Keys found (a non-nil reply, a row returned, a cache-aside GET hit).
    pub hits: u64,
    /// Keys not found (a nil reply, no row, a cache-aside miss that went to the origin).
    pub misses: u64,
    /// Open loop: requests due inside the window but never sent before it closed.
    pub unsent: u64,
    /// Latency of each request that started (was due in open loop, was sent in closed loop)
    /// inside the window, whenever it completed.
    pub latency: Histogram<u64>,
    /// Open loop: how late each batch left after its first request was due.
    pub send_lag: Histogram<u64>,
}

impl Tally {
    /// An empty tally.
    pub fn new() -> Self {
        let hist = || {
            Histogram::new_with_bounds(1, HIGHEST_NS, 3).expect("static histogram bounds are valid")
        };
        Tally {
            requests: 0,
            errors: 0,
            hits: 0,
            misses: 0,
            unsent: 0,
            latency: hist(),
            send_lag: hist(),
        }
    }

    /// Records one request's latency.
    pub fn record(&mut self, latency: Duration) {
        self.latency.saturating_record(nanos(latency));
    }

    /// Records how late a send was.
    pub fn record_lag(&mut self, lag: Duration) {
        self.send_lag.saturating_record(nanos(lag));
    }

    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &Tally) {
        self.requests += other.requests;
        self.errors += other.errors;
        self.hits += other.hits;
        self.misses += other.misses;
        self.unsent += other.unsent;
        // Same bounds on both sides: add cannot fail except on overflow of a count.
        let _ = self.latency.add(&other.latency);
        let _ = self.send_lag.add(&other.send_lag);
    }
}

impl Default for Tally {
    fn default() -> Self {
        Self::new()
    }
}

/// Latency summary in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Quantiles {
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest value.
    pub max_us: f64,
}

/// p50/p99/p99.9/max of `h` in microseconds (zeros when empty).
pub fn quantiles(h: &Histogram<u64>) -> Quantiles {
    if h.is_empty() {
        return Quantiles::default();
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    Quantiles {
        p50_us: us(h.value_at_quantile(0.50)),
        p99_us: us(h.value_at_quantile(0.99)),
        p999_us: us(h.value_at_quantile(0.999)),
        max_us: us(h.max()),
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_in_microseconds_and_merge_adds() {
        let mut a = Tally::new();
        for us in 1..=1000u64 {
            a.record(Duration::from_micros(us));
            a.requests += 1;
        }
        let mut b = Tally::new();
        b.record(Duration::from_millis(50));
        b.requests += 1;
        b.errors = 2;
        a.merge(&b);
        assert_eq!(a.requests, 1001);
        assert_eq!(a.errors, 2);
        let q = quantiles(&a.latency);
        assert!((q.p50_us - 501.0).abs() <= 1.0, "{q:?}");
        assert!((q.p99_us - 991.0).abs() <= 1.0, "{q:?}");
        assert!((q.max_us - 50_000.0).abs() <= 50.0, "{q:?}");
        assert_eq!(quantiles(&Tally::new().latency), Quantiles::default());
    }
}
