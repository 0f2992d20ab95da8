//! Where a parsed command meets the store.
//!
//! `execute` either composes the whole reply into `out` ([`Outcome::Done`]) or, when a key must
//! come from the origin, composes nothing and returns [`Outcome::Deferred`] with the keys to fill
//! and what the reply needs later. A hit is visible here as the early `Lookup::Hit` arms: one
//! optimistic copy of the pre-encoded section into `out`, no allocation.

use std::ops::Range;

use crate::cluster::{key_slot, untag, Route, Topology};
use crate::keyspace::KeySpace;
use crate::plane::{CoreStats, MissKey, Shared};
use crate::resp::{
    compose_array_header, compose_bulk, compose_error, compose_integer, compose_map_header,
    compose_null, compose_simple, compose_unknown_command,
};
use crate::resp::{Args, Protocol};
use crate::resp::{ClientSub, ClusterSub, Command, CommandSub, TrackingArgs};
use crate::row::{SECTION_COLUMNS, SECTION_RESP_JSON};
use crate::store::Lookup;

use super::conn::Session;
use super::deferred::{compose_all_fields, compose_field, Deferred, Part};
use super::info;
use super::tracking::{
    ClientTracking, CoreTracking, Mode, INVALIDATE_CHANNEL, MAX_CORE_PREFIXES, MAX_PREFIXES,
    MAX_PREFIX_BYTES,
};

/// Everything a command may read while it executes on a core.
pub(crate) struct Exec<'a> {
    pub shared: &'a Shared,
    pub keyspace: &'a KeySpace,
    /// The fleet's topology in cluster mode: keys of slots this node does not serve are
    /// redirected before the store is read.
    pub topology: Option<&'a Topology>,
    /// Where a tagged key's untagged form is built (cluster mode).
    pub untag: &'a mut Vec<u8>,
    /// False while hits are not allowed: every lookup is deferred as a bypass read.
    pub serve_hits: bool,
    pub stats: &'a CoreStats,
    /// Reused buffer for sections that are read and then picked apart (HGET and friends).
    pub scratch: &'a mut Vec<u8>,
    pub password: Option<&'a [u8]>,
    /// The connection limit (reported by `CONFIG GET maxclients`).
    pub max_connections: usize,
    /// Wrong passwords one connection may give before it is closed (0: no limit).
    pub max_auth_failures: u32,
    /// This core's client-tracking table (issue 18).
    pub tracking: &'a mut CoreTracking,
    /// This core's index.
    pub core: usize,
    /// The connection's slot on its core.
    pub slot: usize,
}

pub(crate) enum Outcome {
    Done,
    Deferred {
        keys: Vec<MissKey>,
        deferred: Deferred,
    },
    /// Reply composed; close the connection once it is written.
    Close,
}

/// What `CLUSTER` and `READONLY`/`READWRITE` answer outside cluster mode (Redis's words).
const CLUSTER_DISABLED: &[u8] = b"ERR This instance has cluster support disabled";

/// The result of looking one key up.
enum Found {
    /// The section was appended to the output.
    Hit,
    /// The row does not exist (cached negative entry) or the key names no cached table.
    Absent,
    Miss(MissKey),
    /// The key names a table that cannot be cached: the command answers its error
    /// ([`Exec::compose_refusal`]) instead of a nil that would look like an absent row.
    Refused,
}

