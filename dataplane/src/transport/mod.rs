//! Transports: how bytes reach a core. They know nothing of RESP or the store.
//!
//! - [`kernel`]: kernel TCP sockets, one `SO_REUSEPORT` listener per core (the default, works
//!   anywhere).
//! - [`stream`]: what the userspace core loop needs of a userspace TCP stack (a DPDK or in-memory
//!   port under `net::Stack`), as a trait; [`net`] maps `net::Stack` onto it.

#![deny(unsafe_code)]

pub mod kernel;
pub mod net;
pub mod stream;
