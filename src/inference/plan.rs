//! What a request will be served by: the parsed request (`ParsedRequest`), and the rungs the
//! policy lets serve it (`PlannedRung`s), each with its wire, its target, what it drops and
//! the headers it needs, decided once before the first attempt.

use super::admit::AnthropicHeaders;
use super::Engine;
use crate::byok::{Lane, RouteRung};
use crate::catalog::Model;
use crate::hooks::LoopPart;
use crate::upstream::{OutBody, Target};
use bytes::Bytes;
use serde_json::value::RawValue;
use sluice_filters::inbound::chat::without_answer_keys;
use sluice_filters::inbound::history::without_gateway_reasoning;
use sluice_filters::inbound::Inbound;
use sluice_filters::ir::watch::Watch;
use sluice_filters::ir::{Request, ServerSearch};
use sluice_filters::json::{append_member, RawObject};
use sluice_filters::policy::{self, ModelFacts, RungFacts};
use sluice_filters::upstream::is_claude;
use sluice_filters::upstream::openai_chat::render_spliced;
use sluice_filters::upstream::Wire;
use sluice_filters::upstream::{native, reasoning_maker};
use sluice_filters::{ApiError, ErrorCode};
use std::sync::Arc;

/// One inference request, parsed.
pub(crate) struct ParsedRequest<'a> {
    pub(crate) inbound: Inbound,
    /// The canonical form, for rungs of another wire.
    pub(crate) req: Request,
    /// The client's top-level members, unparsed, for native rungs.
    pub(crate) object: RawObject<'a>,
    /// The client's body that `object` borrows from: a native rung's long values
    /// are sent as slices of it.
    pub(crate) source: Bytes,
    pub(crate) stream: bool,
    /// The `[1m]` suffix asked for the 1M-token window.
    pub(crate) long_context: bool,
    /// Messages: the client's Anthropic headers beyond the spoken version.
    pub(crate) anthropic: Option<Box<AnthropicHeaders>>,
    /// The active route for the org, in order, each rung with its lane.
    pub(crate) rungs: Vec<RouteRung>,
    pub(crate) org_id: String,
    /// The request is long enough for a provider to cache its prefix.
    pub(crate) cacheable: bool,
    /// Responses: the store keeps this turn and the client did not ask for the
    /// encrypted reasoning, so the gateway asks a reasoning rung for it (and the
    /// client's answer goes without it).
    pub(crate) keep_reasoning: bool,
    /// A feature's part in the attempt loop (none on the common request): the
    /// canonical path for every rung, request-level drops, a service-run search,
    /// rounds between model calls.
    pub(crate) part: Option<Box<dyn LoopPart>>,
}

/// Providers cache prompt prefixes of about 1,024 tokens and more; a shorter
/// conversation has no cache to stay near (about 4 bytes per token of JSON).
pub(crate) const CACHEABLE_BYTES: usize = 4_096;

