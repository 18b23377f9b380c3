//! Organizations: verification state, tier, credit balance, grants, review state.
//! Every write bumps `updated_at`, which is how other instances see the change.

use crate::error::Error;
use crate::money::{micro_to_usd, usd_to_micro};
use crate::store::db::opt_i64;
use crate::store::{new_id, now_ms, Db};
use serde::Serialize;
use serde_json::{json, Value};
use sluice_filters::{ApiError, ErrorCode};
use sqlx::Row;
use std::collections::BTreeSet;

/// The 1 USD card verification charge, credited back to the balance.
pub const VERIFICATION_MICRO_USD: i64 = 1_000_000;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct OrgRecord {
    pub id: String,
    pub name: String,
    pub email: Option<String>,
    pub email_verified: bool,
    pub card_on_file: bool,
    pub settled: bool,
    pub tier: i64,
    pub balance_micro_usd: i64,
    pub purchased_micro_usd: i64,
    /// Every credit ever added (grants, purchases, the verification refund), from
    /// the same row read as the balance: see `store::counters::BalanceReq`.
    pub credited_micro_usd: i64,
    pub under_review: bool,
    pub review_reason: Option<String>,
    /// The review was opened for a payment reason: a settled payment lifts it.
    pub review_for_payment: bool,
    pub credits_overflow: bool,
    /// Fail-over stays on zero-retention platform rungs.
    pub require_zdr: bool,
    /// The org's own prompt capture choice; `None` follows
    /// `[responses] prompt_capture_default`.
    pub prompt_capture: Option<bool>,
    pub grants: BTreeSet<String>,
    pub created_at: i64,
}

impl OrgRecord {
    /// The admin read: flags, tier, balance in USD, review state.
    pub fn to_admin_json(&self) -> Value {
        json!({
            "org_id": self.id,
            "name": self.name,
            "email": self.email,
            "email_verified": self.email_verified,
            "card_on_file": self.card_on_file,
            "card_verified": self.card_on_file && self.settled,
            "settled": self.settled,
            "tier": self.tier,
            "balance_usd": micro_to_usd(self.balance_micro_usd),
            "purchased_usd": micro_to_usd(self.purchased_micro_usd),
            "under_review": self.under_review,
            "review_reason": self.review_reason,
            "credits_overflow": self.credits_overflow,
            "require_zdr": self.require_zdr,
            "prompt_capture": self.prompt_capture,
            "grants": self.grants,
            "created_at": self.created_at,
        })
    }
}

#[derive(Clone, Debug, Default)]
pub struct NewOrg {
    pub name: String,
    pub email: Option<String>,
    pub email_verified: bool,
    pub card_verified: bool,
    pub credits_micro_usd: i64,
    pub tier: i64,
}

pub async fn org_exists(db: &Db, org_id: &str) -> Result<bool, ApiError> {
    Ok(sqlx::query("SELECT 1 FROM orgs WHERE id = $1")
        .bind(org_id)
        .fetch_optional(&db.pool)
        .await
        .map_err(Error::db("orgs"))?
        .is_some())
}

fn no_org() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "No such organization.")
}

pub async fn create(db: &Db, new: NewOrg) -> Result<String, ApiError> {
    if new.name.trim().is_empty() {
        return Err(ApiError::invalid_parameter(
            "name",
            "name must not be empty",
        ));
    }
    if new.credits_micro_usd < 0 {
        return Err(ApiError::invalid_parameter(
            "credits_usd",
            "credits_usd must not be negative",
        ));
    }
    let mut tx = db.pool.begin().await.map_err(Error::db("orgs"))?;
    let id = create_in_tx(&mut tx, new).await?;
    tx.commit().await.map_err(Error::db("orgs"))?;
    Ok(id)
}

