//! Probing rungs' capabilities: one cheap request per rung and capability, through
//! the same wire rendering and upstream client as real traffic. A rung is first
//! asked a plain question; only when that succeeds do the capability answers mean
//! anything (a 400 or 422 then says the provider refuses the capability; any other
//! failure leaves the declared capability in place).

use super::{Target, Upstreams};
use crate::catalog::probe::{Verdict, PROBED};
use crate::catalog::ModelSpec;
use crate::config::Config;
use crate::deadline::within;
use serde_json::value::RawValue;
use sluice_filters::inbound::Inbound;
use sluice_filters::ir::{Message, Part, Request, ResponseFormat, Role, Tool};
use sluice_filters::upstream::Wire;
use std::collections::HashSet;
use std::time::Duration;

/// The minimal request that exercises `capability` (`None`: the plain baseline).
fn request(capability: Option<&str>) -> Request {
    let ask = match capability {
        Some("json_object" | "json_schema") => "Reply with the JSON object {\"ok\": true}.",
        _ => "Reply with the word ok.",
    };
    let mut r = Request {
        model: "probe".into(),
        max_tokens: Some(16),
        messages: vec![Message {
            role: Role::User,
            parts: vec![Part::text(ask)],
        }],
        ..Request::default()
    };
    let raw = |s: &str| RawValue::from_string(s.to_string()).ok();
    match capability {
        Some("json_object") => r.response_format = Some(ResponseFormat::JsonObject),
        Some("json_schema") => {
            if let Some(schema) = raw(
                r#"{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"],"additionalProperties":false}"#,
            ) {
                r.response_format = Some(ResponseFormat::JsonSchema {
                    name: "probe".into(),
                    description: None,
                    schema,
                    strict: Some(true),
                });
            }
        }
        Some("tools") => {
            if let Some(parameters) = raw(r#"{"type":"object","properties":{}}"#) {
                r.tools.push(Tool {
                    name: "ping".into(),
                    description: Some("Answers pong.".into()),
                    parameters,
                    strict: None,
                });
            }
        }
        Some("sampling") => {
            r.temperature = Some(0.5);
            r.top_p = Some(0.9);
        }
        _ => {}
    }
    r
}

/// The request field a capability travels in, as a wire names what it drops.
fn field_of(capability: &str) -> &'static str {
    match capability {
        "json_object" | "json_schema" => "response_format",
        "tools" => "tools",
        _ => "temperature",
    }
}

/// Sends one probe; the provider's status, or `None` when nothing came back.
async fn send(up: &Upstreams, t: &Target, wire: Wire, req: &Request) -> Option<u16> {
    let rendered = wire.render(&t.provider, req, &t.model_id, false);
    let path = t.path(wire, false);
    let mut call = up
        .post(t, &path, rendered.body.into(), false, &[])
        .await
        .ok()?;
    let status = call.status();
    while let Ok(Ok(Some(_))) = within(t.first_token_timeout, call.read()).await {}
    call.finish().await;
    Some(status)
}

/// Probes every platform rung of `specs` that this configuration can reach.
pub async fn probe_all(config: &Config, specs: &[ModelSpec]) -> Vec<Verdict> {
    let up = Upstreams::new(config);
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for r in specs.iter().flat_map(|m| &m.rungs) {
        if !seen.insert((
            r.provider.clone(),
            r.provider_model_id.clone(),
            r.base_url.clone(),
        )) {
            continue;
        }
        let (Some(wire), Some(t)) = (
            Wire::of_rung(&r.provider, &r.provider_model_id, Inbound::Chat),
            up.target(r),
        ) else {
            continue;
        };
        match send(&up, &t, wire, &request(None)).await {
            Some(s) if (200..300).contains(&s) => {}
            _ => continue,
        }
        for cap in PROBED {
            let req = request(Some(cap));
            let verdict = |supported: bool, status: u16| Verdict {
                provider: r.provider.clone(),
                provider_model_id: r.provider_model_id.clone(),
                base_url: r.base_url.clone(),
                capability: cap.to_string(),
                supported,
                status,
            };
            let dropped = wire.render(&t.provider, &req, &t.model_id, false).dropped;
            if dropped.iter().any(|d| d == field_of(cap)) {
                out.push(verdict(false, 0));
                continue;
            }
            match send(&up, &t, wire, &req).await {
                Some(s) if (200..300).contains(&s) => out.push(verdict(true, s)),
                Some(s @ (400 | 422)) => out.push(verdict(false, s)),
                // Throttled, down, or unreachable: inconclusive.
                _ => {}
            }
        }
    }
    out
}

/// Probes now and then, when `[probe] enabled`: the verdicts reach every instance
/// through the catalog poll.
pub fn spawn_periodic(config: Config, db: crate::store::Db) {
    if !config.probe.enabled {
        return;
    }
    tokio::spawn(async move {
        let every = Duration::from_secs(config.probe.interval_seconds.max(60));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let specs = match crate::catalog::load_configured(&config.catalog.path) {
                Ok(Some(s)) => s,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "probe: catalog file unreadable");
                    continue;
                }
            };
            let verdicts = probe_all(&config, &specs).await;
            if let Err(e) = crate::catalog::probe::record(&db, &verdicts).await {
                tracing::warn!(error = %e, "probe: verdicts not stored");
            }
        }
    });
}
