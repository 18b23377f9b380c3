//! The parameter policy: for each rung of a route, which requested fields are
//! honoured, which are dropped (and disclosed in `x-service-ignored-parameters`),
//! and which capabilities or fields refuse the whole request with a 400 before
//! anything is charged or sent.
//!
//! Decisions come from the rung's declared (or probed) capabilities and from what
//! its wire can carry, never from the model's name.

use crate::error::{ApiError, ErrorCode};
use crate::inbound::Inbound;
use crate::ir::{Part, Request, ResponseFormat};
use crate::upstream::Wire;
use serde_json::Value;
use std::collections::BTreeMap;

/// Whether a wire carries the field at all (before capabilities).
fn carries(wire: Wire, f: Field) -> bool {
    use Field::*;
    match wire {
        Wire::OpenAiChat => !matches!(f, TopK),
        Wire::OpenAiResponses => !matches!(f, TopK | FrequencyPenalty | PresencePenalty | Stop),
        Wire::Anthropic => !matches!(f, FrequencyPenalty | PresencePenalty | Logprobs),
        Wire::Gemini => !matches!(f, Logprobs),
        Wire::Bedrock => !matches!(f, TopK | FrequencyPenalty | PresencePenalty | Logprobs),
    }
}

/// What the policy needs to know of one rung.
#[derive(Clone, Copy, Debug)]
pub struct RungFacts<'a> {
    pub wire: Wire,
    /// The rung's provider speaks the inbound format natively (a responses client on
    /// an OpenAI responses rung, a messages client on an Anthropic rung).
    pub native: bool,
    /// The rung serves a model of the Anthropic family (anthropic, or Claude on
    /// bedrock/vertex): extended thinking works there.
    pub claude: bool,
    pub caps: &'a [String],
}

impl RungFacts<'_> {
    fn has(&self, cap: &str) -> bool {
        self.caps.iter().any(|c| c == cap)
    }
}

/// What the policy needs to know of the model.
#[derive(Clone, Copy, Debug)]
pub struct ModelFacts<'a> {
    pub modalities: &'a [String],
    /// Sampling values the model pins: another value is refused.
    pub pinned: &'a BTreeMap<String, Value>,
    /// The `[1m]` suffix asked for the 1M-token window.
    pub long_context_1m: bool,
}

/// One rung that may serve the request, and what it drops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RungPlan {
    /// Position of the rung in the route.
    pub index: usize,
    /// Inbound field names this rung will not receive.
    pub dropped: Vec<String>,
}

/// Sampling-style fields whose support varies by rung.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Temperature,
    TopP,
    TopK,
    FrequencyPenalty,
    PresencePenalty,
    Stop,
    Logprobs,
}

impl Field {
    /// The field's name in the inbound format (its `param`).
    fn name(self, inbound: Inbound) -> &'static str {
        match (self, inbound) {
            (Field::Temperature, _) => "temperature",
            (Field::TopP, _) => "top_p",
            (Field::TopK, _) => "top_k",
            (Field::FrequencyPenalty, _) => "frequency_penalty",
            (Field::PresencePenalty, _) => "presence_penalty",
            (Field::Stop, Inbound::Messages) => "stop_sequences",
            (Field::Stop, _) => "stop",
            (Field::Logprobs, _) => "top_logprobs",
        }
    }

    /// Whether a rung that carries it must also sample (reasoning-only models
    /// reject these).
    fn needs_sampling(self) -> bool {
        !matches!(self, Field::Stop)
    }
}

impl Field {
    const ALL: [Field; 7] = [
        Field::Temperature,
        Field::TopP,
        Field::TopK,
        Field::FrequencyPenalty,
        Field::PresencePenalty,
        Field::Stop,
        Field::Logprobs,
    ];

    /// Clears the field from the canonical request, so no wire renders it.
    fn clear(self, req: &mut Request) {
        match self {
            Field::Temperature => req.temperature = None,
            Field::TopP => req.top_p = None,
            Field::TopK => req.top_k = None,
            Field::FrequencyPenalty => req.frequency_penalty = None,
            Field::PresencePenalty => req.presence_penalty = None,
            Field::Stop => req.stop.clear(),
            Field::Logprobs => req
                .extras
                .retain(|e| !matches!(e.name.as_str(), "logprobs" | "top_logprobs")),
        }
    }
}

