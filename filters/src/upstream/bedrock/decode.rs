//! Decoding: a Converse answer and its stream events into the canonical form.

use super::*;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Answer<'a> {
    #[serde(default, borrow)]
    pub(super) output: Option<Output<'a>>,
    #[serde(default)]
    pub(super) stop_reason: Option<String>,
    #[serde(default)]
    pub(super) additional_model_response_fields: Option<ResponseFields>,
    #[serde(default)]
    pub(super) usage: Option<WireUsage>,
}

#[derive(Deserialize)]
pub(super) struct Output<'a> {
    #[serde(default, borrow)]
    pub(super) message: Option<OutMessage<'a>>,
}

#[derive(Deserialize)]
pub(super) struct OutMessage<'a> {
    #[serde(default, borrow)]
    pub(super) content: Vec<OutBlock<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct OutBlock<'a> {
    #[serde(default, borrow)]
    pub(super) text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) tool_use: Option<OutToolUse<'a>>,
    #[serde(default)]
    pub(super) reasoning_content: Option<OutReasoning>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct OutToolUse<'a> {
    pub(super) tool_use_id: String,
    pub(super) name: String,
    #[serde(default, borrow)]
    pub(super) input: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct OutReasoning {
    #[serde(default)]
    pub(super) reasoning_text: Option<ReasoningText>,
    #[serde(default)]
    pub(super) redacted_content: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct ReasoningText {
    #[serde(default)]
    pub(super) text: String,
    #[serde(default)]
    pub(super) signature: Option<String>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "camelCase")]
pub(super) struct WireUsage {
    #[serde(default)]
    pub(super) input_tokens: u64,
    #[serde(default)]
    pub(super) output_tokens: u64,
    #[serde(default)]
    pub(super) cache_read_input_tokens: u64,
    #[serde(default)]
    pub(super) cache_write_input_tokens: u64,
}

impl WireUsage {
    pub(super) fn usage(self) -> Usage {
        Usage {
            // Provider-supplied counts: saturate rather than wrap.
            input_tokens: self
                .input_tokens
                .saturating_add(self.cache_read_input_tokens)
                .saturating_add(self.cache_write_input_tokens),
            cached_tokens: self.cache_read_input_tokens,
            cache_write_tokens: self.cache_write_input_tokens,
            output_tokens: self.output_tokens,
            reasoning_tokens: 0,
            cache_write_1h_tokens: 0,
            web_search_requests: 0,
            cost_micro_usd: None,
        }
    }
}

