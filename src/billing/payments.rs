//! The payment provider adapter: Stripe. A checkout (the 1 USD card verification,
//! or a credit purchase) is a Checkout Session created through Stripe's
//! form-encoded API; the member pays on Stripe's page. Credits move only on
//! webhook events whose `Stripe-Signature` checks out (HMAC-SHA256 of
//! `"<t>.<raw body>"` under the webhook secret, within 300 seconds), each event
//! id applied once: a paid checkout credits the purchase (or records the
//! verification and credits its 1 USD back); a refund or a dispute takes back what
//! it names of the payment, from the ledger and the live balance alike.

use crate::accounts::{orgs, Directory};
use crate::config::PaymentsConfig;
use crate::error::Error;
use crate::store::db::opt_i64;
use crate::store::{now_ms, Counters, Db};
use anyhow::Context as _;
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;
use sluice_filters::{ApiError, ErrorCode};
use sqlx::Row;
use std::time::Duration;

/// How old a signed webhook may be.
pub const SIGNATURE_TOLERANCE_SECS: i64 = 300;

/// Micro-USD per cent.
const MICRO_PER_CENT: i64 = 10_000;

/// The smallest and largest purchase a checkout takes, in USD.
pub const MIN_PURCHASE_USD: f64 = 1.0;
pub const MAX_PURCHASE_USD: f64 = 10_000.0;

/// What a checkout pays for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checkout {
    /// The 1 USD card verification, credited back once it settles.
    Verification,
    /// Credits, in cents.
    Purchase { cents: i64 },
}

impl Checkout {
    pub fn kind(self) -> &'static str {
        match self {
            Checkout::Verification => "verification",
            Checkout::Purchase { .. } => "purchase",
        }
    }

    fn cents(self) -> i64 {
        match self {
            Checkout::Verification => orgs::VERIFICATION_MICRO_USD / MICRO_PER_CENT,
            Checkout::Purchase { cents } => cents,
        }
    }

    /// A purchase of `amount_usd` (whole cents, within the bounds), or 400
    /// `invalid_parameter` naming `amount_usd`.
    pub fn purchase(amount_usd: f64) -> Result<Checkout, ApiError> {
        let cents = (amount_usd * 100.0).round();
        let whole_cents = (amount_usd * 100.0 - cents).abs() < 1e-6;
        if !amount_usd.is_finite()
            || !(MIN_PURCHASE_USD..=MAX_PURCHASE_USD).contains(&amount_usd)
            || !whole_cents
        {
            return Err(ApiError::invalid_parameter(
                "amount_usd",
                format!("amount_usd must be from {MIN_PURCHASE_USD} to {MAX_PURCHASE_USD} USD in whole cents"),
            ));
        }
        Ok(Checkout::Purchase {
            cents: cents as i64,
        })
    }
}

/// A created checkout: where the member pays.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created {
    pub checkout_url: String,
    pub checkout_session_id: String,
}

/// A payment as the billing page lists it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Payment {
    pub checkout_session_id: String,
    pub kind: String,
    pub amount_usd: f64,
    pub status: String,
    pub credited_usd: f64,
    pub reversed_usd: f64,
    pub created_at: i64,
}

/// The Stripe adapter (`[payments] provider = "stripe"`). Debug shows no secret.
pub struct Stripe {
    api_base: String,
    secret_key: String,
    webhook_secret: String,
    http: reqwest::Client,
}

impl std::fmt::Debug for Stripe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stripe")
            .field("api_base", &self.api_base)
            .finish_non_exhaustive()
    }
}

