//! The batch runner's recorder: each line's answer, as its output file line, goes
//! to the database a few to a transaction, with the batch's request counts: the
//! line is marked done and its answer appended to `batch_answers` (a row of its
//! own, so the line's row keeps its size and its page is not split). An
//! answer not recorded runs its line again (its claim is let go, or its lease
//! lapses), billed once: `batch_line` on its usage event.

use super::claims::Claims;
use crate::store::db::Engine;
use crate::store::Db;
use sqlx::Row;
use std::sync::Arc;
use std::time::Duration;

/// A line's answer, to be recorded.
pub(super) struct Answered {
    pub(crate) batch_id: String,
    pub(crate) line_no: i64,
    pub(crate) ok: bool,
    pub(crate) output: String,
}

/// Answers one transaction records at most.
const RECORD_BATCH: usize = 256;
/// How long the recorder waits to fill a transaction (an answer's record waits at
/// most this much longer; a crash in between runs its line again, billed once).
/// Each commit writes its pages to the log whole, so a fuller one costs less a line.
const RECORD_LINGER: Duration = Duration::from_millis(10);

/// A line of the output file: `{id, custom_id, response: {status_code, request_id,
/// body}, error}`. The body is spliced in as the gateway wrote it, not parsed and
/// written again (line breaks between its tokens become spaces: one line per
/// answer); a body that is not JSON goes in as a string.
pub(super) fn output_line(
    custom_id: &str,
    status: u16,
    request_id: Option<&str>,
    body: &[u8],
) -> String {
    let id: [u8; 12] = rand::random();
    let text = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "null".into());
    let mut out = String::with_capacity(body.len() + custom_id.len() + 160);
    out.push_str("{\"id\":\"batch_req_");
    out.push_str(&hex::encode(id));
    out.push_str("\",\"custom_id\":");
    out.push_str(&text(custom_id));
    out.push_str(",\"response\":{\"status_code\":");
    out.push_str(&status.to_string());
    out.push_str(",\"request_id\":");
    out.push_str(&request_id.map_or_else(|| "null".into(), text));
    out.push_str(",\"body\":");
    let json = serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok();
    match std::str::from_utf8(body) {
        Ok(b) if json && !b.contains(['\n', '\r']) => out.push_str(b),
        Ok(b) if json => out.push_str(&b.replace(['\n', '\r'], " ")),
        _ => out.push_str(&text(&String::from_utf8_lossy(body))),
    }
    out.push_str("},\"error\":null}");
    out
}