// Stream event payloads (each carries a `p` padding member, ignored).

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct BlockStart {
    #[serde(default)]
    pub(super) content_block_index: u32,
    #[serde(default)]
    pub(super) start: Option<StartKind>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct StartKind {
    #[serde(default)]
    pub(super) tool_use: Option<ToolUseStart>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ToolUseStart {
    pub(super) tool_use_id: String,
    pub(super) name: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct BlockStop {
    #[serde(default)]
    pub(super) content_block_index: u32,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct BlockDelta<'a> {
    #[serde(default)]
    pub(super) content_block_index: u32,
    #[serde(borrow)]
    pub(super) delta: Delta<'a>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Delta<'a> {
    #[serde(default, borrow)]
    pub(super) text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) tool_use: Option<ToolUseDelta<'a>>,
    #[serde(default)]
    pub(super) reasoning_content: Option<ReasoningDelta>,
}

#[derive(Deserialize)]
pub(super) struct ToolUseDelta<'a> {
    #[serde(default, borrow)]
    pub(super) input: Cow<'a, str>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ReasoningDelta {
    #[serde(default)]
    pub(super) text: Option<String>,
    #[serde(default)]
    pub(super) signature: Option<String>,
    #[serde(default)]
    pub(super) redacted_content: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct MessageStop {
    #[serde(default)]
    pub(super) stop_reason: String,
    #[serde(default)]
    pub(super) additional_model_response_fields: Option<ResponseFields>,
}

/// The model's own answer fields we asked for (`/stop_sequence` on Claude).
#[derive(Deserialize)]
pub(super) struct ResponseFields {
    #[serde(default)]
    pub(super) stop_sequence: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct Metadata {
    #[serde(default)]
    pub(super) usage: Option<WireUsage>,
}

#[derive(Deserialize)]
pub(super) struct ErrorPayload {
    #[serde(default, alias = "Message")]
    pub(super) message: Option<String>,
}

/// A stateful reader of Converse answers: stream events, or one whole answer.
#[derive(Default)]
pub struct Decoder {
    pub(super) started: bool,
    /// The next tool call's index.
    pub(super) calls: u32,
    /// Content block index to tool-call index, for the open tool blocks, and
    /// whether input arrived (a call without arguments streams none: `{}`).
    pub(super) blocks: Vec<(u32, u32, bool)>,
    /// Text or a tool call was emitted.
    pub(super) content: bool,
    pub(super) done: bool,
}

pub(super) fn parse<'a, T: Deserialize<'a>>(what: &str, data: &'a [u8]) -> Result<T, DecodeError> {
    serde_json::from_slice(data).map_err(|e| DecodeError(format!("bedrock {what}: {e}")))
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub(super) fn start(&mut self, out: &mut Vec<Event>) {
        if !std::mem::replace(&mut self.started, true) {
            // Converse reports neither an answer id nor a model id.
            out.push(Event::Start {
                id: None,
                model: None,
            });
        }
    }

    pub(super) fn text(&mut self, text: &str, out: &mut Vec<Event>) {
        if !text.is_empty() {
            self.content = true;
            out.push(Event::Text {
                text: text.to_string(),
            });
        }
    }

    pub(super) fn tool_start(
        &mut self,
        block: u32,
        id: String,
        name: String,
        out: &mut Vec<Event>,
    ) -> u32 {
        let index = self.calls;
        self.calls += 1;
        self.content = true;
        self.blocks.push((block, index, false));
        out.push(Event::ToolCallStart { index, id, name });
        index
    }

    pub(super) fn reasoning(&mut self, r: ReasoningDelta, out: &mut Vec<Event>) {
        if let Some(text) = r.text.filter(|t| !t.is_empty()) {
            out.push(Event::Thinking { text });
        }
        if let Some(signature) = r.signature {
            out.push(Event::ThinkingSignature { signature });
        }
        if let Some(data) = r.redacted_content {
            out.push(Event::EncryptedReasoning { data, id: None });
        }
    }

    pub(super) fn finish(
        &mut self,
        reason: String,
        fields: Option<ResponseFields>,
        out: &mut Vec<Event>,
    ) {
        let canonical = match reason.as_str() {
            "end_turn" => FinishReason::Stop,
            "tool_use" => FinishReason::ToolCalls,
            "max_tokens" | "model_context_window_exceeded" => FinishReason::Length,
            "stop_sequence" => FinishReason::StopSequence,
            "guardrail_intervened" | "content_filtered" => {
                if !self.content {
                    out.push(Event::Refusal {
                        reason: RefusalReason::ContentPolicy,
                        text: None,
                    });
                }
                FinishReason::ContentFilter
            }
            "malformed_model_output" | "malformed_tool_use" => {
                out.push(Event::Error {
                    message: format!("Bedrock ended the answer with {reason}"),
                });
                return;
            }
            _ => FinishReason::Stop,
        };
        out.push(Event::Finish {
            reason: canonical,
            raw: Some(reason),
            stop_sequence: fields.and_then(|f| f.stop_sequence),
        });
    }

    pub(super) fn whole(&mut self, a: Answer<'_>, out: &mut Vec<Event>) {
        self.start(out);
        let blocks = a.output.and_then(|o| o.message).map(|m| m.content);
        for (i, b) in blocks.into_iter().flatten().enumerate() {
            if let Some(t) = b.text {
                self.text(&t, out);
            }
            if let Some(t) = b.tool_use {
                let block = u32::try_from(i).unwrap_or(u32::MAX);
                let index = self.tool_start(block, t.tool_use_id, t.name, out);
                let arguments = t.input.map_or("{}", RawValue::get).to_string();
                out.push(Event::ToolCallArgs { index, arguments });
            }
            if let Some(r) = b.reasoning_content {
                let (text, signature) = match r.reasoning_text {
                    Some(t) => (Some(t.text), t.signature),
                    None => (None, None),
                };
                self.reasoning(
                    ReasoningDelta {
                        text,
                        signature,
                        redacted_content: r.redacted_content,
                    },
                    out,
                );
            }
        }
        if let Some(reason) = a.stop_reason {
            self.finish(reason, a.additional_model_response_fields, out);
        }
        if let Some(u) = a.usage {
            out.push(Event::Usage(u.usage()));
        }
        self.done = true;
    }

    pub(super) fn delta(&mut self, d: BlockDelta<'_>, out: &mut Vec<Event>) {
        let BlockDelta {
            content_block_index: block,
            delta,
        } = d;
        if let Some(t) = delta.text {
            self.text(&t, out);
        }
        if let Some(t) = delta.tool_use {
            let index = match self.blocks.iter().rev().find(|(b, ..)| *b == block) {
                Some(&(_, index, _)) => index,
                // Input before its start: open the call nameless rather than lose it.
                None => self.tool_start(block, String::new(), String::new(), out),
            };
            if !t.input.is_empty() {
                if let Some(open) = self.blocks.iter_mut().rev().find(|(b, ..)| *b == block) {
                    open.2 = true;
                }
                out.push(Event::ToolCallArgs {
                    index,
                    arguments: t.input.into_owned(),
                });
            }
        }
        if let Some(r) = delta.reasoning_content {
            self.reasoning(r, out);
        }
    }
}

impl StreamDecoder for Decoder {
    fn frame(
        &mut self,
        name: Option<&str>,
        data: &[u8],
        out: &mut Vec<Event>,
    ) -> Result<(), DecodeError> {
        let name = name.ok_or_else(|| DecodeError("bedrock frame without a type".into()))?;
        match name {
            "messageStart" => self.start(out),
            "contentBlockStart" => {
                let s: BlockStart = parse(name, data)?;
                self.start(out);
                if let Some(t) = s.start.and_then(|k| k.tool_use) {
                    self.tool_start(s.content_block_index, t.tool_use_id, t.name, out);
                }
            }
            "contentBlockDelta" => {
                let d: BlockDelta = parse(name, data)?;
                self.start(out);
                self.delta(d, out);
            }
            "contentBlockStop" => {
                let s: BlockStop = parse(name, data)?;
                let at = s.content_block_index;
                if let Some(open) = self.blocks.iter_mut().rev().find(|(b, ..)| *b == at) {
                    if !open.2 {
                        open.2 = true;
                        out.push(Event::ToolCallArgs {
                            index: open.1,
                            arguments: "{}".into(),
                        });
                    }
                }
            }
            "messageStop" => {
                let s: MessageStop = parse(name, data)?;
                self.start(out);
                self.finish(s.stop_reason, s.additional_model_response_fields, out);
            }
            "metadata" => {
                let m: Metadata = parse(name, data)?;
                if let Some(u) = m.usage {
                    out.push(Event::Usage(u.usage()));
                }
                self.done = true;
            }
            exception if exception.ends_with("Exception") => {
                let p: ErrorPayload =
                    serde_json::from_slice(data).unwrap_or(ErrorPayload { message: None });
                let detail = p.message.map(|m| format!(": {m}")).unwrap_or_default();
                out.push(Event::Error {
                    message: format!("{exception}{detail}"),
                });
            }
            // Event kinds added later are not ours to fail on.
            _ => {}
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.done
    }
}

/// A whole ConverseResponse as the events its stream would give.
pub fn decode(body: &[u8]) -> Result<Vec<Event>, DecodeError> {
    let a: Answer = parse("answer", body)?;
    let mut out = Vec::new();
    Decoder::new().whole(a, &mut out);
    Ok(out)
}

/// Whether an error answer is a policy refusal: Bedrock answers a blocked output
/// with a 4xx whose message names the content filtering policy.
pub fn refusal(status: u16, body: &[u8]) -> Option<RefusalReason> {
    if !(400..500).contains(&status) {
        return None;
    }
    let p: ErrorPayload = serde_json::from_slice(body).ok()?;
    let msg = p.message?.to_ascii_lowercase();
    let filtered = msg.contains("content filtering policy")
        || (msg.contains("blocked") && msg.contains("guardrail"));
    filtered.then_some(RefusalReason::ContentPolicy)
}
