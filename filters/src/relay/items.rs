//! A native responses stream's output items as the provider announced them, so
//! that a stream cut short is closed as OpenAI's stream rules require: every item
//! added is done (its text, parts and arguments too) before the terminal event,
//! and the terminal snapshot lists them, in order.

use serde::Deserialize;
use serde_json::{json, Value};

/// What the relay reads of an event that adds, extends or finishes an item.
#[derive(Deserialize, Default)]
pub(super) struct Place<'a> {
    #[serde(default)]
    pub(super) output_index: Option<u64>,
    #[serde(default)]
    pub(super) content_index: Option<u64>,
    #[serde(default)]
    pub(super) summary_index: Option<u64>,
    #[serde(borrow, default)]
    pub(super) delta: Option<std::borrow::Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Carried {
    #[serde(default)]
    item: Option<Value>,
    #[serde(default)]
    part: Option<Value>,
    #[serde(default)]
    annotation: Option<Value>,
}

struct Part {
    index: u64,
    value: Value,
    text: String,
    text_done: bool,
    done: bool,
}

struct Item {
    output_index: u64,
    value: Value,
    done: bool,
    parts: Vec<Part>,
    arguments: String,
}

/// The items of one stream.
#[derive(Default)]
pub(super) struct Items {
    items: Vec<Item>,
}

impl Items {
    fn item(&mut self, output_index: Option<u64>) -> Option<&mut Item> {
        let i = output_index?;
        self.items.iter_mut().rev().find(|it| it.output_index == i)
    }

    fn part(&mut self, place: &Place) -> Option<&mut Part> {
        let index = place.content_index.or(place.summary_index)?;
        let item = self.item(place.output_index)?;
        item.parts.iter_mut().rev().find(|p| p.index == index)
    }

    /// Sees one provider event of kind `kind` (`data`: its JSON; `place`: what was
    /// read of it already).
    pub(super) fn observe(&mut self, kind: &str, data: &[u8], place: &Place) {
        let carried = || serde_json::from_slice::<Carried>(data).ok();
        match kind {
            "response.output_item.added" => {
                if let (Some(i), Some(value)) = (place.output_index, carried().and_then(|c| c.item))
                {
                    self.items.push(Item {
                        output_index: i,
                        value,
                        done: false,
                        parts: Vec::new(),
                        arguments: String::new(),
                    });
                }
            }
            "response.output_item.done" => {
                let Some(value) = carried().and_then(|c| c.item) else {
                    return;
                };
                match self.item(place.output_index) {
                    Some(it) => {
                        it.value = value;
                        it.done = true;
                    }
                    None => self.items.push(Item {
                        output_index: place.output_index.unwrap_or(0),
                        value,
                        done: true,
                        parts: Vec::new(),
                        arguments: String::new(),
                    }),
                }
            }
            "response.content_part.added" | "response.reasoning_summary_part.added" => {
                let index = place.content_index.or(place.summary_index).unwrap_or(0);
                let value = carried().and_then(|c| c.part).unwrap_or(Value::Null);
                if let Some(it) = self.item(place.output_index) {
                    it.parts.push(Part {
                        index,
                        value,
                        text: String::new(),
                        text_done: false,
                        done: false,
                    });
                }
            }
            "response.output_text.delta"
            | "response.refusal.delta"
            | "response.reasoning_summary_text.delta" => {
                if let (Some(d), Some(p)) = (place.delta.as_deref(), self.part(place)) {
                    p.text.push_str(d);
                }
            }
            "response.output_text.done"
            | "response.refusal.done"
            | "response.reasoning_summary_text.done" => {
                if let Some(p) = self.part(place) {
                    p.text_done = true;
                }
            }
            "response.content_part.done" | "response.reasoning_summary_part.done" => {
                let value = carried().and_then(|c| c.part);
                if let Some(p) = self.part(place) {
                    p.done = true;
                    if let Some(v) = value {
                        p.value = v;
                    }
                }
            }
            "response.output_text.annotation.added" => {
                let annotation = carried().and_then(|c| c.annotation);
                if let (Some(a), Some(p)) = (annotation, self.part(place)) {
                    if let Some(list) = p.value.get_mut("annotations").and_then(Value::as_array_mut)
                    {
                        list.push(a);
                    } else if let Some(o) = p.value.as_object_mut() {
                        o.insert("annotations".into(), json!([a]));
                    }
                }
            }
            "response.function_call_arguments.delta" => {
                if let (Some(d), Some(it)) = (place.delta.as_deref(), self.item(place.output_index))
                {
                    it.arguments.push_str(d);
                }
            }
            _ => {}
        }
    }

