//! Gemini wire format (`/v1beta/models/{model}:{method}`): generateContent,
//! streamGenerateContent (SSE with `alt=sse`, else a streamed JSON array),
//! embedContent / batchEmbedContents bodies, and Google's error envelope.

use bytes::Bytes;
use serde::{de::IgnoredAny, Deserialize};
use serde_json::{json, Value};

use crate::{
    embed,
    sse::{json_str, Frames, Template},
    step::Content,
    wire::{self, Ctx, Parsed, Wire},
};

#[derive(Deserialize)]
struct Request {
    #[serde(default)]
    tools: Option<Vec<IgnoredAny>>,
}

fn status_name(status: u16) -> &'static str {
    match status {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        500 => "INTERNAL",
        501 => "UNIMPLEMENTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "UNKNOWN",
    }
}

/// Google error envelope `{error:{code, message, status}}`.
pub(crate) fn error_body(status: u16, message: &str) -> Value {
    json!({"error": {"code": status, "message": message, "status": status_name(status)}})
}

fn usage(prompt: u64, candidates: u64) -> Value {
    json!({
        "promptTokenCount": prompt,
        "candidatesTokenCount": candidates,
        "totalTokenCount": prompt + candidates,
        "cachedContentTokenCount": 0,
    })
}

fn function_call(name: &str, arguments: &str) -> Value {
    let args = serde_json::from_str::<Value>(arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    json!({"functionCall": {"name": name, "args": args}})
}

fn safety_candidate() -> Value {
    json!({
        "finishReason": "SAFETY",
        "index": 0,
        "safetyRatings": [{
            "category": "HARM_CATEGORY_DANGEROUS_CONTENT",
            "probability": "HIGH",
            "blocked": true,
        }],
    })
}

/// Gemini generateContent / streamGenerateContent.
pub(crate) struct Generate {
    pub(crate) stream: bool,
    /// `alt=sse` framing; otherwise a streamed JSON array.
    pub(crate) sse: bool,
}

impl Generate {
    /// Wraps one response object as the next frame of the stream.
    fn frame(&self, json: &str, first: bool) -> Bytes {
        let prefix = match (self.sse, first) {
            (true, _) => "data: ",
            (false, true) => "[",
            (false, false) => ",\r\n",
        };
        let suffix = if self.sse { "\r\n\r\n" } else { "" };
        Bytes::from([prefix, json, suffix].concat())
    }
}

impl Wire for Generate {
    fn parse(&self, body: &[u8]) -> Result<Parsed, String> {
        let req: Request = serde_json::from_slice(body)
            .map_err(|e| format!("Invalid JSON payload received. {e}"))?;
        Ok(Parsed {
            model: None,
            stream: self.stream,
            include_usage: false,
            has_tools: wire::non_empty(&req.tools),
            rejection: None,
            asks: Default::default(),
        })
    }

    fn reply(&self, ctx: &Ctx<'_>, content: &Content) -> Value {
        let candidate = match content {
            Content::Refusal(_) => safety_candidate(),
            Content::Text(p) | Content::Exhausted(p) => json!({
                "content": {"parts": [{"text": p.text()}], "role": "model"},
                "finishReason": finish_reason(content),
                "index": 0,
            }),
            Content::ToolCall { name, arguments } => json!({
                "content": {"parts": [function_call(name, arguments.text())], "role": "model"},
                "finishReason": "STOP",
                "index": 0,
            }),
        };
        json!({
            "candidates": [candidate],
            "usageMetadata": usage(ctx.prompt_tokens, content.tokens()),
            "modelVersion": ctx.model,
            "responseId": format!("mock{}", wire::next_id()),
        })
    }

    fn frames(&self, ctx: &Ctx<'_>, content: &Content) -> Frames {
        let response_id = format!("mock{}", wire::next_id());
        let trailer = |usage: Value| {
            format!(
                "\"usageMetadata\":{usage},\"modelVersion\":{},\"responseId\":{}}}",
                json_str(ctx.model),
                json_str(&response_id)
            )
        };
        let partial_usage = json!({
            "promptTokenCount": ctx.prompt_tokens,
            "totalTokenCount": ctx.prompt_tokens,
        });
        let final_usage = usage(ctx.prompt_tokens, content.tokens());
        let mut first = true;

        let mut content_frames = Vec::new();
        let finish = match content {
            Content::Text(pieces) | Content::Exhausted(pieces) => {
                let (prefix, suffix) = if self.sse {
                    ("data: ", "\r\n\r\n")
                } else {
                    (",\r\n", "")
                };
                let template = Template::new(
                    format!("{prefix}{{\"candidates\":[{{\"content\":{{\"parts\":[{{\"text\":"),
                    format!(
                        "}}],\"role\":\"model\"}},\"index\":0}}],{}{suffix}",
                        trailer(partial_usage.clone())
                    ),
                );
                for piece in pieces.iter() {
                    let mut frame = template.render(piece);
                    if std::mem::take(&mut first) && !self.sse {
                        // ",\r\n" and "[\r\n" have the same length.
                        frame.replace_range(0..1, "[");
                    }
                    content_frames.push(Bytes::from(frame));
                }
                json!({
                    "content": {"parts": [{"text": ""}], "role": "model"},
                    "finishReason": finish_reason(content),
                    "index": 0,
                })
            }
            Content::ToolCall { name, arguments } => {
                let call = json!({
                    "content": {"parts": [function_call(name, arguments.text())], "role": "model"},
                    "index": 0,
                });
                content_frames.push(self.frame(
                    &format!(
                        "{{\"candidates\":[{call}],{}",
                        trailer(partial_usage.clone())
                    ),
                    std::mem::take(&mut first),
                ));
                json!({
                    "content": {"parts": [{"text": ""}], "role": "model"},
                    "finishReason": "STOP",
                    "index": 0,
                })
            }
            Content::Refusal(_) => safety_candidate(),
        };
        let mut post = vec![self.frame(
            &format!("{{\"candidates\":[{finish}],{}", trailer(final_usage)),
            first,
        )];
        if !self.sse {
            post.push(Bytes::from_static(b"]"));
        }
        Frames {
            pre: Vec::new(),
            content: content_frames,
            post,
        }
    }

    fn error_event(&self) -> Bytes {
        let err = error_body(500, "An internal error has occurred. Please retry.");
        if self.sse {
            Bytes::from(format!("data: {err}\r\n\r\n"))
        } else {
            Bytes::from(format!("[{err}]"))
        }
    }

    fn error_body(&self, status: u16, message: &str) -> Value {
        error_body(status, message)
    }

    fn stream_content_type(&self) -> &'static str {
        if self.sse {
            "text/event-stream"
        } else {
            "application/json; charset=UTF-8"
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EmbedRequest {
    #[serde(default)]
    content: Option<EmbedContent>,
    #[serde(default)]
    output_dimensionality: Option<usize>,
}

#[derive(Deserialize)]
struct EmbedContent {
    #[serde(default)]
    parts: Vec<EmbedPart>,
}

#[derive(Deserialize)]
struct EmbedPart {
    #[serde(default)]
    text: String,
}

#[derive(Deserialize)]
struct BatchRequest {
    #[serde(default)]
    requests: Vec<EmbedRequest>,
}

fn embedding(req: &EmbedRequest, default_dims: usize) -> Value {
    let dims = req.output_dimensionality.unwrap_or(default_dims);
    let text: String = req
        .content
        .iter()
        .flat_map(|c| c.parts.iter())
        .map(|p| p.text.as_str())
        .collect();
    json!({"values": embed::vector(text.as_bytes(), dims)})
}

/// Body of an `embedContent` answer.
pub(crate) fn embed_content(body: &[u8], default_dims: usize) -> Result<Value, String> {
    let req: EmbedRequest =
        serde_json::from_slice(body).map_err(|e| format!("Invalid JSON payload received. {e}"))?;
    Ok(json!({"embedding": embedding(&req, default_dims)}))
}

/// The most requests one `batchEmbedContents` call takes (Gemini API's limit).
pub(crate) const BATCH_LIMIT: usize = 100;

/// Body of a `batchEmbedContents` answer.
pub(crate) fn batch_embed_contents(body: &[u8], default_dims: usize) -> Result<Value, String> {
    let req: BatchRequest =
        serde_json::from_slice(body).map_err(|e| format!("Invalid JSON payload received. {e}"))?;
    if req.requests.len() > BATCH_LIMIT {
        return Err(format!(
            "* BatchEmbedContentsRequest.requests: at most {BATCH_LIMIT} requests can be in one batch"
        ));
    }
    let embeddings: Vec<Value> = req
        .requests
        .iter()
        .map(|r| embedding(r, default_dims))
        .collect();
    Ok(json!({"embeddings": embeddings}))
}

/// Body of a `countTokens` answer.
pub(crate) fn count_tokens(body: &[u8]) -> Value {
    json!({"totalTokens": wire::estimate_tokens(body.len())})
}

#[derive(Deserialize)]
struct PredictRequest {
    #[serde(default)]
    instances: Vec<PredictInstance>,
    #[serde(default)]
    parameters: Option<PredictParameters>,
}

#[derive(Deserialize)]
struct PredictInstance {
    #[serde(default)]
    content: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PredictParameters {
    #[serde(default)]
    output_dimensionality: Option<usize>,
}

/// Body of a Vertex AI text-embedding `predict` answer, with per-instance token
/// statistics.
pub(crate) fn predict(body: &[u8], default_dims: usize) -> Result<Value, String> {
    let req: PredictRequest =
        serde_json::from_slice(body).map_err(|e| format!("Invalid JSON payload received. {e}"))?;
    let dims = req
        .parameters
        .and_then(|p| p.output_dimensionality)
        .unwrap_or(default_dims);
    let predictions: Vec<Value> = req
        .instances
        .iter()
        .map(|i| {
            json!({"embeddings": {
                "values": embed::vector(i.content.as_bytes(), dims),
                "statistics": {"token_count": wire::estimate_tokens(i.content.chars().count()), "truncated": false},
            }})
        })
        .collect();
    Ok(json!({"predictions": predictions}))
}

/// The candidate's finish: `MAX_TOKENS` when the budget went on thinking.
fn finish_reason(content: &Content) -> &'static str {
    match content {
        Content::Exhausted(_) => "MAX_TOKENS",
        _ => "STOP",
    }
}
