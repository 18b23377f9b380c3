//! What an org stores with the service, for its quota (`[limits]
//! org_storage_bytes`, `org_files`): files (and, through them, batches) and
//! telemetry uploads and pulls, counted from their rows. Stored traces and batch
//! lines are projections of those: they count through them.

use super::Db;
use crate::error::Error;
use sluice_filters::{ApiError, ErrorCode};
use sqlx::Row;

/// An org's stored bytes and file count, as the database has them now.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stored {
    pub bytes: i64,
    pub files: i64,
}

pub async fn stored(db: &Db, org_id: &str) -> Result<Stored, ApiError> {
    let row = sqlx::query(
        // SUM is NUMERIC on PostgreSQL, which the Any driver does not read.
        "SELECT CAST((SELECT COALESCE(SUM(bytes), 0) FROM files WHERE org_id = $1) \
         + (SELECT COALESCE(SUM(byte_size), 0) FROM telemetry_ingests WHERE org_id = $1) AS BIGINT) AS bytes, \
         (SELECT COUNT(*) FROM files WHERE org_id = $1) AS files",
    )
    .bind(org_id)
    .fetch_one(&db.pool)
    .await
    .map_err(Error::db("storage quota"))?;
    Ok(Stored {
        bytes: row.try_get("bytes").map_err(Error::db("storage quota"))?,
        files: row.try_get("files").map_err(Error::db("storage quota"))?,
    })
}

/// The refusal past the quota: 429 `insufficient_quota`, its message prefix
/// `storage_quota_reached` saying which.
pub fn refused(what: &str) -> ApiError {
    ApiError::new(
        ErrorCode::InsufficientQuota,
        format!("storage_quota_reached: {what}; delete files or ingests the organization no longer needs."),
    )
}

/// What an org may still store in one object: `cap` (the object kind's own
/// limit), less what the quota has left; an error when nothing is left.
pub async fn room(db: &Db, org_id: &str, quota: u64, cap: u64) -> Result<u64, ApiError> {
    let s = stored(db, org_id).await?;
    let left = quota.saturating_sub(u64::try_from(s.bytes).unwrap_or(0));
    if left == 0 {
        return Err(refused(&format!(
            "the organization stores {quota} bytes, its quota ([limits] org_storage_bytes)"
        )));
    }
    Ok(cap.min(left))
}
