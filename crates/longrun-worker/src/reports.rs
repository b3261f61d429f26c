//! The limits on what a worker reports — progress, cost, checkpoints and
//! outcomes — in one place: the HTTP worker endpoints refuse a report that
//! breaks them, and the worker SDK (in process and remote alike) checks
//! before sending, so a built-in kind cannot store what a remote worker
//! could not.

use longrun_api::{ErrorRequest, ProgressRequest};
use longrun_core::task::{MAX_CHECKPOINT_BYTES, OperationError, Outcome, ProgressUpdate};
use longrun_core::validate;
use serde_json::Value;

/// Largest inline result; anything bigger goes through an artifact upload.
pub const MAX_INLINE_RESULT_BYTES: usize = 64 * 1024;
/// Largest `progress.details`, as JSON text.
pub const MAX_PROGRESS_DETAILS_BYTES: usize = 4 * 1024;
/// Longest `progress.unit`, in characters.
pub const MAX_PROGRESS_UNIT_CHARS: usize = 32;
/// Longest `progress.phase`, in characters.
pub const MAX_PROGRESS_PHASE_CHARS: usize = 64;
/// Longest `error.message` of a failure, in characters.
pub const MAX_ERROR_MESSAGE_CHARS: usize = 4096;

/// A report that breaks a limit; the text says which, for the worker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// A value outside its rule (`400 invalid_request` over HTTP).
    #[error("{0}")]
    Invalid(String),
    /// A value over its size (`413 payload_too_large` over HTTP).
    #[error("{0}")]
    TooLarge(String),
}

/// A progress report as the worker protocol carries it.
pub fn progress_to_wire(p: ProgressUpdate) -> ProgressRequest {
    ProgressRequest {
        completed_units: p.completed_units,
        total_units: p.total_units,
        unit: p.unit,
        phase: p.phase,
        details: p.details,
    }
}

/// A progress report as the store takes it (checked with [`check_progress`]).
pub fn progress_from_wire(p: ProgressRequest) -> ProgressUpdate {
    ProgressUpdate {
        completed_units: p.completed_units,
        total_units: p.total_units,
        unit: p.unit,
        phase: p.phase,
        details: p.details,
    }
}

/// A worker's error as the worker protocol carries it.
pub fn error_to_wire(e: OperationError) -> ErrorRequest {
    ErrorRequest {
        code: e.code,
        message: e.message,
        retryable: e.retryable,
    }
}

/// A worker's error as the store keeps it (checked with [`check_outcome`]).
pub fn error_from_wire(e: ErrorRequest) -> OperationError {
    OperationError {
        code: e.code,
        message: e.message,
        retryable: e.retryable,
    }
}

/// The length of `value` as compact JSON text, counted as it is written
/// rather than built: these checks run on every report.
fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).map_or(usize::MAX, |()| count.0)
}

/// A progress report within its limits, with `details: null` read as none.
pub fn check_progress(progress: ProgressUpdate) -> Result<ProgressUpdate, ReportError> {
    let finite = |v: Option<f64>, field: &str| match v {
        Some(x) if !x.is_finite() || x < 0.0 => Err(ReportError::Invalid(format!(
            "progress.{field} must be a non-negative number"
        ))),
        _ => Ok(v),
    };
    let short = |v: &Option<String>, field: &str, max: usize| match v {
        Some(s) if s.is_empty() || s.chars().count() > max => Err(ReportError::Invalid(format!(
            "progress.{field} must be 1–{max} characters"
        ))),
        _ => Ok(()),
    };
    short(&progress.unit, "unit", MAX_PROGRESS_UNIT_CHARS)?;
    short(&progress.phase, "phase", MAX_PROGRESS_PHASE_CHARS)?;
    if let Some(details) = &progress.details {
        let size = json_len(details);
        if size > MAX_PROGRESS_DETAILS_BYTES {
            return Err(ReportError::TooLarge(format!(
                "progress.details is {size} bytes; at most {MAX_PROGRESS_DETAILS_BYTES}"
            )));
        }
    }
    Ok(ProgressUpdate {
        completed_units: finite(progress.completed_units, "completed_units")?,
        total_units: finite(progress.total_units, "total_units")?,
        unit: progress.unit,
        phase: progress.phase,
        details: progress.details.filter(|d| !d.is_null()),
    })
}

/// A checkpoint within [`MAX_CHECKPOINT_BYTES`].
pub fn check_checkpoint(checkpoint: &Value) -> Result<(), ReportError> {
    let size = json_len(checkpoint);
    if size > MAX_CHECKPOINT_BYTES {
        return Err(ReportError::TooLarge(format!(
            "the checkpoint is {size} bytes; at most {} are kept",
            MAX_CHECKPOINT_BYTES
        )));
    }
    Ok(())
}

