//! The stream: an answer as the responses API's named events, each with its
//! sequence number.

use super::*;

/// A stream event: its `type` (also the SSE `event:` name) and `sequence_number`
/// around the event's own members.
#[derive(Serialize)]
pub(super) struct Envelope<'a, T: Serialize> {
    #[serde(rename = "type")]
    pub(super) kind: &'a str,
    pub(super) sequence_number: u64,
    #[serde(flatten)]
    pub(super) body: T,
}

#[derive(Serialize)]
pub(super) struct ItemEvent<'a> {
    pub(super) output_index: usize,
    pub(super) item: &'a OutItem,
}

#[derive(Serialize)]
pub(super) struct PartEvent<'a> {
    pub(super) item_id: &'a str,
    pub(super) output_index: usize,
    pub(super) content_index: usize,
    pub(super) part: &'a OutputText,
}

#[derive(Serialize)]
pub(super) struct TextDelta<'a> {
    pub(super) item_id: &'a str,
    pub(super) output_index: usize,
    pub(super) content_index: usize,
    pub(super) delta: &'a str,
    pub(super) logprobs: [(); 0],
}

#[derive(Serialize)]
pub(super) struct TextDone<'a> {
    pub(super) item_id: &'a str,
    pub(super) output_index: usize,
    pub(super) content_index: usize,
    pub(super) text: &'a str,
    pub(super) logprobs: [(); 0],
}

#[derive(Serialize)]
pub(super) struct SummaryPartEvent<'a> {
    pub(super) item_id: &'a str,
    pub(super) output_index: usize,
    pub(super) summary_index: usize,
    pub(super) part: &'a SummaryText,
}

#[derive(Serialize)]
pub(super) struct SummaryDelta<'a> {
    pub(super) item_id: &'a str,
    pub(super) output_index: usize,
    pub(super) summary_index: usize,
    pub(super) delta: &'a str,
}

#[derive(Serialize)]
pub(super) struct SummaryDone<'a> {
    pub(super) item_id: &'a str,
    pub(super) output_index: usize,
    pub(super) summary_index: usize,
    pub(super) text: &'a str,
}

#[derive(Serialize)]
pub(super) struct ArgsDelta<'a> {
    pub(super) item_id: &'a str,
    pub(super) output_index: usize,
    pub(super) delta: &'a str,
}

#[derive(Serialize)]
pub(super) struct ItemRef<'a> {
    pub(super) item_id: &'a str,
    pub(super) output_index: usize,
}

#[derive(Serialize)]
pub(super) struct AnnotationAdded<'a> {
    pub(super) item_id: &'a str,
    pub(super) output_index: usize,
    pub(super) content_index: usize,
    pub(super) annotation_index: usize,
    pub(super) annotation: &'a Annotation,
}

#[derive(Serialize)]
pub(super) struct ArgsDone<'a> {
    pub(super) item_id: &'a str,
    pub(super) output_index: usize,
    pub(super) name: &'a str,
    pub(super) arguments: &'a str,
}

/// Writes one named event straight into `out`.
pub(super) fn frame<T: Serialize>(out: &mut Vec<u8>, seq: &mut u64, name: &str, body: T) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    let env = Envelope {
        kind: name,
        sequence_number: *seq,
        body,
    };
    // Serializing strings and numbers into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, &env);
    out.extend_from_slice(b"\n\n");
    *seq += 1;
}

/// Writes a lifecycle event, which carries the response object (the last one with
/// the tail's members).
pub(super) fn lifecycle(
    out: &mut Vec<u8>,
    seq: u64,
    name: &str,
    obj: &ResponseObj,
    tail: Option<&Tail>,
) {
    use std::io::Write;
    // Writing into a Vec cannot fail.
    let _ = write!(
        out,
        "event: {name}\ndata: {{\"type\":\"{name}\",\"sequence_number\":{seq},\"response\":"
    );
    write_response(out, obj, tail);
    out.extend_from_slice(b"}\n\n");
}

/// Encodes canonical events as the responses API's stream: `response.created` and
/// `response.in_progress`, then each output item's added / delta / done events,
/// then `response.completed` (or `response.incomplete`) with the whole response.
///
/// Text and function calls stream as they arrive. A reasoning item is written when
/// it closes: its id (needed to replay its encrypted content) is known only then.
pub struct Encoder {
    pub(super) meta: Meta,
    pub(super) seq: u64,
    pub(super) ids: Option<Ids>,
    pub(super) model: Option<String>,
    pub(super) items: Vec<OutItem>,
    /// The output index of the item still taking deltas.
    pub(super) open: Option<usize>,
    /// Output index of each tool call, by its canonical index.
    pub(super) calls: Vec<(u32, usize)>,
    pub(super) finish: Option<FinishReason>,
    /// Each message item's output index and where its text starts in the
    /// answer's text (characters): citations are placed by it.
    pub(super) texts: Vec<(usize, u32)>,
    /// Characters of answer text so far.
    pub(super) chars: u32,
}