/// Why a webhook was refused (400: Stripe shows it and retries) or failed (500).
#[derive(Debug)]
pub enum WebhookError {
    BadSignature(&'static str),
    BadEvent(&'static str),
    Store(ApiError),
}

impl From<ApiError> for WebhookError {
    fn from(e: ApiError) -> Self {
        WebhookError::Store(e)
    }
}

impl From<Error> for WebhookError {
    fn from(e: Error) -> Self {
        WebhookError::Store(e.into())
    }
}

/// What a webhook event did.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    /// Credits moved (or the verification was recorded).
    Changed { org_id: String },
    /// Seen before: nothing happened again.
    Duplicate,
    /// Nothing to do for this event.
    Ignored,
}

impl Stripe {
    /// The adapter `[payments]` configures: `None` for provider `none`. Stripe needs
    /// both secrets in the variables the config names; without them it refuses to
    /// start (a webhook could not be checked).
    pub fn from_config(c: &PaymentsConfig) -> anyhow::Result<Option<Stripe>> {
        match c.provider.as_str() {
            "none" | "" => Ok(None),
            "stripe" => {
                let read = |var: &str| {
                    std::env::var(var)
                        .ok()
                        .filter(|v| !v.is_empty())
                        .with_context(|| {
                            format!("[payments] provider = \"stripe\" needs the variable {var} set")
                        })
                };
                let http = reqwest::Client::builder()
                    .timeout(Duration::from_secs(30))
                    .build()
                    .context("building the payment provider's client")?;
                Ok(Some(Stripe {
                    api_base: c.api_base.trim_end_matches('/').to_string(),
                    secret_key: read(&c.secret_key_env)?,
                    webhook_secret: read(&c.webhook_secret_env)?,
                    http,
                }))
            }
            other => anyhow::bail!("payments.provider = {other:?}: expected none or stripe"),
        }
    }

    /// The origin of Stripe's checkout pages, for the web app's form-action policy.
    pub fn checkout_origins(&self) -> Vec<String> {
        let mut out = vec!["https://checkout.stripe.com".to_string()];
        if let Some(origin) = origin_of(&self.api_base) {
            out.push(origin);
        }
        out
    }

    /// Creates a Checkout Session for the org (`POST {api_base}/v1/checkout/sessions`,
    /// form-encoded) and records it; the member pays at `checkout_url`.
    pub async fn create_checkout(
        &self,
        db: &Db,
        org_id: &str,
        user_id: &str,
        what: Checkout,
        return_url: &str,
    ) -> Result<Created, ApiError> {
        let cents = what.cents();
        let name = match what {
            Checkout::Verification => "Card verification (1 USD, credited back to your balance)",
            Checkout::Purchase { .. } => "sluice credits",
        };
        let mut form: Vec<(&str, String)> = vec![
            ("mode", "payment".into()),
            ("client_reference_id", org_id.into()),
            ("metadata[kind]", what.kind().into()),
            ("metadata[org_id]", org_id.into()),
            ("line_items[0][quantity]", "1".into()),
            ("line_items[0][price_data][currency]", "usd".into()),
            ("line_items[0][price_data][unit_amount]", cents.to_string()),
            ("line_items[0][price_data][product_data][name]", name.into()),
            ("payment_intent_data[metadata][org_id]", org_id.into()),
            ("payment_intent_data[metadata][kind]", what.kind().into()),
            (
                "success_url",
                format!("{return_url}?checkout=success&session_id={{CHECKOUT_SESSION_ID}}"),
            ),
            ("cancel_url", format!("{return_url}?checkout=cancelled")),
        ];
        if what == Checkout::Verification {
            // The card stays on file for later purchases.
            form.push(("customer_creation", "always".into()));
            form.push((
                "payment_intent_data[setup_future_usage]",
                "off_session".into(),
            ));
        }
        let refused = |why: String| {
            tracing::warn!(reason = %why, "the payment provider refused a checkout");
            ApiError::new(
                ErrorCode::InternalError,
                "The payment provider could not start a checkout; try again shortly.",
            )
            .with_status(502)
        };
        let answer = self
            .http
            .post(format!("{}/v1/checkout/sessions", self.api_base))
            .bearer_auth(&self.secret_key)
            .header("Idempotency-Key", crate::store::new_id("chk"))
            .form(&form)
            .send()
            .await
            .map_err(|e| refused(format!("unreachable: {e}")))?;
        let status = answer.status();
        let body: Value = answer
            .json()
            .await
            .map_err(|e| refused(format!("answer is not JSON: {e}")))?;
        if !status.is_success() {
            let msg = body["error"]["message"].as_str().unwrap_or("no message");
            return Err(refused(format!("status {status}: {msg}")));
        }
        let (Some(id), Some(url)) = (body["id"].as_str(), body["url"].as_str()) else {
            return Err(refused("the session has no id or url".into()));
        };
        let now = now_ms();
        sqlx::query(
            "INSERT INTO payments (checkout_session_id, org_id, kind, amount_micro_usd, status, \
             created_by, created_at, updated_at) VALUES ($1, $2, $3, $4, 'open', $5, $6, $6)",
        )
        .bind(id)
        .bind(org_id)
        .bind(what.kind())
        .bind(cents * MICRO_PER_CENT)
        .bind(user_id)
        .bind(now)
        .execute(&db.pool)
        .await
        .map_err(Error::db("payments"))?;
        Ok(Created {
            checkout_url: url.to_string(),
            checkout_session_id: id.to_string(),
        })
    }

