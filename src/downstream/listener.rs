//! The gateway's plain-TCP listener: our own accept loop, handing each client
//! connection to the app (the gateway's HTTP/1 loop) on one of the service's
//! threads, as Pingora's listener does.
//!
//! Why not Pingora's: its per-connection task holds a TLS handshake's state beside
//! the connection for the connection's whole life (a task's size is its largest
//! state), and its plain streams carry a socket digest and timing bookkeeping
//! nothing here reads. An open stream held all of that. A TLS gateway still goes
//! through Pingora's listener (`server.rs`).

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, Ssl, UniqueID, UniqueIDType,
};
use pingora::server::{ListenFds, ShutdownWatch};
use std::io;
use std::os::fd::AsRawFd as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Accepts on a listener bound beforehand and serves each connection with `app`
/// until the service shuts down.
pub struct PlainListener<A> {
    pub name: &'static str,
    pub app: Arc<A>,
    pub listener: Option<std::net::TcpListener>,
    pub threads: usize,
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> pingora::services::Service for PlainListener<A> {
    async fn start_service(
        &mut self,
        _fds: Option<ListenFds>,
        mut shutdown: ShutdownWatch,
        _listeners_per_fd: usize,
    ) {
        let Some(listener) = self.listener.take() else {
            return;
        };
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(service = self.name, error = %e, "listener unusable");
                return;
            }
        };
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = shutdown.wait_for(|down| *down) => break,
            };
            let tcp = match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    tracing::warn!(service = self.name, error = %e, "accept failed");
                    // Out of descriptors: accept would fail at once again; give
                    // the connections being served a moment to close.
                    if e.raw_os_error() == Some(EMFILE) {
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    }
                    continue;
                }
            };
            // As Pingora's listener does: answers are small writes that must not
            // wait for an acknowledgement.
            let _ = tcp.set_nodelay(true);
            let (app, shutdown) = (self.app.clone(), shutdown.clone());
            pingora_runtime::current_handle().spawn(async move {
                let mut conn: pingora::protocols::Stream = Box::new(ClientConn::new(tcp));
                while let Some(next) = app.process_new(conn, &shutdown).await {
                    conn = next;
                }
            });
        }
    }

    fn name(&self) -> &str {
        self.name
    }

    fn threads(&self) -> Option<usize> {
        Some(self.threads)
    }
}

/// The process is out of file descriptors (errno EMFILE).
const EMFILE: i32 = 24;

/// What a response's head and a short body are gathered in before they are
/// written, so they leave in one write (Pingora's default for its own streams).
const WRITE_BUFFER: usize = 1460;

/// A client connection: the socket, read directly (the HTTP session reads into
/// buffers of its own), and writes gathered up to [`WRITE_BUFFER`] until a flush.
/// The gathering buffer is let go at each flush: a stream's connection spends its
/// life between flushes waiting for the next token, and holds no buffer then.
#[derive(Debug)]
pub struct ClientConn {
    tcp: TcpStream,
    out: Vec<u8>,
}

impl ClientConn {
    pub fn new(tcp: TcpStream) -> ClientConn {
        ClientConn {
            tcp,
            out: Vec::new(),
        }
    }

    /// Writes out what is gathered.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.out.is_empty() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, &self.out))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out.drain(..n);
        }
        self.out = Vec::new();
        Poll::Ready(Ok(()))
    }

    /// Gathers `len` bytes if they fit beside what is gathered; else writes out
    /// what is gathered first, and gathers them only if they fit on their own.
    /// Ready(true): gather them now; Ready(false): write them straight out.
    fn poll_room(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<io::Result<bool>> {
        if self.out.len() + len <= WRITE_BUFFER {
            return Poll::Ready(Ok(true));
        }
        ready!(self.poll_drain(cx))?;
        Poll::Ready(Ok(len <= WRITE_BUFFER))
    }

    fn gather<'a>(&mut self, parts: impl IntoIterator<Item = &'a [u8]>) {
        if self.out.capacity() == 0 {
            self.out.reserve_exact(WRITE_BUFFER);
        }
        for p in parts {
            self.out.extend_from_slice(p);
        }
    }
}

impl AsyncRead for ClientConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for ClientConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if ready!(self.poll_room(cx, buf.len()))? {
            self.gather([buf]);
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let len = bufs.iter().map(|b| b.len()).sum();
        if ready!(self.poll_room(cx, len))? {
            self.gather(bufs.iter().map(|b| &**b));
            return Poll::Ready(Ok(len));
        }
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

#[async_trait]
impl Shutdown for ClientConn {
    async fn shutdown(&mut self) {
        let _ = tokio::io::AsyncWriteExt::shutdown(self).await;
    }
}

impl UniqueID for ClientConn {
    fn id(&self) -> UniqueIDType {
        self.tcp.as_raw_fd() as UniqueIDType
    }
}

impl Ssl for ClientConn {}

impl Peek for ClientConn {}

impl GetTimingDigest for ClientConn {
    fn get_timing_digest(&self) -> Vec<Option<pingora::protocols::TimingDigest>> {
        Vec::new()
    }
}

impl GetProxyDigest for ClientConn {
    fn get_proxy_digest(&self) -> Option<Arc<pingora::protocols::raw_connect::ProxyDigest>> {
        None
    }
}

impl GetSocketDigest for ClientConn {
    fn get_socket_digest(&self) -> Option<Arc<pingora::protocols::SocketDigest>> {
        None
    }
}
