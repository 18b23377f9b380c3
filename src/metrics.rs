//! The Prometheus registry every room records into, and what an operator reads on
//! `/metrics`: traffic by route, model, lane and outcome; each provider's attempts,
//! fail-overs and breakers; time to first token, the gateway's own overhead,
//! upstream and total time; tokens and spend; why the gates refuse; the usage
//! writer's health; database and Redis calls; the process itself.
//!
//! One registry per process, made on first use ([`global`]), so the stores and the
//! request flow record into the same families without handing it around. Label
//! values come only from the catalog, the config and fixed enums: never a key, an
//! org id, a raw path or a provider message. Recording allocates nothing once a
//! label set has been seen (`with_label_values` finds it by hash).

use prometheus::{
    Counter, Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use sluice_filters::usage::Usage;
use sluice_filters::{ApiError, ErrorCode};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

/// Buckets from 50 µs to 5 minutes: the gateway's own overhead sits at the
/// bottom, a long reasoning stream at the top.
const WIDE: [f64; 22] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
];

/// Buckets for database and Redis calls: 50 µs to 10 s.
const STORE: [f64; 15] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5,
    10.0,
];

/// Every `reason` a gate refusal carries (`error.reason`), plus the codes that
/// refuse without one. Anything else is counted as `other`, so a new reason can
/// never grow the series without bound.
const GATE_REASONS: [&str; 21] = [
    "insufficient_credits",
    "key_daily_cap",
    "key_rate_limit",
    "key_token_rate_limit",
    "key_concurrency",
    "org_rate_limit",
    "org_token_rate_limit",
    "org_token_rate_limit_hour",
    "org_token_rate_limit_day",
    "org_request_rate",
    "org_concurrency",
    "free_limit_reached",
    "promo_byok_only",
    "free_tier_requires_payment",
    "card_required",
    "model_requires_payment",
    "model_requires_purchase",
    "email_unverified",
    "model_not_granted",
    "model_location_not_supported",
    "org_under_review",
];

/// The gate reasons that are a key's own guardrails, by limit type.
const GUARDRAILS: [(&str, &str); 4] = [
    ("key_daily_cap", "daily_spend_cap"),
    ("key_rate_limit", "rpm"),
    ("key_token_rate_limit", "tpm"),
    ("key_concurrency", "concurrency"),
];

/// The operations of the counters store, as Redis calls are labelled.
pub(crate) const REDIS_OPS: [&str; 12] = [
    "take",
    "seed_balance",
    "window_total",
    "add",
    "add_many",
    "correct_many",
    "get",
    "set",
    "put_marker",
    "get_marker",
    "delete",
    "ping",
];

/// What a finished request is counted under (filled by the request's trail).
pub(crate) struct RequestDone<'a> {
    pub(crate) route: &'static str,
    /// The catalog slug, `custom` for an org's own model, `none` before one was
    /// resolved.
    pub(crate) model: &'a str,
    pub(crate) lane: &'static str,
    /// The provider of the serving (or last tried) rung; `none` when no rung was.
    pub(crate) provider: &'static str,
    pub(crate) status: u16,
    /// The error code, or `ok`.
    pub(crate) code: &'static str,
    pub(crate) total: Duration,
}

/// What settlement knows of a served request's time and usage.
pub(crate) struct Settled<'a> {
    pub(crate) route: &'static str,
    pub(crate) provider: &'static str,
    pub(crate) model: &'a str,
    pub(crate) lane: &'static str,
    pub(crate) ttft: Option<Duration>,
    pub(crate) overhead: Duration,
    pub(crate) upstream: Duration,
    pub(crate) usage: &'a Usage,
    pub(crate) cost_micro_usd: i64,
}

