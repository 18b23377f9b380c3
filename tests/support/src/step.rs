//! Scripted behaviours: the public [`Step`] enum, its JSON form for the control
//! API, and how one step turns into a concrete reply plan for one request.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What the mock does with one request for a model.
///
/// Steps are queued per model with [`crate::Mock::script`] and consumed one per
/// request; [`crate::Mock::set_default`] sets the behaviour used when the queue
/// is empty (otherwise [`Step::Ok`]).
///
/// JSON form (control API): an object tagged by `kind`, durations in
/// milliseconds, e.g. `{"kind":"status","status":500}`,
/// `{"kind":"slow_chunks","n":5,"every_ms":20}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "StepSpec", into = "StepSpec")]
pub enum Step {
    /// Normal answer. JSON `{"kind":"ok"}`.
    Ok,
    /// Answer with this text (split into the default number of stream chunks).
    /// JSON `{"kind":"text","text":"..."}`.
    Text(String),
    /// Error response with this status in the format's own envelope; 429 also
    /// carries `retry-after: 1`. JSON `{"kind":"status","status":500}`.
    Status(u16),
    /// Sleep before sending the response headers, then answer normally.
    /// JSON `{"kind":"delay_headers","ms":250}`.
    DelayHeaders(Duration),
    /// Streams: headers and the opening frames (role chunk, `message_start`...)
    /// go out at once, then a pause before the first content chunk.
    /// Non-streaming requests: same as [`Step::DelayHeaders`].
    /// JSON `{"kind":"delay_first_token","ms":250}`.
    DelayFirstToken(Duration),
    /// Streams: send the opening frames and `n` content chunks, then drop the
    /// connection with no finish frame and no `[DONE]` (`0` = right after the
    /// opening frames). Non-streaming: 200 headers and (if `n > 0`) half the
    /// JSON body, then the connection drops. JSON `{"kind":"cut_after","n":2}`.
    CutAfter(usize),
    /// Streams: 200 headers, then one in-band error event before any content,
    /// then the stream ends. Non-streaming: a 500 error.
    /// JSON `{"kind":"error_event"}`.
    ErrorEvent,
    /// A normal finish with no content (empty text), with usage.
    /// JSON `{"kind":"empty"}`.
    Empty,
    /// The output budget ran out before any visible content (a reasoning model
    /// spent it thinking): no text, output tokens reported, and the wire's
    /// token-limit finish (`length`, `max_tokens`, `MAX_TOKENS`, responses
    /// `incomplete`). JSON `{"kind":"exhausted"}`.
    Exhausted,
    /// Streams: the whole answer including the frame that carries the finish,
    /// then the connection drops before the stream's last frame (`[DONE]`,
    /// `message_stop`, ...). Non-streaming: a normal answer.
    /// JSON `{"kind":"finish_then_cut"}`.
    FinishThenCut,
    /// A refusal: OpenAI `refusal` field / refusal deltas, Anthropic
    /// `stop_reason: "refusal"`, Gemini `finishReason: "SAFETY"`.
    /// JSON `{"kind":"refusal","text":"I can't help with that."}`.
    Refusal(String),
    /// A tool call, if the request declares tools (otherwise a normal answer).
    /// `arguments` is a JSON text. JSON form
    /// `{"kind":"tool_call","name":"get_weather","arguments":{"city":"Paris"}}`
    /// (`arguments` may also be given as a string).
    ToolCall { name: String, arguments: String },
    /// Normal answer in `n` stream chunks. JSON `{"kind":"chunks","n":50}`.
    Chunks(usize),
    /// Normal answer in `n` stream chunks with a pause before each chunk.
    /// JSON `{"kind":"slow_chunks","n":5,"every_ms":20}`.
    SlowChunks { n: usize, every: Duration },
    /// Read the request, then drop the connection without sending a byte.
    /// JSON `{"kind":"close_connection"}`.
    CloseConnection,
    /// Embedding requests: vectors of this many dimensions when the request
    /// does not ask for `dimensions` itself; other requests: normal answer.
    /// JSON `{"kind":"embeddings","dims":1536}`.
    Embeddings { dims: usize },
    /// An answer with this status and this body, sent verbatim: JSON (a provider's
    /// own error envelope: a policy 400, a context-length 400, a 429 without
    /// `retry-after`; or a whole answer of a shape the mock does not build), or a
    /// stream when the body starts with `event:` or `data:`; `retry-after` only
    /// when given.
    /// JSON `{"kind":"reply","status":400,"body":{...},"retry_after":"2"}`.
    Reply {
        status: u16,
        body: String,
        retry_after: Option<String>,
    },
    /// As [`Step::Reply`] without `retry-after`, the body written `piece` bytes at
    /// a time (chunked, a flush after each write; the last write may be shorter),
    /// so the gateway reads it in pieces that split lines, frames and UTF-8
    /// characters, as a slow network delivers a provider's answer.
    /// JSON `{"kind":"reply_in_pieces","status":200,"body":"data: {...}\n\n","piece":5}`.
    ReplyInPieces {
        status: u16,
        body: String,
        piece: usize,
    },
    /// Streams: the opening frames and `n` content chunks, then silence with the
    /// connection held open (a stalled provider). Non-streaming: 200 headers and
    /// half the body, then silence. JSON `{"kind":"stall_after","n":2}`.
    StallAfter(usize),
    /// Streams: after `n` content chunks one frame whose data is not JSON, then
    /// the rest of the stream as usual. Non-streaming: a 200 whose body is not
    /// JSON. JSON `{"kind":"malformed_after","n":1}`.
    MalformedAfter(usize),
    /// Non-streaming: the normal answer pretty-printed (as OpenAI sends it);
    /// streams: a normal answer. JSON `{"kind":"pretty"}`.
    Pretty,
    /// A call of tool `name` only if the request declares a tool of that name
    /// (in any wire's tools); otherwise the text `sluice-mock: no tool named
    /// <name> was declared`, so a test sees which tools reached the model.
    /// JSON `{"kind":"call_if_declared","name":"tool_search","arguments":{"query":"x"}}`.
    CallIfDeclared { name: String, arguments: String },
}

