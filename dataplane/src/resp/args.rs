//! [`Args`]: a borrowing view over the arguments of one parsed request.
//!
//! Invariants: none of the accessors can panic, even if a range lies outside `buf` (such an
//! argument reads as absent from [`Args::get`] and as empty from [`Args::iter`]);
//! [`parse_request`](super::parse_request) only produces ranges inside its buffer.

use core::ops::Range;

/// The arguments of one request: ranges into the connection's input buffer.
#[derive(Clone, Copy, Debug)]
pub struct Args<'a> {
    buf: &'a [u8],
    ranges: &'a [Range<usize>],
}

impl<'a> Args<'a> {
    /// Wraps the buffer a request was parsed from and the ranges the parser filled in.
    pub fn new(buf: &'a [u8], ranges: &'a [Range<usize>]) -> Self {
        Args { buf, ranges }
    }

    /// Number of arguments (the command name counts).
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// True when the request had no arguments at all.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The `i`-th argument, if present.
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        let range = self.ranges.get(i)?;
        self.buf.get(range.clone())
    }

    /// All arguments in order.
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let buf = self.buf;
        self.ranges
            .iter()
            .map(move |r| buf.get(r.clone()).unwrap_or(&[]))
    }

    /// The arguments from index `from` on (empty if `from >= len`).
    pub fn slice(&self, from: usize) -> Args<'a> {
        Args {
            buf: self.buf,
            ranges: self.ranges.get(from..).unwrap_or(&[]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accessors() {
        let buf = b"GET key";
        let ranges = [0..3, 4..7];
        let args = Args::new(buf, &ranges);
        assert_eq!(args.len(), 2);
        assert!(!args.is_empty());
        assert_eq!(args.get(0), Some(&b"GET"[..]));
        assert_eq!(args.get(1), Some(&b"key"[..]));
        assert_eq!(args.get(2), None);
        assert_eq!(args.iter().collect::<Vec<_>>(), vec![&b"GET"[..], b"key"]);
        let rest = args.slice(1);
        assert_eq!(rest.len(), 1);
        assert_eq!(rest.get(0), Some(&b"key"[..]));
        assert!(args.slice(2).is_empty());
        assert!(args.slice(99).is_empty());
    }

    #[test]
    fn out_of_bounds_ranges_do_not_panic() {
        let ranges = [0..3, 10..20];
        let args = Args::new(b"abc", &ranges);
        assert_eq!(args.get(1), None);
        assert_eq!(args.iter().collect::<Vec<_>>(), vec![&b"abc"[..], b""]);
    }
}
