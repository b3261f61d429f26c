//! A day's expiry with a month stored: how long the retention pass takes,
//! what it does to the hot paths' p99 while it runs, and what it leaves
//! behind (dead tuples on PostgreSQL, free pages on SQLite).
//!
//! `cargo bench -p longrun-cli --bench retention_load`
//! (`LONGRUN_RETENTION_STORE`: `postgres`, the default, or `sqlite`;
//! `LONGRUN_RETENTION_DAYS`, default 30; `LONGRUN_RETENTION_DAY`, the
//! operations of one day, default 100,000 — the width of the PostgreSQL
//! store's first history partition, so that the oldest day is exactly that
//! partition; ten million stored: `LONGRUN_RETENTION_DAYS=100` on
//! PostgreSQL, `LONGRUN_RETENTION_DAY=333334` on SQLite).
//!
//! The store is filled with SQL as thirty days of ended operations (each
//! with its idempotency record and three events; on PostgreSQL every later
//! day in a history partition of its own, as the store's upkeep would have
//! made them, and a week and a day of delivered webhooks, a day's worth
//! (`LONGRUN_RETENTION_DAY`) a real day, each with its attempt, every day
//! in a partition of its own (schema 19)), vacuumed and checkpointed. A
//! release `longrun serve` runs on it; the oldest day is then set to
//! expire in 20 s (and, on PostgreSQL, vacuumed again; the oldest day of
//! deliveries to be past the delivery retention then), and the server's
//! next retention pass (they run every 60 s) removes it. All along, 4
//! clients submit and 4 read one operation, each at most 200 requests a
//! second, every request labelled by what retention was doing when it
//! ended.

#[allow(dead_code)]
mod batches;
mod processes;
mod record;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use processes::{free_port, prepare, serve};
use record::Record;
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};

fn env_number(name: &str, default: i64) -> i64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn p99(samples: &mut [f64]) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(f64::total_cmp);
    samples[((samples.len() as f64 * 0.99).ceil() as usize).min(samples.len()) - 1]
}

async fn sql(db: &mut PgConnection, statement: &str) {
    sqlx::raw_sql(statement).execute(&mut *db).await.unwrap();
}

fn fill_sql(days: i64, day: i64, now_ms: i64) -> String {
    let n = days * day;
    let id = "'op_r' || lpad(i::text, 25, '0')";
    let at = format!("({now_ms} - ({n} - i) * 26)");
    let partitions = batches::history_partitions_sql(&(n + 1).to_string(), &day.to_string(), now_ms);
    format!(
        "INSERT INTO operations (id, tenant, kind, state, version, attempt, labels, result, idempotency_key,
                                 created_at, started_at, completed_at, updated_at, expires_at)
         SELECT {id}, 'bench', 'noop', 'succeeded', 3, 1, '{{}}', '{{\"ok\":true}}', 'r-' || i,
                {at}, {at} + 1, {at} + 2, {at} + 2, 4102444800000 FROM generate_series(1::BIGINT, {n}) AS g(i);
         INSERT INTO idempotency_keys (tenant, kind, key, fingerprint, operation_id, created_at)
         SELECT 'bench', 'noop', 'r-' || i, decode(md5(i::text) || md5(i::text), 'hex'), {id}, {at}
           FROM generate_series(1::BIGINT, {n}) AS g(i);
         {partitions}
         INSERT INTO operation_events (op_seq, version, type, state, at, data, snapshot)
         SELECT i, v.n, v.type, v.state, {at} + v.n, '{{}}', CASE WHEN v.n < 3 THEN '{{}}' END
           FROM generate_series(1::BIGINT, {n}) AS g(i),
                (SELECT 1 AS n, 'created' AS type, 'queued' AS state UNION ALL SELECT 2, 'started', 'running'
                 UNION ALL SELECT 3, 'succeeded', 'succeeded') v;"
    )
}

const DAY_MS: i64 = 86_400_000;

/// The name of the bench's deliveries partition of day `k` (0 the oldest).
fn delivery_day(k: i64) -> String {
    format!("bench{k}")
}

