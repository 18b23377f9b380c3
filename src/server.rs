//! Builds the Pingora `Server`: the gateway proxy service, and the web and ops
//! listeners as further services of the same process (axum under background
//! services), all over one `Arc<AppState>`.

use crate::config::Config;
use crate::proxy::Gateway;
use crate::state::AppState;
use anyhow::Context;
use async_trait::async_trait;
use pingora::server::configuration::ServerConf;
use pingora::server::{Server, ShutdownWatch};
use pingora::services::background::{background_service, BackgroundService};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An axum app on a listener we bound ourselves (so port 0 works). It keeps serving
/// through the drain (so /readyz can answer 503 while draining) and ends with the
/// process.
struct AxumService {
    name: &'static str,
    listener: Mutex<Option<TcpListener>>,
    router: axum::Router,
}

#[async_trait]
impl BackgroundService for AxumService {
    async fn start(&self, _shutdown: ShutdownWatch) {
        let Some(std_listener) = self.listener.lock().ok().and_then(|mut l| l.take()) else {
            return;
        };
        let listener = match tokio::net::TcpListener::from_std(std_listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(service = self.name, error = %e, "listener unusable");
                return;
            }
        };
        // With the peer's address: the web app counts signups per client address.
        let app = self
            .router
            .clone()
            .into_make_service_with_connect_info::<SocketAddr>();
        let served = axum::serve(listener, app).await;
        if let Err(e) = served {
            tracing::error!(service = self.name, error = %e, "service stopped");
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

fn bind(addr: &str) -> anyhow::Result<TcpListener> {
    let l = TcpListener::bind(addr).with_context(|| format!("binding {addr}"))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Runs the service until SIGTERM (graceful) or SIGINT.
pub fn serve(config: Config) -> anyhow::Result<()> {
    // The state runtime owns the database and Redis connections and the snapshot
    // refreshers; it lives as long as the process.
    let state_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("sluice-state")
        .enable_all()
        .build()?;
    let state = state_rt.block_on(AppState::build(config.clone()))?;
    state_rt.block_on(async {
        state.spawn_refreshers();
        state.spawn_readiness();
        // The idempotency jobs: this instance's liveness marker, and the sweep of
        // expired keys.
        crate::store::instances::spawn_heartbeat(
            state.counters.clone(),
            state.db.clone(),
            state.instance_id.clone(),
        );
        crate::inference::idempotency::spawn_sweep(state.db.clone());
        state.responses.spawn_jobs();
        crate::upstream::prober::spawn_periodic(config.clone(), state.db.clone());
        // Finalized telemetry uploads are verified and projected into traces.
        crate::telemetry::worker::spawn(state.clone());
    });
    // Never dropped: the connections it drives are used by every service.
    std::mem::forget(state_rt);

    let web = bind(&config.server.web_listen)?;
    let ops = bind(&config.server.ops_listen)?;
    let web_addr = web.local_addr()?;
    let ops_addr = ops.local_addr()?;
    // Pingora binds the gateway itself; for port 0 we learn a free port first.
    let gateway_addr = {
        let probe = TcpListener::bind(&config.server.listen)
            .with_context(|| format!("binding {}", config.server.listen))?;
        probe.local_addr()?
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

    let mut gateway = pingora::proxy::http_proxy_service_with_name(
        &server.configuration,
        Gateway::new(state.clone()),
        "gateway",
    );
    gateway.add_tcp(&gateway_addr.to_string());
    gateway.threads = Some(config.gateway_threads());
    server.add_service(gateway);

    let web_router = crate::web::router(state.clone(), gateway_addr)?;
    for (name, listener, router) in [
        ("web", web, web_router),
        ("ops", ops, crate::ops::router(state.clone())),
    ] {
        let mut svc = background_service(
            name,
            AxumService {
                name,
                listener: Mutex::new(Some(listener)),
                router,
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
