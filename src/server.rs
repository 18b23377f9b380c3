//! Builds the Pingora `Server`: the gateway (our accept loop and HTTP/1 loop, or
//! Pingora's rustls listener under TLS), and the web and ops listeners as further
//! services of the same process (axum under background services), all over one
//! `Arc<AppState>`. With `[server] tls_cert`/`tls_key` the gateway and the web
//! listener speak TLS. SIGHUP reloads the catalog file; requests in flight keep
//! the snapshot they started with.

use crate::config::Config;
use crate::downstream::cap::{descriptor_limit, ConnectionCap, Held};
use crate::downstream::http1;
use crate::proxy::Gateway;
use crate::state::AppState;
use anyhow::Context;
use async_trait::async_trait;
use pingora::server::configuration::ServerConf;
use pingora::server::{Server, ShutdownWatch};
use pingora::services::background::{background_service, BackgroundService};
use pingora::tls::{ServerTlsStream, TlsAcceptor};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An axum app on a listener we bound ourselves (so port 0 works), served by our
/// HTTP/1 loop with its header and body timeouts and connection cap
/// (`downstream::http1`). It keeps serving through the drain (so /readyz can
/// answer 503 while draining) and ends with the process.
struct AxumService {
    name: &'static str,
    listener: Mutex<Option<TcpListener>>,
    router: axum::Router,
    tls: Option<TlsAcceptor>,
    limits: http1::Limits,
    cap: ConnectionCap,
}

#[async_trait]
impl BackgroundService for AxumService {
    async fn start(&self, _shutdown: ShutdownWatch) {
        let taken = self.listener.lock().ok().and_then(|mut l| l.take());
        let Some(listener) =
            taken.and_then(|l| crate::downstream::listener::to_tokio(self.name, l))
        else {
            return;
        };
        let router = self.router.clone();
        match &self.tls {
            None => {
                http1::serve_plain(self.name, listener, router, self.limits, self.cap.clone()).await
            }
            Some(acceptor) => {
                let mut tls = TlsListener::start(listener, acceptor.clone(), self.cap.clone());
                while let Some((stream, peer, held)) = tls.ready.recv().await {
                    tokio::spawn(http1::serve_connection(
                        stream,
                        peer,
                        router.clone(),
                        self.limits,
                        held,
                    ));
                }
            }
        }
    }
}

/// A TLS connection that finished its handshake, with its place under the cap.
type Shaken = (ServerTlsStream<tokio::net::TcpStream>, SocketAddr, Held);

/// TLS connections for an axum app. Handshakes run in tasks of their own, so a
/// slow or silent client holds up no one; finished ones queue for the server.
/// A connection holds its place under the cap from accept, handshake included.
struct TlsListener {
    ready: tokio::sync::mpsc::Receiver<Shaken>,
}

impl TlsListener {
    fn start(
        tcp: tokio::net::TcpListener,
        acceptor: TlsAcceptor,
        cap: ConnectionCap,
    ) -> TlsListener {
        let (tx, ready) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (stream, addr) = match tcp.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of descriptors, say: wait rather than spin.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Some(held) = cap.take() else {
                    drop(stream);
                    continue;
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let shake =
                        tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream));
                    if let Ok(Ok(tls)) = shake.await {
                        let _ = tx.send((tls, addr, held)).await;
                    }
                });
            }
        });
        TlsListener { ready }
    }
}

/// The TLS acceptor of the web listener, from the configured PEM files.
fn tls_acceptor(cert: &str, key: &str) -> anyhow::Result<TlsAcceptor> {
    let (certs, key) = pingora::tls::load_certs_and_key_files(cert, key)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .with_context(|| format!("no certificate in {cert} or no private key in {key}"))?;
    let mut tls = pingora::tls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("server.tls_cert and server.tls_key do not make a certificate")?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(tls)))
}

