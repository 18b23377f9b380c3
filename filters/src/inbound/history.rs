//! A responses conversation as the gateway keeps it: the items of one turn (its
//! input as the client gave it, its output as items the client could replay), and
//! a request body with a stored history put in front of its own input.
//!
//! Continuation (`previous_response_id`) is served by rebuilding the whole
//! conversation and sending it to the serving rung as input, whatever its maker:
//! upstream never stores anything. Stored output items are the response's output
//! in the input-item shapes the responses API documents, with only what a replay
//! needs (an `id` only where the maker needs it: a reasoning item's).

use crate::json::Member;
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// What a responses body says about continuation and storage, read from its
/// top-level members before anything else.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnAsk {
    /// `store` (default true).
    pub store: bool,
    /// `previous_response_id`, when given and not null.
    pub previous: Option<String>,
}

/// Reads `store` and `previous_response_id`; a value of the wrong type is left to
/// the format's parser, which names it.
pub fn turn_ask(members: &[Member<'_>]) -> TurnAsk {
    let last = |name: &str| members.iter().rev().find(|(k, _)| k == name).map(|m| m.1);
    TurnAsk {
        store: last("store").is_none_or(|v| v.get() != "false"),
        previous: last("previous_response_id")
            .and_then(|v| serde_json::from_str::<Option<String>>(v.get()).ok())
            .flatten(),
    }
}

/// The turn's input as a list of items: a string input is one user message item.
/// `None` when `input` is missing or neither a string nor an array (the parser
/// then refuses the body, naming it).
pub fn input_items(members: &[Member<'_>]) -> Option<Vec<Box<RawValue>>> {
    let input = members.iter().rev().find(|(k, _)| k == "input")?.1;
    if input.get().starts_with('"') {
        let text: String = serde_json::from_str(input.get()).ok()?;
        let item = json!({"type": "message", "role": "user", "content": text});
        return Some(vec![RawValue::from_string(item.to_string()).ok()?]);
    }
    serde_json::from_str::<Vec<Box<RawValue>>>(input.get()).ok()
}

/// The request body with `history` put in front of `own` (its own input items,
/// resolved), and `previous_response_id` removed.
pub fn with_history(
    members: &[Member<'_>],
    history: &[Box<RawValue>],
    own: &[Box<RawValue>],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        64 + history
            .iter()
            .chain(own)
            .map(|i| i.get().len() + 1)
            .sum::<usize>()
            + members
                .iter()
                .map(|(k, v)| k.len() + v.get().len() + 4)
                .sum::<usize>(),
    );
    out.push(b'{');
    let mut first = true;
    let mut put_key = |out: &mut Vec<u8>, k: &str| {
        if !first {
            out.push(b',');
        }
        first = false;
        out.extend_from_slice(serde_json::to_string(k).unwrap_or_default().as_bytes());
        out.push(b':');
    };
    for (k, v) in members {
        if k == "input" || k == "previous_response_id" {
            continue;
        }
        put_key(&mut out, k);
        out.extend_from_slice(v.get().as_bytes());
    }
    put_key(&mut out, "input");
    out.push(b'[');
    for (i, item) in history.iter().chain(own).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item.get().as_bytes());
    }
    out.extend_from_slice(b"]}");
    out
}

/// An input item that only the store can complete: a reference to a stored item,
/// or a reasoning item sent back without its encrypted content (clients that let
/// the provider keep reasoning server-side replay it that way).
#[derive(Clone, Debug, PartialEq)]
pub enum Replayed {
    Reference(String),
    BareReasoning(String),
}

/// The items of an input that need the store, by position. Cheap when there are
/// none: the input's text is searched before any item is read.
pub fn needs_store(input: &[Box<RawValue>]) -> Vec<(usize, Replayed)> {
    #[derive(serde::Deserialize)]
    struct Head<'a> {
        #[serde(rename = "type", borrow)]
        kind: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow)]
        id: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow)]
        encrypted_content: Option<&'a RawValue>,
    }
    let mut out = Vec::new();
    for (i, item) in input.iter().enumerate() {
        let text = item.get();
        if !(text.contains("item_reference") || text.contains("reasoning")) {
            continue;
        }
        let Ok(h) = serde_json::from_str::<Head>(text) else {
            continue;
        };
        let id = h.id.map(|c| c.into_owned());
        match (h.kind.as_deref(), id) {
            (Some("item_reference"), Some(id)) => out.push((i, Replayed::Reference(id))),
            (Some("reasoning"), Some(id))
                if h.encrypted_content.is_none_or(|c| c.get() == "null") =>
            {
                out.push((i, Replayed::BareReasoning(id)))
            }
            _ => {}
        }
    }
    out
}

