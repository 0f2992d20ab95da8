//! Row JSON encoding: PostgreSQL text output -> `row_to_json(t)::text`, byte for byte.
//!
//! pgline serves `GET users:42` as the JSON of row 42. The control plane receives column values
//! in PostgreSQL *text output* format (pgoutput tuples in the WAL, `col::text` in fills) and must
//! produce exactly the bytes that the origin's `row_to_json(t)::text` would give, so a cached
//! answer is indistinguishable from the origin's. This module is that conversion; it runs in the
//! control plane when an entry is filled or refreshed, never on the dataplane hit path.
//!
//! # Rules (mirroring `json_categorize_type` / `datum_to_json` in PostgreSQL 15's `json.c`)
//! - `int2`, `int4`, `int8`, `float4`, `float8`, `numeric` ([`JsonKind::Number`]): the text
//!   raw when it is a valid JSON number (`-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`),
//!   else a JSON string (`"NaN"`, `"Infinity"`, `"-Infinity"`). `oid` is *not* numeric in
//!   PostgreSQL (it renders `"1"`), so it is [`JsonKind::Text`] here too.
//! - `bool`: `t`/`f` -> `true`/`false`. `json`, `jsonb`: the text raw.
//! - `date`: the ISO text is already the XSD form (including `" BC"` and `infinity`), quoted.
//! - `timestamp`/`timestamptz`: the space between date and time becomes `T`; a bare `+HH`
//!   offset becomes `+HH:00` (`+05:30` and `+HH:MM:SS` stay); `" BC"` and `infinity` stay.
//! - arrays: JSON arrays, nested per dimension, explicit bounds (`[0:1]=`) dropped, `NULL`
//!   elements -> `null`, each element encoded by its element type's rule. `int2vector` and
//!   `oidvector` (space-separated text) are arrays too, as in PostgreSQL.
//! - everything else: a JSON string escaped like PostgreSQL's `escape_json`.
//!
//! # Invariants and input contract
//! The text values must come from a session with `TimeZone=UTC` (or the zone the origin's
//! `row_to_json` would use), `DateStyle=ISO, MDY`, `IntervalStyle=postgres` and
//! `extra_float_digits=1`; the caller resolves domains to their base type before
//! [`json_kind`]. Malformed input never panics: an array whose text does not parse is emitted
//! as a JSON string instead, `values` shorter than `columns` yields `null` for the missing ones.
//!
//! # Thread model
//! Pure functions over borrowed bytes; callable from any thread.
//!
//! # Limitations (differences from PostgreSQL)
//! - Composite columns (and `record[]`) are nested JSON objects in `row_to_json`; here they are
//!   strings, because the text output does not carry the field types.
//! - `box[]` uses `;` as its element delimiter; [`JsonKind`] does not carry delimiters, so a
//!   `box[]` column is mis-split. Types with a cast to `json` (extensions such as `hstore`)
//!   use that cast in PostgreSQL and plain strings here.
//! - A NUL byte (impossible in PostgreSQL text) is escaped as `\u0000`, where `escape_json`
//!   would stop at it.

#![deny(unsafe_code)]

/// How a column's text output is rendered in JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JsonKind {
    /// int2/int4/int8/float4/float8/numeric: raw when a valid JSON number, else a string.
    Number,
    /// bool: `t`/`f` -> `true`/`false`.
    Bool,
    /// json, jsonb: the text as is.
    Raw,
    /// date: quoted ISO text.
    Date,
    /// timestamp without time zone: XSD form.
    Timestamp,
    /// timestamp with time zone: XSD form with a `+HH:MM` offset.
    TimestampTz,
    /// Any other type: an escaped JSON string.
    Text,
    /// An array whose elements are rendered by the boxed kind.
    Array(Box<JsonKind>),
}

/// One column of a row: its name (escaped into the JSON key) and how its value is rendered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonColumn {
    pub name: String,
    pub kind: JsonKind,
}

const BOOL_OID: u32 = 16;
const INT8_OID: u32 = 20;
const INT2_OID: u32 = 21;
const INT4_OID: u32 = 23;
const JSON_OID: u32 = 114;
const FLOAT4_OID: u32 = 700;
const FLOAT8_OID: u32 = 701;
const DATE_OID: u32 = 1082;
const TIMESTAMP_OID: u32 = 1114;
const TIMESTAMPTZ_OID: u32 = 1184;
const NUMERIC_OID: u32 = 1700;
const JSONB_OID: u32 = 3802;

