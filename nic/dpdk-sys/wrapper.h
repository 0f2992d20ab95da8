/* Headers bindgen reads for pgline-dpdk-sys, plus the hand-written shim's declarations. */
#ifndef PGLINE_DPDK_WRAPPER_H
#define PGLINE_DPDK_WRAPPER_H

#include <rte_config.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_mempool.h>
#include <rte_mbuf.h>
#include <rte_ether.h>
#include <rte_ethdev.h>

/* rte_errno is a per-lcore (thread-local) variable: bindgen cannot reach it, so read it here. */
int pgline_rte_errno(void);

#endif
