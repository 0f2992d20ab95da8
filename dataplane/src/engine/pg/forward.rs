//! What goes to the origin: the [`PgRequest`]s pushed to the control plane's relay (startup,
//! authentication, batches, the session's Close), the messages of a forwarded batch (with the
//! Parse of statements the relay has not seen sent beside them), and the statement table
//! kept in step with what was forwarded. (A point lookup's store miss is not forwarded but filled:
//! `miss.rs`.)
//!
//! Free functions over the parts they need (the core's port, the connection): the session
//! steps in `mod.rs` and the engine's slot table call them.
//!
//! Thread model: the owning core. Allocates (the request's message buffer): forwarding is off
//! the hit path.

use crate::pgwire::{parse_frontend, Frontend, Limits as PgLimits, Target};
use crate::plane::{ConnToken, CorePort, CoreStats, PgRequest, PgRequestKind, ResultKey};

use crate::engine::conn::Conn;

use super::Closing;

/// What the core tells the relay about a batch beside its messages (see [`PgRequest`]).
#[derive(Default)]
pub(super) struct Marks {
    pub fence: bool,
    pub state_free: bool,
    /// Parse messages of statements the relay has not seen ([`forward_messages`]).
    pub statements: Vec<u8>,
}

/// Pushes a request for `conn`; on success the session waits for its reply (except for
/// Close and Cancel, which get none). False when the queue is full (nothing changed).
pub(super) fn push(
    port: &CorePort,
    conn: &mut Conn,
    token: ConnToken,
    kind: PgRequestKind,
    messages: Vec<u8>,
    cache: Option<Box<ResultKey>>,
    marks: Marks,
) -> bool {
    let seq = conn.next_seq;
    // Read before the relay can take the request and read the session's state for it.
    let generation = port.keyspace().generation();
    let mut request = request(port, conn, token, kind, messages, cache);
    request.fence = marks.fence;
    request.state_free = marks.state_free;
    request.statements = marks.statements;
    if port.send_pg(request).is_err() {
        CoreStats::add(&port.stats().pg_queue_full, 1);
        return false;
    }
    conn.next_seq += 1;
    if !matches!(kind, PgRequestKind::Close | PgRequestKind::Cancel) {
        if let Some(pg) = conn.pg.as_mut() {
            pg.waiting = Some(seq);
            pg.asked_generation = generation;
        }
    }
    true
}

/// The request of kind `kind` for `conn`, numbered with its next sequence number (the
/// session's flow-control counters go with its Startup).
fn request(
    port: &CorePort,
    conn: &Conn,
    token: ConnToken,
    kind: PgRequestKind,
    messages: Vec<u8>,
    cache: Option<Box<ResultKey>>,
) -> PgRequest {
    let flow = match (kind, conn.pg.as_ref()) {
        (PgRequestKind::Startup, Some(pg)) => Some(pg.flow.clone()),
        _ => None,
    };
    PgRequest {
        core: port.id(),
        conn: token,
        seq: conn.next_seq,
        session: conn.session.client_id,
        kind,
        messages,
        statements: Vec::new(),
        cache,
        fence: false,
        state_free: false,
        flow,
    }
}

/// The connection is going away: tell the control plane if it knows the session.
pub(crate) fn conn_closed(port: &CorePort, conn: &mut Conn, token: ConnToken) {
    if !conn.pg.as_ref().is_some_and(|pg| pg.opened) {
        return;
    }
    let close = request(port, conn, token, PgRequestKind::Close, Vec::new(), None);
    conn.next_seq += 1;
    // Never refused: a lost Close would leave the control plane's session, and any
    // transaction it holds open, waiting for ever.
    port.send_pg_always(close);
    if let Some(pg) = conn.pg.as_mut() {
        pg.opened = false;
    }
}

