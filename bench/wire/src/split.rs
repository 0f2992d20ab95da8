//! One in-memory port shared by several client stacks, each with its own IPv4 address.
//!
//! Purpose: a client stack names a connection by (server address, server port, its own port),
//! and takes its own ports from an ephemeral range of [`PORTS_PER_STACK`]; one address cannot
//! open more connections than that to the one server port. Runs of more connections (the
//! 100,000-connection cell) use several client stacks on one port: [`ClientQueue::Part`]
//! hands each stack the frames addressed to it.
//!
//! Place: between the client's stacks and the client end of the port pair (`mem::pair`); the
//! server's end is untouched. Transmit goes straight through; receive pulls a burst from the
//! port and sorts it by destination address (IPv4) or target address (ARP) into per-stack
//! backlogs. Frames addressed to no stack go to the first one (which drops them as any stack
//! drops frames not for it).
//!
//! Invariants: the backlogs hold only frames of the port's pool, so they are bounded by it.
//! Thread model: the stacks sharing a port run on one thread (the client's); the mutex is
//! never contended and only makes the queues `Send` as [`Queue`] requires.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use pgline_nic::mem::{MemPacket, MemQueue};
use pgline_nic::{Offloads, Queue};

/// Ports one client stack takes its connections from (its ephemeral range, 49152-65535).
pub const PORTS_PER_STACK: usize = 16_384;
/// Connections given to one client stack by default (below [`PORTS_PER_STACK`], leaving room
/// for ports still in TIME-WAIT from an earlier run's close).
pub const CONNS_PER_STACK: usize = 16_000;

/// A client stack's queue: the whole port, or its part of a shared one.
pub enum ClientQueue {
    Whole(MemQueue),
    Part(SplitQueue),
}

/// One stack's view of a shared port.
pub struct SplitQueue {
    shared: Arc<Mutex<Split>>,
    index: usize,
}

struct Split {
    queue: MemQueue,
    ips: Vec<[u8; 4]>,
    backlogs: Vec<VecDeque<MemPacket>>,
    burst: Vec<MemPacket>,
}

/// Queues for stacks at `ips` sharing `queue`: one [`ClientQueue::Whole`] for a single
/// address, else one [`ClientQueue::Part`] per address, in order.
pub fn client_queues(queue: MemQueue, ips: &[Ipv4Addr]) -> Vec<ClientQueue> {
    if ips.len() == 1 {
        return vec![ClientQueue::Whole(queue)];
    }
    let shared = Arc::new(Mutex::new(Split {
        queue,
        ips: ips.iter().map(|ip| ip.octets()).collect(),
        backlogs: ips.iter().map(|_| VecDeque::new()).collect(),
        burst: Vec::new(),
    }));
    (0..ips.len())
        .map(|index| {
            ClientQueue::Part(SplitQueue {
                shared: shared.clone(),
                index,
            })
        })
        .collect()
}

impl Split {
    /// Moves one burst from the port into the backlogs.
    fn pull(&mut self, max: usize) {
        self.queue.rx_burst(&mut self.burst, max);
        for p in self.burst.drain(..) {
            let i = owner(&self.ips, pgline_nic::Packet::data(&p));
            self.backlogs[i].push_back(p);
        }
    }
}

/// The stack a frame is for: its IPv4 destination, or the address an ARP frame asks about.
fn owner(ips: &[[u8; 4]], frame: &[u8]) -> usize {
    let at = match frame.get(12..14) {
        Some([0x08, 0x00]) => 30,
        Some([0x08, 0x06]) => 38,
        _ => return 0,
    };
    frame
        .get(at..at + 4)
        .and_then(|ip| ips.iter().position(|x| x == ip))
        .unwrap_or(0)
}

impl SplitQueue {
    fn split(&self) -> std::sync::MutexGuard<'_, Split> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Queue for ClientQueue {
    type Packet = MemPacket;

    fn rx_burst(&mut self, out: &mut Vec<MemPacket>, max: usize) -> usize {
        match self {
            ClientQueue::Whole(q) => q.rx_burst(out, max),
            ClientQueue::Part(p) => {
                let index = p.index;
                let mut s = p.split();
                if s.backlogs[index].is_empty() {
                    s.pull(max);
                }
                let backlog = &mut s.backlogs[index];
                let n = backlog.len().min(max);
                out.extend(backlog.drain(..n));
                n
            }
        }
    }

    fn alloc(&mut self) -> Option<MemPacket> {
        match self {
            ClientQueue::Whole(q) => q.alloc(),
            ClientQueue::Part(p) => p.split().queue.alloc(),
        }
    }

    fn tx_burst(&mut self, pkts: &mut Vec<MemPacket>) -> usize {
        match self {
            ClientQueue::Whole(q) => q.tx_burst(pkts),
            ClientQueue::Part(p) => p.split().queue.tx_burst(pkts),
        }
    }

    fn offloads(&self) -> Offloads {
        match self {
            ClientQueue::Whole(q) => q.offloads(),
            ClientQueue::Part(p) => p.split().queue.offloads(),
        }
    }

    fn mac(&self) -> [u8; 6] {
        match self {
            ClientQueue::Whole(q) => q.mac(),
            ClientQueue::Part(p) => p.split().queue.mac(),
        }
    }

    fn max_frame(&self) -> usize {
        match self {
            ClientQueue::Whole(q) => q.max_frame(),
            ClientQueue::Part(p) => p.split().queue.max_frame(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ethertype: [u8; 2], at: usize, ip: [u8; 4]) -> Vec<u8> {
        let mut f = vec![0u8; 64];
        f[12..14].copy_from_slice(&ethertype);
        f[at..at + 4].copy_from_slice(&ip);
        f
    }

    #[test]
    fn frames_go_to_the_stack_of_their_address() {
        let ips = [[10, 0, 0, 2], [10, 0, 0, 3]];
        assert_eq!(owner(&ips, &frame([0x08, 0x00], 30, [10, 0, 0, 3])), 1);
        assert_eq!(owner(&ips, &frame([0x08, 0x00], 30, [10, 0, 0, 2])), 0);
        assert_eq!(owner(&ips, &frame([0x08, 0x06], 38, [10, 0, 0, 3])), 1);
        // Not for any stack, not IPv4 or ARP, or cut short: the first stack drops it.
        assert_eq!(owner(&ips, &frame([0x08, 0x00], 30, [10, 0, 0, 9])), 0);
        assert_eq!(owner(&ips, &frame([0x86, 0xdd], 30, [10, 0, 0, 3])), 0);
        assert_eq!(owner(&ips, &[0x08; 20]), 0);
    }
}
