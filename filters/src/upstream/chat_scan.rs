//! A one-pass reader of an OpenAI chat answer (a whole completion or one stream
//! chunk) for the common shape: it validates the JSON text as it walks it and
//! picks out what [`inspect`](super::openai_chat::inspect) reports, at about a
//! third of a serde parse's cost.
//!
//! It answers only when it is sure: anything outside the common shape (a member of
//! an unexpected type, a repeated member the serde reading would refuse, an escaped
//! key, deep nesting, a lone surrogate, a number too large) and any syntax error
//! gives `None`, and the caller reads the text with serde instead, whose verdict
//! stands. So where this returns `Some`, the text is valid JSON and the result is
//! the serde reading's. The walking itself is [`crate::json_scan`]'s.

use super::openai_chat::Inspection;
use crate::json_scan::Scan;
use crate::usage::Usage;
use std::borrow::Cow;

/// What one choice carries.
#[derive(Default)]
struct ChoiceSeen<'a> {
    content_chars: usize,
    has_content: bool,
    refusal: Option<Cow<'a, str>>,
    finish_reason: Option<Cow<'a, str>>,
}

pub(super) fn inspect(text: &str) -> Option<Inspection<'_>> {
    let mut s = Scan { text, at: 0 };
    let mut out = Inspection::default();
    let mut choices = 0usize;
    const TOP: [&str; 6] = ["choices", "usage", "error", "id", "model", "created"];
    s.fields(TOP, |s, slot| {
        match slot {
            0 => {
                s.array(|s| {
                    choices += 1;
                    let c = s.choice()?;
                    out.content_chars += c.content_chars;
                    out.has_content |= c.has_content;
                    if let Some(r) = c.refusal.filter(|r| !r.is_empty()) {
                        out.refusal.get_or_insert_with(String::new).push_str(&r);
                    }
                    if c.finish_reason.is_some() {
                        out.finish_reason = c.finish_reason;
                    }
                    Some(())
                })?;
            }
            1 => out.usage = s.nullable(Scan::usage)?,
            2 => {
                let raw = s.raw_value()?;
                out.error = (raw != "null").then(|| raw.to_string());
            }
            3 => out.id = s.nullable(Scan::string)?,
            4 => out.model = s.nullable(Scan::string)?,
            _ => out.created = s.nullable(Scan::int)?,
        }
        Some(())
    })?;
    s.end()?;
    out.usage_only = choices == 0 && out.usage.is_some();
    Some(out)
}