/// The batch's `end` bytes, and the Parse messages of the statements it binds, describes or
/// parses again (named ones) that the control plane has not seen, after a `Close S ""` if a
/// Query answered from cache destroyed the unnamed statement (see `PgRequest::statements`).
pub(super) fn forward_messages(conn: &Conn, limits: &PgLimits, end: usize) -> (Vec<u8>, Vec<u8>) {
    let batch = &conn.rbuf[conn.rpos..conn.rpos + end];
    let mut statements = Vec::new();
    let Some(pg) = conn.pg.as_deref() else {
        return (batch.to_vec(), statements);
    };
    if pg.unnamed_dropped {
        statements.extend_from_slice(b"C\0\0\0\x06S\0");
    }
    let mut parsed: Vec<&[u8]> = Vec::new();
    let mut replayed: Vec<&[u8]> = Vec::new();
    let mut at = 0;
    while let Ok((msg, n)) = parse_frontend(&batch[at..], limits) {
        at += n;
        // The statement a message names; a Parse names the one it would replace (if the
        // session holds it, the relay must know it to answer 42P05 as PostgreSQL does).
        let (name, parses) = match msg {
            Frontend::Parse { name, .. } => (name, true),
            Frontend::Bind(b) => (b.statement, false),
            Frontend::Describe {
                target: Target::Statement,
                name,
            } => (name, false),
            _ => continue,
        };
        if parsed.contains(&name) || replayed.contains(&name) {
            continue;
        }
        if parses {
            // Even the unnamed statement the batch replaces: if its Parse is skipped (after
            // an error) or the batch does not run, the session's stays, and later Binds of it
            // go to the relay, which must hold that one, not an older one.
            parsed.push(name);
        }
        if let Some(s) = pg.statements.get(name) {
            if !s.relay_knows && !s.parse.is_empty() {
                statements.extend_from_slice(&s.parse);
                replayed.push(name);
            }
        }
    }
    (batch.to_vec(), statements)
}

/// Brings the statement table in step with a batch that was forwarded.
pub(super) fn note_statements(conn: &mut Conn, limits: &PgLimits, end: usize) {
    let Conn { rbuf, rpos, pg, .. } = conn;
    let Some(pg) = pg.as_deref_mut() else { return };
    pg.unnamed_dropped = false;
    pg.closing.clear();
    // The place of each named Close among the batch's (as the relay counts them).
    let mut closes = 0u32;
    let batch = &rbuf[*rpos..*rpos + end];
    let mut at = 0;
    while let Ok((msg, n)) = parse_frontend(&batch[at..], limits) {
        let raw = &batch[at..at + n];
        at += n;
        match msg {
            // A Parse of a held name fails (42P05) and PostgreSQL keeps the old statement;
            // a held name whose Parse had failed at the origin takes the new one. The core
            // cannot tell which, so the name stops being answered from cache (its Binds go to
            // the relay, which knows) but stays held and counted until the client closes it.
            Frontend::Parse {
                name,
                query,
                param_types,
            } => match pg.statements.get_mut(name) {
                Some(s) if !name.is_empty() => {
                    s.known = false;
                    s.relay_knows = true;
                }
                _ => {
                    pg.remember_parse(name, query, param_types, raw, true);
                    if name.is_empty() {
                        // Whether the origin took it (it may fail, or be skipped after an
                        // earlier error) only the relay sees: later Binds of it go there.
                        if let Some(s) = pg.statements.get_mut(name) {
                            s.known = false;
                        }
                    }
                }
            },
            Frontend::Bind(b) => {
                if let Some(s) = pg.statements.get_mut(b.statement) {
                    s.relay_knows = true;
                }
            }
            Frontend::Describe {
                target: Target::Statement,
                name,
            } => {
                if let Some(s) = pg.statements.get_mut(name) {
                    s.relay_knows = true;
                }
            }
            Frontend::Close {
                target: Target::Statement,
                name,
            } if !name.is_empty() => {
                // Kept until the reply tells whether the origin skipped the Close.
                if let Some(statement) = pg.forget_statement(name) {
                    pg.closing.push(Closing {
                        place: closes,
                        name: name.into(),
                        statement,
                    });
                }
                closes += 1;
            }
            Frontend::Close {
                target: Target::Statement,
                ..
            }
            // A simple Query destroys the unnamed statement.
            | Frontend::Query(_) => {
                pg.forget_statement(b"");
            }
            _ => {}
        }
    }
}
