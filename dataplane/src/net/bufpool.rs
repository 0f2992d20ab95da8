//! The per-core pools of connection buffers for our own TCP (`NetConfig::owned_tcp`, issue 16).
//!
//! Purpose: an idle established connection holds no data buffer. Its receive ring takes a buffer
//! from [`Pools::rx`] when a segment with data arrives and gives it back once the owner has read
//! everything; its send ring takes one from [`Pools::tx`] when the owner writes and gives it
//! back once the peer has acknowledged everything. Memory then follows the connections that
//! are moving bytes, not the connections that are open.
//!
//! Place on the path: `tcp.rs`'s rings call [`Ring::push`] / [`Ring::consume`], which take and
//! return buffers; the stack (`net/mod.rs`) keeps the connections that found a pool dry in FIFO
//! wait lists and hands them buffers as they come back (`Stack::serve_waiters`).
//!
//! Invariants:
//! - every buffer lives in one slab allocated when the stack is made: taking and returning a
//!   buffer is a push/pop on a preallocated free list (no allocation on the hit path); pages of
//!   the slab become resident only once a buffer is used, so RSS follows the peak number of
//!   buffers in use, not the pool size;
//! - a ring holds at most one buffer, and holds it exactly while it has bytes (or was handed one
//!   by a wait list); a buffer is never in a ring and on the free list at once;
//! - receive and send buffers are separate pools: a send buffer comes back when the peer ACKs,
//!   which needs no receive buffer, so a core whose receive buffers are all held by connections
//!   waiting to write cannot starve its writes (and the other way round).
//!
//! When a pool is dry: a connection without a receive buffer announces a zero window and data
//! it is sent is not accepted (not stored, not acknowledged: the peer keeps it and retransmits);
//! a connection without a send buffer takes no bytes from its owner (`send` returns
//! `Err(Full)`, `Writable` follows). Either waits in FIFO order for a buffer; nothing is dropped
//! that was acknowledged, and nothing panics.

/// A fixed number of equal buffers in one slab, handed out by index.
pub struct BufPool {
    size: usize,
    slab: Box<[u8]>,
    free: Vec<u32>,
    /// Times a connection found the pool dry and waited (`note_dry`).
    dry: u64,
    /// Fewest free buffers seen (the peak in use is `count - low`).
    low: usize,
}

impl BufPool {
    /// `count` buffers of `size` bytes (the slab is reserved, not touched).
    pub fn new(size: usize, count: usize) -> BufPool {
        BufPool {
            size,
            slab: vec![0u8; size * count].into_boxed_slice(),
            // Handed out from the end: buffer 0 first, so a lightly used pool touches its first
            // pages only.
            free: (0..count as u32).rev().collect(),
            dry: 0,
            low: count,
        }
    }

    /// Buffers free now.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Buffers in the pool.
    pub fn count(&self) -> usize {
        self.slab.len().checked_div(self.size).unwrap_or(0)
    }

    /// What the pool holds and held.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            buffers: self.count(),
            in_use: self.count() - self.free.len(),
            peak_in_use: self.count() - self.low,
            dry: self.dry,
        }
    }

    fn take(&mut self) -> Option<u32> {
        match self.free.pop() {
            Some(i) => {
                self.low = self.low.min(self.free.len());
                Some(i)
            }
            None => None,
        }
    }

    /// A connection found the pool dry and waits for a buffer.
    pub fn note_dry(&mut self) {
        self.dry += 1;
    }

    fn give(&mut self, i: u32) {
        self.free.push(i);
    }

    fn buf(&self, i: u32) -> &[u8] {
        let start = i as usize * self.size;
        &self.slab[start..start + self.size]
    }

    fn buf_mut(&mut self, i: u32) -> &mut [u8] {
        let start = i as usize * self.size;
        &mut self.slab[start..start + self.size]
    }
}

/// A pool's figures (`Stack::buffer_pools`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub buffers: usize,
    pub in_use: usize,
    /// Most buffers in use at once so far.
    pub peak_in_use: usize,
    /// Times a connection found the pool dry.
    pub dry: u64,
}

/// One stack's receive and send pools.
pub struct Pools {
    pub rx: BufPool,
    pub tx: BufPool,
}

impl Pools {
    /// `count` receive buffers of `rx_size` bytes and `count` send buffers of `tx_size`.
    pub fn new(rx_size: usize, tx_size: usize, count: usize) -> Pools {
        Pools {
            rx: BufPool::new(rx_size, count),
            tx: BufPool::new(tx_size, count),
        }
    }
}

/// A byte ring over a pool buffer: holds one only while it has bytes to keep.
pub struct Ring {
    buf: Option<u32>,
    cap: usize,
    head: usize,
    len: usize,
}

