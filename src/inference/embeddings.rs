//! `POST /v1/embeddings`: validated in `filters`, served by the first rung of the
//! model's waterfall that can take the request (token-ID input only on OpenAI's own
//! wire, reduced `dimensions` only where the rung declares it). A batch over the
//! provider's limit is split into several upstream calls and merged in order; any
//! failed call fails the rung over, and nothing of a failed rung is billed.

use super::attempt::{describe, json_header, read_whole, write_whole, Attempt, Post};
use super::tally::{Outcome, Tally};
use super::Engine;
use crate::byok::{Lane, RouteRung};
use crate::trace::AttemptFacts;
use crate::upstream::breaker::{Admit, Series};
use crate::upstream::{Failure, Target};
use bytes::Bytes;
use pingora::proxy::Session;
use sluice_filters::inbound::embeddings::{render, EmbedRequest, Input};
use sluice_filters::upstream::embed::{self, batch_limit, EmbedWire, Embedded};
use sluice_filters::{ApiError, ErrorCode};
use std::sync::Arc;

/// The rungs that can serve this request, or the 400 that says why none can.
fn chain(
    engine: &Engine,
    rungs: &[RouteRung],
    req: &EmbedRequest,
) -> Result<Vec<(Arc<Target>, EmbedWire, Lane)>, ApiError> {
    let tokens = matches!(req.input, Input::Tokens(_));
    let mut out = Vec::new();
    let (mut no_dims, mut no_tokens) = (false, false);
    for rung in rungs {
        let r = &rung.spec;
        let target = if rung.is_platform() {
            engine.upstreams.target(r)
        } else {
            engine
                .upstreams
                .own_target(r, &rung.id, rung.account.as_deref())
        };
        let (Some(wire), Some(t)) = (
            EmbedWire::for_rung(&r.provider, &r.provider_model_id),
            target,
        ) else {
            continue;
        };
        if req.dimensions.is_some() && !r.caps.iter().any(|c| c == "embeddings_dimensions") {
            no_dims = true;
            continue;
        }
        if tokens && !wire.takes_tokens(&r.provider) {
            no_tokens = true;
            continue;
        }
        out.push((t, wire, rung.lane));
    }
    if out.is_empty() {
        if no_dims {
            return Err(ApiError::new(
                ErrorCode::InvalidParameter,
                "This model does not support `dimensions`; omit it for the model's default size.",
            )
            .param("dimensions"));
        }
        if no_tokens {
            return Err(ApiError::new(
                ErrorCode::InvalidParameter,
                "This model takes text input only, not token IDs.",
            )
            .param("input"));
        }
        return Err(ApiError::new(
            ErrorCode::UnavailableRoute,
            "No rung of this model can be reached from this gateway.",
        )
        .with_status(503));
    }
    Ok(out)
}

fn path(t: &Target, wire: EmbedWire) -> String {
    match wire {
        EmbedWire::OpenAi => t.embeddings_path(),
        EmbedWire::Gemini => t.gemini_embed_path(),
        EmbedWire::Vertex => t.vertex_embed_path(),
        EmbedWire::Titan | EmbedWire::Cohere => t.bedrock_invoke_path(),
    }
}

/// One rung: every batch in order. `Err` fails the rung over.
async fn rung(
    engine: &Engine,
    session: &mut Session,
    tally: &mut Tally,
    t: &Target,
    wire: EmbedWire,
    req: &EmbedRequest,
) -> Result<Option<Embedded>, Failure> {
    let limit = batch_limit(wire, &t.provider);
    let mut all = Embedded::default();
    let mut tokens = 0u64;
    let mut start = 0;
    while start < req.input.len() {
        let end = (start + limit).min(req.input.len());
        let batch = req.input.slice(start..end);
        let body = Bytes::from(embed::render(wire, &batch, &t.model_id, req.dimensions));
        let path = path(t, wire);
        let post = Post {
            target: t,
            path: &path,
            wire: None,
            body: body.into(),
            stream: false,
            headers: &[],
        };
        let buf = match read_whole(engine, session, tally, post).await {
            Ok((call, buf)) => {
                call.finish().await;
                buf
            }
            Err(Attempt::Failed(f)) => return Err(f),
            // Over the response limit.
            Err(Attempt::Terminal(_)) => return Ok(None),
            Err(_) => return Err(Failure::Connect("client gone".into())),
        };
        let got = embed::decode(wire, &buf, batch.len()).map_err(|_| Failure::BadAnswer)?;
        // Providers that report no token count are billed on an estimate.
        tokens = tokens.saturating_add(got.tokens.unwrap_or_else(|| batch.estimated_tokens()));
        all.vectors.extend(got.vectors);
        if all.model.is_none() {
            all.model = got.model;
        }
        start = end;
    }
    all.tokens = Some(tokens);
    Ok(Some(all))
}

