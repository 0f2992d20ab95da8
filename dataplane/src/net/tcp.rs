//! Our own TCP for one connection (`NetConfig::owned_tcp`): a compact state machine with a fast
//! path for the common case of an established connection.
//!
//! Purpose: smoltcp's socket costs ~2,500 instructions per request in building, parsing and
//! dispatching segments through a one-socket `Interface`, and its state is private, so a fast path
//! beside it cannot stay in sync with it (docs/decisions.md, issue 16). This module owns the whole
//! connection instead.
//!
//! Place on the path: `ingress.rs` parses Ethernet/IPv4/TCP and hands the segment to
//! [`Tcb::process`]; `egress.rs` asks [`Tcb::poll_at`] when the connection next wants to run and
//! [`Tcb::dispatch`] for one segment at a time, written straight into a port buffer.
//!
//! What it does: passive and active open (MSS and window scale options), in-order data in both
//! directions, cumulative ACKs, delayed ACK (an ACK rides on the reply when one follows within
//! [`super::ACK_DELAY`]), retransmission on a timer with exponential backoff (RFC 6298 estimator,
//! Karn's rule) and on three duplicate ACKs (go-back-N from the first unacknowledged byte), a
//! 1-byte window probe when the peer's window is zero, FIN in both directions, RST in and out, an
//! inactivity timeout while anything is unacknowledged. Out-of-order data is dropped and a
//! duplicate ACK sent at once (the peer retransmits).
//!
//! Header prediction ([`Tcb::process`], as in BSD's `tcp_input`): an ESTABLISHED connection, a
//! segment with only ACK (and PSH), `seq == rcv_nxt`, an ACK within `snd_una..=snd_max`, the same
//! window, no retransmission in progress and room for the payload: the ACK and the payload are
//! taken in a few comparisons. Everything else goes through the general path, which gives the
//! same result for those segments (`tests/tcp_differential.rs` checks it on recorded traces).
//!
//! Invariants:
//! - `snd_una <= snd_nxt <= snd_max` (sequence order); the send ring holds the bytes from
//!   `data_base` (the first unacknowledged data byte) on, so unacknowledged data is never lost;
//! - the receive ring never takes more than it announced; `rcv_nxt` moves only over bytes stored;
//! - nothing here panics on a segment's contents; timers are plain deadlines (µs since the stack's
//!   epoch) read by `poll_at`.
//!
//! Limitations: no SACK, no timestamps, no out-of-order queue, TIME-WAIT is not kept (the stack
//! frees the slot; see `net/mod.rs`), no congestion window (the peer's window is the only limit:
//! this serves request/response traffic on a LAN).

use smoltcp::socket::tcp::State;

use super::bufpool::{Pools, Ring};
use super::wire::{TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN};

/// PSH flag (accepted by the fast path, set on what we send with data).
pub const TCP_PSH: u8 = 0x08;
/// First retransmission timeout before any RTT sample.
const RTO_INITIAL_US: u64 = 1_000_000;
const RTO_MIN_US: u64 = 20_000;
const RTO_MAX_US: u64 = 10_000_000;
/// The MSS assumed when the peer's SYN names none (RFC 9293).
const DEFAULT_MSS: u16 = 536;
/// A receive buffer granted to a connection whose peer then sends nothing into it goes back to
/// the pool after this long (the peer may have died; it is refused and waits again if it comes
/// back while the pool is dry).
pub const RX_GRANT_UNUSED_US: u64 = 1_000_000;

/// The fields of a received segment the state machine reads.
#[derive(Clone, Copy, Debug)]
pub struct Seg {
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    /// The raw window field (before scaling).
    pub window: u16,
    /// MSS option (SYN only).
    pub mss: Option<u16>,
    /// Window scale option (SYN only).
    pub wscale: Option<u8>,
}

/// The header of a segment to send (payload, if any, follows from the send ring).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Out {
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
    /// MSS and window scale options (on SYN and SYN-ACK).
    pub syn_opts: Option<(u16, Option<u8>)>,
    /// Offset into the send ring and length of the payload.
    pub data_off: usize,
    pub data_len: usize,
    /// Below the highest sequence number sent before.
    pub retransmit: bool,
}

fn lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}
fn le(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) <= 0
}

