//! Forwarded batches: the messages sent to the control plane (with the Parse of statements it
//! has not seen replayed first), the statement table kept in step with what was forwarded, and
//! the fill request that follows a point lookup's store miss.
//!
//! Thread model: the owning core. Allocates (the request's message buffer): forwarding is off
//! the hit path.

use crate::pgwire::{parse_frontend, Frontend, Target};
use crate::plane::{ConnToken, CoreStats, MissKey, MissRequest};

use super::batch::remember_parse;
use crate::engine::conn::Conn;
use crate::engine::session::Worker;

impl Worker {
    /// The batch's `end` bytes, preceded by the Parse messages of statements it names that the
    /// control plane has not seen.
    pub(super) fn pg_forward_messages(&self, conn: &Conn, end: usize) -> Vec<u8> {
        let batch = &conn.rbuf[conn.rpos..conn.rpos + end];
        let mut messages = Vec::with_capacity(end);
        let Some(pg) = conn.pg.as_deref() else {
            return batch.to_vec();
        };
        let mut parsed: Vec<&[u8]> = Vec::new();
        let mut replayed: Vec<&[u8]> = Vec::new();
        let mut at = 0;
        while let Ok((msg, n)) = parse_frontend(&batch[at..], &self.pg_limits) {
            at += n;
            let name = match msg {
                Frontend::Parse { name, .. } => {
                    parsed.push(name);
                    continue;
                }
                Frontend::Bind(b) => b.statement,
                Frontend::Describe {
                    target: Target::Statement,
                    name,
                } => name,
                _ => continue,
            };
            if parsed.contains(&name) || replayed.contains(&name) {
                continue;
            }
            if let Some(s) = pg.statements.get(name) {
                if !s.relay_knows && !s.parse.is_empty() {
                    messages.extend_from_slice(&s.parse);
                    replayed.push(name);
                }
            }
        }
        messages.extend_from_slice(batch);
        messages
    }

    /// Brings the statement table in step with a batch that was forwarded.
    pub(super) fn pg_note_statements(&self, conn: &mut Conn, end: usize) {
        let Conn { rbuf, rpos, pg, .. } = conn;
        let Some(pg) = pg.as_deref_mut() else { return };
        let batch = &rbuf[*rpos..*rpos + end];
        let mut at = 0;
        while let Ok((msg, n)) = parse_frontend(&batch[at..], &self.pg_limits) {
            let raw = &batch[at..at + n];
            at += n;
            match msg {
                Frontend::Parse {
                    name,
                    query,
                    param_types,
                } => remember_parse(pg, name, query, param_types, raw, true),
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
                } => {
                    pg.statements.remove(name);
                }
                _ => {}
            }
        }
    }

    /// Asks the control plane to fill the key of a point lookup that missed (reply discarded:
    /// no reply slot waits for it).
    pub(super) fn pg_push_fill(&mut self, conn: &mut Conn, token: ConnToken, table: u32) {
        let Some(pg) = conn.pg.as_deref() else { return };
        let request = MissRequest {
            core: self.port.id(),
            conn: token,
            seq: conn.next_seq,
            keys: vec![MissKey {
                table,
                pk: pg.key_buf.as_slice().into(),
            }],
            bypass: false,
        };
        if self.port.send_miss(request).is_ok() {
            conn.next_seq += 1;
        } else {
            CoreStats::add(&self.stats().pg_queue_full, 1);
        }
        CoreStats::add(&self.stats().keys_miss, 1);
    }
}
