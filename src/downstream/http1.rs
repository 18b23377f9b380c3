//! The web and ops listeners' HTTP/1 loop: an axum router served by hyper with
//! the limits a public listener needs, which `axum::serve` sets none of (it
//! gives hyper no timer, so even hyper's default header timeout is dropped):
//!
//! - the request head must arrive within `[server] header_timeout_ms`, counted
//!   from the moment the connection waits for it: a keep-alive connection idle
//!   that long is closed too;
//! - the request body must arrive within `[limits] request_read_timeout_ms`;
//! - at most `cap` connections are open at once; past it a new one is closed at
//!   once, before anything is read from it.

use super::cap::{ConnectionCap, Held};
use axum::extract::connect_info::ConnectInfo;
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::future::Future as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tower::ServiceExt as _;

/// A listener's limits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) header_timeout: Duration,
    pub(crate) body_timeout: Duration,
}

/// Serves one accepted connection with `router` under `limits`; returns when the
/// connection ends. `held` is its place under the listener's cap.
pub(crate) async fn serve_connection<IO>(
    io: IO,
    peer: SocketAddr,
    router: axum::Router,
    limits: Limits,
    held: Held,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service =
        hyper::service::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
            let router = router.clone();
            // What `into_make_service_with_connect_info` would give the handlers.
            req.extensions_mut().insert(ConnectInfo(peer));
            let req = req.map(|b| axum::body::Body::new(Deadline::new(b, limits.body_timeout)));
            async move { router.oneshot(req).await }
        });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    if let Err(e) = http.serve_connection(TokioIo::new(io), service).await {
        tracing::debug!(error = %e, "connection ended");
    }
    drop(held);
}

/// Accepts on `listener` for ever, serving each connection that fits under `cap`.
pub(crate) async fn serve_plain(
    name: &'static str,
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: Limits,
    cap: ConnectionCap,
) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, say: wait rather than spin.
                tracing::warn!(service = name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(held) = cap.take() else {
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        tokio::spawn(serve_connection(tcp, peer, router.clone(), limits, held));
    }
}

/// A request body that must end by a deadline; past it the next read fails,
/// the handler sees an error, and hyper closes the connection.
struct Deadline<B> {
    inner: B,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl<B> Deadline<B> {
    fn new(inner: B, within: Duration) -> Deadline<B> {
        Deadline {
            inner,
            timer: Box::pin(tokio::time::sleep(within)),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
struct BodyTimedOut;

impl<B> Body for Deadline<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(got) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(got.map(|r| r.map_err(Into::into)));
        }
        if self.timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(BodyTimedOut))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn start(limits: Limits, cap: usize) -> SocketAddr {
        let router = axum::Router::new().route(
            "/",
            axum::routing::post(|body: Bytes| async move { format!("{} bytes", body.len()) }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(serve_plain(
            "test",
            l,
            router,
            limits,
            ConnectionCap::new("test", cap),
        ));
        addr
    }

    const QUICK: Limits = Limits {
        header_timeout: Duration::from_millis(300),
        body_timeout: Duration::from_millis(300),
    };

    /// Reads until the server closes; what it sent.
    async fn until_closed(c: &mut tokio::net::TcpStream) -> String {
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut got)).await;
        String::from_utf8_lossy(&got).into_owned()
    }

    #[tokio::test]
    async fn a_head_that_never_finishes_is_closed_at_the_header_timeout() {
        let addr = start(QUICK, 8).await;
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"POST / HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        let started = std::time::Instant::now();
        until_closed(&mut c).await;
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "closed by the server"
        );
        // An idle connection (no byte at all) is closed as well.
        let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        until_closed(&mut idle).await;
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_body_that_never_finishes_is_cut_at_the_body_timeout() {
        let addr = start(QUICK, 8).await;
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nabc")
            .await
            .unwrap();
        let got = until_closed(&mut c).await;
        assert!(!got.contains("100 bytes"), "{got}");
        // A whole request is answered.
        let mut ok = tokio::net::TcpStream::connect(addr).await.unwrap();
        ok.write_all(
            b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\nconnection: close\r\n\r\nabc",
        )
        .await
        .unwrap();
        assert!(until_closed(&mut ok).await.contains("3 bytes"));
    }

    #[tokio::test]
    async fn connections_past_the_cap_are_closed_at_once() {
        let addr = start(
            Limits {
                header_timeout: Duration::from_secs(30),
                body_timeout: Duration::from_secs(30),
            },
            2,
        )
        .await;
        let _a = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _b = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = third
            .write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
            .await;
        let got = until_closed(&mut third).await;
        assert!(got.is_empty(), "the third was served: {got}");
        // Once one closes, a new connection is served.
        drop(_a);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut next = tokio::net::TcpStream::connect(addr).await.unwrap();
        next.write_all(
            b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        assert!(until_closed(&mut next).await.contains("0 bytes"));
    }
}