/// One connection's TCP state.
pub struct Tcb {
    pub state: State,
    pub rx: Ring,
    pub tx: Ring,
    /// The fast path may be used (off only for the differential test).
    pub fast_path: bool,
    /// Data arrived while the receive pool was dry and was not accepted: the stack puts the
    /// connection on its wait list (and clears this).
    pub rx_starved: bool,
    /// Data was refused for want of a receive buffer: the peer holds it and, having no reason
    /// to send it before its retransmission timer (seconds, backed off), needs a nudge.
    refused: bool,
    /// Duplicate ACKs still to send after a window update that follows refused data: three
    /// make the peer retransmit at once (fast retransmit, RFC 5681) instead of on its timer.
    nudge: u8,
    /// The receive buffer granted for refused data goes back unused at this deadline.
    grant_until: Option<u64>,
    /// Aborted because the peer acknowledged none of our data for `stall_timeout_us` (the
    /// stack counts it and clears this).
    pub stalled: bool,
    /// Since when the send ring has held data with no byte of it acknowledged.
    stall_since: Option<u64>,
    /// Limit on `stall_since`: a slow or stopped reader holds a pooled send buffer at most
    /// this long (`u64::MAX`: none).
    stall_timeout_us: u64,
    our_mss: u16,
    mss: usize,
    iss: u32,
    snd_una: u32,
    snd_nxt: u32,
    snd_max: u32,
    /// Sequence number of `tx`'s first byte.
    data_base: u32,
    snd_wnd: u32,
    snd_wl1: u32,
    snd_wl2: u32,
    snd_shift: u8,
    rcv_nxt: u32,
    rcv_shift: u8,
    /// Whether window scaling is in use (both SYNs carried the option).
    wscale_ok: bool,
    /// The right edge we last announced.
    rcv_adv: u32,
    /// `close` was called: FIN after the queued data.
    fin_queued: bool,
    /// Peer's FIN taken.
    fin_received: bool,
    /// Send an ACK now / by this deadline.
    ack_now: bool,
    ack_at: Option<u64>,
    /// Bytes received since the last ACK we sent.
    unacked_rx: usize,
    rst_pending: bool,
    rto_us: u64,
    srtt_us: u64,
    rttvar_us: u64,
    backoff: u32,
    rto_at: Option<u64>,
    /// The sequence number being timed and when it was sent (Karn: cleared on retransmission).
    rtt_probe: Option<(u32, u64)>,
    dup_acks: u8,
    /// Inactivity limit while something is unacknowledged or the handshake is open.
    timeout_us: u64,
    last_rx: u64,
    ack_delay_us: u64,
}

impl Tcb {
    pub fn new(rx_cap: usize, tx_cap: usize, our_mss: u16, ack_delay_us: u64) -> Tcb {
        Tcb {
            state: State::Closed,
            rx: Ring::new(rx_cap),
            tx: Ring::new(tx_cap),
            fast_path: true,
            rx_starved: false,
            refused: false,
            nudge: 0,
            grant_until: None,
            stalled: false,
            stall_since: None,
            stall_timeout_us: u64::MAX,
            our_mss,
            mss: usize::from(DEFAULT_MSS),
            iss: 0,
            snd_una: 0,
            snd_nxt: 0,
            snd_max: 0,
            data_base: 0,
            snd_wnd: 0,
            snd_wl1: 0,
            snd_wl2: 0,
            snd_shift: 0,
            rcv_nxt: 0,
            rcv_shift: 0,
            wscale_ok: false,
            rcv_adv: 0,
            fin_queued: false,
            fin_received: false,
            ack_now: false,
            ack_at: None,
            unacked_rx: 0,
            rst_pending: false,
            rto_us: RTO_INITIAL_US,
            srtt_us: 0,
            rttvar_us: 0,
            backoff: 0,
            rto_at: None,
            rtt_probe: None,
            dup_acks: 0,
            timeout_us: u64::MAX,
            last_rx: 0,
            ack_delay_us,
        }
    }

    /// Back to a fresh CLOSED connection (the slot is reused).
    fn reset(&mut self, p: &mut Pools, iss: u32, now: u64) {
        let (fast, stall) = (self.fast_path, self.stall_timeout_us);
        let (our_mss, delay) = (self.our_mss, self.ack_delay_us);
        self.free_buffers(p);
        let rx = std::mem::replace(&mut self.rx, Ring::new(0));
        let tx = std::mem::replace(&mut self.tx, Ring::new(0));
        *self = Tcb {
            rx,
            tx,
            ..Tcb::new(0, 0, our_mss, delay)
        };
        self.fast_path = fast;
        self.stall_timeout_us = stall;
        self.iss = iss;
        self.snd_una = iss;
        self.snd_nxt = iss;
        self.snd_max = iss;
        self.data_base = iss.wrapping_add(1);
        self.last_rx = now;
        let mut shift = 0u8;
        while (self.rx.cap() >> shift) > 65535 && shift < 14 {
            shift += 1;
        }
        self.rcv_shift = shift;
    }

    /// Gives both rings' buffers back to the pools (the connection is gone).
    pub fn free_buffers(&mut self, p: &mut Pools) {
        self.rx.clear(&mut p.rx);
        self.tx.clear(&mut p.tx);
    }

    /// Waits for a SYN (the slot was armed by the accept path).
    pub fn listen(&mut self, p: &mut Pools, iss: u32, now: u64) {
        self.reset(p, iss, now);
        self.state = State::Listen;
    }

    /// Active open: a SYN goes out with the next dispatch.
    pub fn connect(&mut self, p: &mut Pools, iss: u32, now: u64) {
        self.reset(p, iss, now);
        self.wscale_ok = true;
        self.state = State::SynSent;
    }

