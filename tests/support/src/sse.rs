//! Stream plumbing shared by the formats: server-sent-event framing, JSON
//! string quoting for hand-built frames, and the response body that writes
//! each frame as it is produced (with scripted pauses and connection cuts).

use std::{io, time::Duration};

use axum::body::Body;
use bytes::Bytes;
use serde_json::Value;

use crate::step::Plan;

/// Appends `s` as a quoted JSON string.
pub(crate) fn push_json_str(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    let mut plain = 0;
    for (i, b) in s.bytes().enumerate() {
        let escaped = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[plain..i]);
        plain = i + 1;
        if escaped.is_empty() {
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        } else {
            out.push_str(escaped);
        }
    }
    out.push_str(&s[plain..]);
    out.push('"');
}

/// `s` as a quoted JSON string.
pub(crate) fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    push_json_str(&mut out, s);
    out
}

/// An unnamed SSE frame: `data: <json>\n\n`.
pub(crate) fn data(json: &Value) -> Bytes {
    Bytes::from(format!("data: {json}\n\n"))
}

/// A named SSE frame: `event: <name>\ndata: <json>\n\n`.
pub(crate) fn event(name: &str, json: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {json}\n\n"))
}

/// A frame with one varying string: `head` + quoted piece + `tail`. Built once
/// per response so each content chunk costs a single allocation.
pub(crate) struct Template {
    head: String,
    tail: String,
}

impl Template {
    pub(crate) fn new(head: String, tail: String) -> Self {
        Template { head, tail }
    }

    pub(crate) fn render(&self, piece: &str) -> String {
        let mut out = String::with_capacity(self.head.len() + piece.len() + self.tail.len() + 8);
        out.push_str(&self.head);
        push_json_str(&mut out, piece);
        out.push_str(&self.tail);
        out
    }

    /// Like [`Template::render`] with `,"sequence_number":<seq>` after the piece.
    pub(crate) fn render_seq(&self, piece: &str, seq: u64) -> String {
        let mut out = String::with_capacity(self.head.len() + piece.len() + self.tail.len() + 48);
        out.push_str(&self.head);
        push_json_str(&mut out, piece);
        out.push_str(",\"sequence_number\":");
        out.push_str(&seq.to_string());
        out.push_str(&self.tail);
        out
    }
}

/// A stream split where the scripted faults apply: opening frames (role chunk,
/// `message_start`...), one frame per content chunk, closing frames.
#[derive(Default)]
pub(crate) struct Frames {
    pub(crate) pre: Vec<Bytes>,
    pub(crate) content: Vec<Bytes>,
    pub(crate) post: Vec<Bytes>,
}

/// One step of a streamed body.
pub(crate) enum Item {
    Data(Bytes),
    Sleep(Duration),
    /// Return `Pending` once so hyper flushes what it has buffered.
    Flush,
    /// Fail the body: hyper drops the connection without finishing it.
    Fail,
}

/// Lays out a stream's frames according to the plan's pacing and cut.
pub(crate) fn schedule(frames: Frames, plan: &Plan) -> Vec<Item> {
    let mut items = Vec::with_capacity(frames.pre.len() + 2 * frames.content.len() + 8);
    items.extend(frames.pre.into_iter().map(Item::Data));
    if !plan.first_token_delay.is_zero() {
        items.push(Item::Sleep(plan.first_token_delay));
    }
    let content = frames.content.len();
    for (i, frame) in frames.content.into_iter().enumerate() {
        if plan.cut == Some(i) {
            break;
        }
        if plan.stall == Some(i) {
            stall(&mut items);
            return items;
        }
        if plan.malformed == Some(i) {
            items.push(Item::Data(Bytes::from_static(MALFORMED)));
        }
        if !plan.every.is_zero() {
            items.push(Item::Sleep(plan.every));
        }
        items.push(Item::Data(frame));
    }
    if plan.stall.is_some_and(|n| n >= content) {
        stall(&mut items);
    } else if plan.cut.is_some() {
        items.push(Item::Flush);
        items.push(Item::Fail);
    } else if plan.finish_then_cut {
        let keep = frames.post.len().saturating_sub(1);
        items.extend(frames.post.into_iter().take(keep).map(Item::Data));
        items.push(Item::Flush);
        items.push(Item::Fail);
    } else {
        items.extend(frames.post.into_iter().map(Item::Data));
    }
    items
}

/// What a stalled provider's silence lasts: longer than any test waits.
pub(crate) const STALL: Duration = Duration::from_secs(300);

/// A frame whose data is not JSON.
const MALFORMED: &[u8] = b"data: {\"choices\":[{\"delta\":\n\n";

/// Flushes what was written, then goes silent with the connection open.
pub(crate) fn stall(items: &mut Vec<Item>) {
    items.push(Item::Flush);
    items.push(Item::Sleep(STALL));
    items.push(Item::Fail);
}

/// A body that plays `items` in order, writing each data item as its own
/// chunk as soon as it is reached.
pub(crate) fn body(items: Vec<Item>) -> Body {
    let stream = futures_util::stream::unfold(items.into_iter(), |mut items| async move {
        loop {
            match items.next()? {
                Item::Data(bytes) => return Some((Ok(bytes), items)),
                Item::Sleep(d) => tokio::time::sleep(d).await,
                Item::Flush => tokio::task::yield_now().await,
                Item::Fail => {
                    let err = io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "sluice-mock: scripted connection drop",
                    );
                    return Some((Err(err), Vec::new().into_iter()));
                }
            }
        }
    });
    Body::from_stream(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_matches_serde() {
        for s in [
            "plain",
            "quo\"te",
            "back\\slash",
            "nl\nx\r\t",
            "\u{1}ctl",
            "ünï",
        ] {
            assert_eq!(json_str(s), serde_json::to_string(s).unwrap());
        }
    }
}
