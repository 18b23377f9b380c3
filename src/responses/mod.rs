//! The responses store: what `store` keeps and `previous_response_id` continues,
//! on any instance over the same database.
//!
//! The flow reaches this room through the hook seam ([`hook::Store`]), which
//! calls [`Keeper`] twice: `begin` before a responses request is planned (it rebuilds the conversation a
//! `previous_response_id` names and puts it in front of the request's own input, so
//! every rung of every maker gets the whole history and upstream stores nothing),
//! and `finish` once the answer is out (it queues the turn for the writer; the
//! client's last byte never waits for the database).
//!
//! Bounds: a turn is written within milliseconds of its answer by one writer task,
//! in batches; while the database is away the writer retries and the queue holds at
//! most `QUEUE` turns (past it a turn is not kept, and a warning says so); a crash
//! loses the turns answered but not yet written (normally the last one or none). A miss (on this instance: a turn
//! whose answer went out a moment before its turn was queued; on another: one
//! not written yet) is read again after 50, 150 and 300 ms before the request is
//! answered `previous_response_not_found` or an item reference refused.

pub mod hook;
pub mod store;

pub use store::History;

use crate::store::{now_ms, Db};
use serde_json::value::RawValue;
use sluice_filters::inbound::history::{self, Replayed, TurnAsk};
use sluice_filters::json::Member;
use sluice_filters::{ApiError, ErrorCode};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// Turns waiting for the writer, at most.
const QUEUE: usize = 10_000;
/// Turns one transaction writes, at most.
const BATCH: usize = 64;
/// A miss is read again after each of these waits (another instance's writer may
/// not have written the turn yet).
const MISS_WAITS: [Duration; 3] = [
    Duration::from_millis(50),
    Duration::from_millis(150),
    Duration::from_millis(300),
];
/// The longest a history read may take before the request is refused (503).
const READ_TIMEOUT: Duration = Duration::from_secs(2);
const SWEEP_EVERY: Duration = Duration::from_secs(60);
const SWEEP_BATCH: i64 = 500;

/// What a responses request asked of the store, carried from `begin` to `finish`.
#[derive(Debug, Default)]
pub struct Keeping {
    /// The response this turn continues, and the chain it belongs to.
    parent: Option<(String, String)>,
    /// This turn's own input items (not the history).
    input: Vec<Box<RawValue>>,
}

/// What `begin` decided.
#[derive(Debug, Default)]
pub struct Begun {
    /// The body to serve, when a history was put in front of the client's input.
    pub body: Option<Vec<u8>>,
    /// Whether (and how) to keep the answer.
    pub keeping: Option<Keeping>,
    /// Hidden reasoning the client replayed without its content could not be
    /// completed and was removed.
    pub repaired: bool,
}

/// The store's handle: the database, the retention window, the writer's queue and
/// the turns queued but not written yet.
pub struct Keeper {
    db: Db,
    retention_ms: i64,
    /// The largest conversation rebuilt, stored bytes and decompressed.
    max_bytes: usize,
    tx: mpsc::Sender<store::Turn>,
    rx: Mutex<Option<mpsc::Receiver<store::Turn>>>,
    /// Queued turns by (org, id), until written: read-your-writes on this instance.
    pending: Arc<Mutex<HashMap<(String, String), store::Turn>>>,
}

fn not_found(message: &'static str) -> ApiError {
    ApiError::new(ErrorCode::PreviousResponseNotFound, message).param("previous_response_id")
}

impl Keeper {
    /// `max_bytes`: the largest conversation rebuilt (`[limits] max_request_bytes`:
    /// what a client could have sent itself).
    pub fn new(db: Db, retention: Duration, max_bytes: usize) -> Keeper {
        let (tx, rx) = mpsc::channel(QUEUE);
        Keeper {
            db,
            max_bytes,
            retention_ms: i64::try_from(retention.as_millis()).unwrap_or(i64::MAX),
            tx,
            rx: Mutex::new(Some(rx)),
            pending: Arc::default(),
        }
    }