    pub fn set_timeout(&mut self, us: u64) {
        self.timeout_us = us;
    }

    /// Aborts the connection when the peer acknowledges none of our queued data for `us`
    /// (zero window or silence): the bound on how long a slow reader holds a send buffer.
    pub fn set_stall_timeout(&mut self, us: u64) {
        self.stall_timeout_us = us;
    }

    pub fn may_recv(&self) -> bool {
        matches!(
            self.state,
            State::Established | State::FinWait1 | State::FinWait2
        ) || self.rx.len() > 0
    }

    pub fn may_send(&self) -> bool {
        matches!(self.state, State::Established | State::CloseWait) && !self.fin_queued
    }

    /// Takes bytes to send; returns how many fit (0 while the send pool is dry).
    pub fn send(&mut self, p: &mut Pools, data: &[u8]) -> usize {
        self.tx.push(&mut p.tx, data)
    }

    /// Reads up to `max` received bytes into `out` (a drained ring gives its buffer back).
    pub fn recv(&mut self, p: &mut Pools, out: &mut Vec<u8>, max: usize) -> usize {
        let n = self.rx.pop_into(&mut p.rx, out, max);
        // Announce a window that opened by a useful amount (RFC 1122 receiver-side SWS rule).
        let edge = self.rcv_nxt.wrapping_add(self.window(p));
        let grown = edge.wrapping_sub(self.rcv_adv) as i32;
        if n > 0 && grown >= (self.mss.min(self.rx.cap() / 2)) as i32 {
            self.ack_now = true;
        }
        n
    }

    /// A connection waited for a receive buffer and one came back. If it refused data, the
    /// buffer is taken now (its peer holds that data and will send it) and the window update is
    /// followed by three duplicate ACKs, so the peer retransmits at once. If it only announced a
    /// zero window, it takes nothing: the update offers what the pool has, and a peer that then
    /// finds the pool dry again is refused and waits with a claim. (Reserving for an announcer
    /// would let connections whose peers have nothing to send hold every buffer.) False if it
    /// can no longer receive, or holds a buffer already.
    pub fn grant_rx(&mut self, p: &mut Pools, now: u64) -> bool {
        if !self.receiving() || self.rx.held() {
            return false;
        }
        if self.refused {
            if !self.rx.reserve(&mut p.rx) {
                return false;
            }
            self.refused = false;
            self.nudge = 3;
            self.grant_until = Some(now.saturating_add(RX_GRANT_UNUSED_US));
        }
        self.ack_now = true;
        true
    }

    /// Gives back a granted receive buffer the peer sent nothing into by its deadline; true if
    /// one went back to the pool.
    pub fn return_unused_grant(&mut self, p: &mut Pools, now: u64) -> bool {
        if self.grant_until.is_none_or(|t| now < t) {
            return false;
        }
        self.grant_until = None;
        if !self.rx.held() || self.rx.len() > 0 {
            return false;
        }
        self.rx.clear(&mut p.rx);
        true
    }

    /// States in which the peer may still send us data.
    fn receiving(&self) -> bool {
        matches!(
            self.state,
            State::Established | State::FinWait1 | State::FinWait2
        )
    }

    /// Our side is done: FIN after the queued data.
    pub fn close(&mut self) {
        match self.state {
            State::Listen | State::SynSent | State::Closed => self.state = State::Closed,
            State::SynReceived | State::Established => {
                self.fin_queued = true;
                self.state = State::FinWait1;
            }
            State::CloseWait => {
                self.fin_queued = true;
                self.state = State::LastAck;
            }
            _ => {}
        }
    }

    /// Reset: a RST goes out with the next dispatch (if the peer knows us), then CLOSED.
    pub fn abort(&mut self) {
        if !matches!(self.state, State::Closed | State::Listen | State::TimeWait) {
            self.rst_pending = true;
        }
        self.state = State::Closed;
    }

    /// The receive window: the room in the held buffer, a whole buffer if the pool can give one,
    /// zero while it is dry.
    fn window(&self, p: &Pools) -> u32 {
        let room = self.rx.room(&p.rx) as u32;
        let max = 65535u32 << self.rcv_shift;
        room.min(max)
    }

    fn window_field(&self, p: &Pools) -> u16 {
        (self.window(p) >> self.rcv_shift).min(65535) as u16
    }

