//! Idle HTTP/1.1 upstream connections, ready for the next request.
//!
//! Pingora's connector pool parks each released connection behind a spawned
//! watcher task, an async mutex, a oneshot and an LRU entry, and taking it back
//! means waking that task and waiting for it to let go: two extra task switches,
//! a `getpeername` and a dozen allocations on every request's critical path, about
//! a tenth of the gateway's CPU at concurrency 1. This pool is a locked list per
//! peer instead. A connection the server closed while it idled is seen when it is
//! taken (the reactor has already marked it readable) and dropped then; one older
//! than the idle limit is closed on the next take or put for any peer. New
//! connections and HTTP/2 still go through Pingora's connector.

use pingora::protocols::Stream;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

/// Idle connections kept per peer; more than this are closed when released.
const PER_PEER: usize = 512;
/// How often released connections trigger a sweep of every peer's stale ones.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

pub struct IdlePool {
    idle: Duration,
    inner: Mutex<Inner>,
}

struct Inner {
    /// By the peer's reuse hash; newest last, so the warmest is reused first.
    peers: HashMap<u64, Vec<(Instant, Stream)>>,
    swept: Instant,
}

impl IdlePool {
    pub fn new(idle: Duration) -> IdlePool {
        IdlePool {
            idle,
            inner: Mutex::new(Inner {
                peers: HashMap::new(),
                swept: Instant::now(),
            }),
        }
    }

    /// The newest idle connection to this peer that is still open, if any.
    pub fn take(&self, key: u64) -> Option<Stream> {
        let now = Instant::now();
        loop {
            let (_, mut stream) = {
                let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
                let list = inner.peers.get_mut(&key)?;
                let got = list.pop()?;
                if now.duration_since(got.0) > self.idle {
                    // Everything below is older still; closed outside the lock.
                    let stale = std::mem::take(list);
                    drop(inner);
                    drop((got, stale));
                    return None;
                }
                got
            };
            if still_open(&mut stream) {
                return Some(stream);
            }
        }
    }

    /// Parks a connection whose last answer was read whole.
    pub fn put(&self, key: u64, stream: Stream) {
        let now = Instant::now();
        let mut stale = Vec::new();
        {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            let list = inner.peers.entry(key).or_default();
            if list.len() >= PER_PEER {
                stale.push(list.remove(0).1);
            }
            list.push((now, stream));
            if now.duration_since(inner.swept) >= SWEEP_EVERY {
                inner.swept = now;
                let idle = self.idle;
                for list in inner.peers.values_mut() {
                    let fresh = list.partition_point(|(at, _)| now.duration_since(*at) > idle);
                    stale.extend(list.drain(..fresh).map(|(_, s)| s));
                }
                inner.peers.retain(|_, l| !l.is_empty());
            }
        }
        // Closed outside the lock.
        drop(stale);
    }

    #[cfg(test)]
    fn len(&self, key: u64) -> usize {
        let inner = self.inner.lock().unwrap();
        inner.peers.get(&key).map_or(0, Vec::len)
    }
}

/// A server never speaks first on an idle HTTP/1.1 connection: anything readable
/// (bytes, EOF or an error) means it was closed or is unusable. No syscall is made
/// when the reactor has not seen it become readable.
fn still_open(stream: &mut Stream) -> bool {
    use std::future::Future;
    use std::task::{Context, Waker};
    let mut buf = [0u8; 1];
    let read = std::pin::pin!(tokio::task::unconstrained(stream.read(&mut buf)));
    read.poll(&mut Context::from_waker(Waker::noop()))
        .is_pending()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    async fn pair() -> (Stream, tokio::net::TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (c, s) = tokio::join!(TcpStream::connect(addr), l.accept());
        let l4 = pingora::protocols::l4::stream::Stream::from(c.unwrap());
        (Box::new(l4), s.unwrap().0)
    }

    #[tokio::test]
    async fn reuses_the_newest_open_connection_and_drops_closed_ones() {
        let pool = IdlePool::new(Duration::from_secs(60));
        let (a, a_server) = pair().await;
        let (b, mut b_server) = pair().await;
        pool.put(1, a);
        pool.put(1, b);
        assert_eq!(pool.len(1), 2);
        // The server side of the newest one says something unprompted: unusable.
        b_server.write_all(b"x").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut got = pool.take(1).expect("the older connection is still open");
        assert!(pool.take(1).is_none());
        // It is the first connection: its server sees what we write.
        got.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        let mut a_server = a_server;
        a_server.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        // A closed connection is skipped too.
        pool.put(2, got);
        drop(a_server);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(pool.take(2).is_none());
    }

    #[tokio::test]
    async fn stale_connections_are_not_reused() {
        let pool = IdlePool::new(Duration::from_millis(20));
        let (a, _a_server) = pair().await;
        pool.put(7, a);
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(pool.take(7).is_none());
        assert_eq!(pool.len(7), 0);
    }
}
