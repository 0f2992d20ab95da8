//! Client-side caching on RESP (`CLIENT TRACKING`), kept coherent by the WAL (issue 18).
//!
//! A client that turns tracking on keeps the replies it reads in its own memory; pgline tells it
//! when a key it read changes, with a RESP3 `invalidate` push (or, for a RESP2 client, a message
//! on `__redis__:invalidate` to the connection it redirects to). Changes come from the WAL: the
//! writer queues them to every core that has tracking clients (`plane::tracking`), after they are
//! in the store.
//!
//! # Per core
//! Everything here belongs to one core: the keys its connections read ([`CoreTracking`]'s table,
//! keyed by table id and pk text, each with the spellings and client ids that read it), its
//! BCAST clients, and the map from client id to connection slot. A connection's tracking mode
//! lives in its session ([`ClientTracking`]). A redirect target on another core gets its messages
//! through that core's queue.
//!
//! # Modes, as Redis has them
//! - Default: every key a read command names is remembered for the client (hit, absent row or
//!   miss alike); its first change sends one invalidation and forgets it.
//! - `OPTIN`: only reads right after `CLIENT CACHING yes`; `OPTOUT`: all but those right after
//!   `CLIENT CACHING no`.
//! - `BCAST [PREFIX p ...]`: nothing is remembered; every change of a key that starts with one
//!   of the prefixes (any key without prefixes) is sent. A row's keys are its table's names
//!   (`users:42`, `public.users:42`, configured prefixes). Tagged spellings (`{users}:42`,
//!   cluster mode) cannot be derived, so a BCAST client's tagged reads are remembered as in the
//!   default mode.
//! - `NOLOOP` is accepted and changes nothing: pgline has no writes of its own.
//!
//! # Nothing stale
//! - The writer queues a transaction's changes after they are in the store, so a client that
//!   rereads after the invalidation gets the new row.
//! - An invalidation for a connection with a reply still waiting for the origin is queued behind
//!   that reply: a client never caches a reply after the invalidation that voids it.
//! - Hits stop being served when the stream is lost or lags past the bound: at that moment every
//!   tracking client gets a null invalidation (forget everything). While hits are off, every
//!   tracked read is invalidated at the next turn after its reply, since no WAL change would
//!   reach it.
//! - A new key space (a table added, dropped or changed) sends a null invalidation too: a key
//!   that read as absent may now name a row.
//! - A full queue between the writer and the core sends a null invalidation.
//!
//! # Bounds
//! The table holds at most `max_keys` (key, client) pairs and `max_bytes` of key text per core;
//! beyond either, the oldest keys are invalidated and forgotten (Redis's
//! `tracking-table-max-keys`). A connection whose unread output passes the reply backlog bound
//! while invalidations are queued to it is closed (Redis's pubsub output limit), since dropping
//! a message would leave its cache stale. A client has at most [`MAX_PREFIXES`] prefixes.
//!
//! # Cost
//! A connection without tracking pays one branch per command. A tracked read of a key already
//! in the table allocates nothing; a new key allocates its entry. Thread model: the core's only.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::keyspace::KeySpace;
use crate::plane::Invalidation;
use crate::resp::{compose_bulk, compose_bulk_header, Protocol};

/// Prefixes one BCAST client may register.
pub(crate) const MAX_PREFIXES: usize = 1024;
/// Bytes of prefixes one BCAST client may register (a request may be megabytes long).
pub(crate) const MAX_PREFIX_BYTES: usize = 64 * 1024;
/// Prefixes all BCAST clients of one core may register together: each change of a row is
/// matched against them, so this bounds the core's work per change.
pub(crate) const MAX_CORE_PREFIXES: usize = 64 * 1024;
/// The channel RESP2 clients subscribe to for invalidations.
pub(crate) const INVALIDATE_CHANNEL: &[u8] = b"__redis__:invalidate";

/// A connection's tracking mode (`CLIENT TRACKING ON ...`).
#[derive(Debug, Default, Clone)]
pub(crate) struct Mode {
    /// Client id invalidations go to; 0: this connection.
    pub redirect: u64,
    pub bcast: bool,
    pub prefixes: Vec<Box<[u8]>>,
    pub optin: bool,
    pub optout: bool,
    pub noloop: bool,
    /// A redirect target was found gone.
    pub broken_redirect: bool,
}