    /// Processes one segment; `payload` is its data. True if it took the fast path.
    pub fn process(&mut self, p: &mut Pools, now: u64, seg: &Seg, payload: &[u8]) -> bool {
        // Header prediction: the common case of request/response traffic.
        if self.fast_path
            && self.state == State::Established
            && seg.flags & !(TCP_PSH) == TCP_ACK
            && seg.seq == self.rcv_nxt
            && le(self.snd_una, seg.ack)
            && le(seg.ack, self.snd_max)
            && u32::from(seg.window) << self.snd_shift == self.snd_wnd
            && self.backoff == 0
            && self.snd_nxt == self.snd_max
            && self.dup_acks == 0
            && !payload.is_empty()
            && payload.len() <= self.rx.room(&p.rx)
            && payload.len() <= self.window(p) as usize
        {
            self.last_rx = now;
            if seg.ack != self.snd_una {
                self.take_ack(p, now, seg.ack);
            }
            self.snd_wl1 = seg.seq;
            self.snd_wl2 = seg.ack;
            self.rx.push(&mut p.rx, payload);
            self.rcv_nxt = self.rcv_nxt.wrapping_add(payload.len() as u32);
            self.data_received(now, payload.len());
            return true;
        }
        self.process_general(p, now, seg, payload);
        if !payload.is_empty() && !self.rx.held() && p.rx.available() == 0 && self.receiving() {
            self.rx_starved = true;
            self.refused = true;
        }
        false
    }

    /// An ACK that advances `snd_una` (`snd_una < ack <= snd_max`).
    fn take_ack(&mut self, p: &mut Pools, now: u64, ack: u32) {
        if lt(self.data_base, ack) || ack == self.data_base {
            let acked = ack.wrapping_sub(self.data_base) as usize;
            let data = acked.min(self.tx.len());
            self.tx.consume(&mut p.tx, data);
            self.data_base = self.data_base.wrapping_add(data as u32);
            if data > 0 {
                self.stall_since = None;
            }
        }
        self.snd_una = ack;
        if lt(self.snd_nxt, ack) {
            self.snd_nxt = ack;
        }
        if let Some((seq, sent)) = self.rtt_probe {
            if lt(seq, ack) {
                self.rtt_sample(now.saturating_sub(sent));
                self.rtt_probe = None;
            }
        }
        self.backoff = 0;
        self.dup_acks = 0;
        self.rto_at = if self.snd_una == self.snd_max {
            None
        } else {
            Some(now + self.rto_us)
        };
    }

    fn rtt_sample(&mut self, r: u64) {
        if self.srtt_us == 0 {
            self.srtt_us = r.max(1);
            self.rttvar_us = r / 2;
        } else {
            let diff = self.srtt_us.abs_diff(r);
            self.rttvar_us = (3 * self.rttvar_us + diff) / 4;
            self.srtt_us = (7 * self.srtt_us + r) / 8;
        }
        self.rto_us = (self.srtt_us + 4 * self.rttvar_us).clamp(RTO_MIN_US, RTO_MAX_US);
    }

    /// In-order data stored: ACK it with the reply, or within the delay, or at once after two
    /// full segments.
    fn data_received(&mut self, now: u64, n: usize) {
        self.unacked_rx += n;
        if self.unacked_rx >= 2 * self.mss {
            self.ack_now = true;
        } else if self.ack_at.is_none() {
            self.ack_at = Some(now + self.ack_delay_us);
        }
    }