/// Records answers as they come, up to [`RECORD_BATCH`] to a transaction, with
/// the batch's request counts; `finished` hears of a batch whose lines are all
/// recorded. Then the lines' claims are let go (`Claims::recorded`).
pub(super) async fn record(
    db: Db,
    mut rx: tokio::sync::mpsc::Receiver<Answered>,
    claims: Arc<Claims>,
    finished: Arc<tokio::sync::Notify>,
) {
    let mut pending = Vec::with_capacity(RECORD_BATCH);
    while rx.recv_many(&mut pending, RECORD_BATCH).await > 0 {
        // A few milliseconds more gather a fuller transaction: each commit writes
        // its pages to the log again, so fewer, larger ones cost the database less.
        let linger = tokio::time::sleep(RECORD_LINGER);
        tokio::pin!(linger);
        while pending.len() < RECORD_BATCH {
            let room = RECORD_BATCH - pending.len();
            tokio::select! {
                n = rx.recv_many(&mut pending, room) => if n == 0 { break },
                () = &mut linger => break,
            }
        }
        let db = &db;
        pending.sort_by(|a, b| a.batch_id.cmp(&b.batch_id));
        let mut all_done = false;
        let write = async {
            let mut tx = db.pool.begin().await?;
            for same in pending.chunk_by(|a, b| a.batch_id == b.batch_id) {
                let batch = &same[0].batch_id;
                let (mut ok, mut failed) = (0i64, 0i64);
                let mut fresh = Vec::with_capacity(same.len());
                for part in crate::store::db::fixed_chunks(same, &[64, 16, 4, 1]) {
                    let sql = done_sql(db.engine, part.len());
                    let mut q = sqlx::query(&sql);
                    for a in part {
                        q = q.bind(a.line_no).bind(a.ok as i64);
                    }
                    // Kept where claims are leases: which instance served the line.
                    q = q.bind(claims.claimant()).bind(batch);
                    // A line recorded already (it ran twice: a lease that lapsed)
                    // is not returned, nor counted or its answer stored again.
                    for r in q.fetch_all(&mut *tx).await? {
                        match r.get::<i64, _>("ok") {
                            1 => ok += 1,
                            _ => failed += 1,
                        }
                        fresh.push(r.get::<i64, _>("line_no"));
                    }
                }
                fresh.sort_unstable();
                let answers: Vec<&Answered> = same
                    .iter()
                    .filter(|a| fresh.binary_search(&a.line_no).is_ok())
                    .collect();
                for part in crate::store::db::fixed_chunks(&answers, &[64, 16, 4, 1]) {
                    let sql = format!(
                        "INSERT INTO batch_answers (batch_id, line_no, output) VALUES {} \
                         ON CONFLICT DO NOTHING",
                        db.engine.value_rows(part.len(), 3)
                    );
                    let mut q = sqlx::query(&sql);
                    for a in part {
                        q = q.bind(batch).bind(a.line_no).bind(&a.output);
                    }
                    q.execute(&mut *tx).await?;
                }
                let short: i64 = sqlx::query_scalar(
                    "UPDATE batches SET completed_count = completed_count + $1, \
                     failed_count = failed_count + $2 WHERE id = $3 \
                     RETURNING total - completed_count - failed_count",
                )
                .bind(ok)
                .bind(failed)
                .bind(batch)
                .fetch_one(&mut *tx)
                .await?;
                all_done |= short <= 0;
            }
            tx.commit().await
        };
        match db.bounded(write).await {
            // A batch whose last line this was is finalized now, not at the
            // finalizer's next poll (`batches.poll_ms`, 500 ms by default).
            Ok(()) if all_done => finished.notify_one(),
            Ok(()) => {}
            Err(e) => {
                tracing::warn!(error = %e, lines = pending.len(), "batch answers were not recorded")
            }
        }
        // Recorded or not, the lines are let go: a line not recorded runs again.
        for same in pending.chunk_by(|a, b| a.batch_id == b.batch_id) {
            claims.recorded(&same[0].batch_id, same.iter().map(|a| a.line_no));
        }
        pending.clear();
    }
}

/// One statement marking `n` lines of one batch done: parameters are `n` pairs
/// (line, ok), then the instance and the batch, in the text's order. It returns
/// the lines it marked (not those done already), whose answers are then stored.
fn done_sql(engine: Engine, n: usize) -> String {
    let (claimant, batch) = (engine.param(2 * n + 1), engine.param(2 * n + 2));
    format!(
        "WITH v (line_no, ok) AS (VALUES {}) \
         UPDATE batch_lines SET done = 1, ok = v.ok, claimed_by = {claimant} \
         FROM v WHERE batch_lines.batch_id = {batch} AND batch_lines.line_no = v.line_no \
         AND batch_lines.done = 0 RETURNING batch_lines.line_no, batch_lines.ok",
        engine.value_rows(n, 2)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn an_output_line_is_one_line_of_json_with_the_body_as_written() {
        let pretty = b"{\n  \"id\": \"chatcmpl-1\",\r\n  \"text\": \"a\\nb\"\n}";
        let line = output_line("r-\"1", 200, Some("req_1"), pretty);
        assert!(!line.contains('\n') && !line.contains('\r'), "{line}");
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["custom_id"], "r-\"1");
        assert_eq!(v["response"]["status_code"], 200);
        assert_eq!(v["response"]["request_id"], "req_1");
        assert_eq!(
            v["response"]["body"],
            json!({"id": "chatcmpl-1", "text": "a\nb"})
        );
        assert_eq!(v["error"], Value::Null);
        assert!(v["id"].as_str().unwrap().starts_with("batch_req_"));
        // Not JSON: kept as a string.
        let v: Value = serde_json::from_str(&output_line("x", 502, None, b"bad\ngateway")).unwrap();
        assert_eq!(v["response"]["body"], "bad\ngateway");
        assert_eq!(v["response"]["request_id"], Value::Null);
    }
}
