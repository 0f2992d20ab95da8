//! Helpers shared by the per-command tests.

use super::{parse_command, Command, CommandError};
use crate::resp::Args;
use std::ops::Range;

/// Parses a command given as words. The buffer and ranges are leaked: tests only.
pub fn parse(words: &[&str]) -> Result<Command<'static>, CommandError> {
    let buf: &'static [u8] = Box::leak(words.concat().into_bytes().into_boxed_slice());
    let mut ranges = Vec::new();
    let mut at = 0;
    for w in words {
        ranges.push(at..at + w.len());
        at += w.len();
    }
    let ranges: &'static [Range<usize>] = Box::leak(ranges.into_boxed_slice());
    parse_command(Args::new(buf, ranges))
}

/// Collects an [`Args`] into owned strings.
pub fn strings(args: Args) -> Vec<String> {
    args.iter()
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// The reply text of an error.
pub fn error_text(err: CommandError) -> String {
    let mut out = Vec::new();
    err.compose(&mut out);
    String::from_utf8(out).expect("error replies are ASCII")
}