/// [`create`] inside a caller's transaction (a signup makes its org, its first
/// member and its first key at once); the name and credits are checked by the
/// caller.
pub async fn create_in_tx(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    new: NewOrg,
) -> Result<String, ApiError> {
    let id = new_id("org");
    let now = now_ms();
    let flag = |b: bool| b as i64;
    sqlx::query(
        "INSERT INTO orgs (id, name, email, email_verified, card_on_file, settled, tier, \
         balance_micro_usd, purchased_micro_usd, under_review, review_reason, credits_overflow, \
         created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, 0, 0, 0, NULL, 0, $8, $8)",
    )
    .bind(&id)
    .bind(new.name.trim())
    .bind(&new.email)
    .bind(flag(new.email_verified))
    .bind(flag(new.card_verified))
    .bind(flag(new.card_verified))
    .bind(new.tier)
    .bind(now)
    .execute(&mut **tx)
    .await
    .map_err(Error::db("orgs"))?;
    if new.credits_micro_usd > 0 {
        ledger_in_tx(tx, &id, new.credits_micro_usd, "grant", now).await?;
    }
    Ok(id)
}

async fn ledger_in_tx(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    org_id: &str,
    amount: i64,
    kind: &str,
    now: i64,
) -> Result<(), ApiError> {
    sqlx::query(
        "INSERT INTO credit_ledger (id, org_id, amount_micro_usd, kind, note, created_at) \
         VALUES ($1, $2, $3, $4, NULL, $5)",
    )
    .bind(new_id("cr"))
    .bind(org_id)
    .bind(amount)
    .bind(kind)
    .bind(now)
    .execute(&mut **tx)
    .await
    .map_err(Error::db("orgs"))?;
    let purchased = if kind == "purchase" { amount } else { 0 };
    sqlx::query(
        "UPDATE orgs SET balance_micro_usd = balance_micro_usd + $1, \
         credited_micro_usd = credited_micro_usd + $1, \
         purchased_micro_usd = purchased_micro_usd + $2, updated_at = $3 WHERE id = $4",
    )
    .bind(amount)
    .bind(purchased)
    .bind(now)
    .bind(org_id)
    .execute(&mut **tx)
    .await
    .map_err(Error::db("orgs"))?;
    Ok(())
}

/// Adds credits (`grant` or `purchase`); returns the new balance in micro-USD. A
/// purchase of at least `tier_up_micro_usd` moves the org up one tier, and any
/// purchase is a settled payment: it lifts a review opened for a payment reason.
pub async fn add_credits(
    db: &Db,
    org_id: &str,
    amount_usd: f64,
    kind: &str,
    tier_up_micro_usd: i64,
) -> Result<i64, ApiError> {
    if !matches!(kind, "grant" | "purchase") {
        return Err(ApiError::invalid_parameter(
            "kind",
            "kind must be grant or purchase",
        ));
    }
    let amount = usd_to_micro(amount_usd).map_err(|e| e.param("amount_usd"))?;
    if amount <= 0 {
        return Err(ApiError::invalid_parameter(
            "amount_usd",
            "amount_usd must be positive",
        ));
    }
    if !org_exists(db, org_id).await? {
        return Err(no_org());
    }
    let mut tx = db.pool.begin().await.map_err(Error::db("orgs"))?;
    credit_in_tx(&mut tx, org_id, amount, kind, tier_up_micro_usd).await?;
    tx.commit().await.map_err(Error::db("orgs"))?;
    Ok(get(db, org_id).await?.ok_or_else(no_org)?.balance_micro_usd)
}

/// Adds `amount` micro-USD of `kind` (`grant` or `purchase`) inside a caller's
/// transaction (a payment webhook records its event in the same one). A purchase
/// of at least `tier_up_micro_usd` moves the org up one tier and lifts a review
/// opened for a payment reason.
pub async fn credit_in_tx(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    org_id: &str,
    amount: i64,
    kind: &str,
    tier_up_micro_usd: i64,
) -> Result<(), ApiError> {
    ledger_in_tx(tx, org_id, amount, kind, now_ms()).await?;
    if kind == "purchase" {
        if amount >= tier_up_micro_usd {
            sqlx::query("UPDATE orgs SET tier = tier + 1 WHERE id = $1 AND tier < $2")
                .bind(org_id)
                .bind(MAX_TIER)
                .execute(&mut **tx)
                .await
                .map_err(Error::db("orgs"))?;
        }
        lift_payment_review(tx, org_id).await?;
    }
    Ok(())
}

