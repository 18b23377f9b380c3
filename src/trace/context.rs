//! W3C Trace Context: the `traceparent` a client sends (so our spans join its
//! trace) and the one each attempt sends to its provider (so theirs join ours).
//! Ids are random, in fixed-size arrays: nothing here allocates.

/// `version-traceid-parentid-flags`, 55 characters in version 00.
pub const HEADER_LEN: usize = 55;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    /// The caller's span (the parent of ours).
    pub span_id: [u8; 8],
    /// Bit 0: sampled.
    pub flags: u8,
}

impl TraceContext {
    /// Parses a `traceparent` value; `None` when it is not a valid one (W3C:
    /// then a new trace starts). Versions above 00 are read by their first four
    /// fields, as the spec asks; `ff` is invalid.
    pub fn parse(value: &[u8]) -> Option<TraceContext> {
        if value.len() < HEADER_LEN || (value.len() > HEADER_LEN && value[HEADER_LEN] != b'-') {
            return None;
        }
        let version = hex_byte(&value[0..2])?;
        if version == 0xff || (version == 0 && value.len() != HEADER_LEN) {
            return None;
        }
        if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let mut trace_id = [0u8; 16];
        for (i, b) in trace_id.iter_mut().enumerate() {
            *b = hex_byte(&value[3 + 2 * i..5 + 2 * i])?;
        }
        let mut span_id = [0u8; 8];
        for (i, b) in span_id.iter_mut().enumerate() {
            *b = hex_byte(&value[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&value[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceContext {
            trace_id,
            span_id,
            flags,
        })
    }

    /// A new trace, sampled.
    pub fn fresh() -> TraceContext {
        TraceContext {
            trace_id: nonzero(),
            span_id: nonzero(),
            flags: 1,
        }
    }

    /// The `traceparent` naming `span_id` of this trace as the parent.
    pub fn header(&self) -> Header {
        let mut out = [0u8; HEADER_LEN];
        out[..3].copy_from_slice(b"00-");
        hex_into(&self.trace_id, &mut out[3..35]);
        out[35] = b'-';
        hex_into(&self.span_id, &mut out[36..52]);
        out[52] = b'-';
        hex_into(&[self.flags], &mut out[53..55]);
        Header(out)
    }
}

/// A `traceparent` value, ready to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header([u8; HEADER_LEN]);

impl Header {
    pub fn as_str(&self) -> &str {
        // Only ASCII hex digits and dashes are ever written into it.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// Random bytes that are not all zero (an all-zero id is invalid).
pub fn nonzero<const N: usize>() -> [u8; N] {
    use rand::RngCore;
    let mut b = [0u8; N];
    while b == [0; N] {
        rand::thread_rng().fill_bytes(&mut b);
    }
    b
}

/// Lower-case hex of `bytes` into `out` (twice as long).
pub fn hex_into(bytes: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in bytes.iter().enumerate() {
        out[2 * i] = DIGITS[(b >> 4) as usize];
        out[2 * i + 1] = DIGITS[(b & 15) as usize];
    }
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    let d = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(d(two[0])? << 4 | d(two[1])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_the_w3c_header() {
        let v = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let c = TraceContext::parse(v.as_bytes()).unwrap();
        assert_eq!(c.flags, 1);
        assert_eq!(c.header().as_str(), v);
        // A later version with more fields is read by its first four.
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-ever";
        assert_eq!(
            TraceContext::parse(later.as_bytes()).unwrap().trace_id,
            c.trace_id
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(TraceContext::parse(bad.as_bytes()).is_none(), "{bad}");
        }
        let f = TraceContext::fresh();
        assert_eq!(TraceContext::parse(f.header().as_str().as_bytes()), Some(f));
    }
}