pub(crate) async fn serve(
    engine: &Engine,
    session: &mut Session,
    tally: &mut Tally,
    rungs: &[RouteRung],
    req: EmbedRequest,
) -> Outcome {
    let chain = match chain(engine, rungs, &req) {
        Ok(l) => l,
        Err(e) => return Outcome::Error(e),
    };
    let mut reasons = Vec::new();
    let mut last: Option<(&str, &'static str)> = None;
    for (t, wire, lane) in &chain {
        if engine.breaker.admit(&t.breaker_key) == Admit::No {
            continue;
        }
        let series = Series {
            provider: &t.provider,
            rung: match lane {
                Lane::Platform => &t.rung_id,
                Lane::PassThrough => "byok",
            },
        };
        // Only a platform rung draws credits; the org's own account costs nothing here.
        tally.price = match lane {
            Lane::Platform => tally.platform_price,
            Lane::PassThrough => Default::default(),
        };
        tally.lane = *lane;
        if let Some((provider, reason)) = last {
            engine
                .state
                .metrics
                .failover("embeddings", provider, reason);
        }
        tally.trace.begin();
        let result = rung(engine, session, tally, t, *wire, &req).await;
        let class = match &result {
            Ok(Some(_)) => "ok",
            Ok(None) => "too_large",
            Err(f) => f.class(),
        };
        engine
            .state
            .metrics
            .attempt(series.provider, series.rung, class);
        tally.trace.end(AttemptFacts {
            provider: series.provider,
            model_id: &t.model_id,
            host: t.host(),
            port: t.port(),
            rung: series.rung,
            outcome: class,
        });
        last = Some((series.provider, class));
        match result {
            Ok(None) => {
                engine.breaker.abandon(&t.breaker_key);
                tally.attempt(&t.provider, "too_large");
                return Outcome::Error(ApiError::new(
                    ErrorCode::ProviderOutputTooLarge,
                    "The provider's answer exceeded the response limit.",
                ));
            }
            Ok(Some(got)) => {
                engine.breaker.success(&t.breaker_key, series);
                tally.rung = Some(t.rung_id.clone());
                tally.billable = true;
                let tokens = got.tokens.unwrap_or(0);
                tally.usage.input_tokens = tokens;
                tally.first_token = Some(tally.started.elapsed());
                let reported = got.model.unwrap_or_else(|| t.model_id.clone());
                let usage = tally.priced(sluice_filters::usage::Usage {
                    input_tokens: tokens,
                    ..Default::default()
                });
                let body = render(
                    &reported,
                    &got.vectors,
                    req.base64,
                    tokens,
                    usage.cost_usd(),
                    &t.rung_id,
                );
                let Some(h) = json_header(tally, &t.provider, "ok") else {
                    return Outcome::Error(ApiError::internal());
                };
                tally.attempt(&t.provider, "ok");
                return if write_whole(session, tally, h, body).await {
                    Outcome::Written(200)
                } else {
                    Outcome::ClientGone
                };
            }
            Err(Failure::Connect(why)) if why == "client gone" => {
                engine.breaker.abandon(&t.breaker_key);
                return Outcome::ClientGone;
            }
            Err(Failure::Deadline) => {
                engine.breaker.abandon(&t.breaker_key);
                return Outcome::Error(ApiError::new(
                    ErrorCode::DeadlineExceeded,
                    "The request ran past its deadline before any rung answered.",
                ));
            }
            Err(f) => {
                if f.trips_breaker(false) {
                    engine.breaker.failure(&t.breaker_key, series);
                } else {
                    engine.breaker.abandon(&t.breaker_key);
                }
                tally.attempt(&t.provider, &f.label());
                reasons.push(format!("{} ({})", t.rung_id, describe(&f)));
            }
        }
    }
    if reasons.is_empty() {
        return Outcome::Error(
            ApiError::new(
                ErrorCode::UnavailableRoute,
                "Every rung of this model is cooling down after repeated failures; retry with backoff.",
            )
            .with_status(503),
        );
    }
    Outcome::Error(ApiError::new(
        ErrorCode::AllRoutesFailed,
        format!("Every rung failed: {}.", reasons.join("; ")),
    ))
}
