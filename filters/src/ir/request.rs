//! The canonical request.

use super::search::{ToolSearch, WebSearch};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Who speaks a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions from the caller (chat `system`/`developer`, responses
    /// `instructions`, messages `system`).
    System,
    User,
    Assistant,
    /// A turn that only carries tool results (chat `tool`; messages user turns of
    /// `tool_result` blocks map here too).
    Tool,
}

/// One piece of a turn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    Text {
        text: String,
    },
    /// An image: `url` is an `https:` URL or a `data:<media type>;base64,...` URL.
    Image {
        url: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// A document (PDF and the like), as a data URL or an https URL.
    Document {
        url: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    /// A call the assistant made. `arguments` is the JSON text of the arguments.
    ToolCall {
        id: String,
        name: String,
        arguments: String,
    },
    /// The result of a call, sent back by the caller.
    ToolResult {
        call_id: String,
        /// Text and image parts of the result.
        content: Vec<Part>,
        #[serde(default)]
        is_error: bool,
    },
    /// Visible reasoning (Anthropic `thinking`, Gemini thoughts, OpenAI reasoning
    /// summaries), with the provider's signature when it gave one.
    Thinking {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// Hidden reasoning carried opaquely: Anthropic `redacted_thinking.data`
    /// (`id: None`) or an OpenAI reasoning item's `encrypted_content` (`id: Some`,
    /// maybe empty). Only a rung of the maker that produced it can take it back.
    EncryptedReasoning {
        data: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
    },
}

impl Part {
    pub fn text(text: impl Into<String>) -> Self {
        Part::Text { text: text.into() }
    }

    /// The maker whose hidden reasoning this part carries.
    pub fn reasoning_maker(&self) -> Option<ReasoningMaker> {
        match self {
            Part::EncryptedReasoning { id: Some(_), .. } => Some(ReasoningMaker::OpenAi),
            Part::EncryptedReasoning { id: None, .. } => Some(ReasoningMaker::Anthropic),
            _ => None,
        }
    }
}

/// A maker whose hidden (encrypted) reasoning can be replayed to it alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningMaker {
    OpenAi,
    Anthropic,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub parts: Vec<Part>,
}

/// A function the model may call. `parameters` is a JSON Schema, forwarded as is.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub parameters: Box<RawValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl PartialEq for Tool {
    fn eq(&self, o: &Self) -> bool {
        self.name == o.name
            && self.description == o.description
            && self.parameters.get() == o.parameters.get()
            && self.strict == o.strict
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolChoice {
    Auto,
    None,
    /// The model must call some tool (chat `required`, messages `any`).
    Required,
    /// The model must call this tool.
    Tool {
        name: String,
    },
}

/// Structured output.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        description: Option<String>,
        schema: Box<RawValue>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        strict: Option<bool>,
    },
}

impl PartialEq for ResponseFormat {
    fn eq(&self, o: &Self) -> bool {
        match (self, o) {
            (Self::Text, Self::Text) | (Self::JsonObject, Self::JsonObject) => true,
            (
                Self::JsonSchema {
                    name: a,
                    description: b,
                    schema: c,
                    strict: d,
                },
                Self::JsonSchema {
                    name: e,
                    description: f,
                    schema: g,
                    strict: h,
                },
            ) => a == e && b == f && c.get() == g.get() && d == h,
            _ => false,
        }
    }
}

/// Reasoning controls, in the union of the makers' terms.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Reasoning {
    /// OpenAI effort: minimal, low, medium, high (passed through as given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effort: Option<String>,
    /// OpenAI summary: auto, concise, detailed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Anthropic / Gemini thinking budget in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_tokens: Option<u64>,
}

/// A field the gateway did not model, kept verbatim with its inbound name: it is
/// forwarded only to a rung of the inbound format's own maker, else dropped and
/// disclosed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Extra {
    pub name: String,
    pub value: Box<RawValue>,
}

impl PartialEq for Extra {
    fn eq(&self, o: &Self) -> bool {
        self.name == o.name && self.value.get() == o.value.get()
    }
}

/// A prompt-cache breakpoint the caller marked (Anthropic `cache_control`): the
/// prefix up to and including the marked item may be cached. Makers that take
/// explicit breakpoints get them (Anthropic `cache_control`, Bedrock `cachePoint`);
/// the others cache by prefix on their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheBreak {
    /// After `system[i]`.
    System(usize),
    /// After `tools[i]`.
    Tool(usize),
    /// After part `part` of `messages[message]`.
    Part { message: usize, part: usize },
}

/// Where a part came from in the client's body: the messages format's
/// `messages[message].content[block]`, for naming it in an error after the turns
/// were regrouped (a user turn's tool results become a tool turn of their own).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    pub message: u32,
    pub block: u32,
}