/// Takes `amount` micro-USD back (a refund or a dispute of a payment) inside a
/// caller's transaction: a negative ledger entry of `kind`, the balance (and, for
/// a purchase, the purchased total) down by it. The credited total stays: it
/// counts what was ever added, and the live balance counter is drawn by the
/// caller (`billing::payments`).
pub async fn debit_in_tx(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    org_id: &str,
    amount: i64,
    kind: &str,
    of_purchase: bool,
) -> Result<(), ApiError> {
    let now = now_ms();
    sqlx::query(
        "INSERT INTO credit_ledger (id, org_id, amount_micro_usd, kind, note, created_at) \
         VALUES ($1, $2, $3, $4, NULL, $5)",
    )
    .bind(new_id("cr"))
    .bind(org_id)
    .bind(-amount)
    .bind(kind)
    .bind(now)
    .execute(&mut **tx)
    .await
    .map_err(Error::db("orgs"))?;
    let purchased = if of_purchase { amount } else { 0 };
    sqlx::query(
        "UPDATE orgs SET balance_micro_usd = balance_micro_usd - $1, \
         purchased_micro_usd = CASE WHEN purchased_micro_usd > $2 THEN purchased_micro_usd - $2 ELSE 0 END, \
         updated_at = $3 WHERE id = $4",
    )
    .bind(amount)
    .bind(purchased)
    .bind(now)
    .bind(org_id)
    .execute(&mut **tx)
    .await
    .map_err(Error::db("orgs"))?;
    Ok(())
}

/// Records verification steps. `settled` records the 1 USD charge and credits it
/// back, once.
pub async fn verify(
    db: &Db,
    org_id: &str,
    email: Option<bool>,
    card_on_file: Option<bool>,
    settled: Option<bool>,
) -> Result<OrgRecord, ApiError> {
    let mut tx = db.pool.begin().await.map_err(Error::db("orgs"))?;
    verify_in_tx(&mut tx, org_id, email, card_on_file, settled).await?;
    tx.commit().await.map_err(Error::db("orgs"))?;
    get(db, org_id).await?.ok_or_else(no_org)
}

/// [`verify`] inside a caller's transaction; the flags are read in it, so the
/// 1 USD is credited back once however many callers race.
pub async fn verify_in_tx(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    org_id: &str,
    email: Option<bool>,
    card_on_file: Option<bool>,
    settled: Option<bool>,
) -> Result<(), ApiError> {
    // A write first: on SQLite the transaction then holds the write lock (waiting
    // for it) rather than failing to upgrade a read when another writer committed.
    let now = now_ms();
    let touched = sqlx::query("UPDATE orgs SET updated_at = $1 WHERE id = $2")
        .bind(now)
        .bind(org_id)
        .execute(&mut **tx)
        .await
        .map_err(Error::db("orgs"))?;
    if touched.rows_affected() == 0 {
        return Err(no_org());
    }
    let row = sqlx::query("SELECT email_verified, card_on_file, settled FROM orgs WHERE id = $1")
        .bind(org_id)
        .fetch_one(&mut **tx)
        .await
        .map_err(Error::db("orgs"))?;
    let flag = |c: &str| opt_i64(&row, c).unwrap_or(0) != 0;
    let was_settled = flag("settled");
    sqlx::query(
        "UPDATE orgs SET email_verified = $1, card_on_file = $2, settled = $3, updated_at = $4 WHERE id = $5",
    )
    .bind(email.unwrap_or(flag("email_verified")) as i64)
    .bind(card_on_file.unwrap_or(flag("card_on_file")) as i64)
    .bind(settled.unwrap_or(was_settled) as i64)
    .bind(now)
    .bind(org_id)
    .execute(&mut **tx)
    .await
    .map_err(Error::db("orgs"))?;
    if settled == Some(true) && !was_settled {
        ledger_in_tx(tx, org_id, VERIFICATION_MICRO_USD, "verification", now).await?;
        lift_payment_review(tx, org_id).await?;
    }
    Ok(())
}

/// Replaces the set of restricted slugs the org may call.
pub async fn set_grants(db: &Db, org_id: &str, slugs: &[String]) -> Result<(), ApiError> {
    if !org_exists(db, org_id).await? {
        return Err(no_org());
    }
    let mut tx = db.pool.begin().await.map_err(Error::db("orgs"))?;
    sqlx::query("DELETE FROM org_grants WHERE org_id = $1")
        .bind(org_id)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("orgs"))?;
    let unique: BTreeSet<&String> = slugs.iter().collect();
    for slug in unique {
        sqlx::query("INSERT INTO org_grants (org_id, slug) VALUES ($1, $2)")
            .bind(org_id)
            .bind(slug)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("orgs"))?;
    }
    touch(&mut tx, org_id).await?;
    tx.commit().await.map_err(Error::db("orgs"))?;
    Ok(())
}

