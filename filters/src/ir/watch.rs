//! `tool_search` calls in a model's answer, when the gateway serves the tool
//! search: held back from the client while rounds are left, turned into text once
//! the budget is spent ([`Watch`]).

use super::response::{Collector, Response};
use super::search::TOOL_SEARCH;
use super::stream::{Event, FinishReason};

/// Watches one model call of a request whose tool search the gateway serves:
/// `tool_search` calls are taken out of what reaches the client, so the gateway
/// can run the search and call the model again. Once the search budget is spent
/// (or a real tool call already went to the client), a `tool_search` call becomes
/// text saying so instead: the caller never sees a call of a tool it does not
/// have.
pub struct Watch {
    /// Text written in place of a call that cannot be served; `None` while
    /// rounds are left.
    spent: Option<String>,
    /// Everything the call said, for the search round.
    turn: Collector,
    /// Indexes of `tool_search` calls held back.
    held: Vec<u32>,
    /// Indexes of `tool_search` calls turned into text.
    voided: Vec<u32>,
    /// A call of a real tool went to the client.
    real_call: bool,
}

impl Watch {
    /// A watch while search rounds are left.
    pub fn live() -> Self {
        Watch::new(None)
    }

    /// A watch on the last call: a `tool_search` call becomes `note`.
    pub fn spent(note: String) -> Self {
        Watch::new(Some(note))
    }

    fn new(spent: Option<String>) -> Self {
        Watch {
            spent,
            turn: Collector::default(),
            held: Vec::new(),
            voided: Vec::new(),
            real_call: false,
        }
    }

    /// Filters one batch of decoded events in place.
    pub fn filter(&mut self, events: &mut Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let mut kept = Vec::with_capacity(events.len());
        for ev in events.drain(..) {
            self.turn.push(&ev);
            match &ev {
                Event::ToolCallStart { index, name, .. } if name == TOOL_SEARCH => {
                    match (&self.spent, self.real_call) {
                        (None, false) => self.held.push(*index),
                        (note, _) => {
                            self.voided.push(*index);
                            let text = note.clone().unwrap_or_else(|| {
                                "(tool_search can only be called before any other tool.)"
                                    .to_string()
                            });
                            kept.push(Event::Text { text });
                        }
                    }
                }
                Event::ToolCallStart { .. } => {
                    self.real_call = true;
                    kept.push(ev);
                }
                Event::ToolCallArgs { index, .. }
                    if self.held.contains(index) || self.voided.contains(index) => {}
                Event::Finish {
                    reason: FinishReason::ToolCalls,
                    ..
                } if !self.real_call => {
                    // The turn ended to call tool_search: a round follows (held),
                    // or the turn ends as text (voided).
                    if self.held.is_empty() {
                        kept.push(Event::Finish {
                            reason: FinishReason::Stop,
                            raw: None,
                            stop_sequence: None,
                        });
                    }
                }
                _ => kept.push(ev),
            }
        }
        *events = kept;
    }

    /// A `tool_search` call was held back: a search round follows this call.
    pub fn round(&self) -> bool {
        !self.held.is_empty()
    }

    /// The call ended (its finish was seen): its `tool_search` calls are whole.
    pub fn finished(&self) -> bool {
        self.turn.response().finish.is_some()
    }

    /// What the call said, whole (its `tool_search` calls included).
    pub fn turn(self) -> Response {
        self.turn.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Part;

    #[test]
    fn the_watch_holds_tool_search_calls_and_voids_them_once_spent() {
        let call = |name: &str| Event::ToolCallStart {
            index: 0,
            id: "c0".into(),
            name: name.into(),
        };
        let args = Event::ToolCallArgs {
            index: 0,
            arguments: r#"{"query":"weather"}"#.into(),
        };
        let finish = Event::Finish {
            reason: FinishReason::ToolCalls,
            raw: None,
            stop_sequence: None,
        };
        let mut w = Watch::live();
        let mut evs = vec![call(TOOL_SEARCH), args.clone(), finish.clone()];
        w.filter(&mut evs);
        assert!(evs.is_empty(), "{evs:?}");
        assert!(w.round());
        let turn = w.turn();
        assert!(matches!(&turn.parts[0], Part::ToolCall { name, .. } if name == TOOL_SEARCH));

        let mut w = Watch::spent("budget spent".into());
        let mut evs = vec![call(TOOL_SEARCH), args.clone(), finish.clone()];
        w.filter(&mut evs);
        assert!(!w.round());
        assert_eq!(
            evs,
            vec![
                Event::Text {
                    text: "budget spent".into()
                },
                Event::Finish {
                    reason: FinishReason::Stop,
                    raw: None,
                    stop_sequence: None
                }
            ]
        );

        // A real call passes; a later tool_search call in the same turn is voided.
        let mut w = Watch::live();
        let mut evs = vec![call("get_weather"), finish.clone()];
        w.filter(&mut evs);
        assert_eq!(evs.len(), 2);
        let mut evs = vec![Event::ToolCallStart {
            index: 1,
            id: "c1".into(),
            name: TOOL_SEARCH.into(),
        }];
        w.filter(&mut evs);
        assert!(!w.round());
        assert!(matches!(&evs[0], Event::Text { .. }));
    }
}