/// The id of the output item at `index`.
pub(super) fn item_id(items: &[OutItem], index: usize) -> &str {
    match items.get(index) {
        Some(OutItem::Reasoning { id, .. })
        | Some(OutItem::Message { id, .. })
        | Some(OutItem::FunctionCall { id, .. })
        | Some(OutItem::WebSearchCall { id, .. }) => id,
        None => "",
    }
}

impl Encoder {
    pub fn new(meta: Meta) -> Self {
        Encoder {
            meta,
            seq: 0,
            ids: None,
            model: None,
            items: Vec::new(),
            open: None,
            calls: Vec::new(),
            finish: None,
            texts: Vec::new(),
            chars: 0,
        }
    }

    /// A search shown as a `web_search_call` item, whole: added, its three
    /// progress events, done.
    pub(super) fn search(&mut self, s: &ServerSearch, out: &mut Vec<u8>) {
        self.close(out, "completed");
        let index = self.items.len();
        self.items.push(OutItem::web_search(s, "in_progress"));
        self.added(index, out);
        for name in [
            "response.web_search_call.in_progress",
            "response.web_search_call.searching",
            "response.web_search_call.completed",
        ] {
            let ev = ItemRef {
                item_id: item_id(&self.items, index),
                output_index: index,
            };
            frame(out, &mut self.seq, name, ev);
        }
        if let Some(OutItem::WebSearchCall { status, .. }) = self.items.get_mut(index) {
            *status = "completed";
        }
        if let Some(item) = self.items.get(index) {
            let ev = ItemEvent {
                output_index: index,
                item,
            };
            frame(out, &mut self.seq, "response.output_item.done", ev);
        }
    }

    /// A citation, on the message whose text holds its start.
    pub(super) fn cite(&mut self, c: &UrlCitation, out: &mut Vec<u8>) {
        let Some(&(index, start)) = self
            .texts
            .iter()
            .rev()
            .find(|(_, start)| *start <= c.start_index)
            .or(self.texts.first())
        else {
            return;
        };
        let annotation = Annotation::of(c, start);
        let Some(OutItem::Message { id, content, .. }) = self.items.get_mut(index) else {
            return;
        };
        let Some(part) = content.first_mut() else {
            return;
        };
        part.annotations.push(annotation);
        let ev = AnnotationAdded {
            item_id: id,
            output_index: index,
            content_index: 0,
            annotation_index: part.annotations.len() - 1,
            annotation: &part.annotations[part.annotations.len() - 1],
        };
        frame(
            out,
            &mut self.seq,
            "response.output_text.annotation.added",
            ev,
        );
    }

    pub(super) fn ids(&self) -> &str {
        self.ids.as_ref().map_or("", |i| i.resp.as_str())
    }

