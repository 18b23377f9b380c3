//! Web search and tool search in the formats and wires, sans-IO: the request
//! spellings each parser reads, the providers' own search answers (whole and
//! streamed) read into server searches, citations and counts, and the formats'
//! renderings of them.

use serde_json::{json, Value};
use sluice_filters::inbound::{chat, messages, responses, Inbound};
use sluice_filters::ir::{
    Event, Meta, Part, Response, SearchForm, SearchResult, ServerSearch, StreamDecoder, Tail,
    ToolSearchKind, UrlCitation,
};
use sluice_filters::upstream::{anthropic, gemini, openai_chat, openai_responses};
use sluice_filters::ErrorCode;
use std::sync::Arc;

fn decode_stream(d: &mut dyn StreamDecoder, frames: &[(Option<&str>, Value)]) -> Vec<Event> {
    let mut out = Vec::new();
    for (name, data) in frames {
        d.frame(*name, data.to_string().as_bytes(), &mut out)
            .unwrap();
    }
    out
}

fn citations(events: &[Event]) -> Vec<UrlCitation> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Citation(c) => Some((**c).clone()),
            _ => None,
        })
        .collect()
}

fn searches(events: &[Event]) -> Vec<ServerSearch> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::ServerSearch(s) => Some((**s).clone()),
            _ => None,
        })
        .collect()
}

fn last_usage(events: &[Event]) -> sluice_filters::usage::Usage {
    events
        .iter()
        .rev()
        .find_map(|e| match e {
            Event::Usage(u) => Some(*u),
            _ => None,
        })
        .unwrap()
}

#[test]
fn each_format_reads_its_spellings_of_web_search() {
    let r = chat::parse(
        br#"{"model":"m","messages":[{"role":"user","content":"q"}],
        "web_search_options":{"search_context_size":"high"}}"#,
    )
    .unwrap();
    let ws = r.web_search.unwrap();
    assert_eq!(ws.form, SearchForm::ChatOptions);
    assert_eq!(ws.context_size.as_deref(), Some("high"));
    assert!(r.extras.is_empty(), "no longer an extra");
    let r = chat::parse(
        br#"{"model":"m","messages":[{"role":"user","content":"q"}],
        "plugins":[{"id":"web","max_results":3,"search_prompt":"Found:","engine":"native"}]}"#,
    )
    .unwrap();
    let ws = r.web_search.unwrap();
    assert_eq!(
        (ws.form, ws.max_results, ws.search_prompt.as_deref()),
        (SearchForm::Plugin, Some(3), Some("Found:"))
    );
    let e = chat::parse(
        br#"{"model":"m","messages":[{"role":"user","content":"q"}],"plugins":[{"id":"pdf"}]}"#,
    )
    .unwrap_err();
    assert_eq!(
        (e.code, e.param.as_deref()),
        (ErrorCode::UnsupportedParameter, Some("plugins"))
    );
    let e = chat::parse(br#"{"model":"m","messages":[{"role":"user","content":"q"}],"plugins":[{"id":"web","max_results":0}]}"#)
        .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("plugins[0].max_results"));

    let r = responses::parse(br#"{"model":"m","input":"q","tools":[{"type":"web_search_preview","search_context_size":"low"}]}"#)
        .unwrap();
    let ws = r.web_search.unwrap();
    assert_eq!(
        (ws.form, ws.context_size.as_deref()),
        (SearchForm::ResponsesTool, Some("low"))
    );
    assert!(ws.raw.unwrap().get().contains("web_search_preview"));
    // A replayed web_search_call item is accepted (nothing to read again).
    responses::parse(br#"{"model":"m","input":[{"type":"web_search_call","id":"ws_1","status":"completed","action":{"type":"search","query":"x"}},{"role":"user","content":"q"}]}"#)
        .unwrap();

    let r = messages::parse(
        br#"{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"q"}],
        "tools":[{"type":"web_search_20250305","name":"web_search","max_uses":2}]}"#,
    )
    .unwrap();
    assert_eq!(r.web_search.unwrap().form, SearchForm::MessagesTool);
    assert!(r.extras.is_empty());
}