/// The policy's fields among `dropped` (a rung's `RungPlan::dropped`, named as
/// the `inbound` format names them).
fn dropped_fields(inbound: Inbound, dropped: &[String]) -> impl Iterator<Item = Field> + '_ {
    Field::ALL
        .into_iter()
        .filter(move |f| dropped.iter().any(|d| d == f.name(inbound)))
}

/// Whether a rung that drops `dropped` needs the canonical request stripped
/// (`strip`) before its wire renders it.
pub fn strips(inbound: Inbound, dropped: &[String]) -> bool {
    dropped_fields(inbound, dropped).next().is_some()
}

/// Clears from `req` every field the policy dropped for a rung: a translated
/// rung's wire renders what the canonical request holds.
pub fn strip(req: &mut Request, inbound: Inbound, dropped: &[String]) {
    for f in dropped_fields(inbound, dropped) {
        f.clear(req);
    }
}

/// The fields a request sets, with their values where pinning applies.
fn requested(req: &Request) -> Vec<(Field, Option<f64>)> {
    let mut out = Vec::new();
    let mut put = |f, v: Option<f64>, set: bool| {
        if set {
            out.push((f, v));
        }
    };
    put(
        Field::Temperature,
        req.temperature,
        req.temperature.is_some(),
    );
    put(Field::TopP, req.top_p, req.top_p.is_some());
    put(Field::TopK, None, req.top_k.is_some());
    put(
        Field::FrequencyPenalty,
        req.frequency_penalty,
        req.frequency_penalty.is_some(),
    );
    put(
        Field::PresencePenalty,
        req.presence_penalty,
        req.presence_penalty.is_some(),
    );
    put(Field::Stop, None, !req.stop.is_empty());
    let logprobs = req.extras.iter().any(|e| {
        matches!(e.name.as_str(), "logprobs" | "top_logprobs")
            && e.value.get() != "null"
            && e.value.get() != "false"
    });
    put(Field::Logprobs, None, logprobs);
    out
}

fn capability_error(param: &str, what: &str) -> ApiError {
    ApiError::new(
        ErrorCode::UnsupportedCapability,
        format!("No rung of this model's route supports {what}."),
    )
    .param(param.to_string())
}

/// The capabilities a request needs, each with its `param` and a description.
fn needs(
    req: &Request,
    inbound: Inbound,
    model: &ModelFacts,
) -> Vec<(&'static str, String, &'static str)> {
    let mut out = Vec::new();
    if !req.tools.is_empty() {
        out.push(("tools", "tools".to_string(), "tool calling"));
    }
    match &req.response_format {
        Some(ResponseFormat::JsonObject) => out.push((
            "json_object",
            format_param(inbound),
            "JSON mode (json_object)",
        )),
        Some(ResponseFormat::JsonSchema { .. }) => out.push((
            "json_schema",
            format_param(inbound),
            "structured outputs (json_schema)",
        )),
        _ => {}
    }
    if req.reasoning.is_some() {
        let param = match inbound {
            Inbound::Chat => "reasoning_effort",
            Inbound::Responses => "reasoning",
            Inbound::Messages => "thinking",
        };
        out.push(("reasoning", param.to_string(), "reasoning controls"));
    }
    if model.long_context_1m {
        out.push((
            "long_context_1m",
            "model".to_string(),
            "the 1M-token context window",
        ));
    }
    out
}

fn format_param(inbound: Inbound) -> String {
    match inbound {
        Inbound::Responses => "text.format".into(),
        _ => "response_format".into(),
    }
}

/// Reasoning is served by a rung that declares `reasoning` or `thinking`; a
/// capability the rung's wire has no form for is never served there, whatever the
/// declaration says (JSON mode on Anthropic's wire would be a silent downgrade to
/// prose).
fn rung_has(r: &RungFacts, cap: &str) -> bool {
    let wire_can = !(r.wire == Wire::Anthropic && cap == "json_object");
    wire_can
        && match cap {
            "reasoning" => r.has("reasoning") || r.has("thinking"),
            c => r.has(c),
        }
}