    fn process_general(&mut self, p: &mut Pools, now: u64, seg: &Seg, payload: &[u8]) {
        match self.state {
            State::Closed | State::TimeWait => return,
            State::Listen => {
                if seg.flags & (TCP_SYN | TCP_ACK | TCP_RST) != TCP_SYN {
                    if seg.flags & TCP_RST == 0 {
                        // Not a connection yet: the stack frees the slot and the peer retries.
                        self.state = State::Closed;
                    }
                    return;
                }
                self.last_rx = now;
                self.take_syn(seg);
                self.state = State::SynReceived;
                return;
            }
            State::SynSent => {
                let ack_ok = seg.flags & TCP_ACK != 0 && seg.ack == self.iss.wrapping_add(1);
                if seg.flags & TCP_RST != 0 {
                    if ack_ok {
                        self.state = State::Closed;
                    }
                    return;
                }
                if seg.flags & TCP_ACK != 0 && !ack_ok {
                    return;
                }
                if seg.flags & TCP_SYN != 0 && ack_ok {
                    self.last_rx = now;
                    // The SYN-ACK's window is not scaled (RFC 7323); `take_syn` took it.
                    self.take_syn(seg);
                    self.snd_wl1 = seg.seq;
                    self.snd_wl2 = seg.ack;
                    self.take_ack(p, now, seg.ack);
                    self.state = State::Established;
                    self.ack_now = true;
                }
                return;
            }
            _ => {}
        }
        // Synchronized states (and SYN-RECEIVED): is the segment acceptable?
        let wnd = self.window(p);
        let len = payload.len() as u32 + u32::from(seg.flags & TCP_FIN != 0);
        let seq_ok = if len == 0 {
            if wnd == 0 {
                seg.seq == self.rcv_nxt
            } else {
                le(self.rcv_nxt, seg.seq) && lt(seg.seq, self.rcv_nxt.wrapping_add(wnd))
            }
        } else if wnd == 0 {
            false
        } else {
            let end = seg.seq.wrapping_add(len - 1);
            (le(self.rcv_nxt, seg.seq) && lt(seg.seq, self.rcv_nxt.wrapping_add(wnd)))
                || (le(self.rcv_nxt, end) && lt(end, self.rcv_nxt.wrapping_add(wnd)))
        };
        if seg.flags & TCP_RST != 0 {
            if seq_ok {
                self.state = State::Closed;
            }
            return;
        }
        if seg.flags & TCP_SYN != 0 {
            if self.state == State::SynReceived && seg.seq.wrapping_add(1) == self.rcv_nxt {
                // Our SYN-ACK was lost: send it again.
                self.snd_nxt = self.iss;
                self.last_rx = now;
            } else {
                // A SYN in a synchronized state: challenge ACK (RFC 5961), nothing else.
                self.ack_now = true;
            }
            return;
        }
        if !seq_ok {
            self.ack_now = true;
            return;
        }
        if seg.flags & TCP_ACK == 0 {
            return;
        }
        self.last_rx = now;
        // The ACK field.
        if self.state == State::SynReceived {
            if seg.ack != self.iss.wrapping_add(1) && !lt(self.iss.wrapping_add(1), seg.ack) {
                return;
            }
            if lt(self.snd_max, seg.ack) {
                return;
            }
            self.state = State::Established;
            self.snd_wnd = u32::from(seg.window) << self.snd_shift;
            self.snd_wl1 = seg.seq;
            self.snd_wl2 = seg.ack;
        }
        if lt(self.snd_max, seg.ack) {
            // Acknowledges something never sent.
            self.ack_now = true;
            return;
        }
        let window = u32::from(seg.window) << self.snd_shift;
        if lt(self.snd_una, seg.ack) {
            self.take_ack(p, now, seg.ack);
        } else if seg.ack == self.snd_una
            && payload.is_empty()
            && seg.flags & TCP_FIN == 0
            && window == self.snd_wnd
            && self.snd_una != self.snd_max
        {
            self.dup_acks = self.dup_acks.saturating_add(1);
            if self.dup_acks == 3 {
                self.go_back(now, false);
            }
        }
        if lt(self.snd_wl1, seg.seq) || (self.snd_wl1 == seg.seq && le(self.snd_wl2, seg.ack)) {
            self.snd_wnd = window;
            self.snd_wl1 = seg.seq;
            self.snd_wl2 = seg.ack;
        }
        let fin_acked = self.fin_queued && self.snd_una == self.fin_seq().wrapping_add(1);
        if fin_acked {
            match self.state {
                State::FinWait1 => self.state = State::FinWait2,
                State::Closing => self.state = State::TimeWait,
                State::LastAck => {
                    self.state = State::Closed;
                    return;
                }
                _ => {}
            }
        }
        // The data.
        let mut fin_in_order = seg.flags & TCP_FIN != 0;
        if !payload.is_empty() {
            if matches!(
                self.state,
                State::Established | State::FinWait1 | State::FinWait2
            ) {
                let skip = self.rcv_nxt.wrapping_sub(seg.seq) as usize;
                if lt(self.rcv_nxt, seg.seq) {
                    // Out of order: dropped, the peer learns where we are.
                    self.ack_now = true;
                    return;
                }
                let fresh = &payload[skip.min(payload.len())..];
                let take = fresh.len().min(self.rx.room(&p.rx));
                if take < fresh.len() {
                    fin_in_order = false;
                }
                if take > 0 {
                    self.rx.push(&mut p.rx, &fresh[..take]);
                    self.rcv_nxt = self.rcv_nxt.wrapping_add(take as u32);
                    self.data_received(now, take);
                }
                if skip >= payload.len() {
                    // Only old bytes: the peer missed our ACK.
                    self.ack_now = true;
                }
            } else {
                fin_in_order = false;
            }
        }
        if fin_in_order
            && seg.seq.wrapping_add(payload.len() as u32) == self.rcv_nxt
            && !self.fin_received
        {
            self.fin_received = true;
            self.rcv_nxt = self.rcv_nxt.wrapping_add(1);
            self.ack_now = true;
            self.state = match self.state {
                State::Established => State::CloseWait,
                State::FinWait1 => State::Closing,
                State::FinWait2 => State::TimeWait,
                s => s,
            };
        } else if seg.flags & TCP_FIN != 0 && self.fin_received {
            self.ack_now = true;
        }
    }

    /// The peer's SYN: its sequence number and options.
    fn take_syn(&mut self, seg: &Seg) {
        self.rcv_nxt = seg.seq.wrapping_add(1);
        self.mss = usize::from(seg.mss.unwrap_or(DEFAULT_MSS).min(self.our_mss).max(64));
        match seg.wscale {
            Some(s) if self.state == State::Listen || self.wscale_ok => {
                self.wscale_ok = true;
                self.snd_shift = s.min(14);
            }
            _ => {
                self.wscale_ok = false;
                self.snd_shift = 0;
                self.rcv_shift = 0;
            }
        }
        self.snd_wnd = u32::from(seg.window);
        self.rcv_adv = self.rcv_nxt;
    }

    /// The sequence number our FIN takes.
    fn fin_seq(&self) -> u32 {
        self.data_base.wrapping_add(self.tx.len() as u32)
    }

