//! What a backend provides to the use cases of the plan layer: fetch
//! primitives, and the row writes [`apply`](super::apply) turns
//! [`Effect`](super::Effect)s into. None of them decides anything; none
//! records an event or queues a webhook of its own accord (the use case
//! says which, with [`EventType`] and [`WebhookType`](super::WebhookType)).

use std::collections::{HashMap, VecDeque};

use longrun_core::Timestamp;
use serde_json::Value;

use super::EventType;
use super::claim::{Leased, ReadyTenant};
use super::fetches::{self, OverdueWaiting, PauseRequested, StopRequested};
use super::retention::{Expiring, Tombstone};
use crate::shared::{Ending, Fenced, Holder, Lapsed, Script, Stmt, UploadLease};
use crate::{ArtifactRef, ClaimParams, Id, Operation, Result};

/// Whether a fetch of fenced rows locks them until the transaction ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lock {
    /// Read only: what was read may change before the transaction writes
    /// (where another writer can run at the same time).
    None,
    /// Locked until the transaction ends.
    ForUpdate,
}

/// One operation to end: as `ending` says, at `now`, and (with a `guard`)
/// only while it is still at that version.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EndRow {
    pub id: String,
    pub ending: Ending,
    pub now: Timestamp,
    pub guard: Option<i64>,
}

/// A backend as the plan layer's use cases see it: one transaction (or one
/// writer job) in which rows are fetched and changes applied. Fetches that
/// hand out shared work lock what they return and skip what another node
/// holds (`FOR UPDATE SKIP LOCKED` on PostgreSQL; SQLite has one writer).
///
/// Every method is a statement or a few; none decides anything. Those
/// with a body run a shared script (`plan/fetches.rs`): a backend writes
/// only the others.
pub(crate) trait Driver {
    /// One writer at a time: what a fetch returned stays as read until the
    /// use case ends, locked or not (SQLite's writer thread). A use case
    /// then needs no second, locking read before it writes.
    const SERIAL: bool;

    /// Whether history is dropped a partition at a time (PostgreSQL): an
    /// expired operation's events then stay for their partition's drop.
    const HISTORY_BY_PARTITION: bool;

    /// A ready task a claim picked, as the driver's lease finds it again.
    type Picked;

    /// Runs a script of shared statements in the use case's transaction.
    async fn script<T>(&mut self, script: &Script<T>) -> Result<T>;

    /// Drops the piece rows of an operation (of `name`, at or past an
    /// offset, when given); each object becomes garbage once no row names
    /// it, unless it is `keep` (a single piece that became the result).
    async fn pieces_drop(
        &mut self,
        operation_id: &str,
        only: Option<(&str, i64)>,
        keep: Option<&str>,
        now: Timestamp,
    ) -> Result<()>;

    // Fetch primitives.

    /// Up to `limit` operations past their deadline at `now` whose task is
    /// ready (not leased), soonest deadline first.
    async fn overdue_waiting(&mut self, now: Timestamp, limit: u32) -> Result<Vec<OverdueWaiting>> {
        self.script(&fetches::overdue_waiting(now, limit)).await
    }

    /// Up to `limit` ids of cancellable operations past their deadline at
    /// `now` whose task a worker holds and that nobody asked to stop yet.
    async fn overdue_running(&mut self, now: Timestamp, limit: u32) -> Result<Vec<String>> {
        self.script(&fetches::overdue_running(now, limit)).await
    }

    /// Up to `limit` running operations the server asked to stop at or
    /// before `cutoff`, oldest request first.
    async fn stops_unacknowledged(&mut self, cutoff: Timestamp, limit: u32) -> Result<Vec<StopRequested>> {
        self.script(&fetches::stops_unacknowledged(cutoff, limit)).await
    }

    /// Up to `limit` running operations asked to pause at or before
    /// `cutoff`, oldest request first.
    async fn pauses_unanswered(&mut self, cutoff: Timestamp, limit: u32) -> Result<Vec<PauseRequested>> {
        self.script(&fetches::pauses_unanswered(cutoff, limit)).await
    }

