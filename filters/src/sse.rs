//! Incremental server-sent-events decoding and encoding. Upstream bytes arrive in
//! arbitrary pieces: an event may span reads, and one read may hold several events.
//! The decoder keeps only the unfinished tail between pushes.

/// One decoded event. `data` is the concatenation of its `data:` lines (joined by
/// `\n`); an event with only comment lines has `comment` set and no data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
    pub comment: bool,
}

/// The largest event (or unfinished line) a decoder holds: a provider that sends
/// more without an event boundary is broken or hostile, and is cut off there.
pub const MAX_EVENT_BYTES: usize = 4 << 20;

#[derive(Default)]
pub struct SseDecoder {
    buf: Vec<u8>,
    /// Where scanning for the next line resumes.
    scan: usize,
    pending: SseEvent,
    has_field: bool,
    /// Data lines in the pending event (a first empty `data:` line still counts).
    data_lines: usize,
}

impl SseDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes as they arrive.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete event, if the buffer holds one.
    pub fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            let rest = &self.buf[self.scan..];
            let nl = memchr::memchr2(b'\n', b'\r', rest)?;
            let line_end = self.scan + nl;
            let mut next = line_end + 1;
            if self.buf[line_end] == b'\r' {
                match self.buf.get(next) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    // A lone \r at the end may be the first half of \r\n: wait.
                    None => return None,
                }
            }
            let (start, end) = (self.scan, line_end);
            self.scan = next;
            if start == end {
                if self.has_field {
                    self.has_field = false;
                    self.data_lines = 0;
                    let ev = std::mem::take(&mut self.pending);
                    self.compact();
                    return Some(ev);
                }
                continue;
            }
            self.has_field = true;
            let line = &self.buf[start..end];
            if line[0] == b':' {
                self.pending.comment = true;
                continue;
            }
            let (field, value) = match line.iter().position(|&b| b == b':') {
                Some(i) => {
                    let v = &line[i + 1..];
                    (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
                }
                None => (line, &b""[..]),
            };
            let value = match std::str::from_utf8(value) {
                Ok(v) => std::borrow::Cow::Borrowed(v),
                Err(_) => String::from_utf8_lossy(value),
            };
            match field {
                b"data" => {
                    if self.data_lines > 0 {
                        self.pending.data.push('\n');
                    }
                    self.pending.data.push_str(&value);
                    self.data_lines += 1;
                }
                b"event" => self.pending.event = Some(value.into_owned()),
                _ => {}
            }
        }
    }

    /// Whether the event being assembled (its data so far and the unread bytes)
    /// is past [`MAX_EVENT_BYTES`]: the stream is to be abandoned.
    pub fn too_large(&self) -> bool {
        self.buf.len() - self.scan + self.pending.data.len() > MAX_EVENT_BYTES
    }

    /// Forgets consumed bytes once they are a good part of the buffer.
    fn compact(&mut self) {
        if self.scan == self.buf.len() {
            self.buf.clear();
            self.scan = 0;
        } else if self.scan > 4096 && self.scan * 2 > self.buf.len() {
            self.buf.drain(..self.scan);
            self.scan = 0;
        }
    }
}

/// `data: <payload>\n\n`.
pub fn data_frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 8);
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\n\n");
    out
}

/// `event: <name>\ndata: <payload>\n\n`.
pub fn named_frame(event: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + event.len() + 16);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\n\n");
    out
}

/// An SSE comment line, used as a keep-alive.
pub const KEEPALIVE: &[u8] = b": keep-alive\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    fn all(d: &mut SseDecoder) -> Vec<SseEvent> {
        std::iter::from_fn(|| d.next_event()).collect()
    }

    #[test]
    fn an_endless_line_or_event_is_too_large() {
        let mut d = SseDecoder::new();
        let piece = vec![b'x'; 1 << 20];
        d.push(b"data: ");
        for _ in 0..3 {
            d.push(&piece);
            assert!(d.next_event().is_none());
        }
        assert!(!d.too_large());
        d.push(&piece);
        d.push(&piece);
        assert!(d.too_large(), "one line past the cap");
        // Many data lines of one event count together.
        let mut d = SseDecoder::new();
        for _ in 0..5 {
            d.push(b"data: ");
            d.push(&piece);
            d.push(b"\n");
            assert!(d.next_event().is_none());
        }
        assert!(d.too_large(), "one event past the cap");
        // Whole events leave nothing behind.
        let mut d = SseDecoder::new();
        for _ in 0..8 {
            d.push(b"data: ");
            d.push(&piece);
            d.push(b"\n\n");
            assert!(d.next_event().is_some());
            assert!(!d.too_large());
        }
    }

    #[test]
    fn events_split_across_reads_and_joined_in_one() {
        let text = "data: {\"a\":1}\n\ndata: {\"b\":2}\n\nevent: ping\ndata: x\n\n: keep\n\ndata: [DONE]\n\n";
        for split in 0..text.len() {
            let mut d = SseDecoder::new();
            let mut got = Vec::new();
            d.push(&text.as_bytes()[..split]);
            got.extend(all(&mut d));
            d.push(&text.as_bytes()[split..]);
            got.extend(all(&mut d));
            assert_eq!(got.len(), 5, "split at {split}: {got:?}");
            assert_eq!(got[0].data, "{\"a\":1}");
            assert_eq!(got[1].data, "{\"b\":2}");
            assert_eq!(got[2].event.as_deref(), Some("ping"));
            assert!(got[3].comment && got[3].data.is_empty());
            assert_eq!(got[4].data, "[DONE]");
        }
    }

    #[test]
    fn crlf_and_multiline_data() {
        let mut d = SseDecoder::new();
        d.push(b"data: one\r\ndata: two\r\n\r\ndata:three\r");
        assert_eq!(d.next_event().unwrap().data, "one\ntwo");
        assert_eq!(d.next_event(), None);
        d.push(b"\n\r\n");
        assert_eq!(d.next_event().unwrap().data, "three");
    }

    #[test]
    fn incomplete_event_waits() {
        let mut d = SseDecoder::new();
        d.push(b"data: {\"partial\"");
        assert_eq!(d.next_event(), None);
        d.push(b":1}\n");
        assert_eq!(d.next_event(), None);
        d.push(b"\n");
        assert_eq!(d.next_event().unwrap().data, "{\"partial\":1}");
    }

    #[test]
    fn frames() {
        assert_eq!(data_frame(b"{}"), b"data: {}\n\n");
        assert_eq!(named_frame("ping", b"{}"), b"event: ping\ndata: {}\n\n");
    }
}