impl Exec<'_> {
    fn find(&mut self, key: &[u8], section: usize, out: &mut Vec<u8>) -> Found {
        // In cluster mode a hash tag's braces are routing only (`orders:{7}:1001`).
        let key = match self.topology {
            Some(_) => untag(key, self.untag),
            None => key,
        };
        let Some((table, pk)) = self.keyspace.resolve(key) else {
            CoreStats::add(&self.stats.keys_unknown_table, 1);
            if self.keyspace.refusal(key).is_some() {
                return Found::Refused;
            }
            return Found::Absent;
        };
        if !self.serve_hits {
            CoreStats::add(&self.stats.keys_bypass, 1);
            return Found::Miss(MissKey {
                table,
                pk: pk.into(),
            });
        }
        match self.shared.store().read(table, pk, section, out) {
            Lookup::Hit => {
                CoreStats::add(&self.stats.keys_hit, 1);
                Found::Hit
            }
            Lookup::Negative => {
                CoreStats::add(&self.stats.keys_negative_hit, 1);
                Found::Absent
            }
            Lookup::Miss => {
                CoreStats::add(&self.stats.keys_miss, 1);
                Found::Miss(MissKey {
                    table,
                    pk: pk.into(),
                })
            }
        }
    }

    /// Remembers the keys a read command names for a tracking client (a key of no cached table
    /// is not remembered: only a new key space can change its answer, and that invalidates
    /// everything). `tagged_only`: only keys with a hash tag (cluster mode), the spellings a
    /// BCAST client's invalidations cannot derive from its prefixes.
    fn track_reads(&mut self, cmd: Command<'_>, client: u64, tagged_only: bool) {
        let mut one = |key: &[u8]| {
            let resolved = match self.topology {
                Some(_) => untag(key, self.untag),
                None => key,
            };
            if tagged_only && resolved.len() == key.len() {
                return;
            }
            if let Some((table, pk)) = self.keyspace.resolve(resolved) {
                self.tracking.record(client, key, table, pk);
            }
        };
        match cmd {
            Command::Get { key }
            | Command::HGet { key, .. }
            | Command::HMGet { key, .. }
            | Command::HGetAll { key } => one(key),
            Command::MGet { keys } | Command::Exists { keys } => keys.iter().for_each(one),
            _ => {}
        }
    }

    /// The error of a key that names a table that cannot be cached.
    fn compose_refusal(&self, key: &[u8], out: &mut Vec<u8>) {
        let msg = self
            .keyspace
            .refusal(key)
            .unwrap_or(b"ERR table is not cacheable");
        compose_error(out, msg);
    }

    /// Runs one command for `session`, composing into `out`.
    pub fn execute(
        &mut self,
        cmd: Command<'_>,
        session: &mut Session,
        out: &mut Vec<u8>,
    ) -> Outcome {
        let proto = session.proto;
        if !session.authenticated
            && !matches!(
                cmd,
                Command::Auth { .. } | Command::Hello { .. } | Command::Quit
            )
        {
            compose_error(out, b"NOAUTH Authentication required.");
            return Outcome::Done;
        }
        if let Some(topology) = self.topology {
            let route = match cmd {
                Command::Get { key }
                | Command::HGet { key, .. }
                | Command::HMGet { key, .. }
                | Command::HGetAll { key } => {
                    topology.route(std::iter::once(key), session.readonly)
                }
                Command::MGet { keys } | Command::Exists { keys } => {
                    topology.route(keys.iter(), session.readonly)
                }
                _ => Route::Serve,
            };
            if route != Route::Serve {
                topology.compose_redirect(route, out);
                return Outcome::Done;
            }
        }
        if let Some(t) = session.tracking.as_deref() {
            // While hits are off a BCAST client's reads are remembered too, to be invalidated
            // right after their replies (no WAL change would reach them). In cluster mode its
            // tagged reads are always remembered: `orders:{7}:1001` is one of countless
            // spellings of a row that no prefix match can produce.
            let bcast = t.mode.as_ref().is_some_and(|m| m.bcast);
            if t.records() || (bcast && !self.serve_hits) {
                self.track_reads(cmd, session.client_id, false);
            } else if bcast && self.topology.is_some() {
                self.track_reads(cmd, session.client_id, true);
            }
        }
        match cmd {
            Command::Get { key } => match self.find(key, SECTION_RESP_JSON, out) {
                Found::Hit => Outcome::Done,
                Found::Absent => {
                    compose_null(out, proto);
                    Outcome::Done
                }
                Found::Miss(k) => deferred(vec![k], Deferred::Get),
                Found::Refused => {
                    self.compose_refusal(key, out);
                    Outcome::Done
                }
            },
            Command::MGet { keys } => self.mget(keys, proto, out),
            Command::Exists { keys } => self.exists(keys, out),
            Command::HGet { key, field } => self.hash(
                key,
                out,
                |cols, out| compose_field(out, cols, field, proto),
                || Deferred::HGet {
                    field: field.into(),
                },
            ),
            Command::HMGet { key, fields } => self.hash(
                key,
                out,
                |cols, out| {
                    compose_array_header(out, fields.len());
                    for f in fields.iter() {
                        compose_field(out, cols, f, proto);
                    }
                },
                || Deferred::HMGet {
                    fields: fields.iter().map(Into::into).collect(),
                },
            ),
            Command::HGetAll { key } => self.hash(
                key,
                out,
                |cols, out| compose_all_fields(out, cols, proto),
                || Deferred::HGetAll,
            ),
            other => self.execute_admin(other, session, out),
        }
    }

    fn mget(&mut self, keys: Args<'_>, proto: Protocol, out: &mut Vec<u8>) -> Outcome {
        self.prefetch(keys);
        let start = out.len();
        compose_array_header(out, keys.len());
        // The last key that was a hit and the bytes its value took in `out` (only a key right
        // after it is compared with it).
        let mut prev: (&[u8], Range<usize>) = (&[], 0..0);
        let mut iter = keys.iter().enumerate();
        for (i, key) in iter.by_ref() {
            if !prev.1.is_empty() && key == prev.0 {
                // The key before it again: the same value, copied from the reply composed for
                // it instead of looked up again (docs/decisions.md, issue 16).
                CoreStats::add(&self.stats.keys_hit, 1);
                out.extend_from_within(prev.1.clone());
                continue;
            }
            let before = out.len();
            match self.find(key, SECTION_RESP_JSON, out) {
                Found::Hit => prev = (key, before..out.len()),
                Found::Absent => {
                    compose_null(out, proto);
                    prev.1 = 0..0;
                }
                Found::Refused => {
                    out.truncate(start);
                    self.compose_refusal(key, out);
                    return Outcome::Done;
                }
                Found::Miss(first) => {
                    // Slow path: the replies composed so far stay as they are, one part; the
                    // rest is collected key by key.
                    let header = itoa_len(keys.len());
                    let mut held = out.split_off(start + header);
                    out.truncate(start);
                    let mut parts = Vec::with_capacity(keys.len() - i + 1);
                    if i > 0 {
                        parts.push(Part::Held(0..held.len()));
                    }
                    let mut missing = vec![first];
                    parts.push(Part::Missing(0));
                    for (_, key) in iter {
                        let before = held.len();
                        match self.find(key, SECTION_RESP_JSON, &mut held) {
                            Found::Hit => parts.push(Part::Held(before..held.len())),
                            Found::Absent => {
                                compose_null(&mut held, proto);
                                parts.push(Part::Held(before..held.len()));
                            }
                            Found::Miss(k) => {
                                parts.push(Part::Missing(missing.len()));
                                missing.push(k);
                            }
                            Found::Refused => {
                                out.truncate(start);
                                self.compose_refusal(key, out);
                                return Outcome::Done;
                            }
                        }
                    }
                    let keys = keys.len();
                    return deferred(missing, Deferred::MGet { keys, parts, held });
                }
            }
        }
        Outcome::Done
    }

    /// Overlaps the cache misses of a batch of keys: every bucket, then every entry header
    /// (a key equal to the one before it is skipped: `mget` copies its reply).
    fn prefetch(&self, keys: Args<'_>) {
        if !self.serve_hits || keys.len() < 2 {
            return;
        }
        let store = self.shared.store();
        let distinct = || {
            let mut prev: &[u8] = &[];
            keys.iter().enumerate().filter(move |&(i, key)| {
                let new = i == 0 || key != prev;
                prev = key;
                new
            })
        };
        for (_, key) in distinct() {
            if let Some((table, pk)) = self.keyspace.resolve(key) {
                store.prefetch_bucket(table, pk);
            }
        }
        for (_, key) in distinct() {
            if let Some((table, pk)) = self.keyspace.resolve(key) {
                store.prefetch_entry(table, pk);
            }
        }
    }

    fn exists(&mut self, keys: Args<'_>, out: &mut Vec<u8>) -> Outcome {
        let mut present = 0i64;
        let mut missing = Vec::new();
        let start = self.scratch.len();
        let mut refused = None;
        for key in keys.iter() {
            let mut scratch = std::mem::take(self.scratch);
            match self.find(key, SECTION_RESP_JSON, &mut scratch) {
                Found::Hit => present += 1,
                Found::Absent => {}
                Found::Miss(k) => missing.push(k),
                Found::Refused => refused = refused.or(Some(key)),
            }
            scratch.truncate(start);
            *self.scratch = scratch;
        }
        if let Some(key) = refused {
            self.compose_refusal(key, out);
            return Outcome::Done;
        }
        if missing.is_empty() {
            compose_integer(out, present);
            Outcome::Done
        } else {
            deferred(missing, Deferred::Exists { present })
        }
    }

    /// HGET / HMGET / HGETALL: read the columns section into scratch, then pick from it.
    fn hash(
        &mut self,
        key: &[u8],
        out: &mut Vec<u8>,
        compose: impl FnOnce(&[u8], &mut Vec<u8>),
        later: impl FnOnce() -> Deferred,
    ) -> Outcome {
        let mut scratch = std::mem::take(self.scratch);
        scratch.clear();
        let outcome = match self.find(key, SECTION_COLUMNS, &mut scratch) {
            Found::Hit => {
                compose(&scratch, out);
                Outcome::Done
            }
            Found::Absent => {
                // A missing hash is one with no columns: nil for HGET, all-nil array for
                // HMGET, empty map for HGETALL — the same composer, nothing allocated.
                compose(&[], out);
                Outcome::Done
            }
            Found::Miss(k) => deferred(vec![k], later()),
            Found::Refused => {
                self.compose_refusal(key, out);
                Outcome::Done
            }
        };
        *self.scratch = scratch;
        outcome
    }

    /// Every command but the data commands: the connection's own (this function) and the
    /// server's ([`Exec::execute_server`]).
    fn execute_admin(
        &mut self,
        cmd: Command<'_>,
        session: &mut Session,
        out: &mut Vec<u8>,
    ) -> Outcome {
        match cmd {
            Command::Hello {
                protover,
                auth,
                setname,
            } => return self.hello(protover, auth, setname, session, out),
            Command::Auth { username, password } => {
                if self.password.is_none() {
                    compose_error(out, b"ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?");
                } else if self.check_password(username, password) {
                    session.authenticated = true;
                    compose_simple(out, b"OK");
                } else {
                    return self.wrong_password(session, out);
                }
            }
            Command::Select { db: 0 } => compose_simple(out, b"OK"),
            Command::Select { .. } => compose_error(out, b"ERR DB index is out of range"),
            Command::Client {
                sub: ClientSub::Tracking(args),
            } => self.client_tracking(args, session, out),
            Command::Client {
                sub: ClientSub::Caching { yes },
            } => client_caching(yes, session, out),
            Command::Client {
                sub: ClientSub::TrackingInfo,
            } => tracking_info(session, out),
            Command::Client {
                sub: ClientSub::GetRedir,
            } => {
                let redirect = match session.tracking.as_deref().and_then(|t| t.mode.as_ref()) {
                    None => -1,
                    Some(m) => m.redirect as i64,
                };
                compose_integer(out, redirect);
            }
            Command::Client { sub } => execute_client(sub, session, out),
            Command::Subscribe { channels } => self.subscribe(channels, session, out),
            Command::Unsubscribe { channels } => self.unsubscribe(channels, session, out),
            Command::PubSubOther { name } => {
                let mut msg = b"ERR pgline has no pub/sub: '".to_vec();
                msg.extend(name.iter().take(32).map(u8::to_ascii_lowercase));
                msg.extend_from_slice(b"' is refused (SUBSCRIBE serves only __redis__:invalidate, for client-side caching)");
                compose_error(out, &msg);
            }
            Command::Quit => {
                compose_simple(out, b"OK");
                return Outcome::Close;
            }
            Command::ReadOnly | Command::ReadWrite if self.topology.is_none() => {
                compose_error(out, CLUSTER_DISABLED);
            }
            Command::ReadOnly => {
                session.readonly = true;
                compose_simple(out, b"OK");
            }
            Command::ReadWrite => {
                session.readonly = false;
                compose_simple(out, b"OK");
            }
            Command::Reset => {
                self.stop_tracking(session);
                if let Some(t) = session.tracking.as_deref_mut() {
                    t.subscribed = false;
                }
                self.update_listening(session);
                session.proto = Protocol::Resp2;
                session.name = None;
                session.readonly = false;
                session.authenticated = self.password.is_none();
                compose_simple(out, b"RESET");
            }
            other => self.execute_server(other, session.proto, out),
        }
        Outcome::Done
    }

    /// `HELLO [protover [AUTH user pass] [SETNAME name]]`.
    fn hello(
        &mut self,
        protover: Option<u8>,
        auth: Option<(&[u8], &[u8])>,
        setname: Option<&[u8]>,
        session: &mut Session,
        out: &mut Vec<u8>,
    ) -> Outcome {
        if let Some((user, pass)) = auth {
            if !self.check_password(Some(user), pass) {
                return self.wrong_password(session, out);
            }
            session.authenticated = true;
        }
        if !session.authenticated {
            compose_error(out, b"NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time");
            return Outcome::Done;
        }
        if let Some(v) = protover {
            session.proto = if v == 3 {
                Protocol::Resp3
            } else {
                Protocol::Resp2
            };
        }
        if let Some(name) = setname {
            session.name = Some(name.into());
        }
        info::compose_hello(out, session);
        Outcome::Done
    }

    /// The commands about the server rather than the connection: PING, ECHO, DBSIZE, INFO,
    /// COMMAND, CONFIG, and the refusals (writes, unknown commands).
    fn execute_server(&self, cmd: Command<'_>, proto: Protocol, out: &mut Vec<u8>) {
        match cmd {
            Command::Ping { message: None } => compose_simple(out, b"PONG"),
            Command::Ping { message: Some(m) } | Command::Echo { message: m } => {
                compose_bulk(out, m)
            }
            Command::DbSize => {
                let stats = self.shared.store().stats();
                compose_integer(
                    out,
                    stats.entries.saturating_sub(stats.negative_entries) as i64,
                )
            }
            Command::Info { section } => info::compose_info(out, self.shared, section, proto),
            Command::Command { sub } => match sub {
                CommandSub::Count => crate::resp::compose_command_count(out),
                CommandSub::Docs { names } => crate::resp::compose_command_docs(out, names, proto),
                CommandSub::Info { names } => crate::resp::compose_command_info(out, names, proto),
                CommandSub::All => crate::resp::compose_command_table(out, proto),
                CommandSub::Other { .. } => compose_error(
                    out,
                    b"ERR unknown subcommand or wrong number of arguments for 'COMMAND'",
                ),
            },
            Command::Write { name } => {
                let mut msg = b"READONLY pgline is a read cache of PostgreSQL: '".to_vec();
                msg.extend(name.iter().map(u8::to_ascii_lowercase));
                msg.extend_from_slice(b"' is refused; write to PostgreSQL and the change reaches the cache through the WAL");
                compose_error(out, &msg);
            }
            Command::ConfigGet { patterns } => self.config_get(patterns, proto, out),
            Command::ConfigOther { sub } => {
                let mut msg = b"ERR CONFIG ".to_vec();
                msg.extend(sub.iter().take(32).map(u8::to_ascii_uppercase));
                msg.extend_from_slice(
                    b" is not supported: pgline is configured through its config file, PGLINE_* variables and flags",
                );
                compose_error(out, &msg);
            }
            Command::Unknown { name, args } => compose_unknown_command(out, name, args),
            Command::Cluster { sub } => self.cluster(sub, proto, out),
            // The data commands are handled by `execute`, the connection's by `execute_admin`.
            Command::Get { .. }
            | Command::MGet { .. }
            | Command::Exists { .. }
            | Command::HGet { .. }
            | Command::HMGet { .. }
            | Command::HGetAll { .. }
            | Command::Hello { .. }
            | Command::Auth { .. }
            | Command::Select { .. }
            | Command::Client { .. }
            | Command::ReadOnly
            | Command::ReadWrite
            | Command::Quit
            | Command::Subscribe { .. }
            | Command::Unsubscribe { .. }
            | Command::PubSubOther { .. }
            | Command::Reset => compose_error(out, b"ERR internal: command in the wrong path"),
        }
    }

    /// `CLIENT TRACKING ON|OFF ...`, with Redis's rules and words.
    fn client_tracking(
        &mut self,
        args: TrackingArgs<'_>,
        session: &mut Session,
        out: &mut Vec<u8>,
    ) {
        if !args.on {
            self.stop_tracking(session);
            self.update_listening(session);
            compose_simple(out, b"OK");
            return;
        }
        if let Err(msg) = self.check_tracking(&args, session) {
            compose_error(out, msg.as_bytes());
            return;
        }
        let state = session.tracking.get_or_insert_with(Box::default);
        let mut mode = state.mode.take().unwrap_or_default();
        mode.redirect = args.redirect.map_or(0, |r| r as u64);
        mode.broken_redirect = false;
        mode.bcast = args.bcast;
        mode.optin = args.optin;
        mode.optout = args.optout;
        mode.noloop = args.noloop;
        for p in args.prefixes() {
            if !mode.prefixes.iter().any(|q| &q[..] == p) {
                mode.prefixes.push(p.into());
            }
        }
        state.mode = Some(mode);
        if !state.counted {
            // Before any read of this client: the writer now queues this core's invalidations.
            self.shared.tracking_enter(self.core);
            state.counted = true;
        }
        self.update_listening(session);
        compose_simple(out, b"OK");
    }

    fn check_tracking(&self, args: &TrackingArgs<'_>, session: &Session) -> Result<(), String> {
        if args.optin && args.optout {
            return Err("ERR You can't use both OPTIN and OPTOUT".into());
        }
        if args.bcast && (args.optin || args.optout) {
            return Err("ERR OPTIN and OPTOUT are not compatible with BCAST".into());
        }
        if args.has_prefixes() && !args.bcast {
            return Err("ERR PREFIX option requires BCAST mode to be enabled".into());
        }
        let current = session.tracking.as_deref().and_then(|t| t.mode.as_ref());
        if let Some(m) = current {
            if m.bcast != args.bcast {
                return Err("ERR You can't switch BCAST mode on/off before disabling tracking for this client, and then re-enabling it with a different mode.".into());
            }
            if (m.optin, m.optout) != (args.optin, args.optout) {
                return Err("ERR You can't switch OPTIN/OPTOUT mode before disabling tracking for this client, and then re-enabling it with a different mode.".into());
            }
        }
        if let Some(id) = args.redirect {
            let exists = u64::try_from(id)
                .ok()
                .filter(|&id| id > 0)
                .is_some_and(|id| {
                    match self.shared.core_of_client(id) {
                        Some(core) if core == self.core => self.tracking.slot_of(id).is_some(),
                        // Another core's connection: an id never handed out is refused here; one
                        // closed since is found when a message goes to it, and the redirect is
                        // then reported broken.
                        Some(_) => self.shared.client_id_issued(id),
                        None => false,
                    }
                });
            if !exists {
                return Err("ERR The client ID you want redirect to does not exist".into());
            }
        }
        let existing: &[Box<[u8]>] = current.map_or(&[], |m| &m.prefixes);
        let mut seen: Vec<&[u8]> = existing.iter().map(|p| &p[..]).collect();
        for p in args.prefixes() {
            if seen.contains(&p) {
                continue;
            }
            if let Some(q) = seen.iter().find(|q| q.starts_with(p) || p.starts_with(q)) {
                return Err(format!(
                    "ERR Prefix '{}' overlaps with an existing prefix '{}'. Prefixes for a single client must not overlap.",
                    String::from_utf8_lossy(p),
                    String::from_utf8_lossy(q)
                ));
            }
            if seen.len() >= MAX_PREFIXES {
                return Err(format!(
                    "ERR pgline: at most {MAX_PREFIXES} prefixes per client"
                ));
            }
            seen.push(p);
        }
        if seen.iter().map(|p| p.len()).sum::<usize>() > MAX_PREFIX_BYTES {
            return Err(format!(
                "ERR pgline: a client's prefixes total at most {MAX_PREFIX_BYTES} bytes"
            ));
        }
        if args.bcast
            && self.tracking.bcast_prefixes_besides(session.client_id) + seen.len()
                > MAX_CORE_PREFIXES
        {
            return Err(format!(
                "ERR pgline: the BCAST clients of this connection's core hold {MAX_CORE_PREFIXES} prefixes, the most a core matches each change against"
            ));
        }
        Ok(())
    }

    /// Tracking off (`CLIENT TRACKING OFF`, `RESET`); the table's entries of this client are
    /// left to be skipped when they are invalidated, as Redis does.
    fn stop_tracking(&mut self, session: &mut Session) {
        if let Some(t) = session.tracking.as_deref_mut() {
            t.mode = None;
            t.caching = None;
            if t.counted {
                self.shared.tracking_leave(self.core);
                t.counted = false;
            }
        }
    }

    fn update_listening(&mut self, session: &Session) {
        let none = ClientTracking::default();
        let t = session.tracking.as_deref().unwrap_or(&none);
        self.tracking.set_listening(session.client_id, self.slot, t);
    }

    /// `SUBSCRIBE __redis__:invalidate`: the channel RESP2 clients receive invalidations on.
    fn subscribe(&mut self, channels: Args<'_>, session: &mut Session, out: &mut Vec<u8>) {
        if let Some(other) = channels.iter().find(|c| *c != INVALIDATE_CHANNEL) {
            let mut msg = b"ERR pgline has no pub/sub: SUBSCRIBE serves only __redis__:invalidate (client-side caching), not '".to_vec();
            msg.extend(
                other
                    .iter()
                    .take(64)
                    .map(|&b| if b.is_ascii_graphic() { b } else { b'?' }),
            );
            msg.push(b'\'');
            compose_error(out, &msg);
            return;
        }
        let state = session.tracking.get_or_insert_with(Box::default);
        state.subscribed = true;
        for c in channels.iter() {
            compose_pubsub_header(out, session.proto);
            compose_bulk(out, b"subscribe");
            compose_bulk(out, c);
            compose_integer(out, 1);
        }
        self.update_listening(session);
    }

    /// `UNSUBSCRIBE [channel ...]`.
    fn unsubscribe(&mut self, channels: Args<'_>, session: &mut Session, out: &mut Vec<u8>) {
        let was = session.tracking.as_deref().is_some_and(|t| t.subscribed);
        if channels.is_empty() {
            compose_pubsub_header(out, session.proto);
            compose_bulk(out, b"unsubscribe");
            if was {
                compose_bulk(out, INVALIDATE_CHANNEL);
            } else {
                compose_null(out, session.proto);
            }
            compose_integer(out, 0);
        }
        let mut subscribed = was;
        for c in channels.iter() {
            if c == INVALIDATE_CHANNEL {
                subscribed = false;
            }
            compose_pubsub_header(out, session.proto);
            compose_bulk(out, b"unsubscribe");
            compose_bulk(out, c);
            compose_integer(out, i64::from(subscribed));
        }
        if channels.is_empty() {
            subscribed = false;
        }
        if let Some(t) = session.tracking.as_deref_mut() {
            t.subscribed = subscribed;
        }
        self.update_listening(session);
    }

    /// `CLUSTER <subcommand>`: the topology's replies; outside cluster mode, Redis's refusal
    /// (`KEYSLOT` too, as Redis refuses it).
    fn cluster(&self, sub: ClusterSub<'_>, proto: Protocol, out: &mut Vec<u8>) {
        let Some(t) = self.topology else {
            compose_error(out, CLUSTER_DISABLED);
            return;
        };
        match sub {
            ClusterSub::Shards => t.compose_shards(proto, out),
            ClusterSub::Slots => t.compose_slots(proto, out),
            ClusterSub::Nodes => t.compose_nodes(proto, out),
            ClusterSub::Info => t.compose_info(proto, out),
            ClusterSub::MyId => compose_bulk(out, t.me().id.as_bytes()),
            ClusterSub::MyShardId => compose_bulk(out, t.my_shard_id().as_bytes()),
            ClusterSub::KeySlot { key } => compose_integer(out, i64::from(key_slot(key))),
            ClusterSub::Other { name } => {
                out.extend_from_slice(b"-ERR unknown subcommand '");
                out.extend(name.iter().take(128).map(|&b| {
                    if b.is_ascii_graphic() || b == b' ' {
                        b
                    } else {
                        b'?'
                    }
                }));
                out.extend_from_slice(b"'. Try CLUSTER HELP.\r\n");
            }
        }
    }

    /// `CONFIG GET`: the settings Redis tools ask about, as pgline has them.
    fn config_get(&self, patterns: Args<'_>, proto: Protocol, out: &mut Vec<u8>) {
        let budget = itoa::Buffer::new()
            .format(self.shared.store().stats().budget_bytes)
            .to_owned();
        let clients = itoa::Buffer::new().format(self.max_connections).to_owned();
        let params: [(&[u8], &[u8]); 6] = [
            (b"maxmemory", budget.as_bytes()),
            (b"maxmemory-policy", b"clock-segments"),
            (b"maxclients", clients.as_bytes()),
            (b"databases", b"1"),
            (b"save", b""),
            (b"appendonly", b"no"),
        ];
        let matches = |name: &[u8]| {
            patterns
                .iter()
                .any(|p| crate::resp::command::glob_match(p, name))
        };
        let n = params.iter().filter(|(name, _)| matches(name)).count();
        compose_map_header(out, n, proto);
        for (name, value) in params.iter().filter(|(name, _)| matches(name)) {
            compose_bulk(out, name);
            compose_bulk(out, value);
        }
    }

    /// Answers a wrong password, counts it, and closes the connection at the limit (so a
    /// pipeline cannot try passwords by the hundred thousand on one connection).
    fn wrong_password(&self, session: &mut Session, out: &mut Vec<u8>) -> Outcome {
        CoreStats::add(&self.stats.auth_failures, 1);
        session.auth_failures = session.auth_failures.saturating_add(1);
        compose_error(out, WRONGPASS);
        if self.max_auth_failures > 0 && session.auth_failures >= self.max_auth_failures {
            CoreStats::add(&self.stats.connections_auth_failures, 1);
            compose_error(out, TOO_MANY_FAILURES);
            return Outcome::Close;
        }
        Outcome::Done
    }

    fn check_password(&self, user: Option<&[u8]>, pass: &[u8]) -> bool {
        let Some(expected) = self.password else {
            return false;
        };
        if let Some(user) = user {
            if user != b"default" {
                return false;
            }
        }
        constant_time_eq(expected, pass)
    }
}