impl Ring {
    /// An empty ring of `cap` bytes (its pool's buffer size) that holds no buffer yet.
    pub fn new(cap: usize) -> Ring {
        Ring {
            buf: None,
            cap,
            head: 0,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Whether the ring holds a pool buffer.
    pub fn held(&self) -> bool {
        self.buf.is_some()
    }

    /// Bytes `push` would take now: the free part of its buffer, or a whole buffer if the pool
    /// has one to give.
    pub fn room(&self, pool: &BufPool) -> usize {
        if self.buf.is_some() || pool.available() > 0 {
            self.cap - self.len
        } else {
            0
        }
    }

    /// Takes a buffer from `pool` if the ring holds none (a wait list handing one over); false
    /// if the pool is dry.
    pub fn reserve(&mut self, pool: &mut BufPool) -> bool {
        if self.buf.is_none() {
            self.buf = pool.take();
        }
        self.buf.is_some()
    }

    /// Gives the buffer back and empties the ring.
    pub fn clear(&mut self, pool: &mut BufPool) {
        if let Some(i) = self.buf.take() {
            pool.give(i);
        }
        self.head = 0;
        self.len = 0;
    }

    /// Appends as much of `data` as fits (taking a buffer first if needed); returns how much.
    pub fn push(&mut self, pool: &mut BufPool, data: &[u8]) -> usize {
        if data.is_empty() || !self.reserve(pool) {
            return 0;
        }
        let Some(i) = self.buf else { return 0 };
        let n = data.len().min(self.cap - self.len);
        let cap = self.cap;
        let tail = wrap(self.head + self.len, cap);
        let first = n.min(cap - tail);
        let buf = pool.buf_mut(i);
        buf[tail..tail + first].copy_from_slice(&data[..first]);
        buf[..n - first].copy_from_slice(&data[first..n]);
        self.len += n;
        n
    }

    /// Drops `n` bytes from the front; a ring emptied by it gives its buffer back (dropping
    /// nothing keeps a buffer that a wait list just handed over).
    pub fn consume(&mut self, pool: &mut BufPool, n: usize) {
        let n = n.min(self.len);
        if n == 0 {
            return;
        }
        self.len -= n;
        if self.len == 0 {
            self.clear(pool);
        } else {
            self.head = wrap(self.head + n, self.cap);
        }
    }

    /// Copies `out.len()` bytes starting `offset` bytes after the front (all must be present).
    pub fn read_at(&self, pool: &BufPool, offset: usize, out: &mut [u8]) {
        let Some(i) = self.buf else { return };
        let buf = pool.buf(i);
        let cap = self.cap;
        let start = wrap(self.head + offset, cap);
        let first = out.len().min(cap - start);
        out[..first].copy_from_slice(&buf[start..start + first]);
        let rest = out.len() - first;
        out[first..].copy_from_slice(&buf[..rest]);
    }

    /// Moves up to `max` bytes from the front to `out`; returns how many.
    pub fn pop_into(&mut self, pool: &mut BufPool, out: &mut Vec<u8>, max: usize) -> usize {
        let n = max.min(self.len);
        let Some(i) = self.buf.filter(|_| n > 0) else {
            return 0;
        };
        let buf = pool.buf(i);
        let first = n.min(self.cap - self.head);
        out.extend_from_slice(&buf[self.head..self.head + first]);
        out.extend_from_slice(&buf[..n - first]);
        self.consume(pool, n);
        n
    }
}

/// `i` modulo `cap` for `i < 2 * cap` (positions in a ring: a compare instead of a division
/// on the per-segment path).
#[inline]
fn wrap(i: usize, cap: usize) -> usize {
    if i >= cap {
        i - cap
    } else {
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_take_buffers_on_demand_and_give_them_back_when_drained() {
        let mut pool = BufPool::new(8, 2);
        let (mut a, mut b, mut c) = (Ring::new(8), Ring::new(8), Ring::new(8));
        assert_eq!(a.room(&pool), 8, "an empty ring may take a whole buffer");
        assert!(!a.held());
        assert_eq!(a.push(&mut pool, b"hello"), 5);
        assert_eq!(
            b.push(&mut pool, b"0123456789"),
            8,
            "a ring takes what fits"
        );
        assert_eq!(pool.available(), 0);
        assert_eq!(c.room(&pool), 0, "dry: no room without a buffer");
        assert_eq!(c.push(&mut pool, b"x"), 0);
        // Wrap around inside a held buffer.
        let mut out = Vec::new();
        assert_eq!(a.pop_into(&mut pool, &mut out, 3), 3);
        assert_eq!(a.push(&mut pool, b"world!"), 6);
        let mut peek = [0u8; 8];
        a.read_at(&pool, 0, &mut peek);
        assert_eq!(&peek, b"loworld!");
        out.clear();
        assert_eq!(a.pop_into(&mut pool, &mut out, 100), 8);
        assert_eq!(out, b"loworld!");
        assert!(!a.held(), "drained: the buffer went back");
        assert_eq!(pool.available(), 1);
        assert_eq!(
            c.push(&mut pool, b"x"),
            1,
            "the freed buffer serves the next ring"
        );
        b.consume(&mut pool, 8);
        c.clear(&mut pool);
        assert_eq!(pool.available(), 2);
        assert_eq!(pool.stats().peak_in_use, 2);
        assert_eq!(pool.stats().in_use, 0);
    }
}