/// Whether a stored reasoning item carries its encrypted content.
pub fn has_encrypted_content(item: &RawValue) -> bool {
    #[derive(serde::Deserialize)]
    struct E<'a> {
        #[serde(borrow)]
        encrypted_content: Option<&'a RawValue>,
    }
    serde_json::from_str::<E>(item.get())
        .is_ok_and(|e| e.encrypted_content.is_some_and(|c| c.get() != "null"))
}

/// A responses `input` without the reasoning items whose encrypted content the
/// gateway made (Anthropic's hidden reasoning, another maker's signed reasoning):
/// an OpenAI rung cannot take them back. `None` when nothing goes.
pub fn without_gateway_reasoning(input: &RawValue) -> Option<Box<RawValue>> {
    let items: Vec<&RawValue> = serde_json::from_str(input.get()).ok()?;
    #[derive(serde::Deserialize)]
    struct Kind<'a> {
        #[serde(rename = "type", borrow)]
        kind: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow)]
        encrypted_content: Option<std::borrow::Cow<'a, str>>,
    }
    let foreign = |item: &&RawValue| {
        serde_json::from_str::<Kind>(item.get()).is_ok_and(|k| {
            k.kind.as_deref() == Some("reasoning")
                && k.encrypted_content.is_some_and(|c| {
                    c.starts_with(super::responses::ANTHROPIC_REASONING)
                        || c.starts_with(super::responses::SIGNED_REASONING)
                })
        })
    };
    if !items.iter().any(foreign) {
        return None;
    }
    let kept: Vec<&RawValue> = items.into_iter().filter(|i| !foreign(i)).collect();
    RawValue::from_string(serde_json::to_string(&kept).ok()?).ok()
}

/// The final `response` object of an answer as the client received it: the body
/// of a whole answer, or the snapshot in a stream's last `response.completed`,
/// `response.incomplete` or `response.failed` event.
pub fn final_response(answer: &[u8], streamed: bool) -> Option<Value> {
    if !streamed {
        return serde_json::from_slice(answer).ok();
    }
    let mut dec = crate::sse::SseDecoder::new();
    dec.push(answer);
    let mut last = None;
    while let Some(ev) = dec.next_event() {
        let named = ev.event.as_deref().unwrap_or_default();
        if matches!(
            named,
            "response.completed" | "response.incomplete" | "response.failed"
        ) {
            last = Some(ev.data);
        }
    }
    let mut v: Value = serde_json::from_str(&last?).ok()?;
    Some(v.get_mut("response")?.take())
}

/// One output item as an input item a later turn replays: messages keep their
/// text, function calls their call, reasoning its summary and encrypted content
/// (with its id, which the maker needs). Other kinds (server tool calls) are left
/// out: they are not input items.
pub fn replayable(item: &Value) -> Option<Value> {
    match item.get("type")?.as_str()? {
        "message" => {
            let content: Vec<Value> = item
                .get("content")?
                .as_array()?
                .iter()
                .filter_map(|c| match c.get("type")?.as_str()? {
                    "output_text" => Some(json!({"type": "output_text", "text": c.get("text")?})),
                    "refusal" => Some(json!({"type": "refusal", "refusal": c.get("refusal")?})),
                    _ => None,
                })
                .collect();
            Some(json!({"type": "message", "role": "assistant", "content": content}))
        }
        "function_call" => Some(json!({
            "type": "function_call",
            "call_id": item.get("call_id")?,
            "name": item.get("name")?,
            "arguments": item.get("arguments")?,
        })),
        "reasoning" => {
            let mut r = json!({
                "type": "reasoning",
                "summary": item.get("summary").cloned().unwrap_or_else(|| json!([])),
            });
            for key in ["id", "encrypted_content"] {
                if let Some(v) = item.get(key).filter(|v| !v.is_null()) {
                    r[key] = v.clone();
                }
            }
            Some(r)
        }
        _ => None,
    }
}

/// A finished response as the store keeps it: its id, status, and the output items
/// a later turn replays, each with the id the answer gave it (an `item_reference`
/// names it).
#[derive(Clone, Debug, PartialEq)]
pub struct Answered {
    pub id: String,
    /// `completed` or `incomplete` (a cut stream, a spent budget).
    pub status: String,
    pub output: Vec<(Option<String>, Value)>,
}

