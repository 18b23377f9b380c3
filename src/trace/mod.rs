//! What each gateway request leaves for the operator besides its usage event:
//! the request's metrics series, one access line in the logs (JSON logs), and its
//! trace (a span for the request, one per attempt, with the GenAI semantic
//! conventions) exported over OTLP/HTTP.
//!
//! The gateway listener opens a [`Trail`] when a request arrives and closes it
//! when the answer is done ([`Tracer::finish`]); the request flow fills it in as
//! it learns who asked, which model, which rung served and what it cost. Nothing
//! here reaches a key, a provider credential or a provider's message: the trail
//! holds ids, catalog names and counts.

mod context;
mod otlp;
pub mod request_id;
mod span;

pub use context::{Header, TraceContext};
pub use span::{AttemptFacts, Attempts};

use crate::accounts::{KeyRecord, OrgRecord};
use crate::catalog::Model;
use crate::config::ObservabilityConfig;
use crate::downstream::client::Client;
use crate::metrics::{RequestDone, Settled};
use http::HeaderValue;
use pingora::http::RequestHeader;
use sluice_filters::usage::Usage;
use sluice_filters::{ApiError, Route};
use span::{now_ns, Attr, SpanRecord, KIND_SERVER};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The process's trace and access-log settings, and the span exporter.
pub struct Tracer {
    queue: Option<Arc<otlp::Queue>>,
    access_log: bool,
}

impl Tracer {
    pub fn new(c: &ObservabilityConfig, instance_id: &str) -> anyhow::Result<Tracer> {
        let queue = if c.otlp_endpoint.is_empty() {
            None
        } else {
            let endpoint = otlp::Endpoint::parse(&c.otlp_endpoint)?;
            Some(Arc::new(otlp::Queue::new(endpoint, instance_id)))
        };
        Ok(Tracer {
            queue,
            access_log: c.log_format == "json",
        })
    }

    /// Starts the span exporter on the current runtime (when an endpoint is set).
    pub fn spawn_export(&self) {
        if let Some(q) = &self.queue {
            q.clone().spawn();
        }
    }

    /// Opens the trail of a request that just arrived on the gateway. `client`
    /// is asked for only when the request is logged or traced.
    pub fn start(
        &self,
        route: Route,
        req: &RequestHeader,
        client: impl FnOnce() -> Option<Client>,
        started: Instant,
    ) -> Trail {
        let tracing = self.queue.is_some();
        let detailed = tracing || self.access_log;
        let parent = req
            .headers
            .get("traceparent")
            .and_then(|v| TraceContext::parse(v.as_bytes()));
        // With an exporter: our request span joins the client's trace (or starts
        // one); without: the client's header alone is passed on to providers.
        let (ctx, attempts) = match (tracing, parent) {
            (true, c) => {
                let mut ours = c.unwrap_or_else(TraceContext::fresh);
                ours.span_id = context::nonzero();
                (Some(ours), Attempts::new(ours, true))
            }
            (false, Some(c)) => (None, Attempts::new(c, false)),
            (false, None) => (None, Attempts::default()),
        };
        let m = crate::metrics::global();
        m.in_flight.with_label_values(&[route.label()]).inc();
        Trail {
            route,
            started,
            start_ns: if tracing { now_ns() } else { 0 },
            detailed,
            client: if detailed { client() } else { None },
            request_id: req.headers.get(request_id::HEADER).cloned(),
            client_parent: parent.filter(|_| tracing).map(|c| c.span_id),
            ctx,
            attempts,
            key: None,
            org: None,
            model: None,
            lane: "none",
            provider: "none",
            code: "ok",
            stream: false,
            facts: None,
        }
    }

    /// Closes a request's trail: its metrics, its access line, its spans.
    pub fn finish(&self, mut t: Trail, status: u16) {
        let total = t.started.elapsed();
        let m = crate::metrics::global();
        let route = t.route.label();
        m.in_flight.with_label_values(&[route]).dec();
        if t.stream {
            m.open_streams.with_label_values(&[route]).dec();
        }
        let code = if status < 400 || t.code != "ok" {
            t.code
        } else {
            // An error the flow did not name (Pingora's own, a management answer).
            crate::metrics::status_label(status)
        };
        m.request_done(&RequestDone {
            route,
            model: t.model_label(),
            lane: t.lane,
            provider: t.provider,
            status,
            code,
            total,
        });
        if self.access_log {
            t.access_line(status, code, total);
        }
        if let Some(q) = &self.queue {
            let mut spans = t.attempts.take();
            spans.push(t.request_span(status, code));
            q.push(spans);
        }
    }
}