    /// Checks a webhook's `Stripe-Signature` against its raw body at `now_secs`.
    pub fn verify_signature(
        &self,
        header: Option<&str>,
        body: &[u8],
        now_secs: i64,
    ) -> Result<(), WebhookError> {
        verify_signature(&self.webhook_secret, header, body, now_secs)
    }

    /// `POST {web_url}/webhooks/stripe`: checks the signature, then applies the
    /// event once.
    pub async fn webhook(
        &self,
        db: &Db,
        counters: &dyn Counters,
        dir: &Directory,
        header: Option<&str>,
        body: &[u8],
        tier_up_micro_usd: i64,
    ) -> Result<Applied, WebhookError> {
        self.verify_signature(header, body, now_ms() / 1000)?;
        let event: Value =
            serde_json::from_slice(body).map_err(|_| WebhookError::BadEvent("not JSON"))?;
        let (Some(id), Some(kind)) = (event["id"].as_str(), event["type"].as_str()) else {
            return Err(WebhookError::BadEvent("no id or type"));
        };
        let object = &event["data"]["object"];
        let applied = match kind {
            "checkout.session.completed" | "checkout.session.async_payment_succeeded" => {
                paid(db, id, kind, object, tier_up_micro_usd).await?
            }
            "charge.refunded" => {
                let refunded = object["amount_refunded"].as_i64().unwrap_or(0);
                take_back(
                    db,
                    counters,
                    id,
                    kind,
                    object,
                    Reversal::UpTo(refunded),
                    tier_up_micro_usd,
                )
                .await?
            }
            "charge.dispute.created" => {
                let disputed = object["amount"].as_i64().unwrap_or(0);
                take_back(
                    db,
                    counters,
                    id,
                    kind,
                    object,
                    Reversal::Add(disputed),
                    tier_up_micro_usd,
                )
                .await?
            }
            _ => Applied::Ignored,
        };
        if let Applied::Changed { org_id } = &applied {
            if let Some(org) = orgs::get(db, org_id).await? {
                dir.put_org(org);
            }
        }
        Ok(applied)
    }
}

/// The scheme and host of a URL (`https://host:port`).
fn origin_of(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let host = rest.split(['/', '?', '#']).next()?;
    (!host.is_empty()).then(|| format!("{scheme}://{host}"))
}

/// Stripe's scheme: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">` (more
/// than one `v1` while a secret rolls over), within the tolerance.
pub fn verify_signature(
    secret: &str,
    header: Option<&str>,
    body: &[u8],
    now_secs: i64,
) -> Result<(), WebhookError> {
    let header = header.ok_or(WebhookError::BadSignature("no Stripe-Signature header"))?;
    let mut t: Option<i64> = None;
    let mut v1: Vec<Vec<u8>> = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", v)) => t = v.parse().ok(),
            Some(("v1", v)) => {
                if let Ok(sig) = hex::decode(v) {
                    v1.push(sig);
                }
            }
            _ => {}
        }
    }
    let t = t.ok_or(WebhookError::BadSignature("no timestamp"))?;
    if v1.is_empty() {
        return Err(WebhookError::BadSignature("no v1 signature"));
    }
    let skew = now_secs.checked_sub(t).map(i64::unsigned_abs);
    if skew.is_none_or(|s| s > SIGNATURE_TOLERANCE_SECS as u64) {
        return Err(WebhookError::BadSignature(
            "timestamp outside the tolerance",
        ));
    }
    for sig in &v1 {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes())
            .map_err(|_| WebhookError::BadSignature("unusable secret"))?;
        mac.update(t.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        // Constant time.
        if mac.verify_slice(sig).is_ok() {
            return Ok(());
        }
    }
    Err(WebhookError::BadSignature("no signature matches"))
}

