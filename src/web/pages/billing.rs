//! The billing page: the balance and tier, the card verification (1 USD, credited
//! back), buying credits through the payment provider's checkout, the payments
//! and the credit ledger.

use super::{org, shell, status_of, with_status};
use crate::accounts::orgs;
use crate::api::respond::Failure;
use crate::billing::payments;
use crate::web::api::start_checkout;
use crate::web::session::{checked_form, PageMember};
use crate::web::WebShared;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::json as j;
use std::collections::HashMap;

async fn render(
    web: &WebShared,
    m: &PageMember,
    notice: Option<&str>,
    error: Option<String>,
    status: StatusCode,
) -> Response {
    let org = match org(web, m).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    let db = &web.app.db;
    let (paid, ledger) = match (
        payments::list_for_org(db, &org.id).await,
        orgs::ledger(db, &org.id, 25).await,
    ) {
        (Ok(p), Ok(l)) => (p, l),
        (Err(e), _) | (_, Err(e)) => return Failure(e).into_response(),
    };
    let billing = &web.app.config.billing;
    let tier = billing.tier(org.tier);
    let mut ctx = shell(web, m, &org, "billing", "Billing", notice);
    ctx["payments_list"] = j!(paid);
    ctx["ledger"] = j!(ledger);
    ctx["purchased_usd"] = j!(crate::money::micro_to_usd(org.purchased_micro_usd));
    ctx["card_on_file"] = j!(org.card_on_file);
    ctx["settled"] = j!(org.settled);
    ctx["credits_overflow"] = j!(org.credits_overflow);
    ctx["tier_limits"] = j!(tier);
    ctx["tier_up_usd"] = j!(billing.tier_up_purchase_usd);
    ctx["min_purchase"] = j!(payments::MIN_PURCHASE_USD);
    ctx["max_purchase"] = j!(payments::MAX_PURCHASE_USD);
    ctx["error"] = j!(error);
    with_status(status, web.templates.page("billing.html", &ctx))
}

pub(crate) async fn page(
    State(web): State<WebShared>,
    m: PageMember,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let notice = match q.get("checkout").map(String::as_str) {
        Some("success") => Some("checkout_success"),
        Some("cancelled") => Some("checkout_cancelled"),
        _ => q.get("notice").map(String::as_str),
    };
    render(&web, &m, notice, None, StatusCode::OK).await
}

/// `POST /billing/checkout` (`kind`, and `amount_usd` for a purchase): off to the
/// payment provider's checkout page.
pub(crate) async fn checkout(State(web): State<WebShared>, m: PageMember, body: Bytes) -> Response {
    let form = match checked_form(&m, &body) {
        Ok(f) => f,
        Err(r) => return r.into_response(),
    };
    let amount = match form.get("amount_usd").trim() {
        "" => None,
        a => match a.parse::<f64>() {
            Ok(v) => Some(v),
            Err(_) => Some(f64::NAN),
        },
    };
    let s = &m.session;
    match start_checkout(&web, &s.org_id, &s.user_id, form.get("kind"), amount).await {
        Ok(created) => Redirect::to(&created.checkout_url).into_response(),
        Err(f) => {
            let status = status_of(&f);
            render(&web, &m, None, Some(f.0.message.to_string()), status).await
        }
    }
}