/// The canonical request: what every inbound format means, in one shape.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The slug as the client sent it (suffixes included).
    pub model: String,
    pub stream: bool,
    /// Chat `stream_options.include_usage`: the client wants the usage chunk.
    #[serde(default)]
    pub include_usage: bool,
    /// Instructions, in order (several system turns are kept apart).
    #[serde(default)]
    pub system: Vec<String>,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub tools: Vec<Tool>,
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// The output budget (chat max_tokens / max_completion_tokens, responses
    /// max_output_tokens, messages max_tokens); on reasoning models it covers
    /// thinking.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub top_k: Option<u64>,
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    #[serde(default)]
    pub stop: Vec<String>,
    #[serde(default)]
    pub response_format: Option<ResponseFormat>,
    #[serde(default)]
    pub reasoning: Option<Reasoning>,
    /// End-user attribution (chat/responses `user`, messages `metadata.user_id`).
    #[serde(default)]
    pub user: Option<String>,
    /// A routing hint owned by the gateway: never sent upstream as is.
    #[serde(default)]
    pub prompt_cache_key: Option<String>,
    /// Responses `include` values (e.g. `reasoning.encrypted_content`).
    #[serde(default)]
    pub include: Vec<String>,
    /// Fields of one maker the canonical form does not model (e.g. `text.verbosity`,
    /// `service_tier`, `metadata`, `client_metadata`), forwarded only to that
    /// maker's rungs.
    #[serde(default)]
    pub extras: Vec<Extra>,
    /// Prompt-cache breakpoints, in the order given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cache_breaks: Vec<CacheBreak>,
    /// Some assistant message carries keys only answers have (chat `annotations`,
    /// `reasoning_content`, null `refusal`/`audio`/`function_call`: a client sent
    /// back the message it was given): a rung that gets the client's own messages
    /// gets them without those keys.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replayed_answer_keys: bool,
    /// Web search, in whichever of its spellings the client asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_search: Option<Box<WebSearch>>,
    /// A tool search declaration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_search: Option<Box<ToolSearch>>,
    /// Tools marked `defer_loading: true`: withheld until a search loads them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deferred: Vec<Tool>,
    /// Anthropic beta flags the gateway asks Claude rungs for (the `[1m]`
    /// window): carried in the body where the wire takes them there (Converse's
    /// `additionalModelRequestFields.anthropic_beta`); Anthropic's wire takes them as
    /// a header, which the gateway adds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anthropic_beta: Vec<String>,
    /// One per part of `messages`, in order, where the format regroups turns
    /// (messages); empty elsewhere. Only errors read it: never stored.
    #[serde(skip)]
    pub origins: Vec<Origin>,
}

impl Request {
    /// How the client's body names part `part` of `messages[message]`.
    pub fn part_param(&self, message: usize, part: usize) -> String {
        let flat = self.messages[..message]
            .iter()
            .map(|m| m.parts.len())
            .sum::<usize>()
            + part;
        let parts: usize = self.messages.iter().map(|m| m.parts.len()).sum();
        match self.origins.get(flat) {
            Some(o) if self.origins.len() == parts => {
                format!("messages[{}].content[{}]", o.message, o.block)
            }
            _ => format!("messages[{message}].content[{part}]"),
        }
    }

    /// The caller's stop sequence when it gave exactly one.
    pub fn only_stop(&self) -> Option<String> {
        match self.stop.as_slice() {
            [one] => Some(one.clone()),
            _ => None,
        }
    }

    /// Whether the request asks for structured output (json_object or json_schema).
    pub fn wants_structured(&self) -> bool {
        matches!(
            self.response_format,
            Some(ResponseFormat::JsonObject) | Some(ResponseFormat::JsonSchema { .. })
        )
    }

    /// The text a model sees, piece by piece (the system prompt, each turn's
    /// text, thinking, tool calls and results, the tools' definitions), handed to
    /// `text`; returns the tokens of what is not text: four of framing per turn,
    /// 1,024 per image or document. The JSON syntax around the text is not part
    /// of it: the body's bytes overstate a prompt by half and more.
    pub fn prompt_text(&self, mut text: impl FnMut(&str)) -> u64 {
        fn part(p: &Part, text: &mut impl FnMut(&str)) -> u64 {
            match p {
                Part::Text { text: t } | Part::Thinking { text: t, .. } => {
                    text(t);
                    0
                }
                Part::ToolCall {
                    name, arguments, ..
                } => {
                    text(name);
                    text(arguments);
                    0
                }
                Part::ToolResult { content, .. } => content.iter().map(|p| part(p, text)).sum(),
                Part::Image { .. } | Part::Document { .. } => 1_024,
                // Replayed opaquely: the provider decrypts it, the count is its own.
                Part::EncryptedReasoning { .. } => 0,
            }
        }
        self.system.iter().for_each(|s| text(s));
        let mut fixed: u64 = 4 * (self.messages.len() + self.system.len()) as u64;
        for p in self.messages.iter().flat_map(|m| &m.parts) {
            fixed += part(p, &mut text);
        }
        for t in self.tools.iter().chain(&self.deferred) {
            text(&t.name);
            if let Some(d) = &t.description {
                text(d);
            }
            text(t.parameters.get());
        }
        fixed
    }