    /// Up to `limit` leased tasks whose lease ended before `now`, soonest
    /// expiry first.
    async fn leases_lapsed(&mut self, now: Timestamp, limit: u32) -> Result<Vec<(String, Lapsed)>> {
        self.script(&fetches::leases_lapsed(now, limit)).await
    }

    /// The fenced rows of `leases` (operation id, lease token; no lease
    /// twice), in their order: `None` where the lease is not (or no longer)
    /// held.
    async fn fenced(&mut self, leases: &[(&str, &str)], lock: Lock) -> Result<Vec<Option<Fenced>>>;

    /// The operation `id`, as stored.
    async fn operation(&mut self, id: &str) -> Result<Option<Operation>>;

    /// The tenant's operation, locked for the rest of the transaction.
    async fn operation_locked(&mut self, tenant: &str, id: &Id) -> Result<Option<Operation>>;

    /// Whether the operation's task is leased (`None`: it has no task).
    async fn task_leased(&mut self, id: &str) -> Result<Option<bool>> {
        self.script(&fetches::task_leased(id)).await
    }

    /// What the workers of `op` can do, as a change of intent needs it.
    async fn intent_holder(&mut self, op: &Operation) -> Result<Holder>;

    // Claims (`plan/claim.rs`).

    /// The tenants with ready work, least recently served first; with each
    /// its ready heads for `p` when the driver picks them here.
    async fn tenants_with_ready_work(&mut self, p: &ClaimParams) -> Result<Vec<ReadyTenant<Self::Picked>>>;

    /// How many of the tenant's tasks are leased, counted so that claims
    /// for the same capped tenant take turns until their transactions end.
    async fn tasks_running(&mut self, tenant: &str) -> Result<i64>;

    /// Up to `allowance` of the tenant's ready tasks for `p`, highest
    /// priority first, then earliest available, each taken from other
    /// claims until the transaction ends.
    async fn ready_heads(&mut self, p: &ClaimParams, tenant: &str, allowance: usize) -> Result<VecDeque<Self::Picked>>;

    /// Leases `picked` (in their order) and starts their operations, but
    /// for those [`too_late_to_start`](super::claim::too_late_to_start),
    /// which it hands back for the claim to end.
    async fn lease(&mut self, p: &ClaimParams, picked: Vec<Self::Picked>) -> Result<Leased>;

    /// Records that these tenants, in this order, were served last.
    async fn tenants_served(&mut self, tenants: &[&str]) -> Result<()>;

    // Row writes, as `apply` calls them.

    /// Ends each operation of `ends` that is still live (and at its guard
    /// version): its row and its task. Returns the ended ones by id.
    async fn operations_end(&mut self, ends: &[&EndRow]) -> Result<HashMap<String, Operation>>;

    /// Publishes the uploaded results of operations that ended (each with
    /// the time it ended, from which they are kept); returns the published
    /// artifacts, by name, of each operation that had any (usually none).
    async fn results_publish(
        &mut self,
        ended: &[(&str, Timestamp)],
    ) -> Result<Vec<(String, Vec<(String, ArtifactRef)>)>>;

    /// Moves the uploaded but unpublished results of operations `ids` to
    /// the garbage list.
    async fn results_discard(&mut self, ids: &[&str], now: Timestamp) -> Result<()>;

    /// Runs `stmt`, an `UPDATE` of the one operation its `?1` names (a
    /// statement of [`writes`](super::writes)), and reads the row back:
    /// `None` when the statement matched no row.
    async fn operation_update(&mut self, stmt: &Stmt) -> Result<Option<Operation>>;

    // Retention and tenant deletion: fetches of what is due, and removals.

    /// Up to `limit` published results past their expiry (id, storage key).
    async fn results_expiring(&mut self, now: Timestamp, limit: u32) -> Result<Vec<(String, String)>> {
        self.script(&fetches::results_expiring(now, limit)).await
    }

    /// Marks a result expired; its object becomes garbage.
    async fn result_expire(&mut self, id: &str, storage_key: &str, now: Timestamp) -> Result<()> {
        self.script(&fetches::result_expire(id, storage_key, now)).await
    }

