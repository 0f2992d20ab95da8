//! Mbuf pools and the owned mbuf handle, [`Mbuf`], that implements [`Packet`].

use std::ffi::CString;
use std::ptr::NonNull;

use pgline_dpdk_sys as sys;

use super::{DpdkError, Eal};
use crate::Packet;

/// Longest pool name DPDK accepts (its memzone name less the `MP_` prefix, less the NUL).
const MAX_POOL_NAME: usize = 26;
/// IPv4 header: offset of the protocol byte.
const IPV4_PROTO_OFFSET: usize = 9;
const IPPROTO_UDP: u8 = 17;

/// A pool of packet buffers (`rte_pktmbuf_pool_create`). A `Copy` handle: pools are never freed
/// before the process exits, so every [`Mbuf`] may assume its pool is alive.
#[derive(Clone, Copy, Debug)]
pub struct Mempool {
    raw: NonNull<sys::rte_mempool>,
}

// SAFETY: a packet pool uses DPDK's default mempool ops (multi-producer/multi-consumer ring),
// whose get/put are safe from any thread; the pool is never freed (see the type's doc).
unsafe impl Send for Mempool {}
// SAFETY: as for Send; `&Mempool` only allows alloc and counters, both thread-safe.
unsafe impl Sync for Mempool {}

impl Mempool {
    /// Creates a pool of `mbufs` buffers of `data_room` bytes each (headroom included; DPDK's
    /// default is 2048 + 128), with a per-lcore cache of `cache` buffers, on the caller's NUMA
    /// socket. `mbufs` is best a power of two less one.
    pub fn create(
        _eal: &Eal,
        name: &str,
        mbufs: u32,
        cache: u32,
        data_room: u16,
    ) -> Result<Mempool, DpdkError> {
        let cname = check_pool_args(name, data_room)?;
        // SAFETY: the EAL is initialized (`_eal` proves it), `cname` is a valid C string, and
        // DPDK validates the sizes itself (returning NULL with rte_errno set).
        let raw = unsafe {
            sys::rte_pktmbuf_pool_create(
                cname.as_ptr(),
                mbufs,
                cache,
                0,
                data_room,
                sys::rte_socket_id() as i32,
            )
        };
        NonNull::new(raw)
            .map(|raw| Mempool { raw })
            .ok_or_else(|| DpdkError::call("rte_pktmbuf_pool_create", -1))
    }

    /// [`Mempool::create`], with the buffers packed back to back in memory rather than each
    /// kept inside one page (DPDK's default where memory is not IOVA-contiguous, e.g.
    /// `--no-huge`). Use it for ports that never DMA into mbufs. `net_af_xdp` needs it: it
    /// registers only `mbufs * buffer size` bytes from the pool's start as the AF_XDP UMEM, so
    /// with the default layout the buffers past that end are refused by the kernel on the fill
    /// ring and RX stalls once they come round (see `docs/decisions.md`).
    pub fn create_packed(
        _eal: &Eal,
        name: &str,
        mbufs: u32,
        cache: u32,
        data_room: u16,
    ) -> Result<Mempool, DpdkError> {
        let cname = check_pool_args(name, data_room)?;
        // SAFETY: the EAL is initialized (`_eal` proves it), `cname` is a valid C string; the
        // shim returns a populated packet pool or NULL with rte_errno set.
        let raw = unsafe {
            sys::pgline_pktmbuf_pool_create_packed(
                cname.as_ptr(),
                mbufs,
                cache,
                data_room,
                sys::rte_socket_id() as i32,
            )
        };
        NonNull::new(raw)
            .map(|raw| Mempool { raw })
            .ok_or_else(|| DpdkError::call("pgline_pktmbuf_pool_create_packed", -1))
    }

    /// How far the buffers reach from the start of the pool's first memory chunk, counted in
    /// buffer sizes: `capacity - 1` when packed, more when DPDK left gaps between them.
    pub fn span(&self) -> std::ffi::c_ulong {
        // SAFETY: the pool is live; the shim only walks its object list.
        unsafe { sys::pgline_mempool_span_objects(self.raw.as_ptr()) }
    }

    /// One empty buffer, or `None` when the pool is exhausted.
    #[inline]
    pub fn alloc(&self) -> Option<Mbuf> {
        // SAFETY: the pool is a live packet pool; `rte_pktmbuf_alloc` returns a reset mbuf that
        // the caller now owns, or NULL.
        let raw = unsafe { sys::rte_pktmbuf_alloc(self.raw.as_ptr()) };
        NonNull::new(raw).map(Mbuf)
    }

    /// Appends `n` empty buffers to `out`, all or none (false when the pool has fewer than `n`).
    pub fn alloc_bulk(&self, out: &mut Vec<Mbuf>, n: usize) -> bool {
        let Ok(count) = u32::try_from(n) else {
            return false;
        };
        out.reserve(n);
        let spare = out.spare_capacity_mut();
        // SAFETY: `spare` has room for `n` pointers; Mbuf is a transparent NonNull<rte_mbuf>, so
        // its slots take the mbuf pointers DPDK writes; on success all `n` are written.
        let ret = unsafe {
            sys::rte_pktmbuf_alloc_bulk(self.raw.as_ptr(), spare.as_mut_ptr().cast(), count)
        };
        if ret != 0 {
            return false;
        }
        let len = out.len() + n;
        // SAFETY: the `n` slots past the old length were initialized with owned mbufs above.
        unsafe { out.set_len(len) };
        true
    }

    /// Buffers free in the pool (its ring plus the per-lcore caches).
    pub fn available(&self) -> u32 {
        // SAFETY: the pool is live; the call only reads counters.
        unsafe { sys::rte_mempool_avail_count(self.raw.as_ptr()) }
    }

