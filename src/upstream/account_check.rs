//! Calls made about an org's own provider account rather than for a request: the
//! cheap check that the key works (the provider's model list), and the spend the
//! provider reports where its API offers it.

use super::egress;
use super::{Failure, Target, Upstreams};
use crate::byok::Live;
use crate::catalog::RungSpec;
use crate::config::Config;
use std::sync::Arc;

/// What a check found.
pub enum Checked {
    Ok(String),
    Failed(String),
    /// This provider's accounts cannot be checked from here yet.
    Unsupported(String),
}

fn target(up: &Upstreams, live: &Live) -> Option<Arc<Target>> {
    let c = &live.conn;
    let rung = RungSpec {
        provider: c.provider.clone(),
        provider_model_id: "check".into(),
        base_url: c.base_url().to_string(),
        zdr: false,
        caps: Vec::new(),
    };
    up.own_target(&rung, &format!("byok:{}", c.id), Some(live))
}

/// Why a call about the account got no answer; a refused org URL says so, and
/// nothing of what such an address would have answered is ever read.
fn unreachable(provider: &str, f: &Failure) -> String {
    match f {
        Failure::Connect(why) if why == egress::REFUSED => format!(
            "{provider} was not called: the account's URL leads to a non-public address, which this gateway does not allow"
        ),
        f => format!("{provider} could not be reached ({})", f.label()),
    }
}

/// Lists the provider's models with the account's key: a 2xx means it works.
pub(crate) async fn check(config: &Config, live: &Live) -> Checked {
    let provider = live.conn.provider.as_str();
    let up = Upstreams::new(config);
    if provider == "bedrock" {
        return Checked::Unsupported(
            "bedrock has no cheap read on its runtime endpoint; the keys are stored and used on the next request".into(),
        );
    }
    let Some(t) = target(&up, live) else {
        return Checked::Failed(format!("the {provider} account's settings are incomplete"));
    };
    if provider == "vertex" {
        return match up.check_own_vertex(&t).await {
            Ok(()) => Checked::Ok("vertex issued an access token for the service account".into()),
            Err(Failure::Connect(why)) if why == egress::REFUSED => {
                Checked::Failed(unreachable(provider, &Failure::Connect(why)))
            }
            Err(f) => Checked::Failed(format!(
                "vertex refused the service account ({})",
                f.label()
            )),
        };
    }
    let path = match provider {
        "anthropic" => t.under_base("/v1/models"),
        "google" => t.under_base("/v1beta/models"),
        "azure" => t.under_base("/openai/models?api-version=2024-10-21"),
        _ => t.under_base("/models"),
    };
    match up.get(&t, &path).await {
        Ok((s, _)) if (200..300).contains(&s) => Checked::Ok(format!(
            "{provider} accepted the key (model list answered {s})"
        )),
        Ok((s @ (401 | 403), _)) => {
            Checked::Failed(format!("{provider} refused the key (status {s})"))
        }
        Ok((s, _)) => Checked::Failed(format!("{provider} answered status {s}")),
        Err(f) => Checked::Failed(unreachable(provider, &f)),
    }
}

/// The spend the provider reports for the account, in micro-USD.
pub(crate) async fn spend(config: &Config, live: &Live) -> Result<i64, String> {
    let provider = live.conn.provider.as_str();
    if provider != "openrouter" {
        return Err(format!(
            "{provider} does not report an account's spend through its API"
        ));
    }
    let up = Upstreams::new(config);
    let t = target(&up, live).ok_or_else(|| format!("{provider} is not reachable"))?;
    match up.get(&t, &t.under_base("/key")).await {
        Ok((200, body)) => {
            let v: serde_json::Value = serde_json::from_slice(&body)
                .map_err(|_| format!("{provider} answered a spend that is not JSON"))?;
            let usd = v["data"]["usage"]
                .as_f64()
                .ok_or_else(|| format!("{provider} answered no usage figure"))?;
            Ok((usd * 1_000_000.0).round() as i64)
        }
        Ok((s, _)) => Err(format!("{provider} answered status {s} reading spend")),
        Err(f) => Err(format!("{} reading spend", unreachable(provider, &f))),
    }
}