    /// The response object as it stands.
    pub(super) fn snapshot<'a>(
        &'a self,
        outcome: Option<Outcome>,
        usage: Option<&Usage>,
    ) -> ResponseObj<'a> {
        ResponseObj {
            id: self.ids(),
            object: "response",
            created_at: self.meta.created,
            status: outcome.map_or("in_progress", Outcome::status),
            error: None,
            incomplete_details: match outcome {
                Some(Outcome::Incomplete(reason)) => Some(Incomplete { reason }),
                _ => None,
            },
            model: self.model.as_deref().unwrap_or(&self.meta.slug),
            output: if outcome.is_some() { &self.items } else { &[] },
            usage: usage.map(UsageOut::from),
            provider: &self.meta.provider,
            echo: &self.meta.echo,
        }
    }

    /// Writes `response.created` and `response.in_progress` before anything else.
    pub(super) fn start(&mut self, id: Option<&str>, out: &mut Vec<u8>) {
        if self.ids.is_some() {
            return;
        }
        self.ids = Some(Ids::new(id, &self.meta.fallback_id));
        for name in ["response.created", "response.in_progress"] {
            lifecycle(out, self.seq, name, &self.snapshot(None, None), None);
            self.seq += 1;
        }
    }

    /// Opens a new item at the end of the output (the previous one closes first).
    pub(super) fn push_item(
        &mut self,
        out: &mut Vec<u8>,
        make: impl FnOnce(&Ids, usize) -> OutItem,
    ) -> usize {
        self.close(out, "completed");
        let index = self.items.len();
        let item = match &self.ids {
            Some(ids) => make(ids, index),
            None => make(&Ids::new(None, &self.meta.fallback_id), index),
        };
        self.items.push(item);
        self.open = Some(index);
        index
    }

    pub(super) fn text(&mut self, text: &str, out: &mut Vec<u8>) {
        if text.is_empty() {
            return;
        }
        let index = match self.open {
            Some(i) if matches!(self.items.get(i), Some(OutItem::Message { .. })) => i,
            _ => {
                let i = self.push_item(out, |ids, i| {
                    OutItem::message(ids.item("msg", i), "in_progress")
                });
                // The item is announced without content, then its one text part.
                self.texts.push((i, self.chars));
                self.added(i, out);
                if let Some(OutItem::Message { id, content, .. }) = self.items.get_mut(i) {
                    content.push(OutputText::new(String::new()));
                    if let Some(part) = content.first() {
                        let ev = PartEvent {
                            item_id: id,
                            output_index: i,
                            content_index: 0,
                            part,
                        };
                        frame(out, &mut self.seq, "response.content_part.added", ev);
                    }
                }
                i
            }
        };
        if let Some(OutItem::Message { content, .. }) = self.items.get_mut(index) {
            if let Some(part) = content.first_mut() {
                part.text.push_str(text);
            }
        }
        self.chars += text.chars().count() as u32;
        let ev = TextDelta {
            item_id: item_id(&self.items, index),
            output_index: index,
            content_index: 0,
            delta: text,
            logprobs: [],
        };
        frame(out, &mut self.seq, "response.output_text.delta", ev);
    }

    pub(super) fn thinking(&mut self, text: &str, out: &mut Vec<u8>) {
        if text.is_empty() {
            return;
        }
        let index = match self.open {
            Some(i) if self.items.get(i).is_some_and(OutItem::open_reasoning) => i,
            _ => self.push_item(out, |ids, i| OutItem::reasoning(ids.item("rs", i))),
        };
        if let Some(it) = self.items.get_mut(index) {
            it.add_thinking(text);
        }
    }

    /// A signature closes the reasoning item open before it (one with a summary:
    /// a signature on its own, as Gemini puts on a call, has nothing to sign).
    pub(super) fn signed(&mut self, signature: &str, out: &mut Vec<u8>) {
        let Some(i) = self.open else {
            return;
        };
        let Some(it) = self.items.get_mut(i).filter(|it| it.open_reasoning()) else {
            return;
        };
        it.set_signed(signature);
        if !it.open_reasoning() {
            self.close(out, "completed");
        }
    }

    pub(super) fn encrypted(&mut self, data: &str, id: Option<&str>, out: &mut Vec<u8>) {
        let index = match self.open {
            Some(i) if self.items.get(i).is_some_and(OutItem::open_reasoning) => i,
            _ => self.push_item(out, |ids, i| OutItem::reasoning(ids.item("rs", i))),
        };
        if let Some(it) = self.items.get_mut(index) {
            it.set_encrypted(data, id);
        }
        self.close(out, "completed");
    }

    pub(super) fn tool_start(&mut self, index: u32, call_id: &str, name: &str, out: &mut Vec<u8>) {
        let i = self.push_item(out, |ids, i| OutItem::FunctionCall {
            id: ids.item("fc", i),
            call_id: call_id.to_string(),
            name: name.to_string(),
            arguments: String::new(),
            status: "in_progress",
        });
        self.calls.push((index, i));
        self.added(i, out);
    }

    pub(super) fn tool_args(&mut self, index: u32, args: &str, out: &mut Vec<u8>) {
        let Some(&(_, i)) = self.calls.iter().rev().find(|(c, _)| *c == index) else {
            return;
        };
        if let Some(OutItem::FunctionCall { arguments, .. }) = self.items.get_mut(i) {
            arguments.push_str(args);
        }
        // A call that already closed keeps the late pieces in the final response.
        if self.open == Some(i) && !args.is_empty() {
            let ev = ArgsDelta {
                item_id: item_id(&self.items, i),
                output_index: i,
                delta: args,
            };
            frame(
                out,
                &mut self.seq,
                "response.function_call_arguments.delta",
                ev,
            );
        }
    }

    pub(super) fn added(&mut self, index: usize, out: &mut Vec<u8>) {
        if let Some(item) = self.items.get(index) {
            let ev = ItemEvent {
                output_index: index,
                item,
            };
            frame(out, &mut self.seq, "response.output_item.added", ev);
        }
    }

    /// Closes the open item with its done events.
    pub(super) fn close(&mut self, out: &mut Vec<u8>, status: &'static str) {
        let Some(index) = self.open.take() else {
            return;
        };
        let Some(item) = self.items.get_mut(index) else {
            return;
        };
        item.set_status(status);
        let seq = &mut self.seq;
        match &*item {
            OutItem::Message { id, content, .. } => {
                if let Some(part) = content.first() {
                    let done = TextDone {
                        item_id: id,
                        output_index: index,
                        content_index: 0,
                        text: &part.text,
                        logprobs: [],
                    };
                    frame(out, seq, "response.output_text.done", done);
                    let ev = PartEvent {
                        item_id: id,
                        output_index: index,
                        content_index: 0,
                        part,
                    };
                    frame(out, seq, "response.content_part.done", ev);
                }
            }
            OutItem::FunctionCall {
                id,
                name,
                arguments,
                ..
            } => {
                let ev = ArgsDone {
                    item_id: id,
                    output_index: index,
                    name,
                    arguments,
                };
                frame(out, seq, "response.function_call_arguments.done", ev);
            }
            // Written whole when it was added.
            OutItem::WebSearchCall { .. } => return,
            OutItem::Reasoning { id, summary, .. } => {
                // Written whole now that its id is final.
                let ev = ItemEvent {
                    output_index: index,
                    item: &OutItem::Reasoning {
                        id: id.clone(),
                        summary: Vec::new(),
                        encrypted_content: None,
                    },
                };
                frame(out, seq, "response.output_item.added", ev);
                let empty = SummaryText {
                    kind: "summary_text",
                    text: String::new(),
                };
                for (j, part) in summary.iter().enumerate() {
                    let added = SummaryPartEvent {
                        item_id: id,
                        output_index: index,
                        summary_index: j,
                        part: &empty,
                    };
                    frame(out, seq, "response.reasoning_summary_part.added", added);
                    let delta = SummaryDelta {
                        item_id: id,
                        output_index: index,
                        summary_index: j,
                        delta: &part.text,
                    };
                    frame(out, seq, "response.reasoning_summary_text.delta", delta);
                    let done = SummaryDone {
                        item_id: id,
                        output_index: index,
                        summary_index: j,
                        text: &part.text,
                    };
                    frame(out, seq, "response.reasoning_summary_text.done", done);
                    let done = SummaryPartEvent {
                        item_id: id,
                        output_index: index,
                        summary_index: j,
                        part,
                    };
                    frame(out, seq, "response.reasoning_summary_part.done", done);
                }
            }
        }
        let ev = ItemEvent {
            output_index: index,
            item,
        };
        frame(out, seq, "response.output_item.done", ev);
    }
}

