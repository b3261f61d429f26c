//! `impl Store` for a backend: the methods that run one use case of this
//! layer, written once. A backend names its `Store` type, a macro that runs
//! a use case with its [`Driver`](super::Driver) in one transaction (or one
//! writer job), and the methods that are its own (reads, the group-committed
//! hot path, batch forms):
//!
//! ```text
//! macro_rules! run_plan {
//!     ($self:ident, |$d:ident| $body:expr) => {{ /* bind $d, run $body */ }};
//! }
//! crate::plan::store::impl_store!(MyStore, run_plan, { /* own methods */ });
//! ```
//!
//! A macro, not a generic `impl<D: Driver> Store`: the drivers' futures
//! differ in `Send` (SQLite's driver borrows the writer thread's
//! connection and is run to completion there, PostgreSQL's is awaited on
//! the runtime), which a generic method over both cannot state on stable
//! Rust.

macro_rules! impl_store {
    ($store:ty, $run:ident, { $($own:tt)* }) => {
        #[async_trait::async_trait]
        impl crate::Store for $store {
            $($own)*

            async fn operation_cancel(&self, params: crate::CancelParams) -> crate::Result<crate::CancelOutcome> {
                $run!(self, |d| crate::plan::control::operation_cancel(d, &params).await)
            }

            async fn operation_intent(&self, params: crate::IntentParams) -> crate::Result<crate::Operation> {
                $run!(self, |d| crate::plan::control::operation_intent(d, &params).await)
            }

            async fn operation_update(&self, params: crate::UpdateParams) -> crate::Result<crate::Operation> {
                $run!(self, |d| crate::plan::update::operation_update(d, &params).await)
            }

            async fn task_reap(&self, params: crate::ReapParams) -> crate::Result<crate::ReapCounts> {
                $run!(self, |d| crate::plan::finish::task_reap(d, &params).await)
            }

            async fn deadline_enforce(&self, params: crate::EnforceParams) -> crate::Result<crate::EnforceCounts> {
                $run!(self, |d| crate::plan::deadline::deadline_enforce(d, &params).await)
            }

            async fn webhook_due(
                &self,
                now: longrun_core::Timestamp,
                limit: u32,
                lease: std::time::Duration,
            ) -> crate::Result<Vec<crate::Delivery>> {
                $run!(self, |d| crate::plan::webhooks::webhook_due(d, now, limit, lease).await)
            }

            async fn webhook_attempt(&self, params: crate::AttemptParams) -> crate::Result<()> {
                $run!(self, |d| crate::plan::webhooks::webhook_attempt(d, &params).await)
            }

            async fn result_upload(&self, params: crate::ResultUploadParams) -> crate::Result<()> {
                $run!(self, |d| crate::plan::uploads::result_upload(d, &params).await)
            }

            async fn artifact_piece_add(
                &self,
                params: crate::ArtifactPieceParams,
            ) -> crate::Result<Vec<crate::UploadChunk>> {
                $run!(self, |d| crate::plan::uploads::artifact_piece_add(d, &params).await)
            }

            async fn artifact_pieces(
                &self,
                operation_id: &crate::Id,
                lease_token: &str,
                name: &str,
            ) -> crate::Result<Vec<crate::UploadChunk>> {
                let (id, token, name) = (operation_id.clone(), lease_token.to_owned(), name.to_owned());
                $run!(self, |d| crate::plan::uploads::artifact_pieces(d, &id, &token, &name).await)
            }

            /// In steps of at most the store's `RETENTION_STEP` rows of each
            /// phase, each a transaction (on SQLite a writer job) of its own,
            /// so that the writes queued behind a step wait for no more than
            /// one (`plan::retention::steps`).
            async fn retention_sweep(&self, params: crate::RetentionParams) -> crate::Result<crate::RetentionCounts> {
                let mut counts = crate::RetentionCounts::default();
                for limit in crate::plan::retention::steps(params.limit, <$store>::RETENTION_STEP) {
                    let p = crate::RetentionParams { limit, ..params.clone() };
                    let step = $run!(self, |d| crate::plan::retention::retention_sweep(d, &p).await)?;
                    counts += step;
                    if !crate::plan::retention::more_due(&step, limit) {
                        break;
                    }
                }
                Ok(counts)
            }

            async fn tenant_delete(
                &self,
                tenant: &str,
                now: longrun_core::Timestamp,
            ) -> crate::Result<crate::TenantDeleteCounts> {
                let tenant = tenant.to_owned();
                $run!(self, |d| crate::plan::retention::tenant_delete(d, &tenant, now).await)
            }

            async fn upload_create(&self, params: crate::UploadCreateParams) -> crate::Result<crate::UploadRecord> {
                $run!(self, |d| crate::plan::uploads::upload_create(d, &params).await)
            }

            async fn upload_append(&self, params: crate::UploadAppendParams) -> crate::Result<crate::UploadRecord> {
                $run!(self, |d| crate::plan::uploads::upload_append(d, &params).await)
            }

            async fn upload_complete(&self, params: crate::UploadCompleteParams) -> crate::Result<crate::UploadRecord> {
                $run!(self, |d| crate::plan::uploads::upload_complete(d, &params).await)
            }

            async fn upload_remove(
                &self,
                tenant: &str,
                id: &crate::Id,
                now: longrun_core::Timestamp,
            ) -> crate::Result<bool> {
                let (tenant, id) = (tenant.to_owned(), id.clone());
                $run!(self, |d| crate::plan::uploads::upload_remove(d, &tenant, &id, now).await)
            }

            async fn upload_append_lease(&self, params: crate::AppendLeaseParams) -> crate::Result<crate::AppendLease> {
                $run!(self, |d| crate::plan::uploads::upload_append_lease(d, &params).await)
            }

            async fn upload_append_release(&self, id: &crate::Id, token: &str) -> crate::Result<()> {
                let (id, token) = (id.clone(), token.to_owned());
                $run!(self, |d| crate::plan::uploads::upload_append_release(d, &id, &token).await)
            }
        }
    };
}

pub(crate) use impl_store;