/// Records an event id inside the transaction; false when it was applied before.
async fn first_time(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    event_id: &str,
    kind: &str,
    org_id: Option<&str>,
) -> Result<bool, ApiError> {
    let done = sqlx::query(
        "INSERT INTO payment_events (event_id, type, org_id, received_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (event_id) DO NOTHING",
    )
    .bind(event_id)
    .bind(kind)
    .bind(org_id)
    .bind(now_ms())
    .execute(&mut **tx)
    .await
    .map_err(Error::db("payment events"))?;
    Ok(done.rows_affected() == 1)
}

/// A payment row as the webhook reads it.
struct Row_ {
    session: String,
    org_id: String,
    kind: String,
    status: String,
    credited: i64,
    reversed: i64,
    /// What applying it unlocked (M5 of the 2026-12-01 review).
    raised_tier: bool,
    lifted_review: Option<String>,
}

fn payment_row(r: &sqlx::any::AnyRow) -> Row_ {
    Row_ {
        session: r.get("checkout_session_id"),
        org_id: r.get("org_id"),
        kind: r.get("kind"),
        status: r.get("status"),
        credited: opt_i64(r, "credited_micro_usd").unwrap_or(0),
        reversed: opt_i64(r, "reversed_micro_usd").unwrap_or(0),
        raised_tier: opt_i64(r, "raised_tier").unwrap_or(0) != 0,
        lifted_review: r
            .try_get::<Option<String>, _>("lifted_review")
            .ok()
            .flatten(),
    }
}

const ROW_COLUMNS: &str = "checkout_session_id, org_id, kind, status, credited_micro_usd, \
                           reversed_micro_usd, raised_tier, lifted_review";

/// A payment row read inside a webhook's transaction. On PostgreSQL it is locked
/// until the transaction ends, so two events of one payment applied at once on
/// two instances take turns (SQLite's transaction holds the write lock already:
/// it wrote the event first).
fn locked_row(db: &Db, by: &str) -> String {
    let lock = match db.engine {
        crate::store::db::Engine::Postgres => " FOR UPDATE",
        crate::store::db::Engine::Sqlite => "",
    };
    format!("SELECT {ROW_COLUMNS} FROM payments WHERE {by} = $1{lock}")
}