/// Eight real days of delivered webhooks before `now_ms`, `day` a day,
/// each with its attempt, each day in a partition of its own, named for
/// operations of the newest days (which retention keeps); the oldest
/// day's partition is not yet due (its `ends_at` is set later).
async fn fill_deliveries(db: &mut PgConnection, day: i64, now_ms: i64, ops: i64) {
    use longrun_core::{Id, IdKind};
    let bound = |ms: i64| Id::lowest_at(IdKind::Event, ms as u64).into_string();
    for k in 0..8 {
        let (start, end) = (now_ms - (8 - k) * DAY_MS, now_ms - (7 - k) * DAY_MS);
        let ends_at = if k == 0 { now_ms + DAY_MS } else { end };
        let name = delivery_day(k);
        sql(
            db,
            &format!(
                "CREATE TABLE webhook_deliveries_{name} PARTITION OF webhook_deliveries
                   FOR VALUES FROM ('{lo}') TO ('{hi}') WITH (autovacuum_vacuum_cost_delay = 10);
                 CREATE TABLE webhook_attempts_{name} PARTITION OF webhook_attempts
                   FOR VALUES FROM ('{lo}') TO ('{hi}') WITH (autovacuum_vacuum_cost_delay = 10);
                 INSERT INTO delivery_partitions (hi, lo, ends_at, name) VALUES ('{hi}', '{lo}', {ends_at}, '{name}');",
                lo = bound(start),
                hi = bound(end),
            ),
        )
        .await;
        let step = (end - start) / day;
        for chunk in (0..day).collect::<Vec<_>>().chunks(50_000) {
            let at: Vec<i64> = chunk.iter().map(|i| start + i * step).collect();
            let events: Vec<String> = at
                .iter()
                .map(|&ms| Id::generate_at(IdKind::Event, ms as u64).into_string())
                .collect();
            let ops: Vec<String> = chunk
                .iter()
                .map(|i| format!("op_r{:025}", ops - 8 * day + k * day + i + 1))
                .collect();
            sqlx::query(
                "WITH d AS (
                     INSERT INTO webhook_deliveries (event_id, operation_id, tenant, url, type, payload, created_at,
                                                     status, attempts)
                     SELECT e, o, 'bench', 'https://client.example/hook', 'operation.succeeded',
                            '{\"type\":\"operation.succeeded\",\"data\":{\"operation_id\":\"' || o || '\"}}', t,
                            'delivered', 1
                       FROM unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[]) AS u(e, o, t)
                     RETURNING event_id, operation_id, created_at)
                 INSERT INTO webhook_attempts (event_id, attempt, operation_id, type, at, status_code, latency_ms)
                 SELECT event_id, 1, operation_id, 'operation.succeeded', created_at + 40, 204, 40 FROM d",
            )
            .bind(&events)
            .bind(&ops)
            .bind(&at)
            .execute(&mut *db)
            .await
            .unwrap();
        }
    }
}