pub(crate) struct Metrics {
    registry: Registry,
    pub(crate) requests: IntCounterVec,
    pub(crate) duration: HistogramVec,
    pub(crate) ttft: HistogramVec,
    pub(crate) overhead: HistogramVec,
    pub(crate) upstream: HistogramVec,
    pub(crate) in_flight: IntGaugeVec,
    pub(crate) open_streams: IntGaugeVec,
    pub(crate) open_connections: IntGaugeVec,
    pub(crate) refused_connections: IntCounterVec,
    pub(crate) upstream_attempts: IntCounterVec,
    pub(crate) failovers: IntCounterVec,
    pub(crate) breaker_open: IntGaugeVec,
    pub(crate) breaker_opens: IntCounterVec,
    pub(crate) tokens: IntCounterVec,
    pub(crate) cost: IntCounterVec,
    pub(crate) gate_refusals: IntCounterVec,
    pub(crate) guardrail_hits: IntCounterVec,
    pub(crate) idempotency: IntCounterVec,
    pub(crate) usage_queue: IntGauge,
    pub(crate) usage_spool_events: IntGauge,
    pub(crate) usage_spool_bytes: IntGauge,
    pub(crate) usage_write: Histogram,
    pub(crate) usage_lag: Gauge,
    pub(crate) usage_events: IntCounterVec,
    pub(crate) db_calls: HistogramVec,
    pub(crate) db_errors: IntCounterVec,
    pub(crate) redis_calls: HistogramVec,
    pub(crate) redis_errors: IntCounterVec,
    pub(crate) catalog_reloads: IntCounterVec,
    pub(crate) trace_spans: IntCounterVec,
    /// Service-run web search and tool search (recorded by `search` when it runs).
    pub(crate) search_rounds: IntCounterVec,
    pub(crate) search_fees: IntCounter,
    pub(crate) search_drops: IntCounterVec,
    /// Batch lines waiting and telemetry uploads waiting (recorded by those rooms).
    pub(crate) batch_queue: IntGauge,
    pub(crate) telemetry_queue: IntGauge,
    /// 1 while `/readyz` would answer 200 (set at each scrape and readiness check).
    pub(crate) ready: IntGauge,
    /// 0 while a PostgreSQL instance's change feed is down (`store::changes`).
    pub(crate) change_feed_up: IntGauge,
    process: Process,
}

/// The one registry of this process.
pub(crate) fn global() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &METRICS
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition");
    r.register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("static metric definition");
    r.register(Box::new(g.clone()))
        .expect("metric registered once");
    g
}

fn histogram(r: &Registry, name: &str, help: &str, labels: &[&str], b: &[f64]) -> HistogramVec {
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(b.to_vec()), labels)
        .expect("static metric definition");
    r.register(Box::new(h.clone()))
        .expect("metric registered once");
    h
}