/// A paid checkout: credit the purchase, or record the verification.
async fn paid(
    db: &Db,
    event_id: &str,
    kind: &str,
    session: &Value,
    tier_up_micro_usd: i64,
) -> Result<Applied, WebhookError> {
    let Some(session_id) = session["id"].as_str() else {
        return Err(WebhookError::BadEvent("the checkout session has no id"));
    };
    let mut tx = db.pool.begin().await.map_err(Error::db("payments"))?;
    // The event is recorded first: the transaction writes before it reads, so on
    // SQLite it takes the write lock (waiting for it) instead of failing to
    // upgrade a read when the usage writer committed meanwhile.
    let reference = session["client_reference_id"].as_str();
    if !first_time(&mut tx, event_id, kind, reference).await? {
        return Ok(Applied::Duplicate);
    }
    let stored = sqlx::query(&locked_row(db, "checkout_session_id"))
        .bind(session_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(Error::db("payments"))?
        .as_ref()
        .map(payment_row);
    // Our own record says whose and what it is; a session made elsewhere (the
    // Stripe dashboard) by its reference and metadata.
    let org_id = stored
        .as_ref()
        .map(|r| r.org_id.clone())
        .or_else(|| reference.map(str::to_string));
    let commit = |tx: sqlx::Transaction<'static, sqlx::Any>| async move {
        tx.commit().await.map_err(Error::db("payments"))
    };
    if session["payment_status"].as_str() != Some("paid") {
        commit(tx).await?;
        return Ok(Applied::Ignored);
    }
    let Some(org_id) = org_id.filter(|o| !o.is_empty()) else {
        commit(tx).await?;
        return Ok(Applied::Ignored);
    };
    if !org_known(&mut tx, &org_id).await? || stored.as_ref().is_some_and(|r| r.status != "open") {
        // No such org, or this checkout was credited already (its other event).
        commit(tx).await?;
        return Ok(Applied::Ignored);
    }
    let what = stored
        .as_ref()
        .map(|r| r.kind.clone())
        .or_else(|| session["metadata"]["kind"].as_str().map(str::to_string))
        .unwrap_or_default();
    // Amounts are read as cents of USD: a session in another currency (made in
    // the dashboard, or a payment link) is not credited.
    if let Some(currency) = session["currency"].as_str() {
        if !currency.eq_ignore_ascii_case("usd") {
            tracing::warn!(
                currency,
                "a paid checkout in another currency than usd is not credited"
            );
            commit(tx).await?;
            return Ok(Applied::Ignored);
        }
    }
    let paid_micro = session["amount_total"].as_i64().unwrap_or(0) * MICRO_PER_CENT;
    let before = orgs::unlocks_in_tx(&mut tx, &org_id).await?;
    let mut raised_tier = false;
    let credited = match what.as_str() {
        "purchase" if paid_micro > 0 => {
            raised_tier = paid_micro >= tier_up_micro_usd && before.tier < orgs::MAX_TIER;
            orgs::credit_in_tx(&mut tx, &org_id, paid_micro, "purchase", tier_up_micro_usd).await?;
            paid_micro
        }
        "verification" => {
            let settled: i64 = sqlx::query("SELECT settled FROM orgs WHERE id = $1")
                .bind(&org_id)
                .fetch_one(&mut *tx)
                .await
                .map_err(Error::db("payments"))?
                .try_get("settled")
                .unwrap_or(0);
            orgs::verify_in_tx(&mut tx, &org_id, None, Some(true), Some(true)).await?;
            // The 1 USD goes back to the balance the first time only.
            if settled == 0 {
                orgs::VERIFICATION_MICRO_USD
            } else {
                0
            }
        }
        _ => {
            commit(tx).await?;
            return Ok(Applied::Ignored);
        }
    };
    let now = now_ms();
    let intent = session["payment_intent"].as_str();
    let lifted = before.payment_review;
    if stored.is_some() {
        // Only from open: the payment's other event, applied meanwhile, made it paid.
        let done = sqlx::query(
            "UPDATE payments SET status = 'paid', payment_intent = $1, credited_micro_usd = $2, \
             updated_at = $3, raised_tier = $5, lifted_review = $6 \
             WHERE checkout_session_id = $4 AND status = 'open'",
        )
        .bind(intent)
        .bind(credited)
        .bind(now)
        .bind(session_id)
        .bind(raised_tier as i64)
        .bind(&lifted)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("payments"))?;
        if done.rows_affected() == 0 {
            // Dropped: what this transaction credited is rolled back.
            return Ok(Applied::Ignored);
        }
    } else {
        sqlx::query(
            "INSERT INTO payments (checkout_session_id, org_id, kind, amount_micro_usd, status, \
             payment_intent, credited_micro_usd, created_at, updated_at, raised_tier, lifted_review) \
             VALUES ($1, $2, $3, $4, 'paid', $5, $6, $7, $7, $8, $9)",
        )
        .bind(session_id)
        .bind(&org_id)
        .bind(&what)
        .bind(paid_micro)
        .bind(intent)
        .bind(credited)
        .bind(now)
        .bind(raised_tier as i64)
        .bind(&lifted)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("payments"))?;
    }
    commit(tx).await?;
    Ok(Applied::Changed { org_id })
}

