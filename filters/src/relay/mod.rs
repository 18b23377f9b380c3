//! Answers of a rung that speaks the client's own format (a responses client on
//! OpenAI's responses API, a messages client on Anthropic's messages API) go to the
//! client as the provider sent them: every event and every field, the ones sluice
//! does not model included (citations, server tool events, fields added later).
//! Only what the contract makes the gateway's is set: `provider`, `usage.cost`, the
//! receipt (`x_gateway`) and the disclosure of dropped fields. A stream the
//! provider did not finish is closed here, in the format's own terms.

use crate::inbound::history::TurnAsk;
use crate::inbound::{messages, responses};
use crate::ir::{Collector, Event, Meta, Tail, IGNORED_MEMBER, RECEIPT_MEMBER};
use crate::json::edit::{set_member, set_nested};
use crate::usage::Usage;
use serde::Deserialize;

mod items;

/// The client format both sides speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Responses,
    Messages,
}

/// What the gateway sets in the provider's answer.
pub struct Owned<'a> {
    /// The serving rung's id as a JSON string.
    pub provider: &'a [u8],
    /// The usage so far, priced: its cost is `usage.cost`.
    pub usage: Option<Usage>,
    /// The receipt object, as JSON.
    pub receipt: &'a [u8],
    pub ignored: Option<&'a str>,
    /// The answer is a responses object: the web searches the provider ran are
    /// counted in `usage.server_tool_use_details` (messages answers count them in
    /// Anthropic's own `usage.server_tool_use`).
    pub count_searches: bool,
    /// Responses: what the client asked of continuation and storage. The provider
    /// was asked to store nothing and continue nothing (the gateway does both), so
    /// its echo of `store` and `previous_response_id` is replaced by the client's.
    pub turn: Option<&'a TurnAsk>,
}

impl Owned<'_> {
    /// `object` (a response object, or an event holding one at `path`) with the
    /// client's `store` and `previous_response_id` in place of the provider's.
    fn echo_turn(&self, object: Vec<u8>, path: &[&str]) -> Vec<u8> {
        let Some(turn) = self.turn else {
            return object;
        };
        let store: &[u8] = if turn.store { b"true" } else { b"false" };
        let previous = serde_json::to_vec(&turn.previous).unwrap_or_else(|_| b"null".to_vec());
        let mut out = object;
        for (key, value) in [("store", store), ("previous_response_id", &previous)] {
            out = if path.is_empty() {
                set_member(&out, key, value)
            } else {
                match set_nested(&out, path, key, value) {
                    Some(o) => o,
                    None => out,
                }
            };
        }
        out
    }

    fn cost(&self) -> Option<Vec<u8>> {
        serde_json::to_vec(&self.usage?.cost_usd()?).ok()
    }

    /// `usage.server_tool_use_details` of a responses answer whose provider
    /// searched.
    fn searches(&self) -> Option<Vec<u8>> {
        let n = self.usage?.web_search_requests;
        (self.count_searches && n > 0)
            .then(|| format!(r#"{{"web_search_requests":{n}}}"#).into_bytes())
    }

    /// `object` with the members a finished answer carries.
    fn finals(&self, object: &[u8]) -> Vec<u8> {
        let mut out = set_member(object, RECEIPT_MEMBER, self.receipt);
        if let Some(ignored) = self.ignored {
            let v = serde_json::to_vec(ignored).unwrap_or_default();
            out = set_member(&out, IGNORED_MEMBER, &v);
        }
        out
    }
}

/// A whole answer: the provider's object with `provider`, `usage.cost`, the
/// receipt and the disclosure set (the same members in both formats).
pub fn whole(body: &[u8], owned: &Owned) -> Vec<u8> {
    let mut out = owned.echo_turn(set_member(body, "provider", owned.provider), &[]);
    if let Some(cost) = owned.cost() {
        if let Some(priced) = set_nested(&out, &["usage"], "cost", &cost) {
            out = priced;
        }
    }
    if let Some(n) = owned.searches() {
        if let Some(counted) = set_nested(&out, &["usage"], "server_tool_use_details", &n) {
            out = counted;
        }
    }
    owned.finals(&out)
}

/// The members of a stream event the relay reads.
#[derive(Deserialize, Default)]
struct Head<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    sequence_number: Option<u64>,
    #[serde(default)]
    index: Option<u64>,
    // Responses: where an event's item is, and its text.
    #[serde(default)]
    output_index: Option<u64>,
    #[serde(default)]
    content_index: Option<u64>,
    #[serde(default)]
    summary_index: Option<u64>,
    #[serde(borrow, default)]
    delta: Option<std::borrow::Cow<'a, str>>,
}

