//! Storing an org's waterfall override for a model, and dropping it (the default
//! chain serves the model again).

use crate::error::Error;
use crate::store::{now_ms, Db};
use sluice_filters::ApiError;

pub(crate) async fn put(
    db: &Db,
    org_id: &str,
    slug: &str,
    chain: &[String],
) -> Result<(), ApiError> {
    let text = serde_json::to_string(chain).map_err(|_| ApiError::internal())?;
    sqlx::query(
        "INSERT INTO org_waterfalls (org_id, slug, chain, updated_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (org_id, slug) DO UPDATE SET chain = excluded.chain, updated_at = excluded.updated_at",
    )
    .bind(org_id)
    .bind(slug)
    .bind(text)
    .bind(now_ms())
    .execute(&db.pool)
    .await
    .map_err(Error::db("org waterfalls"))?;
    Ok(())
}

pub(crate) async fn delete(db: &Db, org_id: &str, slug: &str) -> Result<(), ApiError> {
    sqlx::query("DELETE FROM org_waterfalls WHERE org_id = $1 AND slug = $2")
        .bind(org_id)
        .bind(slug)
        .execute(&db.pool)
        .await
        .map_err(Error::db("org waterfalls"))?;
    Ok(())
}
