//! The [`Store`] trait on PostgreSQL: each method one transaction (or a
//! group commit), calling the use case it names.

use super::*;

/// Runs a use case of the plan layer in one transaction, with the driver
/// bound to `$d`.
macro_rules! run_plan {
    ($self:ident, |$d:ident| $body:expr) => {{
        let policy = $self.policy;
        $self
            .tx(move |c, ch| {
                Box::pin(async move {
                    let $d = &mut PgDriver { c, ch, policy };
                    $body
                })
            })
            .await
    }};
}

impl crate::tables::RunScripts for PostgresStore {
    fn read_now<T: Send + 'static>(&self, script: Script<T>) -> impl std::future::Future<Output = Result<T>> + Send {
        self.script(script)
    }

    fn read<T: Send + 'static>(&self, script: Script<T>) -> impl std::future::Future<Output = Result<T>> + Send {
        self.script(script)
    }

    fn write<T: Send + 'static>(&self, script: Script<T>) -> impl std::future::Future<Output = Result<T>> + Send {
        self.script(script)
    }
}

crate::plan::store::impl_store!(PostgresStore, run_plan, {
    async fn operation_accept(&self, params: AcceptParams) -> Result<AcceptOutcome> {
        self.accepts.write(params).await
    }

    async fn operation_accept_many(&self, params: Vec<AcceptParams>) -> Vec<Result<AcceptOutcome>> {
        self.accepts.write_many(params).await
    }

    async fn operation_accept_leased(&self, params: &AcceptParams, to: &LeaseTo) -> Result<Option<(Operation, Task)>> {
        operation_accept_leased(&self.pool, &self.reads, params, to).await
    }

    fn hands_off(&self) -> bool {
        true
    }

    async fn operation_shared(&self, tenant: &str, id: &Id) -> Result<Option<Arc<Operation>>> {
        self.reads
            .read_through(tenant, id.as_str(), || operation_read(&self.pool, tenant, id))
            .await
    }

    async fn operation_list(&self, params: ListParams) -> Result<OperationPage> {
        let mut c = self.pool.acquire().await.map_err(db)?;
        operation_list(&mut c, &params).await
    }

    async fn operation_history(&self, tenant: &str, id: &Id) -> Result<Option<Vec<Event>>> {
        let mut c = self.pool.acquire().await.map_err(db)?;
        events_of(&mut c, tenant, id, 0, i64::MAX, false).await
    }

    async fn task_claim(&self, params: ClaimParams) -> Result<Vec<Task>> {
        let policy = self.policy;
        self.tx_begun_with(CLAIM_BEGIN, move |c, ch| {
            Box::pin(async move { plan::claim::task_claim(&mut PgDriver { c, ch, policy }, &params).await })
        })
        .await
    }

    async fn task_heartbeat(&self, params: HeartbeatParams) -> Result<HeartbeatAck> {
        run_plan!(self, |d| plan::finish::task_heartbeat(d, &params).await)
    }

    async fn task_finish(&self, params: FinishParams) -> Result<Operation> {
        self.finishes.write(params).await
    }

    async fn task_finish_many(&self, params: Vec<FinishParams>) -> Vec<Result<Operation>> {
        self.finishes.write_many(params).await
    }

    async fn task_finish_and_claim(
        &self,
        outcomes: Vec<FinishParams>,
        claim: ClaimParams,
    ) -> (Vec<Result<Operation>>, Result<Vec<Task>>) {
        // Side by side on two connections: the outcomes join the finishes'
        // group commit while the claim runs, so neither waits for the
        // other's commit.
        tokio::join!(self.task_finish_many(outcomes), self.task_claim(claim))
    }

    async fn operation_events_after(
        &self,
        tenant: &str,
        id: &Id,
        after_version: i64,
        limit: u32,
    ) -> Result<Option<Vec<Event>>> {
        let mut c = self.pool.acquire().await.map_err(db)?;
        events_of(&mut c, tenant, id, after_version, i64::from(limit), true).await
    }

    fn subscribe_changes(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    async fn history_upkeep(&self, now: Timestamp, limit: u32) -> Result<HistoryUpkeep> {
        // In a task of its own: a caller that goes away does not cut a
        // step between its DDL and its bookkeeping.
        let (pool, strays_from) = (self.pool.clone(), self.strays_from.clone());
        tokio::spawn(async move { history::history_upkeep(&pool, &strays_from, now, limit).await })
            .await
            .map_err(|_| StoreError::Stopped("the history upkeep"))?
    }

    async fn deliveries_upkeep(&self, now: Timestamp, retention: Duration) -> Result<DeliveriesUpkeep> {
        // In a task of its own, as the history's upkeep.
        let pool = self.pool.clone();
        tokio::spawn(async move { deliveries::deliveries_upkeep(&pool, now, retention).await })
            .await
            .map_err(|_| StoreError::Stopped("the webhook deliveries' upkeep"))?
    }

    /// One statement for all of `keys`, each looked up by the indexes that
    /// name objects (see the SQLite backend).
    async fn artifact_keys_named(&self, keys: Vec<String>) -> Result<Vec<String>> {
        let uploads: Vec<Option<&str>> = keys.iter().map(|k| upload_of_key(k)).collect();
        let quoted: Vec<String> = keys.iter().map(|k| key_in_chunks(k)).collect();
        sqlx::query_scalar(
            "SELECT k.key FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[]) AS k(key, upload, quoted)
              WHERE EXISTS (SELECT 1 FROM results WHERE storage_key = k.key)
                 OR EXISTS (SELECT 1 FROM artifact_pieces WHERE storage_key = k.key)
                 OR EXISTS (SELECT 1 FROM uploads WHERE id = k.upload AND position(k.quoted IN chunks) > 0)",
        )
        .bind(&keys)
        .bind(&uploads)
        .bind(&quoted)
        .fetch_all(&self.pool)
        .await
        .map_err(db)
    }

    async fn schedule_update_many(&self, updates: Vec<(ScheduleRecord, i64)>) -> Result<Vec<bool>> {
        self.schedule_update_rows(&updates).await
    }

    async fn schedule_fires_record(&self, fires: Vec<ScheduleFire>, keep_after: Timestamp) -> Result<()> {
        self.schedule_fires_record_rows(&fires, keep_after).await
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await.map_err(db)?;
        Ok(())
    }
});
