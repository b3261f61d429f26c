//! [`Tables`]: the store's small tables and its reads off the job path —
//! keys, kinds, tenants, secrets, console sessions, acceptance pauses,
//! results, tombstones, idempotency records, webhook secrets and the
//! delivery log, the console's summaries, schedules, artifact garbage,
//! upload append leases and an upload as a task's worker reads it, a gone
//! worker's leases — implemented once for every
//! backend over the shared scripts (`shared/admin.rs`, `shared/lookups.rs`,
//! `shared/webhooks.rs`, `shared/uploads.rs`). A backend only says how it
//! runs a script ([`RunScripts`]).

use async_trait::async_trait;
use longrun_core::Id;

use crate::*;

// The implementation over the shared scripts, built with a backend.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod scripted;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use scripted::RunScripts;

/// The part of the [`Store`] written once for every backend; [`Store`]
/// requires it, so callers use it through the store as any other call.
#[async_trait]
pub trait Tables: Send + Sync {
    /// The key `id`, revoked or not.
    async fn api_key_get(&self, id: &Id) -> Result<Option<ApiKeyRecord>>;

    /// The kind `name`, if declared.
    async fn kind_get(&self, name: &str) -> Result<Option<KindSpec>>;

    /// A tenant's limits, if it has any.
    async fn tenant_get(&self, name: &str) -> Result<Option<TenantLimits>>;

    /// The published (or expired) artifacts of the tenant's operation, by name.
    async fn result_for_operation(&self, tenant: &str, id: &Id) -> Result<Vec<ResultRecord>>;

    /// A result by its own id (download links are the authorisation).
    async fn result_get(&self, id: &Id) -> Result<Option<ResultRecord>>;

    /// When the tenant's removed operation `id` was removed, while its tombstone lives.
    async fn operation_tombstone(&self, tenant: &str, id: &Id) -> Result<Option<longrun_core::Timestamp>>;

    /// The tenant an operation belongs to (the admin console reads any).
    async fn operation_tenant(&self, id: &Id) -> Result<Option<String>>;

    /// The idempotency record an operation was submitted under.
    async fn idempotency_record(&self, tenant: &str, id: &Id) -> Result<Option<IdempotencyRecord>>;

    /// The operation submitted with idempotency key `key` for one of `kinds`.
    async fn operation_by_key(&self, tenant: &str, kinds: Vec<String>, key: &str) -> Result<Option<Id>>;

    /// Ends now every lease held by `worker_id` (a worker known to be gone,
    /// such as this node's in-process workers before a restart), so the
    /// reaper handles them at once instead of after the lease time. Returns
    /// how many.
    async fn task_expire_worker(&self, worker_id: &str, now: longrun_core::Timestamp) -> Result<u64>;

    /// Storage keys of objects to delete, oldest garbage first.
    async fn artifact_garbage(&self, limit: u32) -> Result<Vec<String>>;

    /// Forgets garbage whose objects were deleted.
    async fn artifact_garbage_done(&self, keys: Vec<String>) -> Result<()>;

    /// When the right to append that a request holds on the tenant's upload
    /// `id` ends, if one holds it at `now`; `None` when no append is under
    /// way (or the upload is unknown).
    async fn upload_appending(
        &self,
        tenant: &str,
        id: &Id,
        now: longrun_core::Timestamp,
    ) -> Result<Option<longrun_core::Timestamp>>;

    /// The tenant's upload `id`; `None` for an unknown or foreign id.
    async fn upload_get(&self, tenant: &str, id: &Id) -> Result<Option<UploadRecord>>;

    /// The upload `upload_id` as the worker holding `lease_token` on
    /// `operation_id` may read it: the operation names it and the lease is
    /// current (else `LeaseLost`); `None` when the operation does not name it.
    async fn upload_for_task(
        &self,
        operation_id: &Id,
        lease_token: &str,
        upload_id: &Id,
    ) -> Result<Option<UploadRecord>>;

    /// Every key, revoked ones too.
    async fn api_key_list(&self) -> Result<Vec<ApiKeyRecord>>;

    /// How many keys exist (bootstrap makes keys only on an empty store).
    async fn api_key_count(&self) -> Result<u64>;

    /// Every declared kind.
    async fn kind_list(&self) -> Result<Vec<KindSpec>>;

    /// The median time from acceptance to success of the kind's recent
    /// operations, if any succeeded.
    async fn kind_typical_duration(&self, kind: &str) -> Result<Option<std::time::Duration>>;