fn one<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, m: T) -> T {
    r.register(Box::new(m.clone()))
        .expect("metric registered once");
    m
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let r = Registry::new();
        let rp = ["route", "provider"];
        let m = Metrics {
            requests: counter(
                &r,
                "sluice_requests_total",
                "Requests answered on the gateway, by route, model slug, lane, status and error code (ok when none).",
                &["route", "model", "lane", "status", "code"],
            ),
            duration: histogram(
                &r,
                "sluice_request_duration_seconds",
                "Time from the request's arrival to the end of its answer, by route and serving provider.",
                &rp,
                &WIDE,
            ),
            ttft: histogram(
                &r,
                "sluice_time_to_first_token_seconds",
                "Time from the request's arrival to its committed first content, by route and provider.",
                &rp,
                &WIDE,
            ),
            overhead: histogram(
                &r,
                "sluice_gateway_overhead_seconds",
                "Time spent in the gateway itself, provider time excluded (x-gateway-overhead-us), by route and provider.",
                &rp,
                &WIDE,
            ),
            upstream: histogram(
                &r,
                "sluice_upstream_seconds",
                "Time spent waiting on providers, every attempt together, by route and serving provider.",
                &rp,
                &WIDE,
            ),
            in_flight: gauge(
                &r,
                "sluice_in_flight_requests",
                "Requests being answered now on the gateway, by route.",
                &["route"],
            ),
            open_streams: gauge(
                &r,
                "sluice_open_streams",
                "Streamed inference requests being answered now, by route.",
                &["route"],
            ),
            open_connections: gauge(
                &r,
                "sluice_open_connections",
                "Client connections open now, by listener (gateway, web, ops).",
                &["listener"],
            ),
            refused_connections: counter(
                &r,
                "sluice_refused_connections_total",
                "Client connections closed at accept because their listener held its cap ([server] max_connections and its siblings), by listener.",
                &["listener"],
            ),
            upstream_attempts: counter(
                &r,
                "sluice_upstream_attempts_total",
                "Attempts on provider rungs, by provider, rung (catalog rung id; byok for an org's own) and outcome.",
                &["provider", "rung", "outcome"],
            ),
            failovers: counter(
                &r,
                "sluice_failovers_total",
                "Moves from a failed rung to the next, by route, the provider that failed and why.",
                &["route", "provider", "reason"],
            ),
            breaker_open: gauge(
                &r,
                "sluice_breaker_open",
                "Rungs whose breaker is open or half-open (1 per platform rung; a count for byok), by provider and rung.",
                &["provider", "rung"],
            ),
            breaker_opens: counter(
                &r,
                "sluice_breaker_opens_total",
                "Times a rung's breaker opened, by provider and rung.",
                &["provider", "rung"],
            ),
            tokens: counter(
                &r,
                "sluice_tokens_total",
                "Tokens served, by model, lane and kind (input, cached, cache_write, output, reasoning).",
                &["model", "lane", "kind"],
            ),
            cost: counter(
                &r,
                "sluice_cost_micro_usd_total",
                "What requests were billed, in micro-USD, by model and lane.",
                &["model", "lane"],
            ),
            gate_refusals: counter(
                &r,
                "sluice_gate_refusals_total",
                "Requests the gates refused before anything was sent, by reason (credits, rate limits, grants, location, review).",
                &["reason"],
            ),
            guardrail_hits: counter(
                &r,
                "sluice_guardrail_hits_total",
                "Refusals by a key's own guardrails, by limit type.",
                &["limit"],
            ),
            idempotency: counter(
                &r,
                "sluice_idempotency_requests_total",
                "Requests with an Idempotency-Key, by result (fresh, replay, refused).",
                &["result"],
            ),
            usage_queue: one(
                &r,
                IntGauge::new(
                    "sluice_usage_queue_depth",
                    "Usage events recorded and not yet written or spooled.",
                )
                .expect("static metric definition"),
            ),
            usage_spool_events: one(
                &r,
                IntGauge::new(
                    "sluice_usage_spool_events",
                    "Usage events waiting in the local spool for the database.",
                )
                .expect("static metric definition"),
            ),
            usage_spool_bytes: one(
                &r,
                IntGauge::new("sluice_usage_spool_bytes", "Size of the local usage spool file.")
                    .expect("static metric definition"),
            ),
            usage_write: one(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "sluice_usage_write_seconds",
                        "Time to write one batch of usage events (or spool it).",
                    )
                    .buckets(STORE.to_vec()),
                )
                .expect("static metric definition"),
            ),
            usage_lag: one(
                &r,
                Gauge::new(
                    "sluice_usage_write_lag_seconds",
                    "Age of the oldest event of the last batch when it was written.",
                )
                .expect("static metric definition"),
            ),
            usage_events: counter(
                &r,
                "sluice_usage_events_total",
                "Usage events by what became of them (written, spooled, replayed; unspooled: the spool refused them and only the journal keeps them).",
                &["result"],
            ),
            db_calls: histogram(
                &r,
                "sluice_db_call_seconds",
                "Database calls off the request path, by operation.",
                &["op"],
                &STORE,
            ),
            db_errors: counter(
                &r,
                "sluice_db_errors_total",
                "Database calls that failed, by operation.",
                &["op"],
            ),
            redis_calls: histogram(
                &r,
                "sluice_redis_call_seconds",
                "Redis calls, by operation.",
                &["op"],
                &STORE,
            ),
            redis_errors: counter(
                &r,
                "sluice_redis_errors_total",
                "Redis calls that failed, by operation.",
                &["op"],
            ),
            catalog_reloads: counter(
                &r,
                "sluice_catalog_reloads_total",
                "Catalog file reloads on SIGHUP, by result.",
                &["result"],
            ),
            trace_spans: counter(
                &r,
                "sluice_trace_spans_total",
                "Trace spans by what became of them (exported, dropped when the queue was full, failed).",
                &["result"],
            ),
            search_rounds: counter(
                &r,
                "sluice_search_rounds_total",
                "Service-run search rounds, by kind (web, tool).",
                &["kind"],
            ),
            search_fees: one(
                &r,
                IntCounter::new(
                    "sluice_search_fees_micro_usd_total",
                    "Web search fees billed, in micro-USD.",
                )
                .expect("static metric definition"),
            ),
            search_drops: counter(
                &r,
                "sluice_search_drops_total",
                "Searches dropped (unavailable, timed out), by kind.",
                &["kind"],
            ),
            batch_queue: one(
                &r,
                IntGauge::new("sluice_batch_queue_depth", "Batch lines waiting to be served.")
                    .expect("static metric definition"),
            ),
            telemetry_queue: one(
                &r,
                IntGauge::new(
                    "sluice_telemetry_queue_depth",
                    "Telemetry uploads waiting to be parsed.",
                )
                .expect("static metric definition"),
            ),
            ready: one(
                &r,
                IntGauge::new(
                    "sluice_ready",
                    "1 while the instance is ready (/readyz 200): storage answers, not draining.",
                )
                .expect("static metric definition"),
            ),
            change_feed_up: one(
                &r,
                IntGauge::new(
                    "sluice_change_feed_up",
                    "0 while this instance listens to no PostgreSQL change feed: key, catalog and \
                     route changes reach it by polling (within 250-500 ms) until it reconnects. \
                     Always 1 on SQLite, which has no feed to listen to.",
                )
                .expect("static metric definition"),
            ),
            process: Process::register(&r),
            registry: r,
        };
        let build = gauge(
            &m.registry,
            "sluice_build_info",
            "Always 1: the running build's version and commit.",
            &["version", "commit"],
        );
        build
            .with_label_values(&[
                env!("CARGO_PKG_VERSION"),
                option_env!("SLUICE_GIT_COMMIT").unwrap_or("unknown"),
            ])
            .set(1);
        // Series a dashboard reads from the start, before any traffic.
        for route in sluice_filters::Route::ALL {
            m.in_flight.with_label_values(&[route.label()]);
            if route.is_inference() {
                m.open_streams.with_label_values(&[route.label()]);
            }
        }
        for r in ["fresh", "replay", "refused"] {
            m.idempotency.with_label_values(&[r]);
        }
        for r in ["written", "spooled", "replayed", "unspooled"] {
            m.usage_events.with_label_values(&[r]);
        }
        for r in ["exported", "dropped", "failed"] {
            m.trace_spans.with_label_values(&[r]);
        }
        for r in ["ok", "failed"] {
            m.catalog_reloads.with_label_values(&[r]);
        }
        for op in REDIS_OPS {
            m.redis_calls.with_label_values(&[op]);
            m.redis_errors.with_label_values(&[op]);
        }
        for op in [
            "usage_write",
            "usage_replay",
            "catalog",
            "routing",
            "directory",
        ] {
            m.db_calls.with_label_values(&[op]);
            m.db_errors.with_label_values(&[op]);
        }
        for l in ["gateway", "web", "ops"] {
            m.open_connections.with_label_values(&[l]);
            m.refused_connections.with_label_values(&[l]);
        }
        for k in ["web", "tool"] {
            m.search_rounds.with_label_values(&[k]);
            m.search_drops.with_label_values(&[k]);
        }
        m
    }

    /// One finished request on the gateway.
    pub(crate) fn request_done(&self, r: &RequestDone) {
        self.requests
            .with_label_values(&[r.route, r.model, r.lane, status_label(r.status), r.code])
            .inc();
        self.duration
            .with_label_values(&[r.route, r.provider])
            .observe(r.total.as_secs_f64());
    }

    /// A served (or failed) inference request at settlement.
    pub(crate) fn settled(&self, s: &Settled) {
        let rp = [s.route, s.provider];
        if let Some(t) = s.ttft {
            self.ttft.with_label_values(&rp).observe(t.as_secs_f64());
        }
        self.overhead
            .with_label_values(&rp)
            .observe(s.overhead.as_secs_f64());
        if !s.upstream.is_zero() {
            self.upstream
                .with_label_values(&rp)
                .observe(s.upstream.as_secs_f64());
        }
        let u = s.usage;
        for (kind, n) in [
            ("input", u.input_tokens),
            ("cached", u.cached_tokens),
            ("cache_write", u.cache_write_tokens),
            ("output", u.output_tokens),
            ("reasoning", u.reasoning_tokens),
        ] {
            if n > 0 {
                self.tokens
                    .with_label_values(&[s.model, s.lane, kind])
                    .inc_by(n);
            }
        }
        if s.cost_micro_usd > 0 {
            self.cost
                .with_label_values(&[s.model, s.lane])
                .inc_by(s.cost_micro_usd as u64);
        }
    }

    /// One attempt on a rung, and the fail-over it caused when another rung is
    /// tried after it.
    pub(crate) fn attempt(&self, provider: &str, rung: &str, outcome: &'static str) {
        self.upstream_attempts
            .with_label_values(&[provider_label(provider), rung, outcome])
            .inc();
    }

    pub(crate) fn failover(&self, route: &'static str, provider: &str, reason: &'static str) {
        self.failovers
            .with_label_values(&[route, provider_label(provider), reason])
            .inc();
    }

    pub(crate) fn breaker_opened(&self, provider: &str, rung: &str) {
        let labels = [provider_label(provider), rung];
        self.breaker_opens.with_label_values(&labels).inc();
        self.breaker_open.with_label_values(&labels).inc();
    }

    pub(crate) fn breaker_closed(&self, provider: &str, rung: &str) {
        let g = self
            .breaker_open
            .with_label_values(&[provider_label(provider), rung]);
        if g.get() > 0 {
            g.dec();
        }
    }

    /// Counts a refusal by the gates (credits, limits, grants, location, review)
    /// and by a key's guardrails; other errors are not refusals.
    pub(crate) fn refused(&self, e: &ApiError) {
        let Some(reason) = gate_reason(e) else {
            return;
        };
        self.gate_refusals.with_label_values(&[reason]).inc();
        if let Some((_, limit)) = GUARDRAILS.iter().find(|(r, _)| *r == reason) {
            self.guardrail_hits.with_label_values(&[limit]).inc();
        }
    }

    /// Times a database call off the request path and counts its failure.
    pub(crate) async fn db<T, E>(
        &self,
        op: &'static str,
        call: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let started = std::time::Instant::now();
        let out = call.await;
        self.db_calls
            .with_label_values(&[op])
            .observe(started.elapsed().as_secs_f64());
        if out.is_err() {
            self.db_errors.with_label_values(&[op]).inc();
        }
        out
    }

    /// The text exposition format.
    pub(crate) fn render(&self) -> String {
        self.process.update();
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// The reason a gate refusal is counted under, or `None` when the error is not
/// one.
fn gate_reason(e: &ApiError) -> Option<&'static str> {
    let named = e
        .extra
        .iter()
        .find(|(k, _)| *k == "reason")
        .and_then(|(_, v)| v.as_str());
    match e.code {
        ErrorCode::ModelNotGranted => Some("model_not_granted"),
        ErrorCode::ModelLocationNotSupported => Some("model_location_not_supported"),
        ErrorCode::OrgUnderReview => Some("org_under_review"),
        ErrorCode::InsufficientQuota
        | ErrorCode::UnavailableRoute
        | ErrorCode::VerificationRequired => {
            let named = named?;
            Some(
                GATE_REASONS
                    .iter()
                    .copied()
                    .find(|r| *r == named)
                    .unwrap_or("other"),
            )
        }
        _ => None,
    }
}

