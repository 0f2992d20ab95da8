//! The data set: `rows` rows of table `kv` (keys `kv:0` .. `kv:{rows-1}`), each a JSON object
//! padded to exactly `value_bytes` bytes and different per row, installed in a fresh store the
//! way the control plane installs a fill (RESP bulk string section + columns section), and the
//! same reply bytes kept here so the client can check what comes back.

use std::sync::Arc;

use pgline_dataplane::keyspace::{KeySpace, KeySpaceCell};
use pgline_dataplane::plane::{ControlWakers, Shared};
use pgline_dataplane::row::{encode_columns, encode_resp_json};
use pgline_dataplane::store::{self, EntryData, StoreConfig};

/// Table id of `kv`.
pub const TABLE: u32 = 16384;
/// The key prefix the keyspace maps to [`TABLE`].
pub const PREFIX: &str = "kv";
/// Shortest value the padding scheme supports.
pub const MIN_VALUE_BYTES: usize = 96;

/// Every row's expected GET reply, all of one length.
pub struct Rows {
    replies: Vec<u8>,
    reply_len: usize,
    rows: u32,
}

impl Rows {
    /// Builds the rows; `value_bytes >= MIN_VALUE_BYTES`.
    pub fn new(rows: u32, value_bytes: usize) -> Rows {
        Rows::with_label(rows, value_bytes, "user")
    }

    /// Rows whose `name` is `"{label} {i}"` (tests use a second label to get rows that differ
    /// only past the bytes checked on every reply).
    pub fn with_label(rows: u32, value_bytes: usize, label: &str) -> Rows {
        let mut replies = Vec::new();
        let mut json = Vec::with_capacity(value_bytes);
        let mut reply_len = 0;
        for i in 0..rows {
            row_json(&mut json, i, value_bytes, label);
            let before = replies.len();
            encode_resp_json(&mut replies, &json);
            reply_len = replies.len() - before;
        }
        Rows {
            replies,
            reply_len,
            rows,
        }
    }

    pub fn rows(&self) -> u32 {
        self.rows
    }

    /// Length of one GET reply (`$<len>\r\n<json>\r\n`).
    pub fn reply_len(&self) -> usize {
        self.reply_len
    }

    /// Row `i`'s GET reply.
    pub fn reply(&self, i: u32) -> &[u8] {
        let at = i as usize * self.reply_len;
        &self.replies[at..at + self.reply_len]
    }

    /// A fresh store holding every row, and the shared state of one core serving hits from it.
    pub fn install(&self) -> Result<Arc<Shared>, String> {
        // Four times the data, and at least the shipped default budget: the index is 1/16 of
        // the budget in 7-slot buckets and a full bucket drops its oldest entry, so a small
        // budget loses a few rows (121 MiB kept 99,987 of 100,000).
        let per_row = self.reply_len + 128;
        let cfg = StoreConfig {
            memory_bytes: (self.rows as usize * per_row * 4).max(store::DEFAULT_MEMORY_BYTES),
            ..StoreConfig::default()
        };
        let (mut writer, reader) = store::open(&cfg).map_err(|e| e.to_string())?;
        let mut cols = Vec::new();
        for i in 0..self.rows {
            let pk = i.to_string();
            cols.clear();
            encode_columns(&mut cols, [(&b"id"[..], Some(pk.as_bytes()))].into_iter());
            let sections: [&[u8]; 2] = [self.reply(i), &cols];
            let data = EntryData {
                sections: &sections,
                negative: false,
                lsn: 1,
            };
            writer
                .insert(TABLE, pk.as_bytes(), &data)
                .map_err(|e| format!("insert row {i}: {e}"))?;
        }
        let stats = writer.stats();
        if stats.entries != u64::from(self.rows) || stats.evicted_segments > 0 {
            return Err(format!(
                "the store kept {} of {} rows ({} segments evicted): every GET must hit",
                stats.entries, self.rows, stats.evicted_segments
            ));
        }
        let mut ks = KeySpace::new();
        ks.add(PREFIX, TABLE);
        let shared = Arc::new(Shared::new(
            reader,
            KeySpaceCell::new(ks),
            1,
            4096,
            // The control plane is not running: nothing to wake.
            ControlWakers::none(),
        ));
        shared.control_port().set_serve_hits(true);
        // The writer owns the region the readers map: it lives as long as the process.
        std::mem::forget(writer);
        Ok(shared)
    }
}

/// Writes row `i`'s JSON, padded to exactly `len` bytes.
fn row_json(out: &mut Vec<u8>, i: u32, len: usize, label: &str) {
    out.clear();
    out.extend_from_slice(
        format!(r#"{{"id":{i},"name":"{label} {i}","email":"user{i}@example.com","pad":""#)
            .as_bytes(),
    );
    let pad = len.saturating_sub(out.len() + 2);
    out.resize(out.len() + pad, b'x');
    out.extend_from_slice(br#""}"#);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_have_the_asked_length_and_differ() {
        let rows = Rows::new(1000, 166);
        assert_eq!(rows.reply_len(), 166 + b"$166\r\n\r\n".len());
        assert!(rows.reply(999).starts_with(b"$166\r\n{\"id\":999,"));
        assert_ne!(rows.reply(1), rows.reply(2));
        assert!(rows.reply(0).ends_with(b"x\"}\r\n"));
    }
}
