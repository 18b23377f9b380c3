//! Reading a provider's HTTP/1.1 answer on a connection we own: the status line,
//! the framing headers (length, chunked, close) and the body as it arrives.
//!
//! Pingora's client session builds a full header map (with each name's original
//! case) and a 64 KiB body buffer for every answer; a rung's answer needs only its
//! status and framing, so this reader parses into a stack array and keeps one
//! buffer per call. Reads are cancel-safe: state moves only after bytes arrived.

use bytes::{Buf, Bytes, BytesMut};
use pingora::{Error, ErrorType, Result};
use tokio::io::{AsyncRead, AsyncReadExt};

/// A header block larger than this is refused (as a proxy would).
const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 128;
/// Interim (1xx) answers skipped before the final one; a server needs one or two,
/// and each costs a parse: a hostile one could send thousands.
const MAX_INTERIM: usize = 8;
/// Room made for a read: one page first, doubled each time a read fills all the
/// room it had, up to `READ_MAX`. A stream's small chunks then touch one page of
/// memory per open stream, not a 16 KiB buffer filled (and made resident) page by
/// page as the stream goes on; a large answer still reads in large gulps.
const READ_FIRST: usize = 4 * 1024;
const READ_MAX: usize = 64 * 1024;

/// How the body is delimited, and how much of it is left.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Body {
    /// `Content-Length`: bytes still to come.
    Length(u64),
    /// Chunked: the next chunk's size line is due.
    ChunkSize,
    /// Chunked: bytes left in the current chunk.
    ChunkData(u64),
    /// Chunked: the line break that ends a chunk's data.
    ChunkEnd,
    /// Chunked: trailer lines after the last chunk, up to an empty line.
    Trailers,
    /// Neither: the body runs until the peer closes.
    UntilClose,
    Done,
}

/// What one parse of the buffer found.
enum Parsed {
    /// The final answer's head; the body follows.
    Final,
    /// An interim (1xx) answer, dropped.
    Interim,
    /// More bytes are needed.
    Partial,
}

/// One answer being read from `S`.
pub struct Response<S> {
    stream: S,
    buf: BytesMut,
    status: u16,
    body: Body,
    keepalive: bool,
    /// Interim answers skipped so far, and their bytes (counted against
    /// `MAX_HEAD` with the final head).
    interim: usize,
    interim_bytes: usize,
    /// The room the next read gets when the buffer runs low.
    read_size: usize,
}

impl<S: AsyncRead + Unpin> Response<S> {
    /// Reads up to the end of the header block (skipping 1xx interim answers).
    pub async fn read_head(stream: S) -> Result<Response<S>> {
        let mut r = Response {
            stream,
            buf: BytesMut::with_capacity(4096),
            status: 0,
            body: Body::Done,
            keepalive: false,
            interim: 0,
            interim_bytes: 0,
            read_size: READ_FIRST,
        };
        loop {
            if r.parse_head()? {
                return Ok(r);
            }
            if r.interim_bytes + r.buf.len() >= MAX_HEAD {
                return Error::e_explain(ErrorType::InvalidHTTPHeader, "response header too large");
            }
            if r.fill().await? == 0 {
                return Error::e_explain(
                    ErrorType::ConnectionClosed,
                    "closed before the response header",
                );
            }
        }
    }

    /// Parses a complete head from the buffer, if there is one; interim (1xx)
    /// answers are dropped (a loop, never recursion: each parse holds a header
    /// array on the stack) and `false` returned when the caller must read on.
    fn parse_head(&mut self) -> Result<bool> {
        loop {
            match self.next_head()? {
                Parsed::Final => return Ok(true),
                Parsed::Partial => return Ok(false),
                Parsed::Interim => {}
            }
        }
    }

