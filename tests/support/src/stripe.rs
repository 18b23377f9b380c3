//! A fake Stripe for tests: the Checkout Sessions API as Stripe speaks it
//! (`POST /v1/checkout/sessions`, form-encoded, `Authorization: Bearer` the secret
//! key, Stripe's error shape), a checkout page a browser can pay on, and webhook
//! events (`checkout.session.completed`, `charge.refunded`,
//! `charge.dispute.created`) signed the real way: `Stripe-Signature:
//! t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" under the webhook secret>`.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub const SECRET_KEY: &str = "sk_test_sluice_fake_51Hxyz";
pub const WEBHOOK_SECRET: &str = "whsec_sluice_fake_signing_secret";

/// A checkout session as the fake keeps it.
#[derive(Clone, Debug)]
pub struct Session {
    pub id: String,
    /// The form fields it was created with, in order.
    pub form: Vec<(String, String)>,
    pub amount_total: i64,
    pub paid: bool,
    pub payment_intent: String,
}

impl Session {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.form
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One API request the fake received.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    pub authorization: Option<String>,
    pub content_type: Option<String>,
    pub idempotency_key: Option<String>,
    pub body: String,
}

#[derive(Default)]
struct Inner {
    sessions: Mutex<BTreeMap<String, Session>>,
    received: Mutex<Vec<Received>>,
    webhook_url: Mutex<Option<String>>,
    base: Mutex<String>,
    next: AtomicU64,
}

pub struct FakeStripe {
    inner: Arc<Inner>,
    port: u16,
    task: tokio::task::AbortHandle,
}

impl Drop for FakeStripe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Stripe's error body.
fn stripe_error(status: StatusCode, kind: &str, message: &str, param: Option<&str>) -> Response {
    let mut err = json!({"type": kind, "message": message});
    if let Some(p) = param {
        err["param"] = json!(p);
        err["code"] = json!("parameter_missing");
    }
    (status, Json(json!({ "error": err }))).into_response()
}

impl FakeStripe {
    pub async fn start() -> FakeStripe {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake stripe");
        let port = listener.local_addr().unwrap().port();
        let inner = Arc::new(Inner::default());
        *inner.base.lock().unwrap() = format!("http://127.0.0.1:{port}");
        let app = Router::new()
            .route("/v1/checkout/sessions", post(create_session))
            .route("/c/pay/{id}", get(pay_page).post(pay))
            .with_state(inner.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        })
        .abort_handle();
        FakeStripe { inner, port, task }
    }

    /// `[payments] api_base`.
    pub fn api_base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Where the checkout page delivers its webhook events.
    pub fn set_webhook(&self, url: &str) {
        *self.inner.webhook_url.lock().unwrap() = Some(url.to_string());
    }

    pub fn sessions(&self) -> Vec<Session> {
        self.inner
            .sessions
            .lock()
            .unwrap()
            .values()
            .cloned()
            .collect()
    }

    pub fn session(&self, id: &str) -> Option<Session> {
        self.inner.sessions.lock().unwrap().get(id).cloned()
    }

    pub fn received(&self) -> Vec<Received> {
        self.inner.received.lock().unwrap().clone()
    }

    fn id(&self, prefix: &str) -> String {
        next_id(&self.inner, prefix)
    }

    /// `checkout.session.completed` of a session, paid.
    pub fn completed_event(&self, session_id: &str) -> Value {
        let s = self.mark_paid(session_id);
        completed(&self.inner, &s)
    }

    fn mark_paid(&self, session_id: &str) -> Session {
        let mut sessions = self.inner.sessions.lock().unwrap();
        let s = sessions
            .get_mut(session_id)
            .expect("a session the fake made");
        s.paid = true;
        s.clone()
    }

    /// `charge.refunded` of a payment: `refunded_cents` is the charge's refunded
    /// total so far, as Stripe reports it.
    pub fn refund_event(
        &self,
        payment_intent: &str,
        amount_cents: i64,
        refunded_cents: i64,
    ) -> Value {
        let charge = json!({
            "id": self.id("ch"), "object": "charge", "amount": amount_cents,
            "amount_captured": amount_cents, "amount_refunded": refunded_cents,
            "currency": "usd", "paid": true, "payment_intent": payment_intent,
            "refunded": refunded_cents >= amount_cents, "status": "succeeded",
        });
        event(&self.inner, "charge.refunded", charge)
    }

    /// `charge.dispute.created` of a payment.
    pub fn dispute_event(&self, payment_intent: &str, disputed_cents: i64) -> Value {
        let dispute = json!({
            "id": self.id("dp"), "object": "dispute", "amount": disputed_cents,
            "charge": self.id("ch"), "currency": "usd", "payment_intent": payment_intent,
            "reason": "fraudulent", "status": "needs_response",
        });
        event(&self.inner, "charge.dispute.created", dispute)
    }

    /// An event of another type (ignored by a receiver that does not use it).
    pub fn other_event(&self, kind: &str) -> Value {
        event(
            &self.inner,
            kind,
            json!({"id": self.id("obj"), "object": "unknown"}),
        )
    }

    /// The `Stripe-Signature` of a body at time `t`.
    pub fn signature(body: &str, t: i64, secret: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(format!("{t}.{body}").as_bytes());
        format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
    }

    /// The body and the `Stripe-Signature` header of an event, signed now.
    pub fn signed(event: &Value) -> (String, String) {
        let body = event.to_string();
        let sig = Self::signature(&body, now(), WEBHOOK_SECRET);
        (body, sig)
    }
}