/// Facts known once the request settled, kept only when they are logged or
/// traced.
#[derive(Default)]
struct Facts {
    rung: Option<String>,
    attempts: String,
    usage: Usage,
    cost_micro_usd: i64,
    overhead_us: u64,
    ttft: Option<Duration>,
    incomplete: bool,
}

/// One gateway request as the operator sees it, filled in as the flow goes.
pub struct Trail {
    route: Route,
    started: Instant,
    start_ns: u64,
    /// The access line or the trace need more than the metrics: ids, the rung,
    /// the attempts.
    detailed: bool,
    /// Who sent the request (when detailed): the trusted edge header's address,
    /// else the socket's peer.
    client: Option<Client>,
    request_id: Option<HeaderValue>,
    /// The request span's context (when spans are made).
    ctx: Option<TraceContext>,
    client_parent: Option<[u8; 8]>,
    /// The attempt spans; the tally carries them while the waterfall runs.
    pub attempts: Attempts,
    key: Option<Arc<KeyRecord>>,
    org: Option<Arc<OrgRecord>>,
    model: Option<Arc<Model>>,
    lane: &'static str,
    provider: &'static str,
    code: &'static str,
    stream: bool,
    facts: Option<Box<Facts>>,
}

impl Trail {
    /// Who asked (kept only when logged or traced).
    pub fn identify(&mut self, key: &Arc<KeyRecord>, org: &Arc<OrgRecord>) {
        if self.detailed {
            self.key = Some(key.clone());
            self.org = Some(org.clone());
        }
    }

    pub fn model(&mut self, model: &Arc<Model>) {
        self.model = Some(model.clone());
    }

    /// The request streams: it counts among the open streams until it ends.
    pub fn streaming(&mut self, stream: bool) {
        if stream && !self.stream {
            self.stream = true;
            crate::metrics::global()
                .open_streams
                .with_label_values(&[self.route.label()])
                .inc();
        }
    }

    /// The request ended in this error before settlement (or without one):
    /// counted as a gate refusal when it is one.
    pub fn failed(&mut self, e: &ApiError) {
        self.code = e.code.as_str();
        crate::metrics::global().refused(e);
    }

    /// The model's label: its catalog slug, `custom` for an org's own model.
    fn model_label(&self) -> &str {
        match &self.model {
            None => "none",
            Some(m) if m.owner.is_some() => "custom",
            Some(m) => &m.spec.slug,
        }
    }

    /// Settlement's figures: recorded into the metrics now, kept for the access
    /// line and the span when those are on.
    #[allow(clippy::too_many_arguments)]
    pub fn settled(
        &mut self,
        lane: &'static str,
        code: Option<&'static str>,
        attempts: &str,
        rung: Option<&str>,
        usage: &Usage,
        cost_micro_usd: i64,
        times: (Option<Duration>, Duration, Duration),
        incomplete: bool,
    ) {
        let (ttft, overhead, upstream) = times;
        self.lane = lane;
        self.code = code.unwrap_or("ok");
        // The last attempt's provider: the one that served, or failed last.
        self.provider = attempts
            .rsplit(',')
            .next()
            .and_then(|a| a.split(':').next())
            .map_or("none", crate::metrics::provider_label);
        crate::metrics::global().settled(&Settled {
            route: self.route.label(),
            provider: self.provider,
            model: self.model_label(),
            lane,
            ttft,
            overhead,
            upstream,
            usage,
            cost_micro_usd,
        });
        if self.detailed {
            self.facts = Some(Box::new(Facts {
                rung: rung.map(str::to_string),
                attempts: attempts.to_string(),
                usage: *usage,
                cost_micro_usd,
                overhead_us: overhead.as_micros() as u64,
                ttft,
                incomplete,
            }));
        }
    }

