//! Embedding wires: OpenAI-compatible `/embeddings` (openai, azure, mistral, hosted,
//! local), Gemini `batchEmbedContents` (google), Vertex AI `predict` (vertex) and
//! Bedrock `invoke` for Amazon Titan (one text a call) and Cohere (batches).
//! Each renders one batch and decodes its vectors in input order; the gateway
//! splits a large batch at the provider's limit and merges the answers.

use crate::inbound::embeddings::{decode_base64, Input};
use crate::ir::DecodeError;
use serde::Deserialize;
use serde_json::{json, Value};

/// How a provider serves embeddings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbedWire {
    OpenAi,
    Gemini,
    Vertex,
    /// Amazon Titan text embeddings on Bedrock: `{inputText}` per call.
    Titan,
    /// Cohere embed on Bedrock: `{texts, input_type}`.
    Cohere,
}

impl EmbedWire {
    pub fn for_rung(provider: &str, model_id: &str) -> Option<EmbedWire> {
        Some(match provider {
            "openai" | "azure" | "mistral" | "hosted" | "local" => EmbedWire::OpenAi,
            "google" => EmbedWire::Gemini,
            "vertex" => EmbedWire::Vertex,
            "bedrock" if model_id.contains("cohere.") => EmbedWire::Cohere,
            "bedrock" => EmbedWire::Titan,
            _ => return None,
        })
    }

    /// Whether the wire takes token-ID input (only OpenAI's does).
    pub fn takes_tokens(self, provider: &str) -> bool {
        self == EmbedWire::OpenAi && matches!(provider, "openai" | "azure")
    }
}

/// The most inputs one upstream call may carry, by provider (their published limits;
/// a conservative figure where none is published).
pub fn batch_limit(wire: EmbedWire, provider: &str) -> usize {
    match wire {
        EmbedWire::Titan => return 1,
        EmbedWire::Cohere => return 96,
        _ => {}
    }
    match provider {
        "openai" | "azure" => 2048,
        "google" => 100,
        "vertex" => 250,
        "mistral" => 512,
        _ => 256,
    }
}

/// One batch's body.
pub fn render(wire: EmbedWire, input: &Input, model_id: &str, dimensions: Option<u32>) -> Vec<u8> {
    let body = match wire {
        EmbedWire::OpenAi => {
            let mut b = json!({"model": model_id, "encoding_format": "float"});
            b["input"] = match input {
                Input::Texts(t) => json!(t),
                Input::Tokens(t) => json!(t),
            };
            if let Some(d) = dimensions {
                b["dimensions"] = json!(d);
            }
            b
        }
        EmbedWire::Gemini => {
            let texts: &[String] = match input {
                Input::Texts(t) => t,
                Input::Tokens(_) => &[],
            };
            let requests: Vec<Value> = texts
                .iter()
                .map(|t| {
                    let mut r = json!({"model": format!("models/{model_id}"),
                                       "content": {"parts": [{"text": t}]}});
                    if let Some(d) = dimensions {
                        r["outputDimensionality"] = json!(d);
                    }
                    r
                })
                .collect();
            json!({"requests": requests})
        }
        EmbedWire::Vertex => {
            let texts: &[String] = match input {
                Input::Texts(t) => t,
                Input::Tokens(_) => &[],
            };
            let instances: Vec<Value> = texts.iter().map(|t| json!({"content": t})).collect();
            let mut b = json!({"instances": instances});
            if let Some(d) = dimensions {
                b["parameters"] = json!({"outputDimensionality": d});
            }
            b
        }
        EmbedWire::Titan => {
            let text = match input {
                Input::Texts(t) => t.first().cloned().unwrap_or_default(),
                Input::Tokens(_) => String::new(),
            };
            let mut b = json!({"inputText": text, "normalize": true});
            if let Some(d) = dimensions {
                b["dimensions"] = json!(d);
            }
            b
        }
        EmbedWire::Cohere => {
            let texts: &[String] = match input {
                Input::Texts(t) => t,
                Input::Tokens(_) => &[],
            };
            json!({"texts": texts, "input_type": "search_document", "embedding_types": ["float"]})
        }
    };
    serde_json::to_vec(&body).unwrap_or_default()
}

