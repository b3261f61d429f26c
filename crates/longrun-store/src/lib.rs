//! Durable state of Longrun behind one [`Store`] trait.
//!
//! Every backend implements the same noun-first methods, each taking one
//! params struct, and passes the same `conformance` suite. Invariants live in
//! the schema too: CHECK constraints on states and roles, a unique constraint
//! on idempotency keys (the convergence point of concurrent first requests),
//! and a trigger that refuses any state change not in the core's
//! legal-transition table.
//!
//! Callers pass `now` in every params struct: the store never reads a clock,
//! so tests drive lease expiry and retention with an injected one.
//!
//! # Layout
//!
//! - `types` (re-exported): records and params; storage types, not wire types.
//! - `shared`: what both backends decide alike — how an outcome, a reap or a
//!   change of intent ends, upload offsets, the JSON forms kept in columns.
//! - `sqlite` (feature `sqlite`): one writer thread with group commit, a
//!   pool of readers; schema in `sqlite/migrations/`.
//! - `postgres` (feature `postgres`): one transaction per call, group commit
//!   on the job path, `FOR UPDATE SKIP LOCKED` for shared work, NOTIFY for
//!   wake-ups; schema in `postgres/`.
//! - `error`: what a call can refuse; driver errors keep their cause.
//! - `conformance` and `pgtest` (feature `test-support`): the suite every
//!   backend passes, and a throwaway PostgreSQL cluster.

// Each case is a `pub async fn` whose name says what it checks.
#[cfg(feature = "test-support")]
#[allow(missing_docs)]
pub mod conformance;
mod error;
#[cfg(feature = "test-support")]
pub mod pgtest;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod plan;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod reads;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod shared;
#[cfg(feature = "sqlite")]
pub mod sqlite;
mod tables;
mod types;

pub use error::StoreError;
pub use longrun_core::task::{
    DEFAULT_ARTIFACT, HeartbeatAck, MAX_CHECKPOINT_BYTES, OperationError, Outcome, ProgressUpdate,
};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteConfig, SqliteStore};
pub use tables::Tables;
pub use types::*;

use async_trait::async_trait;
use longrun_core::Id;

