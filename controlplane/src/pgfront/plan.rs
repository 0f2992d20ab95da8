//! Batch planning and reply tracking: the client's frontend messages rewritten for one backend,
//! and the backend's replies filtered back into what the client must see.
//!
//! Named prepared statements are the session's (client name -> [`Stmt`]); on a backend they live
//! under a name derived from their text and parameter types ([`backend_name`]), so sessions that
//! prepare the same statement share it. [`plan_batch`] rewrites names, drops a Parse the backend
//! already has (its ParseComplete is synthesized), injects a hidden Parse before a Bind/Describe
//! of a statement the backend lacks, and answers Close of a statement locally. [`Tracker`] walks
//! the backend's replies in step with the planned messages: it emits the synthesized replies at
//! their place, hides the replies to injected messages, and mirrors the protocol's error rule
//! (after an ErrorResponse, messages up to Sync get no reply).
//!
//! Invariants: replies reach the client in the order PostgreSQL would have sent them for the
//! client's own messages; `prepared` (the backend's statement names) only ever holds names the
//! backend accepted or is about to accept in this batch (a Parse that fails or is skipped after
//! an error is removed again).
//!
//! A Parse reusing a client name that is still open fails with 42P05 raised by pgline (its
//! message text is PostgreSQL's, its other fields are not).
//!
//! The unnamed statement is the session's too ([`Unnamed`]): a Bind or Describe of it in a
//! batch that has not parsed it gets it parsed again, hidden, first, since the backend that
//! runs the batch may hold another session's (or none); with no unnamed statement left, pgline
//! raises PostgreSQL's 26000.
//!
//! Limitations: FunctionCall (`F`) and copy sub-protocol messages are refused.

use std::collections::{HashMap, HashSet};

use bytes::{BufMut, BytesMut};
use pgline_dataplane::pgwire::{self, sqlstate, ErrorFields};
use postgres_protocol::message::frontend;

pub const PARSE_COMPLETE: &[u8] = b"1\0\0\0\x04";
pub const CLOSE_COMPLETE: &[u8] = b"3\0\0\0\x04";

/// Why a batch cannot be planned (the client's fault).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("malformed frontend message")]
    Malformed,
    #[error("unsupported frontend message {0:?}")]
    Unsupported(char),
    #[error("batch does not end with Sync or Query")]
    Unterminated,
}

/// A frontend message: its tag and body (length word stripped).
pub use pgwire::Frame;

/// Splits a run of complete frontend messages (the core has checked their sizes already).
pub fn parse_frames(mut buf: &[u8]) -> Result<Vec<Frame<'_>>, PlanError> {
    let mut frames = Vec::new();
    while !buf.is_empty() {
        let Ok(Some((frame, n))) = pgwire::split_frame(buf, usize::MAX) else {
            return Err(PlanError::Malformed);
        };
        frames.push(frame);
        buf = &buf[n..];
    }
    Ok(frames)
}

/// A NUL-terminated string at the start of `b`, and the rest after the NUL.
pub fn cstr(b: &[u8]) -> Result<(&str, &[u8]), PlanError> {
    let end = b.iter().position(|&c| c == 0).ok_or(PlanError::Malformed)?;
    let s = std::str::from_utf8(&b[..end]).map_err(|_| PlanError::Malformed)?;
    Ok((s, &b[end + 1..]))
}

/// Like [`cstr`], but any bytes: invalid UTF-8 is replaced (for texts only looked at).
fn lossy_cstr(b: &[u8]) -> Result<std::borrow::Cow<'_, str>, PlanError> {
    let end = b.iter().position(|&c| c == 0).ok_or(PlanError::Malformed)?;
    Ok(String::from_utf8_lossy(&b[..end]))
}

/// A named statement of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stmt {
    pub text: String,
    pub oids: Vec<u32>,
    pub backend_name: String,
}