/// One batch's answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Embedded {
    pub vectors: Vec<Vec<f32>>,
    /// Input tokens the provider reported (`None`: it reports none).
    pub tokens: Option<u64>,
    pub model: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Vector {
    Floats(Vec<f32>),
    Base64(String),
}

fn floats(v: Vector) -> Result<Vec<f32>, DecodeError> {
    match v {
        Vector::Floats(f) => Ok(f),
        Vector::Base64(s) => {
            let bytes = decode_base64(&s).ok_or_else(|| DecodeError("bad base64 vector".into()))?;
            Ok(bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        }
    }
}

/// Decodes one batch's answer, vectors in input order.
pub fn decode(wire: EmbedWire, body: &[u8], expected: usize) -> Result<Embedded, DecodeError> {
    let bad = |e: serde_json::Error| DecodeError(format!("embeddings answer: {e}"));
    let out = match wire {
        EmbedWire::OpenAi => {
            #[derive(Deserialize)]
            struct Item {
                #[serde(default)]
                index: Option<usize>,
                embedding: Vector,
            }
            #[derive(Deserialize)]
            struct Usage {
                #[serde(default)]
                prompt_tokens: Option<u64>,
                #[serde(default)]
                total_tokens: Option<u64>,
            }
            #[derive(Deserialize)]
            struct Answer {
                data: Vec<Item>,
                #[serde(default)]
                model: Option<String>,
                #[serde(default)]
                usage: Option<Usage>,
            }
            let a: Answer = serde_json::from_slice(body).map_err(bad)?;
            let mut slots: Vec<Option<Vec<f32>>> = vec![None; a.data.len()];
            for (n, item) in a.data.into_iter().enumerate() {
                let at = item.index.unwrap_or(n);
                let slot = slots
                    .get_mut(at)
                    .ok_or_else(|| DecodeError(format!("index {at} out of range")))?;
                *slot = Some(floats(item.embedding)?);
            }
            Embedded {
                vectors: slots
                    .into_iter()
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| DecodeError("an index is missing".into()))?,
                tokens: a.usage.and_then(|u| u.prompt_tokens.or(u.total_tokens)),
                model: a.model,
            }
        }
        EmbedWire::Gemini => {
            #[derive(Deserialize)]
            struct Values {
                values: Vec<f32>,
            }
            #[derive(Deserialize)]
            struct Answer {
                embeddings: Vec<Values>,
            }
            let a: Answer = serde_json::from_slice(body).map_err(bad)?;
            Embedded {
                vectors: a.embeddings.into_iter().map(|e| e.values).collect(),
                tokens: None,
                model: None,
            }
        }
        EmbedWire::Vertex => {
            #[derive(Deserialize)]
            struct Stats {
                #[serde(default)]
                token_count: Option<f64>,
            }
            #[derive(Deserialize)]
            struct Emb {
                values: Vec<f32>,
                #[serde(default)]
                statistics: Option<Stats>,
            }
            #[derive(Deserialize)]
            struct Prediction {
                embeddings: Emb,
            }
            #[derive(Deserialize)]
            struct Answer {
                predictions: Vec<Prediction>,
            }
            let a: Answer = serde_json::from_slice(body).map_err(bad)?;
            let mut tokens = 0u64;
            let mut all = true;
            let vectors = a
                .predictions
                .into_iter()
                .map(|p| {
                    match p.embeddings.statistics.and_then(|s| s.token_count) {
                        Some(t) => tokens = tokens.saturating_add(t as u64),
                        None => all = false,
                    }
                    p.embeddings.values
                })
                .collect();
            Embedded {
                vectors,
                tokens: all.then_some(tokens),
                model: None,
            }
        }
        EmbedWire::Titan => {
            #[derive(Deserialize)]
            #[serde(rename_all = "camelCase")]
            struct Answer {
                embedding: Vec<f32>,
                #[serde(default)]
                input_text_token_count: Option<u64>,
            }
            let a: Answer = serde_json::from_slice(body).map_err(bad)?;
            Embedded {
                vectors: vec![a.embedding],
                tokens: a.input_text_token_count,
                model: None,
            }
        }
        EmbedWire::Cohere => {
            // `embeddings` is a list of vectors, or `{float: [...]}` when
            // `embedding_types` was given.
            #[derive(Deserialize)]
            #[serde(untagged)]
            enum Vectors {
                Plain(Vec<Vec<f32>>),
                Typed { float: Vec<Vec<f32>> },
            }
            #[derive(Deserialize)]
            struct Answer {
                embeddings: Vectors,
            }
            let a: Answer = serde_json::from_slice(body).map_err(bad)?;
            Embedded {
                vectors: match a.embeddings {
                    Vectors::Plain(v) | Vectors::Typed { float: v } => v,
                },
                tokens: None,
                model: None,
            }
        }
    };
    if out.vectors.len() != expected {
        return Err(DecodeError(format!(
            "{} vectors for {expected} inputs",
            out.vectors.len()
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_answers_are_put_back_in_input_order_and_base64_is_read() {
        let body = br#"{"object":"list","model":"text-embedding-3-small","data":[
            {"object":"embedding","index":1,"embedding":[0.5,0.25]},
            {"object":"embedding","index":0,"embedding":"AACAPwAAAL8="}],
            "usage":{"prompt_tokens":7,"total_tokens":7}}"#;
        let e = decode(EmbedWire::OpenAi, body, 2).unwrap();
        assert_eq!(e.vectors, vec![vec![1.0, -0.5], vec![0.5, 0.25]]);
        assert_eq!(e.tokens, Some(7));
        assert!(decode(EmbedWire::OpenAi, body, 3).is_err());
    }

    #[test]
    fn bedrock_titan_and_cohere_bodies_and_answers() {
        let one = Input::Texts(vec!["a".into()]);
        let t: Value = serde_json::from_slice(&render(
            EmbedWire::Titan,
            &one,
            "amazon.titan-embed-text-v2:0",
            Some(256),
        ))
        .unwrap();
        assert_eq!(
            t,
            json!({"inputText": "a", "normalize": true, "dimensions": 256})
        );
        let e = decode(
            EmbedWire::Titan,
            br#"{"embedding":[0.5,0.5],"inputTextTokenCount":2}"#,
            1,
        )
        .unwrap();
        assert_eq!((e.vectors.len(), e.tokens), (1, Some(2)));
        let two = Input::Texts(vec!["a".into(), "b".into()]);
        let c: Value = serde_json::from_slice(&render(
            EmbedWire::Cohere,
            &two,
            "cohere.embed-english-v3",
            None,
        ))
        .unwrap();
        assert_eq!(c["texts"], json!(["a", "b"]));
        let e = decode(
            EmbedWire::Cohere,
            br#"{"id":"x","embeddings":{"float":[[1.0],[2.0]]},"texts":["a","b"]}"#,
            2,
        )
        .unwrap();
        assert_eq!(e.vectors, vec![vec![1.0], vec![2.0]]);
        assert_eq!(batch_limit(EmbedWire::Titan, "bedrock"), 1);
    }

    #[test]
    fn gemini_and_vertex_bodies_and_answers() {
        let input = Input::Texts(vec!["a".into(), "b".into()]);
        let g: Value = serde_json::from_slice(&render(
            EmbedWire::Gemini,
            &input,
            "gemini-embedding-001",
            Some(768),
        ))
        .unwrap();
        assert_eq!(g["requests"][1]["content"]["parts"][0]["text"], "b");
        assert_eq!(g["requests"][0]["model"], "models/gemini-embedding-001");
        assert_eq!(g["requests"][0]["outputDimensionality"], 768);
        let v: Value =
            serde_json::from_slice(&render(EmbedWire::Vertex, &input, "m", None)).unwrap();
        assert_eq!(
            v,
            json!({"instances": [{"content": "a"}, {"content": "b"}]})
        );
        let answer = br#"{"predictions":[{"embeddings":{"values":[1.0],"statistics":{"token_count":3,"truncated":false}}},{"embeddings":{"values":[2.0],"statistics":{"token_count":4}}}]}"#;
        let e = decode(EmbedWire::Vertex, answer, 2).unwrap();
        assert_eq!(e.tokens, Some(7));
        let answer = br#"{"embeddings":[{"values":[1.0,2.0]},{"values":[3.0,4.0]}]}"#;
        assert_eq!(
            decode(EmbedWire::Gemini, answer, 2).unwrap().vectors[1],
            vec![3.0, 4.0]
        );
    }
}
