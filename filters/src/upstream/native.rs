//! Bodies for a rung that speaks the client's own format (a responses client on
//! OpenAI's responses API, a messages client on Anthropic): every member passes
//! through verbatim, except the ones the gateway owns.

use super::Wire;
use crate::json::RawObject;

/// Members replaced (`Some(json)`) or removed (`None`) on a native body.
fn owned(wire: Wire, stream: bool) -> Vec<(&'static str, Option<&'static str>)> {
    let stream = Some(if stream { "true" } else { "false" });
    match wire {
        // Nothing is stored with the provider; continuation is the gateway's.
        Wire::OpenAiResponses => vec![
            ("stream", stream),
            ("store", Some("false")),
            ("prompt_cache_key", None),
            ("previous_response_id", None),
        ],
        _ => vec![("stream", stream), ("prompt_cache_key", None)],
    }
}

/// The client's members with the rung's model id and the gateway-owned members
/// replaced or removed.
pub fn render(wire: Wire, object: &RawObject, model_id: &str, stream: bool) -> Vec<u8> {
    let rules = owned(wire, stream);
    let mut out = Vec::with_capacity(64 + object.value_bytes());
    out.push(b'{');
    let model = serde_json::to_vec(model_id).unwrap_or_default();
    put(&mut out, "model", &model);
    for (k, v) in object.iter() {
        if k == "model" || rules.iter().any(|(name, _)| *name == k) {
            continue;
        }
        put(&mut out, k, v.get().as_bytes());
    }
    for (name, value) in rules {
        if let Some(v) = value {
            put(&mut out, name, v.as_bytes());
        }
    }
    out.push(b'}');
    out
}

fn put(out: &mut Vec<u8>, k: &str, v: &[u8]) {
    if out.len() > 1 {
        out.push(b',');
    }
    // Keys came from a JSON document: serializing a str cannot fail.
    out.extend_from_slice(&serde_json::to_vec(k).unwrap_or_default());
    out.push(b':');
    out.extend_from_slice(v);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_bodies_never_store_upstream_nor_carry_gateway_fields() {
        let o = RawObject::parse(
            r#"{"model":"gpt-5","input":"hi","store":true,"prompt_cache_key":"k","previous_response_id":null,"reasoning":{"effort":"low"}}"#,
        )
        .unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&render(Wire::OpenAiResponses, &o, "gpt-5-2025-08-07", true))
                .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"model":"gpt-5-2025-08-07","input":"hi","store":false,"stream":true,"reasoning":{"effort":"low"}})
        );
    }

    #[test]
    fn messages_bodies_pass_through_with_the_rung_model() {
        let o = RawObject::parse(
            r#"{"model":"claude-sonnet-4.5","max_tokens":10,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[]}"#,
        )
        .unwrap();
        let body = render(Wire::Anthropic, &o, "claude-sonnet-4-5-20250929", false);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"model":"claude-sonnet-4-5-20250929","max_tokens":10,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[],"stream":false})
        );
    }
}
