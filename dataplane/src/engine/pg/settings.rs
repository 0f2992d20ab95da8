//! The session settings guard: cached answers hold the text output pgline's own origin
//! sessions produced, as pgline's role reads the rows, so a session gets them only while the
//! origin, in that session's exact state, would send the same bytes.
//!
//! The rule:
//! - no hits at all unless the session's login user is one the operator lets read the cache
//!   (`EngineConfig::pg_cache_users`: `origin.url`'s user and `pgwire.cache_users`) and its
//!   database is the one pgline caches (`origin.url`'s);
//! - no hits at all unless the relay's last reply said the session's origin state is the
//!   cache's ([`PgReply::serve_cached`](crate::plane::PgReply)): the relay reads it from the
//!   origin at login and after every batch that asked for it (one holding a statement the
//!   cache could answer; any other reply says false, see `serve.rs`'s cache gate) with one
//!   hidden prepared statement: session user
//!   and current role equal to the login user (no `SET ROLE`, no `SET SESSION
//!   AUTHORIZATION`), the resolved search path exactly `pg_catalog, public` with no temporary
//!   relation or type, and the output settings the origin does not report
//!   (`pgfront::state::UNREPORTED` in the control plane: `extra_float_digits`, `bytea_output`,
//!   `lc_monetary`, `transform_null_equals`, `lc_numeric`, `lc_time`, `quote_all_identifiers`,
//!   `array_nulls`, `default_text_search_config`, `timezone_abbreviations`,
//!   `gin_fuzzy_search_limit`, `pg_trgm.similarity_threshold`) as pgline's own sessions have
//!   them. However the state changed
//!   (`SET`, `set_config` under any spelling, a function, a role or database default, startup
//!   `options`), the origin says so; nothing here reads statement text;
//! - no hits at all unless the session's `client_encoding` is `UTF8` (text is stored in the
//!   server's encoding, assumed UTF-8) and `standard_conforming_strings` is on (literal keys
//!   are read with standard quoting);
//! - a lookup returning a column of a date/time type (date, time, timetz, timestamp,
//!   timestamptz, interval, or an array of one) is served only while the session's `DateStyle`
//!   is `ISO, MDY`, its `IntervalStyle` is `postgres`, and its `TimeZone` is UTC (`UTC`,
//!   `Etc/UTC`, `GMT`, `Etc/GMT`): pgline's own origin sessions run with `TimeZone=UTC`, so
//!   on a server whose default zone is another one, date/time columns always go to the origin.
//!
//! The reported settings come from the ParameterStatus messages of every reply the control
//! plane sends (the startup reply, and e.g. the one `SET TimeZone` or a function's
//! `set_config('TimeZone', ...)` produces), scanned by [`ReplyScan`] across chunk boundaries.
//!
//! Invariants: flags only; the hit path reads two booleans. A session starts refused and is
//! served only once a reply vouched for its state. Thread model: the owning core.

/// Type OIDs whose text output depends on DateStyle, IntervalStyle or TimeZone (and arrays).
const DATETIME: [u32; 12] = [
    1082, 1083, 1266, 1114, 1184, 1186, 1182, 1183, 1270, 1115, 1185, 1187,
];

/// Zone names whose timestamptz output is pgline's own (its origin sessions run
/// `TimeZone=UTC`, `crate`-external: `SESSION_OPTIONS` in the control plane's config).
const UTC_NAMES: [&[u8]; 4] = [b"UTC", b"Etc/UTC", b"GMT", b"Etc/GMT"];

/// Whether a column of type `oid` prints differently under other DateStyle/IntervalStyle/
/// TimeZone.
pub(crate) fn is_datetime(oid: u32) -> bool {
    DATETIME.contains(&oid)
}

/// What the session's settings allow.
#[derive(Debug, Default)]
pub(crate) struct Settings {
    date_style_ok: bool,
    interval_style_ok: bool,
    tz_ok: bool,
    encoding_ok: bool,
    /// The relay's last word on the session's origin state (see the module doc).
    origin_state_ok: bool,
    /// `standard_conforming_strings` is off: `'a\\b'` means `a\b` at the origin, not the
    /// text pgline's literal reader sees.
    escapes_in_strings: bool,
    /// The session's user and database may read the cache.
    identity_ok: bool,
}

impl Settings {
    /// Any hit at all.
    #[cfg(test)]
    pub(crate) fn plain(&self) -> bool {
        self.eligible() && self.origin_state_ok
    }

    /// The session may read the cache once the relay vouches for its origin state: its
    /// identity, encoding and string quoting allow it.
    pub(crate) fn eligible(&self) -> bool {
        self.identity_ok && self.encoding_ok && !self.escapes_in_strings
    }

    /// The relay's last word on the session's origin state.
    pub(crate) fn origin_state_ok(&self) -> bool {
        self.origin_state_ok
    }

    /// The StartupMessage's user and database (after its defaults), against the identities
    /// that may read the cache.
    pub(crate) fn note_identity(
        &mut self,
        user: &[u8],
        database: &[u8],
        cache_users: &[String],
        cache_database: Option<&str>,
    ) {
        self.identity_ok = cache_database.is_some_and(|d| d.as_bytes() == database)
            && cache_users.iter().any(|u| u.as_bytes() == user);
    }

    /// Hits returning date/time columns.
    pub(crate) fn datetime_ok(&self) -> bool {
        self.date_style_ok && self.interval_style_ok && self.tz_ok
    }

