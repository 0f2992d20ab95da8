//! Helpers shared by the dataplane's integration tests.
pub mod pglab;
pub mod pgorigin;
pub mod pipe;
pub mod rig;
pub mod wire;
