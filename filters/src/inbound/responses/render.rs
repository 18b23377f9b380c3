//! The response object: a whole answer rendered as the responses API's response,
//! its echo of the request, and the output rule that drops encrypted reasoning.

use super::*;

/// Ids of the answer and its output items. The provider's id is kept when it is a
/// responses id; any other is prefixed so the client sees the format's own shape.
pub(super) struct Ids {
    pub(super) resp: String,
}

impl Ids {
    pub(super) fn new(id: Option<&str>, fallback: &str) -> Self {
        let raw = id.filter(|s| !s.is_empty()).unwrap_or(fallback);
        let resp = if raw.starts_with("resp_") {
            raw.to_string()
        } else {
            format!("resp_{raw}")
        };
        Ids { resp }
    }

    /// An output item id, unique within the answer.
    pub(super) fn item(&self, prefix: &str, index: usize) -> String {
        format!("{prefix}_{}_{index}", &self.resp["resp_".len()..])
    }
}

#[derive(Serialize)]
pub(super) struct SummaryText {
    #[serde(rename = "type")]
    pub(super) kind: &'static str,
    pub(super) text: String,
}

/// A `url_citation` annotation of an output text, indexes within that text.
#[derive(Clone, Serialize)]
pub(super) struct Annotation {
    #[serde(rename = "type")]
    pub(super) kind: &'static str,
    pub(super) start_index: u32,
    pub(super) end_index: u32,
    pub(super) url: String,
    pub(super) title: String,
}

impl Annotation {
    /// `c` moved to a text that starts `offset` characters into the answer.
    pub(super) fn of(c: &UrlCitation, offset: u32) -> Self {
        Annotation {
            kind: "url_citation",
            start_index: c.start_index.saturating_sub(offset),
            end_index: c.end_index.saturating_sub(offset),
            url: c.url.clone(),
            title: c.title.clone(),
        }
    }
}

#[derive(Serialize)]
pub(super) struct OutputText {
    #[serde(rename = "type")]
    pub(super) kind: &'static str,
    pub(super) text: String,
    pub(super) annotations: Vec<Annotation>,
    pub(super) logprobs: [(); 0],
}

impl OutputText {
    pub(super) fn new(text: String) -> Self {
        OutputText {
            kind: "output_text",
            text,
            annotations: Vec::new(),
            logprobs: [],
        }
    }
}

/// What a `web_search_call` did.
#[derive(Serialize)]
pub(super) struct SearchAction {
    #[serde(rename = "type")]
    pub(super) kind: &'static str,
    pub(super) query: String,
}

/// One output item of the answer.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum OutItem {
    Reasoning {
        id: String,
        summary: Vec<SummaryText>,
        #[serde(skip_serializing_if = "Option::is_none")]
        encrypted_content: Option<String>,
    },
    Message {
        id: String,
        status: &'static str,
        role: &'static str,
        content: Vec<OutputText>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: &'static str,
    },
    /// A search run on the server side (the gateway's, or the provider's).
    WebSearchCall {
        id: String,
        status: &'static str,
        action: SearchAction,
    },
}

impl OutItem {
    pub(super) fn web_search(s: &ServerSearch, status: &'static str) -> Self {
        let id = if s.id.starts_with("ws_") {
            s.id.clone()
        } else {
            format!("ws_{}", s.id)
        };
        OutItem::WebSearchCall {
            id,
            status,
            action: SearchAction {
                kind: "search",
                query: s.query.clone(),
            },
        }
    }

    pub(super) fn reasoning(id: String) -> Self {
        OutItem::Reasoning {
            id,
            summary: Vec::new(),
            encrypted_content: None,
        }
    }

    /// A message item, announced without content.
    pub(super) fn message(id: String, status: &'static str) -> Self {
        OutItem::Message {
            id,
            status,
            role: "assistant",
            content: Vec::new(),
        }
    }

    pub(super) fn set_status(&mut self, to: &'static str) {
        match self {
            OutItem::Message { status, .. } | OutItem::FunctionCall { status, .. } => *status = to,
            OutItem::Reasoning { .. } | OutItem::WebSearchCall { .. } => {}
        }
    }

    /// Whether this is a reasoning item that can still take its encrypted content.
    pub(super) fn open_reasoning(&self) -> bool {
        matches!(
            self,
            OutItem::Reasoning {
                encrypted_content: None,
                ..
            }
        )
    }