    /// The prompt's size in tokens by the documented approximation, for a model
    /// whose maker's tokenizer the gateway does not hold: [`Request::prompt_text`]
    /// at a token per four characters (OpenAI's rule of thumb for English).
    pub fn estimated_prompt_tokens(&self) -> u64 {
        let mut chars = 0usize;
        let fixed = self.prompt_text(|t| chars += t.chars().count());
        (chars.div_ceil(4) as u64).saturating_add(fixed)
    }

    /// Whether any turn carries an image or a document.
    pub fn has_media(&self) -> bool {
        fn media(p: &Part) -> bool {
            match p {
                Part::Image { .. } | Part::Document { .. } => true,
                Part::ToolResult { content, .. } => content.iter().any(media),
                _ => false,
            }
        }
        self.messages.iter().any(|m| m.parts.iter().any(media))
    }

    /// Whether any turn carries hidden reasoning that `maker` (the serving rung's,
    /// `None` for a rung that takes none back) cannot take.
    pub fn has_foreign_reasoning(&self, maker: Option<ReasoningMaker>) -> bool {
        self.messages
            .iter()
            .flat_map(|m| &m.parts)
            .any(|p| p.reasoning_maker().is_some_and(|m| Some(m) != maker))
    }

    /// Whether any turn carries visible reasoning with its maker's signature.
    pub fn has_signed_reasoning(&self) -> bool {
        self.messages.iter().flat_map(|m| &m.parts).any(|p| {
            matches!(
                p,
                Part::Thinking {
                    signature: Some(_),
                    ..
                }
            )
        })
    }

    /// Whether the conversation's last assistant turn calls a tool without signed
    /// reasoning at its start: Claude with thinking on refuses such a history
    /// (400, the turn must start with a thinking or redacted_thinking block), as
    /// when a client's framework dropped the reasoning between turns.
    pub fn tool_turn_without_signed_reasoning(&self) -> bool {
        let Some(last) = self
            .messages
            .iter()
            .rposition(|m| m.role == Role::Assistant)
        else {
            return false;
        };
        let first = self.messages[..=last]
            .iter()
            .rev()
            .take_while(|m| m.role == Role::Assistant)
            .count();
        let parts = self.messages[last + 1 - first..=last]
            .iter()
            .flat_map(|m| &m.parts);
        if !parts.clone().any(|p| matches!(p, Part::ToolCall { .. })) {
            return false;
        }
        // What an Anthropic rung is not sent (empty text, unsigned thinking,
        // another maker's hidden reasoning) does not start the turn.
        let opening = parts.clone().find(|p| match p {
            Part::Text { text } => !text.is_empty(),
            Part::Thinking { signature, .. } => signature.is_some(),
            Part::EncryptedReasoning { id, .. } => id.is_none(),
            _ => true,
        });
        !matches!(
            opening,
            Some(Part::Thinking { .. } | Part::EncryptedReasoning { .. })
        )
    }

    /// This request without the hidden reasoning `maker` cannot take (messages, tool
    /// calls and tool results are kept; a turn left empty goes).
    pub fn without_foreign_reasoning(&self, maker: Option<ReasoningMaker>) -> Request {
        let mut r = self.clone();
        for m in &mut r.messages {
            m.parts
                .retain(|p| p.reasoning_maker().is_none_or(|pm| Some(pm) == maker));
        }
        r.messages.retain(|m| !m.parts.is_empty());
        r
    }

    /// Whether the gateway has more to do than translate: a web search, or a tool
    /// search (declared, or deferred tools).
    pub fn orchestrated(&self) -> bool {
        self.web_search.is_some() || self.tool_search.is_some() || !self.deferred.is_empty()
    }

    /// The text of the last user turn (what a service-run web search looks up).
    pub fn last_user_text(&self) -> Option<String> {
        let m = self.messages.iter().rev().find(|m| m.role == Role::User)?;
        let text: Vec<&str> = m
            .parts
            .iter()
            .filter_map(|p| match p {
                Part::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        (!text.is_empty()).then(|| text.join("\n"))
    }
}