/// Serde form of [`Step`].
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum StepSpec {
    Ok,
    Text {
        text: String,
    },
    Status {
        status: u16,
    },
    DelayHeaders {
        ms: u64,
    },
    DelayFirstToken {
        ms: u64,
    },
    CutAfter {
        n: usize,
    },
    ErrorEvent,
    Empty,
    Exhausted,
    FinishThenCut,
    Refusal {
        text: String,
    },
    ToolCall {
        name: String,
        arguments: Value,
    },
    Chunks {
        n: usize,
    },
    SlowChunks {
        n: usize,
        every_ms: u64,
    },
    CloseConnection,
    Embeddings {
        dims: usize,
    },
    Reply {
        status: u16,
        body: Value,
        #[serde(default)]
        retry_after: Option<String>,
    },
    ReplyInPieces {
        status: u16,
        body: Value,
        piece: usize,
    },
    StallAfter {
        n: usize,
    },
    MalformedAfter {
        n: usize,
    },
    Pretty,
    CallIfDeclared {
        name: String,
        arguments: Value,
    },
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Step {
    /// A 200 answering with `body` verbatim (a whole answer, or SSE frames).
    pub fn ok_reply(body: impl ToString) -> Step {
        Step::Reply {
            status: 200,
            body: body.to_string(),
            retry_after: None,
        }
    }
}

impl From<StepSpec> for Step {
    fn from(spec: StepSpec) -> Self {
        match spec {
            StepSpec::Ok => Step::Ok,
            StepSpec::Text { text } => Step::Text(text),
            StepSpec::Status { status } => Step::Status(status),
            StepSpec::DelayHeaders { ms } => Step::DelayHeaders(Duration::from_millis(ms)),
            StepSpec::DelayFirstToken { ms } => Step::DelayFirstToken(Duration::from_millis(ms)),
            StepSpec::CutAfter { n } => Step::CutAfter(n),
            StepSpec::ErrorEvent => Step::ErrorEvent,
            StepSpec::Empty => Step::Empty,
            StepSpec::Exhausted => Step::Exhausted,
            StepSpec::FinishThenCut => Step::FinishThenCut,
            StepSpec::Refusal { text } => Step::Refusal(text),
            StepSpec::ToolCall { name, arguments } => Step::ToolCall {
                name,
                arguments: match arguments {
                    Value::String(s) => s,
                    other => other.to_string(),
                },
            },
            StepSpec::Chunks { n } => Step::Chunks(n),
            StepSpec::SlowChunks { n, every_ms } => Step::SlowChunks {
                n,
                every: Duration::from_millis(every_ms),
            },
            StepSpec::CloseConnection => Step::CloseConnection,
            StepSpec::Embeddings { dims } => Step::Embeddings { dims },
            StepSpec::Reply {
                status,
                body,
                retry_after,
            } => Step::Reply {
                status,
                body: match body {
                    Value::String(s) => s,
                    other => other.to_string(),
                },
                retry_after,
            },
            StepSpec::ReplyInPieces {
                status,
                body,
                piece,
            } => Step::ReplyInPieces {
                status,
                body: match body {
                    Value::String(s) => s,
                    other => other.to_string(),
                },
                piece,
            },
            StepSpec::StallAfter { n } => Step::StallAfter(n),
            StepSpec::MalformedAfter { n } => Step::MalformedAfter(n),
            StepSpec::Pretty => Step::Pretty,
            StepSpec::CallIfDeclared { name, arguments } => Step::CallIfDeclared {
                name,
                arguments: match arguments {
                    Value::String(s) => s,
                    other => other.to_string(),
                },
            },
        }
    }
}

impl From<Step> for StepSpec {
    fn from(step: Step) -> Self {
        match step {
            Step::Ok => StepSpec::Ok,
            Step::Text(text) => StepSpec::Text { text },
            Step::Status(status) => StepSpec::Status { status },
            Step::DelayHeaders(d) => StepSpec::DelayHeaders { ms: millis(d) },
            Step::DelayFirstToken(d) => StepSpec::DelayFirstToken { ms: millis(d) },
            Step::CutAfter(n) => StepSpec::CutAfter { n },
            Step::ErrorEvent => StepSpec::ErrorEvent,
            Step::Empty => StepSpec::Empty,
            Step::Exhausted => StepSpec::Exhausted,
            Step::FinishThenCut => StepSpec::FinishThenCut,
            Step::Refusal(text) => StepSpec::Refusal { text },
            Step::ToolCall { name, arguments } => StepSpec::ToolCall {
                name,
                arguments: Value::String(arguments),
            },
            Step::Chunks(n) => StepSpec::Chunks { n },
            Step::SlowChunks { n, every } => StepSpec::SlowChunks {
                n,
                every_ms: millis(every),
            },
            Step::CloseConnection => StepSpec::CloseConnection,
            Step::Embeddings { dims } => StepSpec::Embeddings { dims },
            Step::Reply {
                status,
                body,
                retry_after,
            } => StepSpec::Reply {
                status,
                body: Value::String(body),
                retry_after,
            },
            Step::ReplyInPieces {
                status,
                body,
                piece,
            } => StepSpec::ReplyInPieces {
                status,
                body: Value::String(body),
                piece,
            },
            Step::StallAfter(n) => StepSpec::StallAfter { n },
            Step::MalformedAfter(n) => StepSpec::MalformedAfter { n },
            Step::Pretty => StepSpec::Pretty,
            Step::CallIfDeclared { name, arguments } => StepSpec::CallIfDeclared {
                name,
                arguments: Value::String(arguments),
            },
        }
    }
}

/// Answer text cut into stream chunks: one string plus the end offset of each
/// chunk, so a 50-chunk answer costs two allocations.
#[derive(Debug)]
pub(crate) struct Pieces {
    text: String,
    ends: Vec<usize>,
}

/// Filler appended to the default answer when more than five chunks are asked.
const FILLER: [&str; 9] = [
    " The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog.",
];

impl Pieces {
    pub(crate) fn empty() -> Self {
        Pieces {
            text: String::new(),
            ends: Vec::new(),
        }
    }

    /// The default answer `Hello from mock <model>.` in `n` chunks
    /// (`Hello`, ` from`, ` mock`, ` <model>`, `.`, then filler words; fewer
    /// than five chunks merge the tail into the last one).
    pub(crate) fn default_answer(model: &str, n: usize) -> Self {
        if n == 0 {
            return Self::empty();
        }
        let total = n.max(5);
        let mut text = String::with_capacity(20 + model.len() + 6 * (total - 5));
        let mut ends = Vec::with_capacity(n);
        for i in 0..total {
            match i {
                0 => text.push_str("Hello"),
                1 => text.push_str(" from"),
                2 => text.push_str(" mock"),
                3 => {
                    text.push(' ');
                    text.push_str(model);
                }
                4 => text.push('.'),
                _ => text.push_str(FILLER[(i - 5) % FILLER.len()]),
            }
            if i + 1 < n || i + 1 == total {
                ends.push(text.len());
            }
        }
        Pieces { text, ends }
    }

    /// `text` split at character boundaries into at most `n` (at least one)
    /// chunks of roughly equal length.
    pub(crate) fn split(text: String, n: usize) -> Self {
        let chars = text.chars().count();
        if chars == 0 {
            return Self::empty();
        }
        let k = n.clamp(1, chars);
        let mut ends = Vec::with_capacity(k);
        let mut next = 1;
        for (count, (at, c)) in text.char_indices().enumerate() {
            if count + 1 == next * chars / k {
                ends.push(at + c.len_utf8());
                next += 1;
            }
        }
        Pieces { text, ends }
    }

    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let piece = &self.text[start..end];
            start = end;
            piece
        })
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Completion tokens reported for this text: ceil(bytes / 4), 0 if empty.
    pub(crate) fn tokens(&self) -> u64 {
        self.text.len().div_ceil(4) as u64
    }
}