/// Decides, for a request and a route, the rungs that may serve it and what each
/// drops; or the 400 that refuses it.
pub fn plan(
    req: &Request,
    inbound: Inbound,
    model: &ModelFacts,
    rungs: &[RungFacts],
) -> Result<Vec<RungPlan>, ApiError> {
    if req.has_media() {
        if inbound == Inbound::Messages {
            return Err(ApiError::new(
                ErrorCode::UnsupportedCapability,
                "Image and document blocks are not accepted on the messages route (text only).",
            )
            .param("messages"));
        }
        if !model.modalities.iter().any(|m| m == "image") {
            return Err(ApiError::new(
                ErrorCode::UnsupportedCapability,
                "This model does not accept image or document input.",
            )
            .param("messages"));
        }
    }
    if inbound == Inbound::Messages {
        messages_route_limits(req, rungs)?;
    }
    // Capabilities: skip rungs without them; refuse when none is left.
    let wanted = needs(req, inbound, model);
    let mut eligible: Vec<usize> = (0..rungs.len()).collect();
    for (cap, param, what) in &wanted {
        eligible.retain(|&i| rung_has(&rungs[i], cap));
        if eligible.is_empty() {
            return Err(capability_error(param, what));
        }
    }
    // Pinned sampling values.
    for (field, value) in requested(req) {
        let name = field.name(inbound);
        if let (Some(pin), Some(v)) = (model.pinned.get(name), value) {
            if pin.as_f64() != Some(v) {
                return Err(ApiError::new(
                    ErrorCode::InvalidParameter,
                    format!("This model pins {name} to {pin}; another value is not accepted."),
                )
                .param(name));
            }
        }
    }
    // Fields: dropped where a rung cannot use them, refused where none can.
    let fields = requested(req);
    let mut plans: Vec<RungPlan> = eligible
        .iter()
        .map(|&index| RungPlan {
            index,
            dropped: Vec::new(),
        })
        .collect();
    for (field, value) in fields {
        let name = field.name(inbound);
        let takes = |r: &RungFacts| {
            carries(r.wire, field) && (!field.needs_sampling() || r.has("sampling"))
        };
        let pinned_ok = value.is_some() && model.pinned.contains_key(name);
        if !pinned_ok && !eligible.iter().any(|&i| takes(&rungs[i])) {
            return Err(ApiError::new(
                ErrorCode::UnsupportedParameter,
                format!("No rung of this model's route accepts `{name}`."),
            )
            .param(name));
        }
        for p in &mut plans {
            if !takes(&rungs[p.index]) {
                p.dropped.push(name.to_string());
            }
        }
    }
    Ok(plans)
}