/// Reads the catalog file again and serves it: rows are upserted (other
/// instances follow within a second) and this instance's snapshot swapped at
/// once. A file that does not load leaves the served catalog as it was.
async fn reload_catalog(state: &AppState) {
    let path = &state.config.catalog.path;
    let result = async {
        if let Some(specs) = crate::catalog::load_configured(path)? {
            crate::catalog::upsert_public(&state.db, &specs).await?;
        }
        state.catalog.reload(&state.db).await
    }
    .await;
    let m = &state.metrics;
    match result {
        Ok(()) => {
            m.catalog_reloads.with_label_values(&["ok"]).inc();
            tracing::info!("catalog reloaded");
        }
        Err(e) => {
            m.catalog_reloads.with_label_values(&["failed"]).inc();
            tracing::error!(error = %format!("{e:#}"), "catalog reload failed; serving the previous catalog");
        }
    }
}

/// Marks the state draining the moment SIGTERM starts the graceful shutdown, and
/// reports the listeners once the gateway accepts connections.
struct Lifecycle {
    state: Arc<AppState>,
    announce: Vec<(&'static str, SocketAddr)>,
}

#[async_trait]
impl BackgroundService for Lifecycle {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let gateway = self.announce[0].1;
        loop {
            if tokio::net::TcpStream::connect(gateway).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for (name, addr) in &self.announce {
            println!("listening {name} {addr}");
        }
        self.state.set_gateway_up();
        let _ = shutdown.changed().await;
        tracing::info!("draining: new requests get 503 gateway_draining");
        self.state.start_draining();
        // What this instance holds of the shared counters goes back.
        if let Some(l) = &self.state.leases {
            l.return_idle(true).await;
        }
    }
}

/// A listening service whose socket was bound before Pingora started: it goes
/// into Pingora's table of inherited listeners under the address Pingora looks
/// up, so Pingora listens on it instead of binding again. Learning a free port
/// from a probe socket and letting Pingora bind it later left a window in which
/// another process could take the port (a test's sluice once answered another's
/// requests with its web app's 404).
struct PreBound<S> {
    inner: S,
    listener: Option<TcpListener>,
    /// The address as Pingora's listener writes it (`ServerAddress`'s text).
    key: String,
}

#[async_trait]
impl<S: pingora::services::Service> pingora::services::Service for PreBound<S> {
    async fn start_service(
        &mut self,
        fds: Option<pingora::server::ListenFds>,
        shutdown: ShutdownWatch,
        listeners_per_fd: usize,
    ) {
        use std::os::fd::IntoRawFd as _;
        if let (Some(table), Some(listener)) = (&fds, self.listener.take()) {
            table
                .lock()
                .add(std::mem::take(&mut self.key), listener.into_raw_fd());
        }
        self.inner
            .start_service(fds, shutdown, listeners_per_fd)
            .await
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn threads(&self) -> Option<usize> {
        self.inner.threads()
    }
}

/// The batch runner and the gateway that serves its lines, on one thread at a
/// lower priority than live requests: each line's connection is an in-memory
/// pipe whose far end this gateway serves as it serves a client's (no listener,
/// no socket), so a line's request and answer stay within one event loop.
struct BatchLines {
    gateway: Arc<Gateway>,
    state: Arc<AppState>,
}

#[async_trait]
impl pingora::services::Service for BatchLines {
    async fn start_service(
        &mut self,
        _fds: Option<pingora::server::ListenFds>,
        mut shutdown: ShutdownWatch,
        _listeners_per_fd: usize,
    ) {
        use pingora::apps::ServerApp as _;
        crate::priority::background(crate::state::BATCH_LINES_NICE);
        let (gateway, closing) = (self.gateway.clone(), shutdown.clone());
        let lines: crate::batches::Lines = Arc::new(move |end| {
            let (gateway, closing) = (gateway.clone(), closing.clone());
            tokio::spawn(async move { gateway.process_new(Box::new(end), &closing).await });
        });
        tokio::spawn(crate::batches::runner::run(self.state.clone(), lines));
        let _ = shutdown.changed().await;
    }

