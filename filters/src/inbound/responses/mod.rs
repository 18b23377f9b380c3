//! The responses inbound format (`POST /v1/responses`): the body parsed and
//! validated into the canonical [`Request`]; answers rendered back as a `response`
//! object, whole or as the responses API's named stream events (see the module
//! contract in `inbound`).
//!
//! The responses API is a closed schema: an unknown top-level field, or an unknown
//! key in an input message item, is a 400 naming it. Fields the canonical form does
//! not model but an OpenAI rung understands are kept verbatim in `extras`.

use super::common::{
    check_description, invalid, malformed, refused_everywhere, unsupported, MAX_DESCRIPTION_CHARS,
};
use crate::error::{ApiError, ErrorCode, Format};
use crate::ir::{
    Event, Extra, FinishReason, Message, Meta, Part, Reasoning, Request, Response, ResponseFormat,
    Role, SearchForm, ServerSearch, StreamEncoder, Tail, Tool, ToolChoice, ToolSearch,
    ToolSearchKind, UrlCitation,
};
use crate::json::{append_member, Member, Members, RawObject};
use crate::usage::Usage;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::fmt;

/// The member of the final answer that carries the receipt.
/// The member of the final answer that names the dropped fields.
use crate::ir::{IGNORED_MEMBER, RECEIPT_MEMBER};

/// Top-level fields kept verbatim as extras under their own names: an OpenAI rung
/// understands them, the canonical form does not model them.
const EXTRA_FIELDS: [&str; 8] = [
    "metadata",
    "service_tier",
    "truncation",
    "client_metadata",
    "background",
    "top_logprobs",
    "safety_identifier",
    "max_tool_calls",
];

/// The prefix of an `encrypted_content` that holds Anthropic's hidden reasoning
/// (redacted thinking) rather than OpenAI's.
pub const ANTHROPIC_REASONING: &str = "sluice:anthropic:";

/// The prefix of an `encrypted_content` that holds the signature of the item's
/// summary, the visible reasoning of a maker that signs it (Claude's thinking,
/// Gemini's thoughts): sent back with the summary unchanged, the signed
/// reasoning goes back to the rung as it came. No OpenAI rung takes it.
pub const SIGNED_REASONING: &str = "sluice:signed:";

/// Parameters for a function tool that declares none.
const EMPTY_PARAMETERS: &str = r#"{"type":"object","properties":{}}"#;

// Reading objects member by member

/// Whether a member is absent in effect (`null`).
fn is_null(v: &RawValue) -> bool {
    v.get() == "null"
}

/// Where a value sits in the body (`input[3].content[1]`), spelled out only when an
/// error names it: a valid body costs no formatting.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root(&'static str),
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl<'a> Path<'a> {
    fn key(&'a self, k: &'a str) -> Path<'a> {
        Path::Key(self, k)
    }

    fn at(&'a self, i: usize) -> Path<'a> {
        Path::Index(self, i)
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Path::Root(name) => f.write_str(name),
            Path::Key(p, k) => write!(f, "{p}.{k}"),
            Path::Index(p, i) => write!(f, "{p}[{i}]"),
        }
    }
}

/// Reads an optional member: absent and `null` are both `None`; a value of the wrong
/// type is a 400 naming `param`.
fn opt<'a, T: Deserialize<'a>>(
    v: Option<&'a RawValue>,
    param: impl fmt::Display,
    what: &str,
) -> Result<Option<T>, ApiError> {
    match v {
        None => Ok(None),
        Some(v) if is_null(v) => Ok(None),
        Some(v) => serde_json::from_str(v.get())
            .map(Some)
            .map_err(|_| invalid(param.to_string(), format!("`{param}` must be {what}."))),
    }
}

/// Reads a required member.
fn req<'a, T: Deserialize<'a>>(
    v: Option<&'a RawValue>,
    param: impl fmt::Display + Copy,
    what: &str,
) -> Result<T, ApiError> {
    opt(v, param, what)?.ok_or_else(|| missing(param))
}

fn missing(param: impl fmt::Display) -> ApiError {
    ApiError::new(
        ErrorCode::InvalidRequest,
        format!("Missing required parameter: `{param}`."),
    )
    .param(param.to_string())
}

fn members(v: &RawValue, param: impl fmt::Display) -> Result<Vec<Member<'_>>, ApiError> {
    crate::json::split_valid_object(v)
        .map_err(|_| invalid(param.to_string(), format!("`{param}` must be an object.")))
}

fn array(v: &RawValue, param: impl fmt::Display) -> Result<Vec<&RawValue>, ApiError> {
    crate::json::split_valid_array(v)
        .map_err(|_| invalid(param.to_string(), format!("`{param}` must be an array.")))
}

mod parse;
mod render;
mod stream;

use render::*;

pub use parse::parse;
pub use render::{echo, render, without_encrypted_content};
pub use stream::{error_frame, Encoder};

#[cfg(test)]
mod encrypted_tests {
    use super::without_encrypted_content;
    use serde_json::{json, Value};

    #[test]
    fn encrypted_reasoning_leaves_whole_answers_and_stream_frames_alone_else() {
        let whole = json!({"id": "r", "output": [
            {"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": "gA"},
            {"type": "message", "content": [{"type": "output_text", "text": "encrypted_content"}]}
        ]});
        let out = without_encrypted_content(&serde_json::to_vec(&whole).unwrap(), false).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert!(v["output"][0].get("encrypted_content").is_none());
        assert_eq!(v["output"][1], whole["output"][1]);
        let sse = b"event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"item\":{\"type\":\"reasoning\",\"id\":\"rs\",\"encrypted_content\":\"gA\",\"summary\":[]}}\n\nevent: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n";
        let out = String::from_utf8(without_encrypted_content(sse, true).unwrap()).unwrap();
        assert!(!out.contains("gA"), "{out}");
        assert!(
            out.starts_with("event: response.output_item.done\ndata: {"),
            "{out}"
        );
        assert!(out.ends_with("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n"), "{out}");
        assert!(without_encrypted_content(b"{\"id\":\"r\"}", false).is_none());
    }
}