    /// Adds visible reasoning to a reasoning item (one summary part).
    pub(super) fn add_thinking(&mut self, text: &str) {
        if let OutItem::Reasoning { summary, .. } = self {
            match summary.last_mut() {
                Some(s) => s.text.push_str(text),
                None => summary.push(SummaryText {
                    kind: "summary_text",
                    text: text.to_string(),
                }),
            }
        }
    }

    /// Closes a reasoning item with the signature of its summary; one without a
    /// summary has nothing signed to carry.
    pub(super) fn set_signed(&mut self, signature: &str) {
        if let OutItem::Reasoning {
            summary,
            encrypted_content,
            ..
        } = self
        {
            if !summary.is_empty() {
                *encrypted_content = Some(format!("{SIGNED_REASONING}{signature}"));
            }
        }
    }

    pub(super) fn set_encrypted(&mut self, data: &str, new_id: Option<&str>) {
        if let OutItem::Reasoning {
            id,
            encrypted_content,
            ..
        } = self
        {
            match new_id {
                Some(n) => {
                    *encrypted_content = Some(data.to_string());
                    if !n.is_empty() {
                        *id = n.to_string();
                    }
                }
                // Anthropic's hidden reasoning (redacted thinking), marked so that a
                // replay of this item goes back to an Anthropic rung only.
                None => *encrypted_content = Some(format!("{ANTHROPIC_REASONING}{data}")),
            }
        }
    }
}

/// How the answer ended, in the format's terms.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Outcome {
    Completed,
    /// `incomplete`, with `incomplete_details.reason`.
    Incomplete(&'static str),
}

impl Outcome {
    pub(super) fn of(finish: Option<FinishReason>, cut: bool) -> Self {
        match finish {
            _ if cut => Outcome::Incomplete("max_output_tokens"),
            Some(FinishReason::Length) => Outcome::Incomplete("max_output_tokens"),
            Some(FinishReason::ContentFilter) => Outcome::Incomplete("content_filter"),
            _ => Outcome::Completed,
        }
    }

    pub(super) fn status(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Incomplete(_) => "incomplete",
        }
    }
}

#[derive(Serialize)]
pub(super) struct Incomplete {
    pub(super) reason: &'static str,
}

#[derive(Serialize)]
pub(super) struct CachedDetails {
    pub(super) cached_tokens: u64,
    /// Tokens the provider wrote to its cache (0 on OpenAI, which never reports any).
    pub(super) cache_write_tokens: u64,
}

#[derive(Serialize)]
pub(super) struct ReasoningDetails {
    pub(super) reasoning_tokens: u64,
}

/// Usage in the responses format's names.
#[derive(Serialize)]
pub(super) struct UsageOut {
    pub(super) input_tokens: u64,
    pub(super) input_tokens_details: CachedDetails,
    pub(super) output_tokens: u64,
    pub(super) output_tokens_details: ReasoningDetails,
    pub(super) total_tokens: u64,
    /// Web searches run for the answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) server_tool_use_details: Option<SearchCount>,
    /// What the call cost, in USD.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) cost: Option<f64>,
}

#[derive(Serialize)]
pub(super) struct SearchCount {
    pub(super) web_search_requests: u64,
}

impl From<&Usage> for UsageOut {
    fn from(u: &Usage) -> Self {
        UsageOut {
            input_tokens: u.input_tokens,
            input_tokens_details: CachedDetails {
                cached_tokens: u.cached_tokens,
                cache_write_tokens: u.cache_write_tokens,
            },
            output_tokens: u.output_tokens,
            output_tokens_details: ReasoningDetails {
                reasoning_tokens: u.reasoning_tokens,
            },
            total_tokens: u.total(),
            server_tool_use_details: (u.web_search_requests > 0).then_some(SearchCount {
                web_search_requests: u.web_search_requests,
            }),
            cost: u.cost_usd(),
        }
    }
}

#[derive(Serialize)]
pub(super) struct ResponseObj<'a> {
    pub(super) id: &'a str,
    pub(super) object: &'static str,
    pub(super) created_at: i64,
    pub(super) status: &'static str,
    pub(super) error: Option<()>,
    pub(super) incomplete_details: Option<Incomplete>,
    pub(super) model: &'a str,
    pub(super) output: &'a [OutItem],
    pub(super) usage: Option<UsageOut>,
    pub(super) provider: &'a str,
    /// The request's members the object repeats (see [`echo`]).
    #[serde(skip)]
    pub(super) echo: &'a str,
}

