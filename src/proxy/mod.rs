//! The gateway listener: our own HTTP/1 connection loop over Pingora's session
//! (`connection`), in which every request is answered by the gateway itself.
//! Inference needs the body before it can pick an upstream and must hold the
//! response header back until the first token, which Pingora's native proxy path
//! cannot do (see DESIGN.md); so the steps stay thin: route and method here,
//! inference in `crate::inference`, `/api` in-process to the management router, the
//! model list in `models`.

mod connection;
mod management;
mod model_list;
mod stored_response;

use crate::downstream::answer;
use crate::downstream::pending::Pending;
use crate::hooks::Registry;
use crate::inference::Engine;
use crate::state::AppState;
use crate::trace::Trail;
use pingora::modules::http::HttpModules;
use pingora::proxy::Session;
use sluice_filters::{ApiError, ErrorCode, Format, Route};
use std::sync::Arc;
use std::time::Instant;

pub(crate) struct Gateway {
    state: Arc<AppState>,
    management: axum::Router,
    engine: Engine,
    /// Each session's downstream modules: one of our own puts `x-request-id` on
    /// every answer, whichever step writes it.
    modules: HttpModules,
    /// The bound on inference requests admitted and not yet committed (none on
    /// the batch lines' gateway: the runner's concurrency bounds those).
    pending: Option<Pending>,
}

impl Gateway {
    /// The gateway clients reach: load shed past `[limits] max_pending`.
    pub(crate) fn new(state: Arc<AppState>, hooks: Registry) -> Gateway {
        let pending = Some(Pending::new(state.config.max_pending()));
        Gateway::with(state, hooks, pending)
    }

    /// The batch lines' gateway.
    pub(crate) fn for_batch_lines(state: Arc<AppState>, hooks: Registry) -> Gateway {
        Gateway::with(state, hooks, None)
    }

    fn with(state: Arc<AppState>, hooks: Registry, pending: Option<Pending>) -> Gateway {
        let mut modules = HttpModules::new();
        modules.add_module(Box::new(crate::trace::request_id::RequestIds));
        Gateway {
            management: crate::api::router(state.clone()),
            engine: Engine::new(state.clone(), hooks),
            modules,
            state,
            pending,
        }
    }
}

/// The key a request of the model list or the stored responses presents, or 401
/// `invalid_key`.
async fn caller(state: &AppState, session: &Session) -> Result<crate::accounts::Caller, ApiError> {
    let headers = &session.req_header().headers;
    crate::accounts::authenticate(&state.directory, &state.db, headers, false)
        .await?
        .ok_or_else(ApiError::invalid_key)
}

/// 429 `gateway_overloaded` with `Retry-After`, before anything of the request
/// is read: its connection closes (its body, if any, is never read).
async fn overloaded(
    session: &mut Session,
    format: Format,
    trail: &mut Trail,
) -> pingora::Result<u16> {
    let e = ApiError::new(
        ErrorCode::GatewayOverloaded,
        "This instance holds as many requests as it may before their first answer; retry shortly, or on another instance.",
    );
    session.set_keepalive(None);
    trail.failed(&e);
    answer::send(
        session,
        e.status,
        "application/json",
        bytes::Bytes::from(e.to_body(format)),
        &[("retry-after", "1".to_string())],
    )
    .await?;
    Ok(e.status)
}

impl Gateway {
    /// Answers one request; returns the status written.
    async fn handle(
        &self,
        session: &mut Session,
        route: Route,
        started: Instant,
        trail: &mut Trail,
    ) -> pingora::Result<u16> {
        let format = if route.is_messages() {
            Format::Anthropic
        } else {
            Format::OpenAi
        };
        if self.state.draining() {
            let e = ApiError::new(
                ErrorCode::GatewayDraining,
                "This instance is draining; retry on another.",
            );
            session.set_keepalive(None);
            trail.failed(&e);
            answer::send_error(session, &e, format).await?;
            return Ok(e.status);
        }
        let method = session.req_header().method.clone();
        let result = match route {
            // The signed telemetry upload streams its body to the object store; the
            // management dispatch below would read it whole.
            Route::Management
                if crate::telemetry::upload::is_upload(
                    &method,
                    session.req_header().uri.path(),
                ) =>
            {
                return Box::pin(crate::telemetry::upload::serve(&self.state, session)).await;
            }
            Route::Management => {
                // Boxed: the management future is large and rare on this listener;
                // inline, its size would be copied on every inference request.
                let limits = &self.state.config.limits;
                return Box::pin(management::dispatch(
                    &self.management,
                    session,
                    limits.max_request_bytes,
                    std::time::Duration::from_millis(limits.request_read_timeout_ms),
                ))
                .await;
            }
            // Files and batches: their own room (uploads stream to the object store).
            Route::Files | Route::Batches => {
                return Box::pin(crate::batches::serve(&self.state, session, route)).await;
            }
            Route::Models | Route::Model if method != http::Method::GET => {
                Err(ApiError::method_not_allowed(&method, "GET"))
            }
            Route::StoredResponse if method != http::Method::DELETE => {
                Err(ApiError::method_not_allowed(&method, "DELETE"))
            }
            Route::StoredResponse => Box::pin(stored_response::delete(&self.state, session)).await,
            Route::Models => Box::pin(model_list::list(&self.state, session)).await,
            Route::Model => Box::pin(model_list::one(&self.state, session)).await,
            r if r.is_inference() && method != http::Method::POST => {
                Err(ApiError::method_not_allowed(&method, "POST"))
            }
            r if r.is_inference() => {
                let place = match &self.pending {
                    None => None,
                    Some(p) => match p.admit() {
                        Some(place) => Some(place),
                        None => return overloaded(session, format, trail).await,
                    },
                };
                self.engine.handle(session, r, started, trail, place).await
            }
            Route::MessagesCountTokens => Err(ApiError::new(
                ErrorCode::NotFound,
                "count_tokens is not served by this gateway.",
            )),
            _ => Err(ApiError::not_found(session.req_header().uri.path())),
        };
        match result {
            Ok(status) => Ok(status),
            Err(e) => {
                trail.failed(&e);
                answer::send_error(session, &e, format).await?;
                Ok(e.status)
            }
        }
    }
}
