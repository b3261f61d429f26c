//! The SQLite backend against the store conformance suite, plus checks of
//! what only SQLite has: the schema's own refusal of illegal transitions and
//! durability of a group commit across reopening.

use std::sync::Arc;

use longrun_core::State;
use longrun_store::conformance::TestStore;
use longrun_store::{SqliteConfig, SqliteStore, store_conformance};

async fn sqlite_store() -> Option<TestStore> {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(SqliteConfig::new(dir.path().join("longrun.db"))).expect("open store");
    Some(TestStore {
        store: Arc::new(store),
        guard: Box::new(dir),
    })
}

store_conformance!(sqlite_store);

#[test]
fn the_schema_refuses_every_transition_the_core_table_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("longrun.db");
    longrun_store::sqlite::migrate(&path).unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    for (i, from) in State::ALL.into_iter().enumerate() {
        for to in State::ALL {
            let id = format!("op_{i}_{to}");
            conn.execute(
                "INSERT INTO operations (id, tenant, kind, state, version, created_at, updated_at)
                 VALUES (?1, 't', 'k', ?2, 1, 0, 0)",
                rusqlite::params![id, from.as_str()],
            )
            .unwrap();
            let result = conn.execute(
                "UPDATE operations SET state = ?2, version = version + 1 WHERE id = ?1",
                rusqlite::params![id, to.as_str()],
            );
            let allowed = longrun_store::conformance::schema_allows(from, to);
            assert_eq!(result.is_ok(), allowed, "{from} → {to}: {result:?}");
            if let Err(e) = result {
                // Recognised by its error code, never by its message.
                assert!(
                    matches!(
                        longrun_store::StoreError::from(e),
                        longrun_store::StoreError::IllegalTransition(_)
                    ),
                    "{from} → {to}"
                );
            }
        }
    }
    // Versions move one step at a time.
    conn.execute(
        "INSERT INTO operations (id, tenant, kind, state, version, created_at, updated_at) VALUES ('v', 't', 'k', 'queued', 1, 0, 0)",
        [],
    )
    .unwrap();
    assert!(
        conn.execute("UPDATE operations SET version = 3 WHERE id = 'v'", [])
            .is_err()
    );
    assert!(
        conn.execute("UPDATE operations SET version = 0 WHERE id = 'v'", [])
            .is_err()
    );
}

/// A full disk mid-batch: SQLite rolls the whole group commit back itself.
/// Every caller must then be told its write failed, and no later job may run
/// outside a transaction (where it would commit while its caller hears
/// "failed"): what was answered `Ok` is stored, what was refused is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_mid_batch_refuses_exactly_what_it_does_not_store() {
    use longrun_store::conformance::accept_params;
    use longrun_store::{AcceptOutcome, ListParams, Store, StoreError};
    use serde_json::json;

    let dir = tempfile::tempdir().unwrap();
    let mut config = SqliteConfig::new(dir.path().join("longrun.db"));
    config.max_page_count = Some(512);
    let store = Arc::new(SqliteStore::open(config).unwrap());
    let pad = "x".repeat(100 * 1024);
    let mut accepted = 0;
    let mut refused = 0;
    // Rounds of concurrent submissions share group commits until the disk is full.
    for round in 0..10 {
        let calls = (0..8).map(|i| {
            let store = store.clone();
            let params = accept_params("t1", "k", Some(&format!("r{round}-{i}")), json!({"pad": pad}));
            tokio::spawn(async move { store.operation_accept(params).await })
        });
        for answer in futures_util::future::join_all(calls).await {
            match answer.unwrap() {
                Ok(AcceptOutcome::Created(_)) => accepted += 1,
                Err(StoreError::Unavailable(_)) => refused += 1,
                other => panic!("{other:?}"),
            }
        }
    }
    assert!(refused > 0, "the disk filled");
    let mut stored = 0;
    let mut before_seq = None;
    loop {
        let page = store
            .operation_list(ListParams {
                tenant: Some("t1".into()),
                page_size: 100,
                before_seq,
                ..Default::default()
            })
            .await
            .unwrap();
        stored += page.operations.len();
        match page.next_before_seq {
            Some(next) => before_seq = Some(next),
            None => break,
        }
    }
    assert_eq!(
        stored, accepted,
        "{accepted} accepted, {refused} refused, {stored} stored"
    );
}

/// A history keeps as rows only what the operation's row cannot say
/// (plan/history.rs): counted in the table itself.
#[tokio::test]
async fn a_history_keeps_as_rows_only_what_the_row_cannot_say() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("longrun.db");
    let store = SqliteStore::open(SqliteConfig::new(path.clone())).unwrap();
    let shapes = longrun_store::conformance::three_histories_and_their_kept_rows(&store).await;
    let c = rusqlite::Connection::open(&path).unwrap();
    for (id, kept) in shapes {
        let rows: i64 = c
            .query_row(
                "SELECT COUNT(*) FROM operation_events WHERE op_seq = (SELECT seq FROM operations WHERE id = ?1)",
                [id.as_str()],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(rows, kept, "{id:?}");
    }
}
