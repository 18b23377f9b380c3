//! The change feed: on PostgreSQL, triggers (migration 60) `NOTIFY` the
//! [`CHANNEL`] channel with a table's name when a table behind an in-process
//! snapshot changes, at its writer's commit, whoever the writer is (an instance,
//! the admin CLI, an operator's SQL). Every instance `LISTEN`s on a connection of
//! its own and wakes that snapshot's poller at once, so a key revoked through one
//! instance is refused by the others a few milliseconds later, not at their next
//! poll.
//!
//! While the feed is live a poller looks only every [`BACKSTOP`] (a notification
//! is lost if the listening connection drops silently; the backstop bounds how
//! stale a snapshot can then be). Without it (SQLite, whose writers share a file
//! on one machine, or while the listener reconnects) each poller keeps its own
//! period. At idle, the directory, catalog and routing pollers ask PostgreSQL
//! about 9 statements a second instead of about 20, per instance.
//! `sluice_change_feed_up` is 0 while a PostgreSQL instance's listener is down.

use super::db::Engine;
use sqlx::postgres::PgListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// The channel the triggers notify; the payload is the changed table's name.
pub const CHANNEL: &str = "sluice_changes";

/// How often a poller whose feed is live still looks: the longest a change can
/// wait when its notification was lost (with the look itself, under the
/// directory's "revoked everywhere within a second").
pub const BACKSTOP: Duration = Duration::from_millis(750);

/// The least time between one poller's looks, however often it is woken: a
/// burst of writes (keys minted in a loop) costs each instance at most 20 looks a
/// second per snapshot, and a change waits at most this long for its look.
pub const MIN_GAP: Duration = Duration::from_millis(50);

/// The bound of connecting the listener and subscribing it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The wait before connecting again after the listener failed.
const RETRY: Duration = Duration::from_secs(1);

/// A snapshot the feed wakes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topic {
    /// Keys and orgs (`accounts::Directory`).
    Directory = 0,
    /// Models and rung probes (`catalog::CatalogStore`).
    Catalog = 1,
    /// Provider connections and waterfalls (`byok::ByokStore`).
    Routing = 2,
}

const TOPICS: [Topic; 3] = [Topic::Directory, Topic::Catalog, Topic::Routing];

impl Topic {
    /// The snapshot a table belongs to (the triggers' payloads).
    pub fn of_table(table: &str) -> Option<Topic> {
        match table {
            "orgs" | "api_keys" => Some(Topic::Directory),
            "models" | "rung_probes" => Some(Topic::Catalog),
            "provider_connections" | "org_waterfalls" => Some(Topic::Routing),
            _ => None,
        }
    }
}

/// Wakes the snapshot pollers when their tables change (see the module's notes).
#[derive(Default)]
pub struct Feed {
    /// One per topic: `notify_one` keeps a permit when its poller is busy, so a
    /// change during a poll brings another poll right after it.
    wakes: [Notify; TOPICS.len()],
    live: AtomicBool,
}

impl Feed {
    /// Whether notifications are arriving (the listener is subscribed).
    pub fn live(&self) -> bool {
        self.live.load(Ordering::Relaxed)
    }

    /// Resolves when `topic`'s tables change (or may have: after a reconnect).
    pub async fn changed(&self, topic: Topic) {
        self.wakes[topic as usize].notified().await;
    }

    /// How long a poller waits for its next look unless woken: its own
    /// `period`, or the backstop while the feed is live.
    pub fn next_look(&self, period: Duration) -> Duration {
        if self.live() {
            period.max(BACKSTOP)
        } else {
            period
        }
    }

    fn wake(&self, topic: Topic) {
        self.wakes[topic as usize].notify_one();
    }

    fn set_live(&self, live: bool) {
        self.live.store(live, Ordering::Relaxed);
        crate::metrics::global().change_feed_up.set(live.into());
    }

    /// Listens for as long as the process runs, on PostgreSQL at `url` (`engine`
    /// says which database it names); on SQLite nothing listens and the pollers
    /// keep their own periods.
    pub fn spawn(self: &Arc<Self>, engine: Engine, url: &str) {
        if engine != Engine::Postgres {
            // Nothing to listen to, and nothing missing.
            crate::metrics::global().change_feed_up.set(1);
            return;
        }
        self.set_live(false);
        let (feed, url) = (Arc::clone(self), url.to_string());
        tokio::spawn(async move {
            loop {
                match subscribe(&url).await {
                    Ok(listener) => feed.relay(listener).await,
                    Err(e) => tracing::warn!(error = %e, "change feed not subscribed; polling"),
                }
                feed.set_live(false);
                tokio::time::sleep(RETRY).await;
            }
        });
    }

