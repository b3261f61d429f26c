//! Crash drills, one command: `cargo bench -p longrun-cli --bench drills`.
//!
//! Runs `LONGRUN_DRILLS` (100) drills of each scenario with the release
//! binary and prints one table row per scenario: drills, operations
//! acknowledged, lost, duplicated, double completions, stuck, unclear
//! answers, and the recovery time. The goal is 0 of each. The test suite
//! runs a short version (`tests/drills.rs`). `LONGRUN_DRILL_ONLY=a,b` runs
//! only the named scenarios (the names are printed with each row).
//! `schedules` runs once: `LONGRUN_SCHEDULE_DRILL_COUNT` (1,000) schedules
//! for `LONGRUN_SCHEDULE_DRILL_SECONDS` (300) with random node kills.

mod drill;
mod processes;
mod record;

use std::time::Duration;

use drill::{Faults, Plan, Report, SmallFilesystem, Submitter, Tally, WorkerProcess};

fn wanted(name: &str) -> bool {
    std::env::var("LONGRUN_DRILL_ONLY").map_or(true, |only| only.split(',').any(|n| n.trim() == name))
}

/// Runs `drills` drills of one scenario and prints the unclean ones.
async fn run(drills: u64, drill: impl AsyncFn(u64) -> Report) -> Tally {
    let mut tally = Tally::default();
    for seed in 0..drills {
        let report = drill(seed).await;
        if report.lost + report.duplicated + report.double_completions + report.stuck + report.unclear > 0 {
            println!("drill {seed}: {report:?}");
        }
        tally.add(&report);
    }
    tally
}

/// Prints a scenario's row as soon as it is done, and keeps it for the table.
fn report(rows: &mut Vec<String>, row: String) {
    println!("{row}");
    rows.push(row);
}

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn peers_required() -> bool {
    std::env::var_os("LONGRUN_REQUIRE_PEERS").is_some_and(|v| v != "0")
}