/// `pgl_<16 hex>`: FNV-1a over the text and the parameter type OIDs (stable across runs).
pub fn backend_name(text: &str, oids: &[u32]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: u8| {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    text.bytes().for_each(&mut eat);
    eat(0);
    oids.iter().flat_map(|o| o.to_be_bytes()).for_each(&mut eat);
    format!("pgl_{h:016x}")
}

/// What one planned message expects back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Act {
    /// `name`: the backend statement name it creates; `hidden`: injected by pgline.
    Parse {
        hidden: bool,
        name: Option<String>,
    },
    /// `renamed`: (backend, client) statement names when pgline rewrote the name, so that an
    /// error about the statement names the client's (see [`rename_statement`]).
    Bind {
        renamed: Option<(String, String)>,
    },
    DescribeStatement,
    DescribePortal,
    Execute,
    Close,
    Sync,
    /// `hidden`: pgline's own (the fence: a prepared statement's `[Parse] Bind Execute Sync`,
    /// whose replies up to its ReadyForQuery all belong to this one act).
    Query {
        hidden: bool,
    },
    /// pgline's own snapshot query before a cacheable statement (hidden; its text is kept).
    Snapshot,
    /// pgline's own state query before a batch that runs on a stolen backend (hidden; the
    /// state is kept in [`Tracker::checked`]), see [`add_check`].
    Check,
    /// pgline's `DISCARD SEQUENCES` before a batch on a backend another session may have left
    /// sequence state on (hidden), see [`add_discard_sequences`].
    DiscardSequences,
    /// A Describe of the portal pgline added before a cacheable Execute (hidden; the
    /// RowDescription is kept in [`Tracker::described`]).
    HiddenDescribe,
    /// Answered by pgline at this place (ParseComplete, CloseComplete).
    Local(&'static [u8]),
    /// An ErrorResponse pgline sends at this place; the backend, which never saw the message,
    /// is told nothing, so the messages up to Sync are skipped by pgline alone.
    Fail(Vec<u8>),
}

/// A batch ready for one backend.
#[derive(Debug, Default)]
pub struct Plan {
    pub out: BytesMut,
    pub acts: Vec<Act>,
    /// SQL texts of the batch (Query strings and Parse texts), for session-state detection.
    pub sql: Vec<String>,
    /// The client's named Parses of names the session did not hold that pgline skipped after
    /// an error it raised itself (never planned): like a Parse the backend skipped, they leave
    /// no statement.
    pub skipped_parses: Vec<String>,
    /// The client's named Parses: (index in `acts`, client name). The planner books the name
    /// as open; if that act fails or is skipped after an error, the name must be forgotten
    /// again ([`Tracker::dropped`]), or a retried Parse would get 42P05.
    pub named_parses: Vec<(usize, String)>,
    /// Every `Close S` of a named statement among the client's messages, in order. The
    /// planner forgets the name; a Close that an error made PostgreSQL skip leaves the
    /// statement, so the session holds it again and the core is told ([`PgReply::unclosed`]).
    ///
    /// [`PgReply::unclosed`]: pgline_dataplane::plane::PgReply::unclosed
    pub closes: Vec<NamedClose>,
    /// What the batch does to the session's unnamed statement, in order: (index in `acts`,
    /// the body of a client's `Parse ""` after its name, or None for a Query, which destroys
    /// it, or its Close). See [`Tracker::unnamed`].
    pub unnamed: Vec<(usize, Option<Vec<u8>>)>,
    /// The backend running the batch holds the session's unnamed statement at this point.
    unnamed_here: bool,
}

/// A client's `Close S "name"` of a named statement in a batch (see [`Plan::closes`]).
#[derive(Debug)]
pub struct NamedClose {
    /// The act answering it; None when pgline skipped it after an error it raised itself.
    pub act: Option<usize>,
    /// The statement it took from the session, by name (None: the session held none).
    pub took: Option<(String, Stmt)>,
    /// The act of this batch's Parse that made the statement it took (None: the session
    /// held it before the batch). A skipped Close gives it back only if that Parse stood.
    pub parsed_at: Option<usize>,
}

/// The session's unnamed statement: the body of its last `Parse ""` after the name (text and
/// parameter types, as the client sent them, in any encoding), None when there is none (never
/// parsed, its Parse failed, closed, or a simple Query destroyed it). PostgreSQL keeps it across
/// batches on the one backend; pgline parses it again on whichever backend needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unnamed(pub Option<Vec<u8>>);

/// Rewrites `messages` for a backend whose prepared statement names are `prepared`.
pub fn plan_batch(
    messages: &[u8],
    stmts: &mut HashMap<String, Stmt>,
    unnamed: &Unnamed,
    prepared: &mut HashSet<String>,
) -> Result<Plan, PlanError> {
    let frames = parse_frames(messages)?;
    match frames.last() {
        Some(f) if f.tag == b'S' || f.tag == b'Q' => {}
        _ => return Err(PlanError::Unterminated),
    }
    let mut plan = Plan::default();
    // After an error pgline raised itself, the backend must not see the messages up to Sync
    // (PostgreSQL would skip them).
    let mut skipping = false;
    for f in frames {
        if skipping && f.tag != b'S' {
            if let (b'P', Ok((name, _))) = (f.tag, cstr(f.body)) {
                if !name.is_empty() && !stmts.contains_key(name) {
                    plan.skipped_parses.push(name.to_owned());
                }
            }
            if f.tag == b'C' && matches!(f.body, [b'S', first, ..] if *first != 0) {
                plan.closes.push(NamedClose {
                    act: None,
                    took: None,
                    parsed_at: None,
                });
            }
            continue;
        }
        plan_frame(f, stmts, unnamed, prepared, &mut plan)?;
        skipping = matches!(plan.acts.last(), Some(Act::Fail(_)));
    }
    Ok(plan)
}

fn plan_frame(
    f: Frame<'_>,
    stmts: &mut HashMap<String, Stmt>,
    unnamed: &Unnamed,
    prepared: &mut HashSet<String>,
    plan: &mut Plan,
) -> Result<(), PlanError> {
    match f.tag {
        b'P' => plan_parse(f.body, stmts, prepared, plan)?,
        b'B' => {
            let (_portal, rest) = cstr(f.body)?;
            let (name, _) = cstr(rest)?;
            if name.is_empty() && !ensure_unnamed(unnamed, plan) {
                return Ok(());
            }
            let mut renamed = None;
            match stmts.get(name).filter(|_| !name.is_empty()) {
                Some(st) => {
                    renamed = Some((st.backend_name.clone(), name.to_owned()));
                    ensure_prepared(st, prepared, plan);
                    plan.sql.push(st.text.clone());
                    let portal_len = f.body.len() - rest.len();
                    let tail = &rest[name.len() + 1..];
                    let mut body = Vec::with_capacity(f.body.len() + 24);
                    body.extend_from_slice(&f.body[..portal_len]);
                    body.extend_from_slice(st.backend_name.as_bytes());
                    body.push(0);
                    body.extend_from_slice(tail);
                    put_frame(&mut plan.out, b'B', &body);
                }
                None => put_frame(&mut plan.out, b'B', f.body),
            }
            plan.acts.push(Act::Bind { renamed });
        }
        b'D' | b'C' => {
            let (&variant, rest) = f.body.split_first().ok_or(PlanError::Malformed)?;
            let (name, _) = cstr(rest)?;
            if f.tag == b'D' && variant == b'S' && name.is_empty() && !ensure_unnamed(unnamed, plan)
            {
                return Ok(());
            }
            let statement = variant == b'S' && !name.is_empty();
            if statement && f.tag == b'C' {
                let took = stmts.remove(name).map(|st| (name.to_owned(), st));
                // A Parse of a held name fails, so the last Parse of this name in the batch, if
                // any, made the statement taken.
                let parsed_at = took.as_ref().and_then(|_| {
                    plan.named_parses
                        .iter()
                        .rev()
                        .find(|(_, n)| n == name)
                        .map(|(i, _)| *i)
                });
                plan.closes.push(NamedClose {
                    act: Some(plan.acts.len()),
                    took,
                    parsed_at,
                });
                plan.acts.push(Act::Local(CLOSE_COMPLETE));
                return Ok(());
            }
            match stmts.get(name).filter(|_| statement) {
                Some(st) => {
                    ensure_prepared(st, prepared, plan);
                    let mut body = vec![variant];
                    body.extend_from_slice(st.backend_name.as_bytes());
                    body.push(0);
                    put_frame(&mut plan.out, f.tag, &body);
                }
                None => put_frame(&mut plan.out, f.tag, f.body),
            }
            if f.tag == b'C' && variant == b'S' && name.is_empty() {
                plan.unnamed.push((plan.acts.len(), None));
                plan.unnamed_here = false;
            }
            plan.acts.push(match (f.tag, variant) {
                (b'C', _) => Act::Close,
                (_, b'S') => Act::DescribeStatement,
                _ => Act::DescribePortal,
            });
        }
        b'E' | b'S' | b'H' | b'Q' => {
            put_frame(&mut plan.out, f.tag, f.body);
            match f.tag {
                b'E' => plan.acts.push(Act::Execute),
                b'S' => plan.acts.push(Act::Sync),
                b'Q' => {
                    // Forwarded as sent; the text is kept for statistics and pin rules only,
                    // so a client encoding other than UTF-8 passes through.
                    plan.sql.push(lossy_cstr(f.body)?.into_owned());
                    plan.unnamed.push((plan.acts.len(), None));
                    plan.unnamed_here = false;
                    plan.acts.push(Act::Query { hidden: false });
                }
                _ => {}
            }
        }
        other => return Err(PlanError::Unsupported(char::from(other))),
    }
    Ok(())
}

fn plan_parse(
    body: &[u8],
    stmts: &mut HashMap<String, Stmt>,
    prepared: &mut HashSet<String>,
    plan: &mut Plan,
) -> Result<(), PlanError> {
    let (name, rest) = cstr(body)?;
    if name.is_empty() {
        // Forwarded as sent, like a Query.
        plan.sql.push(lossy_cstr(rest)?.into_owned());
        plan.unnamed.push((plan.acts.len(), Some(rest.to_vec())));
        plan.unnamed_here = true;
        put_frame(&mut plan.out, b'P', body);
        plan.acts.push(Act::Parse {
            hidden: false,
            name: None,
        });
        return Ok(());
    }
    let st = named_stmt(rest)?;
    plan.sql.push(st.text.clone());
    if stmts.contains_key(name) {
        let msg = format!("prepared statement \"{name}\" already exists");
        let mut reply = Vec::new();
        let e = ErrorFields::error(sqlstate::DUPLICATE_PREPARED_STATEMENT, msg.as_bytes());
        pgwire::compose_error_response(&mut reply, &e);
        plan.acts.push(Act::Fail(reply));
        return Ok(());
    }
    plan.named_parses.push((plan.acts.len(), name.to_owned()));
    if prepared.contains(&st.backend_name) {
        plan.acts.push(Act::Local(PARSE_COMPLETE));
    } else {
        write_parse(&st, &mut plan.out);
        prepared.insert(st.backend_name.clone());
        plan.acts.push(Act::Parse {
            hidden: false,
            name: Some(st.backend_name.clone()),
        });
    }
    stmts.insert(name.to_owned(), st);
    Ok(())
}

/// Books the statements the core answered from cache (`PgRequest::statements`: their Parse
/// messages, and a `Close S ""` for an unnamed statement a cached Query destroyed) for the
/// session, without sending anything: a backend gets each one, hidden, when a Bind or Describe
/// first needs it there ([`ensure_prepared`]). A name the session holds already keeps its
/// statement (the relay's is the one the origin accepted).
pub fn book_statements(
    parses: &[u8],
    stmts: &mut HashMap<String, Stmt>,
    unnamed: &mut Unnamed,
) -> Result<(), PlanError> {
    for f in parse_frames(parses)? {
        if f.tag == b'C' && f.body == b"S\0" {
            // A simple Query the core answered destroyed the unnamed statement.
            unnamed.0 = None;
            continue;
        }
        if f.tag != b'P' {
            return Err(PlanError::Malformed);
        }
        let (name, rest) = cstr(f.body)?;
        if name.is_empty() {
            // The core answered the session's latest unnamed Parse: it replaces the relay's.
            unnamed.0 = Some(rest.to_vec());
        } else if !stmts.contains_key(name) {
            stmts.insert(name.to_owned(), named_stmt(rest)?);
        }
    }
    Ok(())
}

/// A named Parse's statement, from the body after its name. It is re-sent under its backend
/// name, so its text must be UTF-8.
fn named_stmt(rest: &[u8]) -> Result<Stmt, PlanError> {
    let (text, rest) = cstr(rest)?;
    let n = rest
        .get(..2)
        .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
        .ok_or(PlanError::Malformed)?;
    let oids: Vec<u32> = rest[2..]
        .chunks_exact(4)
        .take(n)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if oids.len() != n {
        return Err(PlanError::Malformed);
    }
    Ok(Stmt {
        backend_name: backend_name(text, &oids),
        text: text.to_owned(),
        oids,
    })
}

/// What the core must take back after a batch that did not run at all (no origin connection
/// was free, or the session's transaction was lost): the names of the Parses it booked
/// ([`PgReply::unparsed`](pgline_dataplane::plane::PgReply::unparsed); the unnamed one as
/// `""`) and the places of the named Closes whose statement it must hold again
/// ([`PgReply::unclosed`](pgline_dataplane::plane::PgReply::unclosed)): none of the batch
/// ran. The core booked a named Parse only for a name not held at that point of the batch,
/// which `stmts` (untouched by a batch that was never planned) and the batch's own Closes
/// decide; a Close gives back whatever the core held before the batch under its name (one
/// the relay may never have seen), not one a Parse of the batch made, which never existed.
/// Names are raw bytes, as the core keeps them.
pub fn not_run(messages: &[u8], stmts: &HashMap<String, Stmt>) -> (Vec<Vec<u8>>, Vec<u32>) {
    // Whether a name is held at this point of the batch, where the batch changed it, and
    // whether a Parse of the batch made what it holds.
    let mut now: HashMap<&[u8], (bool, bool)> = HashMap::new();
    let mut parsed: Vec<Vec<u8>> = Vec::new();
    let mut unclosed = Vec::new();
    let mut closes = 0u32;
    let held_before = |name: &[u8]| std::str::from_utf8(name).is_ok_and(|n| stmts.contains_key(n));
    for f in parse_frames(messages).unwrap_or_default() {
        match (f.tag, f.body) {
            (b'P', body) => {
                let Some(name) = name_of(body) else { continue };
                let (held, _) = *now.get(name).unwrap_or(&(held_before(name), false));
                if name.is_empty() || !held {
                    now.insert(name, (!name.is_empty(), true));
                    if !parsed.iter().any(|n| n == name) {
                        parsed.push(name.to_vec());
                    }
                }
            }
            (b'C', [b'S', rest @ ..]) => {
                let Some(name) = name_of(rest).filter(|n| !n.is_empty()) else {
                    continue;
                };
                // Not `held`: the core may hold a statement the relay has not seen (one
                // answered from cache), and holds nothing to give back otherwise.
                let (_, made) = *now.get(name).unwrap_or(&(false, false));
                if !made {
                    unclosed.push(closes);
                }
                closes += 1;
                now.insert(name, (false, false));
            }
            _ => {}
        }
    }
    (parsed, unclosed)
}

/// The C string at the start of `body`, as bytes.
fn name_of(body: &[u8]) -> Option<&[u8]> {
    body.iter().position(|&b| b == 0).map(|n| &body[..n])
}

/// The reply to a batch of named Parses and a Sync alone (what libpq's `PQprepare` sends)
/// when every statement is one `known` says a backend of the pool has accepted, the names are
/// new to the session and distinct: a ParseComplete each and ReadyForQuery (idle). The
/// statements are booked in `stmts` as a relayed Parse books them, so the first Bind prepares
/// them on whatever backend runs it. `None` (and `stmts` untouched) for any other batch.
pub fn parse_only(
    messages: &[u8],
    stmts: &mut HashMap<String, Stmt>,
    known: impl Fn(&str) -> bool,
) -> Option<Vec<u8>> {
    let frames = parse_frames(messages).ok()?;
    let (last, parses) = frames.split_last()?;
    if last.tag != b'S' || parses.is_empty() {
        return None;
    }
    let mut new = Vec::with_capacity(parses.len());
    for f in parses {
        if f.tag != b'P' {
            return None;
        }
        let (name, rest) = cstr(f.body).ok()?;
        let st = named_stmt(rest).ok()?;
        let fresh =
            !name.is_empty() && !stmts.contains_key(name) && !new.iter().any(|(n, _)| *n == name);
        if !fresh || !known(&st.backend_name) {
            return None;
        }
        new.push((name, st));
    }
    let mut reply = Vec::with_capacity(new.len() * PARSE_COMPLETE.len() + 6);
    for (name, st) in new {
        stmts.insert(name.to_owned(), st);
        reply.extend_from_slice(PARSE_COMPLETE);
    }
    pgwire::compose_ready_for_query(&mut reply, pgwire::TxStatus::Idle);
    Some(reply)
}

/// Before a Bind or Describe of the unnamed statement: unless the batch parsed it already, parses
/// the session's again, hidden (the backend may hold another session's). With none, plans
/// PostgreSQL's error instead and returns false (the message is not sent).
fn ensure_unnamed(unnamed: &Unnamed, plan: &mut Plan) -> bool {
    if plan.unnamed_here {
        return true;
    }
    let current = match plan.unnamed.last() {
        Some((_, body)) => body.as_deref(),
        None => unnamed.0.as_deref(),
    };
    let Some(body) = current else {
        let mut reply = Vec::new();
        let e = ErrorFields::error(
            sqlstate::UNDEFINED_PSTATEMENT,
            b"unnamed prepared statement does not exist",
        );
        pgwire::compose_error_response(&mut reply, &e);
        plan.acts.push(Act::Fail(reply));
        return false;
    };
    if let Ok(text) = lossy_cstr(body) {
        // For the statement's effects on the backend (`clears_prepared`, ...), as any text.
        plan.sql.push(text.into_owned());
    }
    let mut frame = Vec::with_capacity(body.len() + 1);
    frame.push(0);
    frame.extend_from_slice(body);
    put_frame(&mut plan.out, b'P', &frame);
    plan.acts.push(Act::Parse {
        hidden: true,
        name: None,
    });
    plan.unnamed_here = true;
    true
}

fn ensure_prepared(st: &Stmt, prepared: &mut HashSet<String>, plan: &mut Plan) {
    if prepared.insert(st.backend_name.clone()) {
        write_parse(st, &mut plan.out);
        plan.acts.push(Act::Parse {
            hidden: true,
            name: Some(st.backend_name.clone()),
        });
    }
}

fn write_parse(st: &Stmt, out: &mut BytesMut) {
    // Text and name come from a parsed message (no NUL inside), so encoding cannot fail.
    let _ = frontend::parse(&st.backend_name, &st.text, st.oids.iter().copied(), out);
}

fn put_frame(out: &mut BytesMut, tag: u8, body: &[u8]) {
    out.put_u8(tag);
    out.put_u32(body.len() as u32 + 4);
    out.put_slice(body);
}

/// Appends pgline's fence query to a plan, as the prepared statement
/// [`FENCE_STATEMENT`](super::state::FENCE_STATEMENT) (parsed first if the backend lacks it):
/// `[Parse] Bind Execute Sync`, whose replies up to ReadyForQuery are hidden as one act (see
/// [`Tracker::fence`]).
/// `async_commits`: the session's fence is the insert position whatever its setting
/// ([`OwnSql::fence`](super::state::OwnSql::fence)).
pub fn add_fence(
    plan: &mut Plan,
    prepared: &mut HashSet<String>,
    sql: &super::state::OwnSql,
    async_commits: bool,
) {
    let (name, sql) = sql.fence(async_commits);
    let out = own_statement(name, sql, prepared);
    plan.out.extend_from_slice(&out);
    plan.acts.push(Act::Query { hidden: true });
}

/// One run of pgline's prepared statement `name` (`sql`), parsed first if the backend lacks it
/// (booked in `prepared`): `[Parse] Bind Execute Sync`.
fn own_statement(name: &str, sql: &str, prepared: &mut HashSet<String>) -> BytesMut {
    let parse = prepared.insert(name.to_owned());
    let mut out = BytesMut::new();
    // Fixed texts without NUL: encoding cannot fail.
    let _ = super::backend::compose_prepared(name, sql, parse, &mut out);
    out
}

pub use super::state::{FENCE_SQL, SNAPSHOT_SQL};

/// Makes the Describe of the portal that pgline added (see `results::with_describe`) hidden.
pub fn hide_added_describe(plan: &mut Plan) {
    if let Some(a) = plan.acts.iter_mut().find(|a| **a == Act::DescribePortal) {
        *a = Act::HiddenDescribe;
    }
}

/// Puts pgline's snapshot query before everything in a plan (its reply is hidden; see
/// [`Tracker::snapshot`]).
pub fn add_snapshot(plan: &mut Plan) {
    let mut out = BytesMut::new();
    let _ = frontend::query(SNAPSHOT_SQL, &mut out);
    put_first(plan, out, Act::Snapshot);
}

/// Puts pgline's state query before everything in a plan, as a run of its prepared state
/// statement with a Sync of its own (its reply is hidden; see [`Tracker::checked`]): the state
/// of a stolen backend read in the batch's own round trip. The batch behind it runs whatever
/// the state is, so the caller sends only a batch that [`only_starts_transaction`].
pub fn add_check(plan: &mut Plan, prepared: &mut HashSet<String>, sql: &super::state::OwnSql) {
    let state = super::state::STATE_STATEMENT;
    let out = own_statement(state, sql.state(), prepared);
    put_first(plan, out, Act::Check);
}

/// Puts `DISCARD SEQUENCES` before everything in a plan, as a simple query whose reply is
/// hidden: the batch is a session's first on a backend whose sequence values (`currval`,
/// `lastval`) may be another session's (PostgreSQL answers a session that never used a sequence
/// with SQLSTATE 55000, "not yet defined in this session"). Called before [`add_check`], which
/// then goes first: the state is read before anything changes it.
pub fn add_discard_sequences(plan: &mut Plan) {
    let mut out = BytesMut::new();
    let _ = frontend::query("DISCARD SEQUENCES", &mut out);
    put_first(plan, out, Act::DiscardSequences);
}

fn put_first(plan: &mut Plan, mut out: BytesMut, act: Act) {
    out.extend_from_slice(&plan.out);
    plan.out = out;
    plan.acts.insert(0, act);
    for (i, _) in &mut plan.named_parses {
        *i += 1;
    }
    for (i, _) in &mut plan.unnamed {
        *i += 1;
    }
    for c in &mut plan.closes {
        for i in [c.act.as_mut(), c.parsed_at.as_mut()].into_iter().flatten() {
            *i += 1;
        }
    }
}

/// The longest text [`is_transaction_start`] accepts: its reply, even an error, stays far below
/// one [`super::CHUNK`], so none of it reaches the client before the relay has seen it whole.
const TRANSACTION_START_MAX: usize = 128;

/// Whether `sql` is one `BEGIN` or `START TRANSACTION`, with or without transaction modes:
/// letters, whitespace and commas only (so no literal, function, comment or second statement),
/// then trailing semicolons. It runs no user code and changes no session state, and `ROLLBACK`
/// undoes it; a text that only looks so is a syntax error, which changes nothing either.
pub fn is_transaction_start(sql: &str) -> bool {
    let s = sql.trim_end_matches(|c: char| c == ';' || c.is_ascii_whitespace());
    if sql.len() > TRANSACTION_START_MAX
        || !s
            .bytes()
            .all(|b| b.is_ascii_alphabetic() || b.is_ascii_whitespace() || b == b',')
    {
        return false;
    }
    let mut words = s.split_ascii_whitespace();
    match words.next() {
        Some(w) if w.eq_ignore_ascii_case("begin") => true,
        Some(w) if w.eq_ignore_ascii_case("start") => words
            .next()
            .is_some_and(|w| w.eq_ignore_ascii_case("transaction")),
        _ => false,
    }
}

/// Whether a batch does nothing but start a transaction ([`is_transaction_start`]): one Query,
/// or `[Parse] Bind [Describe] Execute Sync` of the unnamed portal, whose statement is parsed
/// in the batch or is one of the session's named statements (`stmts`); well formed, so that
/// [`plan_batch`] plans it. Such a batch may run on a stolen backend behind that backend's
/// state read ([`add_check`]): if the state is another session's, a `ROLLBACK` takes the batch
/// back and the backend stays its owner's.
pub fn only_starts_transaction(messages: &[u8], stmts: &HashMap<String, Stmt>) -> bool {
    let Ok(frames) = parse_frames(messages) else {
        return false;
    };
    if let [q] = frames.as_slice() {
        return q.tag == b'Q' && cstr(q.body).is_ok_and(|(t, _)| is_transaction_start(t));
    }
    let Some((last, body)) = frames.split_last() else {
        return false;
    };
    let (mut parsed, mut bound, mut executed) = (Vec::new(), false, false);
    for f in body {
        let Ok((name, rest)) = cstr(f.body) else {
            return false;
        };
        let fits = match f.tag {
            // Read as `plan_batch` reads it, so that a batch passed here always plans (a
            // stolen backend's bookkeeping is never left half-planned).
            b'P' => {
                parsed.push(name);
                named_stmt(rest).is_ok_and(|st| is_transaction_start(&st.text))
            }
            // The unnamed portal, bound once, of a statement known to start a transaction.
            b'B' => {
                let Ok((statement, _)) = cstr(rest) else {
                    return false;
                };
                let known = parsed.contains(&statement)
                    || stmts
                        .get(statement)
                        .is_some_and(|st| !statement.is_empty() && is_transaction_start(&st.text));
                let first = !bound;
                bound = true;
                name.is_empty() && first && known
            }
            b'D' => true,
            b'E' => {
                let first = !executed;
                executed = true;
                bound && first && name.is_empty()
            }
            _ => false,
        };
        if !fits {
            return false;
        }
    }
    last.tag == b'S' && executed
}

/// What the last backend message meant for the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Continue,
    /// The backend wants COPY data: answer CopyFail.
    CopyIn {
        /// Started by an Execute: the origin ignored the batch's Sync during copy-in and
        /// waits for another after the CopyFail.
        extended: bool,
    },
    /// The client's last ReadyForQuery went out, with this status.
    ClientDone(u8),
    /// A hidden query finished.
    HiddenDone,
}

