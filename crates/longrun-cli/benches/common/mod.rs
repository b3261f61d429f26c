//! Helpers shared by the benches.

use longrun_core::apikey::{NewApiKey, Role};
use longrun_core::{Clock, SystemClock};
use longrun_store::{ApiKeyCreateParams, Store};

/// A new key of `role` for tenant `bench`.
pub async fn key(store: &dyn Store, role: Role) -> String {
    let key = NewApiKey::generate();
    store
        .api_key_create(ApiKeyCreateParams {
            id: key.id,
            tenant: "bench".into(),
            role,
            secret_hash: key.secret_hash,
            now: SystemClock.now(),
        })
        .await
        .unwrap();
    key.token
}
