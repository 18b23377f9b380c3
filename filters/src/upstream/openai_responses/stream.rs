//! Streams: the Responses API's named events decoded.

use super::*;

/// The members of a stream event that the decoder reads.
#[derive(Deserialize)]
pub(super) struct Frame<'a> {
    #[serde(borrow, default)]
    pub(super) delta: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) item_id: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(super) output_index: Option<u64>,
    #[serde(default)]
    pub(super) summary_index: Option<u64>,
    #[serde(borrow, default)]
    pub(super) item: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(super) response: Option<&'a RawValue>,
    #[serde(default)]
    pub(super) text: Option<String>,
    #[serde(default)]
    pub(super) arguments: Option<String>,
    #[serde(default)]
    pub(super) refusal: Option<String>,
    #[serde(default)]
    pub(super) code: Option<String>,
    #[serde(default)]
    pub(super) message: Option<String>,
    #[serde(default)]
    pub(super) annotation: Option<AnnotationIn>,
    /// Some providers nest the `error` event's members.
    #[serde(default)]
    pub(super) error: Option<WireError>,
}

#[derive(Deserialize)]
pub(super) struct TypeOnly<'a> {
    #[serde(rename = "type", borrow, default)]
    pub(super) kind: Option<Cow<'a, str>>,
}

/// The item id of a function call item as it opens.
#[derive(Deserialize)]
pub(super) struct ItemHead {
    #[serde(rename = "type", default)]
    pub(super) kind: String,
    #[serde(default)]
    pub(super) id: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct ResponseHead {
    #[serde(default)]
    pub(super) id: Option<String>,
    #[serde(default)]
    pub(super) model: Option<String>,
}

/// A function call seen in the stream.
pub(super) struct Call {
    pub(super) item_id: Option<String>,
    pub(super) output_index: Option<u64>,
    pub(super) index: u32,
    /// Whether any of its arguments went out yet.
    pub(super) args: bool,
}

/// Decodes the responses stream: the events it needs by name (the SSE `event:`
/// field, or the data's `type` when a provider sends no name), ignoring the rest.
#[derive(Default)]
pub struct Decoder {
    pub(super) started: bool,
    pub(super) done: bool,
    pub(super) calls: Vec<Call>,
    /// Items whose text or visible reasoning already went out as deltas (a `.done`
    /// only repeats it).
    pub(super) streamed: Vec<String>,
    pub(super) refusal: String,
    /// Where each message item's text starts in the answer's text (characters),
    /// by item id: a citation's span is moved there.
    pub(super) texts: Vec<(String, u32)>,
    /// Characters of answer text so far.
    pub(super) chars: u32,
    /// Web searches the provider ran.
    pub(super) searches: u64,
}

impl Decoder {
    /// Counts streamed text, noting where each item's text starts.
    pub(super) fn text_seen(&mut self, item_id: Option<&str>, text: &str) {
        if let Some(id) = item_id {
            if !self.texts.iter().any(|(i, _)| i == id) {
                self.texts.push((id.to_string(), self.chars));
            }
        }
        self.chars += text.chars().count() as u32;
    }

    pub fn new() -> Self {
        Self::default()
    }

    pub(super) fn streamed(&self, item_id: Option<&str>) -> bool {
        item_id.is_some_and(|id| self.streamed.iter().any(|s| s == id))
    }

    pub(super) fn mark(&mut self, item_id: Option<&str>) {
        if let Some(id) = item_id {
            if !self.streamed(Some(id)) {
                self.streamed.push(id.to_string());
            }
        }
    }

    pub(super) fn call(&mut self, f: &Frame) -> Option<&mut Call> {
        let by_id = f.item_id.as_deref();
        self.calls
            .iter_mut()
            .rev()
            .find(|c| match (by_id, &c.item_id) {
                (Some(a), Some(b)) => a == b,
                _ => f.output_index.is_some() && c.output_index == f.output_index,
            })
    }

    pub(super) fn start_call(
        &mut self,
        f: &Frame,
        item: &RawValue,
        out: &mut Vec<Event>,
    ) -> Result<(), DecodeError> {
        let head: ItemHead = parse(item.get())?;
        if head.kind != "function_call" {
            return Ok(());
        }
        let ItemIn::FunctionCall {
            call_id,
            name,
            arguments,
        } = parse(item.get())?
        else {
            return Ok(());
        };
        let index = self.calls.len() as u32;
        out.push(Event::ToolCallStart {
            index,
            id: call_id,
            name,
        });
        let args = !arguments.is_empty();
        if args {
            out.push(Event::ToolCallArgs { index, arguments });
        }
        self.calls.push(Call {
            item_id: head.id,
            output_index: f.output_index,
            index,
            args,
        });
        Ok(())
    }

    pub(super) fn item_done(
        &mut self,
        f: &Frame,
        item: &RawValue,
        out: &mut Vec<Event>,
    ) -> Result<(), DecodeError> {
        match parse::<ItemIn>(item.get())? {
            ItemIn::Reasoning {
                id,
                summary,
                content,
                encrypted_content,
            } => {
                if !self.streamed(id.as_deref()) {
                    let text = reasoning_text(&summary, content.as_deref());
                    if !text.is_empty() {
                        out.push(Event::Thinking { text });
                    }
                }
                // Only the finished item carries the whole encrypted content.
                if let Some(data) = encrypted_content {
                    out.push(Event::EncryptedReasoning { data, id });
                }
            }
            ItemIn::FunctionCall { arguments, .. } => match self.call(f) {
                Some(c) if !c.args && !arguments.is_empty() => {
                    c.args = true;
                    out.push(Event::ToolCallArgs {
                        index: c.index,
                        arguments,
                    });
                }
                Some(_) => {}
                None => self.start_call(f, item, out)?,
            },
            ItemIn::WebSearchCall { id, action } => {
                self.searches += 1;
                out.push(server_search(&id, &action));
            }
            // Text went out with its deltas (or its `.done`).
            ItemIn::Message { .. } | ItemIn::Other => {}
        }
        Ok(())
    }

