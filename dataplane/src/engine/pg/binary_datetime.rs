//! Binary forms of numeric and the date/time types, computed from their PostgreSQL text
//! output as pgline's own origin sessions print it (`DateStyle=ISO`, `IntervalStyle=postgres`;
//! any zone offset in the text is honoured). Parsers are strict: anything that is not exactly
//! that output gives `None`, and the caller forwards the batch.
//!
//! - numeric (`numeric_send`): `ndigits, weight, sign, dscale` (int16 each), then base-10000
//!   digits, leading and trailing zero digits stripped as PostgreSQL stores them; zero has no
//!   digits and weight 0; `NaN`, `Infinity`, `-Infinity` are the signs `0xC000`, `0xD000`,
//!   `0xF000` with no digits (dscale 0, 32, 32: see [`compose_numeric`]). dscale is the number
//!   of digits after the point in the text.
//! - date (`date_send`): int32 days since 2000-01-01; `infinity`/`-infinity` are
//!   `i32::MAX`/`i32::MIN`. Years are proleptic Gregorian (`... BC` is year 1 - Y), day
//!   numbers as PostgreSQL's `date2j`.
//! - timestamp/timestamptz (`timestamp_send`): int64 µs since 2000-01-01 00:00 (UTC for
//!   timestamptz: the text's offset is subtracted); infinities are `i64::MAX`/`i64::MIN`.
//! - time (`time_send`): int64 µs since midnight; timetz (`timetz_send`): that, then int32
//!   seconds west of UTC (the negated offset).
//! - interval (`interval_send`): int64 µs, int32 days, int32 months from the `postgres` style
//!   (`1 year 2 mons -3 days +04:05:06.7`).
//!
//! Invariants: append only, no allocation. Thread model: pure functions.

/// `numeric_send` of the text output `text`.
pub(super) fn compose_numeric(text: &[u8], out: &mut Vec<u8>) -> Option<()> {
    // A special value is a bare header; `numeric_send` reads its dscale from the header's
    // short-format dscale bits, which are 0 for NaN (0xC000) and 0x20 for the infinities
    // (0xD000, 0xF000 & 0x1F80 = 0x1000, shifted by 7).
    let special = match text {
        b"NaN" => Some((0xC000u16, 0u16)),
        b"Infinity" => Some((0xD000, 0x20)),
        b"-Infinity" => Some((0xF000, 0x20)),
        _ => None,
    };
    if let Some((sign, dscale)) = special {
        out.extend_from_slice(&8i32.to_be_bytes());
        out.extend_from_slice(&[0, 0, 0, 0]);
        out.extend_from_slice(&sign.to_be_bytes());
        out.extend_from_slice(&dscale.to_be_bytes());
        return Some(());
    }
    let (negative, unsigned) = match text.strip_prefix(b"-") {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (int, frac) = match unsigned.iter().position(|&c| c == b'.') {
        Some(dot) => (&unsigned[..dot], &unsigned[dot + 1..]),
        None => (unsigned, &[][..]),
    };
    let digits_ok = |d: &[u8]| d.iter().all(u8::is_ascii_digit);
    if int.is_empty()
        || !digits_ok(int)
        || !digits_ok(frac)
        || (frac.is_empty() && unsigned.len() != int.len())
    {
        return None;
    }
    let digits = Digits::new(int, frac);
    let groups = digits.groups();
    let first = (0..groups).find(|&g| digits.group(g) != 0);
    let (ndigits, weight, sign) = match first {
        None if negative => return None, // PostgreSQL never prints a negative zero.
        None => (0, 0, 0u16),
        Some(a) => {
            let b = (0..groups).rev().find(|&g| digits.group(g) != 0)?;
            let weight = digits.int_groups() as isize - 1 - a as isize;
            (b - a + 1, weight, if negative { 0x4000 } else { 0 })
        }
    };
    let ndigits16 = i16::try_from(ndigits).ok()?;
    let weight16 = i16::try_from(weight).ok()?;
    let dscale = i16::try_from(frac.len()).ok()?;
    let len = i32::try_from(8 + 2 * ndigits).ok()?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&ndigits16.to_be_bytes());
    out.extend_from_slice(&weight16.to_be_bytes());
    out.extend_from_slice(&sign.to_be_bytes());
    out.extend_from_slice(&dscale.to_be_bytes());
    if let Some(a) = first {
        for g in a..a + ndigits {
            out.extend_from_slice(&digits.group(g).to_be_bytes());
        }
    }
    Some(())
}

/// The decimal digits of a numeric, read in base-10000 groups aligned on the point.
struct Digits<'a> {
    int: &'a [u8],
    frac: &'a [u8],
    /// Zeros before `int` that align it on a group.
    lead: usize,
}