const WRONGPASS: &[u8] = b"WRONGPASS invalid username-password pair or user is disabled.";
const TOO_MANY_FAILURES: &[u8] =
    b"ERR too many failed authentication attempts on this connection: closing it";

/// A subscription reply's header: an array on RESP2, a push on RESP3.
fn compose_pubsub_header(out: &mut Vec<u8>, proto: Protocol) {
    out.extend_from_slice(match proto {
        Protocol::Resp3 => b">3\r\n",
        Protocol::Resp2 => b"*3\r\n",
    });
}

/// `CLIENT CACHING yes|no`: applies to the connection's next command.
fn client_caching(yes: bool, session: &mut Session, out: &mut Vec<u8>) {
    let Some(t) = session.tracking.as_deref_mut() else {
        compose_error(out, CACHING_NOT_OPT);
        return;
    };
    match &t.mode {
        Some(m) if m.optin || m.optout => {
            if yes && !m.optin {
                compose_error(
                    out,
                    b"ERR CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode.",
                );
            } else if !yes && !m.optout {
                compose_error(
                    out,
                    b"ERR CLIENT CACHING NO is only valid when tracking is enabled in OPTOUT mode.",
                );
            } else {
                t.caching = Some(yes);
                compose_simple(out, b"OK");
            }
        }
        _ => compose_error(out, CACHING_NOT_OPT),
    }
}