/// Reads a finished response object; `None` when it has no id or is not a
/// response the client could continue from (failed).
pub fn answered(response: &Value) -> Option<Answered> {
    let status = response.get("status")?.as_str()?;
    if !matches!(status, "completed" | "incomplete") {
        return None;
    }
    Some(Answered {
        id: response.get("id")?.as_str()?.to_string(),
        status: status.to_string(),
        output: response
            .get("output")?
            .as_array()?
            .iter()
            .filter_map(|item| {
                let id = item.get("id").and_then(Value::as_str).map(str::to_string);
                Some((id, replayable(item)?))
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::split_object;

    #[test]
    fn a_string_input_becomes_one_user_message_after_the_history() {
        let body =
            r#"{"model":"m","input":"and now?","previous_response_id":"resp_1","store":true}"#;
        let members = split_object(body).unwrap();
        assert_eq!(
            turn_ask(&members),
            TurnAsk {
                store: true,
                previous: Some("resp_1".into())
            }
        );
        let history: Vec<Box<RawValue>> = serde_json::from_str(
            r#"[{"type":"message","role":"user","content":"hi"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hello"}]}]"#,
        )
        .unwrap();
        let own = input_items(&members).unwrap();
        let merged: Value =
            serde_json::from_slice(&with_history(&members, &history, &own)).unwrap();
        assert_eq!(
            merged,
            json!({"model":"m","store":true,"input":[
                {"type":"message","role":"user","content":"hi"},
                {"type":"message","role":"assistant","content":[{"type":"output_text","text":"hello"}]},
                {"type":"message","role":"user","content":"and now?"}
            ]})
        );
    }

    #[test]
    fn references_and_bare_reasoning_are_found_and_nothing_else() {
        let input: Vec<Box<RawValue>> = serde_json::from_str(
            r#"[{"type":"item_reference","id":"msg_1"},{"role":"user","content":"reasoning about it"},
                {"type":"reasoning","id":"rs_1","summary":[]},{"type":"reasoning","id":"rs_2","summary":[],"encrypted_content":"gA"},
                {"type":"reasoning","id":"rs_3","summary":[],"encrypted_content":null}]"#,
        )
        .unwrap();
        assert_eq!(
            needs_store(&input),
            vec![
                (0, Replayed::Reference("msg_1".into())),
                (2, Replayed::BareReasoning("rs_1".into())),
                (4, Replayed::BareReasoning("rs_3".into())),
            ]
        );
        assert!(has_encrypted_content(&input[3]));
        assert!(!has_encrypted_content(&input[4]));
    }

    #[test]
    fn store_defaults_to_true_and_a_null_previous_id_is_none() {
        let members = split_object(r#"{"previous_response_id":null,"input":[]}"#).unwrap();
        assert_eq!(
            turn_ask(&members),
            TurnAsk {
                store: true,
                previous: None
            }
        );
        let members = split_object(r#"{"store":false,"input":[]}"#).unwrap();
        assert!(!turn_ask(&members).store);
    }

    #[test]
    fn output_items_are_kept_in_their_replayable_input_shapes() {
        let resp = json!({"id":"resp_9","object":"response","status":"completed","output":[
            {"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"hm"}],"encrypted_content":"gAAA"},
            {"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi","annotations":[],"logprobs":[]}]},
            {"type":"function_call","id":"fc_1","call_id":"call_1","name":"f","arguments":"{}","status":"completed"},
            {"type":"web_search_call","id":"ws_1","status":"completed"}
        ]});
        let a = answered(&resp).unwrap();
        assert_eq!(a.id, "resp_9");
        let ids: Vec<Option<&str>> = a.output.iter().map(|(id, _)| id.as_deref()).collect();
        assert_eq!(ids, [Some("rs_1"), Some("msg_1"), Some("fc_1")]);
        let items: Vec<&Value> = a.output.iter().map(|(_, v)| v).collect();
        assert_eq!(
            items,
            [
                &json!({"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"hm"}],"encrypted_content":"gAAA"}),
                &json!({"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hi"}]}),
                &json!({"type":"function_call","call_id":"call_1","name":"f","arguments":"{}"}),
            ]
        );
        assert!(answered(&json!({"id":"r","status":"failed","output":[]})).is_none());
    }

    #[test]
    fn a_streams_last_snapshot_is_its_final_response() {
        let sse = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r1\",\"status\":\"in_progress\",\"output\":[]}}\n\n\
event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n\
event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r1\",\"status\":\"completed\",\"output\":[]}}\n\n";
        let r = final_response(sse, true).unwrap();
        assert_eq!(
            (&r["id"], &r["status"]),
            (&json!("r1"), &json!("completed"))
        );
        assert!(final_response(b"event: response.created\ndata: {}\n\n", true).is_none());
    }
}
