//! State: the durable database (sqlx over SQLite or PostgreSQL) and the fast
//! counters (Redis or in-process).

pub mod counters;
pub mod db;
pub mod usage;

pub use counters::Counters;
pub use db::Db;

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
    format!("{prefix}_{:012x}{}", now_ms(), hex::encode(bytes))
}
