/*
 * Hand-written part of pgline-dpdk-sys (the inline burst/alloc/free functions get generated
 * wrappers from bindgen's wrap_static_fns; see build.rs).
 *
 * 1. rte_errno is a thread-local macro, not a symbol Rust can name: read it through a function.
 * 2. pgline_pktmbuf_pool_create_packed: a packet-mbuf pool whose objects lie back to back
 *    (see its comment below).
 * 3. Flag constants that DPDK defines through function-like macros (RTE_BIT64) cannot be
 *    evaluated by bindgen, so src/lib.rs spells them out; the static asserts below fail the build
 *    if the installed DPDK disagrees with those values.
 */
#include "wrapper.h"

int pgline_rte_errno(void)
{
	return rte_errno;
}

/*
 * rte_pktmbuf_pool_create, but with RTE_MEMPOOL_F_NO_IOVA_CONTIG: the objects are packed back
 * to back, so the pool's n objects fill exactly n * (header + element) bytes from the start of
 * its single memory chunk. Without the flag, where the memory is not IOVA-contiguous (--no-huge,
 * or hugepages in IOVA-as-PA mode), DPDK keeps each object inside one page and skips the rest
 * of the page: with 4 KiB pages and 2,368-byte objects the pool spans ~1.7x that size. The
 * net_af_xdp PMD (22.11) registers only base .. base + n * object size as the AF_XDP UMEM, so
 * the objects past that end are outside the UMEM: the kernel rejects them on the fill ring
 * (invalid descriptor, the mbuf is lost) and the fill ring drains until every frame is dropped.
 * For devices that DMA into mbufs the default layout is the right one; for copying drivers
 * (af_xdp in copy mode, af_packet, tap, ring) the packed one is.
 * Returns NULL with rte_errno set on failure.
 */
struct rte_mempool *pgline_pktmbuf_pool_create_packed(const char *name, unsigned int n,
						      unsigned int cache, uint16_t data_room,
						      int socket)
{
	struct rte_pktmbuf_pool_private priv = {
		.mbuf_data_room_size = data_room,
		.mbuf_priv_size = 0,
	};
	struct rte_mempool *mp;
	int ret;

	mp = rte_mempool_create_empty(name, n, sizeof(struct rte_mbuf) + data_room, cache,
				      sizeof(priv), socket, RTE_MEMPOOL_F_NO_IOVA_CONTIG);
	if (mp == NULL)
		return NULL;
	ret = rte_mempool_set_ops_byname(mp, rte_mbuf_best_mempool_ops(), NULL);
	if (ret != 0) {
		rte_mempool_free(mp);
		rte_errno = -ret;
		return NULL;
	}
	rte_pktmbuf_pool_init(mp, &priv);
	ret = rte_mempool_populate_default(mp);
	if (ret < 0) {
		rte_mempool_free(mp);
		rte_errno = -ret;
		return NULL;
	}
	rte_mempool_obj_iter(mp, rte_pktmbuf_init, NULL);
	return mp;
}

static void pgline_span_cb(struct rte_mempool *mp, void *arg, void *obj, unsigned int i)
{
	uintptr_t *hi = arg;

	(void)mp;
	(void)i;
	if ((uintptr_t)obj > *hi)
		*hi = (uintptr_t)obj;
}

/* How far the pool's objects reach from its first memory chunk, in objects: at most
 * populated_size - 1 when they are packed (the part net_af_xdp's UMEM covers). */
unsigned long pgline_mempool_span_objects(struct rte_mempool *mp)
{
	struct rte_mempool_memhdr *first = STAILQ_FIRST(&mp->mem_list);
	size_t size = mp->header_size + mp->elt_size + mp->trailer_size;
	uintptr_t hi = 0;

	if (first == NULL || size == 0)
		return 0;
	rte_mempool_obj_iter(mp, pgline_span_cb, &hi);
	return (hi - (uintptr_t)first->addr) / size;
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
