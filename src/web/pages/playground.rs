//! The playground: one chat call from the browser, made by the web app to the
//! gateway exactly as any client makes it (`POST /v1/chat/completions` with the
//! member's key as the Bearer token), so a newcomer sees a first answer without
//! leaving the page. The key passes through for that one call: it is never stored,
//! logged or shown back.

use super::{org, shell, with_status};
use crate::catalog::ModelKind;
use crate::web::session::{checked_form, PageMember};
use crate::web::WebShared;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json as j, Value};

async fn render(web: &WebShared, m: &PageMember, extra: Value, status: StatusCode) -> Response {
    let org = match org(web, m).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    let catalog = web.app.catalog.snapshot();
    let models: Vec<Value> = catalog
        .visible(Some(&org.id))
        .into_iter()
        .filter(|mdl| mdl.spec.kind == ModelKind::Chat)
        .map(|mdl| j!({"slug": mdl.spec.slug, "name": mdl.spec.display_name}))
        .collect();
    let mut ctx = shell(web, m, &org, "playground", "Playground", None);
    ctx["models"] = j!(models);
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            ctx[k] = v;
        }
    }
    with_status(status, web.templates.page("playground.html", &ctx))
}

pub(crate) async fn page(State(web): State<WebShared>, m: PageMember) -> Response {
    render(&web, &m, j!({}), StatusCode::OK).await
}

/// `POST /playground` (`api_key`, `model`, `message`): the gateway's answer.
pub(crate) async fn send(State(web): State<WebShared>, m: PageMember, body: Bytes) -> Response {
    let form = match checked_form(&m, &body) {
        Ok(f) => f,
        Err(r) => return r.into_response(),
    };
    let (key, model, message) = (
        form.get("api_key").trim(),
        form.get("model"),
        form.get("message"),
    );
    let asked = j!({"model": model, "message": message});
    if key.is_empty() || message.trim().is_empty() {
        let extra = j!({"asked": asked, "error": "Paste an API key and write a message."});
        return render(&web, &m, extra, StatusCode::BAD_REQUEST).await;
    }
    let url = format!("http://{}/v1/chat/completions", web.gateway);
    let call = web
        .http
        .post(url)
        .bearer_auth(key)
        .json(&j!({"model": model, "messages": [{"role": "user", "content": message}]}))
        .send()
        .await;
    let extra = match call {
        Ok(res) => {
            let status = res.status().as_u16();
            let body: Value = res.json().await.unwrap_or(Value::Null);
            if status == 200 {
                j!({"asked": asked, "answer": {
                    "content": body["choices"][0]["message"]["content"],
                    "provider": body["provider"],
                    "model": body["model"],
                    "usage": body["usage"],
                }})
            } else {
                j!({"asked": asked, "failed": {
                    "status": status,
                    "code": body["error"]["code"],
                    "message": body["error"]["message"],
                }})
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "the playground could not reach the gateway");
            j!({"asked": asked, "error": "The gateway did not answer; try again."})
        }
    };
    render(&web, &m, extra, StatusCode::OK).await
}
