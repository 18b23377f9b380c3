//! The responses store's rows: one per stored turn (its own items, compressed when
//! large), and one per chain (a conversation and its branches) with the expiry every
//! turn of it shares. A history is read in one statement, a recursive walk up the
//! parent links; an expired chain reads as gone before the sweep removes it.

use crate::store::Db;
use serde_json::value::RawValue;
use sqlx::Row;

/// Turns whose items are at least this large are compressed.
const COMPRESS_FROM: usize = 1024;
/// zstd's default level: fast, and about 4x on conversation JSON.
const LEVEL: i32 = 3;
/// A chain deeper than this is not walked (ids come from providers too: a loop
/// must not run forever).
const MAX_DEPTH: i64 = 10_000;

/// One turn to store.
#[derive(Clone, Debug)]
pub struct Turn {
    pub org_id: String,
    pub id: String,
    pub parent_id: Option<String>,
    pub chain_id: String,
    pub model: String,
    pub status: String,
    /// This turn's input items then its output items, as a JSON array.
    pub items: Vec<u8>,
    /// The ids items had in the answer, with their positions in `items`.
    pub item_ids: Vec<(String, i64)>,
}

/// A stored conversation up to and including one response.
#[derive(Debug)]
pub struct History {
    pub chain_id: String,
    /// Every earlier turn's input and output items, oldest first.
    pub items: Vec<Box<RawValue>>,
}

fn encode(items: &[u8]) -> (i64, Vec<u8>) {
    if items.len() < COMPRESS_FROM {
        return (0, items.to_vec());
    }
    match zstd::bulk::compress(items, LEVEL) {
        Ok(z) if z.len() < items.len() => (1, z),
        _ => (0, items.to_vec()),
    }
}

/// A stored turn's items, at most `max` bytes once decompressed (zstd stops
/// there, so a small compressed row never becomes a large allocation).
fn decode(codec: i64, bytes: Vec<u8>, max: usize) -> anyhow::Result<Vec<u8>> {
    Ok(match codec {
        0 if bytes.len() > max => anyhow::bail!("a stored turn larger than {max} bytes"),
        0 => bytes,
        1 => zstd::bulk::decompress(&bytes, max)?,
        c => anyhow::bail!("stored turn with unknown codec {c}"),
    })
}

