//! `net_zero_alloc.rs` with our own TCP on both stacks (server and client): steady-state
//! request/response and connection churn allocate nothing.

#[path = "net_zero_alloc.rs"]
mod net_zero_alloc;
