//! The responses store's cost on a continued turn: what `previous_response_id`
//! adds over a stateless call of the same size (the history read in one statement,
//! decompressed, and put in front of the input), for a 50-turn chain of 2 KB turns,
//! and what that chain costs on disk. SQLite always; PostgreSQL when
//! `SLUICE_BENCH_DATABASE_URL` names one. `cargo bench --bench responses_store`.
//! Prints p50 / p99 / mean per continued turn.

use serde_json::json;
use sluice::responses::store::{self, Turn};
use sluice::responses::Keeper;
use sluice::store::Db;
use std::time::{Duration, Instant};

const TURNS: usize = 50;
const RUNS: usize = 400;

/// A turn of about 2 KB: a user message and the assistant's answer, in words.
fn items(i: usize) -> Vec<u8> {
    let words = |seed: usize| {
        (0..140)
            .map(|w| {
                [
                    "alpha", "route", "gateway", "token", "stream", "answer", "cache",
                ][(w * 7 + seed) % 7]
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    serde_json::to_vec(&json!([
        {"type": "message", "role": "user", "content": format!("question {i}: {}", words(i))},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": format!("answer {i}: {}", words(i + 3))}]}
    ]))
    .unwrap()
}

async fn run(label: &str, db: Db) {
    db.migrate().await.unwrap();
    let org = format!("org_bench_{}", rand_suffix());
    let mut raw = 0usize;
    let mut parent: Option<String> = None;
    for i in 0..TURNS {
        let id = format!("resp_{org}_{i}");
        let t = Turn {
            org_id: org.clone(),
            id: id.clone(),
            parent_id: parent.clone(),
            chain_id: format!("resp_{org}_0"),
            model: "m".into(),
            status: "completed".into(),
            items: items(i),
            item_ids: vec![(format!("msg_{org}_{i}"), 1)],
        };
        raw += t.items.len();
        store::insert(&db, &[t], sluice::store::now_ms(), 86_400_000)
            .await
            .unwrap();
        parent = Some(id);
    }
    let stored: i64 = sqlx::query_scalar::<_, i64>(&format!(
        "SELECT CAST(SUM(LENGTH(items)) AS BIGINT) FROM stored_responses WHERE org_id = '{org}'"
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let keeper = Keeper::new(db, Duration::from_secs(86_400), 32 << 20);
    let body =
        json!({"model": "m", "input": "and now?", "previous_response_id": parent}).to_string();
    let mut times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let t = Instant::now();
        let members = sluice_filters::json::split_object(&body).unwrap();
        let begun = keeper.begin(&org, true, &members).await.unwrap();
        let merged = begun.body.unwrap();
        // The rebuilt body is split again before it is served.
        std::hint::black_box(
            sluice_filters::json::split_object(std::str::from_utf8(&merged).unwrap()).unwrap(),
        );
        times.push(t.elapsed());
    }
    times.sort();
    let mean = times.iter().sum::<Duration>() / RUNS as u32;
    println!(
        "{label}: continuing a {TURNS}-turn chain ({} KB of history): p50 {:?}  p99 {:?}  mean {:?}; on disk {} KB for {} KB of items ({:.1}x smaller)",
        raw / 1024,
        times[RUNS / 2],
        times[RUNS * 99 / 100],
        mean,
        stored / 1024,
        raw / 1024,
        raw as f64 / stored as f64
    );
}

fn rand_suffix() -> String {
    format!(
        "{:x}",
        Instant::now().elapsed().as_nanos() ^ std::process::id() as u128
    )
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("bench.db").display());
        run("SQLite", Db::connect(&url).await.unwrap()).await;
        if let Ok(url) = std::env::var("SLUICE_BENCH_DATABASE_URL") {
            run("PostgreSQL", Db::connect(&url).await.unwrap()).await;
        }
    });
}