/// The static label of a provider name (`other` for a name outside the config's
/// list, which a rung cannot have).
pub(crate) fn provider_label(name: &str) -> &'static str {
    crate::config::PROVIDERS
        .iter()
        .copied()
        .find(|p| *p == name)
        .unwrap_or(if name.is_empty() { "none" } else { "other" })
}

/// A static label per status, so counting allocates nothing.
pub(crate) fn status_label(status: u16) -> &'static str {
    match status {
        200 => "200",
        201 => "201",
        202 => "202",
        204 => "204",
        400 => "400",
        401 => "401",
        402 => "402",
        403 => "403",
        404 => "404",
        405 => "405",
        408 => "408",
        409 => "409",
        413 => "413",
        422 => "422",
        429 => "429",
        499 => "499",
        500 => "500",
        502 => "502",
        503 => "503",
        504 => "504",
        s if s < 300 => "2xx",
        s if s < 500 => "4xx",
        _ => "5xx",
    }
}

/// The process's own figures, read from `/proc` at each scrape under the names
/// every Prometheus client library uses.
struct Process {
    rss: IntGauge,
    vsize: IntGauge,
    fds: IntGauge,
    max_fds: IntGauge,
    threads: IntGauge,
    cpu: Counter,
    start: Gauge,
    cpu_seen: Mutex<f64>,
}

