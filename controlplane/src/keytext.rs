//! Canonical key text: is `<pk text>` in a `table:<pk text>` key the origin's own spelling?
//!
//! Cache keys name a row by the *text output* of its primary-key value. Two spellings of one
//! value (`42`, `+42`, `042`) would name one row under two keys, and a WAL change (which
//! carries the canonical text) would refresh only one of them, leaving the other stale. So a
//! key is accepted only when its text is exactly what PostgreSQL's output function would print
//! for the value it denotes: `'<text>'::type::text = '<text>'`.
//!
//! # Rules
//! - `int2`/`int4`/`int8`: `0` or `-?[1-9][0-9]*` within the type's range (`-0`, `+1`, `01`,
//!   spaces are not canonical).
//! - `text`/`varchar`: valid UTF-8 without NUL (the server encoding is UTF8). `name`: the same
//!   and at most 63 bytes (longer input is truncated by `name`'s input function).
//! - `uuid`: lower-case hex in the 8-4-4-4-12 form.
//! - `bool`: `t` or `f`.
//! - anything else (`bpchar` whose padding depends on the typmod, numeric, dates, ...):
//!   [`KeyCheck::Unknown`]; the caller verifies against the origin's text.
//!
//! # Thread model
//! Pure functions; callable from any thread.
//!
//! # Limitations
//! Assumes a UTF8 server encoding and `varchar` without a length limit that would reject the
//! text (a too-long `varchar(n)` key is reported Canonical; the origin finds no row for it).

#![deny(unsafe_code)]

/// The verdict on a key's text for a given primary-key type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyCheck {
    /// The text is the canonical output of the value it denotes.
    Canonical,
    /// The text is not the output of any value, or not the canonical one.
    NotCanonical,
    /// Type without a local check: caller verifies against the origin's text.
    Unknown,
}

const BOOL_OID: u32 = 16;
const NAME_OID: u32 = 19;
const INT8_OID: u32 = 20;
const INT2_OID: u32 = 21;
const INT4_OID: u32 = 23;
const TEXT_OID: u32 = 25;
const VARCHAR_OID: u32 = 1043;
const UUID_OID: u32 = 2950;

/// `NAMEDATALEN - 1`: the longest `name` in bytes.
const NAME_MAX_BYTES: usize = 63;

/// Checks whether `text` is the canonical text output of a value of type `type_oid`.
pub fn check_key_text(type_oid: u32, text: &[u8]) -> KeyCheck {
    let ok = match type_oid {
        INT2_OID => is_canonical_int(text, i16::MIN.into(), i16::MAX.into()),
        INT4_OID => is_canonical_int(text, i32::MIN.into(), i32::MAX.into()),
        INT8_OID => is_canonical_int(text, i64::MIN, i64::MAX),
        TEXT_OID | VARCHAR_OID => is_pg_text(text),
        NAME_OID => text.len() <= NAME_MAX_BYTES && is_pg_text(text),
        UUID_OID => is_canonical_uuid(text),
        BOOL_OID => text == b"t" || text == b"f",
        _ => return KeyCheck::Unknown,
    };
    if ok {
        KeyCheck::Canonical
    } else {
        KeyCheck::NotCanonical
    }
}

/// `0` or `-?[1-9][0-9]*` whose value lies in `min..=max`.
fn is_canonical_int(text: &[u8], min: i64, max: i64) -> bool {
    let (negative, digits) = match text.strip_prefix(b"-") {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    match digits {
        [b'0'] => return !negative,
        [b'1'..=b'9', rest @ ..] if rest.iter().all(u8::is_ascii_digit) => {}
        _ => return false,
    }
    // Accumulate towards the sign so that i64::MIN does not overflow.
    let mut value: i64 = 0;
    for &d in digits {
        let d = i64::from(d - b'0');
        let next = value.checked_mul(10).and_then(|v| {
            if negative {
                v.checked_sub(d)
            } else {
                v.checked_add(d)
            }
        });
        match next {
            Some(v) => value = v,
            None => return false,
        }
    }
    (min..=max).contains(&value)
}

/// Valid UTF-8 without NUL: exactly the strings a UTF8 `text` value can hold.
fn is_pg_text(text: &[u8]) -> bool {
    !text.contains(&0) && std::str::from_utf8(text).is_ok()
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` in lower-case hex.
fn is_canonical_uuid(text: &[u8]) -> bool {
    text.len() == 36
        && text.iter().enumerate().all(|(i, &b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => matches!(b, b'0'..=b'9' | b'a'..=b'f'),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use KeyCheck::{Canonical as C, NotCanonical as N, Unknown as U};

    #[test]
    fn integers() {
        for (text, want) in [
            (&b"0"[..], C),
            (b"42", C),
            (b"-42", C),
            (b"32767", C),
            (b"-32768", C),
            (b"32768", N),
            (b"-32769", N),
            (b"-0", N),
            (b"+1", N),
            (b"01", N),
            (b" 1", N),
            (b"1 ", N),
            (b"", N),
            (b"-", N),
            (b"1a", N),
            (b"1.0", N),
        ] {
            assert_eq!(check_key_text(INT2_OID, text), want, "{text:?}");
        }
        assert_eq!(check_key_text(INT4_OID, b"2147483647"), C);
        assert_eq!(check_key_text(INT4_OID, b"-2147483648"), C);
        assert_eq!(check_key_text(INT4_OID, b"2147483648"), N);
        assert_eq!(check_key_text(INT8_OID, b"9223372036854775807"), C);
        assert_eq!(check_key_text(INT8_OID, b"-9223372036854775808"), C);
        assert_eq!(check_key_text(INT8_OID, b"9223372036854775808"), N);
        assert_eq!(check_key_text(INT8_OID, b"-9223372036854775809"), N);
        assert_eq!(check_key_text(INT8_OID, b"99999999999999999999999"), N);
    }

    #[test]
    fn texts_uuids_bools() {
        assert_eq!(check_key_text(TEXT_OID, b""), C);
        assert_eq!(check_key_text(TEXT_OID, b"a b\n\xc3\xa9"), C);
        assert_eq!(check_key_text(TEXT_OID, b"a\0b"), N);
        assert_eq!(check_key_text(VARCHAR_OID, b"\xc3"), N);
        assert_eq!(check_key_text(NAME_OID, &[b'a'; 63]), C);
        assert_eq!(check_key_text(NAME_OID, &[b'a'; 64]), N);
        assert_eq!(
            check_key_text(UUID_OID, b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
            C
        );
        assert_eq!(
            check_key_text(UUID_OID, b"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"),
            N
        );
        assert_eq!(
            check_key_text(UUID_OID, b"a0eebc999c0b4ef8bb6d6bb9bd380a11"),
            N
        );
        assert_eq!(
            check_key_text(UUID_OID, b"{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}"),
            N
        );
        assert_eq!(
            check_key_text(UUID_OID, b"g0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
            N
        );
        assert_eq!(check_key_text(BOOL_OID, b"t"), C);
        assert_eq!(check_key_text(BOOL_OID, b"f"), C);
        assert_eq!(check_key_text(BOOL_OID, b"true"), N);
        assert_eq!(check_key_text(1700, b"1"), U);
        assert_eq!(check_key_text(1042, b"a"), U);
    }
}
