//! A body written by the gateway around long values it borrows, unchanged, from
//! the client's body. A native rung's body is mostly the client's own members: a
//! 100 KB `messages` value is sent from where it arrived instead of being copied
//! into a new body (the gateway sends the pieces in one vectored write).

/// Values this long or longer are borrowed; shorter ones are copied, as a piece
/// costs more than copying a few KB.
pub const BORROW_AT: usize = 4096;

/// The gateway's bytes, and the borrowed values to splice in: `holes[i] = (at,
/// value)` puts `value` before `bytes[at]`, in order of `at`.
#[derive(Debug, Default)]
pub struct Spliced<'a> {
    pub bytes: Vec<u8>,
    pub holes: Vec<(usize, &'a [u8])>,
}

impl<'a> Spliced<'a> {
    fn with_capacity(n: usize) -> Self {
        Spliced {
            bytes: Vec::with_capacity(n),
            holes: Vec::new(),
        }
    }

    /// Room for the members' values that will be copied, and `extra` bytes.
    pub fn for_values<'v>(values: impl Iterator<Item = &'v str>, extra: usize) -> Self {
        let copied: usize = values.map(str::len).filter(|n| *n < BORROW_AT).sum();
        Self::with_capacity(copied + extra)
    }

    /// Opens the object or separates the member, then writes `"k":`.
    pub fn key(&mut self, k: &str) {
        self.bytes
            .push(if self.bytes.is_empty() { b'{' } else { b',' });
        // Written straight into the body: serializing a str into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut self.bytes, k);
        self.bytes.push(b':');
    }

    /// Appends `v`: borrowed when long, copied otherwise.
    pub fn put_value(&mut self, v: &'a [u8]) {
        if v.len() >= BORROW_AT {
            self.holes.push((self.bytes.len(), v));
        } else {
            self.bytes.extend_from_slice(v);
        }
    }

    /// The whole body, with every value copied in.
    pub fn flatten(self) -> Vec<u8> {
        if self.holes.is_empty() {
            return self.bytes;
        }
        let mut out = Vec::with_capacity(self.len());
        let mut from = 0;
        for (at, v) in &self.holes {
            out.extend_from_slice(&self.bytes[from..*at]);
            out.extend_from_slice(v);
            from = *at;
        }
        out.extend_from_slice(&self.bytes[from..]);
        out
    }

    /// The body's length.
    pub fn len(&self) -> usize {
        self.bytes.len() + self.holes.iter().map(|(_, v)| v.len()).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_borrowed_in_place_and_short_ones_copied() {
        let long = "x".repeat(BORROW_AT);
        let mut s = Spliced::default();
        s.bytes.extend_from_slice(b"{\"a\":");
        s.put_value(long.as_bytes());
        s.bytes.extend_from_slice(b",\"b\":");
        s.put_value(b"1");
        s.bytes.push(b'}');
        assert_eq!(s.holes.len(), 1);
        assert_eq!(s.holes[0].0, 5);
        assert!(std::ptr::eq(s.holes[0].1, long.as_bytes()));
        let n = s.len();
        let flat = s.flatten();
        assert_eq!(flat.len(), n);
        assert_eq!(flat, format!("{{\"a\":{long},\"b\":1}}").into_bytes());
    }
}