    /// Before planning: rebuilds the conversation `previous_response_id` names and
    /// decides whether this turn will be kept. `capture` is the org's prompt
    /// capture: while it is off nothing is kept or continued.
    pub async fn begin(
        &self,
        org_id: &str,
        capture: bool,
        members: &[Member<'_>],
    ) -> Result<Begun, ApiError> {
        let TurnAsk { store, previous } = history::turn_ask(members);
        let keep = store && capture;
        let mut begun = Begun::default();
        // The request's own items, when the store keeps them or must complete them.
        let mut own = None;
        let replayed = match members.iter().rev().find(|(k, _)| k == "input") {
            Some((_, v)) if v.get().contains("item_reference") || v.get().contains("reasoning") => {
                let items = history::input_items(members).unwrap_or_default();
                let found = history::needs_store(&items);
                own = Some(items);
                found
            }
            _ => Vec::new(),
        };
        if !replayed.is_empty() {
            let items = own.take().unwrap_or_default();
            let (items, repaired) = self.complete(org_id, capture, items, &replayed).await?;
            begun.repaired = repaired;
            own = Some(items);
        }
        let mut parent = None;
        if let Some(prev) = previous {
            if !capture {
                return Err(not_found(
                    "Prompt capture is off for this organization, so no response is stored to continue from; send the full conversation as `input`.",
                ));
            }
            let Some(h) = self.history(org_id, &prev).await? else {
                return Err(not_found(
                    "The previous response was not found (unknown, expired, of another organization, or not stored); send the full conversation as `input`.",
                ));
            };
            let items = own
                .take()
                .or_else(|| history::input_items(members))
                .unwrap_or_default();
            begun.body = Some(history::with_history(members, &h.items, &items));
            own = Some(items);
            parent = Some((prev, h.chain_id));
        } else if !replayed.is_empty() {
            let items = own.as_deref().unwrap_or_default();
            begun.body = Some(history::with_history(members, &[], items));
        }
        if keep {
            begun.keeping = Some(Keeping {
                parent,
                input: own
                    .or_else(|| history::input_items(members))
                    .unwrap_or_default(),
            });
        }
        Ok(begun)
    }

    /// Completes the items only the store can: an `item_reference` becomes the
    /// stored item (400 when there is none, naming `input[N].id`); a reasoning item
    /// sent back without its encrypted content gets it back from the store, or is
    /// removed (`true`: hidden reasoning was lost, which the answer says).
    async fn complete(
        &self,
        org_id: &str,
        capture: bool,
        mut items: Vec<Box<RawValue>>,
        replayed: &[(usize, Replayed)],
    ) -> Result<(Vec<Box<RawValue>>, bool), ApiError> {
        let ids: Vec<String> = replayed
            .iter()
            .map(|(_, r)| match r {
                Replayed::Reference(id) | Replayed::BareReasoning(id) => id.clone(),
            })
            .collect();
        let mut found = if capture {
            self.items(org_id, &ids).await?
        } else {
            HashMap::new()
        };
        let mut drop = Vec::new();
        for (i, r) in replayed {
            match r {
                Replayed::Reference(id) => match found.remove(id) {
                    Some(item) => items[*i] = item,
                    None => {
                        return Err(ApiError::new(
                            ErrorCode::InvalidParameter,
                            format!(
                                "No stored item {id:?} for this organization (unknown, expired, or of a response that was not stored); send the item itself."
                            ),
                        )
                        .param(format!("input[{i}].id")))
                    }
                },
                Replayed::BareReasoning(id) => match found.remove(id) {
                    Some(item) if history::has_encrypted_content(&item) => items[*i] = item,
                    _ => drop.push(*i),
                },
            }
        }
        let repaired = !drop.is_empty();
        for i in drop.into_iter().rev() {
            items.remove(i);
        }
        Ok((items, repaired))
    }

    /// Items of the org's turns queued here (not written yet), by id.
    fn pending_items(
        &self,
        org_id: &str,
        ids: &[String],
        found: &mut HashMap<String, Box<RawValue>>,
    ) {
        let pending = self.lock_pending();
        for t in pending.values().filter(|t| t.org_id == org_id) {
            for (id, pos) in &t.item_ids {
                if !ids.contains(id) || found.contains_key(id) {
                    continue;
                }
                let items: Vec<Box<RawValue>> =
                    serde_json::from_slice(&t.items).unwrap_or_default();
                if let Some(item) = usize::try_from(*pos)
                    .ok()
                    .and_then(|p| items.into_iter().nth(p))
                {
                    found.insert(id.clone(), item);
                }
            }
        }
    }

    /// Stored items of the org by id: queued ones here first, then the database;
    /// a miss is read again after short waits (the turn that holds the item may
    /// still be on its way: queued here a moment after its answer went out, or
    /// written by another instance).
    async fn items(
        &self,
        org_id: &str,
        ids: &[String],
    ) -> Result<HashMap<String, Box<RawValue>>, ApiError> {
        let mut found = HashMap::new();
        let mut waits = MISS_WAITS.iter();
        loop {
            self.pending_items(org_id, ids, &mut found);
            let rest: Vec<String> = ids
                .iter()
                .filter(|i| !found.contains_key(*i))
                .cloned()
                .collect();
            if rest.is_empty() {
                return Ok(found);
            }
            let read = tokio::time::timeout(
                READ_TIMEOUT,
                store::items(&self.db, org_id, &rest, now_ms(), self.max_bytes),
            );
            match read.await {
                Ok(Ok(more)) => found.extend(more),
                Ok(Err(e)) if e.is::<store::TooLarge>() => return Err(too_large(self.max_bytes)),
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "responses store read failed");
                    return Err(unavailable());
                }
                Err(_) => return Err(unavailable()),
            }
            if found.len() == ids.len() {
                return Ok(found);
            }
            match waits.next() {
                Some(d) => tokio::time::sleep(*d).await,
                None => return Ok(found),
            }
        }
    }

    /// After the answer went out: queues the turn for the writer. `answer` is what
    /// the client received (a stream's frames in order).
    pub fn finish(
        &self,
        org_id: &str,
        model: &str,
        keeping: Keeping,
        answer: &[u8],
        streamed: bool,
    ) {
        let Some(done) =
            history::final_response(answer, streamed).and_then(|r| history::answered(&r))
        else {
            return;
        };
        let mut items: Vec<&RawValue> = keeping.input.iter().map(AsRef::as_ref).collect();
        let mut item_ids = Vec::new();
        let output: Vec<Box<RawValue>> = done
            .output
            .iter()
            .filter_map(|(id, v)| RawValue::from_string(v.to_string()).ok().map(|r| (id, r)))
            .enumerate()
            .map(|(n, (id, r))| {
                if let Some(id) = id {
                    item_ids.push((id.clone(), (keeping.input.len() + n) as i64));
                }
                r
            })
            .collect();
        items.extend(output.iter().map(AsRef::as_ref));
        let Ok(items) = serde_json::to_vec(&items) else {
            return;
        };
        let (parent_id, chain_id) = match keeping.parent {
            Some((p, c)) => (Some(p), c),
            None => (None, done.id.clone()),
        };
        let turn = store::Turn {
            org_id: org_id.to_string(),
            id: done.id,
            parent_id,
            chain_id,
            model: model.to_string(),
            status: done.status,
            items,
            item_ids,
        };
        let key = (turn.org_id.clone(), turn.id.clone());
        self.lock_pending().insert(key.clone(), turn.clone());
        if self.tx.try_send(turn).is_err() {
            self.lock_pending().remove(&key);
            tracing::warn!("responses store queue full: a turn is not kept");
        }
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), store::Turn>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The conversation up to `id`: turns still queued here, then the database
    /// (read again after short waits when it has not got the id yet).
    async fn history(&self, org_id: &str, id: &str) -> Result<Option<History>, ApiError> {
        let mut waits = MISS_WAITS.iter();
        loop {
            if let Some(h) = self.history_now(org_id, id).await? {
                return Ok(Some(h));
            }
            // Not there yet: the turn may be queued here a moment after its answer
            // went out, or being written by another instance.
            match waits.next() {
                Some(d) => tokio::time::sleep(*d).await,
                None => return Ok(None),
            }
        }
    }

    /// The conversation up to `id` as this instance's queue and the database have
    /// it now.
    async fn history_now(&self, org_id: &str, id: &str) -> Result<Option<History>, ApiError> {
        // Turns of this instance not written yet, newest first.
        let mut queued: Vec<store::Turn> = Vec::new();
        let mut at = id.to_string();
        loop {
            let t = self
                .lock_pending()
                .get(&(org_id.to_string(), at.clone()))
                .cloned();
            match t {
                Some(t) => {
                    let parent = t.parent_id.clone();
                    queued.push(t);
                    match parent {
                        Some(p) => at = p,
                        None => break,
                    }
                }
                None => break,
            }
        }
        let rest = match queued.last() {
            // The oldest queued turn starts the chain: nothing to read.
            Some(t) if t.parent_id.is_none() => Some(History {
                chain_id: t.chain_id.clone(),
                items: Vec::new(),
            }),
            _ => self.read(org_id, &at).await?,
        };
        let Some(mut h) = rest else {
            return Ok(None);
        };
        let read: usize = h.items.iter().map(|i| i.get().len()).sum();
        let queued_bytes: usize = queued.iter().map(|t| t.items.len()).sum();
        if read + queued_bytes > self.max_bytes {
            return Err(too_large(self.max_bytes));
        }
        for t in queued.iter().rev() {
            let items: Vec<Box<RawValue>> =
                serde_json::from_slice(&t.items).map_err(|_| ApiError::internal())?;
            h.items.extend(items);
        }
        if let Some(t) = queued.first() {
            h.chain_id = t.chain_id.clone();
        }
        Ok(Some(h))
    }

    /// Reads a history from the database, within the read bound.
    async fn read(&self, org_id: &str, id: &str) -> Result<Option<History>, ApiError> {
        let read = tokio::time::timeout(
            READ_TIMEOUT,
            store::history(&self.db, org_id, id, now_ms(), self.max_bytes),
        )
        .await;
        match read {
            Ok(Ok(h)) => Ok(h),
            Ok(Err(e)) if e.is::<store::TooLarge>() => Err(too_large(self.max_bytes)),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "responses store read failed");
                Err(unavailable())
            }
            Err(_) => {
                tracing::error!("responses store read timed out");
                Err(unavailable())
            }
        }
    }

    /// `DELETE /v1/responses/{id}`: removes the org's stored turn, queued or
    /// written; false when it has none.
    pub async fn delete(&self, org_id: &str, id: &str) -> Result<bool, ApiError> {
        // A queued turn is dropped from the queue's record: the writer skips it.
        let queued = self
            .lock_pending()
            .remove(&(org_id.to_string(), id.to_string()))
            .is_some();
        let stored = tokio::time::timeout(READ_TIMEOUT, store::delete(&self.db, org_id, id)).await;
        match stored {
            Ok(Ok(found)) => Ok(found || queued),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "responses store delete failed");
                Err(unavailable())
            }
            Err(_) => Err(unavailable()),
        }
    }

    /// Starts the writer and the expiry sweep (called once, by `server.rs`).
    pub fn spawn_jobs(&self) {
        let Some(mut rx) = self.rx.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let (db, retention, pending) = (self.db.clone(), self.retention_ms, self.pending.clone());
        tokio::spawn(async move {
            let mut batch = Vec::with_capacity(BATCH);
            while rx.recv_many(&mut batch, BATCH).await > 0 {
                // A turn deleted while it waited is not written.
                {
                    let p = pending.lock().unwrap_or_else(|e| e.into_inner());
                    batch.retain(|t| p.contains_key(&(t.org_id.clone(), t.id.clone())));
                }
                // A failed write (the database away) is tried again until it lands;
                // meanwhile the queue fills, and past `QUEUE` new turns are not kept.
                let mut wait = Duration::from_millis(100);
                while let Err(e) = store::insert(&db, &batch, now_ms(), retention).await {
                    tracing::warn!(error = %e, "responses store write failed; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
                let mut p = pending.lock().unwrap_or_else(|e| e.into_inner());
                for t in batch.drain(..) {
                    p.remove(&(t.org_id, t.id));
                }
            }
        });
        let db = self.db.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = store::sweep(&db, now_ms(), SWEEP_BATCH).await {
                    tracing::warn!(error = %e, "responses store sweep failed");
                }
            }
        });
    }
}

fn too_large(max: usize) -> ApiError {
    ApiError::invalid_parameter(
        "previous_response_id",
        format!(
            "The conversation stored up to previous_response_id is larger than {max} bytes ([limits] max_request_bytes), more than a request may carry; start a new conversation or send a shorter one as `input`."
        ),
    )
}

fn unavailable() -> ApiError {
    ApiError::new(
        ErrorCode::UnavailableRoute,
        "The responses store is unavailable; retry with backoff, or send the full conversation as `input`.",
    )
    .with_status(503)
}
