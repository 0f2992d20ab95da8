/*
 * Hand-written part of pgline-dpdk-sys (the inline burst/alloc/free functions get generated
 * wrappers from bindgen's wrap_static_fns; see build.rs).
 *
 * 1. rte_errno is a thread-local macro, not a symbol Rust can name: read it through a function.
 * 2. Flag constants that DPDK defines through function-like macros (RTE_BIT64) cannot be
 *    evaluated by bindgen, so src/lib.rs spells them out; the static asserts below fail the build
 *    if the installed DPDK disagrees with those values.
 */
#include "wrapper.h"

int pgline_rte_errno(void)
{
	return rte_errno;
}

#define PGLINE_CHECK(name, value) _Static_assert((name) == (value), #name " changed")

PGLINE_CHECK(RTE_ETH_TX_OFFLOAD_IPV4_CKSUM, 1ULL << 1);
PGLINE_CHECK(RTE_ETH_TX_OFFLOAD_UDP_CKSUM, 1ULL << 2);
PGLINE_CHECK(RTE_ETH_TX_OFFLOAD_TCP_CKSUM, 1ULL << 3);
PGLINE_CHECK(RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE, 1ULL << 16);
PGLINE_CHECK(RTE_ETH_RX_OFFLOAD_IPV4_CKSUM, 1ULL << 1);
PGLINE_CHECK(RTE_ETH_RX_OFFLOAD_UDP_CKSUM, 1ULL << 2);
PGLINE_CHECK(RTE_ETH_RX_OFFLOAD_TCP_CKSUM, 1ULL << 3);
PGLINE_CHECK(RTE_ETH_RSS_IPV4, 1ULL << 2);
PGLINE_CHECK(RTE_ETH_RSS_FRAG_IPV4, 1ULL << 3);
PGLINE_CHECK(RTE_ETH_RSS_NONFRAG_IPV4_TCP, 1ULL << 4);
PGLINE_CHECK(RTE_ETH_RSS_NONFRAG_IPV4_UDP, 1ULL << 5);
PGLINE_CHECK(RTE_ETH_RSS_NONFRAG_IPV4_OTHER, 1ULL << 7);
PGLINE_CHECK(RTE_ETH_MQ_RX_RSS_FLAG, 1);
PGLINE_CHECK(RTE_ETH_LINK_UP, 1);
PGLINE_CHECK(RTE_MBUF_F_TX_TCP_CKSUM, 1ULL << 52);
PGLINE_CHECK(RTE_MBUF_F_TX_UDP_CKSUM, 3ULL << 52);
PGLINE_CHECK(RTE_MBUF_F_TX_IP_CKSUM, 1ULL << 54);
PGLINE_CHECK(RTE_MBUF_F_TX_IPV4, 1ULL << 55);
PGLINE_CHECK(RTE_MBUF_DEFAULT_BUF_SIZE, 2048 + 128);
