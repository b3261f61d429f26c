//! Helpers shared by the benches.

use longrun_core::apikey::{NewApiKey, Role};
use longrun_core::{Clock, SystemClock};
use longrun_store::{ApiKeyCreateParams, KindSpec, Store};

/// A new key of `role` for tenant `bench`.
pub async fn key(store: &dyn Store, role: Role) -> String {
    key_of(store, "bench", role).await
}

/// A new key of `role` for `tenant`.
pub async fn key_of(store: &dyn Store, tenant: &str, role: Role) -> String {
    let key = NewApiKey::generate();
    store
        .api_key_create(ApiKeyCreateParams {
            id: key.id,
            tenant: tenant.into(),
            role,
            secret_hash: key.secret_hash,
            now: SystemClock.now(),
        })
        .await
        .unwrap();
    key.token
}

/// Declares `name` a re-run-safe kind of three attempts, the benches' usual.
pub async fn rerun_safe_kind(store: &dyn Store, name: &str) {
    store
        .kind_upsert(KindSpec {
            name: name.into(),
            builtin: false,
            rerun_safe: true,
            max_attempts: 3,
            default_deadline_seconds: None,
            max_deadline_seconds: None,
            pausable: false,
        })
        .await
        .unwrap();
}
