//! The `sleep` kind: waits `duration_ms` in `steps`, reporting progress after
//! each step and stopping at the next step boundary once cancellation is
//! requested. Pausable: a pause stops it mid-step, and it resumes after the
//! last step done (its checkpoint, `{"steps_done": n}`), after a pause or
//! a crash alike. `fail_with` makes it fail with that code at the end. For tests,
//! demos and benchmarks.

use std::time::Duration;

use async_trait::async_trait;
use longrun_core::validate::Invalid;
use longrun_store::ProgressUpdate;
use serde_json::{Value, json};

use longrun_worker::task::{Handler, KindInfo, TaskContext, TaskError};

/// The longest `duration_ms` accepted: a day.
pub const MAX_DURATION_MS: u64 = 24 * 3600 * 1000;
/// The most progress steps accepted.
pub const MAX_STEPS: u64 = 10_000;

/// The `sleep` kind: waits, reporting progress in steps; the no-op of benches and tests.
pub struct Sleep;

/// A validated `sleep` input.
#[derive(Debug, Clone, PartialEq)]
pub struct SleepInput {
    /// How long to wait in all.
    pub duration: Duration,
    /// Progress reports along the way.
    pub steps: u64,
    /// Fail with this error code at the end instead of succeeding.
    pub fail_with: Option<String>,
}

fn invalid(message: impl Into<String>) -> Invalid {
    Invalid {
        field: "input",
        message: message.into(),
    }
}

impl SleepInput {
    /// Checks a `sleep` input.
    pub fn parse(input: &Value) -> Result<Self, Invalid> {
        let object = input.as_object().ok_or_else(|| invalid("must be an object"))?;
        for key in object.keys() {
            if !matches!(key.as_str(), "duration_ms" | "steps" | "fail_with") {
                return Err(invalid(format!(
                    "unknown field {key:?}; expected duration_ms, steps, fail_with"
                )));
            }
        }
        let duration_ms = object
            .get("duration_ms")
            .ok_or_else(|| invalid("duration_ms is required"))
            .and_then(|v| {
                whole_number(v, 0, MAX_DURATION_MS).ok_or_else(|| {
                    invalid(format!(
                        "duration_ms must be an integer between 0 and {MAX_DURATION_MS}"
                    ))
                })
            })?;
        let steps = match object.get("steps") {
            None => 10,
            Some(v) => whole_number(v, 1, MAX_STEPS)
                .ok_or_else(|| invalid(format!("steps must be an integer between 1 and {MAX_STEPS}")))?,
        };
        let fail_with = match object.get("fail_with") {
            None | Some(Value::Null) => None,
            Some(Value::String(code)) if longrun_core::validate::kind_name(code).is_ok() => Some(code.clone()),
            Some(_) => {
                return Err(invalid(
                    "fail_with must be an error code like \"boom\" (a-z, 0-9, '_', '.', '-')",
                ));
            }
        };
        Ok(Self {
            duration: Duration::from_millis(duration_ms),
            steps,
            fail_with,
        })
    }
}

/// A JSON number with an integral value in `min..=max`, however it is
/// spelled (`100`, `100.0`, `1e2`): the fingerprint treats those as equal, so
/// validation does too.
fn whole_number(v: &Value, min: u64, max: u64) -> Option<u64> {
    let f = v.as_f64()?;
    (f.fract() == 0.0 && f >= min as f64 && f <= max as f64).then_some(f as u64)
}

#[async_trait]
impl Handler for Sleep {
    fn info(&self) -> KindInfo {
        KindInfo {
            name: "sleep".into(),
            rerun_safe: true,
            max_attempts: 3,
            pausable: true,
        }
    }

    fn validate(&self, input: &Value) -> Result<(), Invalid> {
        SleepInput::parse(input).map(|_| ())
    }