    /// Server secrets whose names start with `prefix`, oldest first.
    async fn server_secret_list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>>;

    /// The current pauses: `None` means all kinds.
    async fn accepting_pauses(&self) -> Result<Vec<Option<String>>>;

    /// The key a live session was opened with.
    async fn console_session_key(&self, token_hash: &[u8], now: longrun_core::Timestamp) -> Result<Option<Id>>;

    /// The delivery log of an operation; `None` when it is not the tenant's.
    async fn webhook_log(&self, tenant: &str, id: &Id) -> Result<Option<Vec<AttemptRecord>>>;

    /// Queued and running work by kind and state (`None`: every tenant's).
    async fn active_summary(&self, tenant: Option<String>) -> Result<Vec<ActiveGroup>>;

    /// Live leases, soonest expiry first, at most `limit`.
    async fn lease_list(&self, tenant: Option<String>, limit: u32) -> Result<Vec<LeaseInfo>>;

    /// Every tenant with its limits and current usage.
    async fn tenant_usage(&self) -> Result<Vec<TenantUsage>>;

    /// Ages and backlogs for the metrics endpoint.
    async fn backlog(&self, now: longrun_core::Timestamp) -> Result<Backlog>;

    /// Sets a tenant's limits (creating the tenant).
    async fn tenant_set(&self, limits: TenantLimits) -> Result<()>;

    /// Stores a new API key.
    async fn api_key_create(&self, params: ApiKeyCreateParams) -> Result<()>;

    /// `true` if a key was revoked now, `false` if unknown or already revoked.
    async fn api_key_revoke(&self, id: &Id, now: longrun_core::Timestamp) -> Result<bool>;

    /// Declares a kind, or changes its declaration.
    async fn kind_upsert(&self, spec: KindSpec) -> Result<()>;

    /// The server-wide secret `name`: `candidate` is stored if there is none
    /// yet; either way the stored value is returned, so every process agrees.
    async fn server_secret(&self, name: &str, candidate: Vec<u8>, now: longrun_core::Timestamp) -> Result<Vec<u8>>;

    /// Pauses (or resumes) acceptance: `None` for every kind, else one kind.
    async fn accepting_pause(&self, kind: Option<String>, paused: bool) -> Result<()>;

    /// Opens a console session (and forgets sessions past their expiry).
    async fn console_session_start(&self, session: ConsoleSession) -> Result<()>;

    /// Ends a session (signing out); ending an unknown one is no error.
    async fn console_session_end(&self, token_hash: &[u8]) -> Result<()>;

    /// The tenant's secrets that sign now, newest first; `candidate` becomes
    /// the first one if the tenant has none.
    async fn webhook_secrets(
        &self,
        tenant: &str,
        candidate: String,
        now: longrun_core::Timestamp,
    ) -> Result<Vec<String>>;

    /// Makes `new_secret` the tenant's secret; the current ones keep signing
    /// until `now + overlap`.
    async fn webhook_secret_rotate(
        &self,
        tenant: &str,
        new_secret: String,
        now: longrun_core::Timestamp,
        overlap: std::time::Duration,
    ) -> Result<()>;

    /// Stores a new schedule (with a fresh id).
    async fn schedule_insert(&self, schedule: ScheduleRecord) -> Result<()>;

    /// Replaces the tenant's schedule if it is still at `expected_version`
    /// (the record carries the next version); whether it was.
    async fn schedule_update(&self, schedule: ScheduleRecord, expected_version: i64) -> Result<bool>;

    /// Deletes the tenant's schedule and its firing records; whether it was there.
    async fn schedule_delete(&self, tenant: &str, id: &Id) -> Result<bool>;

    /// The tenant's schedule.
    async fn schedule_get(&self, tenant: &str, id: &Id) -> Result<Option<ScheduleRecord>>;

    /// Up to `limit` of the tenant's schedules after `after`, in id order
    /// (creation order to the millisecond).
    async fn schedule_list(&self, tenant: &str, after: Option<Id>, limit: u32) -> Result<Vec<ScheduleRecord>>;

    /// Up to `limit` unpaused schedules with a firing due at `now` or one
    /// held back, soonest first.
    async fn schedule_due(&self, now: longrun_core::Timestamp, limit: u32) -> Result<Vec<ScheduleRecord>>;

    /// Up to `limit` of a schedule's firing records, newest first.
    async fn schedule_fires(&self, id: &Id, limit: u32) -> Result<Vec<ScheduleFire>>;
}