/// The highest tier an org can be moved to.
pub const MAX_TIER: i64 = 100;

/// A settled payment releases a review opened for a payment reason.
async fn lift_payment_review(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    org_id: &str,
) -> Result<(), ApiError> {
    sqlx::query(
        "UPDATE orgs SET under_review = 0, review_reason = NULL, review_for_payment = 0 \
         WHERE id = $1 AND under_review = 1 AND review_for_payment = 1",
    )
    .bind(org_id)
    .execute(&mut **tx)
    .await
    .map_err(Error::db("orgs"))?;
    Ok(())
}

/// What a payment may unlock, as it stands before the payment is applied.
#[derive(Debug, Default)]
pub struct Unlocks {
    pub tier: i64,
    /// The reason of a review opened for a payment reason (a payment lifts it).
    pub payment_review: Option<String>,
}

/// The org's tier and payment review, read inside a payment's transaction.
pub async fn unlocks_in_tx(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    org_id: &str,
) -> Result<Unlocks, ApiError> {
    let row = sqlx::query(
        "SELECT tier, under_review, review_for_payment, review_reason FROM orgs WHERE id = $1",
    )
    .bind(org_id)
    .fetch_one(&mut **tx)
    .await
    .map_err(Error::db("orgs"))?;
    let flag = |c: &str| opt_i64(&row, c).unwrap_or(0) != 0;
    Ok(Unlocks {
        tier: opt_i64(&row, "tier").unwrap_or(0),
        payment_review: (flag("under_review") && flag("review_for_payment")).then(|| {
            row.try_get::<Option<String>, _>("review_reason")
                .ok()
                .flatten()
                .unwrap_or_else(|| "payment review".into())
        }),
    })
}

/// Takes back what a reversed payment unlocked: the tier step it gave, the
/// payment review it lifted (opened again unless another review is open), and
/// for the 1 USD verification the card on file, the settled charge and credits
/// overflow (which needs both).
pub async fn reverse_unlocks_in_tx(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    org_id: &str,
    lower_tier: bool,
    review: Option<&str>,
    verification: bool,
) -> Result<(), ApiError> {
    let now = now_ms();
    if lower_tier {
        sqlx::query("UPDATE orgs SET tier = tier - 1, updated_at = $1 WHERE id = $2 AND tier > 0")
            .bind(now)
            .bind(org_id)
            .execute(&mut **tx)
            .await
            .map_err(Error::db("orgs"))?;
    }
    if let Some(reason) = review {
        sqlx::query(
            "UPDATE orgs SET under_review = 1, review_reason = $1, review_for_payment = 1, updated_at = $2 \
             WHERE id = $3 AND under_review = 0",
        )
        .bind(reason)
        .bind(now)
        .bind(org_id)
        .execute(&mut **tx)
        .await
        .map_err(Error::db("orgs"))?;
    }
    if verification {
        sqlx::query(
            "UPDATE orgs SET card_on_file = 0, settled = 0, credits_overflow = 0, updated_at = $1 WHERE id = $2",
        )
        .bind(now)
        .bind(org_id)
        .execute(&mut **tx)
        .await
        .map_err(Error::db("orgs"))?;
    }
    Ok(())
}

/// Turns credits overflow on (a spent free allowance then draws credits); only a
/// verified org (card on file and the 1 USD charge settled) may.
pub async fn enable_overflow(db: &Db, org: &OrgRecord) -> Result<(), ApiError> {
    if !(org.card_on_file && org.settled) {
        return Err(ApiError::new(
            ErrorCode::VerificationRequired,
            "Credits overflow needs a verified organization: add a card and complete the 1 USD verification.",
        ));
    }
    let done = sqlx::query("UPDATE orgs SET credits_overflow = 1, updated_at = $1 WHERE id = $2")
        .bind(now_ms())
        .bind(&org.id)
        .execute(&db.pool)
        .await;
    one_org(done)
}