/// A store call's result.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The durable state of Longrun: one trait, two backends (SQLite, PostgreSQL),
/// one conformance suite judging both. A call applies all of its change or
/// none (a batch call: each item alone), and callers pass `now`.
#[async_trait]
pub trait Store: Tables + Send + Sync + 'static {
    /// Accepts a submission: operation row, idempotency record, first event
    /// and dispatch record commit together, or the existing operation for the
    /// same key is returned (or refused when the request differs).
    async fn operation_accept(&self, params: AcceptParams) -> Result<AcceptOutcome>;

    /// The operation `id` if it belongs to `tenant`; `None` for both an unknown
    /// id and another tenant's, so callers cannot tell them apart.
    async fn operation_get(&self, tenant: &str, id: &Id) -> Result<Option<Operation>> {
        Ok(self
            .operation_shared(tenant, id)
            .await?
            .map(std::sync::Arc::unwrap_or_clone))
    }

    /// [`operation_get`](Self::operation_get), shared rather than copied: a
    /// poll answered from the read cache hands out the kept operation
    /// itself, not a copy of its input and result (docs/ARCHITECTURE.md).
    /// `operation_get` is this, copied only when the cache kept it too.
    async fn operation_shared(&self, tenant: &str, id: &Id) -> Result<Option<std::sync::Arc<Operation>>>;

    /// Newest first, keyset-paginated.
    async fn operation_list(&self, params: ListParams) -> Result<OperationPage>;

    /// Events oldest first; `None` when the operation is not the tenant's.
    async fn operation_history(&self, tenant: &str, id: &Id) -> Result<Option<Vec<Event>>>;

    /// Requests cancellation: queued work is cancelled at once, running work is
    /// flagged for its worker, terminal work is left unchanged.
    async fn operation_cancel(&self, params: CancelParams) -> Result<CancelOutcome>;

    /// Leases up to `max_tasks` ready tasks of the given kinds.
    async fn task_claim(&self, params: ClaimParams) -> Result<Vec<Task>>;

    /// Accepts a submission and, in the same commit, leases its task to a
    /// worker waiting in a claim (`to`): a hand-off, so work submitted to an
    /// idle worker starts without a claim of its own. Both versions are
    /// written with their events (`created`, then `started`, as a claim
    /// would have written it); the answer is the operation as created
    /// (version 1, what the submitter is told) and the task.
    ///
    /// `Ok(None)` when nothing was written: the backend does not hand off,
    /// or this submission must queue as usual — its tenant has a quota on
    /// active or running work (counted under the tenant's lock), or its
    /// idempotency key is already taken (a replay or a reuse). The caller
    /// then accepts it with [`Store::operation_accept`], as it does a
    /// submission that [`AcceptParams::may_be_handed_off`] says may not be.
    async fn operation_accept_leased(&self, params: &AcceptParams, to: &LeaseTo) -> Result<Option<(Operation, Task)>> {
        let _ = (params, to);
        Ok(None)
    }

    /// Whether [`Store::operation_accept_leased`] can hand off at all (so
    /// callers need not keep claims waiting for it).
    fn hands_off(&self) -> bool {
        false
    }

    /// Renews a lease and records progress, fenced by the lease token.
    async fn task_heartbeat(&self, params: HeartbeatParams) -> Result<HeartbeatAck>;

    /// Ends a running operation, fenced by the lease token:
    /// `SetStateIfRunning` in River's words.
    async fn task_finish(&self, params: FinishParams) -> Result<Operation>;

    /// Accepts many submissions, each on its own (one refused submission
    /// refuses only itself), answered in order. Every backend commits them
    /// in group commits: concurrent callers and the items of one call share
    /// transactions and flushes.
    async fn operation_accept_many(&self, params: Vec<AcceptParams>) -> Vec<Result<AcceptOutcome>> {
        futures_util::future::join_all(params.into_iter().map(|p| self.operation_accept(p))).await
    }

    /// Applies many worker outcomes, each fenced by its own lease token and
    /// answered in order; like [`Store::operation_accept_many`], they share
    /// group commits.
    async fn task_finish_many(&self, params: Vec<FinishParams>) -> Vec<Result<Operation>> {
        futures_util::future::join_all(params.into_iter().map(|p| self.task_finish(p))).await
    }

    /// Applies `outcomes` as [`Store::task_finish_many`] does and claims as
    /// [`Store::task_claim`] does. A worker that reports and asks for more
    /// in one call lets a backend pay for both at once: SQLite applies then
    /// claims in one writer job and one commit; PostgreSQL runs the two side
    /// by side on two connections, so the claim may not see the outcomes
    /// (it never needs to: an ended task is not claimable, and a retry waits
    /// for its backoff). A failed claim loses no outcome.
    async fn task_finish_and_claim(
        &self,
        outcomes: Vec<FinishParams>,
        claim: ClaimParams,
    ) -> (Vec<Result<Operation>>, Result<Vec<Task>>) {
        let finished = if outcomes.is_empty() {
            Vec::new()
        } else {
            self.task_finish_many(outcomes).await
        };
        (finished, self.task_claim(claim).await)
    }

    /// Applies many heartbeats, each fenced by its own lease token.
    async fn task_heartbeat_many(&self, params: Vec<HeartbeatParams>) -> Vec<Result<HeartbeatAck>> {
        futures_util::future::join_all(params.into_iter().map(|p| self.task_heartbeat(p))).await
    }

    /// Handles leases that were not renewed in time: re-queues rerun-safe
    /// kinds with attempts left, fails the others with `outcome_unknown`.
    async fn task_reap(&self, params: ReapParams) -> Result<ReapCounts>;

    /// Pauses or resumes an operation under `If-Match`: queued work (and
    /// running work waiting for a retry) pauses at once, leaving the queue;
    /// resumed work goes back to it. Refused with `IntentConflict` once
    /// cancellation is requested or the operation ended (whatever the
    /// version), `NotPausable` for work a worker holds, then
    /// `PreconditionFailed` for a stale version. Asking for what already
    /// holds changes nothing.
    async fn operation_intent(&self, params: IntentParams) -> Result<Operation>;

    /// Changes deadline or labels of a live operation under `If-Match`.
    async fn operation_update(&self, params: UpdateParams) -> Result<Operation>;

    /// Fails queued work past its deadline, asks running work past its
    /// deadline to stop, and ends work whose worker ignored such a request.
    async fn deadline_enforce(&self, params: EnforceParams) -> Result<EnforceCounts>;

    /// Events after `after_version`, oldest first, at most `limit`, with their
    /// snapshots; `None` when the operation is not the tenant's.
    async fn operation_events_after(
        &self,
        tenant: &str,
        id: &Id,
        after_version: i64,
        limit: u32,
    ) -> Result<Option<Vec<Event>>>;

    /// Committed changes, as they happen. A lagging receiver has missed some
    /// and must re-read what it watches.
    fn subscribe_changes(&self) -> tokio::sync::broadcast::Receiver<Change>;

    /// Up to `limit` webhook events due now, each leased to the caller for
    /// `lease` (a crashed deliverer's work is picked up after it).
    async fn webhook_due(
        &self,
        now: longrun_core::Timestamp,
        limit: u32,
        lease: std::time::Duration,
    ) -> Result<Vec<Delivery>>;

    /// Records an attempt and what follows: delivered, retry later, or given up.
    async fn webhook_attempt(&self, params: AttemptParams) -> Result<()>;

    /// Records a worker's uploaded artifact (fenced by its lease); `complete`
    /// publishes it, any other end discards it.
    async fn result_upload(&self, params: ResultUploadParams) -> Result<()>;

    /// Records a piece of a task's resumable artifact (see
    /// [`ArtifactPieceParams`]); returns its pieces in order. A refused
    /// piece's object is the caller's to delete.
    async fn artifact_piece_add(&self, params: ArtifactPieceParams) -> Result<Vec<UploadChunk>>;

    /// The pieces of the task's resumable artifact `name`, in order (fenced
    /// by the lease): what earlier attempts (or the original of a
    /// `from_checkpoint` re-run) stored.
    async fn artifact_pieces(&self, operation_id: &Id, lease_token: &str, name: &str) -> Result<Vec<UploadChunk>>;

    /// One batched, idempotent pass of retention.
    async fn retention_sweep(&self, params: RetentionParams) -> Result<RetentionCounts>;

    /// Keeps the history's partitions, once per retention pass: makes the
    /// next one ahead, drops those of which no operation remains, and
    /// deletes up to `limit` events of removed operations that landed
    /// outside every partition. A store that keeps its history in one table
    /// (SQLite) has nothing to do: retention removed it row by row.
    async fn history_upkeep(&self, now: longrun_core::Timestamp, limit: u32) -> Result<HistoryUpkeep> {
        let _ = (now, limit);
        Ok(HistoryUpkeep::default())
    }

    /// Keeps the webhook deliveries' partitions, once per retention pass:
    /// makes the next day's ahead and drops each day that ended
    /// `retention` ago with no delivery pending (its finished deliveries
    /// and their attempts at once). A store that keeps deliveries in one
    /// table (SQLite) has nothing to do: retention removed them row by row.
    async fn deliveries_upkeep(
        &self,
        now: longrun_core::Timestamp,
        retention: std::time::Duration,
    ) -> Result<DeliveriesUpkeep> {
        let _ = (now, retention);
        Ok(DeliveriesUpkeep::default())
    }

    /// Which of `keys` (storage keys of objects) a row names: a result, a
    /// piece of a resumable artifact, or an upload (its pieces, or its
    /// joined object). An object no row names is an orphan: a crash between
    /// storing it and recording it left it behind.
    async fn artifact_keys_named(&self, keys: Vec<String>) -> Result<Vec<String>>;

    /// Removes every operation, record, result, event, delivery, secret and
    /// key of the tenant (result objects become garbage).
    async fn tenant_delete(&self, tenant: &str, now: longrun_core::Timestamp) -> Result<TenantDeleteCounts>;

    /// Starts an upload (no bytes yet).
    async fn upload_create(&self, params: UploadCreateParams) -> Result<UploadRecord>;

    /// Records a stored piece at the upload's current offset (see
    /// [`UploadAppendParams`]); a refused piece is the caller's to delete.
    async fn upload_append(&self, params: UploadAppendParams) -> Result<UploadRecord>;

    /// Takes (or, with the same token, renews) the right to append to the
    /// tenant's upload `id` until `params.until`: one request on any node
    /// holds it at a time. `Busy` while another token's right lives;
    /// `NotFound` for an unknown or foreign id.
    async fn upload_append_lease(&self, params: AppendLeaseParams) -> Result<AppendLease>;

    /// Gives back the right to append, if `token` still holds it.
    async fn upload_append_release(&self, id: &Id, token: &str) -> Result<()>;

    /// Completes an upload whose pieces the caller joined into one object.
    async fn upload_complete(&self, params: UploadCompleteParams) -> Result<UploadRecord>;

    /// Removes an upload no operation names (its objects become garbage);
    /// `false` if there was none to remove.
    async fn upload_remove(&self, tenant: &str, id: &Id, now: longrun_core::Timestamp) -> Result<bool>;

    /// Cheap round trip to the database, for `/readyz`.
    async fn ping(&self) -> Result<()>;

    // The console's reads and sessions. Each is bounded by live work (tasks,
    // leases, tenants, sessions) or by a key, never by stored history.

    /// Many `schedule_update`s in one transaction (a firing round's page):
    /// whether each applied, in order.
    async fn schedule_update_many(&self, updates: Vec<(ScheduleRecord, i64)>) -> Result<Vec<bool>>;

    /// Records what firing times became (a time recorded again takes the
    /// newer record, unless that would hide the operation the older one
    /// names), and forgets each schedule's records from before `keep_after`.
    async fn schedule_fires_record(&self, fires: Vec<ScheduleFire>, keep_after: longrun_core::Timestamp) -> Result<()>;
}