/// Built-in array types `(array oid, element oid)` whose element is a base, pseudo, range or
/// multirange type (PostgreSQL 15 `pg_type`, `typsubscript = array_subscript_handler`).
const ARRAY_TYPES: &[(u32, u32)] = &[
    (22, 21),     // int2
    (30, 26),     // oid
    (143, 142),   // xml
    (199, 114),   // json
    (271, 5069),  // xid8
    (629, 628),   // line
    (651, 650),   // cidr
    (719, 718),   // circle
    (775, 774),   // macaddr8
    (791, 790),   // money
    (1000, 16),   // bool
    (1001, 17),   // bytea
    (1002, 18),   // char
    (1003, 19),   // name
    (1005, 21),   // int2
    (1006, 22),   // int2vector
    (1007, 23),   // int4
    (1008, 24),   // regproc
    (1009, 25),   // text
    (1010, 27),   // tid
    (1011, 28),   // xid
    (1012, 29),   // cid
    (1013, 30),   // oidvector
    (1014, 1042), // bpchar
    (1015, 1043), // varchar
    (1016, 20),   // int8
    (1017, 600),  // point
    (1018, 601),  // lseg
    (1019, 602),  // path
    (1020, 603),  // box
    (1021, 700),  // float4
    (1022, 701),  // float8
    (1027, 604),  // polygon
    (1028, 26),   // oid
    (1034, 1033), // aclitem
    (1040, 829),  // macaddr
    (1041, 869),  // inet
    (1115, 1114), // timestamp
    (1182, 1082), // date
    (1183, 1083), // time
    (1185, 1184), // timestamptz
    (1187, 1186), // interval
    (1231, 1700), // numeric
    (1263, 2275), // cstring
    (1270, 1266), // timetz
    (1561, 1560), // bit
    (1563, 1562), // varbit
    (2201, 1790), // refcursor
    (2207, 2202), // regprocedure
    (2208, 2203), // regoper
    (2209, 2204), // regoperator
    (2210, 2205), // regclass
    (2211, 2206), // regtype
    (2287, 2249), // record
    (2949, 2970), // txid_snapshot
    (2951, 2950), // uuid
    (3221, 3220), // pg_lsn
    (3643, 3614), // tsvector
    (3644, 3642), // gtsvector
    (3645, 3615), // tsquery
    (3735, 3734), // regconfig
    (3770, 3769), // regdictionary
    (3807, 3802), // jsonb
    (3905, 3904), // int4range
    (3907, 3906), // numrange
    (3909, 3908), // tsrange
    (3911, 3910), // tstzrange
    (3913, 3912), // daterange
    (3927, 3926), // int8range
    (4073, 4072), // jsonpath
    (4090, 4089), // regnamespace
    (4097, 4096), // regrole
    (4192, 4191), // regcollation
    (5039, 5038), // pg_snapshot
    (6150, 4451), // int4multirange
    (6151, 4532), // nummultirange
    (6152, 4533), // tsmultirange
    (6153, 4534), // tstzmultirange
    (6155, 4535), // datemultirange
    (6157, 4536), // int8multirange
];

/// Maximum array dimensions accepted (PostgreSQL's `MAXDIM`).
const MAX_DIMS: usize = 6;

/// The JSON rendering of built-in type `type_oid`; unknown types (enums, user types) -> Text.
pub fn json_kind(type_oid: u32) -> JsonKind {
    match type_oid {
        BOOL_OID => JsonKind::Bool,
        INT2_OID | INT4_OID | INT8_OID | FLOAT4_OID | FLOAT8_OID | NUMERIC_OID => JsonKind::Number,
        JSON_OID | JSONB_OID => JsonKind::Raw,
        DATE_OID => JsonKind::Date,
        TIMESTAMP_OID => JsonKind::Timestamp,
        TIMESTAMPTZ_OID => JsonKind::TimestampTz,
        _ => match array_element_oid(type_oid) {
            Some(elem) => JsonKind::Array(Box::new(json_kind(elem))),
            None => JsonKind::Text,
        },
    }
}

/// The element type of built-in array type `array_oid`, or None if it is not one.
pub fn array_element_oid(array_oid: u32) -> Option<u32> {
    ARRAY_TYPES
        .iter()
        .find(|(arr, _)| *arr == array_oid)
        .map(|(_, elem)| *elem)
}

