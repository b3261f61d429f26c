//! The crash drills of `benches/drills.rs`, a short run: five drills of
//! each scenario with the debug binary, and nothing may be lost, duplicated,
//! completed twice or left stuck.

#[path = "../benches/drill/mod.rs"]
mod drill;
#[path = "../benches/processes/mod.rs"]
#[allow(dead_code)]
mod processes;

use std::time::Duration;

use drill::{Plan, Tally};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_kills_of_the_sqlite_server_under_load_lose_and_repeat_nothing() {
    let plan = Plan {
        clients: 3,
        submissions_per_client: 20,
        workers: 2,
        fault_within: Duration::from_millis(300),
        stuck_bound: Duration::from_secs(30),
    };
    let mut tally = Tally::default();
    for seed in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let report = drill::kill_the_sqlite_server(seed, &plan, dir.path()).await;
        assert!(report.acknowledged > 0);
        tally.add(&report);
    }
    println!("{}\n{}", Tally::HEADER, tally.row("kill -9 of the SQLite server"));
    assert!(tally.clean(), "{}", tally.row("kill -9 of the SQLite server"));
    assert_eq!(tally.acknowledged, 5 * 3 * 20, "every submission was acknowledged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_kills_of_an_exec_worker_mid_task_lose_and_repeat_nothing() {
    let plan = Plan {
        clients: 2,
        submissions_per_client: 20,
        workers: 2,
        fault_within: Duration::from_millis(300),
        stuck_bound: Duration::from_secs(30),
    };
    let mut tally = Tally::default();
    for seed in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        tally.add(&drill::kill_an_exec_worker(seed, &plan, dir.path()).await);
    }
    let row = tally.row("kill -9 of a longrun worker --exec");
    println!("{}\n{row}", Tally::HEADER);
    assert!(tally.clean(), "{row}");
    assert_eq!(tally.acknowledged, 5 * 2 * 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_runs_through_a_proxy_that_loses_and_cuts_responses_lose_and_repeat_nothing() {
    let plan = Plan {
        clients: 2,
        submissions_per_client: 20,
        workers: 2,
        fault_within: Duration::ZERO,
        stuck_bound: Duration::from_secs(60),
    };
    let faults = drill::Faults {
        lose_response: 10,
        reset_mid_response: 5,
    };
    let mut tally = Tally::default();
    for seed in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        tally.add(&drill::through_a_faulty_proxy(seed, &plan, dir.path(), faults).await);
    }
    let row = tally.row("a proxy losing and cutting responses");
    println!("{}\n{row}", Tally::HEADER);
    assert!(tally.clean(), "{row}");
    assert_eq!(tally.acknowledged, 5 * 2 * 20);
    assert!(tally.interrupted > 0, "the proxy harmed some requests: {row}");
}
