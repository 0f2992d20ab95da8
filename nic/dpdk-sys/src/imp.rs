//! The bindings and the Rust rewrites of DPDK's per-packet inlines (built when `libdpdk` is found).

#[allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    unsafe_op_in_unsafe_fn,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
mod bindings {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}

pub use bindings::*;

/// `RTE_ETH_TX_OFFLOAD_IPV4_CKSUM`.
pub const TX_OFFLOAD_IPV4_CKSUM: u64 = 1 << 1;
/// `RTE_ETH_TX_OFFLOAD_UDP_CKSUM`.
pub const TX_OFFLOAD_UDP_CKSUM: u64 = 1 << 2;
/// `RTE_ETH_TX_OFFLOAD_TCP_CKSUM`.
pub const TX_OFFLOAD_TCP_CKSUM: u64 = 1 << 3;
/// `RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE`.
pub const TX_OFFLOAD_MBUF_FAST_FREE: u64 = 1 << 16;
/// `RTE_ETH_RX_OFFLOAD_IPV4_CKSUM`.
pub const RX_OFFLOAD_IPV4_CKSUM: u64 = 1 << 1;
/// `RTE_ETH_RX_OFFLOAD_UDP_CKSUM`.
pub const RX_OFFLOAD_UDP_CKSUM: u64 = 1 << 2;
/// `RTE_ETH_RX_OFFLOAD_TCP_CKSUM`.
pub const RX_OFFLOAD_TCP_CKSUM: u64 = 1 << 3;
/// `RTE_ETH_RSS_IPV4`.
pub const RSS_IPV4: u64 = 1 << 2;
/// `RTE_ETH_RSS_FRAG_IPV4`.
pub const RSS_FRAG_IPV4: u64 = 1 << 3;
/// `RTE_ETH_RSS_NONFRAG_IPV4_TCP`.
pub const RSS_NONFRAG_IPV4_TCP: u64 = 1 << 4;
/// `RTE_ETH_RSS_NONFRAG_IPV4_UDP`.
pub const RSS_NONFRAG_IPV4_UDP: u64 = 1 << 5;
/// `RTE_ETH_RSS_NONFRAG_IPV4_OTHER`.
pub const RSS_NONFRAG_IPV4_OTHER: u64 = 1 << 7;

/// `rte_errno` of the calling thread (a thread-local in C, read through `shim.c`).
pub fn rte_errno() -> i32 {
    // SAFETY: `pgline_rte_errno` only reads the calling thread's errno slot; it has no
    // preconditions and is valid before `rte_eal_init` too.
    unsafe { pgline_rte_errno() }
}

/// `rte_pktmbuf_mtod(m, uint8_t *)`: the first byte of the mbuf's data.
///
/// # Safety
/// `m` points to a valid `rte_mbuf`.
#[inline(always)]
pub unsafe fn pktmbuf_mtod(m: *const rte_mbuf) -> *mut u8 {
    // SAFETY: the caller guarantees `m` is a valid mbuf; `data_off` is within its buffer.
    unsafe { (*m).buf_addr.cast::<u8>().add(usize::from((*m).data_off)) }
}

/// Bytes from the start of the data to the end of the buffer (`rte_pktmbuf_data_room` less
/// the headroom in use): the most one segment can hold from where its data starts.
///
/// # Safety
/// `m` points to a valid `rte_mbuf`.
#[inline(always)]
pub unsafe fn pktmbuf_room(m: *const rte_mbuf) -> usize {
    // SAFETY: the caller guarantees `m` is a valid mbuf.
    unsafe { usize::from((*m).buf_len).saturating_sub(usize::from((*m).data_off)) }
}

/// Sets the tx offload lengths `l2_len` (7 bits) and `l3_len` (9 bits) of `m->tx_offload`,
/// keeping its other fields.
///
/// # Safety
/// `m` points to a valid `rte_mbuf` the caller owns.
#[inline(always)]
pub unsafe fn pktmbuf_set_l2_l3_len(m: *mut rte_mbuf, l2_len: u16, l3_len: u16) {
    const MASK: u64 = (1 << 16) - 1;
    let lens = (u64::from(l2_len) & 0x7f) | ((u64::from(l3_len) & 0x1ff) << 7);
    // SAFETY: the caller owns a valid mbuf; `tx_offload` is a plain u64 view of the union.
    unsafe {
        let off = &mut (*m).__bindgen_anon_3.tx_offload;
        *off = (*off & !MASK) | lens;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tx_offload_lengths_land_in_the_bitfields() {
        let mut m = rte_mbuf::default();
        // SAFETY: `m` is a local, valid (zeroed) mbuf struct.
        unsafe { pktmbuf_set_l2_l3_len(&mut m, 14, 20) };
        // SAFETY: reading the bitfield view of the union just written.
        let (l2, l3) = unsafe {
            let b = &m.__bindgen_anon_3.__bindgen_anon_1;
            (b.l2_len(), b.l3_len())
        };
        assert_eq!((l2, l3), (14, 20));
    }

    #[test]
    fn mtod_adds_data_off() {
        let mut buf = [0u8; 256];
        let m = rte_mbuf {
            buf_addr: buf.as_mut_ptr().cast(),
            data_off: 128,
            buf_len: 256,
            ..Default::default()
        };
        // SAFETY: `m` describes `buf`, which outlives the calls.
        let (p, room) = unsafe { (pktmbuf_mtod(&m), pktmbuf_room(&m)) };
        assert_eq!(p, buf[128..].as_mut_ptr());
        assert_eq!(room, 128);
    }

    #[test]
    fn errno_is_readable_before_eal_init() {
        let _ = rte_errno();
    }
}
