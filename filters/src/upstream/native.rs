//! Bodies for a rung that speaks the client's own format (a responses client on
//! OpenAI's responses API, a messages client on Anthropic): every member passes
//! through verbatim, except the ones the gateway owns.

use super::spliced::Spliced;
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
    render_spliced(wire, object, model_id, stream).flatten()
}

/// [`render`], with the client's long values borrowed rather than copied.
pub fn render_spliced<'a>(
    wire: Wire,
    object: &RawObject<'a>,
    model_id: &str,
    stream: bool,
) -> Spliced<'a> {
    let rules = owned(wire, stream);
    let values = object.iter().map(|(_, v)| v.get());
    let mut out = Spliced::for_values(values, 64 + 16 * object.len());
    let model = serde_json::to_vec(model_id).unwrap_or_default();
    out.key("model");
    out.bytes.extend_from_slice(&model);
    for (k, v) in object.iter() {
        if k == "model" || rules.iter().any(|(name, _)| *name == k) {
            continue;
        }
        out.key(k);
        out.put_value(v.get().as_bytes());
    }
    for (name, value) in rules {
        if let Some(v) = value {
            out.key(name);
            out.bytes.extend_from_slice(v.as_bytes());
        }
    }
    out.bytes.push(b'}');
    out
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
