//! Bedrock Converse wire format (`/model/{modelId}/converse` and
//! `/model/{modelId}/converse-stream`): ConverseResponse bodies, the
//! converse-stream events in the AWS event-stream binary framing
//! (`application/vnd.amazon.eventstream`, both CRC32s correct, every payload
//! padded with Bedrock's `p` member), and Bedrock's `{message}` error body with
//! its `x-amzn-errortype` header. The SigV4 `Authorization` header is not
//! checked (it is recorded like every header).
//!
//! Scripted steps map as for the other wires; a refusal is a guardrail
//! intervention: no content and `stopReason: guardrail_intervened`; the in-band
//! error is an `internalServerException` frame.

use axum::{
    http::{HeaderName, HeaderValue},
    response::Response,
};
use bytes::Bytes;
use serde::{de::IgnoredAny, Deserialize};
use serde_json::{json, Value};

use crate::{
    sse::{json_str, Frames},
    step::Content,
    wire::{self, Ctx, Parsed, Wire},
};

/// Content type of a converse-stream answer.
pub(crate) const EVENT_STREAM: &str = "application/vnd.amazon.eventstream";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request {
    #[serde(default)]
    messages: Option<Vec<IgnoredAny>>,
    #[serde(default)]
    tool_config: Option<ToolConfig>,
}

#[derive(Deserialize)]
struct ToolConfig {
    #[serde(default)]
    tools: Option<Vec<IgnoredAny>>,
}

/// The exception name Bedrock gives an HTTP status.
pub(crate) fn error_type(status: u16) -> &'static str {
    match status {
        400 => "ValidationException",
        403 => "AccessDeniedException",
        404 => "ResourceNotFoundException",
        408 => "ModelTimeoutException",
        424 => "ModelErrorException",
        429 => "ThrottlingException",
        503 => "ServiceUnavailableException",
        _ => "InternalServerException",
    }
}

/// Adds Bedrock's response headers: a request id always, and on an error the
/// `x-amzn-errortype` naming its exception.
pub(crate) fn with_headers(mut resp: Response) -> Response {
    let status = resp.status().as_u16();
    let headers = resp.headers_mut();
    let id = format!("mock-{}", wire::next_id());
    if let Ok(v) = HeaderValue::from_str(&id) {
        headers.insert(HeaderName::from_static("x-amzn-requestid"), v);
    }
    if status >= 400 {
        let kind = format!(
            "{}:http://internal.amazon.com/coral/com.amazon.bedrock/",
            error_type(status)
        );
        if let Ok(v) = HeaderValue::from_str(&kind) {
            headers.insert(HeaderName::from_static("x-amzn-errortype"), v);
        }
    }
    resp
}

