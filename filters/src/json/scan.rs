//! A validating one-pass JSON walker for the shapes the hot path reads most (a
//! chat request, a chat answer), and splitters built on it.
//!
//! It answers only when it is sure: anything it does not read the way serde_json
//! does (an escaped key, deep nesting, a lone surrogate, any syntax error) gives
//! `None`, and the caller reads the text with serde instead, whose verdict stands.
//! So where it returns `Some`, the text is valid JSON and the result is serde's.

use super::Member;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// serde_json refuses nesting past 128 levels; stop well before.
const MAX_DEPTH: usize = 100;

pub(crate) struct Scan<'a> {
    /// The document. Every span the scan hands out as `str` is UTF-8: it came as
    /// a `str`, or (`utf8_known` false) each string's bytes past ASCII are checked
    /// as the string is skipped, and outside strings the scan takes only ASCII.
    bytes: &'a [u8],
    pub(crate) at: usize,
    /// The text is known to be JSON (a `RawValue`'s): strings are skipped to their
    /// closing quote, not checked again. A chat body's long content would
    /// otherwise be checked once per level it sits under (body, messages array,
    /// message, content).
    pub(crate) known_valid: bool,
    /// The bytes came as a `str`: their UTF-8 is not checked again.
    utf8_known: bool,
    /// The long strings a checking scan has read (see [`LongStrings`]).
    long: Vec<Long>,
}

/// A string of at least [`LONG`] bytes by where it lies: the address of its
/// opening quote, the address just past its closing quote, and whether it holds
/// an escape.
#[derive(Clone, Copy, Debug)]
struct Long {
    start: usize,
    end: usize,
    escaped: bool,
}

/// A string this long is noted by the checking scan that reads it.
const LONG: usize = 4096;

/// Where the long strings of a document lie, as the checking scan of the whole
/// document found them. While [`with_long_strings`] holds it, a scan of a value
/// of that document known to be valid jumps over each of them instead of
/// looking for its closing quote again: a chat body's long content is otherwise
/// skipped once more at each level it sits under (messages array, message,
/// content). Tied to the document's lifetime, so the document is alive (and its
/// addresses are its own) while the index is in use.
#[derive(Debug, Default)]
pub struct LongStrings<'a> {
    strings: Vec<Long>,
    of: std::marker::PhantomData<&'a [u8]>,
}

#[cfg(test)]
thread_local! {
    /// How many long strings known-valid scans have jumped over on this thread.
    pub(crate) static JUMPS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

thread_local! {
    /// The index [`with_long_strings`] holds on this thread, or null.
    static HELD: std::cell::Cell<*const Vec<Long>> = const { std::cell::Cell::new(std::ptr::null()) };
}

/// Runs `f` with `long` consulted by every known-valid scan on this thread.
pub fn with_long_strings<T>(long: &LongStrings<'_>, f: impl FnOnce() -> T) -> T {
    if long.strings.is_empty() {
        return f();
    }
    struct Release(*const Vec<Long>);
    impl Drop for Release {
        fn drop(&mut self) {
            HELD.with(|h| h.set(self.0));
        }
    }
    let _release = Release(HELD.with(|h| h.replace(&long.strings)));
    f()
}

/// The long string whose opening quote is at `addr`, if the held index has it.
fn long_at(addr: usize) -> Option<Long> {
    let held = HELD.with(|h| h.get());
    if held.is_null() {
        return None;
    }
    // SAFETY: a non-null pointer is set only by `with_long_strings`, which
    // borrows the index for as long as it is set and resets it on the way out
    // (unwinding included).
    let strings = unsafe { &*held };
    strings
        .binary_search_by_key(&addr, |l| l.start)
        .ok()
        .map(|i| strings[i])
}

impl<'a> Scan<'a> {
    /// A scan that checks everything it reads.
    pub(crate) fn new(text: &'a str) -> Self {
        Scan {
            bytes: text.as_bytes(),
            at: 0,
            known_valid: false,
            utf8_known: true,
            long: Vec::new(),
        }
    }

    /// A scan that checks everything it reads, UTF-8 included: a body read from
    /// the wire needs no pass of its own before it (the strings' bytes are looked
    /// at once, for both checks).
    pub(crate) fn of_bytes(bytes: &'a [u8]) -> Self {
        Scan {
            bytes,
            at: 0,
            known_valid: false,
            utf8_known: false,
            long: Vec::new(),
        }
    }

    /// A scan of a `RawValue`'s text, valid JSON by that type's invariant.
    pub(crate) fn of_valid(v: &'a RawValue) -> Self {
        Scan {
            bytes: v.get().as_bytes(),
            at: 0,
            known_valid: true,
            utf8_known: true,
            long: Vec::new(),
        }
    }

    /// The document's span `r`, which the scan has read (see `bytes`).
    fn text(&self, r: std::ops::Range<usize>) -> &'a str {
        let bytes = &self.bytes[r];
        debug_assert!(std::str::from_utf8(bytes).is_ok());
        // SAFETY: spans are only taken of what the scan has read, and what it has
        // read is UTF-8: a `str`'s bytes, checked string bytes, or ASCII it took
        // outside strings (`bytes`). Each span starts and ends at an ASCII byte
        // or the document's ends, so it never splits a character.
        unsafe { std::str::from_utf8_unchecked(bytes) }
    }
}