fn next_id(inner: &Inner, prefix: &str) -> String {
    let n = inner.next.fetch_add(1, Ordering::Relaxed);
    format!(
        "{prefix}_test_{:08}{:016x}",
        n,
        n.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    )
}

fn event(inner: &Inner, kind: &str, object: Value) -> Value {
    json!({
        "id": next_id(inner, "evt"), "object": "event", "api_version": "2024-06-20",
        "created": now(), "livemode": false, "pending_webhooks": 1,
        "request": {"id": null, "idempotency_key": null},
        "type": kind, "data": {"object": object},
    })
}

fn completed(inner: &Inner, s: &Session) -> Value {
    let metadata: BTreeMap<String, String> = s
        .form
        .iter()
        .filter_map(|(k, v)| {
            let key = k.strip_prefix("metadata[")?.strip_suffix(']')?;
            Some((key.to_string(), v.clone()))
        })
        .collect();
    let object = json!({
        "id": s.id, "object": "checkout.session", "mode": "payment",
        "amount_subtotal": s.amount_total, "amount_total": s.amount_total, "currency": "usd",
        "client_reference_id": s.field("client_reference_id"),
        "customer": if s.field("customer_creation") == Some("always") { json!(next_id(inner, "cus")) } else { Value::Null },
        "metadata": metadata, "payment_intent": s.payment_intent,
        "payment_status": "paid", "status": "complete",
        "success_url": s.field("success_url"), "cancel_url": s.field("cancel_url"), "url": null,
    });
    event(inner, "checkout.session.completed", object)
}

