//! OTLP/HTTP export of finished spans, off the request path: requests leave their
//! spans in a bounded in-process queue (a lock and a move, no wake-up); a task
//! drains it twice a second and POSTs batches as OTLP/HTTP JSON to
//! `[observability] otlp_endpoint`. A full queue drops spans (counted in
//! `sluice_trace_spans_total{result="dropped"}`); a failed POST drops its batch
//! (`failed`): traces are never worth slowing or growing the gateway for.

use super::span::{Attr, SpanRecord};
use bytes::Bytes;
use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;
use pingora::prelude::HttpPeer;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Spans the queue holds at most.
const CAP: usize = 8192;
/// Spans per POST at most.
const BATCH: usize = 512;
const EVERY: Duration = Duration::from_millis(500);
const TIMEOUT: Duration = Duration::from_secs(10);

/// Where spans go: scheme, host, port and the path (`/v1/traces` when the
/// endpoint names none, as OTLP's base-URL convention has it).
#[derive(Clone, Debug, PartialEq)]
pub struct Endpoint {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    pub path: String,
}

impl Endpoint {
    pub fn parse(url: &str) -> anyhow::Result<Endpoint> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            anyhow::bail!("observability.otlp_endpoint must start with http:// or https://");
        };
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if authority.is_empty() || authority.contains('@') {
            anyhow::bail!("observability.otlp_endpoint needs a host (and no user info)");
        }
        let default_port = if tls { 443 } else { 80 };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => match p.parse() {
                Ok(port) => (h, port),
                Err(_) if authority.starts_with('[') && authority.ends_with(']') => {
                    (authority, default_port)
                }
                Err(_) => anyhow::bail!("observability.otlp_endpoint has a bad port"),
            },
            _ => (authority, default_port),
        };
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let path = match path.trim_end_matches('/') {
            "" => "/v1/traces".to_string(),
            p => p.to_string(),
        };
        Ok(Endpoint {
            tls,
            host,
            port,
            path,
        })
    }
}

pub struct Queue {
    spans: Mutex<Vec<SpanRecord>>,
    endpoint: Endpoint,
    /// The resource every batch names: this service and instance.
    resource: Value,
}

impl Queue {
    pub fn new(endpoint: Endpoint, instance_id: &str) -> Queue {
        let attr = |k: &str, v: &str| json!({"key": k, "value": {"stringValue": v}});
        Queue {
            spans: Mutex::new(Vec::new()),
            endpoint,
            resource: json!({"attributes": [
                attr("service.name", "sluice"),
                attr("service.version", env!("CARGO_PKG_VERSION")),
                attr("service.instance.id", instance_id),
            ]}),
        }
    }

    /// Leaves a request's spans for the exporter; drops them when the queue is full.
    pub fn push(&self, spans: Vec<SpanRecord>) {
        let n = spans.len();
        let mut q = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() + n > CAP {
            drop(q);
            crate::metrics::global()
                .trace_spans
                .with_label_values(&["dropped"])
                .inc_by(n as u64);
            return;
        }
        q.extend(spans);
    }