/// The members of the object that is the whole of `text` (whitespace around it
/// allowed), as serde's reading of it gives them: in document order, repeats kept,
/// values borrowed as raw JSON. `None` when an escaped key or anything unusual
/// calls for serde.
#[cfg(test)]
pub(crate) fn members(text: &str) -> Option<Vec<Member<'_>>> {
    members_of(Scan::new(text))
}

/// As [`members_of`], with the long strings the scan read.
pub(crate) fn members_and_long_of(mut s: Scan<'_>) -> Option<(Vec<Member<'_>>, LongStrings<'_>)> {
    let mut out = Vec::with_capacity(8);
    s.object(|s, key| {
        let value = s.raw_value()?;
        out.push((Cow::Borrowed(key), raw(value)));
        Some(())
    })?;
    s.end()?;
    let long = LongStrings {
        strings: s.long,
        of: std::marker::PhantomData,
    };
    Some((out, long))
}

pub(crate) fn members_of(s: Scan<'_>) -> Option<Vec<Member<'_>>> {
    members_and_long_of(s).map(|(members, _)| members)
}

/// The items of the array that is the whole of `text`, as raw JSON; `None` as for
/// [`members`].
#[cfg(test)]
pub(crate) fn items(text: &str) -> Option<Vec<&RawValue>> {
    items_of(Scan::new(text))
}

pub(crate) fn items_of(mut s: Scan<'_>) -> Option<Vec<&RawValue>> {
    let mut out = Vec::with_capacity(4);
    s.array(|s| {
        out.push(raw(s.raw_value()?));
        Some(())
    })?;
    s.end()?;
    Some(out)
}

/// The string that is the whole of `text`, when it holds no escapes.
#[cfg(test)]
pub(crate) fn plain_str(text: &str) -> Option<&str> {
    plain_str_of(Scan::new(text))
}

pub(crate) fn plain_str_of(mut s: Scan<'_>) -> Option<&str> {
    s.ws();
    let v = s.plain_string()?;
    s.end()?;
    Some(v)
}

/// Views JSON text the scanner has accepted as a `RawValue`.
fn raw(json: &str) -> &RawValue {
    // SAFETY: `RawValue` is `#[repr(transparent)]` over `str` (serde_json converts
    // the same way internally), and its one invariant, that the text is a whole
    // valid JSON value, is what the scanner just checked.
    unsafe { std::mem::transmute::<&str, &RawValue>(json) }
}

impl<'a> Scan<'a> {
    /// Only whitespace is left.
    pub(crate) fn end(&mut self) -> Option<()> {
        self.ws();
        (self.at == self.bytes.len()).then_some(())
    }

    pub(crate) fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    pub(crate) fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    pub(crate) fn eat(&mut self, b: u8) -> Option<()> {
        self.ws();
        (self.peek()? == b).then(|| self.at += 1)
    }

    /// Walks an object, handing each key (unescaped keys only) to `member`, which
    /// must consume the value.
    pub(crate) fn object(
        &mut self,
        mut member: impl FnMut(&mut Self, &'a str) -> Option<()>,
    ) -> Option<()> {
        self.list(b'{', b'}', |s| {
            let key = s.plain_string()?;
            s.eat(b':')?;
            s.ws();
            member(s, key)
        })
    }

    pub(crate) fn array(&mut self, item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.list(b'[', b']', item)
    }

    /// A comma-separated list between `open` and `close`; `item` reads one entry.
    pub(crate) fn list(
        &mut self,
        open: u8,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Option<()>,
    ) -> Option<()> {
        self.eat(open)?;
        self.ws();
        if self.peek()? == close {
            self.at += 1;
            return Some(());
        }
        loop {
            self.ws();
            item(self)?;
            self.ws();
            match self.peek()? {
                b',' => self.at += 1,
                c if c == close => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// Walks an object whose members of interest are `names`: `read` gets the index
    /// of each one present, other members are skipped, and a repeated one ends the
    /// scan (serde refuses a repeated field).
    pub(crate) fn fields<const N: usize>(
        &mut self,
        names: [&str; N],
        mut read: impl FnMut(&mut Self, usize) -> Option<()>,
    ) -> Option<()> {
        let mut seen = [false; N];
        self.object(|s, key| match names.iter().position(|n| *n == key) {
            None => s.skip_value(0),
            Some(i) if std::mem::replace(&mut seen[i], true) => None,
            Some(i) => read(s, i),
        })
    }

    /// `null` as `None`, else the value read by `read`.
    pub(crate) fn nullable<T>(
        &mut self,
        read: impl FnOnce(&mut Self) -> Option<T>,
    ) -> Option<Option<T>> {
        self.ws();
        if self.bytes[self.at..].starts_with(b"null") {
            self.at += 4;
            return Some(None);
        }
        read(self).map(Some)
    }

    /// A string without escapes, borrowed (keys).
    pub(crate) fn plain_string(&mut self) -> Option<&'a str> {
        let start = self.at;
        let escaped = self.skip_string()?;
        (!escaped).then(|| self.text(start + 1..self.at - 1))
    }

    /// A string value: borrowed, or unescaped by serde when it has escapes.
    pub(crate) fn string(&mut self) -> Option<Cow<'a, str>> {
        let start = self.at;
        if !self.skip_string()? {
            return Some(Cow::Borrowed(self.text(start + 1..self.at - 1)));
        }
        serde_json::from_str::<String>(self.text(start..self.at))
            .ok()
            .map(Cow::Owned)
    }

    /// A non-negative integer that fits a u64, as serde reads one.
    pub(crate) fn uint(&mut self) -> Option<u64> {
        let start = self.at;
        self.skip_number()?;
        self.text(start..self.at).parse().ok()
    }

    pub(crate) fn int(&mut self) -> Option<i64> {
        let start = self.at;
        self.skip_number()?;
        self.text(start..self.at).parse().ok()
    }

    /// A value of any type, as its raw JSON text.
    pub(crate) fn raw_value(&mut self) -> Option<&'a str> {
        self.ws();
        let start = self.at;
        self.skip_value(0)?;
        Some(self.text(start..self.at))
    }

    pub(crate) fn skip_value(&mut self, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.ws();
        match self.peek()? {
            b'"' => self.skip_string().map(drop),
            b'{' => self.object(|s, _| s.skip_value(depth + 1)),
            b'[' => self.array(|s| s.skip_value(depth + 1)),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.skip_number(),
        }
    }

    pub(crate) fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.bytes[self.at..]
            .starts_with(word)
            .then(|| self.at += word.len())
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`
    pub(crate) fn skip_number(&mut self) -> Option<()> {
        let b = self.bytes;
        let digits = |at: &mut usize| {
            let from = *at;
            while b.get(*at).is_some_and(u8::is_ascii_digit) {
                *at += 1;
            }
            *at > from
        };
        let mut at = self.at;
        if b.get(at) == Some(&b'-') {
            at += 1;
        }
        match b.get(at)? {
            b'0' => at += 1,
            b'1'..=b'9' => {
                digits(&mut at);
            }
            _ => return None,
        }
        if b.get(at) == Some(&b'.') {
            at += 1;
            if !digits(&mut at) {
                return None;
            }
        }
        if matches!(b.get(at), Some(b'e' | b'E')) {
            at += 1;
            if matches!(b.get(at), Some(b'+' | b'-')) {
                at += 1;
            }
            if !digits(&mut at) {
                return None;
            }
        }
        self.at = at;
        Some(())
    }

    /// Skips a string, checking what JSON requires of one: no control characters,
    /// only the defined escapes, and `\u` surrogates in pairs. True when it held
    /// an escape.
    pub(crate) fn skip_string(&mut self) -> Option<bool> {
        let b = self.bytes;
        if b.get(self.at) != Some(&b'"') {
            return None;
        }
        let start = self.at;
        let mut at = start + 1;
        let mut escaped = false;
        if self.known_valid {
            let here = b.as_ptr() as usize;
            if let Some(l) = long_at(here + start) {
                // The string lies whole within any value holding its start.
                if l.end <= here + b.len() {
                    #[cfg(test)]
                    JUMPS.with(|j| j.set(j.get() + 1));
                    self.at = l.end - here;
                    return Some(l.escaped);
                }
            }
            // Only the closing quote matters: a backslash's next byte is never it.
            loop {
                at += memchr::memchr2(b'"', b'\\', &b[at..])?;
                if b[at] == b'"' {
                    self.at = at + 1;
                    return Some(escaped);
                }
                escaped = true;
                at += 2;
            }
        }
        let check_utf8 = !self.utf8_known;
        loop {
            at += if check_utf8 {
                plain_run::<true>(&b[at..])
            } else {
                plain_run::<false>(&b[at..])
            };
            match *b.get(at)? {
                b'"' | b'\\' => {}
                0x80.. => {
                    // Bytes past ASCII: UTF-8, up to the next byte a string looks
                    // at (all ASCII, so no character runs across it).
                    let run = at + plain_run::<false>(&b[at..]);
                    std::str::from_utf8(&b[at..run]).ok()?;
                    at = run;
                    continue;
                }
                _ => return None, // a control character
            }
            if b[at] == b'"' {
                self.at = at + 1;
                if self.at - start >= LONG {
                    let here = b.as_ptr() as usize;
                    self.long.push(Long {
                        start: here + start,
                        end: here + self.at,
                        escaped,
                    });
                }
                return Some(escaped);
            }
            escaped = true;
            at += 1;
            match *b.get(at)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => at += 1,
                b'u' => {
                    let unit = hex4(b.get(at + 1..at + 5)?)?;
                    at += 5;
                    match unit {
                        0xD800..=0xDBFF => {
                            // A high surrogate must be followed by a low one.
                            if b.get(at..at + 2)? != b"\\u" {
                                return None;
                            }
                            if !(0xDC00..=0xDFFF).contains(&hex4(b.get(at + 2..at + 6)?)?) {
                                return None;
                            }
                            at += 6;
                        }
                        0xDC00..=0xDFFF => return None,
                        _ => {}
                    }
                }
                _ => return None,
            }
        }
    }
}

/// The length of the leading run of bytes that need no look in a string: not a
/// quote, a backslash or a control character, nor (`HIGH`) a byte past ASCII,
/// whose UTF-8 the caller checks. Sixty-four bytes a step with AVX2
/// where the CPU has it (detected once; a long content string is most of a big
/// body's scan), else sixteen at a time with SSE2 (part of every x86_64), else
/// eight at a time in a word (SWAR).
///
/// Most strings are short (keys, and the values of a stream's chunks), so the
/// first sixteen bytes are looked at here, inline: the AVX2 run is a call of its
/// own, taken only for a string that goes on past them.
#[inline]
fn plain_run<const HIGH: bool>(b: &[u8]) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if b.len() < 16 {
            return plain_run_swar::<HIGH>(b);
        }
        let first = sse2_flags::<HIGH>(b, 0);
        if first != 0 {
            return first.trailing_zeros() as usize;
        }
        let rest = &b[16..];
        if rest.len() >= 64 && std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked just above.
            return 16 + unsafe { plain_run_avx2::<HIGH>(rest) };
        }
        16 + plain_run_sse2::<HIGH>(rest)
    }
    #[cfg(not(target_arch = "x86_64"))]
    plain_run_swar::<HIGH>(b)
}

/// [`plain_run`] two 32-byte vectors a step; the tail goes to the SSE2 run.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn plain_run_avx2<const HIGH: bool>(b: &[u8]) -> usize {
    use std::arch::x86_64::*;
    let quote = _mm256_set1_epi8(b'"' as i8);
    let backslash = _mm256_set1_epi8(b'\\' as i8);
    let below_space = _mm256_set1_epi8(0x1f);
    let top = _mm256_set1_epi8(i8::MIN);
    // min(v, 0x1f) == v exactly where v <= 0x1f (unsigned).
    let flagged = |v: __m256i| {
        let control = _mm256_cmpeq_epi8(_mm256_min_epu8(v, below_space), v);
        let hit = _mm256_or_si256(
            _mm256_or_si256(_mm256_cmpeq_epi8(v, quote), _mm256_cmpeq_epi8(v, backslash)),
            control,
        );
        // A byte past ASCII has its top bit set, which is all the masks look at.
        if HIGH {
            _mm256_or_si256(hit, v)
        } else {
            hit
        }
    };
    let mut at = 0;
    while at + 64 <= b.len() {
        // SAFETY: both loads read 32 bytes within `b` (unaligned loads).
        let (lo, hi) = unsafe {
            (
                flagged(_mm256_loadu_si256(b.as_ptr().add(at).cast())),
                flagged(_mm256_loadu_si256(b.as_ptr().add(at + 32).cast())),
            )
        };
        // Only the top bits count (a compare sets all of a byte's; `HIGH` adds
        // the bytes themselves).
        if _mm256_testz_si256(_mm256_or_si256(lo, hi), top) == 0 {
            let mask = (_mm256_movemask_epi8(lo) as u32 as u64)
                | ((_mm256_movemask_epi8(hi) as u32 as u64) << 32);
            return at + mask.trailing_zeros() as usize;
        }
        at += 64;
    }
    at + plain_run_sse2::<HIGH>(&b[at..])
}

/// [`plain_run`] sixteen bytes at a time; the tail goes to the SWAR run.
#[cfg(target_arch = "x86_64")]
fn plain_run_sse2<const HIGH: bool>(b: &[u8]) -> usize {
    let mut at = 0;
    while at + 16 <= b.len() {
        let mask = sse2_flags::<HIGH>(b, at);
        if mask != 0 {
            return at + mask.trailing_zeros() as usize;
        }
        at += 16;
    }
    at + plain_run_swar::<HIGH>(&b[at..])
}

/// The flagged bytes of `b[at..at + 16]` as a bit mask (bit i: byte at + i).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn sse2_flags<const HIGH: bool>(b: &[u8], at: usize) -> u32 {
    use std::arch::x86_64::*;
    assert!(at + 16 <= b.len());
    // SAFETY: SSE2 is in the x86_64 baseline; the load reads the 16 bytes
    // checked just above (an unaligned load).
    unsafe {
        let v = _mm_loadu_si128(b.as_ptr().add(at).cast());
        let control = _mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(0x1f)), v);
        let mut hit = _mm_or_si128(
            _mm_or_si128(
                _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8)),
                _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8)),
            ),
            control,
        );
        if HIGH {
            hit = _mm_or_si128(hit, v);
        }
        _mm_movemask_epi8(hit) as u32
    }
}

/// [`plain_run`] eight bytes at a time: the lowest flagged byte of each word is
/// exact, which is the one that counts.
fn plain_run_swar<const HIGH: bool>(b: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const TOP: u64 = 0x8080_8080_8080_8080;
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & TOP;
    let mut at = 0;
    while let Some(chunk) = b.get(at..at + 8) {
        let w = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        let mut flagged = zero(w ^ (ONES * u64::from(b'"')))
            | zero(w ^ (ONES * u64::from(b'\\')))
            | (w.wrapping_sub(ONES * 0x20) & !w & TOP);
        if HIGH {
            flagged |= w & TOP;
        }
        if flagged != 0 {
            return at + (flagged.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    while b
        .get(at)
        .is_some_and(|&c| c != b'"' && c != b'\\' && c >= 0x20 && !(HIGH && c >= 0x80))
    {
        at += 1;
    }
    at
}

fn hex4(h: &[u8]) -> Option<u16> {
    let s = std::str::from_utf8(h).ok()?;
    if !s.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    u16::from_str_radix(s, 16).ok()
}

/// Arbitrary JSON-like text for the scanners' property tests: valid documents of
/// every value type (numbers serde reads as out of range among them), with keys
/// from `key`, which may be invalid JSON on purpose.
#[cfg(test)]
pub(crate) fn json_like(
    key: proptest::strategy::BoxedStrategy<String>,
) -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just("null".to_string()),
        Just("true".to_string()),
        Just("false".to_string()),
        Just("1e400".to_string()),
        Just("-0.0E+7".to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u32>().prop_map(|n| n.to_string()),
        (-1e9f64..1e9).prop_map(|f| f.to_string()),
        "[a-z\\\\\"\u{e9}\u{1F600}\n ]{0,12}".prop_map(|s| serde_json::to_string(&s).unwrap()),
    ];
    leaf.prop_recursive(3, 24, 4, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(" , "))),
            prop::collection::vec((key.clone(), inner), 0..4).prop_map(|m| {
                let members: Vec<String> = m.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
                format!("{{{}}}", members.join(","))
            }),
        ]
    })
}

#[cfg(test)]
mod tests {
    use super::{items, items_of, members, members_of, plain_run, plain_str, plain_str_of, Scan};
    use proptest::prelude::*;
    use serde_json::value::RawValue;

    /// serde's reading of an object's members, as (key, raw text) pairs.
    fn serde_members(text: &str) -> Option<Vec<(String, String)>> {
        let m = serde_json::from_str::<super::super::Members>(text).ok()?;
        Some(
            m.0.into_iter()
                .map(|(k, v)| (k.into_owned(), v.get().to_string()))
                .collect(),
        )
    }

    fn serde_items(text: &str) -> Option<Vec<String>> {
        let v: Vec<&RawValue> = serde_json::from_str(text).ok()?;
        Some(v.into_iter().map(|r| r.get().to_string()).collect())
    }

    /// Each splitter either declines or agrees with serde.
    fn agrees(text: &str) -> bool {
        let m = members(text).map(|m| {
            m.into_iter()
                .map(|(k, v)| (k.into_owned(), v.get().to_string()))
                .collect::<Vec<_>>()
        });
        let i = items(text).map(|v| {
            v.into_iter()
                .map(|r| r.get().to_string())
                .collect::<Vec<_>>()
        });
        let s = plain_str(text);
        (m.is_none() || m == serde_members(text))
            && (i.is_none() || i == serde_items(text))
            && (s.is_none() || s.map(str::to_string) == serde_json::from_str::<String>(text).ok())
    }

    #[test]
    fn a_chat_request_is_split_in_one_pass_as_serde_splits_it() {
        let body = r#" {"model":"m","messages":[{"role":"user","content":"Say \"hi\""}],"model":"n","n":1e400, "t" : -0.5e-3 } "#;
        let fast = members(body).expect("the common shape is read in one pass");
        assert_eq!(fast.len(), 5, "repeats are kept, in document order");
        assert!(agrees(body));
        let list = items(fast[1].1.get()).unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!(
            members(list[0].get()).unwrap()[1].1.get(),
            r#""Say \"hi\"""#
        );
        assert_eq!(plain_str(r#" "user" "#), Some("user"));
        assert_eq!(
            plain_str(r#""say \"hi\"""#),
            None,
            "escapes are serde's to undo"
        );
    }

    #[test]
    fn anything_unusual_or_broken_is_left_to_serde() {
        for text in [
            r#"{"m\u006fdel":"x"}"#, // escaped key
            r#"{"x":"\ud800"}"#,     // lone surrogate: serde's RawValue takes it
            r#"{"x":"a\x"}"#,
            "{\"x\":\"a\u{1}\"}",
            r#"{"x":1} x"#,
            r#"{"x":1,}"#,
            r#"{"x":01}"#,
            r#"{"x":-}"#,
            r#"{"x":1.}"#,
            r#"{"x":tru}"#,
            r#"[1,]"#,
            "",
        ] {
            assert!(members(text).is_none() && items(text).is_none(), "{text}");
        }
        let deep = format!("{{\"x\":{}{}}}", "[".repeat(200), "]".repeat(200));
        assert!(members(&deep).is_none());
    }

    fn value() -> impl Strategy<Value = String> {
        super::json_like("\"[a-z_\\\\]{1,6}\"".boxed())
    }

    proptest! {
        #[test]
        fn the_splitters_never_disagree_with_serde(v in value()) {
            prop_assert!(agrees(&v));
        }

        #[test]
        fn broken_documents_are_never_split_differently(
            v in value(), cut in 0usize..200, byte in any::<u8>()
        ) {
            let mut b = v.into_bytes();
            if !b.is_empty() {
                let at = cut % b.len();
                b[at] = byte;
            }
            if let Ok(text) = std::str::from_utf8(&b) {
                prop_assert!(agrees(text));
            }
        }

        /// On text serde has read as JSON, the scan that skips strings unchecked
        /// splits exactly as serde does (or declines, as the checking one may).
        #[test]
        fn a_value_known_to_be_json_is_split_as_serde_splits_it(v in value()) {
            if let Ok(raw) = serde_json::from_str::<&RawValue>(&v) {
                let text = raw.get();
                let m = members_of(Scan::of_valid(raw)).map(|m| {
                    m.into_iter().map(|(k, v)| (k.into_owned(), v.get().to_string())).collect::<Vec<_>>()
                });
                prop_assert!(m.is_none() || m == serde_members(text), "{text}");
                let i = items_of(Scan::of_valid(raw))
                    .map(|v| v.into_iter().map(|r| r.get().to_string()).collect::<Vec<_>>());
                prop_assert!(i.is_none() || i == serde_items(text), "{text}");
                let s = plain_str_of(Scan::of_valid(raw));
                prop_assert!(s.is_none() || s.map(str::to_string) == serde_json::from_str::<String>(text).ok());
                // Where the checking scan splits, the unchecked one splits the same.
                if let Some(checked) = members(text) {
                    prop_assert_eq!(checked.len(), m.map_or(0, |m| m.len()));
                }
            }
        }

    }

    /// Every byte a string must look at, at every offset across the 64- and
    /// 16-byte steps and their tails, over plain bytes of both halves of the range.
    #[test]
    fn a_plain_run_stops_at_every_flagged_byte_at_every_offset() {
        let stops = (0u8..0x20).chain([b'"', b'\\']);
        for stop in stops {
            for fill in [b'a', 0x20, 0x7f, 0xc3, 0xff] {
                for at in 0..200 {
                    let mut text = vec![fill; 260];
                    text[at] = stop;
                    assert_eq!(
                        plain_run::<false>(&text),
                        at,
                        "stop {stop:#x} fill {fill:#x}"
                    );
                    assert_eq!(
                        plain_run::<true>(&text),
                        at.min(if fill >= 0x80 { 0 } else { at })
                    );
                }
                // Short runs too: below, at and past the inline first step.
                for len in 0..100 {
                    for at in 0..len {
                        let mut text = vec![fill; len];
                        text[at] = stop;
                        assert_eq!(plain_run::<false>(&text), at, "len {len}");
                    }
                    assert_eq!(plain_run::<false>(&vec![fill; len]), len);
                }
                assert_eq!(plain_run::<false>(&vec![fill; 259]), 259);
                assert_eq!(
                    plain_run::<true>(&vec![fill; 259]),
                    if fill >= 0x80 { 0 } else { 259 }
                );
            }
        }
    }

    /// The run that also stops past ASCII stops at the first such byte, at every
    /// offset across the vector steps and their tails; the other runs over it.
    #[test]
    fn a_run_checking_utf8_stops_at_every_byte_past_ascii() {
        for high in [0x80u8, 0xc3, 0xe9, 0xff] {
            for at in 0..200 {
                let mut text = vec![b'a'; 260];
                text[at] = high;
                assert_eq!(plain_run::<true>(&text), at, "byte {high:#x}");
                assert_eq!(plain_run::<false>(&text), 260);
            }
        }
    }

    /// The byte scan's verdict on bytes that may not be UTF-8: where it splits,
    /// the bytes are UTF-8 and serde splits them the same.
    fn agrees_on_bytes(b: &[u8]) -> bool {
        let Some(m) = members_of(Scan::of_bytes(b)) else {
            return true;
        };
        let Ok(text) = std::str::from_utf8(b) else {
            return false;
        };
        let m: Vec<_> = m
            .into_iter()
            .map(|(k, v)| (k.into_owned(), v.get().to_string()))
            .collect();
        Some(m) == serde_members(text)
    }

    #[test]
    fn bytes_that_are_not_utf8_are_never_split() {
        for bad in [
            &b"{\"a\":\"\xff\"}"[..],
            b"{\"a\":\"\xc3\"}",
            b"{\"a\":\"\xc3(\"}",
            b"{\"a\":\"\xed\xa0\x80\"}", // a surrogate, encoded
            b"{\"a\":\"\xf0\x9f\x98\"}",
            b"{\"\xe9\":1}",
        ] {
            assert!(members_of(Scan::of_bytes(bad)).is_none(), "{bad:?}");
        }
        let long = format!(
            "{{\"a\":\"{}\u{e9}\u{1F600}{}\"}}",
            "x".repeat(100),
            "y".repeat(70)
        );
        assert_eq!(
            members_of(Scan::of_bytes(long.as_bytes())).map(|m| m.len()),
            Some(1)
        );
    }

    /// Every value under `v`, read the way the inbound parsers read them: objects
    /// and arrays split known-valid, strings unescaped, the rest as written.
    fn read_all(v: &RawValue, out: &mut Vec<String>) {
        match v.get().as_bytes()[0] {
            b'{' => {
                for (k, v) in crate::json::split_valid_object(v).unwrap() {
                    out.push(k.into_owned());
                    read_all(v, out);
                }
            }
            b'[' => {
                for v in crate::json::split_valid_array(v).unwrap() {
                    read_all(v, out);
                }
            }
            b'"' => out.push(crate::json::valid_string_value(v).unwrap().into_owned()),
            _ => out.push(v.get().to_string()),
        }
    }

    /// A body's reading with and without its long strings held, and how many
    /// strings the held reading jumped over.
    fn read_with_and_without_index(body: &[u8]) -> (Vec<String>, Vec<String>, usize) {
        let (members, long) = crate::json::split_object_bytes(body).unwrap();
        let read = |out: &mut Vec<String>| {
            for (k, v) in &members {
                out.push(k.to_string());
                read_all(v, out);
            }
        };
        let mut plain = Vec::new();
        read(&mut plain);
        let jumps = super::JUMPS.with(|j| j.get());
        let mut held = Vec::new();
        super::with_long_strings(&long, || read(&mut held));
        let jumped = super::JUMPS.with(|j| j.get()) - jumps;
        // Outside the scope nothing is jumped over.
        let mut after = Vec::new();
        read(&mut after);
        assert_eq!(super::JUMPS.with(|j| j.get()) - jumps, jumped);
        assert_eq!(after, plain);
        (plain, held, jumped)
    }

    #[test]
    fn long_strings_are_jumped_over_while_held_and_read_the_same() {
        let long = "lorem ipsum ".repeat(500);
        let escaped = format!("{}\\n\\\"\u{e9}{}", "a".repeat(3000), "b".repeat(3000));
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"{long}"}},{{"role":"assistant","content":[{{"type":"text","text":"{escaped}"}}]}}],"{long}":1}}"#
        );
        let (plain, held, jumped) = read_with_and_without_index(body.as_bytes());
        assert_eq!(plain, held);
        assert!(plain.iter().any(|s| s.contains("\n\"\u{e9}")));
        // The content: as a message array's item, a message's member and a string;
        // the escaped text likewise, a level deeper.
        assert!(jumped >= 6, "{jumped}");
        // A short body keeps no index and jumps nothing.
        let (_, long) = crate::json::split_object_bytes(br#"{"a":"b"}"#).unwrap();
        assert!(long.strings.is_empty());
    }

    /// A document whose strings may be long (past the noted length), with
    /// escapes and text past ASCII among them.
    fn long_doc() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("x".to_string()),
            Just("\\\"".to_string()),
            Just("\u{e9}".to_string()),
            Just("\\u00e9".to_string()),
        ];
        let leaf = prop_oneof![
            (piece, 0usize..5000).prop_map(|(p, n)| format!("\"{}{}\"", "y".repeat(n), p)),
            Just("1".to_string()),
            Just("null".to_string()),
        ];
        leaf.prop_recursive(3, 12, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec(inner, 0..3).prop_map(|v| {
                    let m: Vec<String> = v
                        .into_iter()
                        .enumerate()
                        .map(|(i, v)| format!("\"k{i}\":{v}"))
                        .collect();
                    format!("{{{}}}", m.join(","))
                }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// With its long strings held, a document reads exactly as without.
        #[test]
        fn a_document_reads_the_same_with_its_long_strings_held(v in long_doc()) {
            let body = format!("{{\"a\":{v},\"b\":{v}}}");
            let (plain, held, _) = read_with_and_without_index(body.as_bytes());
            prop_assert_eq!(plain, held);
        }
    }

    proptest! {
        /// Bytes past ASCII put anywhere in a document (in its strings, a long
        /// run of them, or outside them): the byte scan splits only UTF-8, and as
        /// serde does.
        #[test]
        fn the_byte_scan_splits_only_utf8_and_as_serde_does(
            v in value(),
            cut in 0usize..400,
            pad in 0usize..100,
            bytes in proptest::collection::vec(any::<u8>(), 1..6),
        ) {
            let mut b = v.clone().into_bytes();
            prop_assert!(agrees_on_bytes(&b));
            let at = cut % (b.len() + 1);
            let mut inserted = vec![b'x'; pad];
            inserted.extend_from_slice(&bytes);
            b.splice(at..at, inserted);
            prop_assert!(agrees_on_bytes(&b), "{:?}", String::from_utf8_lossy(&b));
        }

        /// The vector runs (64 and 16 bytes a step) find the first byte a string
        /// must look at, wherever it falls and whatever surrounds it.
        #[test]
        fn a_plain_run_stops_at_the_first_quote_backslash_or_control(
            plain in proptest::collection::vec(0x20u8..=0xff, 0..300),
            stop in prop_oneof![Just(b'"'), Just(b'\\'), 0u8..0x20],
            tail in proptest::collection::vec(any::<u8>(), 0..20),
        ) {
            let mut text = plain;
            text.push(stop);
            text.extend_from_slice(&tail);
            let want = text
                .iter()
                .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
                .unwrap_or(text.len());
            prop_assert_eq!(plain_run::<false>(&text), want);
        }
    }
}