/// A connection's tracking state; boxed in the session only once it is used.
#[derive(Debug, Default)]
pub(crate) struct ClientTracking {
    /// `Some` while tracking is on.
    pub mode: Option<Mode>,
    /// Subscribed to [`INVALIDATE_CHANNEL`].
    pub subscribed: bool,
    /// `CLIENT CACHING yes|no` applies to the next command only.
    pub caching: Option<bool>,
    /// Counted in the core's tracking-active gauge (`CorePort::tracking_enter`).
    pub counted: bool,
}

impl ClientTracking {
    /// Whether a read by this connection now is remembered for it (BCAST: nothing is).
    pub fn records(&self) -> bool {
        match &self.mode {
            None => false,
            Some(m) if m.bcast => false,
            Some(m) if m.optin => self.caching == Some(true),
            Some(m) if m.optout => self.caching != Some(false),
            Some(_) => true,
        }
    }

    /// Whether the connection needs the core's invalidations at all.
    pub fn listening(&self) -> bool {
        self.mode.is_some() || self.subscribed
    }
}

/// What a message says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message {
    Key(Box<[u8]>),
    /// Forget everything.
    Null,
}

/// A message for a connection: `Tracked` goes to where the tracking client's mode sends it
/// (itself or its redirect target), `Direct` to the named connection as it is (a redirect
/// target on this core named by another core).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Notice {
    /// For a tracking client: to it, or to its redirect target.
    Tracked { client: u64, message: Message },
    /// To this connection itself.
    Direct { client: u64, message: Message },
    /// To redirect target `client`, from tracking client `from` on another core (reported back
    /// if `client` is gone).
    Redirected {
        client: u64,
        message: Message,
        from: u64,
    },
    /// Tracking client `client`'s redirect target `target`, on another core, is gone.
    RedirectBroken { client: u64, target: u64 },
}

struct Entry {
    stamp: u64,
    /// (client id, key as that client spelled it).
    readers: Vec<(u64, Box<[u8]>)>,
}

/// One core's tracking table, BCAST clients and connection map.
pub(crate) struct CoreTracking {
    tables: FxHashMap<u32, FxHashMap<Box<[u8]>, Entry>>,
    /// Keys in the order they were first remembered, with their entry's stamp (stale items,
    /// whose entry went or was remembered again, are skipped and compacted away).
    order: VecDeque<(u64, u32, Box<[u8]>)>,
    next_stamp: u64,
    /// (key, client) pairs remembered, and their key bytes.
    pairs: usize,
    bytes: usize,
    max_pairs: usize,
    max_bytes: usize,
    /// BCAST clients of this core, with how many prefixes each registered (together at most
    /// [`MAX_CORE_PREFIXES`]).
    bcast: Vec<(u64, usize)>,
    /// Every connection of this core that tracks or is subscribed: client id -> slot.
    listeners: FxHashMap<u64, usize>,
    /// Every connection of this core: client id -> slot (redirect targets are looked up here).
    conns: FxHashMap<u64, usize>,
    /// Hits were served at the last turn (a change to bypass sends a null invalidation).
    serving: bool,
    keyspace_generation: u64,
    /// Messages to deliver at this turn.
    pub notices: Vec<Notice>,
    /// Keys invalidated because the table was full, since start.
    pub evicted: u64,
}

impl CoreTracking {
    pub fn new(max_pairs: usize, max_bytes: usize, keyspace_generation: u64) -> Self {
        CoreTracking {
            tables: FxHashMap::default(),
            order: VecDeque::new(),
            next_stamp: 0,
            pairs: 0,
            bytes: 0,
            max_pairs: max_pairs.max(1),
            max_bytes: max_bytes.max(1),
            bcast: Vec::new(),
            listeners: FxHashMap::default(),
            conns: FxHashMap::default(),
            serving: true,
            keyspace_generation,
            notices: Vec::new(),
            evicted: 0,
        }
    }

