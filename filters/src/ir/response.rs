//! A whole answer, folded from its events.

use super::request::Part;
use super::search::{ServerSearch, UrlCitation};
use super::stream::{Event, FinishReason, RefusalReason};
use crate::usage::Usage;

/// A whole answer in canonical form.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Response {
    pub id: Option<String>,
    /// The model id the provider reported.
    pub model: Option<String>,
    /// Output in order: text, thinking, encrypted reasoning, tool calls.
    pub parts: Vec<Part>,
    pub finish: Option<FinishReason>,
    /// The provider's own finish string, for same-format rendering.
    pub finish_raw: Option<String>,
    /// The stop sequence that ended the turn, when the provider named it.
    pub stop_sequence: Option<String>,
    pub usage: Option<Usage>,
    pub refusal: Option<(RefusalReason, Option<String>)>,
    pub error: Option<String>,
    /// Sources the text cites (`url_citation`), in order.
    pub citations: Vec<UrlCitation>,
    /// Searches run on the server side for the answer.
    pub searches: Vec<ServerSearch>,
}

impl Response {
    /// Whether the answer carries content (text or a tool call).
    pub fn has_content(&self) -> bool {
        self.parts.iter().any(|p| match p {
            Part::Text { text } => !text.is_empty(),
            Part::ToolCall { .. } => true,
            _ => false,
        })
    }

    /// Folds events into one answer.
    pub fn from_events(events: &[Event]) -> Self {
        let mut c = Collector::default();
        for e in events {
            c.push(e);
        }
        c.finish()
    }
}

/// Folds a stream of events into a [`Response`]: adjacent text and thinking deltas
/// are joined, tool-call argument pieces are joined per call.
#[derive(Default)]
pub struct Collector {
    r: Response,
    /// Position in `parts` of each tool call, by its stream index.
    calls: Vec<(u32, usize)>,
}

impl Collector {
    pub fn push(&mut self, ev: &Event) {
        let r = &mut self.r;
        match ev {
            Event::Start { id, model } => {
                if id.is_some() {
                    r.id.clone_from(id);
                }
                if model.is_some() {
                    r.model.clone_from(model);
                }
            }
            Event::Text { text } => match r.parts.last_mut() {
                Some(Part::Text { text: t }) => t.push_str(text),
                _ => r.parts.push(Part::text(text.clone())),
            },
            Event::Thinking { text } => match r.parts.last_mut() {
                Some(Part::Thinking {
                    text: t,
                    signature: None,
                }) => t.push_str(text),
                _ => r.parts.push(Part::Thinking {
                    text: text.clone(),
                    signature: None,
                }),
            },
            Event::ThinkingSignature { signature } => match r.parts.last_mut() {
                Some(Part::Thinking { signature: s, .. }) => {
                    s.get_or_insert_with(String::new).push_str(signature)
                }
                _ => r.parts.push(Part::Thinking {
                    text: String::new(),
                    signature: Some(signature.clone()),
                }),
            },
            Event::EncryptedReasoning { data, id } => r.parts.push(Part::EncryptedReasoning {
                data: data.clone(),
                id: id.clone(),
            }),
            Event::ToolCallStart { index, id, name } => {
                self.calls.push((*index, r.parts.len()));
                r.parts.push(Part::ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: String::new(),
                });
            }
            Event::ToolCallArgs { index, arguments } => {
                if let Some(&(_, at)) = self.calls.iter().rev().find(|(i, _)| i == index) {
                    if let Some(Part::ToolCall { arguments: a, .. }) = r.parts.get_mut(at) {
                        a.push_str(arguments);
                    }
                }
            }
            Event::Refusal { reason, text } => r.refusal = Some((*reason, text.clone())),
            Event::Finish {
                reason,
                raw,
                stop_sequence,
            } => {
                r.finish = Some(*reason);
                r.finish_raw.clone_from(raw);
                r.stop_sequence.clone_from(stop_sequence);
            }
            Event::Usage(u) => r.usage = Some(*u),
            Event::Error { message } => r.error = Some(message.clone()),
            Event::Citation(c) => r.citations.push((**c).clone()),
            Event::ServerSearch(s) => r.searches.push((**s).clone()),
        }
    }

    pub fn response(&self) -> &Response {
        &self.r
    }

    pub fn finish(self) -> Response {
        self.r
    }
}