    fn take(&self) -> Vec<SpanRecord> {
        std::mem::take(&mut *self.spans.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Starts the export loop on the current runtime.
    pub fn spawn(self: Arc<Self>) {
        tokio::spawn(async move {
            let connector = Connector::new(None);
            let mut tick = tokio::time::interval(EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            loop {
                tick.tick().await;
                let all = self.take();
                for batch in all.chunks(BATCH) {
                    let body = self.encode(batch);
                    let sent = tokio::time::timeout(TIMEOUT, self.post(&connector, body)).await;
                    let result = match sent {
                        Ok(Ok(())) => "exported",
                        Ok(Err(e)) => {
                            if !failing {
                                tracing::warn!(error = %e, "trace export failed; spans dropped until it recovers");
                            }
                            "failed"
                        }
                        Err(_) => {
                            if !failing {
                                tracing::warn!(
                                    "trace export timed out; spans dropped until it recovers"
                                );
                            }
                            "failed"
                        }
                    };
                    failing = result == "failed";
                    crate::metrics::global()
                        .trace_spans
                        .with_label_values(&[result])
                        .inc_by(batch.len() as u64);
                }
            }
        });
    }

    /// An `ExportTraceServiceRequest` in OTLP's JSON encoding (ids in hex,
    /// 64-bit integers as strings).
    pub fn encode(&self, spans: &[SpanRecord]) -> Vec<u8> {
        let spans: Vec<Value> = spans.iter().map(span_json).collect();
        let body = json!({"resourceSpans": [{
            "resource": self.resource,
            "scopeSpans": [{
                "scope": {"name": "sluice", "version": env!("CARGO_PKG_VERSION")},
                "spans": spans,
            }],
        }]});
        serde_json::to_vec(&body).unwrap_or_default()
    }

    async fn post(&self, connector: &Connector, body: Vec<u8>) -> Result<(), String> {
        let e = &self.endpoint;
        let addr = tokio::net::lookup_host((e.host.as_str(), e.port))
            .await
            .map_err(|err| format!("resolving the trace endpoint: {err}"))?
            .next()
            .ok_or("the trace endpoint resolves to no address")?;
        let mut peer = HttpPeer::new(addr, e.tls, e.host.clone());
        peer.options.connection_timeout = Some(Duration::from_secs(5));
        let (mut session, _) = connector
            .get_http_session(&peer)
            .await
            .map_err(|err| format!("connecting: {}", err.etype().as_str()))?;
        let mut req = RequestHeader::build("POST", e.path.as_bytes(), None)
            .map_err(|_| "bad request header")?;
        let authority = if (e.tls && e.port == 443) || (!e.tls && e.port == 80) {
            e.host.clone()
        } else {
            format!("{}:{}", e.host, e.port)
        };
        let fields = [
            ("Host", authority),
            ("Content-Type", "application/json".to_string()),
            ("Content-Length", body.len().to_string()),
            ("User-Agent", "sluice".to_string()),
        ];
        for (k, v) in fields {
            req.insert_header(k, v).map_err(|_| "bad request header")?;
        }
        let io = |err: Box<pingora::Error>| format!("sending: {}", err.etype().as_str());
        session
            .write_request_header(Box::new(req))
            .await
            .map_err(io)?;
        session
            .write_request_body(Bytes::from(body), true)
            .await
            .map_err(io)?;
        session.finish_request_body().await.map_err(io)?;
        session.read_response_header().await.map_err(io)?;
        let status = session.response_header().map_or(0, |h| h.status.as_u16());
        while let Ok(Some(_)) = session.read_response_body().await {}
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(format!("the trace endpoint answered {status}"))
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    let mut out = vec![0u8; bytes.len() * 2];
    super::context::hex_into(bytes, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

fn span_json(s: &SpanRecord) -> Value {
    let attrs: Vec<Value> = s
        .attrs
        .iter()
        .map(|(k, v)| {
            let value = match v {
                Attr::Str(s) => json!({"stringValue": s}),
                Attr::Int(i) => json!({"intValue": i.to_string()}),
                Attr::Bool(b) => json!({"boolValue": b}),
            };
            json!({"key": k, "value": value})
        })
        .collect();
    let mut v = json!({
        "traceId": hex(&s.trace_id),
        "spanId": hex(&s.span_id),
        "name": s.name,
        "kind": s.kind,
        "startTimeUnixNano": s.start_ns.to_string(),
        "endTimeUnixNano": s.end_ns.to_string(),
        "attributes": attrs,
        "status": match s.error {
            None => json!({"code": 1}),
            Some(e) => json!({"code": 2, "message": e}),
        },
    });
    if let Some(p) = s.parent {
        v["parentSpanId"] = Value::from(hex(&p));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_default_to_the_traces_path() {
        let e = Endpoint::parse("http://collector:4318").unwrap();
        assert_eq!(
            (e.tls, e.host.as_str(), e.port, e.path.as_str()),
            (false, "collector", 4318, "/v1/traces")
        );
        let e = Endpoint::parse("https://otlp.example.com/v1/traces").unwrap();
        assert_eq!((e.tls, e.port, e.path.as_str()), (true, 443, "/v1/traces"));
        let e = Endpoint::parse("http://[::1]:4318/").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 4318));
        assert!(Endpoint::parse("collector:4318").is_err());
        assert!(Endpoint::parse("http://user:pw@collector").is_err());
    }
}