/// Appends the row's JSON to `out`. `values[i]` is None for SQL NULL.
///
/// Keys are the column names in column order; a missing value (`values` shorter than
/// `columns`) is `null`, extra values are ignored.
pub fn encode_row_json(out: &mut Vec<u8>, columns: &[JsonColumn], values: &[Option<&[u8]>]) {
    out.push(b'{');
    for (i, column) in columns.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        escape_json_string(out, column.name.as_bytes());
        out.push(b':');
        match values.get(i).copied().flatten() {
            None => out.extend_from_slice(b"null"),
            Some(text) => compose_value(out, &column.kind, text),
        }
    }
    out.push(b'}');
}

/// Appends `s` as a quoted JSON string escaped like PostgreSQL's `escape_json`.
pub fn escape_json_string(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    escape_json_body(out, s);
    out.push(b'"');
}

/// The escaping of [`escape_json_string`] without the surrounding quotes.
fn escape_json_body(out: &mut Vec<u8>, s: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut start = 0;
    for (i, &b) in s.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x0c => b"\\f",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&s[start..i]);
        start = i + 1;
        if short.is_empty() {
            let u = [
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 15)],
            ];
            out.extend_from_slice(&u);
        } else {
            out.extend_from_slice(short);
        }
    }
    out.extend_from_slice(&s[start..]);
}

/// Appends one non-NULL value of kind `kind` given its text output.
fn compose_value(out: &mut Vec<u8>, kind: &JsonKind, text: &[u8]) {
    match kind {
        JsonKind::Number if is_json_number(text) => out.extend_from_slice(text),
        JsonKind::Bool if text == b"t" => out.extend_from_slice(b"true"),
        JsonKind::Bool if text == b"f" => out.extend_from_slice(b"false"),
        JsonKind::Raw => out.extend_from_slice(text),
        JsonKind::Timestamp => compose_xsd_timestamp(out, text, false),
        JsonKind::TimestampTz => compose_xsd_timestamp(out, text, true),
        JsonKind::Array(elem) => {
            let mark = out.len();
            if compose_array(out, elem, text).is_err() {
                out.truncate(mark);
                escape_json_string(out, text);
            }
        }
        JsonKind::Number | JsonKind::Bool | JsonKind::Date | JsonKind::Text => {
            escape_json_string(out, text)
        }
    }
}