#[test]
fn each_format_reads_tool_search_and_deferred_tools() {
    let r = chat::parse(
        br#"{"model":"m","messages":[{"role":"user","content":"q"}],"tools":[
        {"type":"service:tool_search","max_results":7},
        {"type":"function","function":{"name":"a","parameters":{}}},
        {"type":"function","defer_loading":true,"function":{"name":"b","parameters":{}}}]}"#,
    )
    .unwrap();
    assert_eq!(r.tool_search.as_ref().unwrap().max_results, Some(7));
    assert_eq!((r.tools.len(), r.deferred.len()), (1, 1));
    assert_eq!(r.deferred[0].name, "b");
    let r = responses::parse(
        br#"{"model":"m","input":"q","tools":[{"type":"tool_search"},
        {"type":"function","name":"b","defer_loading":true}]}"#,
    )
    .unwrap();
    assert_eq!(r.tool_search.unwrap().kind, ToolSearchKind::Bm25);
    assert_eq!(r.deferred.len(), 1);
    let r = messages::parse(
        br#"{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"q"}],"tools":[
        {"type":"tool_search_tool_regex_20251119","name":"tool_search"},
        {"name":"b","input_schema":{},"defer_loading":true}]}"#,
    )
    .unwrap();
    assert_eq!(r.tool_search.unwrap().kind, ToolSearchKind::Regex);
    assert_eq!(r.deferred.len(), 1);
    // History a native tool search left is skipped.
    messages::parse(br#"{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"q"},
        {"role":"assistant","content":[{"type":"server_tool_use","id":"s","name":"tool_search_tool_regex","input":{"query":"x"}},
        {"type":"tool_search_tool_result","tool_use_id":"s","content":{"type":"tool_search_tool_search_result","tool_references":[]}},
        {"type":"text","text":"ok"}]},{"role":"user","content":"go"}]}"#)
    .unwrap();

    // Refusals: a tool_choice naming tool_search; deferred tools without a
    // declaration; the reserved name; a defer_loading that is not a boolean.
    let e = chat::parse(br#"{"model":"m","messages":[{"role":"user","content":"q"}],"tools":[
        {"type":"service:tool_search"},{"type":"function","defer_loading":true,"function":{"name":"b"}}],
        "tool_choice":{"type":"function","function":{"name":"tool_search"}}}"#)
    .unwrap_err();
    assert_eq!(
        (e.code, e.param.as_deref()),
        (ErrorCode::UnsupportedParameter, Some("tool_choice"))
    );
    let e = messages::parse(br#"{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"q"}],"tools":[
        {"type":"tool_search_tool_bm25_20251119","name":"tool_search"},{"name":"b","input_schema":{},"defer_loading":true}],
        "tool_choice":{"type":"tool","name":"tool_search"}}"#)
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::UnsupportedParameter);
    let e = responses::parse(br#"{"model":"m","input":"q","tools":[{"type":"function","name":"b","defer_loading":true}]}"#)
        .unwrap_err();
    assert_eq!(
        (e.code, e.param.as_deref()),
        (ErrorCode::InvalidParameter, Some("tools"))
    );
    let e = chat::parse(
        br#"{"model":"m","messages":[{"role":"user","content":"q"}],"tools":[
        {"type":"service:tool_search"},{"type":"function","function":{"name":"tool_search"}},
        {"type":"function","defer_loading":true,"function":{"name":"b"}}]}"#,
    )
    .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("tools"));
    let e = chat::parse(
        br#"{"model":"m","messages":[{"role":"user","content":"q"}],"tools":[
        {"type":"function","defer_loading":"yes","function":{"name":"b"}}]}"#,
    )
    .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("tools[0].defer_loading"));
}

