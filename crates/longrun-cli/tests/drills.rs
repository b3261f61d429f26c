//! The crash drills of `benches/drills.rs`, a short run: five drills of
//! each scenario with the debug binary, and nothing may be lost, duplicated,
//! completed twice, left stuck or answered unclearly.

#[path = "../benches/drill/mod.rs"]
mod drill;
#[path = "../benches/processes/mod.rs"]
#[allow(dead_code)]
mod processes;

use std::time::Duration;

use drill::{Faults, Plan, Report, SmallFilesystem, Submitter, Tally, WorkerProcess};

const DRILLS: u64 = 5;

fn plan(clients: usize, submissions_per_client: usize) -> Plan {
    Plan {
        clients,
        submissions_per_client,
        workers: 2,
        fault_within: Duration::from_millis(300),
        stuck_bound: Duration::from_secs(30),
    }
}

fn proxied(clients: usize, submissions_per_client: usize) -> Plan {
    Plan {
        fault_within: Duration::ZERO,
        stuck_bound: Duration::from_secs(60),
        ..plan(clients, submissions_per_client)
    }
}

const FAULTS: Faults = Faults {
    lose_response: 10,
    reset_mid_response: 5,
    latency: Duration::from_millis(30),
};

/// Runs the drills, prints the row, and asserts it is clean and that every
/// submission was acknowledged.
async fn drills(name: &str, plan: &Plan, drill: impl AsyncFn(u64) -> Report) -> Tally {
    let mut tally = Tally::default();
    for seed in 0..DRILLS {
        tally.add(&drill(seed).await);
    }
    let row = tally.row(name);
    println!("{}\n{row}", Tally::HEADER);
    assert!(tally.clean(), "{row}");
    assert!(
        tally.acknowledged >= DRILLS as usize * plan.clients * plan.submissions_per_client,
        "every submission was acknowledged: {row}"
    );
    tally
}

/// Not a drill: the entry point of the SDK worker processes the
/// `sdk_worker` drills start from this test binary (they set
/// `LONGRUN_DRILL_SDK_WORKER`); in a normal run it returns at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_sdk_worker_process() {
    drill::sdk_worker_process().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_kills_of_the_sqlite_server_under_load_lose_and_repeat_nothing() {
    let plan = plan(3, 20);
    drills("kill -9 of the SQLite server", &plan, async |seed| {
        let dir = tempfile::tempdir().unwrap();
        drill::kill_the_sqlite_server(seed, &plan, dir.path()).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_kills_of_an_exec_worker_mid_task_lose_and_repeat_nothing() {
    let plan = plan(2, 20);
    drills("kill -9 of a longrun worker --exec", &plan, async |seed| {
        let dir = tempfile::tempdir().unwrap();
        drill::kill_a_worker(seed, &plan, dir.path(), WorkerProcess::Exec).await
    })
    .await;
}

/// Five kills of a worker whose commands are process trees: every process
/// of every tree ends within 5 s (issue 46's worker-death drill).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_kills_of_an_exec_worker_leave_no_process_of_its_commands() {
    let (mut processes, mut survivors) = (0, 0);
    for seed in 1..=5 {
        let dir = tempfile::tempdir().unwrap();
        let trees = drill::kill_an_exec_worker_with_process_trees(seed, dir.path()).await;
        processes += trees.processes;
        survivors += trees.survivors;
    }
    println!("kill -9 of a worker with process trees: 5 drills, {processes} processes, {survivors} alive 5 s later");
    assert!(processes >= 40);
    assert_eq!(survivors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_kills_of_an_sdk_worker_mid_task_lose_and_repeat_nothing() {
    let plan = plan(2, 20);
    drills("kill -9 of an SDK worker", &plan, async |seed| {
        let dir = tempfile::tempdir().unwrap();
        drill::kill_a_worker(seed, &plan, dir.path(), WorkerProcess::Sdk).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_kills_of_one_of_three_postgres_nodes_lose_and_repeat_nothing() {
    let Some(cluster) = longrun_store::pgtest::private_cluster() else {
        return;
    };
    let plan = plan(3, 20);
    drills(
        "kill -9 of one of three serve nodes on PostgreSQL",
        &plan,
        async |seed| drill::kill_a_postgres_node(seed, &plan, cluster.database().await, 3).await,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hard_stops_of_postgres_under_load_are_answered_503_and_lose_nothing() {
    let Some(cluster) = longrun_store::pgtest::private_cluster() else {
        return;
    };
    let plan = plan(2, 20);
    drills("PostgreSQL stopped hard under load", &plan, async |seed| {
        drill::stop_postgres(seed, &plan, &cluster).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_runs_through_a_proxy_that_loses_and_cuts_responses_lose_and_repeat_nothing() {
    let plan = proxied(2, 20);
    let faults = Faults {
        latency: Duration::ZERO,
        ..FAULTS
    };
    let tally = drills("a proxy losing and cutting responses", &plan, async |seed| {
        let dir = tempfile::tempdir().unwrap();
        drill::through_a_faulty_proxy(seed, &plan, dir.path(), faults, Submitter::Http).await
    })
    .await;
    assert!(tally.interrupted > 0, "the proxy harmed some requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_clients_behind_a_slow_faulty_proxy_converge() {
    let plan = proxied(2, 15);
    let tally = drills("SDK clients behind the proxy", &plan, async |seed| {
        let dir = tempfile::tempdir().unwrap();
        drill::through_a_faulty_proxy(seed, &plan, dir.path(), FAULTS, Submitter::Sdk).await
    })
    .await;
    assert!(tally.interrupted > 0, "the proxy harmed some requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_clients_behind_a_slow_faulty_proxy_converge() {
    let plan = proxied(2, 10);
    let tally = drills("longrun submit behind the proxy", &plan, async |seed| {
        let dir = tempfile::tempdir().unwrap();
        drill::through_a_faulty_proxy(seed, &plan, dir.path(), FAULTS, Submitter::Cli).await
    })
    .await;
    assert!(tally.interrupted > 0, "the proxy harmed some requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_through_a_faulty_proxy_are_applied_once_each() {
    let plan = proxied(2, 20);
    let tally = drills("webhooks through the proxy", &plan, async |seed| {
        let dir = tempfile::tempdir().unwrap();
        drill::webhooks_through_a_faulty_proxy(seed, &plan, dir.path(), FAULTS).await
    })
    .await;
    assert!(tally.interrupted > 0, "the proxy harmed some deliveries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_full_disks_under_load_are_answered_503_and_corrupt_nothing() {
    let probe = tempfile::tempdir().unwrap();
    if let Err(why) = SmallFilesystem::mount(probe.path(), "1m") {
        assert!(
            std::env::var_os("LONGRUN_REQUIRE_PEERS").is_none_or(|v| v == "0"),
            "LONGRUN_REQUIRE_PEERS is set but no small file system can be mounted: {why}"
        );
        eprintln!("SKIPPED: the disk-full drills ({why})");
        return;
    }
    let plan = plan(2, 20);
    drills("the file system filled up under load", &plan, async |seed| {
        let dir = tempfile::tempdir().unwrap();
        let fs = SmallFilesystem::mount(dir.path(), "32m").expect("a tmpfs mounts");
        drill::fill_the_disk(seed, &plan, &fs).await
    })
    .await;
}
