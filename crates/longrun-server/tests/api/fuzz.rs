//! Property-based fuzzing of the JSON bodies at the edge, over real HTTP:
//! arbitrary bytes and arbitrary JSON shaped like each request body, sent to
//! a live server. Whatever arrives, the answer is a success or a problem
//! with a stable code and a 4xx status — never a 5xx, never a panic.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use reqwest::Method;
use serde_json::{Map, Value, json};

use crate::helpers::{Options, TestApp, sleep_body, spawn_app_with};

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "\\PC{0,24}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_:./-]{0,12}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An object with some of `fields` (each an arbitrary value, or a plausible
/// one), and sometimes a field no schema knows.
fn arb_object(fields: &'static [&'static str], plausible: Value) -> impl Strategy<Value = Value> {
    let values = prop::collection::vec((any::<bool>(), any::<bool>(), arb_json()), fields.len());
    (values, prop::option::of(("[a-z]{1,8}", arb_json()))).prop_map(move |(values, extra)| {
        let mut object = Map::new();
        for (name, (present, keep_plausible, value)) in fields.iter().zip(values) {
            if !present {
                continue;
            }
            let value = match plausible.get(*name) {
                Some(good) if keep_plausible => good.clone(),
                _ => value,
            };
            object.insert((*name).to_owned(), value);
        }
        if let Some((name, value)) = extra {
            object.insert(name, value);
        }
        Value::Object(object)
    })
}

fn arb_submission() -> impl Strategy<Value = Value> {
    arb_object(
        &["kind", "input", "labels", "deadline_seconds", "callback", "budget"],
        json!({"kind": "sleep", "input": {"duration_ms": 5}, "labels": {"team": "a"}, "deadline_seconds": 60,
               "callback": {"url": "https://example.com/hook"}, "budget": {"max_cost_units": 3}}),
    )
}

/// A body: arbitrary bytes, arbitrary JSON, or JSON shaped like `shaped`.
fn arb_body(shaped: impl Strategy<Value = Value> + 'static) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64),
        arb_json().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        shaped.prop_map(|v| serde_json::to_vec(&v).unwrap()),
    ]
}

/// Sends `body` and checks the answer is a success or a 4xx problem with a code.
async fn answer_is_clear(app: &TestApp, method: Method, path: &str, key: &str, idempotency_key: &str, body: Vec<u8>) {
    let response = app
        .request(method.clone(), path, key)
        .header("Content-Type", "application/json")
        .header("Idempotency-Key", idempotency_key)
        .body(body.clone())
        .send()
        .await
        .unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    let shown = String::from_utf8_lossy(&body);
    assert!(!status.is_server_error(), "{method} {path} {shown} → {status} {text}");
    if !status.is_success() {
        let problem: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{shown} → {status} {text}"));
        let code = problem["code"].as_str().unwrap_or_default();
        assert!(
            !code.is_empty() && code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
            "{method} {path} {shown} → {status} without a stable code: {text}"
        );
        assert_eq!(problem["status"], status.as_u16(), "{text}");
    }
}

fn fuzz(cases: u32, strategy: impl Strategy<Value = Vec<u8>>, send: impl Fn(u64, Vec<u8>)) {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let n = std::cell::Cell::new(0);
    runner
        .run(&strategy, |body| {
            n.set(n.get() + 1);
            send(n.get(), body);
            Ok(())
        })
        .unwrap();
}

#[test]
fn arbitrary_bodies_get_a_success_or_a_stable_problem_never_a_5xx() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let app = runtime.block_on(spawn_app_with(Options {
        builtin_workers: false,
        ..Options::default()
    }));
    let op = runtime.block_on(app.submit_ok("fuzz-target", &sleep_body(5)));
    let op_path = format!("/v1/operations/{}", op["id"].as_str().unwrap());

    fuzz(96, arb_body(arb_submission()), |n, body| {
        runtime.block_on(answer_is_clear(
            &app,
            Method::POST,
            "/v1/operations",
            &app.client_key,
            &format!("fz-{n}"),
            body,
        ));
    });
    let batch = prop::collection::vec(arb_submission(), 0..4).prop_map(|items| {
        let items: Vec<Value> = items
            .into_iter()
            .enumerate()
            .map(|(i, mut item)| {
                if i % 2 == 0 && item.is_object() {
                    item["idempotency_key"] = json!(format!("fz-batch-{i}"));
                }
                item
            })
            .collect();
        json!({ "operations": items })
    });
    fuzz(64, arb_body(batch), |n, body| {
        let key = format!("fzb-{n}");
        runtime.block_on(answer_is_clear(
            &app,
            Method::POST,
            "/v1/operations/batch",
            &app.client_key,
            &key,
            body,
        ));
    });
    let patch = arb_object(
        &["deadline_seconds", "labels"],
        json!({"deadline_seconds": 30, "labels": {"a": "b"}}),
    );
    fuzz(64, arb_body(patch), |n, body| {
        runtime.block_on(answer_is_clear(
            &app,
            Method::PATCH,
            &op_path,
            &app.client_key,
            &format!("fzp-{n}"),
            body,
        ));
    });
    let cancel = arb_object(&["reason"], json!({"reason": "enough"}));
    fuzz(32, arb_body(cancel), |n, body| {
        let path = format!("{op_path}/cancellation");
        runtime.block_on(answer_is_clear(
            &app,
            Method::POST,
            &path,
            &app.client_key,
            &format!("fzc-{n}"),
            body,
        ));
    });
    let outcomes = prop::collection::vec(
        arb_object(
            &[
                "operation_id",
                "lease_token",
                "outcome",
                "result",
                "error",
                "progress",
                "cost_units",
            ],
            json!({"operation_id": op["id"], "lease_token": "lt_x", "outcome": "complete", "result": {"ok": true}}),
        ),
        0..4,
    )
    .prop_map(|items| json!({ "outcomes": items }));
    fuzz(64, arb_body(outcomes), |n, body| {
        let key = app.worker_key.clone();
        runtime.block_on(answer_is_clear(
            &app,
            Method::POST,
            "/v1/worker/outcomes",
            &key,
            &format!("fzo-{n}"),
            body,
        ));
    });
    runtime.block_on(app.shutdown());
}
