//! pgline's control plane: configuration, the origin catalog and fills, the WAL consumer, the
//! store's single writer, and start-up of the whole appliance.
//!
//! Thread model: one tokio runtime. The store writer is one task (so the store has one writer and
//! one order of events); fills run as tasks over a pooled set of origin connections; the WAL
//! consumer is one task feeding the writer through a bounded channel. The dataplane cores are
//! plain threads that reach this crate only through `pgline_dataplane::plane`.
#![deny(unsafe_code)]

pub mod admin;
pub mod advise;
pub mod api;
pub mod catalog;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod corefill;
#[cfg(feature = "dpdk")]
pub mod dpdk_port;
pub mod fill;
pub mod keytext;
pub mod lsn;
pub mod metrics;
pub mod origin;
pub mod pgfront;
pub mod result_plane;
pub mod rowjson;
pub mod server;
pub mod wal;
pub mod writer;
