//! Filling a store: through a running server's batch endpoint, waiting
//! until it has run what it holds (`peers`, `footprint`), or straight into
//! PostgreSQL's history partitions (`peers`, `retention_load`).

use std::time::Duration;

use serde_json::{Value, json};

/// Submits `jobs` operations of `body` through the batch endpoint, 100 per
/// request, 4 clients at once, each with an idempotency key of its own.
pub async fn submit(http: &reqwest::Client, base: &str, token: &str, body: &Value, jobs: usize) {
    let per_client = jobs.div_ceil(4);
    let mut clients = Vec::new();
    for c in 0..4 {
        let (http, base, token, body) = (http.clone(), base.to_owned(), token.to_owned(), body.clone());
        let n = per_client.min(jobs.saturating_sub(c * per_client));
        clients.push(tokio::spawn(async move {
            let prefix = longrun_core::id::random_base32::<8>();
            for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
                let items: Vec<Value> = chunk
                    .iter()
                    .map(|i| {
                        let mut item = body.clone();
                        item["idempotency_key"] = json!(format!("{prefix}-{c}-{i}"));
                        item
                    })
                    .collect();
                let answer: Value = http
                    .post(format!("{base}/v1/operations/batch"))
                    .bearer_auth(&token)
                    .json(&json!({"operations": items}))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                assert!(
                    answer["results"].as_array().unwrap().iter().all(|r| r["status"] == 202),
                    "{answer}"
                );
            }
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
}

/// Until nothing that may run now is queued or running. Work that starts
/// later (created before anything measured) does not count: the newest
/// queued operation is then one of it.
pub async fn drained(http: &reqwest::Client, base: &str, token: &str) {
    loop {
        let mut busy = false;
        for state in ["queued", "running"] {
            let page: Value = http
                .get(format!("{base}/v1/operations?state={state}&page_size=1"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            // Both in the server's one RFC 3339 form: as text, in time order.
            let now = longrun_core::Clock::now(&longrun_core::SystemClock).to_rfc3339();
            busy |= page["operations"]
                .as_array()
                .unwrap()
                .iter()
                .any(|op| op["not_before"].as_str().is_none_or(|at| at <= now.as_str()));
        }
        if !busy {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// PostgreSQL's history partitions, as the store's upkeep would have made
/// them while it grew: from the newest one's end up to `top`, each `width`
/// wide (SQL expressions; `width` may name `lo`, the partition's start,
/// and `top`).
pub fn history_partitions_sql(top: &str, width: &str, now_ms: i64) -> String {
    format!(
        "DO $$ DECLARE lo BIGINT := (SELECT MAX(hi) FROM history_partitions);
                      top BIGINT := {top};
                      width BIGINT;
         BEGIN
             WHILE lo < top LOOP
                 width := {width};
                 EXECUTE format('CREATE TABLE operation_events_%s PARTITION OF operation_events
                                 FOR VALUES FROM (%s) TO (%s)', lo, lo, lo + width);
                 INSERT INTO history_partitions (lo, hi, created_at, made_at_seq)
                 VALUES (lo, lo + width, {now_ms}, lo);
                 lo := lo + width;
             END LOOP;
         END $$;"
    )
}