impl<'a> Digits<'a> {
    fn new(int: &'a [u8], frac: &'a [u8]) -> Digits<'a> {
        Digits {
            int,
            frac,
            lead: (4 - int.len() % 4) % 4,
        }
    }

    fn int_groups(&self) -> usize {
        (self.lead + self.int.len()) / 4
    }

    fn groups(&self) -> usize {
        self.int_groups() + self.frac.len().div_ceil(4)
    }

    fn digit(&self, v: usize) -> u16 {
        let Some(i) = v.checked_sub(self.lead) else {
            return 0;
        };
        let c = match self.int.get(i) {
            Some(&c) => c,
            None => self.frac.get(i - self.int.len()).copied().unwrap_or(b'0'),
        };
        u16::from(c - b'0')
    }

    fn group(&self, g: usize) -> u16 {
        (0..4).fold(0, |acc, k| acc * 10 + self.digit(4 * g + k))
    }
}

/// Days from 2000-01-01 to the Julian day 0 (PostgreSQL's `POSTGRES_EPOCH_JDATE`).
const EPOCH_JDATE: i64 = 2_451_545;
const USECS_PER_DAY: i64 = 86_400_000_000;

/// PostgreSQL's `date2j` (astronomical years: 1 BC is 0).
fn date2j(year: i64, month: i64, day: i64) -> i64 {
    let (y, m) = if month > 2 {
        (year + 4800, month + 1)
    } else {
        (year + 4799, month + 13)
    };
    let century = y / 100;
    y * 365 - 32167 + y / 4 - century + century / 4 + 7834 * m / 256 + day
}

/// A text cursor over a date/time output.
struct Cursor<'a> {
    s: &'a [u8],
}

impl<'a> Cursor<'a> {
    /// At least `min` and at most `max` decimal digits.
    fn number(&mut self, min: usize, max: usize) -> Option<i64> {
        let n = self.s.iter().take_while(|c| c.is_ascii_digit()).count();
        if n < min || n > max {
            return None;
        }
        let v = self.s[..n]
            .iter()
            .fold(0i64, |acc, &c| acc * 10 + i64::from(c - b'0'));
        self.s = &self.s[n..];
        Some(v)
    }

    fn eat(&mut self, c: u8) -> bool {
        match self.s.split_first() {
            Some((&x, rest)) if x == c => {
                self.s = rest;
                true
            }
            _ => false,
        }
    }

    fn eat_str(&mut self, t: &[u8]) -> bool {
        match self.s.strip_prefix(t) {
            Some(rest) => {
                self.s = rest;
                true
            }
            None => false,
        }
    }

    /// `YYYY-MM-DD` (4+ digit year): (year as printed, month, day).
    fn date(&mut self) -> Option<(i64, i64, i64)> {
        let y = self.number(4, 9)?;
        let m = self.eat(b'-').then(|| self.number(2, 2))??;
        let d = self.eat(b'-').then(|| self.number(2, 2))??;
        ((1..=12).contains(&m) && (1..=31).contains(&d) && y >= 1).then_some((y, m, d))
    }

    /// `HH:MM:SS[.f{1,6}]` in µs; `max_hours` bounds HH (24 for a time of day).
    fn time(&mut self, max_hours: i64) -> Option<i64> {
        let h = self.number(2, 10)?;
        let m = self.eat(b':').then(|| self.number(2, 2))??;
        let s = self.eat(b':').then(|| self.number(2, 2))??;
        if h > max_hours || m > 59 || s > 59 {
            return None;
        }
        let mut frac = 0;
        if self.eat(b'.') {
            let before = self.s.len();
            let f = self.number(1, 6)?;
            let n = before - self.s.len();
            frac = f * 10i64.pow(6 - n as u32);
        }
        ((h * 60 + m) * 60 + s)
            .checked_mul(1_000_000)?
            .checked_add(frac)
    }

    /// `+HH[:MM[:SS]]` or `-...`, in seconds east of UTC.
    fn offset(&mut self) -> Option<i64> {
        let sign = if self.eat(b'+') {
            1
        } else if self.eat(b'-') {
            -1
        } else {
            return None;
        };
        let h = self.number(2, 2)?;
        let mut secs = h * 3600;
        if self.eat(b':') {
            secs += self.number(2, 2)? * 60;
            if self.eat(b':') {
                secs += self.number(2, 2)?;
            }
        }
        Some(sign * secs)
    }

    /// ` BC` at the end: the year is before 1 AD.
    fn era(&mut self) -> bool {
        self.eat_str(b" BC")
    }

    fn done(&self) -> bool {
        self.s.is_empty()
    }
}

/// Days since 2000-01-01 of a date printed as (year, month, day), `bc` era.
fn days(year: i64, month: i64, day: i64, bc: bool) -> i64 {
    let year = if bc { 1 - year } else { year };
    date2j(year, month, day) - EPOCH_JDATE
}