/// Follows the backend's replies through a [`Plan`]'s acts.
#[derive(Debug)]
pub struct Tracker {
    acts: Vec<Act>,
    i: usize,
    error: bool,
    last_client: usize,
    /// The LSN the fence query returned.
    pub fence: Option<u64>,
    /// The session state the fence query returned with it (`state::OriginState`).
    pub fence_state: Option<super::state::OriginState>,
    /// The text the snapshot query returned.
    pub snapshot: Option<String>,
    /// How the session resolved names as the snapshot query ran (see `state::SNAPSHOT_SQL`).
    pub snapshot_state: Option<super::state::Resolution>,
    /// The state the check query returned (`None`: it failed).
    pub checked: Option<super::state::OriginState>,
    /// The RowDescription of a hidden Describe.
    pub described: Option<Vec<u8>>,
    /// An ErrorResponse went to the client.
    pub failed: bool,
    /// Indexes of acts that failed or were skipped after an error.
    pub dropped: Vec<usize>,
    /// Indexes of acts the backend answered with an error (a subset of `dropped`).
    pub errored: Vec<usize>,
    /// Set for a backend taken from another session before its state was read: the
    /// NotificationResponses that arrive are that session's, kept in `notifications`.
    pub divert_notifications: bool,
    pub notifications: Vec<u8>,
}