#[test]
fn claudes_search_stream_reads_into_a_search_citations_and_the_count() {
    let frames = [
        (
            Some("message_start"),
            json!({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[],"stop_reason":null,"usage":{"input_tokens":10,"output_tokens":1}}}),
        ),
        (
            Some("content_block_start"),
            json!({"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{}}}),
        ),
        (
            Some("content_block_delta"),
            json!({"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"query\": \"rust"}}),
        ),
        (
            Some("content_block_delta"),
            json!({"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":" news\"}"}}),
        ),
        (
            Some("content_block_stop"),
            json!({"type":"content_block_stop","index":0}),
        ),
        (
            Some("content_block_start"),
            json!({"type":"content_block_start","index":1,"content_block":{"type":"web_search_tool_result","tool_use_id":"srvtoolu_1","content":[{"type":"web_search_result","url":"https://a.test/","title":"A","encrypted_content":"x","page_age":"1 day"}]}}),
        ),
        (
            Some("content_block_stop"),
            json!({"type":"content_block_stop","index":1}),
        ),
        (
            Some("content_block_start"),
            json!({"type":"content_block_start","index":2,"content_block":{"type":"text","text":"Héllo "}}),
        ),
        (
            Some("content_block_stop"),
            json!({"type":"content_block_stop","index":2}),
        ),
        (
            Some("content_block_start"),
            json!({"type":"content_block_start","index":3,"content_block":{"type":"text","text":"","citations":[]}}),
        ),
        (
            Some("content_block_delta"),
            json!({"type":"content_block_delta","index":3,"delta":{"type":"citations_delta","citation":{"type":"web_search_result_location","url":"https://a.test/","title":"A","encrypted_index":"e","cited_text":"quote"}}}),
        ),
        (
            Some("content_block_delta"),
            json!({"type":"content_block_delta","index":3,"delta":{"type":"text_delta","text":"Rust shipped."}}),
        ),
        (
            Some("content_block_stop"),
            json!({"type":"content_block_stop","index":3}),
        ),
        (
            Some("message_delta"),
            json!({"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":9,"server_tool_use":{"web_search_requests":1}}}),
        ),
        (Some("message_stop"), json!({"type":"message_stop"})),
    ];
    let events = decode_stream(&mut anthropic::Decoder::new(), &frames);
    let s = searches(&events);
    assert_eq!(s.len(), 1);
    assert_eq!(
        (s[0].id.as_str(), s[0].query.as_str()),
        ("srvtoolu_1", "rust news")
    );
    assert_eq!(s[0].results[0].page_age.as_deref(), Some("1 day"));
    let c = citations(&events);
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].start_index, c[0].end_index), (6, 19));
    assert_eq!(c[0].content.as_deref(), Some("quote"));
    assert_eq!(last_usage(&events).web_search_requests, 1);
    // The whole answer folds the same way.
    let r = Response::from_events(&events);
    assert_eq!(r.citations, c);
    assert_eq!(r.searches, s);
}

