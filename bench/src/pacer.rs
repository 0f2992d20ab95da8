//! The open-loop pacer: one OS thread that wakes each connection's task at its due times.
//!
//! tokio's timer has 1 ms resolution, which at µs-scale latencies would put up to a millisecond
//! of client-side lateness into every open-loop figure. The pacer walks the global slot train
//! of [`crate::schedule::Schedule`] (slot `k` due at `t0 + k/rate`, owned by connection
//! `k % conns`) with `std::thread::sleep` (nanosleep: the kernel's timer slack, ~50 µs, instead
//! of 1 ms), optionally spinning the last `spin` of each wait, and at each due time calls
//! `notify_one` on the owning connection's [`Notify`]. A task that is still busy with an
//! earlier reply keeps the permit and finds the request due when it looks again; latency is
//! always measured from the due time, so the pacer's own lateness is charged, not hidden.
//!
//! # Thread model
//! One std thread per run, ending at `end`; client tasks wait on their `Notify` and re-check
//! the clock (a permit can be stale), so no wake-up is lost and none is trusted blindly.

#![deny(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Starts the pacer thread.
pub fn spawn(
    t0: Instant,
    end: Instant,
    rate: f64,
    notifies: Vec<Arc<Notify>>,
    spin: Duration,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("pgline-bench-pacer".into())
        .spawn(move || pace(t0, end, rate, &notifies, spin))
}

fn slot_time(t0: Instant, rate: f64, k: u64) -> Instant {
    t0 + Duration::from_secs_f64(k as f64 / rate)
}

fn pace(t0: Instant, end: Instant, rate: f64, notifies: &[Arc<Notify>], spin: Duration) {
    let conns = notifies.len() as u64;
    if conns == 0 {
        return;
    }
    let mut k = 0u64;
    loop {
        let due = slot_time(t0, rate, k);
        if due >= end {
            return;
        }
        let now = Instant::now();
        if due > now {
            let wait = due - now;
            if wait > spin {
                std::thread::sleep(wait - spin);
            }
            while Instant::now() < due {
                std::hint::spin_loop();
            }
        }
        // Release every slot due by now; one round of notifies covers every connection.
        let now = Instant::now();
        let mut released = 0u64;
        while released < conns {
            let t = slot_time(t0, rate, k);
            if t > now || t >= end {
                break;
            }
            notifies[(k % conns) as usize].notify_one();
            k += 1;
            released += 1;
        }
        if released == conns {
            let caught_up = ((now - t0).as_secs_f64() * rate).ceil() as u64;
            k = k.max(caught_up);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each connection is woken about rate/conns times a second, close to its due times.
    #[test]
    fn wakes_each_connection_on_schedule() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let conns = 4usize;
        let notifies: Vec<Arc<Notify>> = (0..conns).map(|_| Arc::new(Notify::new())).collect();
        let t0 = Instant::now() + Duration::from_millis(10);
        let end = t0 + Duration::from_millis(300);
        let rate = 400.0; // 100/s per connection, a wake every 10 ms each
        let h = spawn(t0, end, rate, notifies.clone(), Duration::ZERO).unwrap();
        let counts = rt.block_on(async {
            let mut tasks = Vec::new();
            for n in notifies {
                tasks.push(tokio::spawn(async move {
                    // Counted until well after the schedule ends (a gap in the wakes is the
                    // pacer descheduled, not the end).
                    let stop = end + Duration::from_secs(1);
                    let mut wakes = 0u32;
                    let left = || stop.saturating_duration_since(Instant::now());
                    while tokio::time::timeout(left(), n.notified()).await.is_ok() {
                        wakes += 1;
                        assert!(Instant::now() >= t0, "woken before the first slot");
                    }
                    wakes
                }));
            }
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        });
        h.join().unwrap();
        // 30 slots per connection. Never more wakes than slots; fewer only when this thread or
        // the pacer was descheduled (the pacer then skips slots it is late for, and Notify
        // coalesces permits), which on a loaded 2-vCPU machine has cost up to a few wakes.
        for c in counts {
            assert!(
                (15..=31).contains(&c),
                "about 30 wakes expected per connection: {c}"
            );
        }
    }
}
