//! The userspace stack's end-to-end tests (`net_stack.rs`) with our own TCP on the server and
//! smoltcp's on the client: handshake, 1,000 concurrent echo connections, 1-5 % loss, duplication
//! and reordering, RST, SYN floods, half-open timeouts, window exhaustion.

#[path = "net_stack.rs"]
mod net_stack;