    /// Parses one head off the buffer.
    fn next_head(&mut self) -> Result<Parsed> {
        if self.buf.is_empty() {
            return Ok(Parsed::Partial);
        }
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut headers);
        let len = match resp.parse(&self.buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
            Err(e) => {
                return Error::e_explain(ErrorType::InvalidHTTPHeader, format!("response: {e}"))
            }
        };
        let status = resp.code.unwrap_or(0);
        if (100..200).contains(&status) && status != 101 {
            self.interim += 1;
            self.interim_bytes += len;
            if self.interim > MAX_INTERIM {
                return Error::e_explain(ErrorType::InvalidHTTPHeader, "too many interim answers");
            }
            self.buf.advance(len);
            return Ok(Parsed::Interim);
        }
        let mut length = None;
        let mut chunked = false;
        let mut close = resp.version != Some(1);
        for h in resp.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                let n = std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok());
                match (n, length) {
                    (Some(n), None) => length = Some(n),
                    (Some(n), Some(m)) if n == m => {}
                    _ => {
                        return Error::e_explain(ErrorType::InvalidHTTPHeader, "bad content-length")
                    }
                }
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                // The last coding decides; anything but chunked runs to the close.
                chunked = h
                    .value
                    .rsplit(|&b| b == b',')
                    .next()
                    .is_some_and(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked"));
                close |= !chunked;
            } else if h.name.eq_ignore_ascii_case("connection") {
                close |= h
                    .value
                    .split(|&b| b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
            }
        }
        self.status = status;
        self.body = if status == 204 || status == 304 {
            Body::Done
        } else if chunked {
            Body::ChunkSize
        } else if let Some(n) = length {
            if n == 0 {
                Body::Done
            } else {
                Body::Length(n)
            }
        } else {
            close = true;
            Body::UntilClose
        };
        self.keepalive = !close;
        self.buf.advance(len);
        Ok(Parsed::Final)
    }

    pub fn status(&self) -> u16 {
        self.status
    }

    /// The next piece of the body; `Ok(None)` at its end.
    pub async fn read(&mut self) -> Result<Option<Bytes>> {
        loop {
            if let Some(piece) = self.take()? {
                return Ok(Some(piece));
            }
            if self.body == Body::Done {
                return Ok(None);
            }
            if self.fill().await? == 0 {
                if self.body == Body::UntilClose {
                    self.body = Body::Done;
                    return Ok(None);
                }
                return Error::e_explain(ErrorType::ConnectionClosed, "closed inside the body");
            }
        }
    }

    /// Body bytes the buffer already holds, moving through chunk framing; `None`
    /// when more must be read (or the body is done).
    fn take(&mut self) -> Result<Option<Bytes>> {
        loop {
            match self.body {
                Body::Done => return Ok(None),
                _ if self.buf.is_empty() => return Ok(None),
                Body::UntilClose => return Ok(Some(self.buf.split().freeze())),
                Body::Length(left) => return Ok(Some(self.piece(left, Body::Done, Body::Length))),
                Body::ChunkData(left) => {
                    return Ok(Some(self.piece(left, Body::ChunkEnd, Body::ChunkData)))
                }
                Body::ChunkSize => match httparse::parse_chunk_size(&self.buf) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        self.buf.advance(used);
                        self.body = if size == 0 {
                            Body::Trailers
                        } else {
                            Body::ChunkData(size)
                        };
                    }
                    Ok(httparse::Status::Partial) if self.buf.len() < 1024 => return Ok(None),
                    _ => return Error::e_explain(ErrorType::InvalidHTTPHeader, "bad chunk size"),
                },
                Body::ChunkEnd => {
                    if self.buf.len() < 2 {
                        if self.buf[0] != b'\r' {
                            return Error::e_explain(ErrorType::InvalidHTTPHeader, "bad chunk end");
                        }
                        return Ok(None);
                    }
                    if &self.buf[..2] != b"\r\n" {
                        return Error::e_explain(ErrorType::InvalidHTTPHeader, "bad chunk end");
                    }
                    self.buf.advance(2);
                    self.body = Body::ChunkSize;
                }
                Body::Trailers => match self.buf.windows(2).position(|w| w == b"\r\n") {
                    Some(0) => {
                        self.buf.advance(2);
                        self.body = Body::Done;
                    }
                    // A trailer field: read past it and ignore it.
                    Some(i) => self.buf.advance(i + 2),
                    None if self.buf.len() < MAX_HEAD => return Ok(None),
                    None => return Error::e_explain(ErrorType::InvalidHTTPHeader, "bad trailers"),
                },
            }
        }
    }

    /// Up to `left` buffered bytes of the body; `then` follows once they were all
    /// that was left, else `more` of the rest.
    fn piece(&mut self, left: u64, then: Body, more: fn(u64) -> Body) -> Bytes {
        let n = (self.buf.len() as u64).min(left);
        self.body = if n == left { then } else { more(left - n) };
        self.buf.split_to(n as usize).freeze()
    }

    /// Reads more from the socket into the buffer; the count read (0: closed).
    async fn fill(&mut self) -> Result<usize> {
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(self.read_size);
        }
        let room = self.buf.capacity() - self.buf.len();
        let n = self
            .stream
            .read_buf(&mut self.buf)
            .await
            .map_err(|e| Error::because(ErrorType::ReadError, "reading the response", e))?;
        if n == room {
            self.read_size = (self.read_size * 2).min(READ_MAX);
        }
        Ok(n)
    }

    /// The connection, when the answer was read whole and it may carry another.
    pub fn reusable(self) -> Option<S> {
        (self.body == Body::Done && self.buf.is_empty() && self.keepalive).then_some(self.stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// Feeds `parts` to a reader one write at a time (so framing spans reads).
    async fn answer(parts: &[&[u8]]) -> (u16, Result<Vec<u8>>, bool) {
        let (client, mut server) = tokio::io::duplex(64);
        let parts: Vec<Vec<u8>> = parts.iter().map(|p| p.to_vec()).collect();
        let writer = tokio::spawn(async move {
            for p in parts {
                server.write_all(&p).await.unwrap();
                tokio::task::yield_now().await;
            }
            server.shutdown().await.unwrap();
            // Hold the pipe open until the reader is done with it.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        });
        let mut r = match Response::read_head(client).await {
            Ok(r) => r,
            Err(e) => return (0, Err(e), false),
        };
        let status = r.status();
        let mut body = Vec::new();
        let out = loop {
            match r.read().await {
                Ok(Some(b)) => body.extend_from_slice(&b),
                Ok(None) => break Ok(body),
                Err(e) => break Err(e),
            }
        };
        let reusable = out.is_ok() && r.reusable().is_some();
        writer.abort();
        (status, out, reusable)
    }

    /// Reads an answer written whole into a pipe of `pipe` bytes; the body, and the
    /// room the reader would give its next read.
    async fn read_whole(head: &[u8], body: &[u8], pipe: usize) -> (Vec<u8>, usize) {
        let (client, mut server) = tokio::io::duplex(pipe);
        let mut all = head.to_vec();
        all.extend_from_slice(body);
        let writer = tokio::spawn(async move {
            server.write_all(&all).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        });
        let mut r = Response::read_head(client).await.unwrap();
        let mut got = Vec::new();
        while let Some(b) = r.read().await.unwrap() {
            got.extend_from_slice(&b);
        }
        writer.abort();
        (got, r.read_size)
    }

    #[tokio::test]
    async fn reads_start_at_a_page_and_grow_only_for_large_answers() {
        // A large answer: the reads fill their room, so it grows to the most.
        let big: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", big.len());
        let (got, room) = read_whole(head.as_bytes(), &big, 1 << 20).await;
        assert_eq!(got, big);
        assert_eq!(room, READ_MAX);
        // Small pieces of a stream never fill a page: the room stays one page.
        let (got, room) = read_whole(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
            b"hello",
            64,
        )
        .await;
        assert_eq!(got, b"hello");
        assert_eq!(room, READ_FIRST);
    }

    #[tokio::test]
    async fn content_length_bodies_end_at_their_length() {
        let (s, body, reuse) = answer(&[
            b"HTTP/1.1 200 OK\r\nContent-Le",
            b"ngth: 11\r\nX-A: b\r\n\r\nhello",
            b" world",
        ])
        .await;
        assert_eq!(
            (s, body.unwrap(), reuse),
            (200, b"hello world".to_vec(), true)
        );
    }

    #[tokio::test]
    async fn chunked_bodies_decode_across_reads_with_trailers() {
        let (s, body, reuse) = answer(&[
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nda",
            b"ta:\r",
            b"\n1",
            b"A;ext=1\r\n",
            &[b'x'; 26],
            b"\r\n0\r\nX-Trailer: 1\r\n\r\n",
        ])
        .await;
        let mut want = b"data:".to_vec();
        want.extend_from_slice(&[b'x'; 26]);
        assert_eq!((s, body.unwrap(), reuse), (200, want, true));
    }

    #[tokio::test]
    async fn interim_answers_are_skipped_and_close_runs_to_the_end() {
        let (s, body, reuse) = answer(&[
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Busy\r\nConnection: close\r\n\r\nno",
            b" luck",
        ])
        .await;
        assert_eq!((s, body.unwrap(), reuse), (503, b"no luck".to_vec(), false));
    }

    #[tokio::test]
    async fn a_few_interim_answers_are_skipped_and_a_flood_is_refused() {
        let interim = b"HTTP/1.1 100 Continue\r\n\r\n";
        let fine = [
            interim.repeat(MAX_INTERIM),
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
        ]
        .concat();
        let (s, body, _) = answer(&[&fine]).await;
        assert_eq!((s, body.unwrap()), (200, b"ok".to_vec()));
        let flood = [
            interim.repeat(MAX_INTERIM + 1),
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
        ]
        .concat();
        let (_, body, _) = answer(&[&flood]).await;
        assert!(body.is_err(), "past the cap the answer is refused");
    }

    /// Thousands of interim answers in one read: refused, not a stack overflow
    /// (which would abort the whole process).
    #[tokio::test]
    async fn an_interim_flood_in_one_read_does_not_recurse() {
        let (client, mut server) = tokio::io::duplex(1 << 20);
        let flood = b"HTTP/1.1 100 \r\n\r\n".repeat(20_000);
        server.write_all(&flood).await.unwrap();
        server.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        assert!(Response::read_head(client).await.is_err());
    }

    #[tokio::test]
    async fn a_body_cut_short_is_an_error_and_the_connection_is_not_kept() {
        let (_, body, reuse) = answer(&[b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"]).await;
        assert!(body.is_err());
        assert!(!reuse);
        let (_, body, _) = answer(&[
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde",
            b"XX",
        ])
        .await;
        assert!(body.is_err(), "chunk data must end in CRLF");
    }

    #[tokio::test]
    async fn bad_heads_are_refused() {
        for head in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            b"garbage\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n",
        ] {
            let (_, body, _) = answer(&[head]).await;
            assert!(body.is_err(), "{}", String::from_utf8_lossy(head));
        }
        let (s, body, reuse) = answer(&[b"HTTP/1.1 204 No Content\r\n\r\n"]).await;
        assert_eq!((s, body.unwrap(), reuse), (204, vec![], true));
    }
}