async fn org_known(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    org_id: &str,
) -> Result<bool, ApiError> {
    Ok(sqlx::query("SELECT 1 FROM orgs WHERE id = $1")
        .bind(org_id)
        .fetch_optional(&mut **tx)
        .await
        .map_err(Error::db("payments"))?
        .is_some())
}

/// How much of a payment an event takes back, in cents.
enum Reversal {
    /// A refund: the charge's refunded total so far (refund events repeat it).
    UpTo(i64),
    /// A dispute: this much more.
    Add(i64),
}

/// A refund or a dispute: takes back what it names of the payment (matched by
/// `payment_intent`), never more than the payment credited.
async fn take_back(
    db: &Db,
    counters: &dyn Counters,
    event_id: &str,
    kind: &str,
    object: &Value,
    how: Reversal,
    tier_up_micro_usd: i64,
) -> Result<Applied, WebhookError> {
    let Some(intent) = object["payment_intent"].as_str() else {
        return Ok(Applied::Ignored);
    };
    let mut tx = db.pool.begin().await.map_err(Error::db("payments"))?;
    // Written before anything is read (see `paid`).
    if !first_time(&mut tx, event_id, kind, None).await? {
        return Ok(Applied::Duplicate);
    }
    let row = sqlx::query(&locked_row(db, "payment_intent"))
        .bind(intent)
        .fetch_optional(&mut *tx)
        .await
        .map_err(Error::db("payments"))?
        .as_ref()
        .map(payment_row);
    let Some(row) = row else {
        tx.commit().await.map_err(Error::db("payments"))?;
        return Ok(Applied::Ignored);
    };
    sqlx::query("UPDATE payment_events SET org_id = $1 WHERE event_id = $2")
        .bind(&row.org_id)
        .bind(event_id)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("payment events"))?;
    let open = row.credited - row.reversed;
    let asked = match how {
        Reversal::UpTo(cents) => cents * MICRO_PER_CENT - row.reversed,
        Reversal::Add(cents) => cents * MICRO_PER_CENT,
    };
    let amount = asked.min(open);
    if amount <= 0 {
        tx.commit().await.map_err(Error::db("payments"))?;
        return Ok(Applied::Ignored);
    }
    let entry = if kind == "charge.refunded" {
        "refund"
    } else {
        "dispute"
    };
    // Never past what was credited, whatever was read: the row changes only here.
    let claimed = sqlx::query(
        "UPDATE payments SET reversed_micro_usd = reversed_micro_usd + $1, status = $2, \
         updated_at = $3 WHERE checkout_session_id = $4 \
         AND reversed_micro_usd + $1 <= credited_micro_usd",
    )
    .bind(amount)
    .bind(if entry == "refund" {
        "refunded"
    } else {
        "disputed"
    })
    .bind(now_ms())
    .bind(&row.session)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("payments"))?;
    if claimed.rows_affected() == 0 {
        return Ok(Applied::Ignored);
    }
    orgs::debit_in_tx(&mut tx, &row.org_id, amount, entry, row.kind == "purchase").await?;
    // What the payment unlocked goes with it: the tier step once what is left of
    // the purchase is below a step's price, the review it lifted, and all the
    // verification gave.
    let left = row.credited - row.reversed - amount;
    let lower_tier = row.kind == "purchase" && row.raised_tier && left < tier_up_micro_usd;
    orgs::reverse_unlocks_in_tx(
        &mut tx,
        &row.org_id,
        lower_tier,
        row.lifted_review.as_deref(),
        row.kind == "verification",
    )
    .await?;
    sqlx::query(
        "UPDATE payments SET raised_tier = $1, lifted_review = NULL WHERE checkout_session_id = $2",
    )
    .bind((row.raised_tier && !lower_tier) as i64)
    .bind(&row.session)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("payments"))?;
    // The live balance (the counter requests draw on) goes down with the ledger.
    // A counter that is not there yet is seeded from the ledger after this commit.
    let key = balance_key(&row.org_id);
    counters
        .correct_many(&[(key.clone(), -amount)])
        .await
        .map_err(Error::counters("reversing a payment"))?;
    if let Err(e) = tx.commit().await {
        // Put the live balance back: the ledger did not change.
        if let Err(undo) = counters.correct_many(&[(key, amount)]).await {
            tracing::error!(error = %undo, org = %row.org_id, "a reversal's balance draw could not be undone");
        }
        return Err(Error::db("payments")(e).into());
    }
    Ok(Applied::Changed { org_id: row.org_id })
}

