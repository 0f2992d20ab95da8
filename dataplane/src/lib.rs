//! pgline's dataplane: the hugepage store, the protocol codecs, the transports and the
//! per-core poll loop.
//!
//! Dependencies point one way: codecs and the store know nothing of each other or of I/O;
//! the engine ties them together. `unsafe` is denied crate-wide and allowed only where a
//! module says so (the store's `arena`).
#![deny(unsafe_code)]

pub mod store;