const CACHING_NOT_OPT: &[u8] = b"ERR CLIENT CACHING can be called only when the client is in tracking mode with OPTIN or OPTOUT mode enabled";

/// `CLIENT TRACKINGINFO`: flags, redirect, prefixes, as Redis answers.
fn tracking_info(session: &Session, out: &mut Vec<u8>) {
    let proto = session.proto;
    let t = session.tracking.as_deref();
    let mode: Option<&Mode> = t.and_then(|t| t.mode.as_ref());
    compose_map_header(out, 3, proto);
    compose_bulk(out, b"flags");
    let mut flags: Vec<&[u8]> = Vec::new();
    match mode {
        None => flags.push(b"off"),
        Some(m) => {
            flags.push(b"on");
            if m.bcast {
                flags.push(b"bcast");
            }
            if m.optin {
                flags.push(b"optin");
                if t.is_some_and(|t| t.caching == Some(true)) {
                    flags.push(b"caching-yes");
                }
            }
            if m.optout {
                flags.push(b"optout");
                if t.is_some_and(|t| t.caching == Some(false)) {
                    flags.push(b"caching-no");
                }
            }
            if m.noloop {
                flags.push(b"noloop");
            }
            if m.broken_redirect {
                flags.push(b"broken_redirect");
            }
        }
    }
    crate::resp::compose_set_header(out, flags.len(), proto);
    for f in flags {
        compose_bulk(out, f);
    }
    compose_bulk(out, b"redirect");
    compose_integer(out, mode.map_or(-1, |m| m.redirect as i64));
    compose_bulk(out, b"prefixes");
    let prefixes: &[Box<[u8]>] = mode.map_or(&[], |m| &m.prefixes);
    compose_array_header(out, prefixes.len());
    for p in prefixes {
        compose_bulk(out, p);
    }
}