/// The live balance counter of an org (as `billing::gate` draws it).
pub fn balance_key(org_id: &str) -> String {
    ["bal:", org_id].concat()
}

/// The org's payments, newest first.
pub async fn list_for_org(db: &Db, org_id: &str) -> Result<Vec<Payment>, ApiError> {
    let rows = sqlx::query(
        "SELECT checkout_session_id, kind, amount_micro_usd, status, credited_micro_usd, \
         reversed_micro_usd, created_at FROM payments WHERE org_id = $1 \
         ORDER BY created_at DESC LIMIT 100",
    )
    .bind(org_id)
    .fetch_all(&db.pool)
    .await
    .map_err(Error::db("payments"))?;
    let usd = crate::money::micro_to_usd;
    Ok(rows
        .iter()
        .map(|r| Payment {
            checkout_session_id: r.get("checkout_session_id"),
            kind: r.get("kind"),
            amount_usd: usd(opt_i64(r, "amount_micro_usd").unwrap_or(0)),
            status: r.get("status"),
            credited_usd: usd(opt_i64(r, "credited_micro_usd").unwrap_or(0)),
            reversed_usd: usd(opt_i64(r, "reversed_micro_usd").unwrap_or(0)),
            created_at: r.get("created_at"),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(secret: &str, t: i64, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(format!("{t}.").as_bytes());
        mac.update(body);
        format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
    }

    #[test]
    fn signatures_check_the_secret_the_body_and_the_time() {
        let body = br#"{"id":"evt_1"}"#;
        let now = 1_800_000_000;
        let good = sign("whsec_a", now, body);
        assert!(verify_signature("whsec_a", Some(&good), body, now).is_ok());
        // A second v1 (a secret rolling over) is tried too.
        let rolled = format!("{},v1=00ff", good);
        assert!(verify_signature("whsec_a", Some(&rolled), body, now + 299).is_ok());
        for (secret, header, body, at) in [
            ("whsec_b", Some(good.as_str()), &body[..], now),
            ("whsec_a", Some(good.as_str()), &b"{}"[..], now),
            ("whsec_a", Some(good.as_str()), &body[..], now + 301),
            ("whsec_a", Some(good.as_str()), &body[..], now - 301),
            ("whsec_a", None, &body[..], now),
            ("whsec_a", Some("t=1800000000"), &body[..], now),
            ("whsec_a", Some("v1=abcd"), &body[..], now),
        ] {
            assert!(
                verify_signature(secret, header, body, at).is_err(),
                "{secret} {header:?} {at}"
            );
        }
    }

    #[test]
    fn purchases_are_whole_cents_within_bounds() {
        assert_eq!(
            Checkout::purchase(12.34).unwrap(),
            Checkout::Purchase { cents: 1234 }
        );
        for bad in [0.0, 0.5, 12.345, 10_000.01, f64::NAN, -5.0] {
            let e = Checkout::purchase(bad).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("amount_usd"));
        }
        assert_eq!(Checkout::Verification.cents(), 100);
    }

    #[test]
    fn origins() {
        assert_eq!(
            origin_of("http://127.0.0.1:4242/x").as_deref(),
            Some("http://127.0.0.1:4242")
        );
        assert_eq!(origin_of("nonsense"), None);
    }
}