    /// Retransmission: resend from the first unacknowledged byte.
    fn go_back(&mut self, now: u64, timer: bool) {
        self.snd_nxt = self.snd_una;
        self.rtt_probe = None;
        self.dup_acks = 0;
        if timer {
            self.backoff += 1;
            self.rto_us = (self.rto_us * 2).min(RTO_MAX_US);
        }
        self.rto_at = Some(now + self.rto_us);
    }

    fn syn_state(&self) -> bool {
        matches!(self.state, State::SynSent | State::SynReceived)
    }

    /// Anything unacknowledged (SYN, data, FIN).
    fn outstanding(&self) -> bool {
        self.snd_una != self.snd_max
    }

    /// Offset and length of the data segment that may go now, if any.
    fn next_data(&self) -> Option<(usize, usize)> {
        if self.syn_state() {
            return None;
        }
        let off = self.snd_nxt.wrapping_sub(self.data_base) as usize;
        if lt(self.snd_nxt, self.data_base) || off >= self.tx.len() {
            return None;
        }
        let right = self.snd_una.wrapping_add(self.snd_wnd);
        let usable = if lt(self.snd_nxt, right) {
            right.wrapping_sub(self.snd_nxt) as usize
        } else {
            0
        };
        let n = (self.tx.len() - off).min(self.mss).min(usable);
        if n == 0 {
            // Zero window: a 1-byte probe once nothing is outstanding (the retransmission
            // timer then repeats it with backoff until the window opens).
            if self.snd_wnd == 0 && !self.outstanding() {
                return Some((off, 1));
            }
            return None;
        }
        Some((off, n))
    }

    /// Our FIN is queued, everything before it was sent, and it was not (or must go again).
    fn fin_due(&self) -> bool {
        self.fin_queued && !self.syn_state() && self.snd_nxt == self.fin_seq()
    }

    fn syn_due(&self) -> bool {
        self.syn_state() && self.snd_nxt == self.iss
    }

    /// When the connection next wants `dispatch` (µs since the epoch; `now` or earlier = at once).
    pub fn poll_at(&self, now: u64) -> Option<u64> {
        if self.rst_pending
            || self.ack_now
            || self.nudge > 0
            || self.syn_due()
            || self.next_data().is_some()
            || self.fin_due()
        {
            return Some(now);
        }
        if self.state == State::Closed || self.state == State::Listen {
            return None;
        }
        let mut at: Option<u64> = self.ack_at;
        let mut min = |t: u64| at = Some(at.map_or(t, |a| a.min(t)));
        if let Some(r) = self.rto_at {
            min(r);
        }
        if (self.outstanding() || self.syn_state()) && self.timeout_us != u64::MAX {
            min(self.last_rx.saturating_add(self.timeout_us));
        }
        if let Some(t) = self.grant_until {
            min(t);
        }
        if let Some(t) = self.stall_since {
            min(t.saturating_add(self.stall_timeout_us));
        }
        at
    }

    /// Timers that fell due, then the one segment to send now, if any.
    pub fn dispatch(&mut self, p: &Pools, now: u64) -> Option<Out> {
        if self.rst_pending {
            self.rst_pending = false;
            return Some(Out {
                seq: self.snd_nxt,
                ack: self.rcv_nxt,
                flags: TCP_RST | TCP_ACK,
                window: 0,
                syn_opts: None,
                data_off: 0,
                data_len: 0,
                retransmit: false,
            });
        }
        if matches!(self.state, State::Closed | State::Listen) {
            return None;
        }
        if (self.outstanding() || self.syn_state())
            && self.timeout_us != u64::MAX
            && now >= self.last_rx.saturating_add(self.timeout_us)
        {
            // The peer went silent: give up.
            self.abort();
            return self.dispatch(p, now);
        }
        if self.tx.len() > 0 && self.stall_timeout_us != u64::MAX {
            let since = *self.stall_since.get_or_insert(now);
            if now >= since.saturating_add(self.stall_timeout_us) {
                // The peer takes none of our data (a reader that stopped, or a zero window
                // held open by answering probes): its send buffer goes back to the pool.
                self.stalled = true;
                self.abort();
                return self.dispatch(p, now);
            }
        }
        if self.rto_at.is_some_and(|t| t <= now) {
            self.go_back(now, true);
        }
        // A nudge (duplicate ACK) goes only after the window update itself (`ack_now`).
        let dup_ack = !self.ack_now && self.nudge > 0;
        let ack_due = self.ack_now || dup_ack || self.ack_at.is_some_and(|t| t <= now);
        let mut out = Out {
            seq: self.snd_nxt,
            ack: self.rcv_nxt,
            flags: TCP_ACK,
            window: 0,
            syn_opts: None,
            data_off: 0,
            data_len: 0,
            retransmit: false,
        };
        let mut used = 0u32;
        if self.syn_due() {
            out.flags = if self.state == State::SynSent {
                TCP_SYN
            } else {
                TCP_SYN | TCP_ACK
            };
            let ws = self.wscale_ok.then_some(self.rcv_shift);
            out.syn_opts = Some((self.our_mss, ws));
            out.seq = self.iss;
            used = 1;
        } else if let Some((off, n)) = self.next_data() {
            out.data_off = off;
            out.data_len = n;
            out.flags |= TCP_PSH;
            used = n as u32;
            if self.fin_queued && off + n == self.tx.len() {
                out.flags |= TCP_FIN;
                used += 1;
            }
        } else if self.fin_due() {
            out.flags |= TCP_FIN;
            used = 1;
        } else if !ack_due {
            return None;
        }
        if self.syn_state() && out.flags & TCP_ACK == 0 {
            out.ack = 0;
        }
        // SYN: window field never scaled.
        out.window = if out.flags & TCP_SYN != 0 {
            self.window(p).min(65535) as u16
        } else {
            self.window_field(p)
        };
        if used > 0 {
            // Data carries the ACK; duplicates would no longer be duplicates.
            self.nudge = 0;
            out.retransmit = lt(out.seq, self.snd_max);
            let end = self.snd_nxt.wrapping_add(used);
            if self.rtt_probe.is_none() && !out.retransmit {
                self.rtt_probe = Some((out.seq, now));
            }
            self.snd_nxt = end;
            if lt(self.snd_max, end) {
                self.snd_max = end;
            }
            if self.rto_at.is_none() {
                self.rto_at = Some(now + self.rto_us);
            }
        }
        if dup_ack && used == 0 {
            self.nudge -= 1;
        }
        if out.flags & TCP_ACK != 0 {
            self.ack_now = false;
            self.ack_at = None;
            self.unacked_rx = 0;
            self.rcv_adv = self.rcv_nxt.wrapping_add(self.window(p));
            if out.window == 0 && !self.rx.held() && self.receiving() {
                // A zero window only because the receive pool is dry: the peer now waits for
                // a window update, which comes when the stack grants this connection a buffer.
                self.rx_starved = true;
            }
        }
        Some(out)
    }
}

