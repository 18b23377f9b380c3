//! The embeddings inbound format (`POST /v1/embeddings`, `/api/v1/embeddings`): the
//! request validated rule by rule (SPEC "Embeddings"), and the answer written as one
//! JSON body with float arrays or base64 little-endian f32, never as SSE.

use super::common::{invalid, unsupported};
pub use crate::codec::{decode_base64, encode_base64};
use crate::error::{ApiError, ErrorCode};
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::io::Write as _;

/// The longest `user` accepted, in characters.
pub const MAX_USER_CHARS: usize = 1024;

/// What to embed: texts, or token-ID arrays (never mixed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    Texts(Vec<String>),
    Tokens(Vec<Vec<u32>>),
}

impl Input {
    pub fn len(&self) -> usize {
        match self {
            Input::Texts(t) => t.len(),
            Input::Tokens(t) => t.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Inputs `range` as a new input of the same kind (one upstream batch).
    pub fn slice(&self, range: std::ops::Range<usize>) -> Input {
        match self {
            Input::Texts(t) => Input::Texts(t[range].to_vec()),
            Input::Tokens(t) => Input::Tokens(t[range].to_vec()),
        }
    }

    /// A rough token count (4 characters a token), for providers that report none.
    pub fn estimated_tokens(&self) -> u64 {
        match self {
            Input::Texts(t) => t.iter().map(|s| s.chars().count().div_ceil(4) as u64).sum(),
            Input::Tokens(t) => t.iter().map(|v| v.len() as u64).sum(),
        }
    }
}

/// A validated embeddings request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmbedRequest {
    pub model: String,
    pub input: Input,
    pub dimensions: Option<u32>,
    pub base64: bool,
    /// Attribution only: never forwarded upstream.
    pub user: Option<String>,
}

/// Parses and validates an embeddings body.
pub fn parse(body: &[u8]) -> Result<EmbedRequest, ApiError> {
    let top: BTreeMap<String, &RawValue> = match serde_json::from_slice(body) {
        Ok(t) => t,
        Err(e) if e.is_syntax() || e.is_eof() => return Err(ApiError::invalid_json(e)),
        Err(_) => {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                "The request body must be a JSON object.",
            ))
        }
    };
    let mut model = None;
    let mut input = None;
    let mut dimensions = None;
    let mut base64 = false;
    let mut user = None;
    for (k, v) in &top {
        let raw = v.get();
        match k.as_str() {
            "model" => {
                model = Some(
                    serde_json::from_str::<String>(raw)
                        .map_err(|_| invalid("model", "`model` must be a string slug."))?,
                )
            }
            "input" => input = Some(parse_input(raw)?),
            "dimensions" if raw == "null" => {}
            "dimensions" => match serde_json::from_str::<u64>(raw) {
                Ok(d) if d > 0 && d <= u32::MAX as u64 => dimensions = Some(d as u32),
                _ => {
                    return Err(invalid(
                        "dimensions",
                        "`dimensions` must be a positive integer.",
                    ))
                }
            },
            "encoding_format" => match raw {
                "null" | r#""float""# => base64 = false,
                r#""base64""# => base64 = true,
                _ => {
                    return Err(invalid(
                        "encoding_format",
                        "`encoding_format` must be \"float\" or \"base64\".",
                    ))
                }
            },
            "stream" => match raw {
                "null" | "false" => {}
                "true" => {
                    return Err(unsupported(
                        "stream",
                        "Embeddings are answered in one body; streaming is not supported.",
                    ))
                }
                _ => return Err(invalid("stream", "`stream` must be a boolean.")),
            },
            "user" if raw == "null" => {}
            "user" => {
                let u: String = serde_json::from_str(raw)
                    .map_err(|_| invalid("user", "`user` must be a string."))?;
                let n = u.chars().count();
                if n > MAX_USER_CHARS {
                    return Err(invalid(
                        "user",
                        format!("`user` is {n} characters long; the limit is {MAX_USER_CHARS}."),
                    ));
                }
                user = Some(u);
            }
            other => {
                return Err(unsupported(
                    other,
                    format!("The parameter `{other}` is not accepted on the embeddings route."),
                ))
            }
        }
    }
    let model = model.ok_or_else(|| {
        ApiError::new(ErrorCode::InvalidRequest, "`model` is required.").param("model")
    })?;
    let input = input.ok_or_else(|| {
        ApiError::new(ErrorCode::InvalidRequest, "`input` is required.").param("input")
    })?;
    Ok(EmbedRequest {
        model,
        input,
        dimensions,
        base64,
        user,
    })
}

fn token(raw: &RawValue) -> Result<u32, ApiError> {
    let t = raw.get();
    // Integers only: `1.0`, `1e3`, `true` and `-1` are all refused.
    if t.starts_with('-') {
        return Err(invalid("input", "Token IDs must not be negative."));
    }
    if !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(
            "input",
            "Token IDs must be non-negative integers (no booleans, floats or strings).",
        ));
    }
    t.parse::<u32>()
        .map_err(|_| invalid("input", "A token ID is out of range."))
}