#[test]
fn openai_answers_read_their_annotations_and_search_calls() {
    // Responses, streamed: the annotation's span moves to the answer's text.
    let frames = [
        (
            None,
            json!({"type":"response.created","sequence_number":0,"response":{"id":"resp_1","model":"gpt","status":"in_progress","output":[]}}),
        ),
        (
            None,
            json!({"type":"response.output_item.done","sequence_number":1,"output_index":0,"item":{"type":"web_search_call","id":"ws_1","status":"completed","action":{"type":"search","query":"rust"}}}),
        ),
        (
            None,
            json!({"type":"response.output_text.delta","sequence_number":2,"item_id":"msg_a","output_index":1,"content_index":0,"delta":"One. "}),
        ),
        (
            None,
            json!({"type":"response.output_text.delta","sequence_number":3,"item_id":"msg_b","output_index":2,"content_index":0,"delta":"Two cited."}),
        ),
        (
            None,
            json!({"type":"response.output_text.annotation.added","sequence_number":4,"item_id":"msg_b","output_index":2,"content_index":0,"annotation_index":0,"annotation":{"type":"url_citation","start_index":4,"end_index":9,"url":"https://b.test/","title":"B"}}),
        ),
        (
            None,
            json!({"type":"response.completed","sequence_number":5,"response":{"id":"resp_1","status":"completed","output":[],"usage":{"input_tokens":5,"output_tokens":5,"total_tokens":10}}}),
        ),
    ];
    let events = decode_stream(&mut openai_responses::Decoder::new(), &frames);
    assert_eq!(searches(&events)[0].query, "rust");
    let c = citations(&events);
    assert_eq!(
        (c[0].start_index, c[0].end_index, c[0].url.as_str()),
        (9, 14, "https://b.test/")
    );
    assert_eq!(last_usage(&events).web_search_requests, 1);
    // Responses, whole.
    let body = json!({"id":"resp_1","model":"gpt","status":"completed","output":[
        {"type":"web_search_call","id":"ws_1","status":"completed","action":{"type":"search","query":"rust"}},
        {"type":"message","id":"m","role":"assistant","content":[{"type":"output_text","text":"Hi [x](https://b.test/)","annotations":[{"type":"url_citation","start_index":3,"end_index":22,"url":"https://b.test/","title":"B"}]}]}],
        "usage":{"input_tokens":5,"output_tokens":5,"total_tokens":10}});
    let events = openai_responses::decode(body.to_string().as_bytes()).unwrap();
    assert_eq!(citations(&events)[0].start_index, 3);
    assert_eq!(last_usage(&events).web_search_requests, 1);
    // Chat (a search model), streamed: annotations in a delta.
    let frames = [
        (
            None,
            json!({"id":"c","object":"chat.completion.chunk","model":"gpt-4o-search","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"}}]}),
        ),
        (
            None,
            json!({"id":"c","object":"chat.completion.chunk","model":"gpt-4o-search","choices":[{"index":0,"delta":{"annotations":[{"type":"url_citation","url_citation":{"url":"https://c.test/","title":"C","start_index":0,"end_index":2}}]},"finish_reason":"stop"}]}),
        ),
    ];
    let events = decode_stream(&mut openai_chat::Decoder::new(), &frames);
    assert_eq!(citations(&events)[0].url, "https://c.test/");
}

#[test]
fn gemini_grounding_reads_into_searches_and_citations_in_characters() {
    // Spans are UTF-8 bytes: "Café " is 6 bytes, 5 characters.
    let body = json!({"candidates":[{"content":{"role":"model","parts":[{"text":"Café rocks."}]},"finishReason":"STOP",
        "groundingMetadata":{"webSearchQueries":["cafe","rocks"],
            "groundingChunks":[{"web":{"uri":"https://g.test/1","title":"g.test"}},{"web":{"uri":"https://g.test/2","title":"two"}}],
            "groundingSupports":[{"segment":{"startIndex":6,"endIndex":12,"text":"rocks."},"groundingChunkIndices":[1]}]}}],
        "usageMetadata":{"promptTokenCount":4,"candidatesTokenCount":3}});
    let events = gemini::decode(body.to_string().as_bytes()).unwrap();
    let s = searches(&events);
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].results.len(), 2);
    let c = citations(&events);
    assert_eq!(
        (c[0].start_index, c[0].end_index, c[0].url.as_str()),
        (5, 11, "https://g.test/2")
    );
    assert_eq!(last_usage(&events).web_search_requests, 2);
}

/// SSE frames (event name, data JSON) of an encoded stream.
fn frames(sse: &str) -> Vec<(String, Value)> {
    sse.split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|f| {
            let name = f
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or("")
                .to_string();
            let data: String = f.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
            (name, serde_json::from_str(&data).unwrap_or(Value::Null))
        })
        .collect()
}