/// Stores turns in one transaction; a turn whose id is already stored for the org
/// is left as it was (a replayed write).
pub async fn insert(db: &Db, turns: &[Turn], now: i64, retention_ms: i64) -> anyhow::Result<()> {
    let mut tx = db.pool.begin().await?;
    for t in turns {
        sqlx::query(
            "INSERT INTO response_chains (org_id, chain_id, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (org_id, chain_id) DO UPDATE SET expires_at = excluded.expires_at",
        )
        .bind(&t.org_id)
        .bind(&t.chain_id)
        .bind(now.saturating_add(retention_ms))
        .execute(&mut *tx)
        .await?;
        let (codec, items) = encode(&t.items);
        sqlx::query(
            "INSERT INTO stored_responses \
             (org_id, id, chain_id, parent_id, model, status, codec, items, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (org_id, id) DO NOTHING",
        )
        .bind(&t.org_id)
        .bind(&t.id)
        .bind(&t.chain_id)
        .bind(&t.parent_id)
        .bind(&t.model)
        .bind(&t.status)
        .bind(codec)
        .bind(items)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        for (item_id, position) in &t.item_ids {
            sqlx::query(
                "INSERT INTO stored_items (org_id, item_id, response_id, chain_id, position) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (org_id, item_id) DO NOTHING",
            )
            .bind(&t.org_id)
            .bind(item_id)
            .bind(&t.id)
            .bind(&t.chain_id)
            .bind(position)
            .execute(&mut *tx)
            .await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

/// Stored items of the org by id (of chains not expired); ids not found are absent.
/// The turns read for them count against `max_bytes` as [`history`]'s do.
pub async fn items(
    db: &Db,
    org_id: &str,
    ids: &[String],
    now: i64,
    max_bytes: usize,
) -> anyhow::Result<std::collections::HashMap<String, Box<RawValue>>> {
    let mut out = std::collections::HashMap::new();
    let mut left = max_bytes;
    for id in ids {
        if out.contains_key(id) {
            continue;
        }
        let row = sqlx::query(
            "SELECT i.position, r.codec, r.items FROM stored_items i \
             JOIN stored_responses r ON r.org_id = i.org_id AND r.id = i.response_id \
             JOIN response_chains c ON c.org_id = i.org_id AND c.chain_id = i.chain_id \
             WHERE i.org_id = $1 AND i.item_id = $2 AND c.expires_at > $3",
        )
        .bind(org_id)
        .bind(id)
        .bind(now)
        .fetch_optional(&db.pool)
        .await?;
        let Some(row) = row else { continue };
        let position: i64 = row.try_get("position")?;
        let bytes = decode(row.try_get("codec")?, row.try_get("items")?, left)
            .map_err(|_| TooLarge(max_bytes))?;
        left = left.saturating_sub(bytes.len());
        let mut turn: Vec<Box<RawValue>> = serde_json::from_slice(&bytes)?;
        if let Ok(p) = usize::try_from(position) {
            if p < turn.len() {
                out.insert(id.clone(), turn.swap_remove(p));
            }
        }
    }
    Ok(out)
}

/// A stored conversation larger than a request may be: it is not rebuilt.
#[derive(Debug, thiserror::Error)]
#[error("the stored conversation is larger than {0} bytes")]
pub struct TooLarge(pub usize);

/// The conversation up to and including `id`, when the org has it stored, its
/// chain has not expired, and every earlier turn is still there. Its turns are
/// read one at a time, and counted as they are: past `max_bytes` (stored or
/// decompressed) the read stops with [`TooLarge`], so a long chain of large
/// turns is never all in memory.
pub async fn history(
    db: &Db,
    org_id: &str,
    id: &str,
    now: i64,
    max_bytes: usize,
) -> anyhow::Result<Option<History>> {
    let query = sqlx::query(
        "WITH RECURSIVE walk(id, parent_id, depth) AS ( \
           SELECT id, parent_id, 0 FROM stored_responses WHERE org_id = $1 AND id = $2 \
           UNION ALL \
           SELECT r.id, r.parent_id, w.depth + 1 FROM stored_responses r \
             JOIN walk w ON r.org_id = $1 AND r.id = w.parent_id WHERE w.depth < $3 \
         ) \
         SELECT r.parent_id, r.chain_id, r.codec, r.items, c.expires_at \
         FROM walk w \
         JOIN stored_responses r ON r.org_id = $1 AND r.id = w.id \
         JOIN response_chains c ON c.org_id = r.org_id AND c.chain_id = r.chain_id \
         ORDER BY w.depth DESC",
    )
    .bind(org_id)
    .bind(id)
    .bind(MAX_DEPTH);
    let mut rows = query.fetch(&db.pool);
    let mut items = Vec::new();
    let mut left = max_bytes;
    let mut first = true;
    let mut newest: Option<(String, i64)> = None;
    while let Some(row) = futures_util::TryStreamExt::try_next(&mut rows).await? {
        if first {
            // The oldest turn starts the chain; a missing one was swept.
            let oldest_parent: Option<String> = row.try_get("parent_id")?;
            if oldest_parent.is_some() {
                return Ok(None);
            }
            first = false;
        }
        let codec: i64 = row.try_get("codec")?;
        let stored: Vec<u8> = row.try_get("items")?;
        let bytes = decode(codec, stored, left).map_err(|_| TooLarge(max_bytes))?;
        left = left.checked_sub(bytes.len()).ok_or(TooLarge(max_bytes))?;
        items.extend(serde_json::from_slice::<Vec<Box<RawValue>>>(&bytes)?);
        newest = Some((row.try_get("chain_id")?, row.try_get("expires_at")?));
    }
    let Some((chain_id, expires_at)) = newest else {
        return Ok(None);
    };
    if expires_at <= now {
        return Ok(None);
    }
    Ok(Some(History { chain_id, items }))
}

/// Deletes one stored turn of the org and its items; false when there was none.
/// A later turn of its chain can no longer be continued (its history has a gap).
pub async fn delete(db: &Db, org_id: &str, id: &str) -> anyhow::Result<bool> {
    let mut tx = db.pool.begin().await?;
    let gone = sqlx::query("DELETE FROM stored_responses WHERE org_id = $1 AND id = $2")
        .bind(org_id)
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    sqlx::query("DELETE FROM stored_items WHERE org_id = $1 AND response_id = $2")
        .bind(org_id)
        .bind(id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(gone > 0)
}

/// Removes expired chains and their turns, `batch` chains a statement; safe on
/// several instances at once (each statement removes what is expired when it runs).
pub async fn sweep(db: &Db, now: i64, batch: i64) -> anyhow::Result<u64> {
    let mut total = 0;
    loop {
        let chains = sqlx::query(
            "SELECT org_id, chain_id FROM response_chains WHERE expires_at <= $1 LIMIT $2",
        )
        .bind(now)
        .bind(batch)
        .fetch_all(&db.pool)
        .await?;
        for c in &chains {
            let (org, chain): (String, String) = (c.try_get("org_id")?, c.try_get("chain_id")?);
            let mut tx = db.pool.begin().await?;
            // Only while still expired: a turn stored meanwhile renewed it.
            let gone = sqlx::query(
                "DELETE FROM response_chains WHERE org_id = $1 AND chain_id = $2 AND expires_at <= $3",
            )
            .bind(&org)
            .bind(&chain)
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if gone > 0 {
                total +=
                    sqlx::query("DELETE FROM stored_responses WHERE org_id = $1 AND chain_id = $2")
                        .bind(&org)
                        .bind(&chain)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                sqlx::query("DELETE FROM stored_items WHERE org_id = $1 AND chain_id = $2")
                    .bind(&org)
                    .bind(&chain)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
        }
        if (chains.len() as i64) < batch {
            return Ok(total);
        }
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(org: &str, id: &str, parent: Option<&str>, chain: &str, text: &str) -> Turn {
        Turn {
            org_id: org.into(),
            id: id.into(),
            parent_id: parent.map(str::to_string),
            chain_id: chain.into(),
            model: "m".into(),
            status: "completed".into(),
            items: serde_json::to_vec(
                &serde_json::json!([{"type": "message", "role": "user", "content": text}]),
            )
            .unwrap(),
            item_ids: vec![(format!("msg_{id}"), 0)],
        }
    }

    const MB: usize = 1 << 20;

    #[tokio::test]
    async fn expired_chains_read_as_gone_and_the_sweep_removes_only_them() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::connect(&format!("sqlite://{}", dir.path().join("s.db").display()))
            .await
            .unwrap();
        db.migrate().await.unwrap();
        // Chain a (two turns) stored at 1000 with a 100 ms window; chain b at 1000
        // with a long one; a turn of another org with a's id.
        insert(&db, &[turn("o1", "a1", None, "a1", "one")], 1000, 100)
            .await
            .unwrap();
        insert(&db, &[turn("o1", "a2", Some("a1"), "a1", "two")], 1050, 100)
            .await
            .unwrap();
        insert(&db, &[turn("o1", "b1", None, "b1", "b")], 1000, 1_000_000)
            .await
            .unwrap();
        insert(
            &db,
            &[turn("o2", "a1", None, "a1", "other")],
            1000,
            1_000_000,
        )
        .await
        .unwrap();
        // The second turn renewed the chain: whole until 1150.
        let h = history(&db, "o1", "a2", 1100, MB).await.unwrap().unwrap();
        assert_eq!(h.items.len(), 2);
        assert_eq!(h.chain_id, "a1");
        // Past it: gone for reads before any sweep, for both turns.
        assert!(history(&db, "o1", "a2", 1200, MB).await.unwrap().is_none());
        assert!(history(&db, "o1", "a1", 1200, MB).await.unwrap().is_none());
        // A history larger than the bound is refused, not built.
        let e = history(&db, "o1", "a2", 1100, 10).await.unwrap_err();
        assert!(e.is::<TooLarge>(), "{e}");
        // Another org's id is never another's history.
        let other = history(&db, "o2", "a1", 1200, MB).await.unwrap().unwrap();
        assert!(other.items[0].get().contains("other"));
        // Items by id: the org's own, of chains not expired.
        let ids = ["msg_a2".to_string(), "msg_b1".to_string()];
        let found = items(&db, "o1", &ids, 1100, MB).await.unwrap();
        assert!(found["msg_a2"].get().contains("two"));
        assert!(found["msg_b1"].get().contains("\"b\""));
        let found = items(&db, "o1", &ids, 1200, MB).await.unwrap();
        assert_eq!(found.keys().collect::<Vec<_>>(), ["msg_b1"]);
        assert!(items(&db, "o2", &ids, 1100, MB).await.unwrap().is_empty());
        assert_eq!(sweep(&db, 1200, 1).await.unwrap(), 2);
        let left = sqlx::query("SELECT org_id, id FROM stored_responses ORDER BY org_id, id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
        let left: Vec<(String, String)> = left
            .iter()
            .map(|r| (r.get("org_id"), r.get("id")))
            .collect();
        assert_eq!(
            left,
            [
                ("o1".to_string(), "b1".to_string()),
                ("o2".into(), "a1".into())
            ]
        );
        // Their items went with them (L8 of the 2026-12-01 security review).
        let items_left: Vec<String> =
            sqlx::query("SELECT response_id FROM stored_items ORDER BY org_id, response_id")
                .fetch_all(&db.pool)
                .await
                .unwrap()
                .iter()
                .map(|r| r.get("response_id"))
                .collect();
        assert_eq!(items_left, ["b1", "a1"]);
        // One turn deleted, with its items; the other org's same id untouched.
        assert!(delete(&db, "o1", "b1").await.unwrap());
        assert!(!delete(&db, "o1", "b1").await.unwrap());
        let found = items(&db, "o1", &["msg_b1".to_string()], 1100, MB)
            .await
            .unwrap();
        assert!(found.is_empty());
        assert!(history(&db, "o2", "a1", 1200, MB).await.unwrap().is_some());
    }

    #[test]
    fn large_turns_are_compressed_and_read_back_whole() {
        let small = br#"[{"type":"message","role":"user","content":"hi"}]"#.to_vec();
        assert_eq!(encode(&small), (0, small.clone()));
        let text = "the same words again and again ".repeat(100);
        let large = serde_json::to_vec(
            &serde_json::json!([{"type":"message","role":"user","content": text}]),
        )
        .unwrap();
        let (codec, bytes) = encode(&large);
        assert_eq!(codec, 1);
        assert!(
            bytes.len() * 4 < large.len(),
            "{} vs {}",
            bytes.len(),
            large.len()
        );
        assert_eq!(decode(codec, bytes.clone(), large.len()).unwrap(), large);
        // Past the bound zstd stops: no allocation the size of the content.
        assert!(decode(codec, bytes, large.len() - 1).is_err());
    }
}