impl ParsedRequest<'_> {
    /// Every rung takes the canonical path: a feature rewrites the request or its
    /// answer.
    pub(super) fn canonical(&self) -> bool {
        self.part.as_ref().is_some_and(|p| p.canonical())
    }

    /// The request-level drops a feature disclosed.
    pub(super) fn disclosed(&self) -> &[String] {
        self.part.as_ref().map_or(&[], |p| p.disclosed())
    }

    /// The search the gateway ran, shown and cited in the answer.
    pub(super) fn search(&self) -> Option<Arc<ServerSearch>> {
        self.part.as_ref().and_then(|p| p.search())
    }

    /// The watch for the next model call's round calls.
    pub(super) fn watch(&self) -> Option<Watch> {
        self.part.as_ref().and_then(|p| p.watch())
    }

    /// The counter that remembers which rung holds this conversation's prompt
    /// cache: keyed by `prompt_cache_key` when given, else by the conversation's
    /// prefix (instructions, tools, first message), which every later turn repeats.
    pub(super) fn affinity_key(&self) -> Option<String> {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        match &self.req.prompt_cache_key {
            Some(k) => {
                h.update(b"key\0");
                h.update(k.as_bytes());
            }
            None => {
                let first = self.req.messages.first()?;
                h.update(b"prefix\0");
                h.update(serde_json::to_vec(&(&self.req.system, &self.req.tools, first)).ok()?);
            }
        }
        let digest = hex::encode(&h.finalize()[..12]);
        Some(format!("aff:{}:{}:{digest}", self.org_id, self.req.model))
    }

    /// The stable value sent as `prompt_cache_key` to rungs whose provider routes
    /// by it: derived from the client's key, never the key itself.
    pub(super) fn routing_key(&self) -> Option<String> {
        use sha2::{Digest, Sha256};
        let k = self.req.prompt_cache_key.as_ref()?;
        let mut h = Sha256::new();
        for part in ["sluice-cache-route", self.org_id.as_str(), k.as_str()] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        Some(format!("sl-{}", &hex::encode(h.finalize())[..32]))
    }
}

/// One rung the policy let through, and how it is spoken to.
pub(crate) struct PlannedRung {
    pub(crate) target: Arc<Target>,
    pub(crate) wire: Wire,
    pub(crate) native: bool,
    /// Inbound field names this rung does not receive (disclosed).
    pub(crate) dropped: Vec<String>,
    /// Request headers this rung needs for this request.
    pub(crate) headers: Vec<(&'static str, String)>,
    pub(crate) lane: Lane,
    /// The provider routes by `prompt_cache_key` on this rung.
    pub(crate) cache_key_routing: bool,
    /// The rung's model reasons (the `reasoning` capability).
    pub(crate) reasons: bool,
}

/// The beta flag that opens Anthropic's 1M-token window (the `[1m]` suffix): a
/// header to Anthropic and to Vertex, a body member to Bedrock.
pub(crate) const CONTEXT_1M: &str = "context-1m-2025-08-07";

/// The Anthropic headers a rung gets, and the client's it cannot use (disclosed
/// as ignored). Anthropic's own API takes the client's version and beta flags;
/// Vertex and Bedrock serve Claude behind their own versions and take the 1M
/// flag alone; other makers take neither.
fn anthropic_headers(
    provider: &str,
    wire: Wire,
    long_context: bool,
    client: Option<&AnthropicHeaders>,
    dropped: &mut Vec<String>,
) -> Vec<(&'static str, String)> {
    let own = provider == "anthropic";
    let mut headers = Vec::new();
    let mut betas: Vec<&str> = Vec::new();
    if long_context && wire == Wire::Anthropic {
        betas.push(CONTEXT_1M);
    }
    if let Some(c) = client {
        if let Some(v) = &c.version {
            if own {
                headers.push(("anthropic-version", v.clone()));
            } else {
                dropped.push("anthropic-version".into());
            }
        }
        if let Some(b) = &c.beta {
            if own {
                for flag in b.split(',').map(str::trim).filter(|f| !f.is_empty()) {
                    if !betas.contains(&flag) {
                        betas.push(flag);
                    }
                }
            } else {
                dropped.push("anthropic-beta".into());
            }
        }
    }
    if !betas.is_empty() {
        headers.push(("anthropic-beta", betas.join(",")));
    }
    headers
}

/// The rungs of a model that can serve this request, as the policy decides.
pub(super) fn plan(
    engine: &Engine,
    model: &Model,
    parsed: &ParsedRequest,
) -> Result<Vec<PlannedRung>, ApiError> {
    let mut reachable = Vec::new();
    for rung in &parsed.rungs {
        let r = &rung.spec;
        let Some(wire) = Wire::of_rung(&r.provider, &r.provider_model_id, parsed.inbound) else {
            continue;
        };
        let target = if rung.is_platform() {
            engine.upstreams.target(r)
        } else {
            engine
                .upstreams
                .own_target(r, &rung.id, rung.account.as_deref())
        };
        let Some(target) = target else {
            continue;
        };
        reachable.push((r, target, wire, rung.lane));
    }
    if reachable.is_empty() {
        return Err(ApiError::new(
            ErrorCode::UnavailableRoute,
            "No rung of this model can be reached from this gateway.",
        )
        .with_status(503));
    }
    let facts: Vec<RungFacts> = reachable
        .iter()
        .map(|(r, _, wire, _)| RungFacts {
            wire: *wire,
            native: wire.is_native(&r.provider, parsed.inbound),
            claude: is_claude(&r.provider, &r.provider_model_id),
            caps: &r.caps,
        })
        .collect();
    let model_facts = ModelFacts {
        modalities: &model.spec.modalities,
        pinned: &model.spec.pinned,
        long_context_1m: parsed.long_context,
    };
    let plans = policy::plan(&parsed.req, parsed.inbound, &model_facts, &facts)?;
    Ok(plans
        .into_iter()
        .map(|p| {
            let (_, target, wire, lane) = &reachable[p.index];
            let mut dropped = p.dropped;
            let headers = anthropic_headers(
                &target.provider,
                *wire,
                parsed.long_context,
                parsed.anthropic.as_deref(),
                &mut dropped,
            );
            PlannedRung {
                target: target.clone(),
                wire: *wire,
                // The gateway rewrites an orchestrated request or its answer.
                native: facts[p.index].native && !parsed.canonical(),
                dropped,
                headers,
                lane: *lane,
                cache_key_routing: facts[p.index].caps.iter().any(|c| c == "cache_key_routing"),
                reasons: facts[p.index].caps.iter().any(|c| c == "reasoning"),
            }
        })
        .collect())
}

impl ParsedRequest<'_> {
    pub(super) fn inbound_label(&self) -> &'static str {
        match self.inbound {
            Inbound::Chat => "chat",
            Inbound::Responses => "responses",
            Inbound::Messages => "messages",
        }
    }
}