    /// Wakes each notified topic until the connection is lost.
    async fn relay(&self, mut listener: PgListener) {
        // Whatever changed while nothing listened is read now.
        self.set_live(true);
        TOPICS.iter().for_each(|t| self.wake(*t));
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) => {
                    if let Some(topic) = Topic::of_table(n.payload()) {
                        self.wake(topic);
                    }
                }
                // The connection dropped (notifications in between are lost):
                // subscribe afresh, then read everything again.
                Ok(None) => {
                    tracing::warn!("change feed connection lost; polling until it is back");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "change feed failed; polling until it is back");
                    return;
                }
            }
        }
    }
}

async fn subscribe(url: &str) -> anyhow::Result<PgListener> {
    let subscribing = async {
        let mut listener = PgListener::connect(url).await?;
        // A lost connection is reported (`Ok(None)`), not re-made behind our back.
        listener.eager_reconnect(false);
        listener.listen(CHANNEL).await?;
        anyhow::Ok(listener)
    };
    tokio::time::timeout(CONNECT_TIMEOUT, subscribing)
        .await
        .map_err(|_| anyhow::anyhow!("timed out"))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Db;

    /// Waits for `topic`'s wake, or fails the test naming what should have woken it.
    async fn woken(feed: &Feed, topic: Topic, by: &str) {
        tokio::time::timeout(Duration::from_secs(10), feed.changed(topic))
            .await
            .unwrap_or_else(|_| panic!("{by} did not wake {topic:?}"));
    }

    async fn exec(db: &Db, sql: &str) {
        sqlx::query(sql).execute(&db.pool).await.unwrap();
    }

    /// On PostgreSQL (the test command's second pass): another writer's commits
    /// wake the poller of the snapshot they touch, a balance debit wakes none, and
    /// a feed whose connection was cut subscribes again and has everything re-read.
    #[tokio::test]
    async fn on_postgresql_commits_wake_their_snapshot_and_a_cut_feed_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let url = crate::store::db::test_database_url(dir.path()).await;
        let db = Db::connect(&url).await.unwrap();
        if db.engine != Engine::Postgres {
            return;
        }
        db.migrate().await.unwrap();
        let feed = Arc::new(Feed::default());
        feed.spawn(db.engine, &url);
        // Subscribing wakes every poller once (what changed before is read).
        for topic in TOPICS {
            woken(&feed, topic, "subscribing").await;
        }
        assert!(feed.live());

        exec(
            &db,
            "INSERT INTO orgs (id, name, balance_micro_usd, created_at, updated_at) \
                   VALUES ('org_1', 'acme', 100, 0, 0)",
        )
        .await;
        woken(&feed, Topic::Directory, "a new org").await;
        exec(
            &db,
            "UPDATE orgs SET balance_micro_usd = balance_micro_usd - 1 WHERE id = 'org_1'",
        )
        .await;
        exec(
            &db,
            "INSERT INTO org_waterfalls (org_id, slug, chain, updated_at) \
                   VALUES ('org_1', 'm', '[]', 0)",
        )
        .await;
        woken(&feed, Topic::Routing, "a waterfall").await;
        // The debit's commit came first; had it notified, its wake would be waiting.
        let debit =
            tokio::time::timeout(Duration::from_millis(200), feed.changed(Topic::Directory));
        assert!(debit.await.is_err(), "a balance debit woke the directory");

        // The listening connection cut from the server's side.
        exec(
            &db,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                   WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()",
        )
        .await;
        for topic in TOPICS {
            woken(&feed, topic, "subscribing again").await;
        }
        exec(&db, "UPDATE orgs SET updated_at = 1 WHERE id = 'org_1'").await;
        woken(&feed, Topic::Directory, "an org's change after the cut").await;
    }

    #[test]
    fn each_snapshot_table_wakes_its_poller_and_no_other_table_does() {
        assert_eq!(Topic::of_table("api_keys"), Some(Topic::Directory));
        assert_eq!(Topic::of_table("orgs"), Some(Topic::Directory));
        assert_eq!(Topic::of_table("models"), Some(Topic::Catalog));
        assert_eq!(Topic::of_table("rung_probes"), Some(Topic::Catalog));
        assert_eq!(
            Topic::of_table("provider_connections"),
            Some(Topic::Routing)
        );
        assert_eq!(Topic::of_table("org_waterfalls"), Some(Topic::Routing));
        assert_eq!(Topic::of_table("usage_events"), None);
    }

    #[test]
    fn a_poller_slows_to_the_backstop_only_while_the_feed_is_live() {
        let feed = Feed::default();
        let fast = Duration::from_millis(250);
        assert_eq!(feed.next_look(fast), fast);
        feed.set_live(true);
        assert_eq!(feed.next_look(fast), BACKSTOP);
    }
}
