//! Framing of an open session's input into batches: up to Sync, or one Query. The first
//! [`SHAPE`] messages are kept parsed for `serve.rs` to match the shapes it serves; the batch's
//! end is what a forward sends (`forward.rs`). Copy, FunctionCall and a Query after
//! extended-protocol messages (before their Sync) end the session (0A000), as does bad input
//! (08P01).
//!
//! Thread model: the owning core. Allocates nothing.

use crate::pgwire::{parse_frontend, sqlstate, Frontend, Limits as PgLimits, ParseError};

/// Messages of a batch kept for shape matching (a served batch has at most five).
pub(super) const SHAPE: usize = 5;

/// Where a batch ends and what it looks like.
pub(super) struct Framed<'a> {
    /// Bytes of the batch, terminator included.
    pub end: usize,
    /// Messages in the batch.
    pub count: usize,
    pub shape: [Option<Frontend<'a>>; SHAPE],
    /// The raw bytes of the first message when it is a Parse.
    pub raw_parse: Option<&'a [u8]>,
    /// The batch binds, executes or queries something: it may read or write data or change
    /// session state. A batch of Parse, Describe and Close only (a driver preparing a
    /// statement) does neither.
    pub runs: bool,
    /// The batch parses a named statement (the session's bound on them applies).
    pub names: bool,
}

// A stack value used once per batch: boxing the large variant would allocate on the hit path.
#[allow(clippy::large_enum_variant)]
pub(super) enum Frame<'a> {
    Batch(Framed<'a>),
    Incomplete,
    Terminate,
    Bad(&'static [u8], &'static [u8; 5]),
}

/// Frames the batch at the start of `input` (`max_bytes`: the most a batch may buffer).
pub(super) fn frame<'a>(input: &'a [u8], limits: &PgLimits, max_bytes: usize) -> Frame<'a> {
    let mut at = 0;
    let mut shape = [None; SHAPE];
    let mut count = 0;
    let mut raw_parse = None;
    let mut runs = false;
    let mut names = false;
    loop {
        let (msg, n) = match parse_frontend(&input[at..], limits) {
            Ok(v) => v,
            Err(ParseError::Incomplete) => {
                if input.len() >= max_bytes {
                    return Frame::Bad(
                        b"batch exceeds the size limit",
                        sqlstate::PROTOCOL_VIOLATION,
                    );
                }
                return Frame::Incomplete;
            }
            Err(ParseError::Invalid(kind)) => {
                return Frame::Bad(kind.message().as_bytes(), sqlstate::PROTOCOL_VIOLATION)
            }
        };
        match msg {
            Frontend::Terminate => return Frame::Terminate,
            Frontend::Password(_) => {
                return Frame::Bad(b"unexpected password message", sqlstate::PROTOCOL_VIOLATION)
            }
            Frontend::Unsupported(_) => {
                return Frame::Bad(
                    b"COPY and FunctionCall are not supported by pgline",
                    sqlstate::FEATURE_NOT_SUPPORTED,
                )
            }
            // PostgreSQL runs such a Query as a sync point, unless an earlier message of the
            // batch failed: then it skips the Query and waits for the Sync, which pgline would
            // not read before the batch's reply (the session would hang). No driver sends it.
            Frontend::Query(_) if count > 0 => {
                return Frame::Bad(
                    b"a simple Query before the Sync of an extended-protocol batch is not supported by pgline",
                    sqlstate::FEATURE_NOT_SUPPORTED,
                )
            }
            _ => {}
        }
        runs |= matches!(
            msg,
            Frontend::Bind(_) | Frontend::Execute { .. } | Frontend::Query(_)
        );
        names |= matches!(msg, Frontend::Parse { name, .. } if !name.is_empty());
        if count == 0 && matches!(msg, Frontend::Parse { .. }) {
            raw_parse = Some(&input[..n]);
        }
        if let Some(slot) = shape.get_mut(count) {
            *slot = Some(msg);
        }
        count += 1;
        at += n;
        if matches!(msg, Frontend::Sync | Frontend::Query(_)) {
            return Frame::Batch(Framed {
                end: at,
                count,
                shape,
                raw_parse,
                runs,
                names,
            });
        }
    }
}
