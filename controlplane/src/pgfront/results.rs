//! The relay's part of the query-result cache: what a cacheable batch must look like on the
//! backend, and the answer kept from its reply.
//!
//! The core marks a batch cacheable (`PgRequest::cache`) when it is one statement, as a simple
//! Query or as `[Parse] Bind [Describe portal] Execute Sync`. The cached answer is always
//! `RowDescription DataRow* CommandComplete` as the origin sent it (the core drops the
//! RowDescription when a later client did not describe the portal), so a batch without a
//! Describe of its portal gets one added before its Execute, hidden from the client
//! ([`with_describe`], `plan::hide_added_describe`).
//!
//! Invariants: an answer is kept only if the client's reply was exactly that shape (plus
//! ParseComplete, BindComplete, ParameterDescription and the final ReadyForQuery): a notice,
//! an error, an empty query, a suspended portal or a ParameterStatus make it uncacheable.
//! Thread model: called by a session task.

use pgline_dataplane::plane::RESULT_MAX_BYTES;

use super::plan::parse_frames;

/// The client's messages with a Describe of the portal added before the Execute, when the
/// batch binds and executes one portal and does not describe it.
pub fn with_describe(messages: &[u8]) -> Option<Vec<u8>> {
    let frames = parse_frames(messages).ok()?;
    let binds: Vec<_> = frames.iter().filter(|f| f.tag == b'B').collect();
    let executes = frames.iter().filter(|f| f.tag == b'E').count();
    let described = frames
        .iter()
        .any(|f| f.tag == b'D' && f.body.first() == Some(&b'P'));
    if binds.len() != 1 || executes != 1 || described {
        return None;
    }
    let portal_end = binds[0].body.iter().position(|&b| b == 0)?;
    let portal = &binds[0].body[..portal_end];
    let mut out = Vec::with_capacity(messages.len() + portal.len() + 7);
    for f in &frames {
        if f.tag == b'E' {
            out.push(b'D');
            out.extend_from_slice(&(portal.len() as u32 + 6).to_be_bytes());
            out.push(b'P');
            out.extend_from_slice(portal);
            out.push(0);
        }
        out.push(f.tag);
        out.extend_from_slice(&(f.body.len() as u32 + 4).to_be_bytes());
        out.extend_from_slice(f.body);
    }
    Some(out)
}

/// `RowDescription DataRow* CommandComplete` from what the client was sent (`described`: the
/// RowDescription of a hidden Describe), or `None` if the reply is not exactly one successful
/// row-returning statement within [`RESULT_MAX_BYTES`].
pub fn answer_of(sent: &[u8], described: Option<&[u8]>) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(sent.len());
    if let Some(t) = described {
        out.extend_from_slice(t);
    }
    let mut rest = sent;
    let mut complete = false;
    let mut ready = false;
    while !rest.is_empty() {
        let len = u32::from_be_bytes(rest.get(1..5)?.try_into().ok()?) as usize;
        let frame = rest.get(..1 + len)?;
        rest = &rest[1 + len..];
        if ready {
            return None;
        }
        match frame[0] {
            b'1' | b'2' | b't' => {}
            b'T' if out.is_empty() => out.extend_from_slice(frame),
            b'D' if !out.is_empty() && !complete => out.extend_from_slice(frame),
            b'C' if !out.is_empty() && !complete => {
                complete = true;
                out.extend_from_slice(frame);
            }
            b'Z' if complete => ready = true,
            _ => return None,
        }
    }
    (complete && out.len() <= RESULT_MAX_BYTES).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn a_describe_is_added_before_an_undescribed_execute() {
        let batch = [
            msg(b'B', b"p\0s\0\0\0\0\0\0\0"),
            msg(b'E', b"p\0\0\0\0\0"),
            msg(b'S', b""),
        ]
        .concat();
        let added = with_describe(&batch).expect("one portal");
        let expected = [
            msg(b'B', b"p\0s\0\0\0\0\0\0\0"),
            msg(b'D', b"Pp\0"),
            msg(b'E', b"p\0\0\0\0\0"),
            msg(b'S', b""),
        ]
        .concat();
        assert_eq!(added, expected);
        assert_eq!(with_describe(&expected), None);
    }

    #[test]
    fn only_one_whole_answer_is_kept() {
        let t = msg(b'T', b"\0\x01a\0");
        let d = msg(b'D', b"\0\x01\0\0\0\x011");
        let c = msg(b'C', b"SELECT 1\0");
        let z = msg(b'Z', b"I");
        let simple = [t.clone(), d.clone(), c.clone(), z.clone()].concat();
        let answer = [t.clone(), d.clone(), c.clone()].concat();
        assert_eq!(answer_of(&simple, None).as_deref(), Some(&answer[..]));
        let extended = [
            msg(b'1', b""),
            msg(b'2', b""),
            d.clone(),
            c.clone(),
            z.clone(),
        ]
        .concat();
        assert_eq!(answer_of(&extended, Some(&t)).as_deref(), Some(&answer[..]));
        assert_eq!(answer_of(&extended, None), None, "no RowDescription");
        let notice = [
            t.clone(),
            msg(b'N', b"x\0"),
            d.clone(),
            c.clone(),
            z.clone(),
        ]
        .concat();
        assert_eq!(answer_of(&notice, None), None);
        let error = [t.clone(), msg(b'E', b"x\0"), z.clone()].concat();
        assert_eq!(answer_of(&error, None), None);
    }
}