    /// (key, client) pairs remembered.
    pub fn pairs(&self) -> usize {
        self.pairs
    }

    /// A connection opened in `slot`.
    pub fn conn_opened(&mut self, client: u64, slot: usize) {
        self.conns.insert(client, slot);
    }

    /// A connection closed.
    pub fn conn_closed(&mut self, client: u64) {
        self.conns.remove(&client);
        self.listeners.remove(&client);
        self.set_bcast(client, None);
    }

    /// Prefixes the core's BCAST clients other than `client` registered.
    pub fn bcast_prefixes_besides(&self, client: u64) -> usize {
        self.bcast
            .iter()
            .filter(|(c, _)| *c != client)
            .map(|(_, n)| n)
            .sum()
    }

    /// `client` is a BCAST client with `prefixes` prefixes, or (`None`) is not one.
    fn set_bcast(&mut self, client: u64, prefixes: Option<usize>) {
        self.bcast.retain(|(c, _)| *c != client);
        if let Some(n) = prefixes {
            self.bcast.push((client, n));
        }
    }

    /// The slot of a connection of this core.
    pub fn slot_of(&self, client: u64) -> Option<usize> {
        self.conns.get(&client).copied()
    }

    /// The listening state of the connection in `slot` changed (tracking on or off,
    /// subscribed or not).
    pub fn set_listening(&mut self, client: u64, slot: usize, tracking: &ClientTracking) {
        if tracking.listening() {
            self.listeners.insert(client, slot);
        } else {
            self.listeners.remove(&client);
        }
        let bcast = tracking
            .mode
            .as_ref()
            .filter(|m| m.bcast)
            .map(|m| m.prefixes.len());
        self.set_bcast(client, bcast);
    }

    /// Remembers that `client` read `key` (table `table`, pk text `pk`).
    pub fn record(&mut self, client: u64, key: &[u8], table: u32, pk: &[u8]) {
        let keys = self.tables.entry(table).or_default();
        match keys.get_mut(pk) {
            Some(entry) => {
                if entry
                    .readers
                    .iter()
                    .any(|(c, k)| *c == client && &k[..] == key)
                {
                    return;
                }
                entry.readers.push((client, key.into()));
            }
            None => {
                let stamp = self.next_stamp;
                self.next_stamp += 1;
                keys.insert(
                    pk.into(),
                    Entry {
                        stamp,
                        readers: vec![(client, key.into())],
                    },
                );
                self.order.push_back((stamp, table, pk.into()));
            }
        }
        self.pairs += 1;
        self.bytes += key.len();
        while self.pairs > self.max_pairs || self.bytes > self.max_bytes {
            if !self.evict_oldest() {
                break;
            }
        }
        if self.order.len() > 2 * self.pairs + 1024 {
            self.compact_order();
        }
    }

    fn evict_oldest(&mut self) -> bool {
        while let Some((stamp, table, pk)) = self.order.pop_front() {
            let live = self
                .tables
                .get(&table)
                .and_then(|keys| keys.get(&pk))
                .is_some_and(|e| e.stamp == stamp);
            if live {
                self.evicted += 1;
                self.invalidate_key(table, &pk);
                return true;
            }
        }
        false
    }

    fn compact_order(&mut self) {
        let tables = &self.tables;
        self.order.retain(|(stamp, table, pk)| {
            tables
                .get(table)
                .and_then(|keys| keys.get(pk))
                .is_some_and(|e| e.stamp == *stamp)
        });
    }

    /// Forgets key `pk` of `table` and queues its readers' invalidations.
    fn invalidate_key(&mut self, table: u32, pk: &[u8]) {
        let Some(keys) = self.tables.get_mut(&table) else {
            return;
        };
        let Some(entry) = keys.remove(pk) else {
            return;
        };
        if keys.is_empty() {
            self.tables.remove(&table);
        }
        self.forget_readers(entry);
    }

    fn forget_readers(&mut self, entry: Entry) {
        for (client, key) in entry.readers {
            self.pairs -= 1;
            self.bytes -= key.len();
            self.notices.push(Notice::Tracked {
                client,
                message: Message::Key(key),
            });
        }
    }

