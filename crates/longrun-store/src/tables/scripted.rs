//! [`Tables`] for every backend that says how it runs a shared script.

use std::future::Future;

use async_trait::async_trait;
use longrun_core::Id;

use super::Tables;
use crate::shared::{self, Script};
use crate::*;

/// How a backend runs a shared script: a point read (by key, on the
/// calling thread where the backend can), a read that may walk many rows,
/// or a write (in one transaction, or the writer's batch).
pub(crate) trait RunScripts: Send + Sync {
    /// A read by key.
    fn read_now<T: Send + 'static>(&self, script: Script<T>) -> impl Future<Output = Result<T>> + Send;
    /// A read that may walk many rows.
    fn read<T: Send + 'static>(&self, script: Script<T>) -> impl Future<Output = Result<T>> + Send;
    /// A write.
    fn write<T: Send + 'static>(&self, script: Script<T>) -> impl Future<Output = Result<T>> + Send;
}

#[async_trait]
#[allow(private_bounds)]
impl<S: RunScripts> Tables for S {
    async fn api_key_get(&self, id: &Id) -> Result<Option<ApiKeyRecord>> {
        self.read_now(shared::api_key_get(id)).await
    }

    async fn kind_get(&self, name: &str) -> Result<Option<KindSpec>> {
        self.read_now(shared::kind_get(name)).await
    }

    async fn tenant_get(&self, name: &str) -> Result<Option<TenantLimits>> {
        self.read_now(shared::tenant_get(name)).await
    }

    async fn result_for_operation(&self, tenant: &str, id: &Id) -> Result<Vec<ResultRecord>> {
        self.read_now(shared::result_for_operation(tenant, id)).await
    }

    async fn result_get(&self, id: &Id) -> Result<Option<ResultRecord>> {
        self.read_now(shared::result_get(id)).await
    }

    async fn operation_tombstone(&self, tenant: &str, id: &Id) -> Result<Option<longrun_core::Timestamp>> {
        self.read_now(shared::operation_tombstone(tenant, id)).await
    }

    async fn operation_tenant(&self, id: &Id) -> Result<Option<String>> {
        self.read_now(shared::operation_tenant(id)).await
    }

    async fn idempotency_record(&self, tenant: &str, id: &Id) -> Result<Option<IdempotencyRecord>> {
        self.read_now(shared::idempotency_record(tenant, id)).await
    }

    async fn operation_by_key(&self, tenant: &str, kinds: Vec<String>, key: &str) -> Result<Option<Id>> {
        self.read_now(shared::operation_by_key(tenant, &kinds, key)).await
    }

    async fn task_expire_worker(&self, worker_id: &str, now: longrun_core::Timestamp) -> Result<u64> {
        self.write(shared::leases_of_worker_expired(worker_id, now)).await
    }

    async fn artifact_garbage(&self, limit: u32) -> Result<Vec<String>> {
        self.read(shared::artifact_garbage(limit)).await
    }

    async fn artifact_garbage_done(&self, keys: Vec<String>) -> Result<()> {
        self.write(shared::artifact_garbage_done(&keys)).await
    }

    async fn upload_appending(
        &self,
        tenant: &str,
        id: &Id,
        now: longrun_core::Timestamp,
    ) -> Result<Option<longrun_core::Timestamp>> {
        let lease = self.read_now(shared::upload_lease(Some(tenant), id, false)).await?;
        Ok(lease.and_then(|l| l.live_until(now)))
    }

    async fn upload_get(&self, tenant: &str, id: &Id) -> Result<Option<UploadRecord>> {
        self.read_now(shared::upload_get(tenant, id)).await
    }

    async fn upload_for_task(
        &self,
        operation_id: &Id,
        lease_token: &str,
        upload_id: &Id,
    ) -> Result<Option<UploadRecord>> {
        self.read_now(shared::upload_for_task(operation_id, lease_token, upload_id))
            .await
    }

    async fn api_key_list(&self) -> Result<Vec<ApiKeyRecord>> {
        self.read(shared::api_key_list()).await
    }

    async fn api_key_count(&self) -> Result<u64> {
        self.read(shared::api_key_count()).await
    }

    async fn kind_list(&self) -> Result<Vec<KindSpec>> {
        self.read(shared::kind_list()).await
    }

    async fn kind_typical_duration(&self, kind: &str) -> Result<Option<std::time::Duration>> {
        self.read(shared::kind_typical_duration(kind)).await
    }