/// True when `s` is exactly one JSON number (PostgreSQL's `IsValidJsonNumber`).
fn is_json_number(s: &[u8]) -> bool {
    let s = s.strip_prefix(b"-").unwrap_or(s);
    let digits = |s: &[u8], i: usize| s[i..].iter().take_while(|b| b.is_ascii_digit()).count();
    let mut i = match s.first() {
        Some(b'0') => 1,
        Some(b'1'..=b'9') => 1 + digits(s, 1),
        _ => return false,
    };
    if s.get(i) == Some(&b'.') {
        let n = digits(s, i + 1);
        if n == 0 {
            return false;
        }
        i += 1 + n;
    }
    if matches!(s.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(s.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let n = digits(s, i);
        if n == 0 {
            return false;
        }
        i += n;
    }
    i == s.len()
}

/// Appends an ISO timestamp text (`YYYY-MM-DD HH:MM:SS[.f][+HH[:MM[:SS]]][ BC]`) in XSD form.
///
/// Text without a date/time space (`infinity`, `-infinity`) is quoted unchanged.
fn compose_xsd_timestamp(out: &mut Vec<u8>, text: &[u8], with_tz: bool) {
    let Some(space) = text.iter().position(|&b| b == b' ') else {
        return escape_json_string(out, text);
    };
    let (date, rest) = (&text[..space], &text[space + 1..]);
    let (rest, bc) = match rest.strip_suffix(b" BC") {
        Some(r) => (r, true),
        None => (rest, false),
    };
    out.push(b'"');
    escape_json_body(out, date);
    out.push(b'T');
    escape_json_body(out, rest);
    if with_tz {
        // The time part has no sign, so the first sign starts the offset.
        let sign = rest.iter().position(|&b| b == b'+' || b == b'-');
        if sign.is_some_and(|p| rest.len() - p == 3) {
            out.extend_from_slice(b":00");
        }
    }
    if bc {
        out.extend_from_slice(b" BC");
    }
    out.push(b'"');
}

/// The array text did not parse; the caller falls back to a JSON string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Malformed;

/// Appends an array's text output (`{...}`, `[lb:ub]={...}` or a space-separated vector) as
/// nested JSON arrays whose elements are rendered by `elem`.
fn compose_array(out: &mut Vec<u8>, elem: &JsonKind, text: &[u8]) -> Result<(), Malformed> {
    let mut body = text;
    if body.first() == Some(&b'[') {
        // Dimension decoration: `[lb:ub][lb:ub]=`; the bounds do not appear in JSON.
        let eq = body.iter().position(|&b| b == b'=').ok_or(Malformed)?;
        body = &body[eq + 1..];
    }
    if body.first() != Some(&b'{') {
        return compose_vector(out, elem, text);
    }
    let mut parser = ArrayParser {
        text: body,
        pos: 0,
        scratch: Vec::new(),
    };
    parser.compose_level(out, elem, 1)?;
    if parser.pos != body.len() {
        return Err(Malformed);
    }
    Ok(())
}

/// `int2vector`/`oidvector` text: elements separated by single spaces, no NULLs, no quoting.
fn compose_vector(out: &mut Vec<u8>, elem: &JsonKind, text: &[u8]) -> Result<(), Malformed> {
    if text
        .iter()
        .any(|&b| matches!(b, b'{' | b'}' | b'[' | b'=' | b'"' | b'\\' | b','))
    {
        return Err(Malformed);
    }
    out.push(b'[');
    for (i, item) in text
        .split(|&b| b == b' ')
        .filter(|s| !s.is_empty())
        .enumerate()
    {
        if i > 0 {
            out.push(b',');
        }
        compose_value(out, elem, item);
    }
    out.push(b']');
    Ok(())
}

/// Cursor over the `{...}` part of an array's text output.
struct ArrayParser<'a> {
    text: &'a [u8],
    pos: usize,
    /// Unescaped bytes of the current quoted element.
    scratch: Vec<u8>,
}