/// Output tokens an exhausted answer reports (all of them reasoning).
pub(crate) const EXHAUSTED_TOKENS: u64 = 16;

/// What an answer contains.
#[derive(Debug)]
pub(crate) enum Content {
    Text(Pieces),
    /// No visible output (always empty pieces): the budget went on hidden
    /// reasoning.
    Exhausted(Pieces),
    Refusal(Pieces),
    ToolCall {
        name: String,
        arguments: Pieces,
    },
}

impl Content {
    pub(crate) fn tokens(&self) -> u64 {
        match self {
            Content::Text(p) | Content::Refusal(p) => p.tokens(),
            Content::Exhausted(_) => EXHAUSTED_TOKENS,
            Content::ToolCall { arguments, .. } => arguments.tokens().max(1),
        }
    }
}

/// A successful (200) answer and how to pace it.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) header_delay: Duration,
    pub(crate) first_token_delay: Duration,
    pub(crate) every: Duration,
    pub(crate) content: Content,
    pub(crate) cut: Option<usize>,
    /// Drop the connection right before the stream's last frame.
    pub(crate) finish_then_cut: bool,
    pub(crate) error_event: bool,
    /// Go silent (connection open) after this many content chunks.
    pub(crate) stall: Option<usize>,
    /// Send a frame that is not JSON after this many content chunks.
    pub(crate) malformed: Option<usize>,
    /// Pretty-print a whole answer.
    pub(crate) pretty: bool,
}

