//! Answers: a whole response object decoded into the canonical form.

use super::*;

#[derive(Deserialize, Default)]
pub(super) struct WireUsage {
    #[serde(default)]
    pub(super) input_tokens: u64,
    #[serde(default)]
    pub(super) output_tokens: u64,
    #[serde(default)]
    pub(super) input_tokens_details: Option<CachedDetails>,
    #[serde(default)]
    pub(super) output_tokens_details: Option<ReasoningDetails>,
}

#[derive(Deserialize, Default)]
pub(super) struct CachedDetails {
    #[serde(default)]
    pub(super) cached_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
pub(super) struct ReasoningDetails {
    #[serde(default)]
    pub(super) reasoning_tokens: Option<u64>,
}

impl WireUsage {
    pub(super) fn to_usage(&self) -> Usage {
        Usage {
            input_tokens: self.input_tokens,
            // OpenAI charges no cache writes.
            cache_write_tokens: 0,
            cached_tokens: self
                .input_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            output_tokens: self.output_tokens,
            reasoning_tokens: self
                .output_tokens_details
                .as_ref()
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
            cache_write_1h_tokens: 0,
            web_search_requests: 0,
            cost_micro_usd: None,
        }
    }
}

#[derive(Deserialize)]
pub(super) struct WireError {
    #[serde(default)]
    pub(super) code: Option<String>,
    #[serde(default)]
    pub(super) message: Option<String>,
    /// Azure OpenAI names a content-filter refusal here.
    #[serde(default)]
    pub(super) innererror: Option<InnerError>,
}

#[derive(Deserialize)]
pub(super) struct InnerError {
    #[serde(default)]
    pub(super) code: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct Incomplete {
    #[serde(default)]
    pub(super) reason: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct TextIn {
    #[serde(default)]
    pub(super) text: String,
}

/// An output text's annotation; `url_citation` is the one the canonical form
/// carries.
#[derive(Deserialize)]
pub(super) struct AnnotationIn {
    #[serde(rename = "type", default)]
    pub(super) kind: String,
    #[serde(default)]
    pub(super) url: String,
    #[serde(default)]
    pub(super) title: Option<String>,
    #[serde(default)]
    pub(super) start_index: u32,
    #[serde(default)]
    pub(super) end_index: u32,
}

impl AnnotationIn {
    /// The citation, its span moved to the answer's text (`offset` characters
    /// before this output text).
    pub(super) fn citation(&self, offset: u32) -> Option<Event> {
        (self.kind == "url_citation").then(|| {
            Event::Citation(Box::new(crate::ir::UrlCitation {
                url: self.url.clone(),
                title: self.title.clone().unwrap_or_default(),
                content: None,
                start_index: self.start_index + offset,
                end_index: self.end_index + offset,
            }))
        })
    }
}

/// What a `web_search_call` did.
#[derive(Deserialize)]
pub(super) struct ActionIn {
    #[serde(default)]
    pub(super) query: Option<String>,
}

/// A `web_search_call` item as a server search (OpenAI shows no results).
pub(super) fn server_search(id: &Option<String>, action: &Option<ActionIn>) -> Event {
    Event::ServerSearch(Box::new(crate::ir::ServerSearch {
        id: id.clone().unwrap_or_default(),
        query: action
            .as_ref()
            .and_then(|a| a.query.clone())
            .unwrap_or_default(),
        results: Vec::new(),
    }))
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum ContentIn {
    OutputText {
        #[serde(default)]
        text: String,
        #[serde(default)]
        annotations: Vec<AnnotationIn>,
    },
    Refusal {
        #[serde(default)]
        refusal: String,
    },
    #[serde(other)]
    Other,
}

/// An output item, as far as the canonical form needs it.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum ItemIn {
    Message {
        #[serde(default)]
        content: Vec<ContentIn>,
    },
    FunctionCall {
        #[serde(default)]
        call_id: String,
        #[serde(default)]
        name: String,
        #[serde(default)]
        arguments: String,
    },
    Reasoning {
        #[serde(default)]
        id: Option<String>,
        #[serde(default)]
        summary: Vec<TextIn>,
        /// Raw reasoning text (open-weight models), when given.
        #[serde(default)]
        content: Option<Vec<TextIn>>,
        #[serde(default)]
        encrypted_content: Option<String>,
    },
    /// The provider's own web search.
    WebSearchCall {
        #[serde(default)]
        id: Option<String>,
        #[serde(default)]
        action: Option<ActionIn>,
    },
    /// Other hosted tool calls and anything newer: nothing the canonical form
    /// carries.
    #[serde(other)]
    Other,
}

/// A response object (whole, or inside a stream's lifecycle events).
#[derive(Deserialize)]
pub(super) struct WireResponse {
    #[serde(default)]
    pub(super) id: Option<String>,
    #[serde(default)]
    pub(super) model: Option<String>,
    #[serde(default)]
    pub(super) status: Option<String>,
    #[serde(default)]
    pub(super) output: Vec<ItemIn>,
    #[serde(default)]
    pub(super) usage: Option<WireUsage>,
    #[serde(default)]
    pub(super) error: Option<WireError>,
    #[serde(default)]
    pub(super) incomplete_details: Option<Incomplete>,
}

impl WireError {
    pub(super) fn refusal(&self) -> Option<RefusalReason> {
        let inner = self.innererror.as_ref().and_then(|i| i.code.as_deref());
        self.code
            .as_deref()
            .and_then(policy_reason)
            .or_else(|| inner.and_then(policy_reason))
    }

    /// A policy refusal, or an in-band error.
    pub(super) fn event(&self) -> Event {
        match self.refusal() {
            Some(reason) => Event::Refusal {
                reason,
                text: self.message.clone(),
            },
            None => Event::Error {
                message: self
                    .message
                    .clone()
                    .or_else(|| self.code.clone())
                    .unwrap_or_else(|| "the provider reported an error".into()),
            },
        }
    }
}

/// The closing events of an answer: its error, finish and usage (with the web
/// searches the provider ran).
pub(super) fn settle(r: &WireResponse, has_calls: bool, searches: u64, out: &mut Vec<Event>) {
    if let Some(e) = &r.error {
        out.push(e.event());
    }
    let status = r.status.as_deref().unwrap_or("completed");
    let reason = match status {
        "completed" if has_calls => FinishReason::ToolCalls,
        "completed" => FinishReason::Stop,
        "incomplete" => match r
            .incomplete_details
            .as_ref()
            .and_then(|d| d.reason.as_deref())
        {
            Some("content_filter") => FinishReason::ContentFilter,
            _ => FinishReason::Length,
        },
        // failed, cancelled, or an unfinished (background) response.
        other => {
            if r.error.is_none() {
                out.push(Event::Error {
                    message: format!("the response ended with status `{other}`"),
                });
            }
            return;
        }
    };
    out.push(Event::Finish {
        reason,
        raw: Some(status.to_string()),
        stop_sequence: None,
    });
    if let Some(u) = &r.usage {
        let mut u = u.to_usage();
        u.web_search_requests = searches;
        out.push(Event::Usage(u));
    }
}

/// The visible reasoning of a reasoning item: summary parts (or raw reasoning
/// text) joined by blank lines, as one canonical thinking text.
pub(super) fn reasoning_text(summary: &[TextIn], content: Option<&[TextIn]>) -> String {
    let parts = if summary.is_empty() {
        content.unwrap_or_default()
    } else {
        summary
    };
    let texts: Vec<&str> = parts.iter().map(|t| t.text.as_str()).collect();
    texts.join("\n\n")
}

/// A whole response object as the events its stream would give.
pub fn decode(body: &[u8]) -> Result<Vec<Event>, DecodeError> {
    let r: WireResponse = serde_json::from_slice(body)
        .map_err(|e| DecodeError(format!("not a responses answer: {e}")))?;
    let mut out = Vec::with_capacity(2 + 2 * r.output.len() + 2);
    out.push(Event::Start {
        id: r.id.clone(),
        model: r.model.clone(),
    });
    let mut calls = 0u32;
    let mut searches = 0u64;
    // Characters of answer text before the output text being read.
    let mut offset = 0u32;
    for item in &r.output {
        match item {
            ItemIn::Reasoning {
                id,
                summary,
                content,
                encrypted_content,
            } => {
                let text = reasoning_text(summary, content.as_deref());
                if !text.is_empty() {
                    out.push(Event::Thinking { text });
                }
                if let Some(data) = encrypted_content {
                    out.push(Event::EncryptedReasoning {
                        data: data.clone(),
                        id: id.clone(),
                    });
                }
            }
            ItemIn::Message { content } => {
                for c in content {
                    match c {
                        ContentIn::OutputText { text, annotations } => {
                            out.push(Event::Text { text: text.clone() });
                            out.extend(annotations.iter().filter_map(|a| a.citation(offset)));
                            offset += text.chars().count() as u32;
                        }
                        ContentIn::Refusal { refusal } => out.push(Event::Refusal {
                            reason: RefusalReason::ContentPolicy,
                            text: Some(refusal.clone()),
                        }),
                        ContentIn::Other => {}
                    }
                }
            }
            ItemIn::FunctionCall {
                call_id,
                name,
                arguments,
            } => {
                out.push(Event::ToolCallStart {
                    index: calls,
                    id: call_id.clone(),
                    name: name.clone(),
                });
                if !arguments.is_empty() {
                    out.push(Event::ToolCallArgs {
                        index: calls,
                        arguments: arguments.clone(),
                    });
                }
                calls += 1;
            }
            ItemIn::WebSearchCall { id, action } => {
                searches += 1;
                out.push(server_search(id, action));
            }
            ItemIn::Other => {}
        }
    }
    settle(&r, calls > 0, searches, &mut out);
    Ok(out)
}

#[derive(Deserialize)]
pub(super) struct ErrorBody {
    pub(super) error: Option<WireError>,
}

/// Whether an error answer is a policy refusal (see
/// [`policy_reason`](crate::upstream::openai_chat::policy_reason) for the
/// codes). Only client errors are: a 5xx is the provider failing.
pub fn refusal(status: u16, body: &[u8]) -> Option<RefusalReason> {
    if !(400..500).contains(&status) {
        return None;
    }
    let b: ErrorBody = serde_json::from_slice(body).ok()?;
    b.error?.refusal()
}
