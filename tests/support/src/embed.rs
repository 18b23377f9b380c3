//! Embeddings: deterministic unit vectors derived from the input, a small
//! base64 encoder for `encoding_format: "base64"`, and the OpenAI
//! `/v1/embeddings` request and response shapes.

use serde::Deserialize;
use serde_json::{json, Value};

use crate::wire;

/// Dimensions when neither the request nor the script says otherwise.
pub(crate) const DEFAULT_DIMS: usize = 8;

/// FNV-1a, 64 bits.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A unit-length vector of `dims` values in [-1, 1], fixed for a given input.
pub(crate) fn vector(input: &[u8], dims: usize) -> Vec<f32> {
    // xorshift64* seeded from the input; the seed must not be zero.
    let mut state = fnv1a(input) | 1;
    let mut v: Vec<f32> = (0..dims)
        .map(|_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let x = state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
            (x as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

/// Standard base64 (RFC 4648, with padding).
pub(crate) fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let sextet = |shift: u32| char::from(ALPHABET[((n >> shift) & 63) as usize]);
        out.push(sextet(18));
        out.push(sextet(12));
        out.push(if chunk.len() > 1 { sextet(6) } else { '=' });
        out.push(if chunk.len() > 2 { sextet(0) } else { '=' });
    }
    out
}

/// The OpenAI `input` field: text(s) or token id array(s).
#[derive(Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u64>),
    TokenLists(Vec<Vec<u64>>),
}

#[derive(Deserialize)]
struct Request {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    input: Option<Input>,
    #[serde(default)]
    dimensions: Option<usize>,
    #[serde(default)]
    encoding_format: Option<String>,
}

/// A parsed OpenAI embeddings request.
pub(crate) struct OpenAiRequest {
    pub(crate) model: Option<String>,
    inputs: Vec<(Vec<u8>, u64)>,
    dimensions: Option<usize>,
    base64: bool,
}

/// Reads an OpenAI embeddings request; `Err` is a message for a 400.
pub(crate) fn parse_openai(body: &[u8]) -> Result<OpenAiRequest, String> {
    let req: Request = serde_json::from_slice(body)
        .map_err(|e| format!("We could not parse the JSON body of your request. ({e})"))?;
    let text = |s: String| {
        let tokens = wire::estimate_tokens(s.chars().count());
        (s.into_bytes(), tokens)
    };
    let ids = |ids: Vec<u64>| {
        let bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        (bytes, ids.len() as u64)
    };
    let inputs = match req.input {
        None => return Err("'input' is a required property".to_owned()),
        Some(Input::Text(s)) => vec![text(s)],
        Some(Input::Texts(v)) => v.into_iter().map(text).collect(),
        Some(Input::Tokens(v)) => vec![ids(v)],
        Some(Input::TokenLists(v)) => v.into_iter().map(ids).collect(),
    };
    if inputs.is_empty() {
        return Err("'input' must not be empty".to_owned());
    }
    if req.dimensions == Some(0) {
        return Err("Invalid value for 'dimensions': must be at least 1.".to_owned());
    }
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(format!(
                "Invalid value for 'encoding_format': '{other}' (expected 'float' or 'base64')."
            ))
        }
    };
    Ok(OpenAiRequest {
        model: req.model,
        inputs,
        dimensions: req.dimensions,
        base64,
    })
}

/// The OpenAI embeddings answer body.
pub(crate) fn openai_reply(req: &OpenAiRequest, default_dims: usize) -> Value {
    let dims = req.dimensions.unwrap_or(default_dims);
    let data: Vec<Value> = req
        .inputs
        .iter()
        .enumerate()
        .map(|(index, (input, _))| {
            let v = vector(input, dims);
            let embedding = if req.base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64(&bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    let tokens: u64 = req.inputs.iter().map(|(_, t)| t).sum();
    json!({
        "object": "list",
        "data": data,
        "model": req.model.as_deref().unwrap_or_default(),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_rfc4648_vectors() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in cases {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
    }

    #[test]
    fn vectors_are_deterministic_unit_length() {
        let a = vector(b"hello", 16);
        assert_eq!(a, vector(b"hello", 16));
        assert_ne!(a, vector(b"hellp", 16));
        let norm: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
        assert!(vector(b"x", 0).is_empty());
    }
}
