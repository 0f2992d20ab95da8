//! The Bind message: parameter formats, parameter values and result formats.
//!
//! Purpose: validate a Bind body once (counts within [`Limits::max_params`], every format
//! code 0 or 1, every value length within the message) and hand out a [`Bind`] view whose
//! accessors cannot fail. Invariants: the view's raw slices hold exactly the validated
//! arrays. Thread model: pure functions. Limitations: none beyond the protocol's own.

use super::frame::{Body, Invalid, Limits};

/// A parameter or result column format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// 0: text.
    Text,
    /// 1: binary.
    Binary,
}

impl Format {
    /// The wire code.
    pub fn code(self) -> i16 {
        match self {
            Format::Text => 0,
            Format::Binary => 1,
        }
    }
}

/// A validated Bind message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bind<'a> {
    /// The destination portal ("" = unnamed).
    pub portal: &'a [u8],
    /// The source statement ("" = unnamed).
    pub statement: &'a [u8],
    param_formats: &'a [u8],
    param_count: usize,
    params: &'a [u8],
    result_formats: &'a [u8],
}

impl<'a> Bind<'a> {
    /// How many parameter values.
    pub fn param_count(&self) -> usize {
        self.param_count
    }

    /// The format of parameter `i` (the protocol's rules: no codes = all text, one code =
    /// all that format, otherwise one per parameter).
    pub fn param_format(&self, i: usize) -> Format {
        format_at(self.param_formats, i)
    }

    /// The parameter values in order; `None` is SQL NULL.
    pub fn params(&self) -> Params<'a> {
        Params {
            body: Body::new(self.params),
            left: self.param_count,
        }
    }

    /// How many result format codes were sent (0 = all text, 1 = all columns that format).
    pub fn result_format_count(&self) -> usize {
        self.result_formats.len() / 2
    }

    /// The format of result column `i`, by the same rules as [`Bind::param_format`].
    pub fn result_format(&self, i: usize) -> Format {
        format_at(self.result_formats, i)
    }
}

fn format_at(codes: &[u8], i: usize) -> Format {
    let at = if codes.len() == 2 { 0 } else { i * 2 };
    match codes.get(at..at + 2) {
        Some([0, 1]) => Format::Binary,
        _ => Format::Text,
    }
}

/// Iterator over a validated Bind's parameter values.
pub struct Params<'a> {
    body: Body<'a>,
    left: usize,
}

impl<'a> Iterator for Params<'a> {
    type Item = Option<&'a [u8]>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let len = self.body.i32().ok()?;
        if len < 0 {
            return Some(None);
        }
        Some(self.body.bytes(len as usize).ok())
    }
}

/// Reads a format-code array (count + codes), validating each code.
fn parse_formats<'a>(b: &mut Body<'a>, limits: &Limits) -> Result<&'a [u8], Invalid> {
    let n = b.count16(limits.max_params)?;
    let raw = b.bytes(n * 2)?;
    if raw.chunks_exact(2).any(|c| c != [0, 0] && c != [0, 1]) {
        return Err(Invalid::BadFormat);
    }
    Ok(raw)
}

pub(crate) fn parse_bind<'a>(b: &mut Body<'a>, limits: &Limits) -> Result<Bind<'a>, Invalid> {
    let portal = b.cstr()?;
    let statement = b.cstr()?;
    let param_formats = parse_formats(b, limits)?;
    let param_count = b.count16(limits.max_params)?;
    let nformats = param_formats.len() / 2;
    if nformats > 1 && nformats != param_count {
        return Err(Invalid::FormatCountMismatch);
    }
    let rest = b.rest();
    let mut values = Body::new(rest);
    for _ in 0..param_count {
        let len = values.i32()?;
        match len {
            -1 => {}
            n if n >= 0 => {
                values.bytes(n as usize)?;
            }
            _ => return Err(Invalid::BadCount),
        }
    }
    let used = rest.len() - values.remaining();
    let (params, tail) = rest.split_at_checked(used).ok_or(Invalid::Truncated)?;
    let mut tail = Body::new(tail);
    let result_formats = parse_formats(&mut tail, limits)?;
    tail.end()?;
    Ok(Bind {
        portal,
        statement,
        param_formats,
        param_count,
        params,
        result_formats,
    })
}