/// A total cost that is a finite number, not below zero.
pub fn check_cost(cost_units: Option<f64>) -> Result<(), ReportError> {
    match cost_units {
        Some(cost) if !cost.is_finite() || cost < 0.0 => {
            Err(ReportError::Invalid("cost_units must be a non-negative number".into()))
        }
        _ => Ok(()),
    }
}

/// An outcome within its limits: an inline result of at most
/// [`MAX_INLINE_RESULT_BYTES`], an error code of a kind name's syntax and a
/// message of at most [`MAX_ERROR_MESSAGE_CHARS`], a checkpoint within its
/// bound.
pub fn check_outcome(operation_id: &longrun_core::Id, outcome: &Outcome) -> Result<(), ReportError> {
    match outcome {
        Outcome::Succeeded { result: Some(result) } => {
            let size = json_len(result);
            if size > MAX_INLINE_RESULT_BYTES {
                return Err(ReportError::TooLarge(format!(
                    "the inline result is {size} bytes; at most {MAX_INLINE_RESULT_BYTES} may be inline. Upload \
                     larger results as an artifact (PUT /v1/worker/tasks/{operation_id}/artifact) and complete \
                     without `result`"
                )));
            }
        }
        Outcome::Failed { error } => {
            validate::kind_name(&error.code).map_err(|_| {
                ReportError::Invalid("error.code must be 1–64 characters of a-z, 0-9, '_', '.', '-'".into())
            })?;
            if error.message.chars().count() > MAX_ERROR_MESSAGE_CHARS {
                return Err(ReportError::Invalid(format!(
                    "error.message is longer than {MAX_ERROR_MESSAGE_CHARS} characters"
                )));
            }
        }
        Outcome::Paused { checkpoint: Some(c) } => check_checkpoint(c)?,
        Outcome::Succeeded { result: None } | Outcome::Cancelled | Outcome::Paused { checkpoint: None } => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn id() -> longrun_core::Id {
        longrun_core::Id::generate(longrun_core::IdKind::Operation)
    }

    #[test]
    fn each_limit_refuses_just_past_its_bound() {
        let big = |n: usize| json!("x".repeat(n));
        let at = MAX_INLINE_RESULT_BYTES - 2; // the quotes
        assert!(check_outcome(&id(), &Outcome::Succeeded { result: Some(big(at)) }).is_ok());
        assert!(matches!(
            check_outcome(
                &id(),
                &Outcome::Succeeded {
                    result: Some(big(at + 1))
                }
            ),
            Err(ReportError::TooLarge(_))
        ));
        let failed = |code: &str, message: usize| Outcome::Failed {
            error: OperationError {
                code: code.into(),
                message: "m".repeat(message),
                retryable: false,
            },
        };
        assert!(check_outcome(&id(), &failed("quota.hit", MAX_ERROR_MESSAGE_CHARS)).is_ok());
        assert!(check_outcome(&id(), &failed("quota.hit", MAX_ERROR_MESSAGE_CHARS + 1)).is_err());
        assert!(check_outcome(&id(), &failed("Not A Code", 1)).is_err());
        let details = |n: usize| ProgressUpdate {
            details: Some(big(n - 2)),
            ..ProgressUpdate::default()
        };
        assert!(check_progress(details(MAX_PROGRESS_DETAILS_BYTES)).is_ok());
        assert!(check_progress(details(MAX_PROGRESS_DETAILS_BYTES + 1)).is_err());
        let unit = |n: usize| ProgressUpdate {
            unit: Some("u".repeat(n)),
            ..ProgressUpdate::default()
        };
        assert!(check_progress(unit(MAX_PROGRESS_UNIT_CHARS)).is_ok());
        assert!(check_progress(unit(MAX_PROGRESS_UNIT_CHARS + 1)).is_err());
        assert!(check_progress(unit(0)).is_err());
        let negative = ProgressUpdate {
            completed_units: Some(-1.0),
            ..ProgressUpdate::default()
        };
        assert!(check_progress(negative).is_err());
        assert!(check_cost(Some(f64::NAN)).is_err());
        assert!(check_cost(Some(0.0)).is_ok());
        let checkpoint = big(MAX_CHECKPOINT_BYTES - 1);
        assert!(check_checkpoint(&checkpoint).is_err());
        assert!(check_checkpoint(&big(MAX_CHECKPOINT_BYTES - 2)).is_ok());
    }

    #[test]
    fn lengths_are_those_of_the_compact_text() {
        for value in [
            json!(null),
            json!("é\"\n"),
            json!({"a": [1, 2.5, true], "b": {"c": "x"}}),
        ] {
            assert_eq!(json_len(&value), serde_json::to_string(&value).unwrap().len());
        }
    }

    #[test]
    fn a_null_details_is_no_details() {
        let p = check_progress(ProgressUpdate {
            details: Some(Value::Null),
            ..ProgressUpdate::default()
        })
        .unwrap();
        assert_eq!(p.details, None);
    }
}
