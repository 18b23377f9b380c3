//! A TCP proxy that plays the network faults of a shared store: put in front of
//! PostgreSQL or Redis, it can cut every connection and refuse new ones (the
//! server stopped or killed), heal, and add a delay to every answer (a store one
//! network hop away).
//!
//! ```no_run
//! # async fn demo() {
//! use sluice_mock::fault_proxy::FaultProxy;
//! let redis = FaultProxy::start("127.0.0.1:6379").await;
//! let url = format!("redis://{}/", redis.addr()); // give this to the service
//! redis.cut(); // every connection reset, new ones refused
//! redis.heal();
//! redis.set_delay(std::time::Duration::from_millis(1));
//! # }
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

struct Shared {
    target: String,
    up: AtomicBool,
    /// Added before each chunk the server sends back, in microseconds.
    delay_us: AtomicU64,
    /// Bumped by every cut: pumps of an older generation close.
    generation: watch::Sender<u64>,
}

pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::AbortHandle,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `target` (`host:port`).
    pub async fn start(target: &str) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new(Shared {
            target: target.to_string(),
            up: AtomicBool::new(true),
            delay_us: AtomicU64::new(0),
            generation: watch::channel(0).0,
        });
        let s = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                if !s.up.load(Ordering::SeqCst) {
                    // Refused: closed at once.
                    drop(client);
                    continue;
                }
                tokio::spawn(relay(client, s.clone()));
            }
        })
        .abort_handle();
        FaultProxy { addr, shared, task }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every open connection is reset and new ones are refused until `heal`.
    pub fn cut(&self) {
        self.shared.up.store(false, Ordering::SeqCst);
        self.shared.generation.send_modify(|g| *g += 1);
    }

    pub fn heal(&self) {
        self.shared.up.store(true, Ordering::SeqCst);
    }

    pub fn set_delay(&self, d: Duration) {
        self.shared
            .delay_us
            .store(d.as_micros() as u64, Ordering::SeqCst);
    }
}

async fn relay(client: TcpStream, s: Arc<Shared>) {
    let mut gen = s.generation.subscribe();
    let born = *gen.borrow_and_update();
    let Ok(server) = TcpStream::connect(&s.target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if sw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let d = s.delay_us.load(Ordering::Relaxed);
            if d > 0 {
                tokio::time::sleep(Duration::from_micros(d)).await;
            }
            if cw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let cut = async {
        while gen.changed().await.is_ok() {
            if *gen.borrow() != born {
                return;
            }
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = cut => {}
    }
}