/// What a rung is sent for a request.
pub(crate) struct Rendered {
    pub(crate) body: OutBody,
    /// The `x-service-ignored-parameters` value: what this rung does not receive.
    pub(crate) ignored: Option<String>,
    /// Hidden reasoning of another maker was removed from the history.
    pub(crate) repaired: bool,
}

impl PlannedRung {
    /// The body this rung is sent for the request, and what it does not receive. A native
    /// rung gets the client's own members, less the dropped ones; any other rung the
    /// canonical request rendered for its wire. Rungs whose provider routes by
    /// `prompt_cache_key` get the derived value.
    pub(crate) fn render(&self, parsed: &ParsedRequest) -> Rendered {
        let t = &self.target;
        // Hidden reasoning goes back only to the maker that produced it; anything
        // else is removed from the history this rung gets (and the answer says so).
        let maker = reasoning_maker(self.wire, &t.provider, &t.model_id);
        // A native responses rung is OpenAI's: signed reasoning of another maker
        // (Claude's, Gemini's) leaves the client's input too.
        let repaired = parsed.req.has_foreign_reasoning(maker)
            || (self.native
                && parsed.inbound == Inbound::Responses
                && parsed.req.has_signed_reasoning());
        let (body, ignored) = if self.native {
            let trimmed = without(&parsed.object, &self.dropped);
            let mut object = trimmed.as_ref().unwrap_or(&parsed.object);
            // Members rewritten for this rung: hidden reasoning of another maker out
            // of a responses input, encrypted reasoning asked for when the store
            // keeps it, answer-only keys out of chat messages.
            let mut edits: Vec<(&str, Box<RawValue>)> = Vec::new();
            match parsed.inbound {
                Inbound::Responses => {
                    if repaired {
                        if let Some(k) = object.get("input").and_then(without_gateway_reasoning) {
                            edits.push(("input", k));
                        }
                    }
                    if parsed.keep_reasoning && self.reasons {
                        if let Some(k) = with_encrypted_reasoning(object.get("include")) {
                            edits.push(("include", k));
                        }
                    }
                }
                Inbound::Chat if parsed.req.replayed_answer_keys => {
                    if let Some(k) = object.get("messages").and_then(without_answer_keys) {
                        edits.push(("messages", k));
                    }
                }
                _ => {}
            }
            let edited;
            if !edits.is_empty() {
                let mut o = object.clone();
                for (k, v) in &edits {
                    o.set(k, v);
                }
                edited = o;
                object = &edited;
            }
            // The client's long values are sent from its own body, not copied.
            let mut spliced = if parsed.inbound == Inbound::Chat {
                render_spliced(object, &t.model_id, parsed.stream)
            } else {
                native::render_spliced(self.wire, object, &t.model_id, parsed.stream)
            };
            self.add_routing_key(parsed, &mut spliced.bytes);
            let body = OutBody::splice(spliced, &parsed.source);
            (body, disclosure(&self.dropped, &[], parsed.disclosed()))
        } else {
            let stripped;
            let strips = policy::strips(parsed.inbound, &self.dropped);
            let req = if repaired || strips {
                // A copy only when this rung gets less than the client sent: hidden
                // reasoning of another maker, or what the policy drops (the wire
                // would render it otherwise).
                let mut r = if repaired {
                    parsed.req.without_foreign_reasoning(maker)
                } else {
                    parsed.req.clone()
                };
                policy::strip(&mut r, parsed.inbound, &self.dropped);
                stripped = r;
                &stripped
            } else {
                &parsed.req
            };
            let rendered = self
                .wire
                .render(&t.provider, req, &t.model_id, parsed.stream);
            let request_level = parsed.disclosed();
            let mut body = rendered.body;
            self.add_routing_key(parsed, &mut body);
            (
                body.into(),
                disclosure(&self.dropped, &rendered.dropped, request_level),
            )
        };
        Rendered {
            body,
            ignored,
            repaired,
        }
    }

