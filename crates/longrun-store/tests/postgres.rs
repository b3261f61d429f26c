//! The PostgreSQL backend against the same conformance suite as SQLite, on a
//! throwaway cluster started with the machine's initdb/pg_ctl.

use std::sync::Arc;

use longrun_store::conformance::TestStore;
use longrun_store::postgres::{PostgresConfig, PostgresStore};
use longrun_store::{Store, store_conformance};

async fn postgres_store() -> Option<TestStore> {
    let cluster = longrun_store::pgtest::cluster()?;
    let url = cluster.database().await;
    let mut config = PostgresConfig::new(url);
    config.max_connections = 8;
    let store = PostgresStore::open(config).await.expect("open the PostgreSQL store");
    Some(TestStore {
        store: Arc::new(store),
        guard: Box::new(()),
    })
}

store_conformance!(postgres_store);

/// Notifications sent while the listening connection is down are lost for
/// good; the store must say so (a resync) once it listens again, and go on
/// publishing what commits afterwards.
#[tokio::test]
async fn a_lost_listening_connection_resyncs_and_keeps_publishing() {
    let Some(cluster) = longrun_store::pgtest::cluster() else {
        return;
    };
    let url = cluster.database().await;
    let store = PostgresStore::open(PostgresConfig::new(url.clone())).await.unwrap();
    let mut changes = store.subscribe_changes();
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&url).await.unwrap();
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE 'LISTEN%'",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert_eq!(killed, vec![true], "exactly the listening connection was cut");
    // A guard against hanging, not a synchronisation.
    let within = std::time::Duration::from_secs(60);
    let resync = tokio::time::timeout(within, changes.recv()).await.unwrap().unwrap();
    assert!(resync.is_resync(), "expected a resync, got {resync:?}");
    let op = longrun_store::conformance::create(&store, "t1", "after-reconnect").await;
    let next = tokio::time::timeout(within, changes.recv()).await.unwrap().unwrap();
    assert_eq!((next.operation_id, next.version), (op.id, 1));
}
