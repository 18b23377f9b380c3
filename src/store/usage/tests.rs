use super::*;

/// A fresh database (`db::test_database_url`), with one org.
async fn db() -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = crate::store::db::test_database_url(dir.path()).await;
    let db = Store::open(Db::connect(&url).await.unwrap(), &url).await;
    db.migrate().await.unwrap();
    sqlx::query(
        "INSERT INTO orgs (id, name, balance_micro_usd, created_at, updated_at) \
         VALUES ('org_1', 'acme', 1000000, 0, 0)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    (db, dir)
}

fn event(id: &str, cost: i64) -> UsageEvent {
    UsageEvent {
        id: id.into(),
        org_id: "org_1".into(),
        key_id: "key_1".into(),
        route: "chat".into(),
        model: "m".into(),
        lane: "platform_funded".into(),
        cost_micro_usd: cost,
        status: 200,
        attempts: "openai:ok".into(),
        ..UsageEvent::default()
    }
}

async fn state(db: &Db) -> (i64, i64) {
    let n: i64 = sqlx::query("SELECT COUNT(*) AS n FROM usage_events")
        .fetch_one(&db.pool)
        .await
        .unwrap()
        .get("n");
    let bal: i64 = sqlx::query("SELECT balance_micro_usd AS b FROM orgs WHERE id = 'org_1'")
        .fetch_one(&db.pool)
        .await
        .unwrap()
        .get("b");
    (n, bal)
}

#[tokio::test]
async fn a_batch_written_twice_is_stored_and_charged_once() {
    let (db, _dir) = db().await;
    let tally = Unwritten::default();
    let batch = [event("ue_1", 300), event("ue_2", 200), event("ue_3", 0)];
    insert_fresh(&db, &batch, &tally).await.unwrap();
    assert!(
        insert_fresh(&db, &batch, &tally).await.is_err(),
        "stored ids fail a fresh write"
    );
    insert(&db, &batch, &tally).await.unwrap();
    assert_eq!(state(&db).await, (3, 1_000_000 - 500));
    // A batch partly stored already charges only its new rows, whichever way
    // the writer takes.
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("s.jsonl");
    let mixed = [event("ue_2", 200), event("ue_4", 40)];
    assert!(write_or_spool(&db, &spool, &mixed, &tally).await);
    assert_eq!(state(&db).await, (4, 1_000_000 - 540));
    assert!(!spool.exists());
}