fn parse_input(raw: &str) -> Result<Input, ApiError> {
    let not_input = || {
        invalid(
            "input",
            "`input` must be a non-empty string, a list of non-empty strings, an array of token IDs, or a list of token-ID arrays.",
        )
    };
    // The value's kind by its first byte: the whole value stays unparsed until its
    // items are read one by one, so `1` and `1.0` stay apart.
    match raw.trim_start().as_bytes().first() {
        Some(b'"') => {
            let s: String = serde_json::from_str(raw).map_err(|_| not_input())?;
            if s.is_empty() {
                return Err(invalid("input", "`input` must not be empty."));
            }
            Ok(Input::Texts(vec![s]))
        }
        Some(b'[') => {
            let items: Vec<&RawValue> = serde_json::from_str(raw).map_err(|_| not_input())?;
            if items.is_empty() {
                return Err(invalid("input", "`input` must not be an empty array."));
            }
            let first = items[0].get();
            if first.starts_with('"') {
                let mut texts = Vec::with_capacity(items.len());
                for it in items {
                    let s: String = serde_json::from_str(it.get()).map_err(|_| {
                        invalid("input", "Texts and token IDs cannot be mixed in one batch.")
                    })?;
                    if s.is_empty() {
                        return Err(invalid("input", "`input` must not contain empty strings."));
                    }
                    texts.push(s);
                }
                Ok(Input::Texts(texts))
            } else if first.starts_with('[') {
                let mut lists = Vec::with_capacity(items.len());
                for it in items {
                    let inner: Vec<&RawValue> = serde_json::from_str(it.get()).map_err(|_| {
                        invalid("input", "Texts and token IDs cannot be mixed in one batch.")
                    })?;
                    if inner.is_empty() {
                        return Err(invalid("input", "Token-ID arrays must not be empty."));
                    }
                    lists.push(
                        inner
                            .into_iter()
                            .map(token)
                            .collect::<Result<Vec<_>, _>>()?,
                    );
                }
                Ok(Input::Tokens(lists))
            } else {
                let ids = items
                    .into_iter()
                    .map(|it| {
                        if it.get().starts_with('"') || it.get().starts_with('[') {
                            Err(invalid(
                                "input",
                                "Texts and token IDs cannot be mixed in one batch.",
                            ))
                        } else {
                            token(it)
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Input::Tokens(vec![ids]))
            }
        }
        _ => Err(not_input()),
    }
}

/// Writes the answer: `data[i]` for input `i`, floats or base64 of little-endian f32,
/// `usage.prompt_tokens == usage.total_tokens`.
pub fn render(
    model: &str,
    vectors: &[Vec<f32>],
    base64: bool,
    tokens: u64,
    cost_usd: Option<f64>,
    provider: &str,
) -> Vec<u8> {
    let per = vectors.first().map_or(0, |v| v.len());
    let mut out =
        Vec::with_capacity(128 + vectors.len() * (64 + per * if base64 { 6 } else { 12 }));
    out.extend_from_slice(br#"{"object":"list","data":["#);
    let mut fbuf = ryu::Buffer::new();
    let mut bytes = Vec::with_capacity(per * 4);
    for (i, v) in vectors.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = write!(out, r#"{{"object":"embedding","index":{i},"embedding":"#);
        if base64 {
            bytes.clear();
            for x in v {
                bytes.extend_from_slice(&x.to_le_bytes());
            }
            out.push(b'"');
            encode_base64(&bytes, &mut out);
            out.push(b'"');
        } else {
            out.push(b'[');
            for (j, x) in v.iter().enumerate() {
                if j > 0 {
                    out.push(b',');
                }
                if x.is_finite() {
                    out.extend_from_slice(fbuf.format_finite(*x).as_bytes());
                } else {
                    out.extend_from_slice(b"0.0");
                }
            }
            out.push(b']');
        }
        out.push(b'}');
    }
    out.extend_from_slice(br#"],"model":"#);
    out.extend_from_slice(&serde_json::to_vec(model).unwrap_or_default());
    let _ = write!(
        out,
        r#","usage":{{"prompt_tokens":{tokens},"total_tokens":{tokens}"#
    );
    if let Some(cost) = cost_usd {
        out.extend_from_slice(br#","cost":"#);
        out.extend_from_slice(serde_json::to_string(&cost).unwrap_or_default().as_bytes());
    }
    out.extend_from_slice(br#"},"provider":"#);
    out.extend_from_slice(&serde_json::to_vec(provider).unwrap_or_default());
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(body: serde_json::Value) -> (ErrorCode, Option<String>) {
        let e = parse(&serde_json::to_vec(&body).unwrap()).unwrap_err();
        (e.code, e.param.map(|p| p.to_string()))
    }

    #[test]
    fn every_input_form_parses() {
        let p = |input: serde_json::Value| {
            parse(&serde_json::to_vec(&json!({"model": "m", "input": input})).unwrap())
                .unwrap()
                .input
        };
        assert_eq!(p(json!("a")), Input::Texts(vec!["a".into()]));
        assert_eq!(
            p(json!(["a", "b"])),
            Input::Texts(vec!["a".into(), "b".into()])
        );
        assert_eq!(p(json!([1, 2, 3])), Input::Tokens(vec![vec![1, 2, 3]]));
        assert_eq!(
            p(json!([[1], [2, 3]])),
            Input::Tokens(vec![vec![1], vec![2, 3]])
        );
    }

    #[test]
    fn every_validation_rule_has_its_code_and_param() {
        use ErrorCode::*;
        let cases = [
            (
                json!({"model": "m", "input": ""}),
                InvalidParameter,
                "input",
            ),
            (
                json!({"model": "m", "input": []}),
                InvalidParameter,
                "input",
            ),
            (
                json!({"model": "m", "input": ["a", ""]}),
                InvalidParameter,
                "input",
            ),
            (
                json!({"model": "m", "input": [[1], []]}),
                InvalidParameter,
                "input",
            ),
            (
                json!({"model": "m", "input": ["a", 1]}),
                InvalidParameter,
                "input",
            ),
            (
                json!({"model": "m", "input": [1, "a"]}),
                InvalidParameter,
                "input",
            ),
            (
                json!({"model": "m", "input": [[1], "a"]}),
                InvalidParameter,
                "input",
            ),
            (
                json!({"model": "m", "input": [1, -2]}),
                InvalidParameter,
                "input",
            ),
            (
                json!({"model": "m", "input": [1, 2.5]}),
                InvalidParameter,
                "input",
            ),
            (
                json!({"model": "m", "input": [1.0]}),
                InvalidParameter,
                "input",
            ),
            (
                json!({"model": "m", "input": [true]}),
                InvalidParameter,
                "input",
            ),
            (json!({"model": "m", "input": 7}), InvalidParameter, "input"),
            (
                json!({"model": "m", "input": "a", "dimensions": 0}),
                InvalidParameter,
                "dimensions",
            ),
            (
                json!({"model": "m", "input": "a", "dimensions": -3}),
                InvalidParameter,
                "dimensions",
            ),
            (
                json!({"model": "m", "input": "a", "dimensions": 2.5}),
                InvalidParameter,
                "dimensions",
            ),
            (
                json!({"model": "m", "input": "a", "encoding_format": "int8"}),
                InvalidParameter,
                "encoding_format",
            ),
            (
                json!({"model": "m", "input": "a", "stream": true}),
                UnsupportedParameter,
                "stream",
            ),
            (
                json!({"model": "m", "input": "a", "stream": "no"}),
                InvalidParameter,
                "stream",
            ),
            (
                json!({"model": "m", "input": "a", "user": "u".repeat(1025)}),
                InvalidParameter,
                "user",
            ),
            (
                json!({"model": "m", "input": "a", "temperature": 1}),
                UnsupportedParameter,
                "temperature",
            ),
            (
                json!({"model": "m", "input": "a", "tools": []}),
                UnsupportedParameter,
                "tools",
            ),
            (json!({"input": "a"}), InvalidRequest, "model"),
            (json!({"model": "m"}), InvalidRequest, "input"),
        ];
        for (body, code, param) in cases {
            assert_eq!(err(body.clone()), (code, Some(param.to_string())), "{body}");
        }
        assert!(parse(
            &serde_json::to_vec(
                &json!({"model": "m", "input": "a", "user": "u".repeat(1024), "stream": false})
            )
            .unwrap()
        )
        .is_ok());
    }

    #[test]
    fn base64_is_little_endian_f32_and_round_trips() {
        let mut out = Vec::new();
        encode_base64(b"foobar", &mut out);
        assert_eq!(out, b"Zm9vYmFy");
        for (plain, enc) in [("f", "Zg=="), ("fo", "Zm8="), ("foob", "Zm9vYg==")] {
            let mut out = Vec::new();
            encode_base64(plain.as_bytes(), &mut out);
            assert_eq!(out, enc.as_bytes());
            assert_eq!(decode_base64(enc).unwrap(), plain.as_bytes());
        }
        let body = render("m", &[vec![1.0, -0.5]], true, 3, Some(0.25), "openai:m");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let b = decode_base64(v["data"][0]["embedding"].as_str().unwrap()).unwrap();
        assert_eq!(b, [1.0f32.to_le_bytes(), (-0.5f32).to_le_bytes()].concat());
        assert_eq!(v["usage"]["prompt_tokens"], v["usage"]["total_tokens"]);
        assert_eq!(v["usage"]["cost"], 0.25);
    }

    #[test]
    fn floats_render_as_json_numbers_in_input_order() {
        let body = render(
            "m",
            &[vec![0.25, 1.0], vec![-3.5e-7, 0.0]],
            false,
            9,
            None,
            "p",
        );
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["data"][1]["index"], 1);
        assert_eq!(v["data"][0]["embedding"], json!([0.25, 1.0]));
        assert_eq!(
            v["data"][1]["embedding"][0].as_f64().unwrap() as f32,
            -3.5e-7
        );
        assert_eq!(v["object"], "list");
    }
}
