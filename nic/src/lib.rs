//! Packet ports for the userspace dataplane.
//!
//! A port has one RX/TX queue pair per dataplane core. A core owns its [`Queue`] outright (no
//! sharing, no locks): it receives frames in bursts, writes replies into buffers it allocates from
//! the same queue, and transmits them in bursts. Two backends implement these traits:
//!
//! - DPDK (`dpdk` feature): a `-sys` crate over the system `libdpdk`, mbufs from a per-port pool;
//! - the in-memory pair: two ends joined by lock-free rings, for tests and the dataplane bench.
//!
//! Invariants every backend keeps:
//! - `rx_burst` and `tx_burst` never block and never allocate on the heap once the queue is set up
//!   (the burst vectors are the caller's and keep their capacity);
//! - a [`Packet`] is owned by whoever holds it: dropping it returns its buffer to the pool it came
//!   from, transmitting it hands it to the port;
//! - frames are whole Ethernet frames without the FCS.

#![deny(unsafe_code)]

#[cfg(feature = "dpdk")]
pub mod dpdk;
pub mod mem;

/// One frame buffer, owned by the caller between receive (or alloc) and transmit (or drop).
pub trait Packet: Send {
    /// The frame bytes.
    fn data(&self) -> &[u8];
    /// The frame bytes, writable.
    fn data_mut(&mut self) -> &mut [u8];
    /// Sets the frame length; bytes past the old length are unspecified. `len <= capacity()`.
    fn set_len(&mut self, len: usize);
    /// The largest frame this buffer holds.
    fn capacity(&self) -> usize;
    /// Asks the device to fill in the IPv4 header and TCP/UDP checksums on transmit (only when
    /// [`Offloads::tx_checksum`] is set; the caller then leaves them as the pseudo-header sum the
    /// device expects). `l2_len` and `l3_len` are the Ethernet and IP header lengths.
    fn request_tx_checksum(&mut self, l2_len: u16, l3_len: u16) {
        let _ = (l2_len, l3_len);
    }
}

/// What the device does for the stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offloads {
    /// IPv4 and TCP checksums computed by the device on transmit.
    pub tx_checksum: bool,
    /// Received frames' checksums verified by the device (bad ones dropped or flagged).
    pub rx_checksum: bool,
}

/// One RX/TX queue pair, owned by one dataplane core.
pub trait Queue: Send {
    type Packet: Packet;

    /// Receives up to `max` frames, appending them to `out`. Returns how many arrived.
    fn rx_burst(&mut self, out: &mut Vec<Self::Packet>, max: usize) -> usize;

    /// An empty buffer for a frame to transmit, or `None` when the pool is exhausted.
    fn alloc(&mut self) -> Option<Self::Packet>;

    /// Transmits frames from the front of `pkts`, removing those the device took. Frames left in
    /// `pkts` were not taken (TX ring full): the caller retries them next turn or drops them.
    fn tx_burst(&mut self, pkts: &mut Vec<Self::Packet>) -> usize;

    /// Offloads this queue's device provides.
    fn offloads(&self) -> Offloads;

    /// The port's MAC address.
    fn mac(&self) -> [u8; 6];

    /// The largest frame (Ethernet header included, FCS excluded) the port sends or receives.
    fn max_frame(&self) -> usize {
        1514
    }
}
