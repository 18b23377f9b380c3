//! Which wire a rung speaks for a request, and the dispatch from a wire or an
//! inbound format to its `filters` module: rendering, decoding, encoding.

use sluice_filters::inbound::{
    chat as in_chat, messages as in_messages, responses as in_responses,
};
use sluice_filters::ir::{
    DecodeError, Event, Meta, RefusalReason, Request, Response, StreamDecoder, StreamEncoder, Tail,
};
use sluice_filters::json::Member;
use sluice_filters::policy::{Inbound, Wire};
use sluice_filters::sse::SseDecoder;
use sluice_filters::upstream::{
    anthropic, bedrock, gemini, openai_chat, openai_responses, Rendered,
};
use sluice_filters::{ApiError, Format};

/// The wire a provider's rung speaks for a request in `inbound` format; `None` for
/// a provider the gateway cannot call yet.
pub fn wire_for(provider: &str, model_id: &str, inbound: Inbound) -> Option<Wire> {
    Some(match provider {
        // Vertex hosts Claude behind Anthropic's own body, and Gemini.
        "vertex" if model_id.contains("claude") => Wire::Anthropic,
        "vertex" => Wire::Gemini,
        // OpenAI itself serves both of its wires: a responses client gets the
        // responses API (native: reasoning items and include pass through).
        "openai" if inbound == Inbound::Responses => Wire::OpenAiResponses,
        "openai" | "azure" | "mistral" | "openrouter" | "hosted" | "local" => Wire::OpenAiChat,
        "anthropic" => Wire::Anthropic,
        "google" => Wire::Gemini,
        "bedrock" => Wire::Bedrock,
        _ => return None,
    })
}

/// Whether a rung serves a model of the Anthropic family (extended thinking).
pub fn is_claude(provider: &str, model_id: &str) -> bool {
    provider == "anthropic" || model_id.contains("claude")
}

/// Whether the rung speaks the inbound format itself: the client's body passes
/// through with only the gateway-owned fields changed.
pub fn is_native(provider: &str, wire: Wire, inbound: Inbound) -> bool {
    matches!(
        (inbound, wire, provider),
        (Inbound::Chat, Wire::OpenAiChat, _)
            | (Inbound::Responses, Wire::OpenAiResponses, "openai")
            | (Inbound::Messages, Wire::Anthropic, "anthropic")
    )
}

/// Renders the canonical request for a rung of `wire` served by `provider`.
pub fn render(wire: Wire, provider: &str, req: &Request, model_id: &str, stream: bool) -> Rendered {
    match wire {
        Wire::OpenAiChat => openai_chat::render(req, model_id, stream),
        Wire::OpenAiResponses => openai_responses::render(req, model_id, stream),
        Wire::Anthropic if provider == "vertex" => {
            let mut r = anthropic::render(req, model_id, stream);
            r.body = for_vertex(&r.body);
            r
        }
        Wire::Anthropic => anthropic::render(req, model_id, stream),
        Wire::Gemini => gemini::render(req, model_id, stream),
        Wire::Bedrock => bedrock::render(req, model_id, stream),
    }
}

/// Claude on Vertex: the model is in the URL and the API version in the body.
fn for_vertex(body: &[u8]) -> Vec<u8> {
    const VERSION: &str = "vertex-2023-10-16";
    let Ok(mut o) = serde_json::from_slice::<
        std::collections::BTreeMap<String, Box<serde_json::value::RawValue>>,
    >(body) else {
        return body.to_vec();
    };
    o.remove("model");
    if let Ok(v) = serde_json::value::RawValue::from_string(format!("{VERSION:?}")) {
        o.insert("anthropic_version".into(), v);
    }
    serde_json::to_vec(&o).unwrap_or_else(|_| body.to_vec())
}

/// Decodes a whole answer of `wire`.
pub fn decode(wire: Wire, body: &[u8]) -> Result<Vec<Event>, DecodeError> {
    match wire {
        Wire::OpenAiChat => openai_chat::decode(body),
        Wire::OpenAiResponses => openai_responses::decode(body),
        Wire::Anthropic => anthropic::decode(body),
        Wire::Gemini => gemini::decode(body),
        Wire::Bedrock => bedrock::decode(body),
    }
}

/// Whether an error answer of `wire` is a policy refusal.
pub fn refusal(wire: Wire, status: u16, body: &[u8]) -> Option<RefusalReason> {
    match wire {
        Wire::OpenAiChat => openai_chat::refusal(status, body),
        Wire::OpenAiResponses => openai_responses::refusal(status, body),
        Wire::Anthropic => anthropic::refusal(status, body),
        Wire::Gemini => gemini::refusal(status, body),
        Wire::Bedrock => bedrock::refusal(status, body),
    }
}

/// A stream decoder for `wire`.
pub fn decoder(wire: Wire) -> Box<dyn StreamDecoder> {
    match wire {
        Wire::OpenAiChat => Box::new(openai_chat::Decoder::new()),
        Wire::OpenAiResponses => Box::new(openai_responses::Decoder::new()),
        Wire::Anthropic => Box::new(anthropic::Decoder::new()),
        Wire::Gemini => Box::new(gemini::Decoder::new()),
        Wire::Bedrock => Box::new(bedrock::Decoder::new()),
    }
}

/// Splits upstream stream bytes into frames: SSE events, or AWS event-stream
/// messages for Bedrock.
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

/// The error envelope family of an inbound format.
pub fn format_of(inbound: Inbound) -> Format {
    match inbound {
        Inbound::Messages => Format::Anthropic,
        _ => Format::OpenAi,
    }
}

/// Parses and validates a body in the client's format; `members` is the body
/// already split (the chat format reads those rather than the body again).
pub fn parse(inbound: Inbound, body: &[u8], members: &[Member<'_>]) -> Result<Request, ApiError> {
    match inbound {
        Inbound::Chat => in_chat::parse_members(members),
        Inbound::Responses => in_responses::parse(body),
        Inbound::Messages => in_messages::parse(body),
    }
}

/// Renders a whole answer in the client's format.
pub fn render_answer(inbound: Inbound, resp: &Response, meta: &Meta, tail: &Tail) -> Vec<u8> {
    match inbound {
        Inbound::Chat => in_chat::render(resp, meta, tail),
        Inbound::Responses => in_responses::render(resp, meta, tail),
        Inbound::Messages => in_messages::render(resp, meta, tail),
    }
}

/// A stream encoder in the client's format.
pub fn encoder(inbound: Inbound, meta: Meta) -> Box<dyn StreamEncoder> {
    match inbound {
        Inbound::Chat => Box::new(in_chat::Encoder::new(meta)),
        Inbound::Responses => Box::new(in_responses::Encoder::new(meta)),
        Inbound::Messages => Box::new(in_messages::Encoder::new(meta)),
    }
}

/// The in-band error event that ends a stream whose header already went out.
pub fn error_frame(inbound: Inbound, err: &ApiError) -> Vec<u8> {
    match inbound {
        Inbound::Chat => in_chat::error_frame(err),
        Inbound::Responses => in_responses::error_frame(err),
        Inbound::Messages => in_messages::error_frame(err),
    }
}