/// One stream's relay: each upstream frame is rewritten as it passes.
pub struct Relay {
    kind: Kind,
    /// The provider's closing event went out (`message_stop`;
    /// `response.completed` or `response.incomplete`).
    ended: bool,
    /// Messages: the `message_delta` carrying the stop reason went out.
    finished: bool,
    /// Messages: indexes of content blocks opened and not yet closed.
    open: Vec<u64>,
    /// Responses: the sequence number the next event of ours takes.
    next_seq: u64,
    /// Responses: the answer so far, for the closing snapshot of a cut.
    collected: Collector,
    /// Responses: the output items as the provider announced them, to close a cut.
    items: items::Items,
}

impl Relay {
    pub fn new(kind: Kind) -> Self {
        Relay {
            kind,
            ended: false,
            finished: false,
            open: Vec::new(),
            next_seq: 0,
            collected: Collector::default(),
            items: items::Items::default(),
        }
    }

    /// Sees one decoded event of the stream (what a cut's closing snapshot shows).
    pub fn observe(&mut self, ev: &Event) {
        if self.kind == Kind::Responses {
            self.collected.push(ev);
        }
    }

    /// Appends the frame for the client: the upstream frame named `name` with
    /// `data`, its owned members set. An in-band error or failure is not passed on:
    /// after the commit the gateway settles such a stream as a cut.
    pub fn frame(&mut self, name: Option<&str>, data: &[u8], owned: &Owned, out: &mut Vec<u8>) {
        // Anthropic names every event, so a text delta is passed on unread; the
        // responses stream's sequence numbers are read from every event.
        let read_head = self.kind == Kind::Responses
            || !matches!(name, Some(n) if !n.starts_with("content_block_s"));
        let head: Head = if read_head {
            serde_json::from_slice(data).unwrap_or_default()
        } else {
            Head::default()
        };
        let kind = name.or(head.kind.as_deref()).unwrap_or_default();
        if let Some(seq) = head.sequence_number {
            self.next_seq = self.next_seq.max(seq + 1);
        }
        if self.kind == Kind::Responses && !self.ended {
            let place = items::Place {
                output_index: head.output_index,
                content_index: head.content_index,
                summary_index: head.summary_index,
                delta: head.delta.clone(),
            };
            self.items.observe(kind, data, &place);
        }
        let edited = match (self.kind, kind) {
            (_, "error") | (Kind::Responses, "response.failed") => return,
            (Kind::Messages, "message_start") => {
                set_nested(data, &["message"], "provider", owned.provider)
            }
            (Kind::Messages, "content_block_start") => {
                self.open.extend(head.index);
                None
            }
            (Kind::Messages, "content_block_stop") => {
                self.open.retain(|i| Some(*i) != head.index);
                None
            }
            (Kind::Messages, "message_delta") => {
                self.finished = true;
                let priced = owned
                    .cost()
                    .and_then(|c| set_nested(data, &["usage"], "cost", &c));
                Some(owned.finals(priced.as_deref().unwrap_or(data)))
            }
            (Kind::Messages, "message_stop") => {
                self.ended = true;
                None
            }
            (Kind::Responses, "response.created" | "response.in_progress" | "response.queued") => {
                set_nested(data, &["response"], "provider", owned.provider)
                    .map(|d| owned.echo_turn(d, &["response"]))
            }
            (Kind::Responses, "response.completed" | "response.incomplete") => {
                self.ended = true;
                Some(self.final_response(data, owned))
            }
            _ => None,
        };
        push_frame(out, name, edited.as_deref().unwrap_or(data));
    }

