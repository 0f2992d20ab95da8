//! Requests that wait for the control plane: what each needs to compose its reply once the
//! missing keys come back.
//!
//! A deferred request keeps only what the hit path had already found (copied bytes for the keys
//! that hit) and the positions of the keys that missed; the control plane answers with one
//! [`FillResult`] per missing key, in order. Composing here uses the same row sections as the hit
//! path, so a reply is the same bytes whether it came from the store or from a fill.

use crate::plane::FillResult;
use crate::resp::Protocol;
use crate::resp::{
    compose_array_header, compose_bulk, compose_error, compose_integer, compose_map_header,
    compose_null,
};
use crate::row::ColumnsView;

/// A run of a multi-key reply.
#[derive(Debug)]
pub(crate) enum Part {
    /// Bytes already composed (the replies of one or more consecutive keys: bulk strings or
    /// nils), in `Deferred::held`.
    Held(std::ops::Range<usize>),
    /// The answer to missing key number `n`.
    Missing(usize),
}

#[derive(Debug)]
pub(crate) enum Deferred {
    Get,
    MGet {
        /// Keys asked for (the reply's array length).
        keys: usize,
        parts: Vec<Part>,
        held: Vec<u8>,
    },
    /// `present` keys were already known to exist; each missing key that turns out to exist adds 1.
    Exists {
        present: i64,
    },
    HGet {
        field: Box<[u8]>,
    },
    HMGet {
        fields: Vec<Box<[u8]>>,
    },
    HGetAll,
}

impl Deferred {
    /// Composes the reply from the control plane's results.
    pub fn compose(&self, results: &[FillResult], proto: Protocol, out: &mut Vec<u8>) {
        if let Some(message) = first_error(results) {
            let mut text = b"ERR origin: ".to_vec();
            text.extend_from_slice(message.as_bytes());
            compose_error(out, &text);
            return;
        }
        match self {
            Deferred::Get => match results.first() {
                Some(FillResult::Row(row)) => out.extend_from_slice(&row.resp_json),
                _ => compose_null(out, proto),
            },
            Deferred::MGet { keys, parts, held } => {
                compose_array_header(out, *keys);
                for part in parts {
                    match part {
                        Part::Held(range) => out.extend_from_slice(&held[range.clone()]),
                        Part::Missing(n) => match results.get(*n) {
                            Some(FillResult::Row(row)) => out.extend_from_slice(&row.resp_json),
                            _ => compose_null(out, proto),
                        },
                    }
                }
            }
            Deferred::Exists { present } => {
                let found = results
                    .iter()
                    .filter(|r| matches!(r, FillResult::Row(_)))
                    .count() as i64;
                compose_integer(out, present + found);
            }
            Deferred::HGet { field } => match results.first() {
                Some(FillResult::Row(row)) => compose_field(out, &row.columns, field, proto),
                _ => compose_null(out, proto),
            },
            Deferred::HMGet { fields } => {
                let columns = match results.first() {
                    Some(FillResult::Row(row)) => Some(&row.columns),
                    _ => None,
                };
                compose_array_header(out, fields.len());
                for field in fields {
                    match columns {
                        Some(c) => compose_field(out, c, field, proto),
                        None => compose_null(out, proto),
                    }
                }
            }
            Deferred::HGetAll => match results.first() {
                Some(FillResult::Row(row)) => compose_all_fields(out, &row.columns, proto),
                _ => compose_map_header(out, 0, proto),
            },
        }
    }
}

fn first_error(results: &[FillResult]) -> Option<&str> {
    results.iter().find_map(|r| match r {
        FillResult::Error(e) => Some(&**e),
        _ => None,
    })
}

/// `HGET` reply from a columns section: the column's text, or nil for NULL or no such column.
pub(crate) fn compose_field(out: &mut Vec<u8>, columns: &[u8], field: &[u8], proto: Protocol) {
    match ColumnsView::new(columns).get(field) {
        Some(Some(value)) => compose_bulk(out, value),
        _ => compose_null(out, proto),
    }
}

/// `HGETALL` reply: every non-NULL column as name/value pairs (Redis hashes have no NULLs).
pub(crate) fn compose_all_fields(out: &mut Vec<u8>, columns: &[u8], proto: Protocol) {
    let view = ColumnsView::new(columns);
    let present = view.iter().filter(|(_, v)| v.is_some()).count();
    compose_map_header(out, present, proto);
    for (name, value) in view.iter() {
        if let Some(value) = value {
            compose_bulk(out, name);
            compose_bulk(out, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::plane::RowBytes;

    #[test]
    fn mget_keeps_the_replies_composed_before_the_first_miss_as_one_run() {
        // Keys 0 and 1 were answered (a hit and a nil) before key 2 missed; key 3 was a hit.
        let held = b"$3\r\nabc\r\n$-1\r\n$1\r\nz\r\n".to_vec();
        let deferred = Deferred::MGet {
            keys: 4,
            parts: vec![Part::Held(0..14), Part::Missing(0), Part::Held(14..21)],
            held,
        };
        let row = Arc::new(RowBytes {
            resp_json: b"$2\r\nmm\r\n".to_vec(),
            columns: Vec::new(),
        });
        let mut out = Vec::new();
        deferred.compose(&[FillResult::Row(row)], Protocol::Resp2, &mut out);
        assert_eq!(out, b"*4\r\n$3\r\nabc\r\n$-1\r\n$2\r\nmm\r\n$1\r\nz\r\n");
        let mut out = Vec::new();
        deferred.compose(&[FillResult::Absent], Protocol::Resp2, &mut out);
        assert_eq!(out, b"*4\r\n$3\r\nabc\r\n$-1\r\n$-1\r\n$1\r\nz\r\n");
    }
}