    fn request_id(&self) -> &str {
        self.request_id
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    fn access_line(&self, status: u16, code: &str, total: Duration) {
        let f = self.facts.as_deref();
        let u = f.map(|f| f.usage).unwrap_or_default();
        let trace_id = self.ctx.map(|c| {
            let mut out = [0u8; 32];
            context::hex_into(&c.trace_id, &mut out);
            String::from_utf8_lossy(&out).into_owned()
        });
        tracing::info!(
            target: "sluice::access",
            request_id = self.request_id(),
            client = self.client.map(|c| c.ip.to_string()).as_deref().unwrap_or(""),
            org_id = self.org.as_deref().map_or("", |o| o.id.as_str()),
            key_id = self.key.as_deref().map_or("", |k| k.id.as_str()),
            route = self.route.label(),
            model = self.model.as_deref().map_or("", |m| m.spec.slug.as_str()),
            lane = self.lane,
            rung = f.and_then(|f| f.rung.as_deref()).unwrap_or(""),
            attempts = f.map_or("", |f| f.attempts.as_str()),
            status,
            code,
            stream = self.stream,
            incomplete = f.is_some_and(|f| f.incomplete),
            overhead_us = f.map_or(0, |f| f.overhead_us),
            ttft_ms = f.and_then(|f| f.ttft).map_or(0, |t| t.as_millis() as u64),
            duration_ms = total.as_millis() as u64,
            input_tokens = u.input_tokens,
            cached_tokens = u.cached_tokens,
            output_tokens = u.output_tokens,
            reasoning_tokens = u.reasoning_tokens,
            cost_micro_usd = f.map_or(0, |f| f.cost_micro_usd),
            trace_id = trace_id.as_deref().unwrap_or(""),
            "request"
        );
    }

    /// The request's own span (SERVER), with the GenAI attributes.
    fn request_span(&self, status: u16, code: &'static str) -> SpanRecord {
        let ctx = self.ctx.unwrap_or_else(TraceContext::fresh);
        let embeddings = self.route == Route::Embeddings;
        let op = if embeddings { "embeddings" } else { "chat" };
        let slug = self.model.as_deref().map_or("", |m| m.spec.slug.as_str());
        let mut attrs: Vec<(&'static str, Attr)> = vec![
            ("gen_ai.operation.name", Attr::Str(op.into())),
            ("http.request.method", Attr::Str("POST".into())),
            ("http.route", Attr::Str(self.route.label().into())),
            ("http.response.status_code", Attr::Int(status.into())),
            ("sluice.request_id", Attr::Str(self.request_id().into())),
            ("sluice.lane", Attr::Str(self.lane.into())),
        ];
        if let Some(c) = self.client {
            attrs.push(("client.address", Attr::Str(c.ip.to_string())));
            if let Some(port) = c.port {
                attrs.push(("client.port", Attr::Int(port.into())));
            }
        }
        if !slug.is_empty() {
            attrs.push(("gen_ai.request.model", Attr::Str(slug.into())));
        }
        if self.stream {
            attrs.push(("sluice.stream", Attr::Bool(true)));
        }
        if let Some(o) = &self.org {
            attrs.push(("sluice.org_id", Attr::Str(o.id.clone())));
        }
        if let Some(k) = &self.key {
            attrs.push(("sluice.key_id", Attr::Str(k.id.clone())));
        }
        if let Some(f) = self.facts.as_deref() {
            if let Some(rung) = &f.rung {
                let (provider, model_id) = rung.split_once(':').unwrap_or(("", rung));
                attrs.push(("gen_ai.response.model", Attr::Str(model_id.into())));
                attrs.push((
                    "gen_ai.provider.name",
                    Attr::Str(span::genai_provider(provider).into()),
                ));
            }
            let u = &f.usage;
            for (k, n) in [
                ("gen_ai.usage.input_tokens", u.input_tokens),
                ("gen_ai.usage.output_tokens", u.output_tokens),
                ("gen_ai.usage.cache_read.input_tokens", u.cached_tokens),
                (
                    "gen_ai.usage.cache_creation.input_tokens",
                    u.cache_write_tokens,
                ),
                ("gen_ai.usage.reasoning.output_tokens", u.reasoning_tokens),
            ] {
                attrs.push((k, Attr::Int(n.min(i64::MAX as u64) as i64)));
            }
            attrs.push(("sluice.cost_micro_usd", Attr::Int(f.cost_micro_usd)));
            attrs.push(("sluice.attempts", Attr::Str(f.attempts.clone())));
            attrs.push(("sluice.overhead_us", Attr::Int(f.overhead_us as i64)));
        }
        let error = (status >= 400 || code != "ok").then_some(code);
        if let Some(e) = error {
            attrs.push(("error.type", Attr::Str(e.into())));
        }
        SpanRecord {
            trace_id: ctx.trace_id,
            span_id: ctx.span_id,
            parent: self.client_parent,
            name: if slug.is_empty() {
                op.to_string()
            } else {
                format!("{op} {slug}")
            },
            kind: KIND_SERVER,
            start_ns: self.start_ns,
            end_ns: now_ns(),
            attrs,
            error,
        }
    }
}