/// Sets the org's provider policy.
pub async fn set_require_zdr(db: &Db, org_id: &str, on: bool) -> Result<(), ApiError> {
    let done = sqlx::query("UPDATE orgs SET require_zdr = $1, updated_at = $2 WHERE id = $3")
        .bind(on as i64)
        .bind(now_ms())
        .bind(org_id)
        .execute(&db.pool)
        .await;
    one_org(done)
}

/// The org settings an operator or a member may change; `None` leaves one as it is.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingsChange {
    pub prompt_capture: Option<bool>,
    pub require_zdr: Option<bool>,
    pub credits_overflow: Option<bool>,
}

/// Applies a settings change in one statement. Turning credits overflow on here
/// is the operator's (or a verified member's) call: callers check verification.
pub async fn set_settings(db: &Db, org_id: &str, c: &SettingsChange) -> Result<(), ApiError> {
    let flag = |b: Option<bool>| b.map(|b| b as i64);
    let done = sqlx::query(
        "UPDATE orgs SET prompt_capture = COALESCE($1, prompt_capture), \
         require_zdr = COALESCE($2, require_zdr), \
         credits_overflow = COALESCE($3, credits_overflow), updated_at = $4 WHERE id = $5",
    )
    .bind(flag(c.prompt_capture))
    .bind(flag(c.require_zdr))
    .bind(flag(c.credits_overflow))
    .bind(now_ms())
    .bind(org_id)
    .execute(&db.pool)
    .await;
    one_org(done)
}

impl OrgRecord {
    /// Whether the responses store keeps this org's conversations.
    pub fn captures_prompts(&self, default: bool) -> bool {
        self.prompt_capture.unwrap_or(default)
    }

    /// The settings read: each as it applies now.
    pub fn settings_json(&self, capture_default: bool) -> Value {
        json!({
            "org_id": self.id,
            "prompt_capture": self.captures_prompts(capture_default),
            "require_zdr": self.require_zdr,
            "credits_overflow": self.credits_overflow,
        })
    }
}

async fn touch(tx: &mut sqlx::Transaction<'_, sqlx::Any>, org_id: &str) -> Result<(), ApiError> {
    sqlx::query("UPDATE orgs SET updated_at = $1 WHERE id = $2")
        .bind(now_ms())
        .bind(org_id)
        .execute(&mut **tx)
        .await
        .map_err(Error::db("orgs"))?;
    Ok(())
}

/// Opens or releases a review. `for_payment` marks a review a settled payment
/// lifts; without it, a reason that speaks of payment, a card or a charge counts.
pub async fn set_review(
    db: &Db,
    org_id: &str,
    under_review: bool,
    reason: Option<String>,
    for_payment: Option<bool>,
) -> Result<(), ApiError> {
    let for_payment = under_review
        && for_payment.unwrap_or_else(|| {
            reason.as_deref().is_some_and(|r| {
                let r = r.to_ascii_lowercase();
                ["payment", "card", "charge", "billing", "chargeback"]
                    .iter()
                    .any(|w| r.contains(w))
            })
        });
    let done = sqlx::query(
        "UPDATE orgs SET under_review = $1, review_reason = $2, review_for_payment = $5, \
         updated_at = $3 WHERE id = $4",
    )
    .bind(under_review as i64)
    .bind(if under_review { reason } else { None })
    .bind(now_ms())
    .bind(org_id)
    .bind(for_payment as i64)
    .execute(&db.pool)
    .await;
    one_org(done)
}

pub async fn set_tier(db: &Db, org_id: &str, tier: i64) -> Result<(), ApiError> {
    if !(0..=MAX_TIER).contains(&tier) {
        return Err(ApiError::invalid_parameter(
            "tier",
            "tier must be between 0 and 100",
        ));
    }
    let done = sqlx::query("UPDATE orgs SET tier = $1, updated_at = $2 WHERE id = $3")
        .bind(tier)
        .bind(now_ms())
        .bind(org_id)
        .execute(&db.pool)
        .await;
    one_org(done)
}

/// The result of an UPDATE of one org: not found when no row matched.
fn one_org(done: Result<sqlx::any::AnyQueryResult, sqlx::Error>) -> Result<(), ApiError> {
    match done.map_err(Error::db("orgs"))?.rows_affected() {
        0 => Err(no_org()),
        _ => Ok(()),
    }
}

