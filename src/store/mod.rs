//! State: the durable database (sqlx over SQLite or PostgreSQL) and the fast
//! counters (Redis or in-process).

pub mod changes;
mod checkpoint;
pub mod counters;
pub mod db;
pub mod instances;
pub mod journal;
pub mod objects;
pub mod quota;
pub mod usage;

pub use counters::Counters;
pub use db::Db;

/// Runs `step` on the current runtime for a poller that keeps an in-process
/// snapshot in step with the database: every `period`, or, while the change feed
/// is live, when it says `topic`'s tables changed (and every
/// [`changes::BACKSTOP`]). A failed step is logged and the snapshot keeps serving
/// until the next one succeeds.
pub fn spawn_poll<F, Fut>(
    period: std::time::Duration,
    wake: (&std::sync::Arc<changes::Feed>, changes::Topic),
    what: &'static str,
    mut step: F,
) where
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let (feed, topic) = (std::sync::Arc::clone(wake.0), wake.1);
    tokio::spawn(async move {
        let mut last = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = tokio::time::sleep(feed.next_look(period)) => {}
                // A burst of writes costs at most one look per gap.
                () = feed.changed(topic) => tokio::time::sleep_until(last + changes::MIN_GAP).await,
            }
            if let Err(e) = crate::metrics::global().db(what, step()).await {
                tracing::warn!(error = %e, "{what} refresh failed; serving the last snapshot");
            }
            last = tokio::time::Instant::now();
        }
    });
}

/// Now, in Unix milliseconds: the time unit of every stored timestamp.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A random identifier with a readable prefix, e.g. `org_1f3a…` (96 random bits).
pub fn new_id(prefix: &str) -> String {
    let bytes: [u8; 12] = rand::random();
    format!("{prefix}_{}", hex::encode(bytes))
}

/// A time-ordered identifier (`ue_<ms hex><random hex>`): rows keyed by it append at
/// the end of the index instead of landing at random pages, which keeps high-rate
/// inserts (usage events) cheap.
pub fn new_ordered_id(prefix: &str) -> String {
    let bytes: [u8; 6] = rand::random();
    let mut tail = [0u8; 12];
    hex::encode_to_slice(bytes, &mut tail).expect("6 bytes fill 12");
    format!(
        "{prefix}_{:012x}{}",
        now_ms(),
        std::str::from_utf8(&tail).unwrap_or_default()
    )
}