    /// The relay's verdict on the session's origin state, from a reply that ended Ready.
    pub(crate) fn note_origin_state(&mut self, serve_cached: bool) {
        self.origin_state_ok = serve_cached;
    }

    /// A ParameterStatus; `startup`: part of the startup reply.
    pub(crate) fn note_status(&mut self, name: &[u8], value: &[u8], _startup: bool) {
        match name {
            b"DateStyle" => self.date_style_ok = value == b"ISO, MDY",
            b"IntervalStyle" => self.interval_style_ok = value == b"postgres",
            b"client_encoding" => self.encoding_ok = value == b"UTF8",
            b"standard_conforming_strings" => self.escapes_in_strings = value != b"on",
            b"TimeZone" => self.tz_ok = UTC_NAMES.contains(&value),
            _ => {}
        }
    }
}

/// Finds the ParameterStatus messages in a stream of backend messages delivered in chunks.
#[derive(Debug, Default)]
pub(crate) struct ReplyScan {
    head: [u8; 5],
    have: usize,
    /// Body bytes of the current message not seen yet.
    left: usize,
    /// Collecting the current message's body (a ParameterStatus).
    collect: bool,
    body: Vec<u8>,
}

/// ParameterStatus bodies longer than this are skipped (no setting pgline reads is longer).
const MAX_STATUS: usize = 1024;

impl ReplyScan {
    /// Feeds a chunk; calls `status(name, value)` for every complete ParameterStatus.
    pub(crate) fn feed(&mut self, mut bytes: &[u8], mut status: impl FnMut(&[u8], &[u8])) {
        while !bytes.is_empty() {
            if self.left > 0 {
                let n = self.left.min(bytes.len());
                if self.collect {
                    self.body.extend_from_slice(&bytes[..n]);
                }
                bytes = &bytes[n..];
                self.left -= n;
                if self.left == 0 {
                    self.finish(&mut status);
                }
                continue;
            }
            self.head[self.have] = bytes[0];
            self.have += 1;
            bytes = &bytes[1..];
            if self.have == self.head.len() {
                self.have = 0;
                let [tag, a, b, c, d] = self.head;
                self.left = (u32::from_be_bytes([a, b, c, d]) as usize).saturating_sub(4);
                self.collect = tag == b'S' && self.left <= MAX_STATUS;
                if self.left == 0 {
                    self.finish(&mut status);
                }
            }
        }
    }

    fn finish(&mut self, status: &mut impl FnMut(&[u8], &[u8])) {
        if self.collect {
            let mut parts = self.body.split(|&b| b == 0);
            if let (Some(name), Some(value)) = (parts.next(), parts.next()) {
                status(name, value);
            }
        }
        self.collect = false;
        self.body.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_messages_are_found_across_chunks() {
        let mut stream = Vec::new();
        crate::pgwire::compose_parameter_status(&mut stream, b"TimeZone", b"UTC");
        crate::pgwire::compose_ready_for_query(&mut stream, crate::pgwire::TxStatus::Idle);
        crate::pgwire::compose_parameter_status(&mut stream, b"TimeZone", b"Asia/Tokyo");
        for split in 0..stream.len() {
            let mut scan = ReplyScan::default();
            let mut seen = Vec::new();
            let mut f = |n: &[u8], v: &[u8]| seen.push((n.to_vec(), v.to_vec()));
            scan.feed(&stream[..split], &mut f);
            scan.feed(&stream[split..], &mut f);
            assert_eq!(seen.len(), 2, "split at {split}");
            assert_eq!(seen[1].1, b"Asia/Tokyo");
        }
    }

    #[test]
    fn the_rule() {
        let mut s = Settings::default();
        assert!(!s.plain());
        // Only the cached identity reads the cache.
        let users = ["app".to_string()];
        s.note_identity(b"other", b"appdb", &users, Some("appdb"));
        assert!(!s.identity_ok);
        s.note_identity(b"app", b"otherdb", &users, Some("appdb"));
        assert!(!s.identity_ok);
        s.note_identity(b"app", b"appdb", &users, Some("appdb"));
        for (n, v) in [
            (&b"client_encoding"[..], &b"UTF8"[..]),
            (b"DateStyle", b"ISO, MDY"),
            (b"IntervalStyle", b"postgres"),
            (b"TimeZone", b"Etc/UTC"),
        ] {
            s.note_status(n, v, true);
        }
        // Not before the relay vouched for the session's origin state.
        assert!(!s.plain());
        s.note_origin_state(true);
        assert!(s.plain() && s.datetime_ok());
        s.note_status(b"TimeZone", b"Asia/Tokyo", false);
        assert!(!s.datetime_ok());
        s.note_status(b"TimeZone", b"Etc/UTC", false);
        assert!(s.datetime_ok());
        // A later reply that finds another role, search path or setting turns hits off, and
        // one that finds the clean state again turns them back on.
        s.note_origin_state(false);
        assert!(!s.plain());
        s.note_origin_state(true);
        assert!(s.plain());
        s.note_status(b"standard_conforming_strings", b"off", false);
        assert!(!s.plain());
        s.note_status(b"standard_conforming_strings", b"on", false);
        assert!(s.plain());
        s.note_status(b"client_encoding", b"LATIN1", false);
        assert!(!s.plain());
    }
}
