//! `POST {web_url}/webhooks/stripe`: the payment provider's events. Only a body
//! whose `Stripe-Signature` checks out changes anything (otherwise 400); each
//! event is applied once, and a retried one answers 200 again.

use super::WebShared;
use crate::api::respond::{json, Failure};
use crate::billing::payments::{Applied, WebhookError};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json as j;
use sluice_filters::{ApiError, ErrorCode};

pub(crate) async fn stripe(
    State(web): State<WebShared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(stripe) = &web.payments else {
        return Failure(ApiError::not_found("/webhooks/stripe")).into_response();
    };
    let app = &web.app;
    let signature = headers
        .get("stripe-signature")
        .and_then(|v| v.to_str().ok());
    let tier_up =
        crate::money::usd_to_micro(app.config.billing.tier_up_purchase_usd).unwrap_or(i64::MAX);
    let done = stripe
        .webhook(
            &app.db,
            app.counters.as_ref(),
            &app.directory,
            signature,
            &body,
            tier_up,
        )
        .await;
    let refused = |why: &str| {
        Failure(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("webhook refused: {why}"),
        ))
        .into_response()
    };
    match done {
        Ok(applied) => {
            let result = match applied {
                Applied::Changed { .. } => "applied",
                Applied::Duplicate => "duplicate",
                Applied::Ignored => "ignored",
            };
            json(StatusCode::OK, &j!({"received": true, "result": result}))
        }
        Err(WebhookError::BadSignature(why)) => {
            tracing::warn!(reason = why, "a webhook with a bad signature was refused");
            refused(why)
        }
        Err(WebhookError::BadEvent(why)) => refused(why),
        // Stripe retries a 5xx: the event was not applied.
        Err(WebhookError::Store(e)) => Failure(e).into_response(),
    }
}