/// `date_send`.
pub(super) fn compose_date(text: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let v = match text {
        b"infinity" => i32::MAX,
        b"-infinity" => i32::MIN,
        _ => {
            let mut c = Cursor { s: text };
            let (y, m, d) = c.date()?;
            let bc = c.era();
            if !c.done() {
                return None;
            }
            i32::try_from(days(y, m, d, bc)).ok()?
        }
    };
    push(&v.to_be_bytes(), out);
    Some(())
}

/// `timestamp_send` (`tz`: timestamptz, whose text carries its offset).
pub(super) fn compose_timestamp(text: &[u8], tz: bool, out: &mut Vec<u8>) -> Option<()> {
    let v = match text {
        b"infinity" => i64::MAX,
        b"-infinity" => i64::MIN,
        _ => {
            let mut c = Cursor { s: text };
            let (y, m, d) = c.date()?;
            let time = c.eat(b' ').then(|| c.time(23))??;
            let offset = if tz { c.offset()? } else { 0 };
            let bc = c.era();
            if !c.done() {
                return None;
            }
            let us = days(y, m, d, bc)
                .checked_mul(USECS_PER_DAY)?
                .checked_add(time)?
                .checked_sub(offset.checked_mul(1_000_000)?)?;
            // The ends of the range are the infinities' values: never a real timestamp.
            if us == i64::MAX || us == i64::MIN {
                return None;
            }
            us
        }
    };
    push(&v.to_be_bytes(), out);
    Some(())
}

/// `time_send` (`tz`: `timetz_send`, the zone as seconds west of UTC after the time).
pub(super) fn compose_time(text: &[u8], tz: bool, out: &mut Vec<u8>) -> Option<()> {
    let mut c = Cursor { s: text };
    let us = c.time(24)?;
    if us > USECS_PER_DAY {
        return None;
    }
    if !tz {
        if !c.done() {
            return None;
        }
        push(&us.to_be_bytes(), out);
        return Some(());
    }
    let offset = c.offset()?;
    if !c.done() {
        return None;
    }
    let mut bytes = [0u8; 12];
    bytes[..8].copy_from_slice(&us.to_be_bytes());
    bytes[8..].copy_from_slice(&i32::try_from(-offset).ok()?.to_be_bytes());
    push(&bytes, out);
    Some(())
}

/// `interval_send` of the `postgres`-style output: `[N year(s)] [N mon(s)] [N day(s)]
/// [[+-]HH:MM:SS[.f]]`, numbers signed (`+` after a negative part), at least one part.
pub(super) fn compose_interval(text: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let (mut months, mut days, mut time) = (0i64, 0i64, 0i64);
    let mut last_unit = 0;
    let mut tokens = text.split(|&b| b == b' ');
    while let Some(token) = tokens.next() {
        let mut c = Cursor { s: token };
        let negative = c.eat(b'-');
        if !negative {
            c.eat(b'+');
        }
        if token.contains(&b':') {
            let t = c.time(i64::MAX)?;
            if !c.done() || tokens.next().is_some() {
                return None;
            }
            time = if negative { -t } else { t };
            last_unit = 4;
            break;
        }
        let n = c.number(1, 10)?;
        let n = if negative { -n } else { n };
        if !c.done() {
            return None;
        }
        let unit = match tokens.next()? {
            b"year" | b"years" => 1,
            b"mon" | b"mons" => 2,
            b"day" | b"days" => 3,
            _ => return None,
        };
        if unit <= last_unit {
            return None;
        }
        last_unit = unit;
        match unit {
            1 => months = months.checked_add(n.checked_mul(12)?)?,
            2 => months = months.checked_add(n)?,
            _ => days = n,
        }
    }
    if last_unit == 0 {
        return None;
    }
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&time.to_be_bytes());
    bytes[8..12].copy_from_slice(&i32::try_from(days).ok()?.to_be_bytes());
    bytes[12..].copy_from_slice(&i32::try_from(months).ok()?.to_be_bytes());
    push(&bytes, out);
    Some(())
}

