//! The AWS event-stream binary framing: frames read and written, each prelude and
//! message checked by its CRC32.

use super::*;

/// The largest message accepted (AWS caps payloads at 16 MiB and headers at
/// 128 KiB).
pub(super) const MAX_MESSAGE: usize = (16 << 20) + (128 << 10) + 16;

/// Prelude (total length, headers length, prelude CRC) plus the message CRC.
pub(super) const OVERHEAD: usize = 16;

/// One event-stream message. `event_type` is the `:event-type` header for events,
/// the `:exception-type` for exceptions and the `:error-code` for errors, so it can
/// be handed to [`Decoder`] as the frame's name; an error message's
/// `:error-message` becomes a `{"message": …}` payload.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    pub event_type: String,
    /// `event`, `exception` or `error`.
    pub message_type: String,
    pub payload: Vec<u8>,
}

/// Splits an event-stream byte stream into messages, checking both CRCs. Bytes
/// arrive in arbitrary pieces; only the unfinished tail is kept between pushes.
/// After a framing error the stream cannot be resynchronized: the error is
/// reported once, then nothing more.
#[derive(Default)]
pub struct FrameDecoder {
    pub(super) buf: Vec<u8>,
    /// Where the next message starts.
    pub(super) pos: usize,
    pub(super) failed: bool,
}

pub(super) fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// The string headers a frame needs.
#[derive(Default)]
pub(super) struct Headers {
    pub(super) message_type: Option<String>,
    pub(super) event_type: Option<String>,
    pub(super) exception_type: Option<String>,
    pub(super) error_code: Option<String>,
    pub(super) error_message: Option<String>,
}

pub(super) fn bad_header() -> DecodeError {
    DecodeError("event-stream: malformed header".into())
}

/// Splits `n` bytes off the front of `h`.
pub(super) fn take<'a>(h: &mut &'a [u8], n: usize) -> Result<&'a [u8], DecodeError> {
    if h.len() < n {
        return Err(bad_header());
    }
    let (head, rest) = h.split_at(n);
    *h = rest;
    Ok(head)
}

pub(super) fn parse_headers(mut h: &[u8]) -> Result<Headers, DecodeError> {
    let mut out = Headers::default();
    while !h.is_empty() {
        let name_len = usize::from(take(&mut h, 1)?[0]);
        let name = take(&mut h, name_len)?;
        let kind = take(&mut h, 1)?[0];
        let len = match kind {
            0 | 1 => 0,
            2 => 1,
            3 => 2,
            4 => 4,
            5 | 8 => 8,
            9 => 16,
            6 | 7 => {
                let l = take(&mut h, 2)?;
                usize::from(u16::from_be_bytes([l[0], l[1]]))
            }
            _ => return Err(bad_header()),
        };
        let value = take(&mut h, len)?;
        if kind != 7 {
            continue;
        }
        let slot = match name {
            b":message-type" => &mut out.message_type,
            b":event-type" => &mut out.event_type,
            b":exception-type" => &mut out.exception_type,
            b":error-code" => &mut out.error_code,
            b":error-message" => &mut out.error_message,
            _ => continue,
        };
        *slot = Some(String::from_utf8_lossy(value).into_owned());
    }
    Ok(out)
}

pub(super) fn frame_of(h: Headers, payload: &[u8]) -> Frame {
    let message_type = h.message_type.unwrap_or_else(|| "event".to_string());
    let event_type = match message_type.as_str() {
        "exception" => h.exception_type,
        "error" => h.error_code,
        _ => h.event_type,
    }
    .unwrap_or_default();
    let payload = match h.error_message {
        Some(message) if payload.is_empty() => {
            serde_json::to_vec(&serde_json::json!({ "message": message })).unwrap_or_default()
        }
        _ => payload.to_vec(),
    };
    Frame {
        event_type,
        message_type,
        payload,
    }
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes as they arrive.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > 4096 && self.pos * 2 > self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    pub(super) fn fail(&mut self, message: &str) -> Option<Result<Frame, DecodeError>> {
        self.failed = true;
        Some(Err(DecodeError(format!("event-stream: {message}"))))
    }

    /// The next whole message, if the buffer holds one.
    pub fn next_frame(&mut self) -> Option<Result<Frame, DecodeError>> {
        if self.failed {
            return None;
        }
        let rest = &self.buf[self.pos..];
        if rest.len() < 12 {
            return None;
        }
        let total = be32(&rest[0..4]) as usize;
        let headers_len = be32(&rest[4..8]) as usize;
        if crc32fast::hash(&rest[0..8]) != be32(&rest[8..12]) {
            return self.fail("prelude CRC mismatch");
        }
        if !(OVERHEAD..=MAX_MESSAGE).contains(&total) || headers_len > total - OVERHEAD {
            return self.fail("bad message lengths");
        }
        if rest.len() < total {
            return None;
        }
        let msg = &rest[..total];
        if crc32fast::hash(&msg[..total - 4]) != be32(&msg[total - 4..]) {
            return self.fail("message CRC mismatch");
        }
        let headers = match parse_headers(&msg[12..12 + headers_len]) {
            Ok(h) => h,
            Err(e) => {
                self.failed = true;
                return Some(Err(e));
            }
        };
        let frame = frame_of(headers, &msg[12 + headers_len..total - 4]);
        self.pos += total;
        Some(Ok(frame))
    }
}

/// One event-stream message with string headers (names longer than 255 bytes and
/// values longer than 65535 bytes are cut to fit).
pub fn encode_frame(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::with_capacity(headers.iter().map(|(n, v)| n.len() + v.len() + 4).sum());
    for (name, value) in headers {
        let name = &name.as_bytes()[..name.len().min(usize::from(u8::MAX))];
        let value = &value.as_bytes()[..value.len().min(usize::from(u16::MAX))];
        h.push(name.len() as u8);
        h.extend_from_slice(name);
        h.push(7);
        h.extend_from_slice(&(value.len() as u16).to_be_bytes());
        h.extend_from_slice(value);
    }
    let total = OVERHEAD + h.len() + payload.len();
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&(total as u32).to_be_bytes());
    out.extend_from_slice(&(h.len() as u32).to_be_bytes());
    let prelude_crc = crc32fast::hash(&out);
    out.extend_from_slice(&prelude_crc.to_be_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

/// An `event` message of type `event_type` with a JSON payload.
pub fn encode_event(event_type: &str, payload: &[u8]) -> Vec<u8> {
    encode_frame(
        &[
            (":event-type", event_type),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload,
    )
}

/// An `exception` message of type `exception_type` with a JSON payload.
pub fn encode_exception(exception_type: &str, payload: &[u8]) -> Vec<u8> {
    encode_frame(
        &[
            (":exception-type", exception_type),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        payload,
    )
}