/// An answer (a whole `response` object, or stream frames) without the encrypted
/// content of its reasoning items: what a client that did not ask for
/// `reasoning.encrypted_content` gets, when the gateway asked for it to keep (or
/// rendered it from another maker's hidden reasoning). `None`: nothing to remove.
pub fn without_encrypted_content(answer: &[u8], streamed: bool) -> Option<Vec<u8>> {
    const NEEDLE: &[u8] = b"\"encrypted_content\"";
    memchr::memmem::find(answer, NEEDLE)?;
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(o) => {
                if o.get("type").and_then(|t| t.as_str()) == Some("reasoning") {
                    o.remove("encrypted_content");
                }
                o.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let rewrite = |json: &[u8]| -> Option<Vec<u8>> {
        let mut v: serde_json::Value = serde_json::from_slice(json).ok()?;
        strip(&mut v);
        serde_json::to_vec(&v).ok()
    };
    if !streamed {
        return rewrite(answer);
    }
    let mut out = Vec::with_capacity(answer.len());
    for frame in answer.split_inclusive(|&b| b == b'\n') {
        // Each frame's data is one line; only the ones that hold the member change.
        match frame.strip_prefix(b"data: ") {
            Some(data) if memchr::memmem::find(data, NEEDLE).is_some() => {
                let line = data.strip_suffix(b"\n").unwrap_or(data);
                match rewrite(line) {
                    Some(json) => {
                        out.extend_from_slice(b"data: ");
                        out.extend_from_slice(&json);
                        out.push(b'\n');
                    }
                    None => out.extend_from_slice(frame),
                }
            }
            _ => out.extend_from_slice(frame),
        }
    }
    Some(out)
}

/// The request members a `response` object repeats, as OpenAI's schema requires
/// them (`tools`, `tool_choice` and `parallel_tool_calls` never null), each the
/// client's value or the API's default: JSON members without braces. `turn`: the
/// client's own `store` and `previous_response_id` (the body served may be the
/// rebuilt conversation, which carries neither as asked).
pub fn echo(object: &RawObject, turn: Option<(bool, Option<&str>)>) -> String {
    const FIELDS: [(&str, &str); 8] = [
        ("background", "false"),
        ("instructions", "null"),
        ("metadata", "{}"),
        ("parallel_tool_calls", "true"),
        ("temperature", "1.0"),
        ("tool_choice", "\"auto\""),
        ("tools", "[]"),
        ("top_p", "1.0"),
    ];
    let mut out = String::new();
    for (name, default) in FIELDS {
        let given = object.get(name).map(RawValue::get).filter(|v| *v != "null");
        let tools;
        let given = match (name, given) {
            ("tools", Some(v)) => {
                tools = echoed_tools(v);
                Some(tools.as_deref().unwrap_or(v))
            }
            _ => given,
        };
        let value = match (name, given) {
            (_, Some(v)) => v,
            // Nullable members stay null when the client said null.
            ("instructions" | "temperature" | "top_p", None) if object.contains_key(name) => "null",
            (_, None) => default,
        };
        if !out.is_empty() {
            out.push(',');
        }
        out.push('"');
        out.push_str(name);
        out.push_str("\":");
        out.push_str(value);
    }
    if let Some((store, previous)) = turn {
        out.push_str(if store {
            ",\"store\":true"
        } else {
            ",\"store\":false"
        });
        out.push_str(",\"previous_response_id\":");
        out.push_str(&serde_json::to_string(&previous).unwrap_or_else(|_| "null".into()));
    }
    out
}

/// The request's tools as a `response` object repeats them: a function tool with
/// its `strict` (the API's default, true) and `parameters` (null) filled in.
pub(super) fn echoed_tools(raw: &str) -> Option<String> {
    let mut tools: Vec<serde_json::Map<String, serde_json::Value>> =
        serde_json::from_str(raw).ok()?;
    for t in &mut tools {
        if t.get("type").and_then(|v| v.as_str()) == Some("function") {
            t.entry("strict").or_insert(serde_json::Value::Bool(true));
            t.entry("parameters").or_insert(serde_json::Value::Null);
        }
    }
    serde_json::to_string(&tools).ok()
}

/// Writes a response object into `out`; a finished one carries the receipt and the
/// disclosure of dropped fields.
pub(super) fn write_response(out: &mut Vec<u8>, obj: &ResponseObj, tail: Option<&Tail>) {
    let start = out.len();
    // Serializing plain strings and numbers into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, obj);
    if !obj.echo.is_empty() && out.last() == Some(&b'}') {
        out.pop();
        out.push(b',');
        out.extend_from_slice(obj.echo.as_bytes());
        out.push(b'}');
    }
    let Some(tail) = tail else { return };
    if !tail.receipt.is_empty() {
        append_member(out, start, RECEIPT_MEMBER, tail.receipt.as_bytes());
    }
    if let Some(ignored) = &tail.ignored {
        let v = serde_json::to_vec(ignored).unwrap_or_default();
        append_member(out, start, IGNORED_MEMBER, &v);
    }
}

/// The output items of a whole answer, in order: the searches run for it, then its
/// parts (visible reasoning and the encrypted content that follows it share one
/// reasoning item); each message's text carries the citations of its span.
pub(super) fn items_of(resp: &Response, ids: &Ids) -> Vec<OutItem> {
    let mut items: Vec<OutItem> = resp
        .searches
        .iter()
        .map(|s| OutItem::web_search(s, "completed"))
        .collect();
    // Characters of answer text before the part being read.
    let mut offset = 0u32;
    for p in &resp.parts {
        if let Part::Text { text } = p {
            let len = text.chars().count() as u32;
            if !text.is_empty() {
                let n = items.len();
                let mut out = OutputText::new(text.clone());
                out.annotations = resp
                    .citations
                    .iter()
                    .filter(|c| c.start_index >= offset && c.start_index < offset + len)
                    .map(|c| Annotation::of(c, offset))
                    .collect();
                let mut item = OutItem::message(ids.item("msg", n), "completed");
                if let OutItem::Message { content, .. } = &mut item {
                    content.push(out);
                }
                items.push(item);
            }
            offset += len;
            continue;
        }
        let n = items.len();
        match p {
            Part::Thinking { text, .. } if text.is_empty() => {}
            Part::Thinking { text, signature } => {
                if !items.last().is_some_and(OutItem::open_reasoning) {
                    items.push(OutItem::reasoning(ids.item("rs", n)));
                }
                if let Some(it) = items.last_mut() {
                    it.add_thinking(text);
                    if let Some(s) = signature {
                        it.set_signed(s);
                    }
                }
            }
            Part::EncryptedReasoning { data, id } => {
                if !items.last().is_some_and(OutItem::open_reasoning) {
                    items.push(OutItem::reasoning(ids.item("rs", n)));
                }
                if let Some(it) = items.last_mut() {
                    it.set_encrypted(data, id.as_deref());
                }
            }
            Part::Text { .. } => {}
            Part::ToolCall {
                id,
                name,
                arguments,
            } => items.push(OutItem::FunctionCall {
                id: ids.item("fc", n),
                call_id: id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
                status: "completed",
            }),
            // Inputs never appear in an answer.
            Part::Image { .. } | Part::Document { .. } | Part::ToolResult { .. } => {}
        }
    }
    items
}

/// One whole answer as a `response` object.
pub fn render(resp: &Response, meta: &Meta, tail: &Tail) -> Vec<u8> {
    let ids = Ids::new(resp.id.as_deref(), &meta.fallback_id);
    let mut items = items_of(resp, &ids);
    let outcome = Outcome::of(resp.finish, tail.cut);
    if let (Outcome::Incomplete(_), Some(last)) = (outcome, items.last_mut()) {
        last.set_status("incomplete");
    }
    let obj = ResponseObj {
        id: &ids.resp,
        object: "response",
        created_at: meta.created,
        status: outcome.status(),
        error: None,
        incomplete_details: match outcome {
            Outcome::Incomplete(reason) => Some(Incomplete { reason }),
            Outcome::Completed => None,
        },
        model: resp.model.as_deref().unwrap_or(&meta.slug),
        output: &items,
        usage: Some(UsageOut::from(&tail.usage)),
        provider: &meta.provider,
        echo: &meta.echo,
    };
    let mut out = Vec::with_capacity(512 + tail.receipt.len());
    write_response(&mut out, &obj, Some(tail));
    out
}
