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

use crate::json::scan::Scan;
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

pub(super) fn inspect(json: &[u8]) -> Option<Inspection<'_>> {
    // The bytes as they came: the scan checks the strings' UTF-8 as it reads them
    // (outside strings it takes only ASCII), so the text needs no pass of its own.
    let mut s = Scan::of_bytes(json);
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
                        m.content_chars = raw_text_len(raw);
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

/// What one answer (a whole completion, or one stream chunk) carries.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Inspection<'a> {
    /// A non-empty text or tool-call delta: the commit point.
    pub has_content: bool,
    /// Characters of text content (for estimating a cut stream's output).
    pub content_chars: usize,
    pub refusal: Option<String>,
    pub finish_reason: Option<Cow<'a, str>>,
    pub usage: Option<Usage>,
    /// An in-band error object (`{"error": …}`).
    pub error: Option<String>,
    /// A chunk with `choices: []` that only carries usage.
    pub usage_only: bool,
    /// Borrowed from the answer unless it had escapes.
    pub id: Option<Cow<'a, str>>,
    pub model: Option<Cow<'a, str>>,
    pub created: Option<i64>,
}

/// The characters of text in a raw `content` value: a string, or text parts.
pub(super) fn raw_text_len(text: &str) -> usize {
    if text.starts_with('"') {
        // The common case: a plain string. Without escapes its length is the raw
        // length less the quotes; with them it is read without building a Value.
        if !text.contains('\\') {
            return text.len().saturating_sub(2);
        }
        return serde_json::from_str::<Cow<str>>(text).map_or(0, |s| s.len());
    }
    // Content parts: count the text parts.
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(|t| t.as_str()))
            .map(str::len)
            .sum(),
        _ => 0,
    }
}