#[test]
fn gemini_grounding_in_the_last_chunk_cites_inside_the_text_it_covers() {
    // Gemini streams the text, then tells its grounding with the finish.
    let chunks = [
        json!({"candidates":[{"content":{"role":"model","parts":[{"text":"Café "}]}}]}),
        json!({"candidates":[{"content":{"role":"model","parts":[{"text":"rocks."}]}}]}),
        json!({"candidates":[{"content":{"role":"model","parts":[{"text":""}]},"finishReason":"STOP",
            "groundingMetadata":{"webSearchQueries":["cafe"],
                "groundingChunks":[{"web":{"uri":"https://g.test/1","title":"g.test"}}],
                "groundingSupports":[{"segment":{"startIndex":6,"endIndex":12,"text":"rocks."},"groundingChunkIndices":[0]}]}}],
            "usageMetadata":{"promptTokenCount":4,"candidatesTokenCount":3}}),
    ];
    let mut d = gemini::Decoder::new();
    let framed: Vec<(Option<&str>, Value)> = chunks.iter().map(|c| (None, c.clone())).collect();
    let events = decode_stream(&mut d, &framed);
    let encode = |inbound: Inbound| {
        let mut enc = inbound.encoder(Meta {
            provider: "google:g".into(),
            slug: "m".into(),
            ..Meta::default()
        });
        let mut out = Vec::new();
        for e in &events {
            enc.event(e, &mut out);
        }
        enc.end(&Tail::default(), &mut out);
        frames(&String::from_utf8(out).unwrap())
    };
    // Messages: the citation is a delta of text block 0, before that block stops.
    let m = encode(Inbound::Messages);
    let at = |pred: &dyn Fn(&(String, Value)) -> bool| m.iter().position(pred).unwrap();
    let cited = at(&|(_, d)| d["delta"]["type"] == "citations_delta");
    let stop = at(&|(n, d)| n == "content_block_stop" && d["index"] == 0);
    assert!(
        cited < stop,
        "citation at {cited}, block 0 stops at {stop}: {m:?}"
    );
    assert_eq!(m[cited].1["index"], 0);
    assert_eq!(m[cited].1["delta"]["citation"]["url"], "https://g.test/1");
    // Responses: the annotation is announced before its item is done, and the
    // done item carries it.
    let r = encode(Inbound::Responses);
    let at = |pred: &dyn Fn(&(String, Value)) -> bool| r.iter().position(pred).unwrap();
    let added = at(&|(n, _)| n == "response.output_text.annotation.added");
    let done = at(&|(n, d)| n == "response.output_item.done" && d["item"]["type"] == "message");
    assert!(
        added < done,
        "annotation at {added}, item done at {done}: {r:?}"
    );
    let annotations = &r[done].1["item"]["content"][0]["annotations"];
    assert_eq!(annotations[0]["url"], "https://g.test/1", "{annotations}");
}

fn search() -> Arc<ServerSearch> {
    Arc::new(ServerSearch {
        id: "srch_1".into(),
        query: "rust news".into(),
        results: vec![SearchResult {
            title: "Blog".into(),
            url: "https://blog.test/a".into(),
            snippet: "Rust shipped.".into(),
            page_age: None,
        }],
    })
}

const TEXT: &str = "Né: [blog.test](https://blog.test/a) done";

fn answer() -> Vec<Event> {
    vec![
        Event::Start {
            id: None,
            model: None,
        },
        Event::Text {
            text: TEXT[..10].into(),
        },
        Event::Text {
            text: TEXT[10..].into(),
        },
        Event::Finish {
            reason: sluice_filters::ir::FinishReason::Stop,
            raw: None,
            stop_sequence: None,
        },
    ]
}

fn meta() -> Meta {
    Meta {
        provider: "openai:x".into(),
        slug: "m".into(),
        fallback_id: "abc".into(),
        search: Some(search()),
        ..Meta::default()
    }
}

fn stream(inbound: Inbound) -> String {
    let mut enc = inbound.encoder(meta());
    let mut out = Vec::new();
    for e in answer() {
        enc.event(&e, &mut out);
    }
    enc.end(&Tail::default(), &mut out);
    String::from_utf8(out).unwrap()
}

