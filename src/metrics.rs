//! Prometheus metrics. Label values are bounded (route kinds, status codes, provider
//! names, outcome classes): never key or org ids.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub latency: HistogramVec,
    pub upstream_attempts: IntCounterVec,
    pub failovers: IntCounterVec,
    pub ttft: HistogramVec,
    pub overhead: HistogramVec,
    pub tokens: IntCounterVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "sluice_requests_total",
                "Requests answered, by route and status.",
            ),
            &["route", "status"],
        )
        .expect("static metric definition");
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "sluice_request_duration_seconds",
                "Time from request to the end of the answer, by route.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0, 60.0, 120.0,
            ]),
            &["route"],
        )
        .expect("static metric definition");
        let upstream_attempts = IntCounterVec::new(
            Opts::new(
                "sluice_upstream_attempts_total",
                "Attempts on provider rungs, by provider and outcome.",
            ),
            &["provider", "outcome"],
        )
        .expect("static metric definition");
        let failovers = IntCounterVec::new(
            Opts::new(
                "sluice_failovers_total",
                "Moves from a failed rung to the next, by route.",
            ),
            &["route"],
        )
        .expect("static metric definition");
        let tokens = IntCounterVec::new(
            Opts::new(
                "sluice_tokens_total",
                "Tokens served, by route and kind (input, cached, output).",
            ),
            &["route", "kind"],
        )
        .expect("static metric definition");
        let ttft = HistogramVec::new(
            HistogramOpts::new(
                "sluice_time_to_first_token_seconds",
                "Time from request to the committed first content, by route.",
            )
            .buckets(vec![
                0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
            ]),
            &["route"],
        )
        .expect("static metric definition");
        let overhead = HistogramVec::new(
            HistogramOpts::new(
                "sluice_gateway_overhead_seconds",
                "Time spent in the gateway itself, excluding provider time, by route.",
            )
            .buckets(vec![
                0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1,
            ]),
            &["route"],
        )
        .expect("static metric definition");
        for h in [&ttft, &overhead] {
            registry
                .register(Box::new(h.clone()))
                .expect("metric registered once");
        }
        for c in [&requests, &upstream_attempts, &failovers, &tokens] {
            registry
                .register(Box::new(c.clone()))
                .expect("metric registered once");
        }
        registry
            .register(Box::new(latency.clone()))
            .expect("metric registered once");
        // Pre-register the route label sets so dashboards see every series from the start.
        for r in sluice_filters::Route::ALL {
            latency.with_label_values(&[r.label()]);
        }
        Metrics {
            registry,
            requests,
            latency,
            upstream_attempts,
            failovers,
            ttft,
            overhead,
            tokens,
        }
    }

    pub fn observe_request(&self, route: &str, status: u16, seconds: f64) {
        self.requests
            .with_label_values(&[route, status_label(status)])
            .inc();
        self.latency.with_label_values(&[route]).observe(seconds);
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// A static label per status, so counting allocates nothing.
fn status_label(status: u16) -> &'static str {
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
