//! The layout of a cached row's value: what the control plane writes into the store and what the
//! engine reads back on a hit.
//!
//! An entry carries its row pre-encoded once per way it is read, each in its own store section,
//! so a hit is one optimistic copy of exactly the bytes the reply needs:
//!
//! | section | contents | read by |
//! |---|---|---|
//! | [`SECTION_RESP_JSON`] | the RESP bulk string of the row's JSON, `$<len>\r\n<json>\r\n` | `GET`, `MGET` |
//! | [`SECTION_COLUMNS`] | the columns as `(name, text value or NULL)` pairs, see below | `HGET`, `HMGET`, `HGETALL` |
//!
//! The columns section is `u16 count`, then per column `u16 name_len, name, i32 value_len
//! (-1 for NULL), value`, all little-endian. [`ColumnsView`] reads it back; the bytes come from
//! shared memory written by our own writer, but every length is still checked, so a corrupt
//! section reads as empty instead of panicking.

/// Store section holding the RESP bulk string of the row's JSON.
pub const SECTION_RESP_JSON: usize = 0;
/// Store section holding the row's columns (see the module docs).
pub const SECTION_COLUMNS: usize = 1;

/// Appends the RESP bulk string of `json` (`$<len>\r\n<json>\r\n`).
pub fn encode_resp_json(out: &mut Vec<u8>, json: &[u8]) {
    out.push(b'$');
    out.extend_from_slice(itoa::Buffer::new().format(json.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\r\n");
}

/// Appends the columns section for `columns` (name, text value or `None` for NULL).
///
/// Names longer than `u16::MAX` bytes cannot occur (PostgreSQL limits identifiers to 63 bytes);
/// values longer than `i32::MAX` cannot either (PostgreSQL's 1 GB field limit).
pub fn encode_columns<'a>(
    out: &mut Vec<u8>,
    columns: impl ExactSizeIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
) {
    let count = u16::try_from(columns.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&count.to_le_bytes());
    for (name, value) in columns.take(usize::from(count)) {
        let name = &name[..name.len().min(usize::from(u16::MAX))];
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name);
        match value {
            Some(v) => {
                let v = &v[..v.len().min(i32::MAX as usize)];
                out.extend_from_slice(&(v.len() as i32).to_le_bytes());
                out.extend_from_slice(v);
            }
            None => out.extend_from_slice(&(-1i32).to_le_bytes()),
        }
    }
}

/// A checked view over a columns section.
#[derive(Clone, Copy, Debug)]
pub struct ColumnsView<'a> {
    bytes: &'a [u8],
}

impl<'a> ColumnsView<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        ColumnsView { bytes }
    }

    /// Number of columns announced by the section (0 if it is too short to say).
    pub fn count(&self) -> usize {
        self.bytes
            .get(..2)
            .map(|b| usize::from(u16::from_le_bytes([b[0], b[1]])))
            .unwrap_or(0)
    }

    /// The columns in table order; stops early at the first malformed column.
    pub fn iter(&self) -> ColumnsIter<'a> {
        ColumnsIter {
            rest: self.bytes.get(2..).unwrap_or(&[]),
            left: self.count(),
        }
    }

    /// The value of column `name`: `None` if there is no such column, `Some(None)` for NULL.
    pub fn get(&self, name: &[u8]) -> Option<Option<&'a [u8]>> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

/// Iterator over `(name, value)` of a [`ColumnsView`].
pub struct ColumnsIter<'a> {
    rest: &'a [u8],
    left: usize,
}

impl<'a> Iterator for ColumnsIter<'a> {
    type Item = (&'a [u8], Option<&'a [u8]>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let rest = self.rest;
        let name_len = usize::from(u16::from_le_bytes(rest.get(..2)?.try_into().ok()?));
        let name = rest.get(2..2 + name_len)?;
        let at = 2 + name_len;
        let value_len = i32::from_le_bytes(rest.get(at..at + 4)?.try_into().ok()?);
        let at = at + 4;
        if value_len < 0 {
            self.rest = &rest[at..];
            return Some((name, None));
        }
        let end = at.checked_add(value_len as usize)?;
        let value = rest.get(at..end)?;
        self.rest = &rest[end..];
        Some((name, Some(value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp_json_is_a_bulk_string() {
        let mut out = Vec::new();
        encode_resp_json(&mut out, br#"{"id":1}"#);
        assert_eq!(out, b"$8\r\n{\"id\":1}\r\n");
    }

    #[test]
    fn columns_round_trip() {
        let cols: Vec<(&[u8], Option<&[u8]>)> =
            vec![(b"id", Some(b"1")), (b"name", None), (b"note", Some(b""))];
        let mut out = Vec::new();
        encode_columns(&mut out, cols.iter().copied());
        let view = ColumnsView::new(&out);
        assert_eq!(view.count(), 3);
        assert_eq!(view.iter().collect::<Vec<_>>(), cols);
        assert_eq!(view.get(b"name"), Some(None));
        assert_eq!(view.get(b"id"), Some(Some(&b"1"[..])));
        assert_eq!(view.get(b"missing"), None);
    }

    #[test]
    fn truncated_sections_read_as_short() {
        let cols: Vec<(&[u8], Option<&[u8]>)> = vec![(b"id", Some(b"12345")), (b"x", Some(b"y"))];
        let mut out = Vec::new();
        encode_columns(&mut out, cols.iter().copied());
        for cut in 0..out.len() {
            let view = ColumnsView::new(&out[..cut]);
            assert!(view.iter().count() < 2);
        }
    }
}
