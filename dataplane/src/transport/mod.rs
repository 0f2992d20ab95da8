//! Transports: how bytes reach a core. They know nothing of RESP or the store.
//!
//! - [`kernel`]: kernel TCP sockets, one `SO_REUSEPORT` listener per core (the default, works
//!   anywhere).
//! - The userspace path (DPDK port + userspace TCP) is issue 3 and plugs in beside it.

pub mod kernel;