/// SPEC "Messages route limits": thinking only where every rung is Claude, and
/// `tool_result.is_error` only on a native single-maker route.
fn messages_route_limits(req: &Request, rungs: &[RungFacts]) -> Result<(), ApiError> {
    let all_claude = rungs.iter().all(|r| r.claude);
    // The messages envelope has no `param`: the message leads with it, as
    // Anthropic's own errors do.
    let refuse_thinking = |param: String| {
        ApiError::new(
            ErrorCode::UnsupportedCapability,
            format!("{param}: extended thinking is served only on routes whose every rung is an Anthropic model."),
        )
        .param(param)
    };
    if req.reasoning.is_some() && !all_claude {
        return Err(refuse_thinking("thinking".into()));
    }
    let native = rungs.iter().all(|r| r.native && r.wire == Wire::Anthropic);
    for (i, m) in req.messages.iter().enumerate() {
        for (j, p) in m.parts.iter().enumerate() {
            match p {
                // Signed or not: nothing of it may be dropped silently.
                Part::Thinking { .. } | Part::EncryptedReasoning { .. } if !all_claude => {
                    return Err(refuse_thinking(req.part_param(i, j)));
                }
                Part::ToolResult { is_error: true, .. } if !native => {
                    let param = format!("{}.is_error", req.part_param(i, j));
                    return Err(ApiError::new(
                        ErrorCode::UnsupportedParameter,
                        format!("{param}: tool_result.is_error is accepted only on routes served natively by Anthropic."),
                    )
                    .param(param));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Message, Reasoning, Role, Tool};

    fn caps(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn rung(wire: Wire, caps: &[String]) -> RungFacts<'_> {
        RungFacts {
            wire,
            native: false,
            claude: wire == Wire::Anthropic,
            caps,
        }
    }

    fn model<'a>(pinned: &'a BTreeMap<String, Value>, modalities: &'a [String]) -> ModelFacts<'a> {
        ModelFacts {
            modalities,
            pinned,
            long_context_1m: false,
        }
    }

    fn text_request() -> Request {
        Request {
            model: "m".into(),
            messages: vec![Message {
                role: Role::User,
                parts: vec![Part::text("hi")],
            }],
            ..Request::default()
        }
    }

    #[test]
    fn top_p_is_dropped_on_a_rung_that_does_not_sample_and_kept_on_one_that_does() {
        let sampling = caps(&["sampling"]);
        let reasoning = caps(&["reasoning"]);
        let rungs = [
            rung(Wire::OpenAiChat, &reasoning),
            rung(Wire::OpenAiChat, &sampling),
        ];
        let pinned = BTreeMap::new();
        let mods = caps(&["text"]);
        let mut req = text_request();
        req.top_p = Some(0.5);
        let plans = plan(&req, Inbound::Chat, &model(&pinned, &mods), &rungs).unwrap();
        assert_eq!(plans[0].dropped, vec!["top_p".to_string()]);
        assert!(plans[1].dropped.is_empty());
    }

    #[test]
    fn temperature_on_a_reasoning_only_route_is_refused() {
        let reasoning = caps(&["reasoning"]);
        let rungs = [rung(Wire::OpenAiChat, &reasoning)];
        let pinned = BTreeMap::new();
        let mods = caps(&["text"]);
        let mut req = text_request();
        req.temperature = Some(0.3);
        let e = plan(&req, Inbound::Chat, &model(&pinned, &mods), &rungs).unwrap_err();
        assert_eq!(e.code, ErrorCode::UnsupportedParameter);
        assert_eq!(e.param.as_deref(), Some("temperature"));
    }

    #[test]
    fn a_pinned_value_refuses_another_and_accepts_itself() {
        let reasoning = caps(&["reasoning"]);
        let rungs = [rung(Wire::OpenAiChat, &reasoning)];
        let mut pinned = BTreeMap::new();
        pinned.insert("temperature".to_string(), Value::from(1.0));
        let mods = caps(&["text"]);
        let mut req = text_request();
        req.temperature = Some(0.2);
        let e = plan(&req, Inbound::Chat, &model(&pinned, &mods), &rungs).unwrap_err();
        assert_eq!(
            (e.code, e.param.as_deref()),
            (ErrorCode::InvalidParameter, Some("temperature"))
        );
        req.temperature = Some(1.0);
        let plans = plan(&req, Inbound::Chat, &model(&pinned, &mods), &rungs).unwrap();
        assert_eq!(plans[0].dropped, vec!["temperature".to_string()]);
    }

    #[test]
    fn structured_output_skips_rungs_without_it_and_refuses_when_none_is_left() {
        let full = caps(&["json_object", "json_schema", "sampling"]);
        let object_only = caps(&["json_object", "sampling"]);
        let pinned = BTreeMap::new();
        let mods = caps(&["text"]);
        let mut req = text_request();
        req.response_format = Some(ResponseFormat::JsonSchema {
            name: "x".into(),
            description: None,
            schema: serde_json::value::RawValue::from_string("{}".into()).unwrap(),
            strict: Some(true),
        });
        let rungs = [
            rung(Wire::Gemini, &object_only),
            rung(Wire::OpenAiChat, &full),
        ];
        let plans = plan(&req, Inbound::Chat, &model(&pinned, &mods), &rungs).unwrap();
        assert_eq!(plans.iter().map(|p| p.index).collect::<Vec<_>>(), vec![1]);
        let rungs = [rung(Wire::Gemini, &object_only)];
        let e = plan(&req, Inbound::Responses, &model(&pinned, &mods), &rungs).unwrap_err();
        assert_eq!(e.code, ErrorCode::UnsupportedCapability);
        assert_eq!(e.param.as_deref(), Some("text.format"));
    }

    #[test]
    fn json_mode_is_never_sent_to_a_wire_without_it() {
        let declared = caps(&["json_object", "sampling"]);
        let pinned = BTreeMap::new();
        let mods = caps(&["text"]);
        let mut req = text_request();
        req.response_format = Some(ResponseFormat::JsonObject);
        let rungs = [rung(Wire::Anthropic, &declared)];
        let e = plan(&req, Inbound::Chat, &model(&pinned, &mods), &rungs).unwrap_err();
        assert_eq!(
            (e.code, e.param.as_deref()),
            (ErrorCode::UnsupportedCapability, Some("response_format"))
        );
    }

    #[test]
    fn tools_and_reasoning_are_whole_capabilities() {
        let plain = caps(&["sampling"]);
        let rungs = [rung(Wire::OpenAiChat, &plain)];
        let pinned = BTreeMap::new();
        let mods = caps(&["text"]);
        let mut req = text_request();
        req.tools.push(Tool {
            name: "f".into(),
            description: None,
            parameters: serde_json::value::RawValue::from_string("{}".into()).unwrap(),
            strict: None,
        });
        let e = plan(&req, Inbound::Chat, &model(&pinned, &mods), &rungs).unwrap_err();
        assert_eq!(
            (e.code, e.param.as_deref()),
            (ErrorCode::UnsupportedCapability, Some("tools"))
        );
        let mut req = text_request();
        req.reasoning = Some(Reasoning {
            effort: Some("high".into()),
            ..Reasoning::default()
        });
        let e = plan(&req, Inbound::Chat, &model(&pinned, &mods), &rungs).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("reasoning_effort"));
    }

    #[test]
    fn top_k_goes_only_where_a_wire_carries_it() {
        let sampling = caps(&["sampling"]);
        let pinned = BTreeMap::new();
        let mods = caps(&["text"]);
        let mut req = text_request();
        req.top_k = Some(40);
        let rungs = [rung(Wire::OpenAiChat, &sampling)];
        let e = plan(&req, Inbound::Chat, &model(&pinned, &mods), &rungs).unwrap_err();
        assert_eq!(
            (e.code, e.param.as_deref()),
            (ErrorCode::UnsupportedParameter, Some("top_k"))
        );
        let rungs = [
            rung(Wire::OpenAiChat, &sampling),
            rung(Wire::Anthropic, &sampling),
        ];
        let plans = plan(&req, Inbound::Chat, &model(&pinned, &mods), &rungs).unwrap();
        assert_eq!(plans[0].dropped, vec!["top_k".to_string()]);
        assert!(plans[1].dropped.is_empty());
    }

    #[test]
    fn messages_route_refuses_media_foreign_thinking_and_non_native_is_error() {
        let sampling = caps(&["sampling", "thinking"]);
        let pinned = BTreeMap::new();
        let mods = caps(&["text", "image"]);
        let mut req = text_request();
        req.messages[0].parts.push(Part::Image {
            url: "data:image/png;base64,AA==".into(),
            detail: None,
        });
        let rungs = [rung(Wire::Anthropic, &sampling)];
        let e = plan(&req, Inbound::Messages, &model(&pinned, &mods), &rungs).unwrap_err();
        assert_eq!(e.code, ErrorCode::UnsupportedCapability);
        let mut req = text_request();
        req.reasoning = Some(Reasoning {
            budget_tokens: Some(2048),
            ..Reasoning::default()
        });
        let mixed = [
            rung(Wire::Anthropic, &sampling),
            rung(Wire::OpenAiChat, &sampling),
        ];
        let e = plan(&req, Inbound::Messages, &model(&pinned, &mods), &mixed).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("thinking"));
        assert!(plan(&req, Inbound::Messages, &model(&pinned, &mods), &rungs).is_ok());
        let mut req = text_request();
        req.messages.push(Message {
            role: Role::Tool,
            parts: vec![Part::ToolResult {
                call_id: "c".into(),
                content: vec![Part::text("boom")],
                is_error: true,
            }],
        });
        let e = plan(&req, Inbound::Messages, &model(&pinned, &mods), &rungs).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[1].content[0].is_error"));
        let mut native = rungs;
        native[0].native = true;
        assert!(plan(&req, Inbound::Messages, &model(&pinned, &mods), &native).is_ok());
    }
}