impl ArrayParser<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.pos += 1;
        }
    }

    /// Parses one `{...}` level at `self.pos`, appending a JSON array.
    fn compose_level(
        &mut self,
        out: &mut Vec<u8>,
        elem: &JsonKind,
        depth: usize,
    ) -> Result<(), Malformed> {
        if depth > MAX_DIMS || self.peek() != Some(b'{') {
            return Err(Malformed);
        }
        self.pos += 1;
        out.push(b'[');
        self.skip_space();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            out.push(b']');
            return Ok(());
        }
        loop {
            self.skip_space();
            match self.peek() {
                Some(b'{') => self.compose_level(out, elem, depth + 1)?,
                Some(b'"') => {
                    self.parse_quoted()?;
                    let scratch = std::mem::take(&mut self.scratch);
                    compose_value(out, elem, &scratch);
                    self.scratch = scratch;
                }
                Some(_) => self.compose_unquoted(out, elem)?,
                None => return Err(Malformed),
            }
            self.skip_space();
            match self.peek() {
                Some(b',') => out.push(b','),
                Some(b'}') => {
                    self.pos += 1;
                    out.push(b']');
                    return Ok(());
                }
                _ => return Err(Malformed),
            }
            self.pos += 1;
        }
    }

    /// Reads a `"..."` element into `scratch`, undoing backslash escapes.
    fn parse_quoted(&mut self) -> Result<(), Malformed> {
        self.scratch.clear();
        self.pos += 1;
        loop {
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    let b = self.text.get(self.pos + 1).copied().ok_or(Malformed)?;
                    self.scratch.push(b);
                    self.pos += 2;
                }
                Some(b) => {
                    self.scratch.push(b);
                    self.pos += 1;
                }
                None => return Err(Malformed),
            }
        }
    }

    /// Appends an unquoted element (`NULL` -> `null`), which ends at `,` or `}`.
    fn compose_unquoted(&mut self, out: &mut Vec<u8>, elem: &JsonKind) -> Result<(), Malformed> {
        let start = self.pos;
        while let Some(b) = self.peek() {
            match b {
                b',' | b'}' => break,
                b'{' | b'"' | b'\\' => return Err(Malformed),
                _ => self.pos += 1,
            }
        }
        let item = self.text[start..self.pos].trim_ascii_end();
        if item.eq_ignore_ascii_case(b"NULL") {
            out.extend_from_slice(b"null");
        } else {
            compose_value(out, elem, item);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(kind: JsonKind, text: &[u8]) -> String {
        let mut out = Vec::new();
        compose_value(&mut out, &kind, text);
        String::from_utf8(out).expect("utf-8 in, utf-8 out")
    }

    fn arr(elem: JsonKind) -> JsonKind {
        JsonKind::Array(Box::new(elem))
    }

    #[test]
    fn escapes_like_escape_json() {
        let mut out = Vec::new();
        escape_json_string(&mut out, b"a\"b\\c\x08\x0c\n\r\t\x01\x1b\x1f\x7f \xc3\xa9/");
        assert_eq!(
            out,
            b"\"a\\\"b\\\\c\\b\\f\\n\\r\\t\\u0001\\u001b\\u001f\x7f \xc3\xa9/\"".to_vec()
        );
        out.clear();
        escape_json_string(&mut out, b"");
        assert_eq!(out, b"\"\"");
        out.clear();
        escape_json_string(&mut out, b"\x00");
        assert_eq!(out, b"\"\\u0000\"");
    }

    #[test]
    fn numbers_raw_only_when_valid_json() {
        for ok in [
            &b"0"[..],
            b"-0",
            b"42",
            b"-17",
            b"1.5",
            b"1e+300",
            b"1.5e-07",
            b"1E5",
            b"0.000",
            b"123456789012345678901234567890.123",
        ] {
            assert_eq!(value(JsonKind::Number, ok).as_bytes(), ok);
        }
        for bad in [
            &b"NaN"[..],
            b"Infinity",
            b"-Infinity",
            b"",
            b"-",
            b"01",
            b"1.",
            b".5",
            b"1e",
            b"1e+",
            b"+1",
            b"1 ",
            b"--1",
            b"0x1",
        ] {
            let want = format!("\"{}\"", std::str::from_utf8(bad).expect("ascii"));
            assert_eq!(value(JsonKind::Number, bad), want);
        }
    }

    #[test]
    fn bool_raw_and_text() {
        assert_eq!(value(JsonKind::Bool, b"t"), "true");
        assert_eq!(value(JsonKind::Bool, b"f"), "false");
        assert_eq!(value(JsonKind::Bool, b"x"), "\"x\"");
        assert_eq!(value(JsonKind::Raw, b"{\"a\": [1, 2]}"), "{\"a\": [1, 2]}");
        assert_eq!(value(JsonKind::Text, b"it's \"x\""), "\"it's \\\"x\\\"\"");
        assert_eq!(value(JsonKind::Date, b"0044-03-15 BC"), "\"0044-03-15 BC\"");
        assert_eq!(value(JsonKind::Date, b"infinity"), "\"infinity\"");
    }

    #[test]
    fn timestamps_in_xsd_form() {
        let ts = |t: &[u8]| value(JsonKind::Timestamp, t);
        let tz = |t: &[u8]| value(JsonKind::TimestampTz, t);
        assert_eq!(ts(b"2024-01-02 03:04:05"), "\"2024-01-02T03:04:05\"");
        assert_eq!(ts(b"2024-01-02 03:04:05.5"), "\"2024-01-02T03:04:05.5\"");
        assert_eq!(ts(b"0044-03-15 12:00:00 BC"), "\"0044-03-15T12:00:00 BC\"");
        assert_eq!(ts(b"-infinity"), "\"-infinity\"");
        assert_eq!(
            tz(b"2024-01-02 03:04:05.123456+00"),
            "\"2024-01-02T03:04:05.123456+00:00\""
        );
        assert_eq!(
            tz(b"2024-01-02 03:04:05-08"),
            "\"2024-01-02T03:04:05-08:00\""
        );
        assert_eq!(
            tz(b"2024-01-02 03:04:05+05:30"),
            "\"2024-01-02T03:04:05+05:30\""
        );
        assert_eq!(
            tz(b"1900-01-01 00:00:00+00:17:30"),
            "\"1900-01-01T00:00:00+00:17:30\""
        );
        assert_eq!(
            tz(b"0001-01-01 00:00:00+00 BC"),
            "\"0001-01-01T00:00:00+00:00 BC\""
        );
        assert_eq!(
            tz(b"10000-01-01 00:00:00+00"),
            "\"10000-01-01T00:00:00+00:00\""
        );
        assert_eq!(tz(b"infinity"), "\"infinity\"");
    }

    #[test]
    fn arrays_nest_and_drop_bounds() {
        assert_eq!(value(arr(JsonKind::Number), b"{}"), "[]");
        assert_eq!(
            value(arr(JsonKind::Number), b"{1,NULL,-0,NaN}"),
            "[1,null,-0,\"NaN\"]"
        );
        assert_eq!(value(arr(JsonKind::Number), b"[0:1]={1,2}"), "[1,2]");
        assert_eq!(
            value(arr(JsonKind::Number), b"[1:2][-1:0]={{1,2},{3,NULL}}"),
            "[[1,2],[3,null]]"
        );
        assert_eq!(
            value(arr(JsonKind::Bool), b"{t,f,NULL}"),
            "[true,false,null]"
        );
        assert_eq!(
            value(
                arr(JsonKind::Text),
                b"{\"a b\",\"NULL\",\"\",\"x,y\",\"q\\\"\\\\\",\"{}\",plain}"
            ),
            "[\"a b\",\"NULL\",\"\",\"x,y\",\"q\\\"\\\\\",\"{}\",\"plain\"]"
        );
        assert_eq!(
            value(arr(JsonKind::Raw), b"{\"{\\\"a\\\": 1}\",5,NULL}"),
            "[{\"a\": 1},5,null]"
        );
        assert_eq!(
            value(
                arr(JsonKind::TimestampTz),
                b"{\"2024-01-02 03:04:05+00\",infinity}"
            ),
            "[\"2024-01-02T03:04:05+00:00\",\"infinity\"]"
        );
        assert_eq!(
            value(arr(JsonKind::Text), b"{\"\xc3\xa9\\n\"}"),
            "[\"\u{e9}n\"]"
        );
    }

    #[test]
    fn vectors_and_malformed_arrays() {
        assert_eq!(value(arr(JsonKind::Number), b"1 2 3"), "[1,2,3]");
        assert_eq!(value(arr(JsonKind::Text), b"3 4"), "[\"3\",\"4\"]");
        assert_eq!(value(arr(JsonKind::Number), b""), "[]");
        for bad in [
            &b"{1,2"[..],
            b"{1,2}}",
            b"{\"a}",
            b"[0:1]",
            b"[0:1]=1",
            b"{{{{{{{1}}}}}}}",
        ] {
            let mut want = Vec::new();
            escape_json_string(&mut want, bad);
            assert_eq!(value(arr(JsonKind::Number), bad).as_bytes(), &want[..]);
        }
    }

    #[test]
    fn kinds_of_builtin_types() {
        assert_eq!(json_kind(23), JsonKind::Number);
        assert_eq!(json_kind(26), JsonKind::Text);
        assert_eq!(json_kind(16), JsonKind::Bool);
        assert_eq!(json_kind(3802), JsonKind::Raw);
        assert_eq!(json_kind(1184), JsonKind::TimestampTz);
        assert_eq!(json_kind(1007), arr(JsonKind::Number));
        assert_eq!(json_kind(1185), arr(JsonKind::TimestampTz));
        assert_eq!(json_kind(3807), arr(JsonKind::Raw));
        assert_eq!(json_kind(22), arr(JsonKind::Number));
        assert_eq!(json_kind(1009), arr(JsonKind::Text));
        assert_eq!(json_kind(99999), JsonKind::Text);
        assert_eq!(array_element_oid(1007), Some(23));
        assert_eq!(array_element_oid(23), None);
    }

    #[test]
    fn rows_in_column_order() {
        let cols = [
            JsonColumn {
                name: "id".into(),
                kind: JsonKind::Number,
            },
            JsonColumn {
                name: "na\"me".into(),
                kind: JsonKind::Text,
            },
            JsonColumn {
                name: "ok".into(),
                kind: JsonKind::Bool,
            },
        ];
        let mut out = Vec::new();
        encode_row_json(&mut out, &cols, &[Some(b"1"), None, Some(b"t")]);
        assert_eq!(out, b"{\"id\":1,\"na\\\"me\":null,\"ok\":true}");
        out.clear();
        encode_row_json(&mut out, &cols, &[Some(b"2")]);
        assert_eq!(out, b"{\"id\":2,\"na\\\"me\":null,\"ok\":null}");
        out.clear();
        encode_row_json(&mut out, &[], &[]);
        assert_eq!(out, b"{}");
    }
}