/// The CRC-32 (IEEE) lookup table, built at compile time.
const CRC_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// CRC-32 (IEEE 802.3), as the event-stream framing uses it.
pub(crate) fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c = CRC_TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// One event-stream message with string headers: prelude (total length, headers
/// length, prelude CRC), headers, payload, message CRC.
pub(crate) fn encode(headers: &[(&str, &str)], payload: &[u8]) -> Bytes {
    let headers_len: usize = headers.iter().map(|(n, v)| n.len() + v.len() + 4).sum();
    let total = 16 + headers_len + payload.len();
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&(total as u32).to_be_bytes());
    out.extend_from_slice(&(headers_len as u32).to_be_bytes());
    let prelude_crc = crc32(&out);
    out.extend_from_slice(&prelude_crc.to_be_bytes());
    for (name, value) in headers {
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
        out.push(7);
        out.extend_from_slice(&(value.len() as u16).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out.extend_from_slice(payload);
    let crc = crc32(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    Bytes::from(out)
}

/// An `event` message.
fn event(event_type: &str, payload: &str) -> Bytes {
    encode(
        &[
            (":event-type", event_type),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload.as_bytes(),
    )
}

/// An `exception` message.
fn exception(exception_type: &str, message: &str) -> Bytes {
    let payload = json!({ "message": message }).to_string();
    encode(
        &[
            (":exception-type", exception_type),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        payload.as_bytes(),
    )
}

/// Bedrock pads every stream payload with a `p` member of varying length.
fn pad(n: usize) -> &'static str {
    const ALPHABET: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    &ALPHABET[..1 + (n * 7) % (ALPHABET.len() - 1)]
}

fn stop_reason(content: &Content) -> &'static str {
    match content {
        Content::Text(_) => "end_turn",
        Content::Exhausted(_) => "max_tokens",
        Content::Refusal(_) => "guardrail_intervened",
        Content::ToolCall { .. } => "tool_use",
    }
}

/// The tool input object parsed from the scripted arguments text.
fn tool_input(arguments: &str) -> Value {
    serde_json::from_str::<Value>(arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

fn usage(ctx: &Ctx<'_>, content: &Content) -> Value {
    let (written, input) = ctx.cache_split();
    let output = output_tokens(content);
    let mut v = json!({"inputTokens": input, "outputTokens": output, "totalTokens": ctx.prompt_tokens + output});
    if written > 0 {
        v["cacheWriteInputTokens"] = written.into();
        v["cacheReadInputTokens"] = 0.into();
    }
    v
}

fn output_tokens(content: &Content) -> u64 {
    match content {
        // A guardrail stops the model before it writes.
        Content::Refusal(_) => 0,
        other => other.tokens(),
    }
}

/// Bedrock Converse and ConverseStream.
pub(crate) struct Converse {
    pub(crate) stream: bool,
}

impl Wire for Converse {
    fn parse(&self, body: &[u8]) -> Result<Parsed, String> {
        let req: Request = serde_json::from_slice(body).map_err(|e| {
            format!("Malformed input request: {e}, please reformat your input and try again.")
        })?;
        if req.messages.is_none() {
            return Err("1 validation error detected: Value null at 'messages' failed to satisfy constraint: Member must not be null".into());
        }
        Ok(Parsed {
            model: None,
            stream: self.stream,
            include_usage: false,
            has_tools: wire::non_empty(&req.tool_config.and_then(|t| t.tools)),
            rejection: None,
            asks: Default::default(),
        })
    }

    fn reply(&self, ctx: &Ctx<'_>, content: &Content) -> Value {
        let blocks = match content {
            Content::Text(p) | Content::Exhausted(p) if p.is_empty() => json!([]),
            Content::Text(p) | Content::Exhausted(p) => json!([{"text": p.text()}]),
            Content::Refusal(_) => json!([]),
            Content::ToolCall { name, arguments } => json!([{"toolUse": {
                "toolUseId": format!("tooluse_mock{}", wire::next_id()),
                "name": name,
                "input": tool_input(arguments.text()),
            }}]),
        };
        json!({
            "output": {"message": {"role": "assistant", "content": blocks}},
            "stopReason": stop_reason(content),
            "usage": usage(ctx, content),
            "metrics": {"latencyMs": 1},
        })
    }

    fn frames(&self, ctx: &Ctx<'_>, content: &Content) -> Frames {
        let mut pre = vec![event(
            "messageStart",
            &format!(r#"{{"p":"{}","role":"assistant"}}"#, pad(0)),
        )];
        let (pieces, delta_head) = match content {
            Content::Text(p) | Content::Exhausted(p) => (Some(p), r#"{"text":"#),
            Content::Refusal(_) => (None, ""),
            Content::ToolCall { name, arguments } => {
                let start = json!({
                    "contentBlockIndex": 0,
                    "p": pad(1),
                    "start": {"toolUse": {
                        "toolUseId": format!("tooluse_mock{}", wire::next_id()),
                        "name": name,
                    }},
                });
                pre.push(event("contentBlockStart", &start.to_string()));
                (Some(arguments), r#"{"toolUse":{"input":"#)
            }
        };
        let delta_tail = if delta_head.contains("toolUse") {
            "}}"
        } else {
            "}"
        };
        let content_frames: Vec<Bytes> = pieces
            .into_iter()
            .flat_map(|p| p.iter())
            .enumerate()
            .map(|(i, piece)| {
                let payload = format!(
                    r#"{{"contentBlockIndex":0,"delta":{delta_head}{}{delta_tail},"p":"{}"}}"#,
                    json_str(piece),
                    pad(i + 2)
                );
                event("contentBlockDelta", &payload)
            })
            .collect();
        let has_block = matches!(content, Content::ToolCall { .. })
            || matches!(content, Content::Text(p) | Content::Exhausted(p) if !p.is_empty());
        let mut post = Vec::with_capacity(3);
        if has_block {
            post.push(event(
                "contentBlockStop",
                &format!(r#"{{"contentBlockIndex":0,"p":"{}"}}"#, pad(3)),
            ));
        }
        post.push(event(
            "messageStop",
            &format!(
                r#"{{"p":"{}","stopReason":"{}"}}"#,
                pad(4),
                stop_reason(content)
            ),
        ));
        let metadata = json!({
            "metrics": {"latencyMs": 1},
            "p": pad(5),
            "usage": usage(ctx, content),
        });
        post.push(event("metadata", &metadata.to_string()));
        Frames {
            pre,
            content: content_frames,
            post,
        }
    }

    fn error_event(&self) -> Bytes {
        exception(
            "internalServerException",
            "The system encountered an unexpected error during processing. Try your request again.",
        )
    }

    fn error_body(&self, _status: u16, message: &str) -> Value {
        json!({ "message": message })
    }

    fn stream_content_type(&self) -> &'static str {
        EVENT_STREAM
    }
}

/// Cohere's batch limit on Bedrock.
const COHERE_BATCH_LIMIT: usize = 96;

/// A Bedrock `InvokeModel` embeddings answer: Amazon Titan (`{inputText}`, one text)
/// or Cohere (`{texts}`, a batch of at most 96).
pub(crate) fn invoke_embeddings(body: &[u8], dims: usize) -> Result<Value, String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("Malformed input request: {e}"))?;
    if let Some(text) = v.get("inputText").and_then(Value::as_str) {
        let d = v
            .get("dimensions")
            .and_then(Value::as_u64)
            .map_or(dims, |d| d as usize);
        return Ok(json!({
            "embedding": crate::embed::vector(text.as_bytes(), d),
            "inputTextTokenCount": crate::wire::estimate_tokens(text.chars().count()),
        }));
    }
    let texts: Vec<&str> = v
        .get("texts")
        .and_then(Value::as_array)
        .ok_or("Malformed input request: expected inputText or texts")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    if texts.len() > COHERE_BATCH_LIMIT {
        return Err(format!(
            "Malformed input request: #/texts: expected maxItems: {COHERE_BATCH_LIMIT}, actual: {}",
            texts.len()
        ));
    }
    let vectors: Vec<Value> = texts
        .iter()
        .map(|t| json!(crate::embed::vector(t.as_bytes(), dims)))
        .collect();
    Ok(
        json!({"id": "mock-embed", "embeddings": {"float": vectors}, "texts": texts,
              "response_type": "embeddings_by_type"}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{step::Pieces, Mock, Step};
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpStream,
    };

    /// One decoded message: (message type, event or exception type, payload JSON).
    type Message = (String, String, Value);

    /// Decodes an event stream, checking both CRCs of every message.
    fn decode(mut bytes: &[u8]) -> Vec<Message> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
            let total = be(&bytes[0..4]);
            let headers_len = be(&bytes[4..8]);
            assert_eq!(crc32(&bytes[0..8]), be(&bytes[8..12]) as u32, "prelude CRC");
            let msg = &bytes[..total];
            assert_eq!(
                crc32(&msg[..total - 4]),
                be(&msg[total - 4..]) as u32,
                "message CRC"
            );
            let mut h = &msg[12..12 + headers_len];
            let (mut kind, mut name) = (String::new(), String::new());
            while !h.is_empty() {
                let n = usize::from(h[0]);
                let key = std::str::from_utf8(&h[1..1 + n]).unwrap().to_owned();
                assert_eq!(h[1 + n], 7, "string header");
                let len = usize::from(u16::from_be_bytes([h[2 + n], h[3 + n]]));
                let value = std::str::from_utf8(&h[4 + n..4 + n + len])
                    .unwrap()
                    .to_owned();
                h = &h[4 + n + len..];
                match key.as_str() {
                    ":message-type" => kind = value,
                    ":event-type" | ":exception-type" => name = value,
                    _ => {}
                }
            }
            let payload = serde_json::from_slice(&msg[12 + headers_len..total - 4]).unwrap();
            out.push((kind, name, payload));
            bytes = &bytes[total..];
        }
        out
    }

    #[test]
    fn crc_is_ieee() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    fn ctx() -> Ctx<'static> {
        Ctx {
            model: "anthropic.claude-3-5-haiku-20241022-v1:0",
            prompt_tokens: 7,
            include_usage: false,
            cache_write: false,
            asks: Default::default(),
        }
    }

    fn all(frames: Frames) -> Vec<u8> {
        frames
            .pre
            .iter()
            .chain(&frames.content)
            .chain(&frames.post)
            .flat_map(|b| b.iter().copied())
            .collect()
    }

    #[test]
    fn text_stream_events() {
        let content = Content::Text(Pieces::split("Hello there".into(), 3));
        let msgs = decode(&all(Converse { stream: true }.frames(&ctx(), &content)));
        let names: Vec<&str> = msgs.iter().map(|(_, n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "messageStart",
                "contentBlockDelta",
                "contentBlockDelta",
                "contentBlockDelta",
                "contentBlockStop",
                "messageStop",
                "metadata"
            ]
        );
        let text: String = msgs
            .iter()
            .filter_map(|(_, _, p)| p["delta"]["text"].as_str())
            .collect();
        assert_eq!(text, "Hello there");
        assert!(msgs
            .iter()
            .all(|(k, _, p)| k == "event" && p["p"].is_string()));
        assert_eq!(msgs[5].2["stopReason"], "end_turn");
        assert_eq!(msgs[6].2["usage"]["inputTokens"], 7);
        assert_eq!(msgs[6].2["usage"]["outputTokens"], 3);
    }

    #[test]
    fn tool_call_and_refusal() {
        let content = Content::ToolCall {
            name: "get_weather".into(),
            arguments: Pieces::split(r#"{"city":"Paris"}"#.into(), 2),
        };
        let msgs = decode(&all(Converse { stream: true }.frames(&ctx(), &content)));
        assert_eq!(msgs[1].1, "contentBlockStart");
        assert_eq!(msgs[1].2["start"]["toolUse"]["name"], "get_weather");
        let input: String = msgs
            .iter()
            .filter_map(|(_, _, p)| p["delta"]["toolUse"]["input"].as_str())
            .collect();
        assert_eq!(input, r#"{"city":"Paris"}"#);
        assert_eq!(msgs[msgs.len() - 2].2["stopReason"], "tool_use");
        let reply = Converse { stream: false }.reply(&ctx(), &content);
        assert_eq!(
            reply["output"]["message"]["content"][0]["toolUse"]["input"]["city"],
            "Paris"
        );

        let refusal = Content::Refusal(Pieces::split("no".into(), 1));
        let msgs = decode(&all(Converse { stream: true }.frames(&ctx(), &refusal)));
        let names: Vec<&str> = msgs.iter().map(|(_, n, _)| n.as_str()).collect();
        assert_eq!(names, ["messageStart", "messageStop", "metadata"]);
        assert_eq!(msgs[1].2["stopReason"], "guardrail_intervened");
        let reply = Converse { stream: false }.reply(&ctx(), &refusal);
        assert_eq!(reply["stopReason"], "guardrail_intervened");
        assert_eq!(reply["output"]["message"]["content"], json!([]));

        let msgs = decode(&Converse { stream: true }.error_event());
        assert_eq!(msgs[0].0, "exception");
        assert_eq!(msgs[0].1, "internalServerException");
    }

    /// A raw HTTP/1.1 exchange: status, lowercase headers, de-chunked body.
    async fn post(mock: &Mock, path: &str, body: &str) -> (u16, Vec<(String, String)>, Vec<u8>) {
        let mut tcp = TcpStream::connect(mock.addr()).await.unwrap();
        let req = format!(
            "POST {path} HTTP/1.1\r\nhost: bedrock-runtime.us-east-1.amazonaws.com\r\n\
             authorization: AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20250101/us-east-1/bedrock/aws4_request, SignedHeaders=host;x-amz-date, Signature=abc\r\n\
             x-amz-date: 20250101T000000Z\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        tcp.write_all(req.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        let _ = tcp.read_to_end(&mut raw).await;
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let mut lines = head.split("\r\n");
        let status = lines.next().unwrap()[9..12].parse().unwrap();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(": "))
            .map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned()))
            .collect();
        let mut rest = &raw[split + 4..];
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v == "chunked");
        if !chunked {
            return (status, headers, rest.to_vec());
        }
        let mut body = Vec::new();
        loop {
            let nl = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..nl]).unwrap(), 16).unwrap();
            if size == 0 {
                break;
            }
            body.extend_from_slice(&rest[nl + 2..nl + 2 + size]);
            rest = &rest[nl + 4 + size..];
        }
        (status, headers, body)
    }

    fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    #[tokio::test]
    async fn served_over_http() {
        let mock = Mock::start().await;
        let model = "us.anthropic.claude-3-5-haiku-20241022-v1:0";
        let body = r#"{"messages":[{"role":"user","content":[{"text":"hi"}]}]}"#;

        let (status, headers, bytes) = post(
            &mock,
            "/model/us.anthropic.claude-3-5-haiku-20241022-v1%3A0/converse",
            body,
        )
        .await;
        assert_eq!(status, 200);
        assert!(header(&headers, "x-amzn-requestid").is_some());
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            v["output"]["message"]["content"][0]["text"],
            format!("Hello from mock {model}.")
        );
        assert_eq!(v["stopReason"], "end_turn");

        let (status, headers, bytes) = post(
            &mock,
            "/model/us.anthropic.claude-3-5-haiku-20241022-v1%3A0/converse-stream",
            body,
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(header(&headers, "content-type"), Some(EVENT_STREAM));
        let msgs = decode(&bytes);
        assert_eq!(msgs.first().unwrap().1, "messageStart");
        assert_eq!(msgs.last().unwrap().1, "metadata");

        // Recorded under the decoded model id, SigV4 header included.
        let recorded = mock.requests_for(model);
        assert_eq!(recorded.len(), 2);
        assert!(recorded[0]
            .header("authorization")
            .unwrap()
            .starts_with("AWS4-HMAC-SHA256"));
        assert_eq!(mock.count(model), 2);

        mock.script(model, vec![Step::Status(429), Step::ErrorEvent]);
        let (status, headers, bytes) = post(
            &mock,
            "/model/us.anthropic.claude-3-5-haiku-20241022-v1%3A0/converse",
            body,
        )
        .await;
        assert_eq!(status, 429);
        assert!(header(&headers, "x-amzn-errortype")
            .unwrap()
            .starts_with("ThrottlingException:"));
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert!(v["message"].as_str().unwrap().contains("429"));

        let (status, _, bytes) = post(
            &mock,
            "/model/us.anthropic.claude-3-5-haiku-20241022-v1%3A0/converse-stream",
            body,
        )
        .await;
        assert_eq!(status, 200);
        let msgs = decode(&bytes);
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].0, "exception");

        let (status, headers, _) = post(
            &mock,
            "/model/us.anthropic.claude-3-5-haiku-20241022-v1%3A0/converse",
            "{}",
        )
        .await;
        assert_eq!(status, 400);
        assert!(header(&headers, "x-amzn-errortype")
            .unwrap()
            .starts_with("ValidationException:"));
        mock.shutdown();
    }
}