const COLUMNS: &str =
    "id, name, email, email_verified, card_on_file, settled, tier, balance_micro_usd, \
                       purchased_micro_usd, credited_micro_usd, under_review, review_reason, \
                       review_for_payment, credits_overflow, require_zdr, prompt_capture, created_at, updated_at";

fn from_row(row: &sqlx::any::AnyRow) -> OrgRecord {
    let flag = |c: &str| opt_i64(row, c).unwrap_or(0) != 0;
    OrgRecord {
        id: row.get("id"),
        name: row.get("name"),
        email: row.try_get::<Option<String>, _>("email").ok().flatten(),
        email_verified: flag("email_verified"),
        card_on_file: flag("card_on_file"),
        settled: flag("settled"),
        tier: opt_i64(row, "tier").unwrap_or(0),
        balance_micro_usd: opt_i64(row, "balance_micro_usd").unwrap_or(0),
        purchased_micro_usd: opt_i64(row, "purchased_micro_usd").unwrap_or(0),
        credited_micro_usd: opt_i64(row, "credited_micro_usd").unwrap_or(0),
        under_review: flag("under_review"),
        review_for_payment: flag("review_for_payment"),
        review_reason: row
            .try_get::<Option<String>, _>("review_reason")
            .ok()
            .flatten(),
        credits_overflow: flag("credits_overflow"),
        require_zdr: flag("require_zdr"),
        prompt_capture: opt_i64(row, "prompt_capture").map(|v| v != 0),
        grants: BTreeSet::new(),
        created_at: row.get("created_at"),
    }
}

async fn grants_of(db: &Db, org_id: &str) -> anyhow::Result<BTreeSet<String>> {
    let rows = sqlx::query("SELECT slug FROM org_grants WHERE org_id = $1")
        .bind(org_id)
        .fetch_all(&db.pool)
        .await?;
    Ok(rows.iter().map(|r| r.get::<String, _>("slug")).collect())
}

pub async fn get(db: &Db, org_id: &str) -> Result<Option<OrgRecord>, ApiError> {
    let row = sqlx::query(&format!("SELECT {COLUMNS} FROM orgs WHERE id = $1"))
        .bind(org_id)
        .fetch_optional(&db.pool)
        .await
        .map_err(Error::db("orgs"))?;
    let Some(row) = row else { return Ok(None) };
    let mut org = from_row(&row);
    org.grants = grants_of(db, org_id).await.map_err(|e| {
        tracing::error!(error = %e, "reading grants");
        ApiError::internal()
    })?;
    Ok(Some(org))
}

/// Orgs changed at or after `since_ms`, with their change time.
pub async fn changed_since(db: &Db, since_ms: i64) -> anyhow::Result<Vec<(OrgRecord, i64)>> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM orgs WHERE updated_at >= $1"
    ))
    .bind(since_ms)
    .fetch_all(&db.pool)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let mut org = from_row(row);
        org.grants = grants_of(db, &org.id).await?;
        out.push((org, row.get::<i64, _>("updated_at")));
    }
    Ok(out)
}

/// One entry of an org's credit ledger.
#[derive(Clone, Debug, Serialize)]
pub struct LedgerEntry {
    pub kind: String,
    pub amount_usd: f64,
    pub created_at: i64,
}

/// The org's newest credit ledger entries (grants, purchases, the verification
/// refund, reversals).
pub async fn ledger(db: &Db, org_id: &str, limit: i64) -> Result<Vec<LedgerEntry>, ApiError> {
    let rows = sqlx::query(
        "SELECT kind, amount_micro_usd, created_at FROM credit_ledger WHERE org_id = $1 \
         ORDER BY created_at DESC, id DESC LIMIT $2",
    )
    .bind(org_id)
    .bind(limit)
    .fetch_all(&db.pool)
    .await
    .map_err(Error::db("orgs"))?;
    Ok(rows
        .iter()
        .map(|r| LedgerEntry {
            kind: r.get("kind"),
            amount_usd: micro_to_usd(r.get::<i64, _>("amount_micro_usd")),
            created_at: r.get("created_at"),
        })
        .collect())
}