/// The differential test: recorded traces through the fast path and through the general path
/// alone must deliver the same bytes and emit the same segments.
#[cfg(test)]
mod differential {
    use super::*;

    /// One input to the server connection, as recorded.
    #[derive(Clone, Debug)]
    enum Input {
        Segment(u64, Seg, Vec<u8>),
        /// The application reads everything and echoes it back.
        Serve,
        Dispatch(u64),
        Close,
    }

    /// What the server connection did: segments emitted (header and payload) and bytes read.
    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Output {
        Segment(Out, Vec<u8>),
        Read(Vec<u8>),
        State(State),
    }

    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }
        fn per_mille(&mut self, p: u64) -> bool {
            self.next() % 1000 < p
        }
    }

    fn seg_of(o: &Out) -> Seg {
        Seg {
            seq: o.seq,
            ack: o.ack,
            flags: o.flags,
            window: o.window,
            mss: o.syn_opts.map(|(m, _)| m),
            wscale: o.syn_opts.and_then(|(_, w)| w),
        }
    }

    fn payload_of(t: &Tcb, pools: &Pools, o: &Out) -> Vec<u8> {
        let mut p = vec![0u8; o.data_len];
        t.tx.read_at(&pools.tx, o.data_off, &mut p);
        p
    }

    /// Runs one server input, appending what it did to `out`.
    fn apply(
        s: &mut Tcb,
        sp: &mut Pools,
        input: &Input,
        out: &mut Vec<Output>,
    ) -> Vec<(Out, Vec<u8>)> {
        let mut sent = Vec::new();
        match input {
            Input::Segment(now, seg, p) => {
                s.process(sp, *now, seg, p);
            }
            Input::Serve => {
                let mut buf = Vec::new();
                s.recv(sp, &mut buf, usize::MAX);
                if !buf.is_empty() {
                    let n = s.send(sp, &buf);
                    buf.truncate(n);
                    out.push(Output::Read(buf));
                }
            }
            Input::Dispatch(now) => {
                for _ in 0..64 {
                    if s.poll_at(*now).is_none_or(|at| at > *now) {
                        break;
                    }
                    let Some(o) = s.dispatch(sp, *now) else { break };
                    let p = payload_of(s, sp, &o);
                    out.push(Output::Segment(o, p.clone()));
                    sent.push((o, p));
                }
            }
            Input::Close => s.close(),
        }
        out.push(Output::State(s.state));
        sent
    }

    /// A client (also our TCP, general path) sends `requests` of `req` bytes one at a time over a
    /// link that loses, duplicates and reorders `faults` per mille in each direction; the server
    /// (fast path as given) echoes. Returns the server's inputs, its outputs, and the bytes the
    /// client got back.
    fn record(
        seed: u64,
        faults: u64,
        requests: usize,
        req: usize,
        rx: usize,
    ) -> (Vec<Input>, Vec<Output>, Vec<u8>, u64) {
        let mut rng = Lcg(seed);
        let mut c = Tcb::new(rx, rx, 1460, 10_000);
        let mut cp = Pools::new(rx, rx, 1);
        c.fast_path = false;
        let mut s = Tcb::new(rx, rx, 1460, 10_000);
        let mut sp = Pools::new(rx, rx, 1);
        c.connect(&mut cp, 0x1000_0000 + seed as u32, 0);
        c.set_timeout(30_000_000);
        s.listen(&mut sp, 0xfff0_0000u32.wrapping_add(seed as u32 * 7), 0);
        s.set_timeout(30_000_000);
        let mut inputs = Vec::new();
        let mut outputs = Vec::new();
        let mut to_server: Vec<(Seg, Vec<u8>)> = Vec::new();
        let mut to_client: Vec<(Seg, Vec<u8>)> = Vec::new();
        let mut got = Vec::new();
        let mut sent_reqs = 0;
        let mut fast = 0u64;
        let link = |q: &mut Vec<(Seg, Vec<u8>)>, o: Out, p: Vec<u8>, rng: &mut Lcg| {
            if rng.per_mille(faults) {
                return;
            }
            let item = (seg_of(&o), p);
            if rng.per_mille(faults) {
                q.push(item.clone());
            }
            if rng.per_mille(faults) && !q.is_empty() {
                q.insert(0, item);
            } else {
                q.push(item);
            }
        };
        let mut now = 0u64;
        let mut closed = false;
        for _ in 0..400_000 {
            now += 500;
            // Client side.
            for (seg, p) in std::mem::take(&mut to_client) {
                c.process(&mut cp, now, &seg, &p);
            }
            let mut buf = Vec::new();
            c.recv(&mut cp, &mut buf, usize::MAX);
            got.extend_from_slice(&buf);
            if c.state == State::Established && got.len() == sent_reqs * req && sent_reqs < requests
            {
                let data: Vec<u8> = (0..req).map(|i| (sent_reqs * 31 + i) as u8).collect();
                if c.send(&mut cp, &data) == req {
                    sent_reqs += 1;
                }
            }
            if sent_reqs == requests && got.len() == requests * req && !closed {
                c.close();
                closed = true;
            }
            while c.poll_at(now).is_some_and(|at| at <= now) {
                let Some(o) = c.dispatch(&cp, now) else { break };
                let p = payload_of(&c, &cp, &o);
                link(&mut to_server, o, p, &mut rng);
            }
            // Server side, recorded.
            for (seg, p) in std::mem::take(&mut to_server) {
                if s.process(&mut sp, now, &seg, &p) {
                    fast += 1;
                }
                outputs.push(Output::State(s.state));
                inputs.push(Input::Segment(now, seg, p));
            }
            for input in [Input::Serve, Input::Dispatch(now)] {
                for (o, p) in apply(&mut s, &mut sp, &input, &mut outputs) {
                    link(&mut to_client, o, p, &mut rng);
                }
                inputs.push(input);
            }
            if s.state == State::CloseWait {
                let input = Input::Close;
                apply(&mut s, &mut sp, &input, &mut outputs);
                inputs.push(input);
            }
            if closed && s.state == State::Closed && matches!(c.state, State::TimeWait) {
                break;
            }
        }
        (inputs, outputs, got, fast)
    }

    fn replay(inputs: &[Input], fast_path: bool, seed: u64, rx: usize) -> Vec<Output> {
        let mut s = Tcb::new(rx, rx, 1460, 10_000);
        let mut sp = Pools::new(rx, rx, 1);
        s.fast_path = fast_path;
        s.listen(&mut sp, 0xfff0_0000u32.wrapping_add(seed as u32 * 7), 0);
        s.set_timeout(30_000_000);
        let mut out = Vec::new();
        for input in inputs {
            if let Input::Segment(t, seg, p) = input {
                s.process(&mut sp, *t, seg, p);
                out.push(Output::State(s.state));
            } else {
                apply(&mut s, &mut sp, input, &mut out);
            }
        }
        out
    }

    #[test]
    fn fast_path_and_general_path_agree_on_recorded_traces() {
        for (seed, faults) in [(1u64, 0u64), (2, 10), (3, 30), (4, 50)] {
            let (inputs, recorded, got, fast) = record(seed, faults, 300, 57, 4096);
            let expect: Vec<u8> = (0..300)
                .flat_map(|r| (0..57).map(move |i| (r * 31 + i) as u8))
                .collect();
            assert_eq!(got, expect, "seed {seed}: every byte echoed in order");
            assert!(
                fast > 250,
                "seed {seed}: the fast path was taken ({fast} segments)"
            );
            let with_fast = replay(&inputs, true, seed, 4096);
            assert_eq!(
                with_fast, recorded,
                "seed {seed}: the replay is deterministic"
            );
            let general = replay(&inputs, false, seed, 4096);
            assert_eq!(general.len(), recorded.len(), "seed {seed}");
            for (i, (a, b)) in general.iter().zip(&recorded).enumerate() {
                assert_eq!(a, b, "seed {seed}: output {i} differs");
            }
        }
    }
}
