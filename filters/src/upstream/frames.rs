//! Splitting a rung's stream bytes into frames: SSE events for most wires, AWS
//! event-stream messages for Bedrock.

use super::{bedrock, Wire};
use crate::ir::DecodeError;
use crate::sse::SseDecoder;

/// Splits upstream stream bytes into frames.
pub enum Framer {
    Sse(SseDecoder),
    Aws(bedrock::FrameDecoder),
}

/// One upstream frame: its name (SSE `event:` or `:event-type`) and data.
pub struct Frame {
    pub name: Option<String>,
    pub data: Vec<u8>,
}

impl Framer {
    pub fn new(wire: Wire) -> Framer {
        match wire {
            Wire::Bedrock => Framer::Aws(bedrock::FrameDecoder::new()),
            _ => Framer::Sse(SseDecoder::new()),
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        match self {
            Framer::Sse(d) => d.push(bytes),
            Framer::Aws(d) => d.push(bytes),
        }
    }

    /// The next complete frame; comments and keep-alives are skipped.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Option<Result<Frame, DecodeError>> {
        match self {
            Framer::Sse(d) => loop {
                let Some(ev) = d.next_event() else {
                    // An event that never ends is not buffered past the cap.
                    return d
                        .too_large()
                        .then(|| Err(DecodeError("an event past the size cap".into())));
                };
                if ev.data.is_empty() {
                    continue;
                }
                return Some(Ok(Frame {
                    name: ev.event,
                    data: ev.data.into_bytes(),
                }));
            },
            Framer::Aws(d) => Some(d.next_frame()?.map(|f| Frame {
                // Exception frames are named by their exception type.
                name: Some(f.event_type),
                data: f.payload,
            })),
        }
    }
}