impl Tracker {
    pub fn new(acts: Vec<Act>) -> Tracker {
        let last_client = acts
            .iter()
            .rposition(|a| matches!(a, Act::Sync | Act::Query { hidden: false }))
            .unwrap_or(usize::MAX);
        Tracker {
            acts,
            i: 0,
            error: false,
            last_client,
            fence: None,
            fence_state: None,
            snapshot: None,
            snapshot_state: None,
            checked: None,
            described: None,
            failed: false,
            dropped: Vec::new(),
            errored: Vec::new(),
            divert_notifications: false,
            notifications: Vec::new(),
        }
    }

    /// Emits the synthesized replies due before the next backend reply; skips what an error
    /// made the backend skip.
    fn advance(&mut self, out: &mut Vec<u8>, prepared: &mut HashSet<String>) {
        while let Some(act) = self.acts.get(self.i) {
            match act {
                Act::Sync
                | Act::Query { .. }
                | Act::Snapshot
                | Act::Check
                | Act::DiscardSequences => break,
                Act::Local(bytes) if !self.error => out.extend_from_slice(bytes),
                Act::Fail(bytes) if !self.error => {
                    out.extend_from_slice(bytes);
                    self.error = true;
                    self.failed = true;
                }
                _ if self.error => {
                    if let Act::Parse { name: Some(n), .. } = act {
                        prepared.remove(n);
                    }
                    self.dropped.push(self.i);
                }
                _ => break,
            }
            self.i += 1;
        }
    }