impl<'a> Scan<'a> {
    fn choice(&mut self) -> Option<ChoiceSeen<'a>> {
        let mut c = ChoiceSeen::default();
        let mut message_seen = false;
        self.fields(["message", "delta", "finish_reason"], |s, slot| {
            if slot == 2 {
                c.finish_reason = s.nullable(Scan::string)?;
                return Some(());
            }
            // `message` wins over `delta` when both are there, as in the serde reading.
            let m = s.nullable(Scan::message)?;
            if let Some(m) = m {
                if slot == 0 || !message_seen {
                    c.content_chars = m.content_chars;
                    c.has_content = m.has_content;
                    c.refusal = m.refusal;
                }
                message_seen |= slot == 0;
            }
            Some(())
        })?;
        Some(c)
    }

    fn message(&mut self) -> Option<ChoiceSeen<'a>> {
        let mut m = ChoiceSeen::default();
        let mut tools = false;
        self.fields(["content", "tool_calls", "refusal"], |s, slot| {
            match slot {
                0 => {
                    let raw = s.raw_value()?;
                    if raw != "null" {
                        m.content_chars = super::openai_chat::raw_text_len(raw);
                    }
                }
                1 => {
                    if let Some(n) = s.nullable(|s| {
                        let mut n = 0usize;
                        s.array(|s| {
                            n += 1;
                            s.skip_value(0)
                        })?;
                        Some(n)
                    })? {
                        tools = n > 0;
                    }
                }
                _ => m.refusal = s.nullable(Scan::string)?,
            }
            Some(())
        })?;
        m.has_content = m.content_chars > 0 || tools;
        Some(m)
    }

    fn usage(&mut self) -> Option<Usage> {
        let mut u = Usage::default();
        const NAMES: [&str; 4] = [
            "prompt_tokens",
            "completion_tokens",
            "prompt_tokens_details",
            "completion_tokens_details",
        ];
        self.fields(NAMES, |s, slot| {
            match slot {
                0 => u.input_tokens = s.uint()?,
                1 => u.output_tokens = s.uint()?,
                2 => {
                    let (read, written) = s.nullable(Scan::prompt_details)?.unwrap_or((0, 0));
                    u.cached_tokens = read;
                    u.cache_write_tokens = written;
                }
                _ => {
                    u.reasoning_tokens = s.nullable(|s| s.detail("reasoning_tokens"))?.unwrap_or(0)
                }
            }
            Some(())
        })?;
        Some(u)
    }

    /// `prompt_tokens_details`: cache reads and writes (absent or null: 0).
    fn prompt_details(&mut self) -> Option<(u64, u64)> {
        let (mut read, mut written) = (None, None);
        self.fields(["cached_tokens", "cache_write_tokens"], |s, slot| {
            let n = s.nullable(Scan::uint)?;
            if slot == 0 {
                read = n;
            } else {
                written = n;
            }
            Some(())
        })?;
        Some((read.unwrap_or(0), written.unwrap_or(0)))
    }

    /// A details object: the one counter it names (absent or null: 0).
    fn detail(&mut self, name: &str) -> Option<u64> {
        let mut n = None;
        self.fields([name], |s, _| {
            n = s.nullable(Scan::uint)?;
            Some(())
        })?;
        Some(n.unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::super::openai_chat::inspect_serde;
    use super::inspect;
    use proptest::prelude::*;

    const ANSWER: &str = r#"{"choices":[{"finish_reason":"stop","index":0,"logprobs":null,"message":{"annotations":[],"content":"Hello from mock.","refusal":null,"role":"assistant"}}],"created":1795466564,"id":"chatcmpl-1","model":"m-2025","object":"chat.completion","usage":{"completion_tokens":64,"completion_tokens_details":{"reasoning_tokens":3},"prompt_tokens":23,"prompt_tokens_details":{"audio_tokens":0,"cached_tokens":5},"total_tokens":87}}"#;

    /// The scan either declines or agrees with serde.
    fn agrees(text: &str) -> bool {
        match inspect(text) {
            None => true,
            Some(fast) => inspect_serde(text) == Some(fast),
        }
    }

    #[test]
    fn the_common_shapes_are_read_in_one_pass_as_serde_reads_them() {
        for text in [
            ANSWER,
            r#"{"choices":[{"index":0,"delta":{"content":"Hel"}}]}"#,
            r#"{"choices":[{"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"t","function":{"name":"f","arguments":""}}]}}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"prompt_tokens_details":null}}"#,
            r#"{"error":{"message":"boom \"quoted\" \u00e9","type":"server_error"}}"#,
            r#"{"choices":[{"message":{"content":null,"refusal":"I can\u2019t"}}]}"#,
            r#"{"choices":[{"message":{"content":"a\nb\ud83d\ude00"},"delta":{"content":"zz"}}]}"#,
            r#"{"choices":[{"message":null,"delta":{"content":[{"type":"text","text":"hi"}]}}]}"#,
            " {\"id\" : \"x\" , \"choices\" : [ ] , \"created\" : -5 } \n",
        ] {
            let fast = inspect(text).unwrap_or_else(|| panic!("declined {text}"));
            assert_eq!(Some(fast), inspect_serde(text), "{text}");
        }
    }

    #[test]
    fn anything_unusual_or_broken_is_left_to_serde() {
        for text in [
            r#"{"choices":[],"choices":[]}"#,     // serde refuses repeats
            r#"{"ch\u006fices":[]}"#,             // escaped key
            r#"{"choices":null}"#,                // not an array
            r#"{"usage":{"prompt_tokens":1.5}}"#, // not an integer
            r#"{"usage":{"prompt_tokens":-1}}"#,
            r#"{"created":1e3}"#,
            r#"{"id":"\ud800"}"#,  // lone surrogate
            r#"{"id":"a\x"}"#,     // bad escape
            "{\"id\":\"a\u{1}\"}", // control character
            r#"{"id":"x"} x"#,     // trailing text
            r#"{"id":"x",}"#,
            r#"{"n":01}"#,
            r#"{"n":-}"#,
            r#"{"n":1.}"#,
            r#"{"n":tru}"#,
            r#"[1]"#,
            "",
        ] {
            assert_eq!(inspect(text), None, "{text}");
        }
        let deep = format!("{{\"x\":{}{}}}", "[".repeat(200), "]".repeat(200));
        assert_eq!(inspect(&deep), None);
    }

    fn value() -> impl Strategy<Value = String> {
        crate::json_scan::json_like(key().boxed())
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("\"choices\"".to_string()),
            Just("\"message\"".to_string()),
            Just("\"delta\"".to_string()),
            Just("\"content\"".to_string()),
            Just("\"tool_calls\"".to_string()),
            Just("\"refusal\"".to_string()),
            Just("\"finish_reason\"".to_string()),
            Just("\"usage\"".to_string()),
            Just("\"prompt_tokens\"".to_string()),
            Just("\"completion_tokens\"".to_string()),
            Just("\"prompt_tokens_details\"".to_string()),
            Just("\"cached_tokens\"".to_string()),
            Just("\"cache_write_tokens\"".to_string()),
            Just("\"error\"".to_string()),
            Just("\"id\"".to_string()),
            Just("\"model\"".to_string()),
            Just("\"created\"".to_string()),
            "\"[a-z_]{1,6}\"",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn the_scan_never_disagrees_with_serde(v in value()) {
            prop_assert!(agrees(&v), "{}", v);
        }

        #[test]
        fn well_formed_answers_take_the_one_pass_reading(
            content in proptest::option::of("[a-z\\\\\"\n\u{e9}\u{1F600} ]{0,20}"),
            finish in proptest::option::of("[a-z_]{1,8}"),
            refusal in proptest::option::of("[a-z ]{0,8}"),
            tools in 0usize..3,
            usage in proptest::option::of((any::<u32>(), any::<u32>(), proptest::option::of(any::<u32>()), proptest::option::of(any::<u32>()))),
            stream in any::<bool>(),
            created in any::<i64>(),
        ) {
            let mut m = serde_json::json!({"role": "assistant", "content": content, "refusal": refusal});
            if tools > 0 {
                m["tool_calls"] = serde_json::json!(vec![serde_json::json!({"id": "t", "function": {"name": "f"}}); tools]);
            }
            let mut a = serde_json::json!({
                "id": "chatcmpl-x", "created": created, "model": "m",
                "choices": [{"index": 0, "finish_reason": finish, "logprobs": null}],
            });
            a["choices"][0][if stream { "delta" } else { "message" }] = m;
            if let Some((p, c, cached, written)) = usage {
                a["usage"] = serde_json::json!({"prompt_tokens": p, "completion_tokens": c,
                    "prompt_tokens_details": {"cached_tokens": cached}, "total_tokens": 0});
                if let Some(w) = written {
                    a["usage"]["prompt_tokens_details"]["cache_write_tokens"] = w.into();
                }
            }
            let text = if created % 2 == 0 { serde_json::to_string_pretty(&a) } else { serde_json::to_string(&a) }.unwrap();
            let fast = inspect(&text);
            prop_assert!(fast.is_some(), "{}", text);
            prop_assert_eq!(fast, inspect_serde(&text), "{}", text);
        }

        #[test]
        fn broken_answers_are_never_read_differently(cut in 0usize..400, byte in any::<u8>()) {
            let mut b = ANSWER.as_bytes().to_vec();
            let at = cut % b.len();
            b[at] = byte;
            if let Ok(text) = std::str::from_utf8(&b) {
                prop_assert!(agrees(text), "{}", text);
            }
            prop_assert!(agrees(&ANSWER[..at]));
        }
    }
}