    fn name(&self) -> &str {
        "batch-lines"
    }

    fn threads(&self) -> Option<usize> {
        Some(1)
    }
}

/// A listener whose connections read straight into the HTTP session's own
/// buffers. Pingora's default puts a 64 KiB read buffer in front of every
/// downstream connection (heaptrack: 65.5 MB allocated for 1,000 open streams,
/// mostly never touched: RSS fell only by the page each request wrote). The
/// session reads headers and bodies into buffers of its own, so the extra
/// buffer only added a copy.
fn unbuffered_reads(addr: &str) -> pingora::listeners::ListenerConfig {
    use pingora::listeners::{L4BufferSettings, ListenerConfig};
    ListenerConfig::tcp(addr).l4_buffer(L4BufferSettings::default().read(0))
}

fn bind(addr: &str) -> anyhow::Result<TcpListener> {
    let l = TcpListener::bind(addr).with_context(|| format!("binding {addr}"))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// The per-request features, in the order each request meets them: the
/// responses store rebuilds a conversation before the Idempotency-Key is claimed
/// over the body served, and both see the answer's bytes as they go out.
fn request_features(state: &Arc<AppState>) -> crate::hooks::Registry {
    use crate::hooks::HookFor;
    let capture = state.config.responses.prompt_capture_default;
    let features: Vec<Arc<dyn HookFor>> = vec![
        Arc::new(crate::responses::hook::Store::new(
            state.responses.clone(),
            capture,
        )),
        Arc::new(crate::idempotency::Claims::new(state.clone())),
        Arc::new(crate::search::hook::Searching::new(
            crate::search::Searcher::new(&state.config),
        )),
    ];
    crate::hooks::Registry::new(features)
}

/// The gateway listener's connection cap: `[server] max_connections`, or what the
/// open-file limit leaves once the web and ops caps and 512 descriptors for the
/// process's own connections (stores, providers, files) are set aside.
fn gateway_max_connections(s: &crate::config::ServerConfig) -> usize {
    if s.max_connections > 0 {
        return s.max_connections;
    }
    let reserve = s.web_max_connections + s.ops_max_connections + 512;
    descriptor_limit().saturating_sub(reserve).max(64)
}

/// Runs the service until SIGTERM (graceful) or SIGINT.
pub fn serve(config: Config) -> anyhow::Result<()> {
    // The state runtime owns the database and Redis connections and the snapshot
    // refreshers; it lives as long as the process.
    crate::deadline::start_clock();
    let state_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("sluice-state")
        .on_thread_start(|| crate::priority::background(0))
        .enable_all()
        .build()?;
    let state = state_rt.block_on(AppState::build(config.clone()))?;
    state_rt.block_on(async {
        // A shared counters store without its epoch marker (first start, or it
        // lost its data) refuses money windows until they are restored: done
        // before the gateway listens.
        if state.leases.is_some() {
            state.restore_if_counters_lost().await;
        }
        state.spawn_refreshers();
        state.spawn_readiness();
        // The idempotency jobs: this instance's liveness marker, and the sweep of
        // expired keys.
        crate::store::instances::spawn_heartbeat(
            state.counters.clone(),
            state.db.clone(),
            state.instance_id.clone(),
        );
        crate::idempotency::spawn_sweep(state.db.clone());
        crate::accounts::sessions::spawn_sweep(state.db.clone());
        state.responses.spawn_jobs();
        crate::upstream::prober::spawn_periodic(config.clone(), state.db.clone());
        // Finalized telemetry uploads are verified and projected into traces.
        crate::telemetry::worker::spawn(state.clone());
        state.tracer.spawn_export();
        // SIGHUP reloads the catalog (its default would end the process).
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("listening for SIGHUP")?;
        let reloading = state.clone();
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                reload_catalog(&reloading).await;
            }
        });
        anyhow::Ok(())
    })?;
    // Never dropped: the connections it drives are used by every service.
    std::mem::forget(state_rt);

