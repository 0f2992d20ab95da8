//! placeholder
pub mod wal;
