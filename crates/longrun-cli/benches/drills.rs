//! Crash drills, one command: `cargo bench -p longrun-cli --bench drills`.
//!
//! Runs `LONGRUN_DRILLS` (100) drills of each scenario with the release
//! binary and prints one table row per scenario: drills, operations
//! acknowledged, lost, duplicated, double completions, stuck, and the
//! recovery time. The goal is 0 lost, duplicated, double completed and stuck.
//! The test suite runs a short version (`tests/drills.rs`).

mod drill;
mod processes;

use std::time::Duration;

use drill::{Plan, Tally};

#[tokio::main]
async fn main() {
    let drills: u64 = std::env::var("LONGRUN_DRILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let plan = Plan {
        clients: 4,
        submissions_per_client: 50,
        workers: 2,
        fault_within: Duration::from_millis(400),
        stuck_bound: Duration::from_secs(30),
    };
    println!("{} drills per scenario, {plan:?}", drills);
    let mut tally = Tally::default();
    for seed in 0..drills {
        let dir = tempfile::tempdir().unwrap();
        let report = drill::kill_the_sqlite_server(seed, &plan, dir.path()).await;
        if report.lost + report.duplicated + report.double_completions + report.stuck > 0 {
            println!("drill {seed}: {report:?}");
        }
        tally.add(&report);
    }
    let mut workers = Tally::default();
    for seed in 0..drills {
        let dir = tempfile::tempdir().unwrap();
        let report = drill::kill_an_exec_worker(seed, &plan, dir.path()).await;
        if report.lost + report.duplicated + report.double_completions + report.stuck > 0 {
            println!("drill {seed}: {report:?}");
        }
        workers.add(&report);
    }
    let faults = drill::Faults {
        lose_response: 10,
        reset_mid_response: 5,
    };
    let mut proxied = Tally::default();
    for seed in 0..drills {
        let dir = tempfile::tempdir().unwrap();
        let report = drill::through_a_faulty_proxy(seed, &plan, dir.path(), faults).await;
        if report.lost + report.duplicated + report.double_completions + report.stuck > 0 {
            println!("drill {seed}: {report:?}");
        }
        proxied.add(&report);
    }
    println!("{}", Tally::HEADER);
    println!(
        "{}",
        tally.row("kill -9 of the SQLite server under submit/claim/heartbeat/complete load")
    );
    println!(
        "{}",
        workers.row("kill -9 of a `longrun worker --exec` mid-task (recovery: until all ended)")
    );
    println!(
        "{}",
        proxied.row("a proxy losing 10 % of responses and resetting 5 % mid-response (recovery: until all ended)")
    );
    if !(tally.clean() && workers.clean() && proxied.clean()) {
        eprintln!("a drill found lost, duplicated, twice-completed or stuck work");
        std::process::exit(1);
    }
}