/// One `sleep` operation submitted with `key`; its representation.
async fn submit(http: &reqwest::Client, base: &str, token: &str, key: &str) -> Value {
    let answer = http
        .post(format!("{base}/v1/operations"))
        .bearer_auth(token)
        .header("idempotency-key", key)
        .json(&json!({"kind": "sleep", "input": {"duration_ms": 0}}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 202);
    answer.json().await.unwrap()
}

/// A release `longrun serve` on `store` (built-in workers on, `more`
/// arguments), its base URL, a client, and the id of the one operation the
/// load's readers poll.
async fn serve_watched(
    port: u16,
    store: &[String],
    client: &str,
    more: &[String],
) -> (tokio::process::Child, String, reqwest::Client, String) {
    let mut args = vec!["--builtin-workers=true".to_owned()];
    args.extend(more.iter().chain(store).cloned());
    let server = serve(port, &args).await;
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let watched = submit(&http, &base, client, "watched").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    (server, base, http, watched)
}

/// When a request ended, which path, and its time in milliseconds.
type Sample = (Instant, &'static str, f64);

/// What retention is doing, as a window sees it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Phase {
    Before,
    During,
    After,
}

fn main() {
    let days = env_number("LONGRUN_RETENTION_DAYS", 30);
    let day = env_number("LONGRUN_RETENTION_DAY", 100_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    match std::env::var("LONGRUN_RETENTION_STORE").as_deref() {
        Ok("sqlite") => runtime.block_on(sqlite_day(days, day)),
        Ok("postgres") | Err(_) => runtime.block_on(postgres_day(days, day)),
        Ok(other) => panic!("LONGRUN_RETENTION_STORE={other}: postgres or sqlite"),
    }
}

/// The load: 4 clients submit and 4 read `watched`, each paced at 200
/// requests a second, every request's end and time kept.
struct Load {
    stop: Arc<AtomicBool>,
    samples: Arc<std::sync::Mutex<Vec<Sample>>>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(http: &reqwest::Client, base: &str, client: &str, watched: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let samples: Arc<std::sync::Mutex<Vec<Sample>>> = Arc::default();
        let mut clients = Vec::new();
        for c in 0..8 {
            let (http, base, client, watched) = (http.clone(), base.to_owned(), client.to_owned(), watched.to_owned());
            let (stop, samples) = (stop.clone(), samples.clone());
            clients.push(tokio::spawn(async move {
                // Paced, 200 requests a second a client: the p99s are the
                // server's latency at a moderate load, not a saturated
                // machine's queue.
                let mut pace = tokio::time::interval(Duration::from_millis(5));
                pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    pace.tick().await;
                    let begun = Instant::now();
                    let what = if c < 4 {
                        n += 1;
                        submit(&http, &base, &client, &format!("load-{c}-{n}")).await;
                        "accept"
                    } else {
                        let answer = http
                            .get(format!("{base}/v1/operations/{watched}"))
                            .bearer_auth(&client)
                            .send()
                            .await
                            .unwrap();
                        assert_eq!(answer.status(), 200);
                        "GET"
                    };
                    let ms = begun.elapsed().as_secs_f64() * 1000.0;
                    samples.lock().unwrap().push((Instant::now(), what, ms));
                }
            }));
        }
        Self { stop, samples, clients }
    }

    async fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        for c in self.clients {
            c.await.unwrap();
        }
        std::mem::take(&mut *self.samples.lock().unwrap())
    }
}

/// The p99 of each path before, during and after the pass, as `phases`
/// (what was seen when) place each sample.
fn p99_rows(record: &mut Record, samples: &[Sample], phases: &[(Instant, Phase)]) {
    let phase_at = |at: Instant| {
        phases
            .iter()
            .take_while(|(t, _)| *t <= at)
            .last()
            .map_or(Phase::Before, |(_, p)| *p)
    };
    record.line("| p99 (requests), 4 clients of 200/s each | before the pass | during it | after it |");
    record.line("|---|---|---|---|");
    for what in ["accept", "GET"] {
        let mut by_phase = [Vec::new(), Vec::new(), Vec::new()];
        for (at, w, ms) in samples {
            if *w == what {
                by_phase[phase_at(*at) as usize].push(*ms);
            }
        }
        let counts: Vec<usize> = by_phase.iter().map(Vec::len).collect();
        let [b, d, a] = by_phase.map(|mut v| p99(&mut v));
        record.line(format!(
            "| {what} | {b:.1} ms ({}) | {d:.1} ms ({}) | {a:.1} ms ({}) |",
            counts[0], counts[1], counts[2]
        ));
    }
}

/// What retention was doing when, as the bench's looks at the store saw
/// it (every 100 ms).
struct Watch {
    phases: Vec<(Instant, Phase)>,
    deadline: Instant,
}

impl Watch {
    fn new() -> Self {
        Self {
            phases: Vec::new(),
            deadline: Instant::now() + Duration::from_secs(240),
        }
    }

    /// Notes `phase`, seen now.
    fn saw(&mut self, phase: Phase) -> Instant {
        let now = Instant::now();
        self.phases.push((now, phase));
        now
    }

    /// When a phase other than `Before` was first seen (`During`: the pass
    /// began; `After`: it ended).
    fn first(&self, past: Phase) -> Option<Instant> {
        self.phases.iter().find(|(_, p)| *p >= past).map(|(at, _)| *at)
    }