    /// Takes one whole backend message (`frame`, tag included); appends what the client sees.
    pub fn on_message(
        &mut self,
        frame: &[u8],
        out: &mut Vec<u8>,
        prepared: &mut HashSet<String>,
    ) -> Step {
        let tag = frame[0];
        let hidden_now = matches!(
            self.acts.get(self.i),
            Some(Act::Query { hidden: true } | Act::Snapshot | Act::Check | Act::DiscardSequences)
        );
        if matches!(tag, b'N' | b'S' | b'A') {
            // A notification is the session's whenever it arrives (the backend's owner's when
            // this one took it unread); a notice or parameter status during pgline's own
            // statement is pgline's.
            if tag == b'A' && self.divert_notifications {
                self.notifications.extend_from_slice(frame);
            } else if !hidden_now || tag == b'A' {
                out.extend_from_slice(frame);
            }
            return Step::Continue;
        }
        self.advance(out, prepared);
        let Some(act) = self.acts.get(self.i).cloned() else {
            out.extend_from_slice(frame);
            return Step::Continue;
        };
        let renamed;
        let frame = match (&act, tag) {
            (
                Act::Bind {
                    renamed: Some((ours, theirs)),
                },
                b'E',
            ) => {
                renamed = rename_statement(frame, ours, theirs);
                &renamed[..]
            }
            _ => frame,
        };
        let done = match (&act, tag) {
            (Act::Snapshot, _) => {
                match tag {
                    b'D' => {
                        self.snapshot = parse_text_row(frame);
                        self.snapshot_state = super::backend::row_texts(frame)
                            .and_then(|c| super::state::Resolution::from_columns(c.get(1..)?));
                    }
                    b'Z' => {
                        self.i += 1;
                        self.error = false;
                    }
                    _ => {}
                }
                return Step::Continue;
            }
            (Act::Check, _) => {
                match tag {
                    b'D' => {
                        self.checked = super::backend::row_texts(frame)
                            .and_then(|c| super::state::OriginState::from_columns(&c));
                    }
                    b'Z' => {
                        self.i += 1;
                        self.error = false;
                    }
                    _ => {}
                }
                return Step::Continue;
            }
            (Act::DiscardSequences, _) => {
                // An error (none is known for it outside a failed transaction, and a batch
                // that changes backends starts idle) is the backend's and hidden: the batch
                // behind it runs either way.
                if tag == b'Z' {
                    self.i += 1;
                    self.error = false;
                }
                return Step::Continue;
            }
            (Act::HiddenDescribe, b'T' | b'n') => {
                self.described = Some(frame.to_vec()).filter(|_| tag == b'T');
                self.i += 1;
                return Step::Continue;
            }
            // COPY FROM STDIN: the client never sees the CopyInResponse (the session answers
            // it with CopyFail, so the client gets the error and ReadyForQuery).
            (Act::Query { .. }, b'G') => return Step::CopyIn { extended: false },
            (Act::Execute, b'G') => return Step::CopyIn { extended: true },
            (Act::Query { hidden }, _) => {
                if !hidden {
                    self.failed |= tag == b'E';
                    out.extend_from_slice(frame);
                } else if tag == b'D' {
                    self.fence = parse_fence_row(frame);
                    self.fence_state = super::backend::row_texts(frame)
                        .and_then(|c| super::state::OriginState::from_columns(c.get(1..)?));
                }
                match tag {
                    b'Z' => return self.ready(frame),
                    _ => return Step::Continue,
                }
            }
            (Act::Sync, _) => {
                out.extend_from_slice(frame);
                if tag == b'Z' {
                    return self.ready(frame);
                }
                return Step::Continue;
            }
            (_, b'E') => {
                if let Act::Parse { name: Some(n), .. } = &act {
                    prepared.remove(n);
                }
                self.dropped.push(self.i);
                self.errored.push(self.i);
                out.extend_from_slice(frame);
                self.error = true;
                self.failed = true;
                self.i += 1;
                return Step::Continue;
            }
            (Act::Parse { hidden, .. }, _) => {
                if !hidden {
                    out.extend_from_slice(frame);
                }
                return self.complete_if(tag == b'1');
            }
            (Act::Bind { .. }, _) => tag == b'2',
            (Act::Close, _) => tag == b'3',
            (Act::DescribeStatement | Act::DescribePortal | Act::HiddenDescribe, _) => {
                tag == b'T' || tag == b'n'
            }
            (Act::Execute, _) => matches!(tag, b'C' | b'I' | b's'),
            (Act::Local(_) | Act::Fail(_), _) => false,
        };
        out.extend_from_slice(frame);
        self.complete_if(done)
    }