#[tokio::main]
async fn main() {
    if drill::sdk_worker_process().await {
        return;
    }
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
    let proxied = Plan {
        fault_within: Duration::ZERO,
        stuck_bound: Duration::from_secs(60),
        ..plan.clone()
    };
    let faults = Faults {
        lose_response: 10,
        reset_mid_response: 5,
        latency: Duration::ZERO,
    };
    let slow_faults = Faults {
        latency: Duration::from_millis(50),
        ..faults
    };
    println!("{drills} drills per scenario, {plan:?}");
    let mut rows: Vec<String> = Vec::new();
    let mut skipped = Vec::new();
    let mut trees: Option<String> = None;
    let mut clean = true;
    if wanted("sqlite-server") {
        let tally = run(drills, async |seed| {
            let dir = tempfile::tempdir().unwrap();
            drill::kill_the_sqlite_server(seed, &plan, dir.path()).await
        })
        .await;
        report(
            &mut rows,
            tally.row("`sqlite-server`: kill -9 of the SQLite server under submit/claim/heartbeat/complete load"),
        );
        clean &= tally.clean();
    }
    for (name, kind, label) in [
        (
            "exec-worker",
            WorkerProcess::Exec,
            "`exec-worker`: kill -9 of a `longrun worker --exec` mid-task",
        ),
        (
            "sdk-worker",
            WorkerProcess::Sdk,
            "`sdk-worker`: kill -9 of an SDK worker process mid-task",
        ),
    ] {
        if wanted(name) {
            let tally = run(drills, async |seed| {
                let dir = tempfile::tempdir().unwrap();
                drill::kill_a_worker(seed, &plan, dir.path(), kind).await
            })
            .await;
            report(&mut rows, tally.row(label));
            clean &= tally.clean();
        }
    }
    if wanted("exec-trees") {
        let (mut processes, mut survivors) = (0, 0);
        for seed in 1..=drills {
            let dir = tempfile::tempdir().unwrap();
            let trees = drill::kill_an_exec_worker_with_process_trees(seed, dir.path()).await;
            processes += trees.processes;
            survivors += trees.survivors;
        }
        let line = format!(
            "`exec-trees`: kill -9 of a `longrun worker --exec` running 4 process trees: \
             {drills} drills, {processes} processes started, {survivors} alive 5 s after the kill"
        );
        println!("{line}");
        trees = Some(line);
        clean &= survivors == 0;
    }
    if wanted("postgres-node") || wanted("postgres-stop") {
        match longrun_store::pgtest::start_durable() {
            Ok(cluster) => {
                if wanted("postgres-node") {
                    let tally = run(drills, async |seed| {
                        drill::kill_a_postgres_node(seed, &plan, cluster.database().await, 3).await
                    })
                    .await;
                    report(
                        &mut rows,
                        tally.row("`postgres-node`: kill -9 of one of three `serve` nodes on PostgreSQL"),
                    );
                    clean &= tally.clean();
                }
                if wanted("postgres-stop") {
                    let tally = run(drills, async |seed| drill::stop_postgres(seed, &plan, &cluster).await).await;
                    report(&mut rows, tally.row(
                        "`postgres-stop`: PostgreSQL stopped hard (`-m immediate`) under load on two nodes, then started",
                    ));
                    clean &= tally.clean();
                }
            }
            Err(why) => skipped.push(format!("the PostgreSQL drills: {why}")),
        }
    }
    let mut schedules_line = None;
    if wanted("schedules") {
        match longrun_store::pgtest::start_durable() {
            Ok(cluster) => {
                let count = env_number("LONGRUN_SCHEDULE_DRILL_COUNT", 1000);
                let seconds = env_number("LONGRUN_SCHEDULE_DRILL_SECONDS", 300);
                let found = drill::schedules_through_kills(
                    1,
                    cluster.database().await,
                    count,
                    Duration::from_secs(seconds as u64),
                )
                .await;
                let line = format!(
                    "`schedules`: {} schedules `@every 1s` on three PostgreSQL nodes for {seconds} s, \
                     {} node kills: {} firing times due, {} operations, {} lost, {} duplicated, {} off the cadence",
                    found.schedules,
                    found.kills,
                    found.due,
                    found.operations,
                    found.lost,
                    found.duplicated,
                    found.off_cadence
                );
                println!("{line}");
                clean &= found.clean();
                schedules_line = Some(line);
            }
            Err(why) => skipped.push(format!("the schedule drill: {why}")),
        }
    }
    for (name, submitter, faults, label) in [
        (
            "proxy-http",
            Submitter::Http,
            faults,
            "`proxy-http`: a proxy losing 10 % of responses and resetting 5 % mid-response, HTTP clients",
        ),
        (
            "proxy-sdk",
            Submitter::Sdk,
            slow_faults,
            "`proxy-sdk`: the same proxy with up to 50 ms added latency, SDK clients",
        ),
        (
            "proxy-cli",
            Submitter::Cli,
            slow_faults,
            "`proxy-cli`: the same proxy with up to 50 ms added latency, `longrun submit` clients",
        ),
    ] {
        if wanted(name) {
            let tally = run(drills, async |seed| {
                let dir = tempfile::tempdir().unwrap();
                drill::through_a_faulty_proxy(seed, &proxied, dir.path(), faults, submitter).await
            })
            .await;
            report(&mut rows, tally.row(label));
            clean &= tally.clean();
        }
    }
    if wanted("proxy-webhooks") {
        let tally = run(drills, async |seed| {
            let dir = tempfile::tempdir().unwrap();
            drill::webhooks_through_a_faulty_proxy(seed, &proxied, dir.path(), slow_faults).await
        })
        .await;
        report(
            &mut rows,
            tally.row("`proxy-webhooks`: the proxy (with latency) between the server and a deduping webhook receiver"),
        );
        clean &= tally.clean();
    }
    if wanted("disk-full") {
        let probe = tempfile::tempdir().unwrap();
        match SmallFilesystem::mount(probe.path(), "1m") {
            Ok(fs) => {
                drop(fs);
                let tally = run(drills, async |seed| {
                    let dir = tempfile::tempdir().unwrap();
                    let fs = SmallFilesystem::mount(dir.path(), "32m").expect("a tmpfs mounts");
                    drill::fill_the_disk(seed, &plan, &fs).await
                })
                .await;
                report(
                    &mut rows,
                    tally.row("`disk-full`: the SQLite server's file system filled up under load, then freed"),
                );
                clean &= tally.clean();
            }
            Err(why) => skipped.push(format!("the disk-full drill: {why}")),
        }
    }

    let mut record = record::Record::new("drills");
    if !rows.is_empty() {
        record.line("");
        record.line(Tally::HEADER);
        for row in &rows {
            record.line(row.clone());
        }
    }
    for line in trees.into_iter().chain(schedules_line) {
        record.line("");
        record.line(line);
    }
    record.write();
    for why in &skipped {
        eprintln!("SKIPPED: {why}");
    }
    if !skipped.is_empty() && peers_required() {
        std::process::exit(1);
    }
    if !clean {
        eprintln!("a drill found lost, duplicated, twice-completed, stuck or unclearly answered work");
        std::process::exit(1);
    }
}