    async fn run(&self, ctx: TaskContext) -> Result<Option<Value>, TaskError> {
        let input = SleepInput::parse(ctx.input()).map_err(|e| TaskError::fatal("invalid_input", e.message))?;
        let step = input.duration / u32::try_from(input.steps).unwrap_or(u32::MAX);
        // Resumes after the last step a checkpoint counts (a pause, a crash).
        let first = ctx
            .checkpoint()
            .and_then(|c| c.get("steps_done").and_then(Value::as_u64))
            .unwrap_or(0)
            .min(input.steps)
            + 1;
        for done in first..=input.steps {
            if ctx.is_cancelled() {
                return Err(TaskError::Cancelled);
            }
            if ctx.is_pause_requested() {
                return Err(TaskError::Paused);
            }
            tokio::select! {
                () = tokio::time::sleep(step) => {}
                () = ctx.cancelled() => return Err(TaskError::Cancelled),
                // The step under way is not done: the checkpoint says the last one that is.
                () = ctx.pause_requested() => return Err(TaskError::Paused),
            }
            ctx.note_checkpoint(json!({"steps_done": done}))?;
            ctx.progress(ProgressUpdate {
                completed_units: Some(done as f64),
                total_units: Some(input.steps as f64),
                unit: Some("steps".into()),
                phase: Some("SLEEPING".into()),
                details: None,
            })
            .await?;
        }
        if let Some(code) = input.fail_with {
            return Err(TaskError::fatal(code, "failed as asked by fail_with"));
        }
        Ok(Some(json!({"slept_ms": input.duration.as_millis() as u64})))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::{Arc, Mutex};

    use longrun_core::Id;
    use longrun_store::{HeartbeatAck, Outcome};
    use longrun_worker::WorkerError;

    use crate::bytes::artifacts::ByteReader;
    use longrun_worker::task::{StopFlags, TaskLink, UploadedArtifact, run_task};

    /// Records the steps a run reports and how it ends (what is tested is
    /// where the handler starts and stops, not where reports go).
    #[derive(Default)]
    struct Steps {
        reported: Mutex<Vec<f64>>,
        ended: Mutex<Option<Outcome>>,
    }

    #[async_trait]
    impl TaskLink for Steps {
        async fn heartbeat(
            &self,
            progress: Option<ProgressUpdate>,
            _: Option<f64>,
            _: Option<bool>,
            _: Option<Value>,
        ) -> Result<HeartbeatAck, WorkerError> {
            self.reported
                .lock()
                .unwrap()
                .extend(progress.and_then(|p| p.completed_units));
            Ok(HeartbeatAck {
                lease_expires_at: longrun_core::Timestamp(0),
                cancel_requested: false,
                cancel_reason: None,
                pause_requested: false,
                version: 0,
            })
        }

        async fn finish(&self, outcome: Outcome, progress: Option<ProgressUpdate>) -> Result<(), WorkerError> {
            self.reported
                .lock()
                .unwrap()
                .extend(progress.and_then(|p| p.completed_units));
            *self.ended.lock().unwrap() = Some(outcome);
            Ok(())
        }

        async fn upload(&self, _: &str, _: &str, _: ByteReader) -> Result<UploadedArtifact, WorkerError> {
            Err(WorkerError::LeaseLost)
        }

        async fn open_upload(&self, _: &Id) -> Result<ByteReader, WorkerError> {
            Err(WorkerError::NotFound)
        }

        async fn upload_piece(&self, _: &str, _: u64, _: ByteReader) -> Result<u64, WorkerError> {
            Err(WorkerError::LeaseLost)
        }

        async fn join_pieces(&self, _: &str, _: &str, _: u64) -> Result<UploadedArtifact, WorkerError> {
            Err(WorkerError::LeaseLost)
        }
    }

    async fn run(checkpoint: Option<Value>, flags: Arc<StopFlags>) -> Arc<Steps> {
        let link = Arc::new(Steps::default());
        let ctx = TaskContext::new(
            Id::generate(longrun_core::IdKind::Operation),
            1,
            json!({"duration_ms": 10_000, "steps": 10}),
            link.clone(),
            flags,
        )
        .with_progress_interval(Duration::ZERO)
        .with_checkpoint(checkpoint);
        run_task(Arc::new(Sleep), ctx, Duration::from_secs(60)).await.unwrap();
        link
    }

    #[tokio::test(start_paused = true)]
    async fn it_resumes_after_the_last_step_its_checkpoint_counts() {
        let link = run(Some(json!({"steps_done": 7})), Arc::default()).await;
        assert_eq!(*link.reported.lock().unwrap(), vec![8.0, 9.0, 10.0]);
        assert!(matches!(*link.ended.lock().unwrap(), Some(Outcome::Succeeded { .. })));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_stops_it_mid_step_with_the_steps_done_as_its_checkpoint() {
        let flags = Arc::new(StopFlags::default());
        let pause = {
            let flags = flags.clone();
            async move {
                // Three and a half steps in.
                tokio::time::sleep(Duration::from_millis(3_500)).await;
                flags.pause.send_replace(true);
            }
        };
        let (link, ()) = tokio::join!(run(None, flags), pause);
        assert_eq!(*link.reported.lock().unwrap(), vec![1.0, 2.0, 3.0]);
        assert_eq!(
            *link.ended.lock().unwrap(),
            Some(Outcome::Paused {
                checkpoint: Some(json!({"steps_done": 3}))
            })
        );
    }

    #[test]
    fn input_validation() {
        assert_eq!(
            SleepInput::parse(&json!({"duration_ms": 100})).unwrap(),
            SleepInput {
                duration: Duration::from_millis(100),
                steps: 10,
                fail_with: None
            }
        );
        assert_eq!(
            SleepInput::parse(&json!({"duration_ms": 0, "steps": 1, "fail_with": "boom"}))
                .unwrap()
                .fail_with
                .as_deref(),
            Some("boom")
        );
        let spelled: Value = serde_json::from_str(r#"{"duration_ms": 1e2, "steps": 2.0}"#).unwrap();
        assert_eq!(
            SleepInput::parse(&spelled).unwrap().duration,
            Duration::from_millis(100)
        );
        for bad in [
            json!(null),
            json!([]),
            json!({}),
            json!({"duration_ms": -1}),
            json!({"duration_ms": 1.5}),
            json!({"duration_ms": "100"}),
            json!({"duration_ms": MAX_DURATION_MS + 1}),
            json!({"duration_ms": 1, "steps": 0}),
            json!({"duration_ms": 1, "fail_with": "Has Space"}),
            json!({"duration_ms": 1, "extra": true}),
        ] {
            assert!(SleepInput::parse(&bad).is_err(), "{bad}");
        }
    }
}
