//! One direction of one core's traffic with the control plane: a bounded lock-free queue with
//! an ordered overflow behind it, and the one full-queue policy of the plane.
//!
//! - A request that may be refused ([`Lane::try_push`]: a RESP miss, a PostgreSQL step) is
//!   refused while the queue is full, and the sender decides (`-BUSY`, or retry the step in a
//!   later turn). The core is never blocked.
//! - A message that must arrive ([`Lane::push`]: every reply, a session's Close) is never
//!   refused: when the queue is full it waits in the overflow, behind which every later message
//!   waits too, so each sender's messages keep their order. The receiver takes the overflow
//!   after the queue ([`Lane::pop`]).
//!
//! The overflow is a `Mutex<VecDeque>` touched only while it holds something; its flag is one
//! relaxed-cost `Acquire` load on the receiver's empty-queue path. Senders of must-arrive
//! messages are bounded elsewhere (miss replies by the misses in flight; relayed PostgreSQL
//! replies by each session's flow-control window, [`super::PG_FLOW_WINDOW`]).
//!
//! Thread model: many senders, one receiver.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crossbeam_queue::ArrayQueue;

pub(crate) struct Lane<T> {
    queue: ArrayQueue<T>,
    overflow: Mutex<VecDeque<T>>,
    /// The overflow is not empty (changed only under its lock).
    overflowing: AtomicBool,
}

impl<T> Lane<T> {
    pub fn new(capacity: usize) -> Self {
        Lane {
            queue: ArrayQueue::new(capacity.max(1)),
            overflow: Mutex::new(VecDeque::new()),
            overflowing: AtomicBool::new(false),
        }
    }

    fn overflow(&self) -> std::sync::MutexGuard<'_, VecDeque<T>> {
        self.overflow.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `item` unless the queue is full (or messages wait in the overflow, which would
    /// then overtake it): the item comes back.
    #[inline]
    pub fn try_push(&self, item: T) -> Result<(), T> {
        if self.overflowing.load(Ordering::Acquire) {
            return Err(item);
        }
        self.queue.push(item)
    }

    /// Queues `item`; when the queue is full, in the overflow (never refused).
    pub fn push(&self, item: T) {
        let item = match self.try_push(item) {
            Ok(()) => return,
            Err(item) => item,
        };
        let mut overflow = self.overflow();
        overflow.push_back(item);
        self.overflowing.store(true, Ordering::Release);
    }

    /// The next message: the queue's, then the overflow's.
    #[inline]
    pub fn pop(&self) -> Option<T> {
        if let Some(item) = self.queue.pop() {
            return Some(item);
        }
        if !self.overflowing.load(Ordering::Acquire) {
            return None;
        }
        let mut overflow = self.overflow();
        let item = overflow.pop_front();
        if overflow.is_empty() {
            self.overflowing.store(false, Ordering::Release);
        }
        item
    }

    /// Messages waiting (queue and overflow).
    pub fn len(&self) -> usize {
        let waiting = if self.overflowing.load(Ordering::Acquire) {
            self.overflow().len()
        } else {
            0
        };
        self.queue.len() + waiting
    }

    /// Nothing waits (queue and overflow); without taking the overflow's lock.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty() && !self.overflowing.load(Ordering::Acquire)
    }

    /// The queue's bound (the overflow has none).
    pub fn capacity(&self) -> usize {
        self.queue.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_refuses_try_push_and_keeps_push_in_order() {
        let lane = Lane::new(2);
        lane.try_push(1).unwrap();
        lane.push(2);
        assert_eq!(lane.try_push(3), Err(3));
        lane.push(3);
        lane.push(4);
        assert_eq!(lane.len(), 4);
        // Space in the queue again, but 3 and 4 wait: 5 must not overtake them.
        assert_eq!(lane.pop(), Some(1));
        assert_eq!(lane.try_push(5), Err(5));
        lane.push(5);
        let rest: Vec<_> = std::iter::from_fn(|| lane.pop()).collect();
        assert_eq!(rest, [2, 3, 4, 5]);
        assert_eq!(lane.len(), 0);
        lane.try_push(6).unwrap();
        assert_eq!(lane.pop(), Some(6));
    }

    #[test]
    fn each_sender_keeps_its_order_under_contention() {
        let lane = std::sync::Arc::new(Lane::new(4));
        let senders: Vec<_> = (0..4u64)
            .map(|s| {
                let lane = lane.clone();
                std::thread::spawn(move || {
                    for i in 0..2_000u64 {
                        lane.push((s, i));
                    }
                })
            })
            .collect();
        let mut next = [0u64; 4];
        let mut seen = 0;
        while seen < 8_000 {
            if let Some((s, i)) = lane.pop() {
                assert_eq!(i, next[s as usize], "sender {s} out of order");
                next[s as usize] += 1;
                seen += 1;
            } else {
                std::thread::yield_now();
            }
        }
        for t in senders {
            t.join().unwrap();
        }
        assert_eq!(lane.pop(), None);
    }
}