#[test]
fn a_service_run_search_is_shown_and_cited_in_each_format() {
    let resp = Response::from_events(&answer());
    let link = (4, 36);
    // Chat: message annotations; one delta.annotations chunk on a stream.
    let v: Value =
        serde_json::from_slice(&Inbound::Chat.render(&resp, &meta(), &Tail::default())).unwrap();
    let note = &v["choices"][0]["message"]["annotations"][0]["url_citation"];
    assert_eq!(
        (
            note["start_index"].as_u64().unwrap(),
            note["end_index"].as_u64().unwrap()
        ),
        link
    );
    let s = stream(Inbound::Chat);
    assert_eq!(s.matches("\"annotations\"").count(), 1, "{s}");
    // Responses: a web_search_call item; annotation.added on a stream.
    let v: Value =
        serde_json::from_slice(&Inbound::Responses.render(&resp, &meta(), &Tail::default()))
            .unwrap();
    assert_eq!(v["output"][0]["type"], "web_search_call");
    assert_eq!(
        v["output"][1]["content"][0]["annotations"][0]["start_index"],
        4
    );
    let s = stream(Inbound::Responses);
    for name in [
        "response.web_search_call.searching",
        "response.output_text.annotation.added",
    ] {
        assert!(s.contains(&format!("event: {name}\n")), "{name}: {s}");
    }
    assert!(s.find("annotation.added").unwrap() < s.find("response.output_text.done").unwrap());
    // Messages: server tool blocks, then text split at the cited span.
    let v: Value =
        serde_json::from_slice(&Inbound::Messages.render(&resp, &meta(), &Tail::default()))
            .unwrap();
    let blocks = v["content"].as_array().unwrap();
    let kinds: Vec<&str> = blocks.iter().map(|b| b["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "server_tool_use",
            "web_search_tool_result",
            "text",
            "text",
            "text"
        ]
    );
    assert_eq!(blocks[0]["id"], "srvtoolu_srch_1");
    assert_eq!(blocks[2]["text"], "Né: ");
    assert_eq!(blocks[3]["text"], "[blog.test](https://blog.test/a)");
    assert_eq!(blocks[3]["citations"][0]["cited_text"], "Rust shipped.");
    assert!(blocks[4].get("citations").is_none());
    let s = stream(Inbound::Messages);
    assert!(s.contains("\"citations_delta\""), "{s}");
    assert!(s.contains("\"server_tool_use\""), "{s}");
    // A whole answer without the gateway's search is unchanged.
    let plain = Meta {
        search: None,
        ..meta()
    };
    let v: Value =
        serde_json::from_slice(&Inbound::Messages.render(&resp, &plain, &Tail::default())).unwrap();
    assert_eq!(v["content"].as_array().unwrap().len(), 1);
    assert!(matches!(&resp.parts[0], Part::Text { .. }));
}

#[test]
fn a_relayed_responses_answer_counts_the_providers_searches() {
    use sluice_filters::relay::{whole, Owned};
    let body = json!({"id":"resp_1","object":"response","status":"completed","output":[
        {"type":"web_search_call","id":"ws_1","status":"completed","action":{"type":"search","query":"q"}}],
        "usage":{"input_tokens":5,"output_tokens":5,"total_tokens":10}});
    let events = openai_responses::decode(body.to_string().as_bytes()).unwrap();
    let mut usage = last_usage(&events);
    usage.cost_micro_usd = Some(30);
    let owned = |count| Owned {
        provider: br#""openai:o1""#,
        usage: Some(usage),
        receipt: b"{}",
        ignored: None,
        count_searches: count,
        turn: None,
    };
    let out: Value =
        serde_json::from_slice(&whole(body.to_string().as_bytes(), &owned(true))).unwrap();
    assert_eq!(
        out["usage"]["server_tool_use_details"]["web_search_requests"],
        1
    );
    assert_eq!(out["usage"]["cost"], 0.00003);
    let out: Value =
        serde_json::from_slice(&whole(body.to_string().as_bytes(), &owned(false))).unwrap();
    assert!(out["usage"].get("server_tool_use_details").is_none());
}