impl Process {
    fn register(r: &Registry) -> Process {
        let ig = |name: &str, help: &str| {
            one(
                r,
                IntGauge::new(name, help).expect("static metric definition"),
            )
        };
        let p = Process {
            rss: ig(
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
            ),
            vsize: ig(
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
            ),
            fds: ig("process_open_fds", "Number of open file descriptors."),
            max_fds: ig(
                "process_max_fds",
                "Maximum number of open file descriptors.",
            ),
            threads: ig("process_threads", "Number of OS threads in the process."),
            cpu: one(
                r,
                Counter::new(
                    "process_cpu_seconds_total",
                    "Total user and system CPU time spent in seconds.",
                )
                .expect("static metric definition"),
            ),
            start: one(
                r,
                Gauge::new(
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                )
                .expect("static metric definition"),
            ),
            cpu_seen: Mutex::new(0.0),
        };
        p.start.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        );
        p
    }

    fn update(&self) {
        // SAFETY: sysconf reads a constant of the running system.
        let (tick, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK) as f64,
                libc::sysconf(libc::_SC_PAGESIZE) as i64,
            )
        };
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
            // Fields after the command name, which may hold spaces: `) state ppid …`.
            if let Some((_, rest)) = stat.rsplit_once(')') {
                let f: Vec<&str> = rest.split_whitespace().collect();
                let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
                // rest[0] is field 3 (state): utime is field 14, stime 15,
                // num_threads 20, vsize 23, rss 24.
                if let (Some(u), Some(s)) = (num(11), num(12)) {
                    let total = (u + s) / tick.max(1.0);
                    let mut seen = self.cpu_seen.lock().unwrap_or_else(|e| e.into_inner());
                    if total > *seen {
                        self.cpu.inc_by(total - *seen);
                        *seen = total;
                    }
                }
                if let Some(t) = num(17) {
                    self.threads.set(t as i64);
                }
                if let Some(v) = num(20) {
                    self.vsize.set(v as i64);
                }
                if let Some(rss) = num(21) {
                    self.rss.set(rss as i64 * page);
                }
            }
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            self.fds.set(dir.count() as i64);
        }
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct we pass.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
            self.max_fds.set(lim.rlim_cur as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_reasons_are_bounded() {
        let e =
            ApiError::new(ErrorCode::InsufficientQuota, "x").with_extra("reason", "key_rate_limit");
        assert_eq!(gate_reason(&e), Some("key_rate_limit"));
        let odd =
            ApiError::new(ErrorCode::InsufficientQuota, "x").with_extra("reason", "sk-secret-123");
        assert_eq!(gate_reason(&odd), Some("other"));
        assert_eq!(
            gate_reason(&ApiError::new(ErrorCode::AllRoutesFailed, "x")),
            None
        );
        assert_eq!(provider_label("openai"), "openai");
        assert_eq!(provider_label("https://evil"), "other");
    }

    #[test]
    fn the_process_figures_are_read() {
        let m = Metrics::new();
        let text = m.render();
        for name in [
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_cpu_seconds_total",
            "sluice_build_info",
        ] {
            assert!(text.contains(name), "{name}");
        }
        assert!(m.process.rss.get() > 0);
        assert!(m.process.fds.get() > 0);
    }
}