    /// Adds the derived `prompt_cache_key` for a rung whose provider routes by
    /// it, before the closing brace of the body the gateway wrote. No wire
    /// renders the client's own key, so it is never there twice.
    fn add_routing_key(&self, parsed: &ParsedRequest, body: &mut Vec<u8>) {
        let key = match self.wire {
            Wire::OpenAiChat | Wire::OpenAiResponses if self.cache_key_routing => {
                parsed.routing_key()
            }
            _ => None,
        };
        if let Some(k) = key {
            let v = serde_json::to_vec(&k).unwrap_or_default();
            append_member(body, 0, "prompt_cache_key", &v);
        }
    }
}

/// The `x-service-ignored-parameters` value: every dropped field, comma-separated,
/// in first-seen order without repeats.
fn disclosure(a: &[String], b: &[String], c: &[String]) -> Option<String> {
    let mut names: Vec<&str> = Vec::new();
    for n in a.iter().chain(b).chain(c) {
        if !names.contains(&n.as_str()) {
            names.push(n);
        }
    }
    (!names.is_empty()).then(|| names.join(","))
}

/// A responses `include` with `reasoning.encrypted_content` added.
fn with_encrypted_reasoning(include: Option<&RawValue>) -> Option<Box<RawValue>> {
    let mut list: Vec<String> = match include {
        Some(v) => serde_json::from_str(v.get()).ok()?,
        None => Vec::new(),
    };
    list.push("reasoning.encrypted_content".into());
    RawValue::from_string(serde_json::to_string(&list).ok()?).ok()
}

/// The client's object without the members this rung does not receive.
fn without<'a>(object: &RawObject<'a>, dropped: &[String]) -> Option<RawObject<'a>> {
    if dropped.iter().all(|d| !object.contains_key(d)) {
        return None;
    }
    let mut o = object.clone();
    for d in dropped {
        o.remove(d);
    }
    Some(o)
}
