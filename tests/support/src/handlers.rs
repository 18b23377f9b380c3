//! Request handlers: read and record each request, take the scripted step for
//! its model, and answer in the matching wire format (generation, embeddings,
//! unknown routes).

use std::{sync::Arc, time::Duration};

use axum::{
    body::Body,
    extract::{Path, Request, State},
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use bytes::Bytes;
use serde_json::Value;

use crate::{
    anthropic, bedrock, embed, gemini, openai, responses,
    sse::{self, Item},
    step::{self, Failure},
    wire::{self, Ctx, Wire},
    Inner, Step,
};

/// Largest request body the mock reads.
const BODY_LIMIT: usize = 64 << 20;

pub(crate) type Shared = State<Arc<Inner>>;

pub(crate) async fn chat(State(m): Shared, req: Request) -> Response {
    generate(&m, openai::Chat, None, req).await
}

pub(crate) async fn azure_chat(
    State(m): Shared,
    Path(deployment): Path<String>,
    req: Request,
) -> Response {
    generate(&m, openai::Chat, Some(deployment), req).await
}

pub(crate) async fn responses(State(m): Shared, req: Request) -> Response {
    generate(&m, responses::Responses, None, req).await
}

pub(crate) async fn messages(State(m): Shared, req: Request) -> Response {
    generate(&m, anthropic::Messages, None, req).await
}

pub(crate) async fn embeddings(State(m): Shared, req: Request) -> Response {
    openai_embeddings(&m, None, req).await
}

pub(crate) async fn azure_embeddings(
    State(m): Shared,
    Path(deployment): Path<String>,
    req: Request,
) -> Response {
    openai_embeddings(&m, Some(deployment), req).await
}

pub(crate) async fn gemini(State(m): Shared, Path(rest): Path<String>, req: Request) -> Response {
    let (model, method) = rest.rsplit_once(':').unwrap_or((rest.as_str(), ""));
    let model = model.to_owned();
    match method {
        "generateContent" | "streamGenerateContent" => {
            let stream = method == "streamGenerateContent";
            let sse = req
                .uri()
                .query()
                .is_some_and(|q| q.split('&').any(|kv| kv == "alt=sse"));
            generate(&m, gemini::Generate { stream, sse }, Some(model), req).await
        }
        "embedContent" | "batchEmbedContents" | "countTokens" | "predict" => {
            gemini_other(&m, method, model, req).await
        }
        _ => {
            let (parts, body) = req.into_parts();
            let body = read_body(body).await.unwrap_or_default();
            m.admit(&parts, &body, None);
            let msg = format!("Method not found: {method}");
            error_response(gemini::error_body(404, &msg), 404)
        }
    }
}

/// Vertex AI Gemini models: `.../publishers/google/models/{model}:{method}`.
pub(crate) async fn vertex_google(
    state: State<Arc<Inner>>,
    Path((_project, _region, rest)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    gemini(state, Path(rest), req).await
}

/// Claude on Vertex AI: `.../publishers/anthropic/models/{model}:rawPredict` (or
/// `:streamRawPredict`); the body is Anthropic's without `model`.
pub(crate) async fn vertex_anthropic(
    State(m): Shared,
    Path((_project, _region, rest)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    let model = rest
        .rsplit_once(':')
        .map_or(rest.as_str(), |(m, _)| m)
        .to_owned();
    generate(&m, anthropic::Messages, Some(model), req).await
}

/// Bedrock `InvokeModel` for embedding models (Titan, Cohere).
pub(crate) async fn bedrock_invoke(
    State(m): Shared,
    Path(model): Path<String>,
    req: Request,
) -> Response {
    let (parts, body) = req.into_parts();
    let body = read_body(body).await.unwrap_or_default();
    let step = m.admit(&parts, &body, Some(&model));
    let error = |status: u16, msg: &str| {
        bedrock::with_headers(error_response(serde_json::json!({"message": msg}), status))
    };
    let plan = match embed_plan(step) {
        Ok(plan) => plan,
        Err(Failure::Status(s)) => return error(s, "scripted failure"),
        Err(failure) => {
            return failed(
                failure,
                |s, msg| serde_json::json!({"message": format!("{s}: {msg}")}),
            )
        }
    };
    match bedrock::invoke_embeddings(&body, plan.dims) {
        Ok(v) => {
            pause(plan.delay).await;
            bedrock::with_headers(json_reply(v, plan.cut))
        }
        Err(msg) => error(400, &msg),
    }
}

/// Bedrock Converse: the model id is the (percent-decoded) path segment.
pub(crate) async fn bedrock_converse(
    State(m): Shared,
    Path(model): Path<String>,
    req: Request,
) -> Response {
    let wire = bedrock::Converse { stream: false };
    bedrock::with_headers(generate(&m, wire, Some(model), req).await)
}

/// Bedrock ConverseStream, answered in the binary event-stream framing.
pub(crate) async fn bedrock_converse_stream(
    State(m): Shared,
    Path(model): Path<String>,
    req: Request,
) -> Response {
    let wire = bedrock::Converse { stream: true };
    bedrock::with_headers(generate(&m, wire, Some(model), req).await)
}

pub(crate) async fn not_found(State(m): Shared, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = read_body(body).await.unwrap_or_default();
    m.admit(&parts, &body, None);
    let msg = format!("Invalid URL ({} {})", parts.method, parts.uri.path());
    error_response(openai::error_body(404, &msg), 404)
}

pub(crate) async fn method_not_allowed(State(m): Shared, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = read_body(body).await.unwrap_or_default();
    m.admit(&parts, &body, None);
    let msg = format!("Method not allowed: {} {}", parts.method, parts.uri.path());
    error_response(openai::error_body(405, &msg), 405)
}

async fn read_body(body: Body) -> Result<Bytes, String> {
    axum::body::to_bytes(body, BODY_LIMIT)
        .await
        .map_err(|e| format!("could not read the request body: {e}"))
}

/// An error answer; 429s carry `retry-after: 1`.
pub(crate) fn error_response(body: Value, status: u16) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (code, Json(body)).into_response();
    if code == StatusCode::TOO_MANY_REQUESTS {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

fn scripted_error(status: u16, envelope: impl Fn(u16, &str) -> Value) -> Response {
    error_response(envelope(status, &wire::scripted_message(status)), status)
}

/// A 200 whose body plays `items`.
fn streamed(content_type: &'static str, items: Vec<Item>) -> Response {
    let mut resp = Response::new(sse::body(items));
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// A response that drops the connection before a byte is written.
fn close_connection() -> Response {
    streamed("application/json", vec![Item::Fail])
}

/// A complete JSON answer, or with `cut` its headers and (for `cut > 0`) half
/// its bytes before the connection drops.
fn json_reply(body: Value, cut: Option<usize>) -> Response {
    let Some(n) = cut else {
        return Json(body).into_response();
    };
    let bytes = Bytes::from(body.to_string());
    let mut items = Vec::with_capacity(3);
    if n > 0 {
        items.push(Item::Data(bytes.slice(..bytes.len() / 2)));
    }
    items.push(Item::Flush);
    items.push(Item::Fail);
    streamed("application/json", items)
}

/// Serves one generation request in format `W`. `path_model` is the Gemini
/// path model or Azure deployment, which takes precedence as the script key.
async fn generate<W: Wire>(m: &Inner, w: W, path_model: Option<String>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = match read_body(body).await {
        Ok(b) => b,
        Err(msg) => {
            m.admit(&parts, &Bytes::new(), path_model.as_deref());
            return error_response(w.error_body(400, &msg), 400);
        }
    };
    let parsed = w.parse(&body);
    let body_model = parsed.as_ref().ok().and_then(|p| p.model.as_deref());
    let key = path_model.as_deref().or(body_model);
    let step = m.admit(&parts, &body, key);
    let parsed = match parsed {
        Ok(p) => p,
        Err(msg) => return error_response(w.error_body(400, &msg), 400),
    };
    if let Some((status, body)) = parsed.rejection {
        return error_response(body, status);
    }
    let model = parsed
        .model
        .as_deref()
        .or(path_model.as_deref())
        .unwrap_or("unknown");
    let step = step::declared(step, &wire::declared_tools(&body));
    let plan = match step::resolve(step, model, parsed.has_tools, m.chunks()) {
        Ok(plan) => plan,
        Err(failure) => return failed(failure, |s, msg| w.error_body(s, msg)),
    };
    let ctx = Ctx {
        model,
        prompt_tokens: wire::estimate_tokens(body.len()),
        include_usage: parsed.include_usage,
        cache_write: wire::marks_cache(&body),
        asks: parsed.asks,
    };
    if parsed.stream {
        pause(plan.header_delay).await;
        let items = if plan.error_event {
            vec![Item::Data(w.error_event())]
        } else {
            sse::schedule(w.frames(&ctx, &plan.content), &plan)
        };
        streamed(w.stream_content_type(), items)
    } else {
        pause(plan.header_delay + plan.first_token_delay).await;
        if plan.error_event {
            return scripted_error(500, |s, msg| w.error_body(s, msg));
        }
        let reply = w.reply(&ctx, &plan.content);
        if plan.malformed.is_some() {
            return streamed(
                "application/json",
                vec![Item::Data(Bytes::from_static(b"{\"id\":"))],
            );
        }
        if plan.stall.is_some() {
            let bytes = Bytes::from(reply.to_string());
            let mut items = vec![Item::Data(bytes.slice(..bytes.len() / 2))];
            sse::stall(&mut items);
            return streamed("application/json", items);
        }
        if plan.pretty {
            let text = serde_json::to_string_pretty(&reply).unwrap_or_default();
            let mut resp = text.into_response();
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            return resp;
        }
        json_reply(reply, plan.cut)
    }
}

async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

/// How an embeddings request goes, given its step.
struct EmbedPlan {
    delay: Duration,
    dims: usize,
    cut: Option<usize>,
}

/// Turns a step into an embeddings plan, or the status / dropped connection
/// that replaces the answer.
fn embed_plan(step: Step) -> Result<EmbedPlan, Failure> {
    let mut plan = EmbedPlan {
        delay: Duration::ZERO,
        dims: embed::DEFAULT_DIMS,
        cut: None,
    };
    match step {
        Step::Status(code) => return Err(Failure::Status(code)),
        Step::ErrorEvent => return Err(Failure::Status(500)),
        Step::CloseConnection => return Err(Failure::Close),
        reply @ (Step::Reply { .. } | Step::ReplyInPieces { .. }) => {
            return Err(Failure::reply(reply))
        }
        Step::DelayHeaders(d) | Step::DelayFirstToken(d) => plan.delay = d,
        Step::CutAfter(n) => plan.cut = Some(n),
        Step::Embeddings { dims } => plan.dims = dims,
        _ => {}
    }
    Ok(plan)
}

/// The response for a step that replaced an answer, in `envelope`'s format.
fn failed(failure: Failure, envelope: impl Fn(u16, &str) -> Value) -> Response {
    match failure {
        Failure::Status(code) => scripted_error(code, envelope),
        Failure::Reply {
            status,
            body,
            retry_after,
            piece,
        } => {
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            // A body of SSE frames is a stream; anything else is JSON.
            let sse = body.starts_with("event:") || body.starts_with("data:");
            let mut resp = match piece {
                Some(n) => {
                    let mut resp = Response::new(sse::body(in_pieces(Bytes::from(body), n)));
                    *resp.status_mut() = code;
                    resp
                }
                None => (code, body).into_response(),
            };
            let h = resp.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(if sse {
                    "text/event-stream"
                } else {
                    "application/json"
                }),
            );
            if let Some(v) = retry_after.and_then(|v| HeaderValue::from_str(&v).ok()) {
                h.insert(header::RETRY_AFTER, v);
            }
            resp
        }
        Failure::Close => close_connection(),
    }
}

/// `body` as writes of `n` bytes (at least one), each flushed before the next.
fn in_pieces(body: Bytes, n: usize) -> Vec<Item> {
    let n = n.max(1);
    let mut items = Vec::with_capacity(2 * body.len().div_ceil(n));
    let mut at = 0;
    while at < body.len() {
        let end = (at + n).min(body.len());
        items.push(Item::Data(body.slice(at..end)));
        items.push(Item::Flush);
        at = end;
    }
    items
}

async fn openai_embeddings(m: &Inner, deployment: Option<String>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = read_body(body).await.unwrap_or_default();
    let parsed = embed::parse_openai(&body);
    let body_model = parsed.as_ref().ok().and_then(|p| p.model.as_deref());
    let step = m.admit(&parts, &body, deployment.as_deref().or(body_model));
    let parsed = match parsed {
        Ok(p) => p,
        Err(msg) => return error_response(openai::error_body(400, &msg), 400),
    };
    let plan = match embed_plan(step) {
        Ok(plan) => plan,
        Err(failure) => return failed(failure, openai::error_body),
    };
    pause(plan.delay).await;
    json_reply(embed::openai_reply(&parsed, plan.dims), plan.cut)
}

/// Gemini `embedContent`, `batchEmbedContents` and `countTokens`.
async fn gemini_other(m: &Inner, method: &str, model: String, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = read_body(body).await.unwrap_or_default();
    let step = m.admit(&parts, &body, Some(&model));
    let plan = match embed_plan(step) {
        Ok(plan) => plan,
        Err(failure) => return failed(failure, gemini::error_body),
    };
    let answer = match method {
        "embedContent" => gemini::embed_content(&body, plan.dims),
        "batchEmbedContents" => gemini::batch_embed_contents(&body, plan.dims),
        "predict" => gemini::predict(&body, plan.dims),
        _ => Ok(gemini::count_tokens(&body)),
    };
    match answer {
        Ok(value) => {
            pause(plan.delay).await;
            json_reply(value, plan.cut)
        }
        Err(msg) => error_response(gemini::error_body(400, &msg), 400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_in_pieces_is_the_body_in_writes_of_that_size_each_flushed() {
        // The two bytes of "°" land on either side of a write boundary.
        let body = Bytes::from_static("data: {\"t\":\"69°F\"}\r\n\r\n".as_bytes());
        let items = in_pieces(body.clone(), 5);
        let mut sizes = Vec::new();
        let mut joined = Vec::new();
        for pair in items.chunks(2) {
            let [Item::Data(piece), Item::Flush] = pair else {
                panic!("each write is followed by a flush");
            };
            sizes.push(piece.len());
            joined.extend_from_slice(piece);
        }
        assert_eq!(joined, body);
        let want: Vec<usize> = body.chunks(5).map(<[u8]>::len).collect();
        assert_eq!(sizes, want);
        assert_eq!(in_pieces(Bytes::new(), 5).len(), 0);
        // A piece of 0 is a piece of 1.
        assert_eq!(in_pieces(Bytes::from_static(b"ab"), 0).len(), 4);
    }
}