    fn complete_if(&mut self, done: bool) -> Step {
        if done {
            self.i += 1;
        }
        Step::Continue
    }

    fn ready(&mut self, frame: &[u8]) -> Step {
        let idx = self.i;
        self.i += 1;
        self.error = false;
        if idx == self.last_client {
            Step::ClientDone(frame.get(5).copied().unwrap_or(b'I'))
        } else if matches!(self.acts.get(idx), Some(Act::Query { hidden: true })) {
            Step::HiddenDone
        } else {
            Step::Continue
        }
    }

    /// The session's unnamed statement after the batch ran, given `changes` ([`Plan::unnamed`]);
    /// None when the batch left it as it was. A Parse or Query that failed leaves none
    /// (PostgreSQL drops the old statement first); one skipped after an error changes nothing.
    pub fn unnamed(&self, changes: Vec<(usize, Option<Vec<u8>>)>) -> Option<Unnamed> {
        let mut after = None;
        for (i, body) in changes {
            if self.errored.contains(&i) {
                after = Some(Unnamed(None));
            } else if !self.dropped.contains(&i) {
                after = Some(Unnamed(body));
            }
        }
        after
    }

    /// The connection ended before the reply did: the acts not answered yet count as not
    /// done (their Parses made nothing, their Closes closed nothing), as after an error.
    pub fn drop_unanswered(&mut self) {
        for i in self.i..self.acts.len() {
            if !self.dropped.contains(&i) {
                self.dropped.push(i);
            }
        }
    }