    pub(super) fn finished(&mut self, f: &Frame, out: &mut Vec<Event>) -> Result<(), DecodeError> {
        self.done = true;
        let Some(raw) = f.response else {
            return Ok(());
        };
        let r: WireResponse = parse(raw.get())?;
        settle(&r, !self.calls.is_empty(), self.searches, out);
        Ok(())
    }
}

pub(super) fn parse<'a, T: Deserialize<'a>>(text: &'a str) -> Result<T, DecodeError> {
    serde_json::from_str(text).map_err(|e| DecodeError(format!("unreadable responses event: {e}")))
}

/// The stream events the decoder acts on.
pub(super) const HANDLED: [&str; 18] = [
    "response.created",
    "response.output_text.annotation.added",
    "response.in_progress",
    "response.output_item.added",
    "response.output_item.done",
    "response.output_text.delta",
    "response.output_text.done",
    "response.refusal.delta",
    "response.refusal.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.reasoning_summary_part.added",
    "response.reasoning_summary_text.delta",
    "response.reasoning_text.delta",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "error",
];

impl StreamDecoder for Decoder {
    fn frame(
        &mut self,
        name: Option<&str>,
        data: &[u8],
        out: &mut Vec<Event>,
    ) -> Result<(), DecodeError> {
        let text = std::str::from_utf8(data)
            .map_err(|_| DecodeError("responses event is not UTF-8".into()))?;
        let named;
        let name = match name {
            Some(n) => n,
            None => {
                named = parse::<TypeOnly>(text)?.kind;
                named.as_deref().unwrap_or("")
            }
        };
        if !HANDLED.contains(&name) {
            return Ok(());
        }
        let f: Frame = parse(text)?;
        let item_id = f.item_id.as_deref();
        match name {
            "response.created" | "response.in_progress" if !self.started => {
                self.started = true;
                let head: ResponseHead = match f.response {
                    Some(r) => parse(r.get())?,
                    None => ResponseHead {
                        id: None,
                        model: None,
                    },
                };
                out.push(Event::Start {
                    id: head.id,
                    model: head.model,
                });
            }
            "response.output_item.added" => {
                if let Some(item) = f.item {
                    self.start_call(&f, item, out)?;
                }
            }
            "response.output_item.done" => {
                if let Some(item) = f.item {
                    self.item_done(&f, item, out)?;
                }
            }
            "response.output_text.delta" => {
                if let Some(d) = f.delta.as_deref().filter(|d| !d.is_empty()) {
                    out.push(Event::Text {
                        text: d.to_string(),
                    });
                    self.mark(item_id);
                    self.text_seen(item_id, d);
                }
            }
            "response.output_text.done" if !self.streamed(item_id) => {
                if let Some(t) = f.text.filter(|t| !t.is_empty()) {
                    self.text_seen(item_id, &t);
                    out.push(Event::Text { text: t });
                }
                self.mark(item_id);
            }
            "response.output_text.annotation.added" => {
                let offset = self
                    .texts
                    .iter()
                    .find(|(i, _)| Some(i.as_str()) == item_id)
                    .map_or(0, |(_, start)| *start);
                out.extend(f.annotation.as_ref().and_then(|a| a.citation(offset)));
            }
            "response.refusal.delta" => {
                if let Some(d) = f.delta.as_deref() {
                    self.refusal.push_str(d);
                    out.push(Event::Refusal {
                        reason: RefusalReason::ContentPolicy,
                        text: Some(self.refusal.clone()),
                    });
                }
            }
            "response.refusal.done" if self.refusal.is_empty() => {
                out.push(Event::Refusal {
                    reason: RefusalReason::ContentPolicy,
                    text: f.refusal,
                });
            }
            "response.function_call_arguments.delta" => {
                let delta = f.delta.as_deref().unwrap_or_default();
                if let (Some(c), false) = (self.call(&f), delta.is_empty()) {
                    c.args = true;
                    let index = c.index;
                    out.push(Event::ToolCallArgs {
                        index,
                        arguments: delta.to_string(),
                    });
                }
            }
            "response.function_call_arguments.done" => {
                let args = f.arguments.clone().unwrap_or_default();
                if let Some(c) = self.call(&f).filter(|c| !c.args && !args.is_empty()) {
                    c.args = true;
                    let index = c.index;
                    out.push(Event::ToolCallArgs {
                        index,
                        arguments: args,
                    });
                }
            }
            // Summary parts after the first are set apart by a blank line.
            "response.reasoning_summary_part.added"
                if f.summary_index.unwrap_or(0) > 0 && self.streamed(item_id) =>
            {
                out.push(Event::Thinking {
                    text: "\n\n".into(),
                });
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                if let Some(d) = f.delta.as_deref().filter(|d| !d.is_empty()) {
                    out.push(Event::Thinking {
                        text: d.to_string(),
                    });
                    self.mark(item_id);
                }
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                self.finished(&f, out)?;
            }
            "error" => {
                let e = f.error.unwrap_or(WireError {
                    code: f.code,
                    message: f.message,
                    innererror: None,
                });
                out.push(e.event());
            }
            _ => {}
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.done
    }
}