    /// A final responses event with the owned members of its `response`.
    fn final_response(&self, data: &[u8], owned: &Owned) -> Vec<u8> {
        let mut out = set_nested(data, &["response"], "provider", owned.provider)
            .unwrap_or_else(|| data.to_vec());
        out = owned.echo_turn(out, &["response"]);
        if let Some(cost) = owned.cost() {
            if let Some(priced) = set_nested(&out, &["response", "usage"], "cost", &cost) {
                out = priced;
            }
        }
        if let Some(n) = owned.searches() {
            let path = ["response", "usage"];
            if let Some(counted) = set_nested(&out, &path, "server_tool_use_details", &n) {
                out = counted;
            }
        }
        if let Some(r) = set_nested(&out, &["response"], RECEIPT_MEMBER, owned.receipt) {
            out = r;
        }
        if let Some(ignored) = owned.ignored {
            let v = serde_json::to_vec(ignored).unwrap_or_default();
            if let Some(d) = set_nested(&out, &["response"], IGNORED_MEMBER, &v) {
                out = d;
            }
        }
        out
    }

    /// Whether the provider's own closing event went out.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The frames that close the stream after the provider's last one: nothing
    /// when its own closing event went out; the end marker after a finish; else
    /// the closing events of an answer cut short (`cut`: stopped by the budget, as
    /// SPEC's cut rule says).
    pub fn end(&mut self, owned: &Owned, meta: &Meta, cut: bool, out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        match self.kind {
            Kind::Messages if self.finished => {
                push_frame(out, Some("message_stop"), br#"{"type":"message_stop"}"#)
            }
            Kind::Messages => {
                for index in std::mem::take(&mut self.open) {
                    let stop = format!(r#"{{"type":"content_block_stop","index":{index}}}"#);
                    push_frame(out, Some("content_block_stop"), stop.as_bytes());
                }
                let stop = if cut { "max_tokens" } else { "end_turn" };
                let mut delta = format!(
                    r#"{{"type":"message_delta","delta":{{"stop_reason":"{stop}","stop_sequence":null}},"usage":"#
                )
                .into_bytes();
                messages::put_usage(&mut delta, owned.usage.unwrap_or_default());
                delta.push(b'}');
                push_frame(out, Some("message_delta"), &owned.finals(&delta));
                push_frame(out, Some("message_stop"), br#"{"type":"message_stop"}"#);
            }
            Kind::Responses => {
                // Every item the provider added is done before the terminal event.
                let output = (!self.items.is_empty()).then(|| {
                    self.items.close(&mut self.next_seq, |name, data| {
                        push_frame(out, Some(name), data)
                    })
                });
                let resp = std::mem::take(&mut self.collected).finish();
                let tail = Tail {
                    usage: owned.usage.unwrap_or_default(),
                    cut,
                    receipt: String::from_utf8_lossy(owned.receipt).into_owned(),
                    ignored: owned.ignored.map(str::to_string),
                };
                let mut object = responses::render(&resp, meta, &tail);
                object = set_member(&object, "provider", owned.provider);
                if let Some(output) = output {
                    let list = serde_json::to_vec(&output).unwrap_or_else(|_| b"[]".to_vec());
                    object = set_member(&object, "output", &list);
                }
                let name = if object_status(&object) == "completed" {
                    "response.completed"
                } else {
                    "response.incomplete"
                };
                let mut data = format!(
                    r#"{{"type":"{name}","sequence_number":{},"response":"#,
                    self.next_seq
                )
                .into_bytes();
                data.extend_from_slice(&object);
                data.push(b'}');
                self.next_seq += 1;
                push_frame(out, Some(name), &data);
            }
        }
        self.ended = true;
    }
}

/// The `status` of a response object the gateway rendered.
fn object_status(object: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Status {
        status: String,
    }
    serde_json::from_slice::<Status>(object).map_or_else(|_| String::new(), |s| s.status)
}

fn push_frame(out: &mut Vec<u8>, name: Option<&str>, data: &[u8]) {
    if let Some(n) = name {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(n.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn owned(usage: Option<Usage>) -> Owned<'static> {
        Owned {
            provider: br#""anthropic:c1""#,
            usage,
            receipt: br#"{"attempts":"anthropic:ok","overhead_us":7}"#,
            ignored: Some("top_k"),
            count_searches: false,
            turn: None,
        }
    }

    fn priced() -> Usage {
        Usage {
            input_tokens: 10,
            output_tokens: 5,
            cost_micro_usd: Some(250),
            ..Usage::default()
        }
    }

    fn frames(out: &[u8]) -> Vec<(Option<String>, Value)> {
        String::from_utf8_lossy(out)
            .split("\n\n")
            .filter(|f| !f.is_empty())
            .map(|f| {
                let name = f
                    .lines()
                    .find_map(|l| l.strip_prefix("event: "))
                    .map(str::to_string);
                let data = f.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
                (name, serde_json::from_str(data).unwrap())
            })
            .collect()
    }

    #[test]
    fn unmodelled_events_and_fields_pass_untouched() {
        let mut r = Relay::new(Kind::Messages);
        let mut out = Vec::new();
        let o = owned(None);
        let citation = br#"{"type":"content_block_delta","index":1,"delta":{"type":"citations_delta","citation":{"type":"web_search_result_location","url":"https://a.example","cited_text":"x"}}}"#;
        let server = br#"{"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{}}}"#;
        r.frame(Some("content_block_start"), server, &o, &mut out);
        r.frame(Some("content_block_delta"), citation, &o, &mut out);
        let mut want = Vec::new();
        push_frame(&mut want, Some("content_block_start"), server);
        push_frame(&mut want, Some("content_block_delta"), citation);
        assert_eq!(out, want, "byte for byte");
    }

    #[test]
    fn messages_get_provider_cost_and_receipt_and_a_cut_is_closed() {
        let mut r = Relay::new(Kind::Messages);
        let mut out = Vec::new();
        let o = owned(Some(priced()));
        r.frame(
            Some("message_start"),
            br#"{"type":"message_start","message":{"id":"msg_1","model":"c1","usage":{"input_tokens":10,"output_tokens":1},"future_field":true}}"#,
            &o,
            &mut out,
        );
        r.frame(
            Some("content_block_start"),
            br#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            &o,
            &mut out,
        );
        r.end(&o, &Meta::default(), true, &mut out);
        let f = frames(&out);
        assert_eq!(f[0].1["message"]["provider"], "anthropic:c1");
        assert_eq!(f[0].1["message"]["future_field"], true);
        assert_eq!(
            f[2],
            (
                Some("content_block_stop".into()),
                json!({"type":"content_block_stop","index":0})
            )
        );
        assert_eq!(f[3].1["delta"]["stop_reason"], "max_tokens");
        assert_eq!(f[3].1["usage"]["cost"], 0.00025);
        assert_eq!(f[3].1["x_gateway"]["attempts"], "anthropic:ok");
        assert_eq!(f[3].1["x-service-ignored-parameters"], "top_k");
        assert_eq!(f[4].0.as_deref(), Some("message_stop"));
        assert_eq!(f.len(), 5);
        // The provider's own finish: its delta gets the owned members, and a
        // missing message_stop is all that is added.
        let mut r = Relay::new(Kind::Messages);
        let mut out = Vec::new();
        r.frame(
            Some("message_delta"),
            br#"{"type":"message_delta","delta":{"stop_reason":"stop_sequence","stop_sequence":"END"},"usage":{"output_tokens":5}}"#,
            &o,
            &mut out,
        );
        r.end(&o, &Meta::default(), false, &mut out);
        let f = frames(&out);
        assert_eq!(f[0].1["delta"]["stop_sequence"], "END");
        assert_eq!(f[0].1["usage"]["cost"], 0.00025);
        assert_eq!(f[1].0.as_deref(), Some("message_stop"));
        assert_eq!(f.len(), 2, "exactly one finish");
        // Errors are the gateway's to settle.
        let mut out = Vec::new();
        r.frame(
            Some("error"),
            br#"{"type":"error","error":{"type":"overloaded_error"}}"#,
            &o,
            &mut out,
        );
        assert!(out.is_empty());
    }

    #[test]
    fn responses_final_events_carry_the_owned_members_and_a_cut_gets_one() {
        let o = owned(Some(priced()));
        let mut r = Relay::new(Kind::Responses);
        let mut out = Vec::new();
        r.frame(
            Some("response.created"),
            br#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","status":"in_progress","usage":null}}"#,
            &o,
            &mut out,
        );
        r.frame(
            Some("response.completed"),
            br#"{"type":"response.completed","sequence_number":7,"response":{"id":"resp_1","status":"completed","usage":{"input_tokens":10,"output_tokens":5},"output":[{"type":"web_search_call","id":"ws_1"}]}}"#,
            &o,
            &mut out,
        );
        r.end(&o, &Meta::default(), false, &mut out);
        let f = frames(&out);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].1["response"]["provider"], "anthropic:c1");
        let done = &f[1].1["response"];
        assert_eq!(done["usage"]["cost"], 0.00025);
        assert_eq!(done["x_gateway"]["overhead_us"], 7);
        assert_eq!(done["output"][0]["type"], "web_search_call");
        // Cut after some text: one response.incomplete, numbered after the last.
        let mut r = Relay::new(Kind::Responses);
        let mut out = Vec::new();
        r.frame(
            Some("response.output_text.delta"),
            br#"{"type":"response.output_text.delta","sequence_number":4,"delta":"Hel"}"#,
            &o,
            &mut out,
        );
        r.observe(&Event::Start {
            id: Some("resp_9".into()),
            model: Some("m".into()),
        });
        r.observe(&Event::Text { text: "Hel".into() });
        r.end(&o, &Meta::default(), true, &mut out);
        let f = frames(&out);
        assert_eq!(f[1].0.as_deref(), Some("response.incomplete"));
        assert_eq!(f[1].1["sequence_number"], 5);
        assert_eq!(f[1].1["response"]["status"], "incomplete");
        assert_eq!(f[1].1["response"]["provider"], "anthropic:c1");
        assert_eq!(f[1].1["response"]["usage"]["cost"], 0.00025);
    }

    #[test]
    fn whole_answers_keep_every_field() {
        let body = br#"{"id":"msg_1","type":"message","content":[{"type":"text","text":"hi","citations":[{"url":"u"}]}],"stop_sequence":"END","usage":{"input_tokens":10,"output_tokens":5,"server_tool_use":{"web_search_requests":1}}}"#;
        let v: Value = serde_json::from_slice(&whole(body, &owned(Some(priced())))).unwrap();
        assert_eq!(v["content"][0]["citations"][0]["url"], "u");
        assert_eq!(v["stop_sequence"], "END");
        assert_eq!(v["usage"]["server_tool_use"]["web_search_requests"], 1);
        assert_eq!(v["usage"]["cost"], 0.00025);
        assert_eq!(v["provider"], "anthropic:c1");
        assert_eq!(v["x_gateway"]["attempts"], "anthropic:ok");
    }
}