    /// Applies one invalidation from the queue.
    pub fn apply(&mut self, inv: Invalidation, keyspace: &KeySpace, prefixes: &dyn Prefixes) {
        match inv {
            Invalidation::Key { table, pk } => {
                self.invalidate_key(table, &pk);
                if !self.bcast.is_empty() {
                    self.broadcast(table, &pk, keyspace, prefixes);
                }
            }
            Invalidation::Table(table) => {
                if let Some(keys) = self.tables.remove(&table) {
                    for (_, entry) in keys {
                        self.forget_readers(entry);
                    }
                }
                for &(client, _) in &self.bcast {
                    self.notices.push(Notice::Tracked {
                        client,
                        message: Message::Null,
                    });
                }
            }
            Invalidation::All => self.forget_all(),
            Invalidation::Deliver { client, key, from } => self.notices.push(Notice::Redirected {
                client,
                message: key.map_or(Message::Null, Message::Key),
                from,
            }),
            Invalidation::RedirectBroken { client, target } => {
                self.notices.push(Notice::RedirectBroken { client, target })
            }
        }
    }

    /// Every change of a row goes to the BCAST clients whose prefixes match one of its keys.
    fn broadcast(&mut self, table: u32, pk: &[u8], keyspace: &KeySpace, prefixes: &dyn Prefixes) {
        let mut key = Vec::new();
        for name in keyspace.names_of(table) {
            key.clear();
            key.extend_from_slice(name);
            key.push(b':');
            key.extend_from_slice(pk);
            for &(client, _) in &self.bcast {
                let slot = self.listeners.get(&client).copied();
                let wanted = match slot.and_then(|slot| prefixes.prefixes(client, slot)) {
                    None => false,
                    Some(ps) => ps.is_empty() || ps.iter().any(|p| key.starts_with(p)),
                };
                if wanted {
                    self.notices.push(Notice::Tracked {
                        client,
                        message: Message::Key(key.as_slice().into()),
                    });
                }
            }
        }
    }

    /// Forgets everything and sends every listening connection a null invalidation.
    pub fn forget_all(&mut self) {
        self.tables.clear();
        self.order.clear();
        self.pairs = 0;
        self.bytes = 0;
        for &client in self.listeners.keys() {
            self.notices.push(Notice::Direct {
                client,
                message: Message::Null,
            });
        }
    }

    /// Invalidates every remembered key, one message per key (while hits are off).
    pub fn invalidate_everything_read(&mut self) {
        let tables = std::mem::take(&mut self.tables);
        self.order.clear();
        for (_, keys) in tables {
            for (_, entry) in keys {
                self.forget_readers(entry);
            }
        }
    }

    /// The turn's checks that need no queue: hits switched off, a new key space, reads while
    /// hits are off.
    pub fn observe(&mut self, serving: bool, keyspace_generation: u64) {
        let went_off = self.serving && !serving;
        self.serving = serving;
        let new_space = keyspace_generation != self.keyspace_generation;
        self.keyspace_generation = keyspace_generation;
        if went_off || new_space {
            self.forget_all();
        } else if !serving && self.pairs > 0 {
            self.invalidate_everything_read();
        }
    }
}

/// Looks up a BCAST client's prefixes by client id and slot (`None`: that slot does not hold
/// a tracking connection with that id).
pub(crate) trait Prefixes {
    fn prefixes(&self, client: u64, slot: usize) -> Option<&[Box<[u8]>]>;
}

