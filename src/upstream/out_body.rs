//! A request body for a provider, in pieces: the gateway's own bytes and long
//! values sliced (not copied) from the client's body. The pieces leave behind the
//! request's head in one vectored write.

use bytes::{Buf, Bytes, BytesMut};
use sluice_filters::upstream::spliced::Spliced;
use std::io::IoSlice;

#[derive(Clone, Debug, Default)]
pub struct OutBody {
    parts: Vec<Bytes>,
    len: usize,
}

impl OutBody {
    /// `spliced`, with each borrowed value sliced from `source` when it lies in it
    /// (a value the gateway rewrote does not, and is copied).
    pub fn splice(spliced: Spliced<'_>, source: &Bytes) -> Self {
        if spliced.holes.is_empty() {
            return Bytes::from(spliced.bytes).into();
        }
        let own = Bytes::from(spliced.bytes);
        let mut parts = Vec::with_capacity(2 * spliced.holes.len() + 1);
        let mut from = 0;
        for (at, v) in spliced.holes {
            if at > from {
                parts.push(own.slice(from..at));
            }
            parts.push(slice_of(source, v));
            from = at;
        }
        if from < own.len() {
            parts.push(own.slice(from..));
        }
        let len = parts.iter().map(Bytes::len).sum();
        OutBody { parts, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pieces, in order.
    pub fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    /// The body in one piece (a copy when it is in several): for a signature
    /// over it or an HTTP/2 peer.
    pub fn to_bytes(&self) -> Bytes {
        match self.parts.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            many => {
                let mut b = BytesMut::with_capacity(self.len);
                for p in many {
                    b.extend_from_slice(p);
                }
                b.freeze()
            }
        }
    }

    /// A reader over the pieces, for one vectored write.
    pub fn reader(&self) -> Reader<'_> {
        Reader {
            parts: &self.parts,
            at: 0,
            skip: 0,
        }
    }
}

impl From<Bytes> for OutBody {
    fn from(b: Bytes) -> Self {
        let len = b.len();
        let parts = if len == 0 { Vec::new() } else { vec![b] };
        OutBody { parts, len }
    }
}

impl From<Vec<u8>> for OutBody {
    fn from(v: Vec<u8>) -> Self {
        Bytes::from(v).into()
    }
}

/// `v` as a slice of `source` when it lies in it; a copy otherwise.
fn slice_of(source: &Bytes, v: &[u8]) -> Bytes {
    let start = source.as_ptr() as usize;
    let at = v.as_ptr() as usize;
    if at >= start && at + v.len() <= start + source.len() {
        source.slice_ref(v)
    } else {
        Bytes::copy_from_slice(v)
    }
}

/// The pieces not yet written: piece `at`, less its first `skip` bytes, onward.
pub struct Reader<'a> {
    parts: &'a [Bytes],
    at: usize,
    skip: usize,
}

impl Buf for Reader<'_> {
    fn remaining(&self) -> usize {
        self.parts[self.at.min(self.parts.len())..]
            .iter()
            .map(Bytes::len)
            .sum::<usize>()
            - self.skip
    }

    fn chunk(&self) -> &[u8] {
        self.parts.get(self.at).map_or(&[], |p| &p[self.skip..])
    }

    fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let Some(p) = self.parts.get(self.at) else {
                return;
            };
            let left = p.len() - self.skip;
            if n < left {
                self.skip += n;
                return;
            }
            n -= left;
            self.at += 1;
            self.skip = 0;
        }
    }

    fn chunks_vectored<'s>(&'s self, dst: &mut [IoSlice<'s>]) -> usize {
        let mut n = 0;
        let mut skip = self.skip;
        for p in self.parts.iter().skip(self.at) {
            if n == dst.len() {
                break;
            }
            dst[n] = IoSlice::new(&p[skip..]);
            skip = 0;
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_filters::upstream::spliced::BORROW_AT;

    fn spliced_over(source: &Bytes) -> (Spliced<'_>, String) {
        let long = &source[5..5 + BORROW_AT];
        let mut s = Spliced::default();
        s.bytes.extend_from_slice(b"{\"a\":");
        s.put_value(long);
        s.bytes.extend_from_slice(b",\"b\":");
        let rewritten = vec![b'y'; BORROW_AT];
        let expected = format!(
            "{{\"a\":{},\"b\":{}}}",
            std::str::from_utf8(long).unwrap(),
            "y".repeat(BORROW_AT)
        );
        // A value outside the source (one the gateway rewrote) is copied.
        s.holes
            .push((s.bytes.len(), Box::leak(rewritten.into_boxed_slice())));
        s.bytes.push(b'}');
        (s, expected)
    }

    #[test]
    fn borrowed_values_are_slices_of_the_source_and_the_pieces_read_in_order() {
        let source = Bytes::from(format!("{{\"a\":{}}}", "x".repeat(2 * BORROW_AT)));
        let (s, expected) = spliced_over(&source);
        let body = OutBody::splice(s, &source);
        assert_eq!(body.len(), expected.len());
        assert_eq!(body.to_bytes(), expected.as_bytes());
        // The long value was not copied: its piece points into the source.
        assert!(body
            .parts
            .iter()
            .any(|p| p.as_ptr() == source[5..].as_ptr()));
        // Read the way a vectored write does: a few slices at a time, advancing
        // by less than one piece.
        let mut r = body.reader();
        let mut out = Vec::new();
        while r.has_remaining() {
            let mut io = [IoSlice::new(&[]); 2];
            let n = r.chunks_vectored(&mut io);
            let took = io[..n].iter().map(|s| s.len()).sum::<usize>().min(1000);
            let mut left = took;
            for s in &io[..n] {
                let k = s.len().min(left);
                out.extend_from_slice(&s[..k]);
                left -= k;
            }
            assert_eq!(r.remaining(), expected.len() - out.len() + took);
            r.advance(took);
        }
        assert_eq!(out, expected.as_bytes());
    }

    #[test]
    fn a_body_without_borrowed_values_is_one_piece() {
        let body = OutBody::splice(
            Spliced {
                bytes: b"{}".to_vec(),
                holes: Vec::new(),
            },
            &Bytes::new(),
        );
        assert_eq!(body.parts.len(), 1);
        assert_eq!(body.to_bytes(), "{}");
        assert!(OutBody::from(Bytes::new()).is_empty());
    }
}