    let web = bind(&config.server.web_listen)?;
    let ops = bind(&config.server.ops_listen)?;
    let web_addr = web.local_addr()?;
    let ops_addr = ops.local_addr()?;
    // Bound here (port 0 learns its port from the bind itself) and handed to
    // Pingora as a listener it inherited (`PreBound`).
    let gateway_listener = bind(&config.server.listen)?;
    let gateway_addr = gateway_listener.local_addr()?;

    let tls = &config.server;
    let web_tls = if tls.tls_cert.is_empty() {
        None
    } else {
        pingora::tls::install_default_crypto_provider();
        Some(tls_acceptor(&tls.tls_cert, &tls.tls_key)?)
    };

    let conf = ServerConf {
        threads: config.gateway_threads(),
        grace_period_seconds: Some(config.server.grace_period_seconds),
        graceful_shutdown_timeout_seconds: Some(1),
        // One single-threaded runtime per worker thread (as nginx runs one event
        // loop per worker): a connection stays on the thread that accepted it, and
        // no wake pays for a work-stealing scheduler's shared queues.
        work_stealing: false,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let hooks = request_features(&state);

    if tls.tls_cert.is_empty() {
        server.add_service(crate::downstream::listener::PlainListener {
            name: "gateway",
            app: Arc::new(Gateway::new(state.clone(), hooks.clone())),
            listener: Some(gateway_listener),
            threads: config.gateway_threads(),
            cap: ConnectionCap::new("gateway", gateway_max_connections(&config.server)),
        });
    } else {
        // TLS through Pingora's listener (its handshake, its rustls acceptor).
        let settings =
            pingora::listeners::tls::TlsSettings::intermediate(&tls.tls_cert, &tls.tls_key)
                .map_err(|e| anyhow::anyhow!("the gateway's TLS listener: {e}"))?;
        let mut service = pingora::services::listening::Service::new(
            "gateway".into(),
            Gateway::new(state.clone(), hooks.clone()),
        );
        service.add_listener(unbuffered_reads(&gateway_addr.to_string()).tls(settings));
        service.threads = Some(config.gateway_threads());
        server.add_service(PreBound {
            key: gateway_addr.to_string(),
            listener: Some(gateway_listener),
            inner: service,
        });
    }

    // Batch lines reach a gateway of their own on one thread at a lower
    // priority, so a batch takes what the live requests leave of the core.
    if config.batches.concurrency > 0 {
        server.add_service(BatchLines {
            gateway: Arc::new(Gateway::for_batch_lines(state.clone(), hooks.clone())),
            state: state.clone(),
        });
    }
    let web_router = crate::web::router(state.clone(), gateway_addr)?;
    let limits = http1::Limits {
        header_timeout: Duration::from_millis(config.server.header_timeout_ms),
        body_timeout: Duration::from_millis(config.limits.request_read_timeout_ms),
    };
    for (name, listener, router, tls, cap) in [
        (
            "web",
            web,
            web_router,
            web_tls,
            config.server.web_max_connections,
        ),
        (
            "ops",
            ops,
            crate::ops::router(state.clone()),
            None,
            config.server.ops_max_connections,
        ),
    ] {
        let mut svc = background_service(
            name,
            AxumService {
                name,
                listener: Mutex::new(Some(listener)),
                router,
                tls,
                limits,
                cap: ConnectionCap::new(name, cap),
            },
        );
        svc.threads = Some(1);
        server.add_service(svc);
    }
    let mut life = background_service(
        "lifecycle",
        Lifecycle {
            state,
            announce: vec![
                ("gateway", gateway_addr),
                ("web", web_addr),
                ("ops", ops_addr),
            ],
        },
    );
    life.threads = Some(1);
    server.add_service(life);
    server.run_forever()
}
