//! How a batch line reaches this instance's gateway: HTTP/1.1 over an in-memory
//! pipe (`tokio::io::duplex`) whose other end the gateway serves as it serves a
//! client's connection ([`Lines`]), on kept-alive connections (one per line in
//! flight, reused), with hyper's connection API directly. Over loopback TCP each
//! line cost four socket calls and the kernel's TCP path both ways, on the same
//! core as the line's own work; through the pipe a line is two copies in memory.

use bytes::Bytes;
use http::header::{HeaderName, CONTENT_TYPE, HOST, RETRY_AFTER};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::DuplexStream;

/// Serves one connection's end with the gateway (`server::BatchLines` makes it);
/// the batches room reaches the gateway only through this.
pub(crate) type Lines = Arc<dyn Fn(DuplexStream) + Send + Sync>;

/// Each direction's buffer in the pipe: a line's request and answer usually fit
/// whole, a longer one flows through it.
const PIPE_BUFFER: usize = 64 * 1024;

/// What the gateway answered a line.
pub(super) struct Answer {
    pub(crate) status: u16,
    pub(crate) request_id: Option<String>,
    pub(crate) retry_after: Option<Duration>,
    pub(crate) body: Bytes,
}

pub(super) struct Wire {
    lines: Lines,
    /// Each request's limit: the gateway's deadline and some.
    timeout: Duration,
    /// Idle connections.
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

impl Wire {
    pub(crate) fn new(lines: Lines, timeout: Duration) -> Wire {
        Wire {
            lines,
            timeout,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Posts `body` to `path` with `headers`; `Err` when the gateway was not
    /// reached or its answer was cut off.
    pub(crate) async fn post(
        &self,
        path: &str,
        headers: &[(HeaderName, String)],
        body: Bytes,
    ) -> Result<Answer, String> {
        tokio::time::timeout(self.timeout, self.send(path, headers, body))
            .await
            .unwrap_or_else(|_| Err("timed out".into()))
    }

    async fn send(
        &self,
        path: &str,
        headers: &[(HeaderName, String)],
        body: Bytes,
    ) -> Result<Answer, String> {
        let taken = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            std::iter::from_fn(|| idle.pop()).find(|s| !s.is_closed())
        };
        let mut sender = match taken {
            Some(s) => s,
            None => self.connect().await?,
        };
        let mut req = http::Request::post(path)
            .header(HOST, "batch-lines")
            .header(CONTENT_TYPE, "application/json");
        for (n, v) in headers {
            req = req.header(n, v);
        }
        let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
        sender.ready().await.map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let (status, request_id, retry_after) = head(resp.status(), resp.headers());
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if !sender.is_closed() {
            self.idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(sender);
        }
        Ok(Answer {
            status,
            request_id,
            retry_after,
            body,
        })
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        let (ours, theirs) = tokio::io::duplex(PIPE_BUFFER);
        (self.lines)(theirs);
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(ours))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            // Ends when the gateway closes the connection or the sender is dropped.
            let _ = conn.await;
        });
        Ok(sender)
    }
}

/// The status and the two headers the runner reads.
fn head(status: http::StatusCode, h: &http::HeaderMap) -> (u16, Option<String>, Option<Duration>) {
    let request_id = h
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let retry_after = h
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_secs);
    (status.as_u16(), request_id, retry_after)
}
