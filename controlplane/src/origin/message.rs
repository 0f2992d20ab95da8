//! Readers of the backend messages every origin connection sees: authentication requests,
//! BackendKeyData, ErrorResponse/NoticeResponse fields and DataRow columns.
//!
//! Invariants: each takes a message as the origin sent it and returns `None` (or empty
//! fields) for a malformed one, never panics and never reads past it. Thread model: pure
//! functions.

/// The authentication request code of an `R` message (tag included), and its data.
pub fn auth_request(frame: &[u8]) -> Option<(i32, &[u8])> {
    if frame.first() != Some(&b'R') {
        return None;
    }
    let code = i32::from_be_bytes(frame.get(5..9)?.try_into().ok()?);
    Some((code, &frame[9..]))
}

/// The process id and secret key of a BackendKeyData message (tag included).
pub fn backend_key(frame: &[u8]) -> Option<(i32, i32)> {
    if frame.first() != Some(&b'K') {
        return None;
    }
    let pid = i32::from_be_bytes(frame.get(5..9)?.try_into().ok()?);
    let secret = i32::from_be_bytes(frame.get(9..13)?.try_into().ok()?);
    Some((pid, secret))
}

/// Severity, SQLSTATE and message of an ErrorResponse or NoticeResponse body; malformed
/// trailing bytes are ignored.
pub fn error_fields(body: &[u8]) -> (String, String, String) {
    let (mut severity, mut code, mut message) = (String::new(), String::new(), String::new());
    let mut rest = body;
    while let Some((&kind, tail)) = rest.split_first() {
        if kind == 0 {
            break;
        }
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        let value = String::from_utf8_lossy(&tail[..end]).into_owned();
        match kind {
            b'V' => severity = value,
            b'S' if severity.is_empty() => severity = value,
            b'C' => code = value,
            b'M' => message = value,
            _ => {}
        }
        rest = tail.get(end + 1..).unwrap_or(&[]);
    }
    (severity, code, message)
}

/// The columns of a DataRow body (length word stripped; `None` for NULL); `None` if the
/// message is malformed. Bytes after the last column are ignored.
pub fn data_row(body: &[u8]) -> Option<Vec<Option<&[u8]>>> {
    let count = usize::try_from(i16::from_be_bytes(body.get(..2)?.try_into().ok()?)).ok()?;
    let mut at = 2;
    let mut cols = Vec::with_capacity(count.min(body.len() / 4));
    for _ in 0..count {
        let len = i32::from_be_bytes(body.get(at..at + 4)?.try_into().ok()?);
        at += 4;
        if len < 0 {
            cols.push(None);
            continue;
        }
        let col = body.get(at..at.checked_add(usize::try_from(len).ok()?)?)?;
        at += col.len();
        cols.push(Some(col));
    }
    Some(cols)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_readers_refuse_short_input() {
        assert_eq!(
            auth_request(b"R\0\0\0\x0c\0\0\0\x05abcd"),
            Some((5, &b"abcd"[..]))
        );
        assert_eq!(auth_request(b"R\0\0\0\x08\0\0"), None);
        assert_eq!(auth_request(b"K\0\0\0\x08\0\0\0\0"), None);
        assert_eq!(
            backend_key(b"K\0\0\0\x0c\0\0\0\x07\xff\xff\xff\xfe"),
            Some((7, -2))
        );
        assert_eq!(backend_key(b"K\0\0\0\x0c\0\0\0\x07\xff"), None);
        assert_eq!(backend_key(b""), None);
    }

    #[test]
    fn data_rows() {
        let mut row = Vec::new();
        row.extend_from_slice(&2i16.to_be_bytes());
        row.extend_from_slice(&(-1i32).to_be_bytes());
        row.extend_from_slice(&2i32.to_be_bytes());
        row.extend_from_slice(b"hi");
        assert_eq!(data_row(&row), Some(vec![None, Some(&b"hi"[..])]));
        for short in 0..row.len() {
            assert_eq!(data_row(&row[..short]), None, "{short}");
        }
        assert_eq!(data_row(&(-1i16).to_be_bytes()), None);
        let mut huge = 1i16.to_be_bytes().to_vec();
        huge.extend_from_slice(&i32::MAX.to_be_bytes());
        assert_eq!(data_row(&huge), None);
    }

    #[test]
    fn error_fields_are_read_leniently() {
        let (s, c, m) = error_fields(b"SERROR\0VERROR\0C42704\0Mslot \"x\" does not exist\0\0");
        assert_eq!((s.as_str(), c.as_str()), ("ERROR", "42704"));
        assert_eq!(m, "slot \"x\" does not exist");
        // Unterminated input does not panic.
        let _ = error_fields(b"Cabc");
    }
}
