//! Binary result format for cached point lookups: the binary form of a column value computed
//! exactly from its PostgreSQL text output (what the store's columns section holds).
//!
//! Only types whose binary form is a pure function of their text output are converted:
//! int2/int4/int8/oid (decimal), bool (`t`/`f`), text/varchar/bpchar/name and json (the same
//! bytes), jsonb (version byte 1, then the text), float4/float8 (PostgreSQL >= 12 prints the
//! shortest text that round-trips, so parsing gives the exact value; `Infinity`/`-Infinity`),
//! uuid (16 bytes), bytea (hex output `\x..`), and numeric, date, time, timetz, timestamp,
//! timestamptz and interval (`binary_datetime.rs`; date/time columns are served only while the
//! session prints them as pgline's own sessions do, `settings.rs`). A value the conversion
//! cannot be sure of
//! (`NaN`, whose payload the text does not show; bytea in escape output; anything malformed)
//! makes the whole answer fall back to the origin. Any other type requested in binary is never
//! served (see [`BinaryKind::of`]).
//!
//! Invariants: conversions append to the output and allocate nothing. Thread model: pure
//! functions. Limitations: text is assumed to be in the server's encoding (UTF-8), which the
//! session settings guard (`settings.rs`) checks.

const BOOL: u32 = 16;
const BYTEA: u32 = 17;
const NAME: u32 = 19;
const INT8: u32 = 20;
const INT2: u32 = 21;
const INT4: u32 = 23;
const TEXT: u32 = 25;
const OID: u32 = 26;
const JSON: u32 = 114;
const FLOAT4: u32 = 700;
const FLOAT8: u32 = 701;
const BPCHAR: u32 = 1042;
const VARCHAR: u32 = 1043;
const UUID: u32 = 2950;
const JSONB: u32 = 3802;
const DATE: u32 = 1082;
const TIME: u32 = 1083;
const TIMESTAMP: u32 = 1114;
const TIMESTAMPTZ: u32 = 1184;
const INTERVAL: u32 = 1186;
const TIMETZ: u32 = 1266;
const NUMERIC: u32 = 1700;

use super::binary_datetime::{
    compose_date, compose_interval, compose_numeric, compose_time, compose_timestamp,
};

/// How a column's binary form is made from its text output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BinaryKind {
    Int2,
    Int4,
    Int8,
    Oid,
    Bool,
    /// The same bytes (text, varchar, bpchar, name, json).
    Same,
    Jsonb,
    Float4,
    Float8,
    Uuid,
    Bytea,
    Numeric,
    Date,
    Time,
    TimeTz,
    Timestamp,
    TimestampTz,
    Interval,
}

impl BinaryKind {
    /// The conversion for a column of type `oid`; `None`: never served in binary.
    pub(crate) fn of(oid: u32) -> Option<BinaryKind> {
        Some(match oid {
            INT2 => BinaryKind::Int2,
            INT4 => BinaryKind::Int4,
            INT8 => BinaryKind::Int8,
            OID => BinaryKind::Oid,
            BOOL => BinaryKind::Bool,
            TEXT | VARCHAR | BPCHAR | NAME | JSON => BinaryKind::Same,
            JSONB => BinaryKind::Jsonb,
            FLOAT4 => BinaryKind::Float4,
            FLOAT8 => BinaryKind::Float8,
            UUID => BinaryKind::Uuid,
            BYTEA => BinaryKind::Bytea,
            NUMERIC => BinaryKind::Numeric,
            DATE => BinaryKind::Date,
            TIME => BinaryKind::Time,
            TIMETZ => BinaryKind::TimeTz,
            TIMESTAMP => BinaryKind::Timestamp,
            TIMESTAMPTZ => BinaryKind::TimestampTz,
            INTERVAL => BinaryKind::Interval,
            _ => return None,
        })
    }
}

/// Appends the length-prefixed binary form of `text` (a non-NULL value); `None` when it
/// cannot be produced exactly (the caller then forwards the batch).
pub(crate) fn compose_binary_value(kind: BinaryKind, text: &[u8], out: &mut Vec<u8>) -> Option<()> {
    match kind {
        BinaryKind::Int2 => push_fixed(&parse_int::<i16>(text)?.to_be_bytes(), out),
        BinaryKind::Int4 => push_fixed(&parse_int::<i32>(text)?.to_be_bytes(), out),
        BinaryKind::Int8 => push_fixed(&parse_int::<i64>(text)?.to_be_bytes(), out),
        BinaryKind::Oid => push_fixed(&parse_int::<u32>(text)?.to_be_bytes(), out),
        BinaryKind::Bool => match text {
            b"t" => push_fixed(&[1], out),
            b"f" => push_fixed(&[0], out),
            _ => return None,
        },
        BinaryKind::Same => {
            push_len(text.len(), out)?;
            out.extend_from_slice(text);
        }
        BinaryKind::Jsonb => {
            push_len(text.len() + 1, out)?;
            out.push(1);
            out.extend_from_slice(text);
        }
        BinaryKind::Float4 => push_fixed(&parse_f32(text)?.to_bits().to_be_bytes(), out),
        BinaryKind::Float8 => push_fixed(&parse_float(text)?.to_bits().to_be_bytes(), out),
        BinaryKind::Uuid => push_fixed(&parse_uuid(text)?, out),
        BinaryKind::Bytea => {
            let hex = text.strip_prefix(b"\\x")?;
            if hex.len() % 2 != 0 {
                return None;
            }
            push_len(hex.len() / 2, out)?;
            for pair in hex.chunks_exact(2) {
                out.push(nibble(pair[0])? << 4 | nibble(pair[1])?);
            }
        }
        BinaryKind::Numeric => compose_numeric(text, out)?,
        BinaryKind::Date => compose_date(text, out)?,
        BinaryKind::Time => compose_time(text, false, out)?,
        BinaryKind::TimeTz => compose_time(text, true, out)?,
        BinaryKind::Timestamp => compose_timestamp(text, false, out)?,
        BinaryKind::TimestampTz => compose_timestamp(text, true, out)?,
        BinaryKind::Interval => compose_interval(text, out)?,
    }
    Some(())
}