    async fn server_secret_list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        self.read(shared::server_secret_list(prefix)).await
    }

    async fn accepting_pauses(&self) -> Result<Vec<Option<String>>> {
        self.read(shared::accepting_pauses()).await
    }

    async fn console_session_key(&self, token_hash: &[u8], now: longrun_core::Timestamp) -> Result<Option<Id>> {
        self.read(shared::console_session_key(token_hash, now)).await
    }

    async fn webhook_log(&self, tenant: &str, id: &Id) -> Result<Option<Vec<AttemptRecord>>> {
        self.read(shared::webhook_log(tenant, id)).await
    }

    async fn active_summary(&self, tenant: Option<String>) -> Result<Vec<ActiveGroup>> {
        self.read(shared::active_summary(tenant.as_deref())).await
    }

    async fn lease_list(&self, tenant: Option<String>, limit: u32) -> Result<Vec<LeaseInfo>> {
        self.read(shared::lease_list(tenant.as_deref(), limit)).await
    }

    async fn tenant_usage(&self) -> Result<Vec<TenantUsage>> {
        self.read(shared::tenant_usage()).await
    }

    async fn backlog(&self, now: longrun_core::Timestamp) -> Result<Backlog> {
        self.read(shared::backlog(now)).await
    }

    async fn tenant_set(&self, limits: TenantLimits) -> Result<()> {
        self.write(shared::tenant_set(&limits)).await
    }

    async fn api_key_create(&self, params: ApiKeyCreateParams) -> Result<()> {
        self.write(shared::api_key_create(&params)).await
    }

    async fn api_key_revoke(&self, id: &Id, now: longrun_core::Timestamp) -> Result<bool> {
        self.write(shared::api_key_revoke(id, now)).await
    }

    async fn kind_upsert(&self, spec: KindSpec) -> Result<()> {
        self.write(shared::kind_upsert(&spec)).await
    }

    async fn server_secret(&self, name: &str, candidate: Vec<u8>, now: longrun_core::Timestamp) -> Result<Vec<u8>> {
        self.write(shared::server_secret(name, &candidate, now)).await
    }

    async fn accepting_pause(&self, kind: Option<String>, paused: bool) -> Result<()> {
        self.write(shared::accepting_pause(kind.as_deref(), paused)).await
    }

    async fn console_session_start(&self, session: ConsoleSession) -> Result<()> {
        self.write(shared::console_session_start(&session)).await
    }

    async fn console_session_end(&self, token_hash: &[u8]) -> Result<()> {
        self.write(shared::console_session_end(token_hash)).await
    }

    async fn webhook_secrets(
        &self,
        tenant: &str,
        candidate: String,
        now: longrun_core::Timestamp,
    ) -> Result<Vec<String>> {
        self.write(shared::webhook_secrets(tenant, &candidate, now)).await
    }

    async fn webhook_secret_rotate(
        &self,
        tenant: &str,
        new_secret: String,
        now: longrun_core::Timestamp,
        overlap: std::time::Duration,
    ) -> Result<()> {
        self.write(shared::webhook_secret_rotate(tenant, &new_secret, now, overlap))
            .await
    }

    async fn schedule_insert(&self, schedule: ScheduleRecord) -> Result<()> {
        self.write(shared::schedule_insert(&schedule)).await
    }

    async fn schedule_update(&self, schedule: ScheduleRecord, expected_version: i64) -> Result<bool> {
        self.write(shared::schedule_update(&schedule, expected_version)).await
    }

    async fn schedule_delete(&self, tenant: &str, id: &Id) -> Result<bool> {
        self.write(shared::schedule_delete(tenant, id)).await
    }

    async fn schedule_get(&self, tenant: &str, id: &Id) -> Result<Option<ScheduleRecord>> {
        self.read_now(shared::schedule_get(tenant, id)).await
    }

    async fn schedule_list(&self, tenant: &str, after: Option<Id>, limit: u32) -> Result<Vec<ScheduleRecord>> {
        self.read(shared::schedule_list(tenant, after.as_ref(), limit)).await
    }

    async fn schedule_due(&self, now: longrun_core::Timestamp, limit: u32) -> Result<Vec<ScheduleRecord>> {
        self.read(shared::schedule_due(now, limit)).await
    }

    async fn schedule_fires(&self, id: &Id, limit: u32) -> Result<Vec<ScheduleFire>> {
        self.read(shared::schedule_fires(id, limit)).await
    }
}
