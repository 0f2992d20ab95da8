//! pgline's dataplane: everything on the request path that does not talk to the origin.
//!
//! - [`store`]: the fixed-budget, single-writer / many-reader cache in a hugepage region.
//! - [`resp`]: the RESP2/RESP3 codec (requests borrow from the input buffer, replies are composed
//!   straight into the output buffer).
//! - [`pgwire`]: the PostgreSQL wire protocol 3.0 codec (server side) and statement
//!   classification for the cache (authentication is relayed to the origin, not checked here).
//! - [`row`]: how a row is laid out in the store's sections.
//! - [`keyspace`]: key names (`users:42`) to store keys (table id, pk text).
//! - [`plane`]: the typed queues and shared counters between the cores and the control plane.
//! - [`transport`]: how bytes reach a core: kernel sockets (mio) or a userspace TCP stack over
//!   a DPDK or in-memory port.
//! - [`net`]: the userspace network stack (Ethernet, ARP, IPv4, ICMP, TCP) over a `pgline_nic` queue.
//! - [`engine`]: the per-core poll loop tying them together.
//!
//! Dependencies point one way: `resp` and `store` know nothing of each other or of I/O;
//! `transport` knows nothing of protocols; `engine` ties them together.

#![deny(unsafe_code)]

pub mod cluster;
pub mod engine;
pub mod keyspace;
pub mod net;
pub mod pgwire;
pub mod plane;
pub mod resp;
pub mod row;
pub mod store;
pub mod transport;
