//! The worker that turns finalized uploads into traces. Every instance runs one:
//! it claims an accepted ingest (see `ingests::claim`), verifies the stored object
//! (it exists, its size and SHA-256 are the ones recorded at upload, it is UTF-8
//! JSON or JSONL), projects it with its source's parser, and stores the traces and
//! the `done` mark in one transaction; a failed check ends the ingest in `error`
//! with the reason. A crash mid-projection leaves the claim to expire; the next
//! claim projects again from scratch, and nothing of the first try was kept.

use super::ingests::{self, Ingest};
use super::model::SourceKind;
use super::sources;
use crate::state::AppState;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::sync::Notify;

/// How long a claim holds before another instance may take the ingest.
const LEASE_MS: i64 = 5 * 60 * 1000;
/// Other instances' finalizes are found by polling.
const POLL: Duration = Duration::from_secs(1);
/// Tries before an ingest whose projection keeps dying is given up.
const MAX_ATTEMPTS: i64 = 5;

static WAKE: OnceLock<Notify> = OnceLock::new();

fn wake() -> &'static Notify {
    WAKE.get_or_init(Notify::new)
}

/// Tells this instance's worker that work is waiting (a finalize answered here).
pub fn nudge() {
    wake().notify_one();
}

/// Starts the worker on the current runtime.
pub(crate) fn spawn(state: Arc<AppState>) {
    let claimer = format!("{}-telemetry", state.instance_id);
    tokio::spawn(async move {
        loop {
            match ingests::claim(&state.db, &claimer, LEASE_MS).await {
                Ok(Some(ingest)) => {
                    process(&state, &claimer, ingest).await;
                    continue;
                }
                // Nothing left to claim here: this instance's view of the queue.
                Ok(None) => crate::metrics::global().telemetry_queue.set(0),
                Err(e) => tracing::warn!(error = %e, "telemetry worker: claim failed"),
            }
            let _ = tokio::time::timeout(POLL, wake().notified()).await;
        }
    });
}

async fn process(state: &AppState, claimer: &str, ingest: Ingest) {
    let id = ingest.id.clone();
    if let Ok(n) = ingests::waiting(&state.db).await {
        crate::metrics::global().telemetry_queue.set(n);
    }
    if ingest.attempts > MAX_ATTEMPTS {
        let _ = ingests::fail(
            &state.db,
            &id,
            Some(claimer),
            "projection failed repeatedly",
        )
        .await;
        return;
    }
    match verify_and_project(state, claimer, &ingest).await {
        Ok(true) => tracing::debug!(ingest = %id, "telemetry ingest done"),
        Ok(false) => tracing::debug!(ingest = %id, "telemetry ingest finished elsewhere"),
        Err(Verdict::Refused(reason)) => {
            if let Err(e) = ingests::fail(&state.db, &id, Some(claimer), &reason).await {
                tracing::warn!(ingest = %id, error = %e, "telemetry worker: could not record the error");
            }
        }
        // The store or the database failed: leave the claim to lapse and retry.
        Err(Verdict::Retry(e)) => {
            tracing::warn!(ingest = %id, error = %e, "telemetry worker: will retry")
        }
    }
}

pub enum Verdict {
    /// The file is not what was promised: the ingest ends in error with this reason.
    Refused(String),
    /// Something of ours failed; the ingest is tried again.
    Retry(String),
}

/// Reads the whole object (at most `cap` bytes), checking its size and hash.
async fn read_verified(state: &AppState, ingest: &Ingest, cap: u64) -> Result<Vec<u8>, Verdict> {
    let (Some(size), Some(sha)) = (ingest.byte_size, ingest.sha256.as_deref()) else {
        return Err(Verdict::Refused(
            "no file was uploaded to the signed URL".into(),
        ));
    };
    let got = state
        .objects
        .get(&ingest.object_key)
        .await
        .map_err(|e| Verdict::Retry(e.to_string()))?;
    let Some((stored, mut body)) = got else {
        return Err(Verdict::Refused(
            "the uploaded file is missing from storage".into(),
        ));
    };
    if stored != size as u64 {
        return Err(Verdict::Refused(format!(
            "stored size {stored} bytes differs from the {size} bytes uploaded"
        )));
    }
    if stored > cap {
        return Err(Verdict::Refused(format!("the file exceeds {cap} bytes")));
    }
    let mut bytes = Vec::with_capacity(stored as usize);
    let mut hash = Sha256::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| Verdict::Retry(e.to_string()))?;
        if bytes.len() + chunk.len() > cap as usize {
            return Err(Verdict::Refused(format!("the file exceeds {cap} bytes")));
        }
        hash.update(&chunk);
        bytes.extend_from_slice(&chunk);
    }
    if hex::encode(hash.finalize()) != sha {
        return Err(Verdict::Refused(
            "SHA-256 of the stored file differs from the one recorded at upload".into(),
        ));
    }
    Ok(bytes)
}

/// Checks UTF-8 and projects; CPU work, run off the async threads.
pub async fn project_bytes(
    kind: SourceKind,
    bytes: Vec<u8>,
) -> Result<Vec<super::model::Trace>, Verdict> {
    tokio::task::spawn_blocking(move || {
        if std::str::from_utf8(&bytes).is_err() {
            return Err(Verdict::Refused("the file is not UTF-8 text".into()));
        }
        sources::project(kind, &bytes).map_err(Verdict::Refused)
    })
    .await
    .map_err(|e| Verdict::Retry(e.to_string()))?
}

async fn verify_and_project(
    state: &AppState,
    claimer: &str,
    ingest: &Ingest,
) -> Result<bool, Verdict> {
    let kind = SourceKind::parse(&ingest.source_kind)
        .ok_or_else(|| Verdict::Refused(format!("unknown source_kind {}", ingest.source_kind)))?;
    let bytes = read_verified(state, ingest, state.config.telemetry.max_upload_bytes).await?;
    let size = bytes.len() as i64;
    let sha = ingest.sha256.clone().unwrap_or_default();
    let traces = project_bytes(kind, bytes).await?;
    ingests::complete(&state.db, ingest, Some(claimer), size, &sha, &traces)
        .await
        .map_err(|e| Verdict::Retry(e.to_string()))
}