/// Composes a message for a connection speaking `proto`, subscribed or not; `None` when it
/// cannot receive one (RESP2 and not subscribed, as Redis).
pub(crate) fn compose(
    message: &Message,
    proto: Protocol,
    subscribed: bool,
    out: &mut Vec<u8>,
) -> bool {
    match proto {
        Protocol::Resp3 => out.extend_from_slice(b">2\r\n$10\r\ninvalidate\r\n"),
        Protocol::Resp2 if subscribed => {
            out.extend_from_slice(b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n")
        }
        Protocol::Resp2 => return false,
    }
    match message {
        Message::Key(key) => {
            out.extend_from_slice(b"*1\r\n");
            compose_bulk(out, key);
        }
        Message::Null if proto == Protocol::Resp3 => out.extend_from_slice(b"_\r\n"),
        Message::Null => out.extend_from_slice(b"$-1\r\n"),
    }
    true
}

/// `tracking-redir-broken`: the RESP3 push Redis sends a client whose redirect target is gone.
pub(crate) fn compose_redirect_broken(target: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(b">2\r\n");
    compose_bulk_header(out, 21);
    out.extend_from_slice(b"tracking-redir-broken\r\n");
    crate::resp::compose_integer(out, target as i64);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(notices: &[Notice]) -> Vec<(u64, String)> {
        let mut v: Vec<(u64, String)> = notices
            .iter()
            .map(|n| match n {
                Notice::Tracked { client, message }
                | Notice::Direct { client, message }
                | Notice::Redirected {
                    client, message, ..
                } => (
                    *client,
                    match message {
                        Message::Key(k) => String::from_utf8_lossy(k).into_owned(),
                        Message::Null => "<null>".into(),
                    },
                ),
                Notice::RedirectBroken { client, target } => {
                    (*client, format!("<broken {target}>"))
                }
            })
            .collect();
        v.sort();
        v
    }

    struct NoPrefixes;
    impl Prefixes for NoPrefixes {
        fn prefixes(&self, _: u64, _: usize) -> Option<&[Box<[u8]>]> {
            None
        }
    }
    struct Listed(Vec<Box<[u8]>>);
    impl Prefixes for Listed {
        fn prefixes(&self, client: u64, _: usize) -> Option<&[Box<[u8]>]> {
            match client {
                5 => Some(&self.0),
                _ => Some(&[]),
            }
        }
    }

    #[test]
    fn a_change_invalidates_every_spelling_once_and_forgets_it() {
        let mut t = CoreTracking::new(100, 1 << 20, 1);
        let ks = KeySpace::new();
        t.record(7, b"users:42", 1, b"42");
        t.record(7, b"users:42", 1, b"42");
        t.record(7, b"public.users:42", 1, b"42");
        t.record(8, b"users:42", 1, b"42");
        t.record(8, b"users:43", 1, b"43");
        assert_eq!(t.pairs(), 4);
        let key = |pk: &[u8]| Invalidation::Key {
            table: 1,
            pk: pk.into(),
        };
        t.apply(key(b"42"), &ks, &NoPrefixes);
        assert_eq!(
            keys(&t.notices),
            [
                (7, "public.users:42".into()),
                (7, "users:42".into()),
                (8, "users:42".into())
            ]
        );
        t.notices.clear();
        t.apply(key(b"42"), &ks, &NoPrefixes);
        assert!(t.notices.is_empty(), "sent once, then forgotten");
        assert_eq!(t.pairs(), 1);
        t.apply(Invalidation::Table(1), &ks, &NoPrefixes);
        assert_eq!(keys(&t.notices), [(8, "users:43".into())]);
        assert_eq!(t.pairs(), 0);
    }

    #[test]
    fn the_table_is_bounded_and_evicts_the_oldest_keys() {
        let mut t = CoreTracking::new(3, 1 << 20, 1);
        for i in 0..5u32 {
            let pk = i.to_string();
            t.record(1, format!("t:{pk}").as_bytes(), 9, pk.as_bytes());
        }
        assert_eq!(t.pairs(), 3);
        assert_eq!(t.evicted, 2);
        assert_eq!(keys(&t.notices), [(1, "t:0".into()), (1, "t:1".into())]);
        // By bytes too.
        let mut t = CoreTracking::new(1000, 20, 1);
        t.record(1, &[b'a'; 12], 9, b"1");
        t.record(1, &[b'b'; 12], 9, b"2");
        assert_eq!(t.pairs(), 1);
        assert_eq!(t.evicted, 1);
        // Keys re-remembered many times do not grow the order queue without bound.
        let mut t = CoreTracking::new(10, 1 << 20, 1);
        for _ in 0..10_000 {
            t.record(1, b"t:1", 9, b"1");
            t.apply(
                Invalidation::Key {
                    table: 9,
                    pk: b"1"[..].into(),
                },
                &KeySpace::new(),
                &NoPrefixes,
            );
            t.notices.clear();
        }
        assert!(t.order.len() <= 1024 + 2, "{}", t.order.len());
    }

    #[test]
    fn bcast_sends_every_name_of_the_row_that_matches_a_prefix() {
        let mut ks = KeySpace::new();
        ks.add("users", 1);
        ks.add("public.users", 1);
        let mut t = CoreTracking::new(100, 1 << 20, 1);
        t.conn_opened(5, 0);
        t.conn_opened(6, 1);
        let mut bcast = ClientTracking {
            mode: Some(Mode {
                bcast: true,
                ..Mode::default()
            }),
            ..ClientTracking::default()
        };
        t.set_listening(5, 0, &bcast);
        t.set_listening(6, 1, &bcast);
        bcast.mode = None;
        let lookup = Listed(vec![b"users:"[..].into()]);
        t.apply(
            Invalidation::Key {
                table: 1,
                pk: b"4"[..].into(),
            },
            &ks,
            &lookup,
        );
        assert_eq!(
            keys(&t.notices),
            [
                (5, "users:4".into()),
                (6, "public.users:4".into()),
                (6, "users:4".into())
            ]
        );
        t.notices.clear();
        t.conn_closed(6);
        t.apply(Invalidation::All, &ks, &lookup);
        assert_eq!(keys(&t.notices), [(5, "<null>".into())]);
    }

    #[test]
    fn going_to_bypass_forgets_all_and_reads_in_bypass_are_invalidated_each_turn() {
        let mut t = CoreTracking::new(100, 1 << 20, 1);
        t.conn_opened(3, 0);
        let on = ClientTracking {
            mode: Some(Mode::default()),
            ..ClientTracking::default()
        };
        t.set_listening(3, 0, &on);
        t.record(3, b"t:1", 9, b"1");
        t.observe(false, 1);
        assert_eq!(keys(&t.notices), [(3, "<null>".into())]);
        assert_eq!(t.pairs(), 0);
        t.notices.clear();
        t.record(3, b"t:2", 9, b"2");
        t.observe(false, 1);
        assert_eq!(keys(&t.notices), [(3, "t:2".into())]);
        t.notices.clear();
        t.observe(true, 1);
        assert!(t.notices.is_empty());
        t.observe(true, 2);
        assert_eq!(keys(&t.notices), [(3, "<null>".into())], "new key space");
    }

    #[test]
    fn modes_decide_what_is_recorded() {
        let mut c = ClientTracking::default();
        assert!(!c.records());
        c.mode = Some(Mode::default());
        assert!(c.records());
        c.mode = Some(Mode {
            optin: true,
            ..Mode::default()
        });
        assert!(!c.records());
        c.caching = Some(true);
        assert!(c.records());
        c.mode = Some(Mode {
            optout: true,
            ..Mode::default()
        });
        c.caching = Some(false);
        assert!(!c.records());
        c.caching = None;
        assert!(c.records());
        c.mode = Some(Mode {
            bcast: true,
            ..Mode::default()
        });
        assert!(!c.records());
    }

    #[test]
    fn messages_as_redis_words_them() {
        let mut out = Vec::new();
        assert!(compose(
            &Message::Key(b"k:1"[..].into()),
            Protocol::Resp3,
            false,
            &mut out
        ));
        assert_eq!(out, b">2\r\n$10\r\ninvalidate\r\n*1\r\n$3\r\nk:1\r\n");
        out.clear();
        assert!(compose(&Message::Null, Protocol::Resp2, true, &mut out));
        assert_eq!(
            out,
            b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n$-1\r\n"
        );
        out.clear();
        assert!(!compose(&Message::Null, Protocol::Resp2, false, &mut out));
        compose_redirect_broken(12, &mut out);
        assert_eq!(out, b">2\r\n$21\r\ntracking-redir-broken\r\n:12\r\n");
    }
}