fn push(bytes: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin(f: impl Fn(&[u8], &mut Vec<u8>) -> Option<()>, text: &str) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        f(text.as_bytes(), &mut out)?;
        let len = i32::from_be_bytes(out[..4].try_into().expect("4 bytes"));
        assert_eq!(len as usize, out.len() - 4, "{text}: length prefix");
        Some(out[4..].to_vec())
    }

    fn words(w: &[i16]) -> Vec<u8> {
        w.iter().flat_map(|x| x.to_be_bytes()).collect()
    }

    #[test]
    fn numeric_digits_weight_sign_and_scale() {
        let n = |t| bin(compose_numeric, t);
        assert_eq!(n("-123.4500"), Some(words(&[2, 0, 0x4000, 4, 123, 4500])));
        assert_eq!(n("0"), Some(words(&[0, 0, 0, 0])));
        assert_eq!(n("0.000"), Some(words(&[0, 0, 0, 3])));
        assert_eq!(n("100000000"), Some(words(&[1, 2, 0, 0, 1])));
        assert_eq!(n("0.0001"), Some(words(&[1, -1, 0, 4, 1])));
        assert_eq!(n("12345.6"), Some(words(&[3, 1, 0, 1, 1, 2345, 6000])));
        assert_eq!(n("NaN"), Some(words(&[0, 0, 0xC000u16 as i16, 0])));
        assert_eq!(n("-Infinity"), Some(words(&[0, 0, 0xF000u16 as i16, 32])));
        for bad in ["", "-", "1.", ".5", "1e5", "-0", "1 ", "+1", "nan"] {
            assert_eq!(n(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn dates_and_timestamps_count_from_2000() {
        let d = |t| bin(compose_date, t);
        assert_eq!(d("2000-01-01"), Some(0i32.to_be_bytes().to_vec()));
        assert_eq!(d("1999-12-31"), Some((-1i32).to_be_bytes().to_vec()));
        assert_eq!(d("2000-03-01"), Some(60i32.to_be_bytes().to_vec()));
        assert_eq!(d("infinity"), Some(i32::MAX.to_be_bytes().to_vec()));
        // 1 BC is year 0 (a leap year): 0001-12-31 BC is the day before 0001-01-01.
        let ad1 = d("0001-01-01").expect("date");
        let bc1 = d("0001-12-31 BC").expect("date");
        assert_eq!(
            i32::from_be_bytes(ad1.try_into().expect("4")) - 1,
            i32::from_be_bytes(bc1.try_into().expect("4"))
        );
        for bad in [
            "2000-1-01",
            "2000-13-01",
            "01/02/2000",
            "2000-01-01 AD",
            "0000-01-01",
        ] {
            assert_eq!(d(bad), None, "{bad:?}");
        }
        let ts = |t| bin(|t, o| compose_timestamp(t, false, o), t);
        let tz = |t| bin(|t, o| compose_timestamp(t, true, o), t);
        assert_eq!(
            ts("2000-01-02 00:00:01.5"),
            Some((86_401_500_000i64).to_be_bytes().to_vec())
        );
        assert_eq!(
            tz("2000-01-01 09:00:00+09"),
            Some(0i64.to_be_bytes().to_vec())
        );
        assert_eq!(
            tz("2000-01-01 00:00:00-00:30"),
            Some(1_800_000_000i64.to_be_bytes().to_vec())
        );
        assert_eq!(tz("2000-01-01 00:00:00"), None, "no offset");
        assert_eq!(ts("2000-01-01 00:00:00+00"), None, "an offset");
        assert_eq!(ts("-infinity"), Some(i64::MIN.to_be_bytes().to_vec()));
    }

    #[test]
    fn times_and_intervals() {
        let t = |s| bin(|s, o| compose_time(s, false, o), s);
        let tt = |s| bin(|s, o| compose_time(s, true, o), s);
        assert_eq!(
            t("24:00:00"),
            Some(86_400_000_000i64.to_be_bytes().to_vec())
        );
        assert_eq!(t("00:00:00.000001"), Some(1i64.to_be_bytes().to_vec()));
        assert_eq!(t("24:00:01"), None);
        let mut want = 3_600_000_000i64.to_be_bytes().to_vec();
        want.extend_from_slice(&(-19_800i32).to_be_bytes());
        assert_eq!(tt("01:00:00+05:30"), Some(want));
        let iv = |s| bin(compose_interval, s);
        let interval = |us: i64, days: i32, months: i32| {
            let mut v = us.to_be_bytes().to_vec();
            v.extend_from_slice(&days.to_be_bytes());
            v.extend_from_slice(&months.to_be_bytes());
            Some(v)
        };
        assert_eq!(iv("00:00:00"), interval(0, 0, 0));
        assert_eq!(
            iv("1 year 2 mons 3 days 04:05:06.789"),
            interval(14_706_789_000, 3, 14)
        );
        assert_eq!(
            iv("-1 years -2 mons +3 days -04:05:06"),
            interval(-14_706_000_000, 3, -14)
        );
        assert_eq!(iv("-3 days"), interval(0, -3, 0));
        for bad in [
            "",
            "3",
            "3 weeks",
            "1 day 1 year",
            "00:00:00 1 day",
            "@ 1 day",
        ] {
            assert_eq!(iv(bad), None, "{bad:?}");
        }
    }
}
