#![deny(unsafe_code)]
//! RESP codec: request parsing, command recognition and reply composition.
//!
//! # Purpose and place on the hit path
//! The engine hands [`parse_request`] the start of a connection's input buffer. The parser
//! fills a reusable `Vec<Range<usize>>` with the byte ranges of each argument and says how
//! many bytes the frame took; [`Args`] is a borrowing view over those ranges and
//! [`parse_command`] turns it into a typed [`Command`] that still borrows the input bytes.
//! Replies are written by the `compose_*` functions straight into the engine's output
//! `Vec<u8>`. The codec knows nothing of the store, of transports or of I/O.
//!
//! # What is supported
//! - Multibulk requests (`*N\r\n$len\r\narg\r\n...`) and inline requests (one line of
//!   whitespace-separated words ending in `\n` or `\r\n`). Inline words may be quoted with
//!   `"..."` or `'...'` at the start of a word; escapes inside quotes (`\n`, `\xHH`, `\'`)
//!   cannot be expressed as ranges of the input and are rejected
//!   ([`Invalid::UnsupportedEscape`]), and a quote in the middle of a bare word is literal.
//! - `*0`, `*-1` and empty inline lines are consumed and yield zero arguments.
//! - Commands: GET, MGET, EXISTS, HGET, HMGET, HGETALL, PING, ECHO, HELLO, AUTH, SELECT,
//!   DBSIZE, INFO, COMMAND (COUNT/DOCS/INFO), CLIENT (SETNAME/GETNAME/SETINFO/ID/INFO), QUIT,
//!   RESET; a static list of Redis write commands is recognised as [`Command::Write`] so the
//!   engine can refuse them; anything else is [`Command::Unknown`].
//!
//! # RESP2 / RESP3
//! Requests are the same in both. Replies differ only where RESP3 has its own type: nulls
//! (`$-1` vs `_`), maps (`*2n` vs `%n`), sets (`*n` vs `~n`) and verbatim strings (bulk vs
//! `=`). The caller tracks the protocol a connection negotiated with HELLO and passes it in.
//!
//! # Invariants
//! - Parsing never panics, never reads past `buf`, and on success returns `consumed <= len`
//!   with every argument range inside `buf[..consumed]`.
//! - Length claims are checked against [`Limits`] as soon as their digits are seen, before
//!   waiting for data: a `$1000000000` claim is `Invalid`, never `Incomplete`.
//! - No heap allocation in steady state: the argument vector is reused by the caller and
//!   replies only grow the output buffer.
//!
//! # Thread model
//! Pure functions over borrowed bytes; each dataplane core uses its own buffers.
//!
//! # Limitations
//! - No resumable parse state: after `Incomplete` the caller re-parses the frame from its
//!   start. Re-parsing skips bulk payloads by length, so it costs O(arguments), not O(bytes).
//! - Length lines must be canonical: digits without sign or leading zeros (`-1` only for
//!   arrays); `$-1` inside a request is invalid, as in Redis.

mod args;
pub mod command;
mod compose;
mod request;

#[cfg(test)]
mod client_compat_tests;
#[cfg(test)]
mod proptests;

pub use args::Args;
pub use command::{
    compose_command_count, compose_command_docs, compose_command_info, compose_command_table,
    is_write_command, parse_command, ClientSub, ClusterSub, Command, CommandError, CommandSub,
    TrackingArgs,
};
pub use compose::{
    compose_array_header, compose_bulk, compose_bulk_header, compose_error, compose_integer,
    compose_map_header, compose_null, compose_request, compose_set_header, compose_simple,
    compose_unknown_command, compose_verbatim, Protocol,
};
pub use request::{
    parse_request, Invalid, Limits, ParseError, DEFAULT_MAX_ARGS, DEFAULT_MAX_BULK_BYTES,
    DEFAULT_MAX_INLINE_BYTES,
};