impl StreamEncoder for Encoder {
    fn event(&mut self, ev: &Event, out: &mut Vec<u8>) {
        match ev {
            Event::Start { id, model } => {
                if model.is_some() {
                    self.model.clone_from(model);
                }
                self.start(id.as_deref(), out);
                return;
            }
            _ => self.start(None, out),
        }
        match ev {
            Event::Text { text } => self.text(text, out),
            Event::Thinking { text } => self.thinking(text, out),
            Event::EncryptedReasoning { data, id } => self.encrypted(data, id.as_deref(), out),
            Event::ThinkingSignature { signature } => self.signed(signature, out),
            Event::ToolCallStart { index, id, name } => self.tool_start(*index, id, name, out),
            Event::ToolCallArgs { index, arguments } => self.tool_args(*index, arguments, out),
            Event::Finish { reason, .. } => self.finish = Some(*reason),
            Event::ServerSearch(s) => self.search(s, out),
            Event::Citation(c) => self.cite(c, out),
            // Usage comes whole with the tail; refusals and errors are settled by
            // the gateway.
            Event::Usage(_) | Event::Refusal { .. } | Event::Error { .. } | Event::Start { .. } => {
            }
        }
    }

    fn end(&mut self, tail: &Tail, out: &mut Vec<u8>) {
        self.start(None, out);
        let outcome = Outcome::of(self.finish, tail.cut);
        // The item still open is where the answer stopped.
        self.close(out, outcome.status());
        let name = match outcome {
            Outcome::Completed => "response.completed",
            Outcome::Incomplete(_) => "response.incomplete",
        };
        let obj = self.snapshot(Some(outcome), Some(&tail.usage));
        lifecycle(out, self.seq, name, &obj, Some(tail));
        self.seq += 1;
    }
}

/// The `error` event that ends a stream whose header already went out. No
/// response event was written before it (after the commit a failure settles as a
/// cut), so it is the first in sequence.
pub fn error_frame(err: &ApiError) -> Vec<u8> {
    let mut v = err.to_value(Format::OpenAi);
    let mut obj = match v.get_mut("error").map(serde_json::Value::take) {
        Some(serde_json::Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    obj.insert("type".into(), "error".into());
    obj.insert("sequence_number".into(), 0.into());
    let data = serde_json::to_vec(&obj).unwrap_or_default();
    crate::sse::named_frame("error", &data)
}