#[tokio::test]
async fn every_field_is_stored_in_its_column() {
    let (db, _dir) = db().await;
    let tally = Unwritten::default();
    let full = UsageEvent {
        rung: Some("openai/gpt \"x\"".into()),
        lane: "pass_through".into(),
        input_tokens: 11,
        cached_tokens: 3,
        cache_write_tokens: 2,
        output_tokens: 7,
        reasoning_tokens: 5,
        web_search_requests: 1,
        status: 502,
        error_class: Some("upstream_error".into()),
        incomplete: true,
        // COPY's text format escapes these.
        attempts: "openai:502,anthropic:ok — é\t\\N\r\n\\".into(),
        empty_attempts: 1,
        latency_ms: 1234,
        free: true,
        weighted_tokens: 13,
        list_micro_usd: 77,
        at_ms: 1_700_000_000_123,
        batch: true,
        batch_line: Some("batch_9:3".into()),
        ..event("ue_full", 60)
    };
    // A count past what the column holds is saturated, not wrapped.
    let huge = UsageEvent {
        input_tokens: u64::MAX,
        ..event("ue_huge", 1)
    };
    let bare = event("ue_bare", 0);
    for (fresh, batch) in [(true, vec![full, huge]), (false, vec![bare])] {
        if fresh {
            insert_fresh(&db, &batch, &tally).await.unwrap();
        } else {
            insert(&db, &batch, &tally).await.unwrap();
        }
    }
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM usage_events WHERE id = 'ue_full'"
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let text = |c: &str| row.get::<Option<String>, _>(c);
    let int = |c: &str| row.get::<i64, _>(c);
    assert_eq!(
        [text("org_id"), text("key_id"), text("route"), text("model")],
        [
            Some("org_1".into()),
            Some("key_1".into()),
            Some("chat".into()),
            Some("m".into())
        ]
    );
    assert_eq!(text("rung").as_deref(), Some("openai/gpt \"x\""));
    assert_eq!(text("lane").as_deref(), Some("pass_through"));
    assert_eq!(text("error_class").as_deref(), Some("upstream_error"));
    assert_eq!(
        text("attempts").as_deref(),
        Some("openai:502,anthropic:ok — é\t\\N\r\n\\")
    );
    assert_eq!(text("batch_line").as_deref(), Some("batch_9:3"));
    let ints: Vec<i64> = [
        "input_tokens",
        "cached_tokens",
        "cache_write_tokens",
        "output_tokens",
        "reasoning_tokens",
        "web_search_requests",
        "cost_micro_usd",
        "status",
        "incomplete",
        "empty_attempts",
        "latency_ms",
        "free",
        "weighted_tokens",
        "list_micro_usd",
        "created_at",
        "batch",
    ]
    .into_iter()
    .map(int)
    .collect();
    assert_eq!(
        ints,
        [
            11,
            3,
            2,
            7,
            5,
            1,
            60,
            502,
            1,
            1,
            1234,
            1,
            13,
            77,
            1_700_000_000_123,
            1
        ]
    );
    let huge: i64 = sqlx::query("SELECT input_tokens FROM usage_events WHERE id = 'ue_huge'")
        .fetch_one(&db.pool)
        .await
        .unwrap()
        .get(0);
    assert_eq!(huge, i64::MAX);
    // An event with no end time is stamped when written; a missing rung is NULL.
    let bare = sqlx::query("SELECT rung, created_at FROM usage_events WHERE id = 'ue_bare'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(bare.get::<Option<String>, _>(0), None);
    assert!(bare.get::<i64, _>(1) > 1_700_000_000_123);
    // Only the platform-funded event drew from the balance.
    assert_eq!(state(&db).await, (3, 1_000_000 - 1));
}

#[tokio::test]
async fn a_batch_line_run_twice_is_stored_and_charged_once() {
    let (db, dir) = db().await;
    let tally = Unwritten::default();
    let spool = dir.path().join("s.jsonl");
    let line = |id: &str, cost| UsageEvent {
        batch: true,
        batch_line: Some("batch_1:7".into()),
        ..event(id, cost)
    };
    // The first run's event, then the second run's (another id, another
    // count), in a later write and within one write.
    assert!(write_or_spool(&db, &spool, &[line("ue_1", 300)], &tally).await);
    assert!(write_or_spool(&db, &spool, &[line("ue_2", 310), event("ue_3", 5)], &tally).await);
    assert!(write_or_spool(&db, &spool, &[line("ue_4", 1), line("ue_5", 2)], &tally).await);
    assert_eq!(state(&db).await, (2, 1_000_000 - 305));
    // Another line of the same batch is its own.
    let other = UsageEvent {
        batch_line: Some("batch_1:8".into()),
        ..line("ue_6", 40)
    };
    assert!(write_or_spool(&db, &spool, &[other], &tally).await);
    assert_eq!(state(&db).await, (3, 1_000_000 - 345));
    assert!(!spool.exists());
}

#[test]
fn batches_split_into_few_statement_sizes() {
    let evs: Vec<UsageEvent> = (0..173).map(|i| event(&format!("ue_{i}"), 1)).collect();
    let sizes: Vec<usize> = chunks(Engine::Sqlite, &evs)
        .iter()
        .map(|c| c.len())
        .collect();
    assert_eq!(sizes, vec![128, 32, 8, 4, 1]);
    assert_eq!(sizes.iter().sum::<usize>(), 173);
}

#[tokio::test]
async fn events_the_database_refuses_are_spooled_and_replayed_exactly_once() {
    let (db, dir) = db().await;
    let tally = Unwritten::default();
    let spool = dir.path().join("spool/usage.jsonl");
    sqlx::query("ALTER TABLE usage_events RENAME TO usage_off")
        .execute(&db.pool)
        .await
        .unwrap();
    write_or_spool(&db, &spool, &[event("ue_a", 70), event("ue_b", 30)], &tally).await;
    let text = std::fs::read_to_string(&spool).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");
    // Still down: the spool stays.
    replay(&db, &spool, &tally).await;
    assert!(spool.exists());
    sqlx::query("ALTER TABLE usage_off RENAME TO usage_events")
        .execute(&db.pool)
        .await
        .unwrap();
    replay(&db, &spool, &tally).await;
    assert!(!spool.exists());
    assert_eq!(state(&db).await, (2, 1_000_000 - 100));
    // A spool left behind after a crash mid-replay charges nothing twice.
    append_spool(&spool, &[event("ue_a", 70)]).unwrap();
    replay(&db, &spool, &tally).await;
    assert_eq!(state(&db).await, (2, 1_000_000 - 100));
}

async fn unwritten(t: &Unwritten) -> i64 {
    let (_, _, n) = t
        .read_with("org_1", || async { anyhow::Ok((0, 0)) })
        .await
        .unwrap();
    n
}

#[tokio::test]
async fn charges_count_as_unwritten_until_their_rows_are_stored() {
    let (db, dir) = db().await;
    let spool = dir.path().join("spool.jsonl");
    let sink = UsageSink::default();
    sink.record(event("", 70));
    sink.record(UsageEvent {
        lane: "pass_through".into(),
        ..event("", 500)
    });
    assert_eq!(
        unwritten(&sink.unwritten).await,
        70,
        "platform charges only"
    );
    // The database refuses: spooled, still unwritten.
    sqlx::query("ALTER TABLE usage_events RENAME TO usage_off")
        .execute(&db.pool)
        .await
        .unwrap();
    let (batch, _) = sink.take();
    assert!(
        batch.iter().all(|e| e.id.starts_with("ue_")),
        "ids given on record"
    );
    assert!(write_or_spool(&db, &spool, &batch, &sink.unwritten).await);
    assert_eq!(unwritten(&sink.unwritten).await, 70);
    // A new process finds the spool unwritten too.
    let next = Unwritten::default();
    next.adjust(&read_spool(&spool), 1);
    assert_eq!(unwritten(&next).await, 70);
    sqlx::query("ALTER TABLE usage_off RENAME TO usage_events")
        .execute(&db.pool)
        .await
        .unwrap();
    assert!(replay(&db, &spool, &next).await);
    assert_eq!(unwritten(&next).await, 0);
    assert_eq!(state(&db).await, (2, 1_000_000 - 70));
}

#[tokio::test]
async fn a_process_that_dies_after_recording_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("usage-spool.jsonl");
    // A process records two events, then dies before its writer took them.
    let sink = UsageSink::default();
    sink.pending.lock().unwrap().journal = Some(Journal::open(dir.path(), "inst_dead").unwrap());
    for cost in [70, 30] {
        sink.record(UsageEvent {
            org_id: "org_1".into(),
            lane: "platform_funded".into(),
            cost_micro_usd: cost,
            ..UsageEvent::default()
        });
    }
    drop(sink);
    // The next start takes its journal over into the spool, ids and all.
    adopt_orphans(&spool);
    let events = read_spool(&spool);
    assert_eq!(events.iter().map(|e| e.cost_micro_usd).sum::<i64>(), 100);
    assert!(events.iter().all(|e| e.id.starts_with("ue_")));
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("usage-journal.")
        })
        .collect();
    assert!(left.is_empty(), "the segment went once spooled");
}