fn push_fixed(bytes: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn push_len(len: usize, out: &mut Vec<u8>) -> Option<()> {
    out.extend_from_slice(&i32::try_from(len).ok()?.to_be_bytes());
    Some(())
}

/// PostgreSQL's integer output: optional `-`, decimal digits.
fn parse_int<T: std::str::FromStr>(text: &[u8]) -> Option<T> {
    let digits = text.strip_prefix(b"-").unwrap_or(text);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// PostgreSQL's float output: `Infinity`, `-Infinity`, or a decimal/exponent number. `NaN`
/// is refused (its bits are not in the text).
fn parse_float(text: &[u8]) -> Option<f64> {
    match text {
        b"Infinity" => Some(f64::INFINITY),
        b"-Infinity" => Some(f64::NEG_INFINITY),
        _ if float_syntax(text) => std::str::from_utf8(text).ok()?.parse().ok(),
        _ => None,
    }
}

fn parse_f32(text: &[u8]) -> Option<f32> {
    match text {
        b"Infinity" => Some(f32::INFINITY),
        b"-Infinity" => Some(f32::NEG_INFINITY),
        _ if float_syntax(text) => std::str::from_utf8(text).ok()?.parse().ok(),
        _ => None,
    }
}

/// Digits, `-`, `+`, `.`, `e` only (no `inf`/`nan` spellings Rust would also accept).
fn float_syntax(text: &[u8]) -> bool {
    !text.is_empty()
        && text
            .iter()
            .all(|&c| c.is_ascii_digit() || matches!(c, b'-' | b'+' | b'.' | b'e' | b'E'))
}

/// The canonical uuid output `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
fn parse_uuid(text: &[u8]) -> Option<[u8; 16]> {
    if text.len() != 36 {
        return None;
    }
    let mut raw = [0u8; 16];
    let mut n = 0;
    for (i, &c) in text.iter().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            if c != b'-' {
                return None;
            }
            continue;
        }
        let v = nibble(c)?;
        raw[n / 2] |= if n % 2 == 0 { v << 4 } else { v };
        n += 1;
    }
    Some(raw)
}

fn nibble(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|v| v as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin(kind: BinaryKind, text: &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        compose_binary_value(kind, text, &mut out)?;
        Some(out[4..].to_vec())
    }

    #[test]
    fn conversions_match_postgres_send_functions() {
        assert_eq!(bin(BinaryKind::Int2, b"-7"), Some(vec![0xff, 0xf9]));
        assert_eq!(
            bin(BinaryKind::Int4, b"70000"),
            Some(70000i32.to_be_bytes().to_vec())
        );
        assert_eq!(bin(BinaryKind::Int2, b"70000"), None);
        assert_eq!(bin(BinaryKind::Oid, b"4294967295"), Some(vec![0xff; 4]));
        assert_eq!(bin(BinaryKind::Bool, b"t"), Some(vec![1]));
        assert_eq!(bin(BinaryKind::Jsonb, b"{}"), Some(b"\x01{}".to_vec()));
        assert_eq!(bin(BinaryKind::Bytea, b"\\x00ff"), Some(vec![0, 255]));
        assert_eq!(bin(BinaryKind::Bytea, b"abc"), None);
        assert_eq!(
            bin(BinaryKind::Float8, b"0.1"),
            Some(0.1f64.to_bits().to_be_bytes().to_vec())
        );
        assert_eq!(
            bin(BinaryKind::Float4, b"0.1"),
            Some(0.1f32.to_bits().to_be_bytes().to_vec())
        );
        assert_eq!(
            bin(BinaryKind::Float8, b"-Infinity"),
            Some(f64::NEG_INFINITY.to_bits().to_be_bytes().to_vec())
        );
        assert_eq!(bin(BinaryKind::Float8, b"NaN"), None);
        assert_eq!(bin(BinaryKind::Float8, b"inf"), None);
        assert_eq!(
            bin(BinaryKind::Uuid, b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11").map(|v| v[0]),
            Some(0xa0)
        );
    }
}