/// A scripted step that replaces the answer.
#[derive(Debug)]
pub(crate) enum Failure {
    /// An error response with this status.
    Status(u16),
    /// This status and body verbatim, with `retry-after` when given; with
    /// `piece`, the body written that many bytes at a time.
    Reply {
        status: u16,
        body: String,
        retry_after: Option<String>,
        piece: Option<usize>,
    },
    /// Drop the connection without a response.
    Close,
}

impl Failure {
    /// A [`Step::Reply`] or [`Step::ReplyInPieces`] as the reply it sends.
    pub(crate) fn reply(step: Step) -> Failure {
        match step {
            Step::Reply {
                status,
                body,
                retry_after,
            } => Failure::Reply {
                status,
                body,
                retry_after,
                piece: None,
            },
            Step::ReplyInPieces {
                status,
                body,
                piece,
            } => Failure::Reply {
                status,
                body,
                retry_after: None,
                piece: Some(piece),
            },
            other => unreachable!("not a reply step: {other:?}"),
        }
    }
}

/// A [`Step::CallIfDeclared`] as the step it is for this request: the call when
/// the request declares the tool, else a text saying it did not.
pub(crate) fn declared(step: Step, tools: &[String]) -> Step {
    match step {
        Step::CallIfDeclared { name, arguments } if tools.contains(&name) => {
            Step::ToolCall { name, arguments }
        }
        Step::CallIfDeclared { name, .. } => {
            Step::Text(format!("sluice-mock: no tool named {name} was declared"))
        }
        other => other,
    }
}

