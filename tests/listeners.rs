//! What every listener (gateway, web, ops) holds a client to (the 2026-12-01
//! security review, M3 and the rest of the earlier #14): a request head must
//! arrive within `[server] header_timeout_ms`, a body within
//! `[limits] request_read_timeout_ms`, and each listener keeps at most its cap of
//! connections open, closing the next at accept. An operator sees both on
//! `/metrics`.

mod harness;

use harness::{Backend, Opts, Sluice};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn addr(url: &str) -> String {
    url.trim_start_matches("http://").to_string()
}

/// Waits for the server to close the connection (at most `limit`); what it sent
/// and how long that took.
async fn closed_within(c: &mut TcpStream, limit: Duration) -> Option<(String, Duration)> {
    let started = Instant::now();
    let mut got = Vec::new();
    match tokio::time::timeout(limit, c.read_to_end(&mut got)).await {
        Ok(_) => Some((
            String::from_utf8_lossy(&got).into_owned(),
            started.elapsed(),
        )),
        Err(_) => None,
    }
}

#[tokio::test]
async fn a_client_that_stops_mid_head_or_mid_body_is_closed_on_every_listener() {
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        Opts::default()
            .env("SLUICE_SERVER__HEADER_TIMEOUT_MS", "1500")
            .env("SLUICE_LIMITS__REQUEST_READ_TIMEOUT_MS", "1500"),
    )
    .await;
    for (name, url) in [("gateway", &s.gateway), ("web", &s.web), ("ops", &s.ops)] {
        // A head that stops after its first line, then a byte now and then: a
        // per-read timeout would never fire.
        let mut c = TcpStream::connect(addr(url)).await.unwrap();
        c.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        let trickle = async {
            for _ in 0..20 {
                tokio::time::sleep(Duration::from_millis(500)).await;
                if c.write_all(b"x").await.is_err() {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(4), trickle).await;
        let closed = closed_within(&mut c, Duration::from_secs(6)).await;
        assert!(
            closed.is_some(),
            "{name}: a dribbled head is still open after 10 s"
        );

        // A body that stops part way.
        let mut c = TcpStream::connect(addr(url)).await.unwrap();
        c.write_all(
            b"POST /api/signup/instant HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"email\":",
        )
        .await
        .unwrap();
        let closed = closed_within(&mut c, Duration::from_secs(10)).await;
        assert!(
            closed.is_some(),
            "{name}: a stalled body is still open after 10 s"
        );
    }
    // The web and ops listeners close a connection that never sends a byte too
    // (their idle wait counts against the header timeout).
    for (name, url) in [("web", &s.web), ("ops", &s.ops)] {
        let mut c = TcpStream::connect(addr(url)).await.unwrap();
        assert!(
            closed_within(&mut c, Duration::from_secs(10))
                .await
                .is_some(),
            "{name}: an idle connection is still open"
        );
    }
    // A whole request is still answered on each.
    let (st, _) = s.get("/v1/models", None).await;
    assert_eq!(st, 401);
    let r = s
        .http
        .get(format!("{}/healthz", s.ops))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn each_listener_keeps_at_most_its_cap_of_connections() {
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        Opts::default()
            .env("SLUICE_SERVER__MAX_CONNECTIONS", "3")
            .env("SLUICE_SERVER__WEB_MAX_CONNECTIONS", "3"),
    )
    .await;
    for (name, url) in [("gateway", &s.gateway), ("web", &s.web)] {
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(TcpStream::connect(addr(url)).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut next = TcpStream::connect(addr(url)).await.unwrap();
        let _ = next
            .write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
            .await;
        let (sent, _) = closed_within(&mut next, Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("{name}: the connection past the cap was kept"));
        assert!(sent.is_empty(), "{name}: served past the cap: {sent}");
        // One closes; a new one is served.
        drop(held.pop());
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut again = TcpStream::connect(addr(url)).await.unwrap();
        again
            .write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let (sent, _) = closed_within(&mut again, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(sent.starts_with("HTTP/1.1 "), "{name}: {sent}");
        drop(held);
    }
    let m = s.metrics().await;
    for l in ["gateway", "web"] {
        let line = m
            .lines()
            .find(|x| {
                x.starts_with(&format!(
                    "sluice_refused_connections_total{{listener=\"{l}\"}}"
                ))
            })
            .unwrap_or_else(|| panic!("no refusal series for {l}"));
        let n: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(n >= 1.0, "{line}");
    }
    assert!(m.contains("sluice_open_connections{listener=\"ops\"}"));
}