    /// Buffers currently handed out.
    pub fn in_use(&self) -> u32 {
        // SAFETY: as for `available`.
        unsafe { sys::rte_mempool_in_use_count(self.raw.as_ptr()) }
    }

    /// Bytes each buffer holds, headroom included (`rte_pktmbuf_data_room_size`).
    pub fn data_room(&self) -> u16 {
        // SAFETY: the pool is a live packet pool, whose private area holds the data room size.
        unsafe { sys::rte_pktmbuf_data_room_size(self.raw.as_ptr()) }
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::rte_mempool {
        self.raw.as_ptr()
    }
}

/// The pool name as a C string, after checking it and the data room.
fn check_pool_args(name: &str, data_room: u16) -> Result<CString, DpdkError> {
    if name.is_empty() || name.len() > MAX_POOL_NAME {
        return Err(DpdkError::Invalid(
            "mempool name empty or longer than 26 bytes",
        ));
    }
    if usize::from(data_room) <= sys::RTE_PKTMBUF_HEADROOM as usize {
        return Err(DpdkError::Invalid("mbuf data room not above the headroom"));
    }
    CString::new(name).map_err(|_| DpdkError::Invalid("NUL in mempool name"))
}

/// One packet buffer (`rte_mbuf`), owned: dropping it frees it back to its pool, transmitting it
/// hands it to the device. Only single-segment frames are produced by this backend.
#[repr(transparent)]
#[derive(Debug)]
pub struct Mbuf(NonNull<sys::rte_mbuf>);

// SAFETY: an Mbuf is the only owner of its buffer (unique, like a Box); its pool's free path is
// thread-safe, so it may be dropped or transmitted on another thread.
unsafe impl Send for Mbuf {}

impl Mbuf {
    /// Takes ownership of a raw mbuf.
    ///
    /// # Safety
    /// `raw` is a valid, single-segment mbuf from a pool that is never freed, owned by nobody
    /// else from now on.
    pub unsafe fn from_raw(raw: NonNull<sys::rte_mbuf>) -> Mbuf {
        Mbuf(raw)
    }

    /// Gives up ownership; the caller must free or transmit the mbuf.
    pub fn into_raw(self) -> NonNull<sys::rte_mbuf> {
        let raw = self.0;
        std::mem::forget(self);
        raw
    }

    /// The port the frame arrived on (set by RX).
    pub fn port(&self) -> u16 {
        // SAFETY: self owns a valid mbuf.
        unsafe { self.0.as_ref().port }
    }

    /// The mbuf's offload flags (`RTE_MBUF_F_*`).
    pub fn ol_flags(&self) -> u64 {
        // SAFETY: self owns a valid mbuf.
        unsafe { self.0.as_ref().ol_flags }
    }

    /// The RSS hash the device computed (valid when `RTE_MBUF_F_RX_RSS_HASH` is set).
    pub fn rss_hash(&self) -> u32 {
        // SAFETY: self owns a valid mbuf; `hash.rss` is a plain u32 view of the union.
        unsafe { self.0.as_ref().__bindgen_anon_2.hash.rss }
    }

    fn data_len(&self) -> usize {
        // SAFETY: self owns a valid mbuf.
        usize::from(unsafe { self.0.as_ref().data_len })
    }
}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // SAFETY: self owns the mbuf (never freed or transmitted yet: those paths forget self);
        // its pool is alive for the whole process.
        unsafe { sys::rte_pktmbuf_free(self.0.as_ptr()) }
    }
}

impl Packet for Mbuf {
    #[inline]
    fn data(&self) -> &[u8] {
        // SAFETY: mtod..mtod+data_len is inside the mbuf's buffer (DPDK's invariant, and ours:
        // set_len keeps data_len <= room); self owns it, so nothing else writes it meanwhile.
        unsafe { std::slice::from_raw_parts(sys::pktmbuf_mtod(self.0.as_ptr()), self.data_len()) }
    }

    #[inline]
    fn data_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `data`, and `&mut self` makes the borrow unique.
        unsafe {
            std::slice::from_raw_parts_mut(sys::pktmbuf_mtod(self.0.as_ptr()), self.data_len())
        }
    }

    #[inline]
    fn set_len(&mut self, len: usize) {
        let len = len.min(self.capacity());
        // SAFETY: self owns a single-segment mbuf; `len` fits its room (<= u16::MAX as buf_len
        // is a u16), so data and packet lengths stay inside the buffer.
        unsafe {
            let m = self.0.as_mut();
            m.data_len = len as u16;
            m.pkt_len = len as u32;
        }
    }

    #[inline]
    fn capacity(&self) -> usize {
        // SAFETY: self owns a valid mbuf.
        unsafe { sys::pktmbuf_room(self.0.as_ptr()) }
    }

    fn request_tx_checksum(&mut self, l2_len: u16, l3_len: u16) {
        let proto = self
            .data()
            .get(usize::from(l2_len) + IPV4_PROTO_OFFSET)
            .copied();
        let l4 = if proto == Some(IPPROTO_UDP) {
            sys::RTE_MBUF_F_TX_UDP_CKSUM
        } else {
            sys::RTE_MBUF_F_TX_TCP_CKSUM
        };
        // SAFETY: self owns a valid mbuf; only its offload flags and lengths change.
        unsafe {
            let m = self.0.as_ptr();
            (*m).ol_flags |= sys::RTE_MBUF_F_TX_IPV4 | sys::RTE_MBUF_F_TX_IP_CKSUM | l4;
            sys::pktmbuf_set_l2_l3_len(m, l2_len, l3_len);
        }
    }
}