async fn create_session(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let h = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let text = String::from_utf8_lossy(&body).into_owned();
    inner.received.lock().unwrap().push(Received {
        path: "/v1/checkout/sessions".into(),
        authorization: h("authorization"),
        content_type: h("content-type"),
        idempotency_key: h("idempotency-key"),
        body: text.clone(),
    });
    if h("authorization").as_deref() != Some(&format!("Bearer {SECRET_KEY}")) {
        return stripe_error(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "Invalid API Key provided.",
            None,
        );
    }
    if !h("content-type").is_some_and(|c| c.starts_with("application/x-www-form-urlencoded")) {
        return stripe_error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "Invalid request: the body must be form-encoded.",
            None,
        );
    }
    let form: Vec<(String, String)> = form_urlencoded::parse(text.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let get = |n: &str| form.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    for required in [
        "mode",
        "success_url",
        "line_items[0][price_data][currency]",
        "line_items[0][price_data][unit_amount]",
        "line_items[0][price_data][product_data][name]",
        "line_items[0][quantity]",
    ] {
        if get(required).is_none() {
            return stripe_error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &format!("Missing required param: {required}."),
                Some(required),
            );
        }
    }
    if get("mode").as_deref() != Some("payment") {
        return stripe_error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "Invalid mode: this fake takes payment.",
            Some("mode"),
        );
    }
    let unit: i64 = get("line_items[0][price_data][unit_amount]")
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1);
    let qty: i64 = get("line_items[0][quantity]")
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1);
    if unit < 50 || qty < 1 {
        return stripe_error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "Amount must be at least 50 cents and quantity at least 1.",
            Some("line_items[0][price_data][unit_amount]"),
        );
    }
    let id = next_id(&inner, "cs");
    let base = inner.base.lock().unwrap().clone();
    let s = Session {
        id: id.clone(),
        amount_total: unit * qty,
        paid: false,
        payment_intent: next_id(&inner, "pi"),
        form: form.clone(),
    };
    inner.sessions.lock().unwrap().insert(id.clone(), s.clone());
    let metadata: BTreeMap<String, String> = form
        .iter()
        .filter_map(|(k, v)| {
            Some((
                k.strip_prefix("metadata[")?.strip_suffix(']')?.to_string(),
                v.clone(),
            ))
        })
        .collect();
    Json(json!({
        "id": id, "object": "checkout.session", "mode": "payment", "livemode": false,
        "amount_subtotal": s.amount_total, "amount_total": s.amount_total, "currency": "usd",
        "client_reference_id": get("client_reference_id"), "metadata": metadata,
        "payment_intent": null, "payment_status": "unpaid", "status": "open",
        "success_url": get("success_url"), "cancel_url": get("cancel_url"),
        "url": format!("{base}/c/pay/{id}"),
        "expires_at": now() + 86_400,
    }))
    .into_response()
}

async fn pay_page(State(inner): State<Arc<Inner>>, Path(id): Path<String>) -> Response {
    let Some(s) = inner.sessions.lock().unwrap().get(&id).cloned() else {
        return (StatusCode::NOT_FOUND, "no such checkout").into_response();
    };
    Html(format!(
        "<!doctype html><title>Fake checkout</title><h1>Pay ${:.2}</h1>\
         <form method=post><button id=pay type=submit>Pay</button></form>",
        s.amount_total as f64 / 100.0
    ))
    .into_response()
}

/// The browser pays: the fake sends `checkout.session.completed` to the webhook
/// and returns the browser to the success URL.
async fn pay(State(inner): State<Arc<Inner>>, Path(id): Path<String>) -> Response {
    let s = {
        let mut sessions = inner.sessions.lock().unwrap();
        let Some(s) = sessions.get_mut(&id) else {
            return (StatusCode::NOT_FOUND, "no such checkout").into_response();
        };
        s.paid = true;
        s.clone()
    };
    let ev = completed(&inner, &s);
    let hook = inner.webhook_url.lock().unwrap().clone();
    if let Some(url) = hook {
        let (body, sig) = FakeStripe::signed(&ev);
        let _ = post_webhook(&url, &body, &sig).await;
    }
    let back = s
        .field("success_url")
        .unwrap_or("/")
        .replace("{CHECKOUT_SESSION_ID}", &s.id);
    Redirect::to(&back).into_response()
}

/// POSTs a webhook body with its signature (HTTP/1.1, one connection); returns
/// the status and the body of the answer.
pub async fn post_webhook(
    url: &str,
    body: &str,
    signature: &str,
) -> std::io::Result<(u16, String)> {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let mut stream = TcpStream::connect(host).await?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: Stripe/1.0 (+https://stripe.com/docs/webhooks)\r\n\
         Content-Type: application/json; charset=utf-8\r\nStripe-Signature: {signature}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await?;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((status, body))
}