/// Turns a step into the plan for a generation request, or the failure that
/// replaces the answer.
pub(crate) fn resolve(
    step: Step,
    model: &str,
    has_tools: bool,
    chunks: usize,
) -> Result<Plan, Failure> {
    let mut plan = Plan {
        header_delay: Duration::ZERO,
        first_token_delay: Duration::ZERO,
        every: Duration::ZERO,
        content: Content::Text(Pieces::empty()),
        cut: None,
        finish_then_cut: false,
        error_event: false,
        stall: None,
        malformed: None,
        pretty: false,
    };
    let mut answer_chunks = chunks;
    let mut content = None;
    match step {
        Step::Status(code) => return Err(Failure::Status(code)),
        Step::CloseConnection => return Err(Failure::Close),
        reply @ (Step::Reply { .. } | Step::ReplyInPieces { .. }) => {
            return Err(Failure::reply(reply))
        }
        Step::StallAfter(n) => plan.stall = Some(n),
        Step::MalformedAfter(n) => plan.malformed = Some(n),
        Step::Pretty => plan.pretty = true,
        Step::Ok | Step::Embeddings { .. } => {}
        Step::Text(text) => content = Some(Content::Text(Pieces::split(text, chunks))),
        Step::DelayHeaders(d) => plan.header_delay = d,
        Step::DelayFirstToken(d) => plan.first_token_delay = d,
        Step::CutAfter(n) => plan.cut = Some(n),
        Step::ErrorEvent => plan.error_event = true,
        Step::Empty => content = Some(Content::Text(Pieces::empty())),
        Step::Exhausted => content = Some(Content::Exhausted(Pieces::empty())),
        Step::FinishThenCut => plan.finish_then_cut = true,
        Step::Refusal(text) => content = Some(Content::Refusal(Pieces::split(text, chunks))),
        Step::ToolCall { name, arguments } => {
            if has_tools {
                content = Some(Content::ToolCall {
                    name,
                    arguments: Pieces::split(arguments, chunks),
                });
            }
        }
        Step::Chunks(n) => answer_chunks = n,
        // Read by `declared` before a step is resolved.
        Step::CallIfDeclared { name, arguments } => {
            content = Some(Content::ToolCall {
                name,
                arguments: Pieces::split(arguments, chunks),
            });
        }
        Step::SlowChunks { n, every } => {
            answer_chunks = n;
            plan.every = every;
        }
    }
    plan.content =
        content.unwrap_or_else(|| Content::Text(Pieces::default_answer(model, answer_chunks)));
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(p: &Pieces) -> Vec<&str> {
        p.iter().collect()
    }

    #[test]
    fn default_answer_chunks() {
        let p = Pieces::default_answer("m", 5);
        assert_eq!(collect(&p), ["Hello", " from", " mock", " m", "."]);
        let p = Pieces::default_answer("m", 2);
        assert_eq!(collect(&p), ["Hello", " from mock m."]);
        let p = Pieces::default_answer("m", 7);
        assert_eq!(p.len(), 7);
        assert_eq!(p.text(), "Hello from mock m. The quick");
        assert!(Pieces::default_answer("m", 0).is_empty());
        assert_eq!(Pieces::default_answer("m", 50).len(), 50);
    }

    #[test]
    fn split_is_even_and_lossless() {
        let p = Pieces::split("héllo wörld".to_owned(), 4);
        assert_eq!(p.len(), 4);
        assert_eq!(collect(&p).concat(), "héllo wörld");
        let p = Pieces::split("ab".to_owned(), 5);
        assert_eq!(collect(&p), ["a", "b"]);
        assert!(Pieces::split(String::new(), 3).is_empty());
    }

    #[test]
    fn step_json_round_trip() {
        let steps = vec![
            Step::Ok,
            Step::Text("hi".into()),
            Step::Status(429),
            Step::DelayHeaders(Duration::from_millis(5)),
            Step::DelayFirstToken(Duration::from_millis(6)),
            Step::CutAfter(2),
            Step::ErrorEvent,
            Step::Empty,
            Step::Refusal("no".into()),
            Step::ToolCall {
                name: "f".into(),
                arguments: "{\"a\":1}".into(),
            },
            Step::Chunks(50),
            Step::SlowChunks {
                n: 3,
                every: Duration::from_millis(7),
            },
            Step::CloseConnection,
            Step::Embeddings { dims: 16 },
            Step::Reply {
                status: 400,
                body: r#"{"error":{"code":"x"}}"#.into(),
                retry_after: Some("2".into()),
            },
            Step::ReplyInPieces {
                status: 200,
                body: "data: {\"x\":1}\n\n".into(),
                piece: 5,
            },
            Step::StallAfter(2),
            Step::MalformedAfter(1),
            Step::Pretty,
            Step::CallIfDeclared {
                name: "tool_search".into(),
                arguments: "{\"query\":\"x\"}".into(),
            },
        ];
        let json = serde_json::to_string(&steps).unwrap();
        let back: Vec<Step> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, steps);
        let s: Step = serde_json::from_str(r#"{"kind":"status","status":500}"#).unwrap();
        assert_eq!(s, Step::Status(500));
        let s: Step =
            serde_json::from_str(r#"{"kind":"tool_call","name":"f","arguments":{"x":1}}"#).unwrap();
        assert_eq!(
            s,
            Step::ToolCall {
                name: "f".into(),
                arguments: "{\"x\":1}".into()
            }
        );
    }
}