    /// Whether hidden acts (the fence) follow the client's last one.
    pub fn has_hidden_tail(&self) -> bool {
        self.acts.len() > self.last_client.saturating_add(1)
    }
}

/// An ErrorResponse with the backend's statement name `ours` (quoted, as PostgreSQL quotes
/// it: `bind message supplies 1 parameters, but prepared statement "pgl_..." requires 2`)
/// replaced by the client's `theirs` in its message, detail and hint; every other field as
/// the origin sent it. Anything that is not a well-formed ErrorResponse is returned as it is.
pub fn rename_statement(frame: &[u8], ours: &str, theirs: &str) -> Vec<u8> {
    let (from, to) = (format!("\"{ours}\""), format!("\"{theirs}\""));
    let Some(fields) = frame.get(5..) else {
        return frame.to_vec();
    };
    let mut body = Vec::with_capacity(fields.len() + to.len());
    let mut rest = fields;
    while let Some((&code, tail)) = rest.split_first() {
        if code == 0 {
            break;
        }
        let Some(end) = tail.iter().position(|&c| c == 0) else {
            return frame.to_vec();
        };
        let value = &tail[..end];
        body.push(code);
        match std::str::from_utf8(value) {
            Ok(text) if matches!(code, b'M' | b'D' | b'H') => {
                body.extend_from_slice(text.replace(&from, &to).as_bytes());
            }
            _ => body.extend_from_slice(value),
        }
        body.push(0);
        rest = &tail[end + 1..];
    }
    body.push(0);
    let mut out = Vec::with_capacity(5 + body.len());
    pgwire::compose_message(&mut out, frame[0], &body);
    out
}

