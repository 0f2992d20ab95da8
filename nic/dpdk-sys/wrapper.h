/* Headers bindgen reads for pgline-dpdk-sys, plus the hand-written shim's declarations. */
#ifndef PGLINE_DPDK_WRAPPER_H
#define PGLINE_DPDK_WRAPPER_H

#include <rte_config.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_mempool.h>
#include <rte_mbuf.h>
#include <rte_mbuf_pool_ops.h>
#include <rte_ether.h>
#include <rte_ethdev.h>

/* rte_errno is a per-lcore (thread-local) variable: bindgen cannot reach it, so read it here. */
int pgline_rte_errno(void);

/* A packet-mbuf pool with its objects packed back to back (see shim.c). */
struct rte_mempool *pgline_pktmbuf_pool_create_packed(const char *name, unsigned int n,
						      unsigned int cache, uint16_t data_room,
						      int socket);

/* How far a pool's objects reach from its first memory chunk, in objects (see shim.c). */
unsigned long pgline_mempool_span_objects(struct rte_mempool *mp);

#endif