/// `CLIENT SETNAME | GETNAME | SETINFO | ID | INFO`.
fn execute_client(sub: ClientSub<'_>, session: &mut Session, out: &mut Vec<u8>) {
    match sub {
        ClientSub::SetName { name } => {
            session.name = (!name.is_empty()).then(|| name.into());
            compose_simple(out, b"OK");
        }
        ClientSub::GetName => match &session.name {
            Some(n) => compose_bulk(out, n),
            None => compose_null(out, session.proto),
        },
        ClientSub::SetInfo { attr, value } => {
            if attr.eq_ignore_ascii_case(b"lib-name") {
                session.lib_name = Some(value.into());
            } else if attr.eq_ignore_ascii_case(b"lib-ver") {
                session.lib_ver = Some(value.into());
            }
            compose_simple(out, b"OK");
        }
        ClientSub::Id => compose_integer(out, session.client_id as i64),
        ClientSub::Info => info::compose_client_info(out, session),
        // Handled by `Exec::execute_admin`.
        ClientSub::Tracking(_)
        | ClientSub::Caching { .. }
        | ClientSub::TrackingInfo
        | ClientSub::GetRedir => compose_error(out, b"ERR internal: command in the wrong path"),
        ClientSub::Other { .. } => compose_error(
            out,
            b"ERR unknown subcommand or wrong number of arguments for 'CLIENT'",
        ),
    }
}

fn deferred(keys: Vec<MissKey>, deferred: Deferred) -> Outcome {
    Outcome::Deferred { keys, deferred }
}

/// Length of `*<n>\r\n`.
fn itoa_len(n: usize) -> usize {
    1 + itoa::Buffer::new().format(n).len() + 2
}

/// Compares without an early exit, so timing does not tell how many leading bytes matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0xff);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_is_eq() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret1"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}
