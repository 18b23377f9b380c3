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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Accepts on a listener bound beforehand and serves each connection with `app`
/// until the service shuts down.
pub(crate) struct PlainListener<A> {
    pub(crate) name: &'static str,
    pub(crate) app: Arc<A>,
    pub(crate) listener: Option<std::net::TcpListener>,
    pub(crate) threads: usize,
    /// Past it a new connection is closed at accept.
    pub(crate) cap: super::cap::ConnectionCap,
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> pingora::services::Service for PlainListener<A> {
    async fn start_service(
        &mut self,
        _fds: Option<ListenFds>,
        mut shutdown: ShutdownWatch,
        _listeners_per_fd: usize,
    ) {
        let Some(listener) = self.listener.take().and_then(|l| to_tokio(self.name, l)) else {
            return;
        };
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = shutdown.wait_for(|down| *down) => break,
            };
            let (tcp, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(service = self.name, error = %e, "accept failed");
                    // Out of descriptors: accept would fail at once again; give
                    // the connections being served a moment to close.
                    if e.raw_os_error() == Some(libc::EMFILE) {
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    }
                    continue;
                }
            };
            let Some(held) = self.cap.take() else {
                drop(tcp);
                continue;
            };
            // As Pingora's listener does: answers are small writes that must not
            // wait for an acknowledgement.
            let _ = tcp.set_nodelay(true);
            let (app, shutdown) = (self.app.clone(), shutdown.clone());
            pingora_runtime::current_handle().spawn(async move {
                let mut conn: pingora::protocols::Stream =
                    Box::new(ClientConn::new(tcp, Some(peer)));
                while let Some(next) = app.process_new(conn, &shutdown).await {
                    conn = next;
                }
                drop(held);
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

/// A listener bound beforehand, for the runtime of the service that serves it;
/// None (and an error logged) when it cannot be.
pub(crate) fn to_tokio(service: &str, l: std::net::TcpListener) -> Option<tokio::net::TcpListener> {
    tokio::net::TcpListener::from_std(l)
        .inspect_err(|e| tracing::error!(service, error = %e, "listener unusable"))
        .ok()
}

/// What a response's head and a short body are gathered in before they are
/// written, so they leave in one write (Pingora's default for its own streams).
const WRITE_BUFFER: usize = 1460;

/// A client connection: the socket, read directly (the HTTP session reads into
/// buffers of its own), and writes gathered up to [`WRITE_BUFFER`] until a flush.
/// The gathering buffer is let go at each flush: a stream's connection spends its
/// life between flushes waiting for the next token, and holds no buffer then.
#[derive(Debug)]
pub(crate) struct ClientConn {
    tcp: TcpStream,
    /// The client's address, as `accept` gave it (for the access line and the
    /// request span; there is no socket digest to carry it).
    peer: Option<std::net::SocketAddr>,
    out: Vec<u8>,
    /// How much of `out` is written (a partial write leaves the rest in place).
    sent: usize,
    /// The next flush leaves what is gathered for the write after it
    /// ([`hold_next_flush`]).
    hold: AtomicBool,
    /// A flush was held: the next write joins what is gathered, whatever its size.
    carry: bool,
}

/// Lets the next flush on the session's connection pass without writing, so that
/// what was gathered goes out with the next write. For a writer that knows more
/// follows at once: a stream's head, which Pingora flushes on its own because a
/// chunked answer may be real time, then its first token; or a stream's last
/// events, then the terminating chunk. Either pair leaves in one write instead of
/// two. No effect on a connection that is not ours (TLS, a batch line's pipe).
pub(crate) fn hold_next_flush(session: &pingora::proxy::Session) {
    let conn = session.downstream_session.stream();
    if let Some(conn) = conn.and_then(|c| (**c).as_any().downcast_ref::<ClientConn>()) {
        conn.hold.store(true, Ordering::Relaxed);
    }
}

/// Waits until the session's connection has bytes to read (or is closed); `None`
/// when the connection is not ours (TLS), which cannot tell.
pub(crate) async fn readable(session: &pingora::proxy::Session) -> Option<io::Result<()>> {
    let conn = session.downstream_session.stream();
    let ours = conn.and_then(|c| (**c).as_any().downcast_ref::<ClientConn>())?;
    Some(ours.tcp.readable().await)
}

/// The client's IP address and port: from our own connection, or from the
/// socket digest of one Pingora's listener accepted (TLS).
pub(crate) fn peer(session: &pingora::proxy::Session) -> Option<std::net::SocketAddr> {
    let conn = session.downstream_session.stream();
    match conn.and_then(|c| (**c).as_any().downcast_ref::<ClientConn>()) {
        Some(ours) => ours.peer,
        None => session.client_addr().and_then(|a| a.as_inet()).copied(),
    }
}

impl ClientConn {
    pub(crate) fn new(tcp: TcpStream, peer: Option<std::net::SocketAddr>) -> ClientConn {
        ClientConn {
            tcp,
            peer,
            out: Vec::new(),
            sent: 0,
            hold: AtomicBool::new(false),
            carry: false,
        }
    }

    /// Writes out what is gathered.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.out.len() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, &self.out[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.out = Vec::new();
        self.sent = 0;
        self.carry = false;
        Poll::Ready(Ok(()))
    }

    /// Gathers `len` bytes if they fit beside what is gathered, or whatever their
    /// size around a held flush (before it, they wait for what follows; after
    /// it, they join what waited); else writes out what is gathered first, and
    /// gathers them only if they fit on their own.
    /// Ready(true): gather them now; Ready(false): write them straight out.
    fn poll_room(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<io::Result<bool>> {
        if self.out.len() + len <= WRITE_BUFFER || self.carry || *self.hold.get_mut() {
            return Poll::Ready(Ok(true));
        }
        ready!(self.poll_drain(cx))?;
        Poll::Ready(Ok(len <= WRITE_BUFFER))
    }

    fn gather<'a>(&mut self, len: usize, parts: impl IntoIterator<Item = &'a [u8]>) {
        let room = (self.out.len() + len).max(WRITE_BUFFER) - self.out.len();
        self.out.reserve_exact(room);
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
            self.gather(buf.len(), [buf]);
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
            self.gather(len, bufs.iter().map(|b| &**b));
            return Poll::Ready(Ok(len));
        }
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.hold.swap(false, Ordering::Relaxed) {
            self.carry = true;
            return Poll::Ready(Ok(()));
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connection of ours and the client's end of it.
    async fn pair() -> (ClientConn, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (ours, _) = l.accept().await.unwrap();
        (ClientConn::new(ours, None), client)
    }

    /// What has arrived at the client so far, without waiting for more.
    async fn arrived(client: &mut TcpStream) -> Vec<u8> {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let mut got = vec![0u8; 1 << 16];
        match client.try_read(&mut got) {
            Ok(n) => got.truncate(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => got.clear(),
            Err(e) => panic!("{e}"),
        }
        got
    }

    #[tokio::test]
    async fn small_writes_leave_together_at_the_flush() {
        let (mut conn, mut client) = pair().await;
        conn.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        conn.write_all(b"hello").await.unwrap();
        assert_eq!(arrived(&mut client).await, b"");
        conn.flush().await.unwrap();
        assert_eq!(arrived(&mut client).await, b"HTTP/1.1 200 OK\r\n\r\nhello");
        // The buffer is let go once written.
        assert_eq!(conn.out.capacity(), 0);
    }

    #[tokio::test]
    async fn a_write_larger_than_the_buffer_goes_straight_out_after_what_was_gathered() {
        let (mut conn, mut client) = pair().await;
        conn.write_all(b"head").await.unwrap();
        let big = vec![b'x'; WRITE_BUFFER * 2];
        conn.write_all(&big).await.unwrap();
        let mut got = vec![0u8; 4 + big.len()];
        client.read_exact(&mut got).await.unwrap();
        assert!(got.starts_with(b"head") && got[4..] == big[..]);
    }

    #[tokio::test]
    async fn what_is_gathered_leaves_whole_and_in_order_over_partial_writes() {
        let (mut conn, mut client) = pair().await;
        // Far more than the socket buffers hold: the drain takes many writes, each
        // partial, while the client reads.
        let big: Vec<u8> = (0..8 << 20).map(|i| (i % 251) as u8).collect();
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; 4 + (8 << 20)];
            client.read_exact(&mut got).await.unwrap();
            got
        });
        conn.hold.store(true, Ordering::Relaxed);
        conn.write_all(b"head").await.unwrap();
        conn.flush().await.unwrap();
        conn.write_all(&big).await.unwrap();
        conn.flush().await.unwrap();
        let got = reader.await.unwrap();
        assert!(got.starts_with(b"head") && got[4..] == big[..]);
        assert_eq!(conn.out.capacity(), 0);
    }

    #[tokio::test]
    async fn a_held_flush_sends_nothing_and_its_bytes_leave_with_the_next_write() {
        let (mut conn, mut client) = pair().await;
        conn.hold.store(true, Ordering::Relaxed);
        conn.write_all(b"head").await.unwrap();
        conn.flush().await.unwrap();
        assert_eq!(arrived(&mut client).await, b"");
        // Held or not, the next flush writes everything, a large write included.
        let big = vec![b'y'; WRITE_BUFFER * 3];
        conn.write_all(&big).await.unwrap();
        conn.flush().await.unwrap();
        let mut got = vec![0u8; 4 + big.len()];
        client.read_exact(&mut got).await.unwrap();
        assert!(got.starts_with(b"head") && got[4..] == big[..]);
        // A large write while held is gathered whole, to leave with what follows.
        conn.hold.store(true, Ordering::Relaxed);
        conn.write_all(&big).await.unwrap();
        conn.flush().await.unwrap();
        assert_eq!(arrived(&mut client).await, b"");
        // What follows a held flush joins what waited, whatever the sizes.
        conn.write_all(b"0\r\n\r\n").await.unwrap();
        assert_eq!(arrived(&mut client).await, b"");
        conn.flush().await.unwrap();
        let mut got = vec![0u8; big.len() + 5];
        client.read_exact(&mut got).await.unwrap();
        assert!(got.ends_with(b"0\r\n\r\n"));
    }
}
