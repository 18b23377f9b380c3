//! One HTTP/1 request on a gateway connection, over Pingora's session.
//!
//! The gateway answers every request itself, so it needs Pingora's HTTP/1 session
//! (parsing, framing, keep-alive) but none of its proxy app: no upstream proxying,
//! no cache, no HTTP/2 accept loop (the gateway's ALPN offers HTTP/1.1 only). That
//! app's connection futures are sized for all of those, and an open stream held
//! them for its whole life; this loop holds only what a request of ours needs.
//! What it keeps of the app's behaviour: a keep-alive between requests
//! (`server.keepalive_seconds`), a 400 for a malformed request head, a 405 for
//! CONNECT, no new request read once the service is shutting down, and the
//! downstream modules run on every request.

use super::Gateway;
use crate::downstream::client::Client;
use crate::downstream::listener;
use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::Stream;
use pingora::proxy::Session;
use pingora::server::ShutdownWatch;
use sluice_filters::route::route;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a connection's first request head may take when connections are not
/// kept alive (`server.keepalive_seconds = 0`).
const HEAD_WAIT_SECS: u64 = 60;

#[async_trait]
impl ServerApp for Gateway {
    /// Serves one request; the connection comes back for the next one if it can
    /// be reused (Pingora's listener calls this again with it).
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let mut session = Session::new_h1_with_modules(stream, &self.modules);
        let closing = *shutdown.borrow();
        // The wait for this request's head: `server.keepalive_seconds` (60 by
        // default, Pingora's for its own apps), or 60 when that is 0.
        let keepalive = self.state.config.server.keepalive_seconds;
        let head_wait = if keepalive > 0 {
            keepalive
        } else {
            HEAD_WAIT_SECS
        };
        session.set_keepalive((!closing).then_some(head_wait));
        let waits = HeadWaits {
            idle: Duration::from_secs(head_wait),
            head: Duration::from_millis(self.state.config.server.header_timeout_ms),
        };
        if !read_head(&mut session, shutdown, waits).await {
            return None;
        }
        if keepalive == 0 {
            // Reading the head turned keep-alive on for an HTTP/1.1 client: the
            // answer says `connection: close` and the connection ends with it.
            session.set_keepalive(None);
        }
        let started = Instant::now();
        let route = route(session.req_header().uri.path());
        let mut trail = self.state.tracer.start(
            route,
            session.req_header(),
            || Client::of_session(&session, &self.state.config.server.client_ip_header),
            started,
        );
        let served = self.handle(&mut session, route, started, &mut trail).await;
        // On an error a write to the client failed (it left, or its socket broke):
        // the status is what reached it, and nothing more can be said here.
        let status = served.as_ref().copied().unwrap_or_else(|e| {
            tracing::debug!(error = %e, "answer not delivered");
            session
                .response_written()
                .map_or(499, |h| h.status.as_u16())
        });
        self.state.tracer.finish(trail, status);
        served.ok()?;
        let reusable = session.downstream_session.finish().await.ok().flatten()?;
        Some(reusable.into_parts().0)
    }
}

/// How long a connection may wait for its next request's first byte (its idle
/// wait), and then for the rest of the head (`[server] header_timeout_ms`).
#[derive(Clone, Copy)]
struct HeadWaits {
    idle: Duration,
    head: Duration,
}

/// Reads the request head and runs the downstream modules on it; false when
/// there is no request to serve (the client left or stopped mid-head, the head
/// was malformed, the method is CONNECT, or the service is shutting down).
///
/// Pingora times each read of the head, not the head: a client sending a byte a
/// minute would hold its connection for ever. So the first byte is waited for
/// under the idle wait, and the whole head must then arrive within the header
/// timeout. On a connection that is not ours (TLS), which cannot say when its
/// first byte came, both together bound the head.
async fn read_head(session: &mut Session, shutdown: &ShutdownWatch, waits: HeadWaits) -> bool {
    let mut closing = shutdown.clone();
    let within = tokio::select! {
        biased;
        ready = tokio::time::timeout(waits.idle, listener::readable(session)) => match ready {
            Ok(Some(Ok(()))) => waits.head,
            Ok(None) => waits.idle + waits.head,
            Ok(Some(Err(_))) | Err(_) => return false,
        },
        _ = closing.wait_for(|down| *down) => return false,
    };
    let read = tokio::select! {
        // Biased: a request already sent is read before the shutdown is looked at.
        biased;
        read = tokio::time::timeout(within, session.downstream_session.read_request()) => read,
        _ = closing.wait_for(|down| *down) => return false,
    };
    let Ok(read) = read else {
        // The head did not arrive in time.
        session.downstream_session.shutdown().await;
        return false;
    };
    let refuse = match read {
        Ok(true) if session.req_header().method == http::Method::CONNECT => Some(405),
        Ok(true) => None,
        Ok(false) => return false,
        Err(e) if matches!(e.etype, pingora::ErrorType::InvalidHTTPHeader) => Some(400),
        Err(_) => {
            session.downstream_session.shutdown().await;
            return false;
        }
    };
    if let Some(status) = refuse {
        let _ = session.downstream_session.respond_error(status).await;
        session.downstream_session.shutdown().await;
        return false;
    }
    let req = session.downstream_session.req_header_mut();
    if let Err(e) = session
        .downstream_modules_ctx
        .request_header_filter(req)
        .await
    {
        tracing::warn!(error = %e, "request refused by a downstream module");
        let _ = session.downstream_session.respond_error(500).await;
        return false;
    }
    true
}