    /// Up to `limit` operations past their retention, soonest expiry first.
    async fn operations_expiring(&mut self, now: Timestamp, limit: u32) -> Result<Vec<Expiring>> {
        self.script(&fetches::operations_expiring(now, limit)).await
    }

    /// Before operations `ids` are removed (`plan::retention`): read caches
    /// forget them, and their result objects and uploaded pieces become
    /// garbage (a piece another operation still names stays).
    async fn operations_release(&mut self, ids: &[&str], now: Timestamp) -> Result<()>;

    /// Deletes the events of operations `ids`, found through their rows
    /// (so before those go).
    async fn events_remove(&mut self, ids: &[&str]) -> Result<()> {
        self.script(&fetches::events_remove(ids)).await
    }

    /// Stores (or replaces) tombstones, each of a different operation.
    async fn tombstones_set(&mut self, tombstones: &[Tombstone]) -> Result<()> {
        for tombstone in tombstones {
            self.script(&fetches::tombstone_set(tombstone)).await?;
        }
        Ok(())
    }

    /// Deletes up to `limit` tombstones past their window and the
    /// idempotency records they kept; returns how many.
    async fn tombstones_bury(&mut self, now: Timestamp, limit: u32) -> Result<u64>;

    /// Up to `limit` finished deliveries created at or before `cutoff`.
    async fn deliveries_finished(&mut self, cutoff: Timestamp, limit: u32) -> Result<Vec<String>> {
        self.script(&fetches::deliveries_finished(cutoff, limit)).await
    }

    /// Up to `limit` uploads past their expiry that no operation names.
    async fn uploads_unused(&mut self, now: Timestamp, limit: u32) -> Result<Vec<String>> {
        self.script(&fetches::uploads_unused(now, limit)).await
    }

    /// Deletes an upload; its objects become garbage.
    async fn upload_drop(&mut self, id: &str, now: Timestamp) -> Result<()> {
        self.script(&fetches::upload_drop(id, now)).await
    }

    /// How many results and webhook deliveries the tenant has.
    async fn tenant_counts(&mut self, tenant: &str) -> Result<(u64, u64)> {
        Ok((
            self.script(&fetches::tenant_results(tenant)).await?,
            self.script(&fetches::tenant_deliveries(tenant)).await?,
        ))
    }

    /// The ids of every operation of the tenant.
    async fn tenant_operations(&mut self, tenant: &str) -> Result<Vec<String>> {
        self.script(&fetches::tenant_operations(tenant)).await
    }

    /// The ids of every upload of the tenant.
    async fn tenant_uploads(&mut self, tenant: &str) -> Result<Vec<String>> {
        self.script(&fetches::tenant_uploads(tenant)).await
    }

    /// Makes the objects of the tenant's results that still have one
    /// garbage (results of operations already removed; expired ones have
    /// no object left).
    async fn tenant_results_to_garbage(&mut self, tenant: &str, now: Timestamp) -> Result<()> {
        self.script(&fetches::tenant_results_to_garbage(tenant, now)).await
    }

    /// `DELETE FROM {table} WHERE {column} IN values{and}`: one of the
    /// plan's fixed lists of rows to remove (`and` is a condition, empty or
    /// starting with ` AND`, that lets an index find them). Returns how many.
    async fn rows_delete(&mut self, table: &str, column: &str, and: &str, values: &[&str]) -> Result<u64>;

    // Uploads.

    /// Who holds the right to append to upload `id` (the tenant's, when
    /// given), locked for the rest of the transaction; `None` if no such
    /// upload.
    async fn upload_lease_locked(&mut self, tenant: Option<&str>, id: &Id) -> Result<Option<UploadLease>> {
        self.script(&crate::shared::upload_lease(tenant, id, true)).await
    }

    /// Sets who holds the right to append to upload `id`.
    async fn upload_lease_set(&mut self, id: &Id, lease: &UploadLease) -> Result<()> {
        self.script(&fetches::upload_lease_set(id, lease)).await
    }

    /// Records events, each of its operation's current version.
    async fn events_insert(&mut self, events: &[(&Operation, EventType, Value)]) -> Result<()>;
}
