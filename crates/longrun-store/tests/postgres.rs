//! The PostgreSQL backend against the same conformance suite as SQLite, on a
//! throwaway cluster started with the machine's initdb/pg_ctl.

use std::sync::Arc;

use longrun_store::conformance::TestStore;
use longrun_store::postgres::{PostgresConfig, PostgresStore};
use longrun_store::store_conformance;

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