    /// The pass ended 10 s ago: the load's p99 after it is measured.
    fn settled(&self, now: Instant) -> bool {
        self.first(Phase::After)
            .is_some_and(|at| now.duration_since(at) > Duration::from_secs(10))
    }

    /// The record's line on the pass: `removed` what, in how long.
    fn pass_line(&self, removed: &str) -> String {
        match (self.first(Phase::During), self.first(Phase::After)) {
            (Some(a), Some(b)) => format!(
                "The pass removed {removed} in {:.1} s.",
                b.duration_since(a).as_secs_f64()
            ),
            _ => "The pass did not end within 240 s.".to_owned(),
        }
    }
}

async fn postgres_day(days: i64, day: i64) {
    let cluster = match longrun_store::pgtest::start_durable() {
        Ok(c) => c,
        Err(why) => {
            println!("PostgreSQL is not available here ({why}); nothing to measure");
            return;
        }
    };
    let url = cluster.database().await;
    let store = vec!["--database".to_owned(), url.clone()];
    let (client, _) = prepare(&store);
    let mut db = PgConnection::connect(&url).await.unwrap();
    let first_hi: i64 = sqlx::query_scalar("SELECT MAX(hi) FROM history_partitions")
        .fetch_one(&mut db)
        .await
        .unwrap();
    assert_eq!(first_hi, day + 1, "the first partition is one day wide");
    let now_ms = longrun_core::Clock::now(&longrun_core::SystemClock).0;
    let started = Instant::now();
    sql(&mut db, &fill_sql(days, day, now_ms)).await;
    fill_deliveries(&mut db, day, now_ms, days * day).await;
    sql(&mut db, "VACUUM ANALYZE").await;
    sql(&mut db, "CHECKPOINT").await;
    let mut record = Record::new("retention");
    record.line(format!(
        "PostgreSQL, {} ended operations stored ({days} days of {day}, 3 events and a key each) and {} delivered webhooks with their attempt (8 days of {day}), filled in {:.0} s",
        days * day,
        8 * day,
        started.elapsed().as_secs_f64()
    ));

    let port = free_port();
    let metrics_port = free_port();
    let metrics = ["--metrics-listen".to_owned(), format!("127.0.0.1:{metrics_port}")];
    let (server, base, http, watched) = serve_watched(port, &store, &client, &metrics).await;

    // The oldest day expires in 20 s; the rows this update leaves dead
    // are vacuumed before anything is measured.
    let expire_at = longrun_core::Clock::now(&longrun_core::SystemClock).0 + 20_000;
    sql(
        &mut db,
        &format!("UPDATE operations SET expires_at = {expire_at} WHERE seq < {first_hi}"),
    )
    .await;
    // The server's delivery retention is its default, 7 days.
    sql(
        &mut db,
        &format!(
            "UPDATE delivery_partitions SET ends_at = {} WHERE name = '{}'",
            expire_at - 7 * DAY_MS,
            delivery_day(0)
        ),
    )
    .await;
    sql(&mut db, "VACUUM ANALYZE operations").await;
    sql(&mut db, "CHECKPOINT").await;

    let load = Load::start(&http, &base, &client, &watched);

    // Watch retention: the oldest day's operations, and its partition.
    let mut watch = Watch::new();
    let mut day_dropped = None;
    let oldest_day = format!("webhook_deliveries_{}", delivery_day(0));
    loop {
        let left: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM operations WHERE seq < {first_hi}"))
            .fetch_one(&mut db)
            .await
            .unwrap();
        let partition: bool = sqlx::query_scalar("SELECT to_regclass('operation_events_0') IS NOT NULL")
            .fetch_one(&mut db)
            .await
            .unwrap();
        let phase = if left == day {
            Phase::Before
        } else if partition {
            Phase::During
        } else {
            Phase::After
        };
        let deliveries_day: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(&oldest_day)
            .fetch_one(&mut db)
            .await
            .unwrap();
        let now = watch.saw(phase);
        if !deliveries_day && day_dropped.is_none() {
            day_dropped = Some(now);
        }
        if now > watch.deadline || (watch.settled(now) && day_dropped.is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let samples = load.stop().await;
    // History steps the server left for a later pass (a drop whose lock
    // was not granted in time), from its own count.
    let deferred = processes::metric(
        &http,
        &format!("127.0.0.1:{metrics_port}"),
        "longrun_retention_history_deferred_total",
    )
    .await;
    let deliveries_deferred = processes::metric(
        &http,
        &format!("127.0.0.1:{metrics_port}"),
        "longrun_retention_deliveries_deferred_total",
    )
    .await;
    drop(server);

    record.line(String::new());
    record.line(watch.pass_line(&format!("{day} operations and dropped their history partition")));
    record.line(format!(
        "History steps left for a later pass (`longrun_retention_history_deferred_total`): {deferred}."
    ));
    match (watch.first(Phase::During), day_dropped) {
        (Some(a), Some(b)) => record.line(format!(
            "The oldest day of deliveries ({day} and their attempts) was dropped {:.1} s after the pass began; steps left for a later pass (`longrun_retention_deliveries_deferred_total`): {deliveries_deferred}.",
            b.saturating_duration_since(a).as_secs_f64()
        )),
        _ => record.line("The oldest day of deliveries was not dropped within 240 s."),
    };
    record.line(String::new());
    p99_rows(&mut record, &samples, &watch.phases);
    // The statistics of the last commits reach the views within a second.
    tokio::time::sleep(Duration::from_secs(2)).await;
    record.line(String::new());
    record.line("| table | dead tuples after the pass | live |");
    record.line("|---|---|---|");
    // Partitioned tables summed over their partitions.
    for row in sqlx::query_as::<_, (String, i64, i64)>(
        "SELECT family, SUM(n_dead_tup)::BIGINT, SUM(n_live_tup)::BIGINT FROM (
             SELECT CASE WHEN relname LIKE 'operation_events%' THEN 'operation_events (every partition)'
                         WHEN relname LIKE 'webhook_deliveries%' THEN 'webhook_deliveries (every partition)'
                         WHEN relname LIKE 'webhook_attempts%' THEN 'webhook_attempts (every partition)'
                         ELSE relname::text END AS family, n_dead_tup, n_live_tup
               FROM pg_stat_user_tables
              WHERE relname IN ('operations', 'idempotency_keys', 'tombstones')
                 OR relname LIKE 'operation_events%' OR relname LIKE 'webhook_%') t
          GROUP BY family ORDER BY 2 DESC, 1",
    )
    .fetch_all(&mut db)
    .await
    .unwrap()
    {
        record.line(format!("| {} | {} | {} |", row.0, row.1, row.2));
    }
    record.line(String::new());
    record.line("Load from the bench's own process (paced clients, not wrk): the columns compare with each other, not with the peers bench.");
    if let Some(path) = record.write() {
        println!("\nrecorded in {}", path.display());
    }
}

/// `days` of `day` ended operations for SQLite, each with its idempotency
/// record and three events, written straight into the tables (seq 1 the
/// oldest), as `fill_sql` writes them for PostgreSQL.
fn sqlite_fill_sql(days: i64, day: i64, now_ms: i64) -> String {
    let n = days * day;
    let series =
        format!("WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < {n}) SELECT i FROM g");
    let id = "'op_r' || printf('%025d', i)";
    let at = format!("({now_ms} - ({n} - i) * 26)");
    format!(
        "BEGIN;
         INSERT INTO operations (id, tenant, kind, state, version, attempt, labels, result, idempotency_key,
                                 created_at, started_at, completed_at, updated_at, expires_at)
         SELECT {id}, 'bench', 'noop', 'succeeded', 3, 1, '{{}}', '{{\"ok\":true}}', 'r-' || i,
                {at}, {at} + 1, {at} + 2, {at} + 2, 4102444800000 FROM ({series});
         INSERT INTO idempotency_keys (tenant, kind, key, fingerprint, operation_id, created_at)
         SELECT 'bench', 'noop', 'r-' || i, randomblob(32), {id}, {at} FROM ({series});
         INSERT INTO operation_events (op_seq, version, type, state, at, data, snapshot)
         SELECT o.seq, v.n, v.type, v.state, o.created_at + v.n, '{{}}', CASE WHEN v.n < 3 THEN '{{}}' END
           FROM operations o,
                (SELECT 1 AS n, 'created' AS type, 'queued' AS state UNION ALL SELECT 2, 'started', 'running'
                 UNION ALL SELECT 3, 'succeeded', 'succeeded') v
          WHERE o.id LIKE 'op_r%';
         COMMIT;
         ANALYZE;
         PRAGMA wal_checkpoint(TRUNCATE);"
    )
}

/// The file's pages, and of them those on its free list.
fn sqlite_pages(db: &rusqlite::Connection) -> (i64, i64) {
    let pages = db.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
    let free = db.query_row("PRAGMA freelist_count", [], |r| r.get(0)).unwrap();
    (pages, free)
}

async fn sqlite_day(days: i64, day: i64) {
    let dir = tempfile::tempdir().unwrap();
    let store = vec!["--data-dir".to_owned(), dir.path().display().to_string()];
    let (client, _) = prepare(&store);
    let path = dir.path().join("longrun.db");
    let db = rusqlite::Connection::open(&path).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    let now_ms = longrun_core::Clock::now(&longrun_core::SystemClock).0;
    let started = Instant::now();
    db.execute_batch(&sqlite_fill_sql(days, day, now_ms)).unwrap();
    let first: i64 = db
        .query_row("SELECT MIN(seq) FROM operations WHERE id LIKE 'op_r%'", [], |r| {
            r.get(0)
        })
        .unwrap();
    let oldest = first + day; // seq < oldest: the oldest day
    let mut record = Record::new("retention");
    record.line(format!(
        "SQLite, {} ended operations stored ({days} days of {day}, 3 events and a key each), filled in {:.0} s",
        days * day,
        started.elapsed().as_secs_f64()
    ));
    // The oldest day expires in 20 s; checkpointed, as the fill was,
    // before anything is measured.
    let expire_at = longrun_core::Clock::now(&longrun_core::SystemClock).0 + 20_000;
    db.execute(
        "UPDATE operations SET expires_at = ?1 WHERE seq >= ?2 AND seq < ?3",
        (expire_at, first, oldest),
    )
    .unwrap();
    db.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    let (pages_before, free_before) = sqlite_pages(&db);

    let port = free_port();
    let (server, base, http, watched) = serve_watched(port, &store, &client, &[]).await;

    let load = Load::start(&http, &base, &client, &watched);
    // Watch retention: the oldest day's operations.
    let mut watch = Watch::new();
    loop {
        let left: i64 = db
            .query_row(
                "SELECT COUNT(*) FROM operations WHERE seq >= ?1 AND seq < ?2",
                (first, oldest),
                |r| r.get(0),
            )
            .unwrap();
        let phase = match left {
            l if l == day => Phase::Before,
            0 => Phase::After,
            _ => Phase::During,
        };
        let now = watch.saw(phase);
        if now > watch.deadline || watch.settled(now) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let samples = load.stop().await;
    drop(server);

    record.line(String::new());
    record.line(watch.pass_line(&format!("{day} operations (their rows and events; a tombstone each)")));
    record.line(String::new());
    p99_rows(&mut record, &samples, &watch.phases);
    let (pages_after, free_after) = sqlite_pages(&db);
    let events: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM operation_events WHERE op_seq >= ?1 AND op_seq < ?2",
            (first, oldest),
            |r| r.get(0),
        )
        .unwrap();
    record.line(String::new());
    record.line("| the file | before the pass | after it |");
    record.line("|---|---|---|");
    record.line(format!("| pages | {pages_before} | {pages_after} |"));
    record.line(format!(
        "| of them free (reused by later writes, no vacuum) | {free_before} | {free_after} |"
    ));
    record.line(format!("| the day's events left | {} | {events} |", 3 * day));
    record.line(String::new());
    record.line("Load from the bench's own process (paced clients, not wrk): the columns compare with each other, not with the peers bench.");
    if let Some(path) = record.write() {
        println!("\nrecorded in {}", path.display());
    }
}