    /// Whether the provider announced any item.
    pub(super) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The done events of every item not yet done (`push(name, data)` writes one,
    /// numbered from `seq`), then every item in order, as the terminal snapshot's
    /// `output`.
    pub(super) fn close(&mut self, seq: &mut u64, mut push: impl FnMut(&str, &[u8])) -> Value {
        let mut emit = |name: &str, mut ev: Value| {
            ev["type"] = json!(name);
            ev["sequence_number"] = json!(*seq);
            *seq += 1;
            push(name, &serde_json::to_vec(&ev).unwrap_or_default());
        };
        for it in self.items.iter_mut().filter(|it| !it.done) {
            let item_id = it.value.get("id").cloned().unwrap_or(Value::Null);
            let oi = it.output_index;
            let kind = it
                .value
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            match kind.as_str() {
                "message" | "reasoning" => {
                    let reasoning = kind == "reasoning";
                    for p in it.parts.iter_mut().filter(|p| !p.done) {
                        let refusal =
                            p.value.get("type").and_then(Value::as_str) == Some("refusal");
                        let (text_key, index_key) = match (reasoning, refusal) {
                            (true, _) => ("text", "summary_index"),
                            (false, true) => ("refusal", "content_index"),
                            (false, false) => ("text", "content_index"),
                        };
                        if !p.text_done {
                            let name = match (reasoning, refusal) {
                                (true, _) => "response.reasoning_summary_text.done",
                                (false, true) => "response.refusal.done",
                                (false, false) => "response.output_text.done",
                            };
                            let mut ev = json!({"item_id": item_id, "output_index": oi});
                            ev[index_key] = json!(p.index);
                            ev[text_key] = json!(p.text);
                            if name == "response.output_text.done" {
                                ev["logprobs"] = json!([]);
                            }
                            emit(name, ev);
                        }
                        if let Some(o) = p.value.as_object_mut() {
                            o.insert(text_key.into(), json!(p.text));
                        }
                        let name = if reasoning {
                            "response.reasoning_summary_part.done"
                        } else {
                            "response.content_part.done"
                        };
                        let mut ev = json!({"item_id": item_id, "output_index": oi});
                        ev[index_key] = json!(p.index);
                        ev["part"] = p.value.clone();
                        emit(name, ev);
                        p.done = true;
                    }
                    let list: Vec<Value> = it.parts.iter().map(|p| p.value.clone()).collect();
                    it.value[if reasoning { "summary" } else { "content" }] = json!(list);
                }
                "function_call" => {
                    let ev =
                        json!({"item_id": item_id, "output_index": oi, "arguments": it.arguments});
                    emit("response.function_call_arguments.done", ev);
                    it.value["arguments"] = json!(it.arguments);
                }
                _ => {}
            }
            if it.value.get("status").is_some()
                || matches!(kind.as_str(), "message" | "function_call")
            {
                it.value["status"] = json!("incomplete");
            }
            it.done = true;
            emit(
                "response.output_item.done",
                json!({"output_index": oi, "item": it.value}),
            );
        }
        self.items.sort_by_key(|it| it.output_index);
        Value::Array(self.items.iter().map(|it| it.value.clone()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(items: &mut Items, kind: &str, ev: Value) {
        let data = serde_json::to_vec(&ev).unwrap();
        let place: Place = serde_json::from_slice(&data).unwrap();
        items.observe(kind, &data, &place);
    }

    #[test]
    fn a_cut_message_is_done_with_its_text_before_the_end() {
        let mut items = Items::default();
        feed(
            &mut items,
            "response.output_item.added",
            json!({"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}),
        );
        feed(
            &mut items,
            "response.content_part.added",
            json!({"item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","annotations":[],"text":""}}),
        );
        feed(
            &mut items,
            "response.output_text.delta",
            json!({"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hel"}),
        );
        feed(
            &mut items,
            "response.output_text.delta",
            json!({"item_id":"msg_1","output_index":0,"content_index":0,"delta":"lo"}),
        );
        let mut seq = 7;
        let mut frames = Vec::new();
        let output = items.close(&mut seq, |n, d| {
            frames.push((n.to_string(), serde_json::from_slice::<Value>(d).unwrap()))
        });
        let names: Vec<&str> = frames.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done"
            ]
        );
        assert_eq!(frames[0].1["text"], "Hello");
        assert_eq!(frames[0].1["sequence_number"], 7);
        assert_eq!(frames[2].1["item"]["status"], "incomplete");
        assert_eq!(seq, 10);
        assert_eq!(output[0]["content"][0]["text"], "Hello");
        assert_eq!(output[0]["id"], "msg_1");
    }

    #[test]
    fn items_the_provider_finished_are_listed_and_not_done_again() {
        let mut items = Items::default();
        feed(
            &mut items,
            "response.output_item.added",
            json!({"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[]}}),
        );
        feed(
            &mut items,
            "response.output_item.done",
            json!({"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[]}}),
        );
        feed(
            &mut items,
            "response.output_item.added",
            json!({"output_index":1,"item":{"id":"fc_1","type":"function_call","status":"in_progress","arguments":"","call_id":"c","name":"f"}}),
        );
        feed(
            &mut items,
            "response.function_call_arguments.delta",
            json!({"item_id":"fc_1","output_index":1,"delta":"{\"a\":"}),
        );
        let mut seq = 0;
        let mut names = Vec::new();
        let output = items.close(&mut seq, |n, _| names.push(n.to_string()));
        assert_eq!(
            names,
            [
                "response.function_call_arguments.done",
                "response.output_item.done"
            ]
        );
        assert_eq!(output[0]["id"], "rs_1");
        assert_eq!(output[1]["arguments"], "{\"a\":");
        assert_eq!(output[1]["status"], "incomplete");
    }
}