/// The LSN in a DataRow with one text column `X/Y`.
fn parse_fence_row(frame: &[u8]) -> Option<u64> {
    crate::lsn::parse_lsn(&parse_text_row(frame)?)
}

/// The text of a DataRow's first column, if it is not NULL and is UTF-8.
fn parse_text_row(frame: &[u8]) -> Option<String> {
    let cols = crate::origin::data_row(frame.get(5..)?)?;
    let text = cols.into_iter().next()??;
    std::str::from_utf8(text).ok().map(str::to_owned)
}

/// Whether a statement leaves session state on its backend that a later batch on another
/// backend would miss, so the session must keep its backend for good: `SET` (but not
/// `SET LOCAL`, `SET TRANSACTION`, `SET CONSTRAINTS`), `LISTEN`, `PREPARE`, `DECLARE ... WITH
/// HOLD`, any statement with the word `temp`/`temporary` or naming `pg_temp` (temporary
/// objects, `SELECT ... INTO TEMP`), `LOAD`, session-level advisory locks and `set_config`.
/// Comments are skipped. Errs on the side of pinning; `RESET` and `DISCARD` pin nothing.
pub fn leaves_session_state(sql: &str) -> bool {
    let lower = strip_comments(&sql.to_ascii_lowercase());
    if [
        "pg_advisory_lock",
        "pg_try_advisory_lock",
        "set_config",
        "pg_temp",
    ]
    .iter()
    .any(|w| lower.contains(w))
    {
        return true;
    }
    lower.split(';').any(|stmt| {
        let words: Vec<&str> = stmt
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .collect();
        if words.iter().any(|w| matches!(*w, "temp" | "temporary")) {
            return true;
        }
        match words.as_slice() {
            ["set", second, ..] => !matches!(*second, "local" | "transaction" | "constraints"),
            ["listen", ..] | ["prepare", ..] | ["load", ..] => true,
            ["declare", rest @ ..] => rest.windows(2).any(|w| w == ["with", "hold"]),
            _ => false,
        }
    })
}

/// `sql` without `--` and `/* */` comments (not nested; quotes are not tracked, so a `--`
/// inside a string literal cuts the rest of its line: pin rules only).
fn strip_comments(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    loop {
        let line = rest.find("--");
        let block = rest.find("/*");
        match (line, block) {
            (Some(l), b) if b.is_none_or(|b| l < b) => {
                out.push_str(&rest[..l]);
                out.push(' ');
                rest = rest[l..].find('\n').map_or("", |n| &rest[l + n..]);
            }
            (_, Some(b)) => {
                out.push_str(&rest[..b]);
                out.push(' ');
                rest = rest[b + 2..]
                    .find("*/")
                    .map_or("", |e| &rest[b + 2 + e + 2..]);
            }
            _ => {
                out.push_str(rest);
                return out;
            }
        }
    }
}

/// What a statement text may do to the backend it runs on, read from its words once per text
/// (the relay's text cache, `stats::Stats::text`, remembers it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traits {
    /// It may leave session state behind ([`leaves_session_state`]).
    pub leaves_state: bool,
    /// It drops every prepared statement of its backend ([`clears_prepared`]).
    pub clears_prepared: bool,
    /// It names `copy` anywhere: the fence cannot be pipelined behind it.
    pub copy: bool,
    /// It names `begin` or `start` anywhere: it may open a transaction block.
    pub may_open_tx: bool,
    /// It names `synchronous_commit` anywhere: it may make a commit asynchronous that the
    /// session's setting at its next fence does not show (`SET LOCAL`, `set_config(.., true)`,
    /// a `RESET` after the commit).
    pub synchronous_commit: bool,
}

impl Traits {
    pub fn of(sql: &str) -> Traits {
        let lower = sql.to_ascii_lowercase();
        Traits {
            leaves_state: leaves_session_state(sql),
            clears_prepared: clears_prepared(sql),
            copy: lower.contains("copy"),
            may_open_tx: lower.contains("begin") || lower.contains("start"),
            synchronous_commit: lower.contains("synchronous_commit"),
        }
    }
}

/// Whether a statement drops every prepared statement of its backend.
pub fn clears_prepared(sql: &str) -> bool {
    let lower = sql.to_ascii_lowercase();
    lower.split(';').any(|stmt| {
        let words: Vec<&str> = stmt.split_whitespace().take(3).collect();
        matches!(
            words.as_slice(),
            ["discard", "all"] | ["deallocate", "all"] | ["deallocate", "prepare", "all"]
        )
    })
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
