//! The worker's side after a claim: fenced reads of leased tasks,
//! heartbeats, outcomes (one at a time and in batches) and the reaper of
//! lapsed leases.

use super::*;

pub(super) async fn fenced(c: &mut PgConnection, operation_id: &Id, lease_token: &str) -> Result<Fenced> {
    fenced_many(c, &[(operation_id.as_str(), lease_token)], Lock::ForUpdate)
        .await?
        .remove(&(operation_id.as_str().to_owned(), lease_token.to_owned()))
        .ok_or(StoreError::LeaseLost)
}

/// Whether `fenced_many` locks what it reads.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Lock {
    /// Read only: what was read may change before the transaction writes.
    None,
    /// Locked until the transaction ends.
    ForUpdate,
}

/// The fenced rows of many leases in one statement, keyed by operation id
/// and lease token: only the current holders' tasks are found; with
/// `Lock::ForUpdate` they are locked (in id order, so concurrent batches
/// cannot deadlock) until the transaction ends. Each lease is looked up by
/// its task's primary key (a LATERAL with a LIMIT, never a join the planner
/// could turn into a scan of every leased task; its other conditions are
/// outside it, or the planner, its statistics taken before anything was
/// leased, read every leased task through the partial index instead).
pub(super) async fn fenced_many(
    c: &mut PgConnection,
    leases: &[(&str, &str)],
    lock: Lock,
) -> Result<std::collections::HashMap<(String, String), Fenced>> {
    // Sorted by id: the locking variant locks in this order.
    let mut leases = leases.to_vec();
    leases.sort_unstable();
    let (ids, tokens): (Vec<&str>, Vec<&str>) = leases.into_iter().unzip();
    macro_rules! fenced_sql {
        ($lock:literal) => {
            concat!(
                "SELECT o.version, o.progress, o.cost_units, o.cancellable, o.cancel_requested_at IS NOT NULL,
                        o.cancel_reason, o.cancel_requested_by, o.attempt, COALESCE(k.max_attempts, 1),
                        o.budget_max_cost, COALESCE(t.lease_ms, 30000), t.operation_id, t.lease_token,
                        o.pause_requested_at IS NOT NULL
                   FROM unnest($1::TEXT[], $2::TEXT[]) WITH ORDINALITY AS f(op_id, token, n)
                  CROSS JOIN LATERAL (
                        SELECT operation_id, lease_token, lease_ms, status FROM tasks
                         WHERE operation_id = f.op_id LIMIT 1 ",
                $lock,
                ") t
                  CROSS JOIN LATERAL (
                        SELECT version, progress, cost_units, cancellable, cancel_requested_at, cancel_reason,
                               cancel_requested_by, attempt, budget_max_cost, pause_requested_at, kind, state
                          FROM operations WHERE id = f.op_id LIMIT 1 ",
                $lock,
                ") o
                   LEFT JOIN kinds k ON k.name = o.kind
                  WHERE t.lease_token = f.token AND t.status = 'leased' AND o.state = 'running'
                  ORDER BY f.n"
            )
        };
    }
    let rows = sqlx::query(match lock {
        Lock::ForUpdate => fenced_sql!("FOR UPDATE"),
        Lock::None => fenced_sql!(""),
    })
    .bind(&ids)
    .bind(&tokens)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    rows.iter()
        .map(|row| {
            let fenced = Fenced {
                version: row.try_get(0).map_err(db)?,
                progress: json_text(row.try_get(1).map_err(db)?)?.map(|v| progress_from_json(&v)),
                cost_units: row.try_get(2).map_err(db)?,
                cancellable: row.try_get(3).map_err(db)?,
                cancel_requested: row.try_get(4).map_err(db)?,
                cancel_reason: row.try_get(5).map_err(db)?,
                cancel_requested_by: row.try_get(6).map_err(db)?,
                attempt: row.try_get(7).map_err(db)?,
                max_attempts: row.try_get(8).map_err(db)?,
                budget_max_cost: row.try_get(9).map_err(db)?,
                lease_ms: row.try_get(10).map_err(db)?,
                pause_requested: row.try_get(13).map_err(db)?,
            };
            Ok(((row.try_get(11).map_err(db)?, row.try_get(12).map_err(db)?), fenced))
        })
        .collect()
}

/// The fenced rows of a batch of outcomes, in the batch's order: `None`
/// where the lease is not (or no longer) held, and for a second outcome
/// with the same lease in one batch, which finds it already used.
pub(super) async fn fenced_outcomes(
    c: &mut PgConnection,
    batch: &[&FinishParams],
    lock: Lock,
) -> Result<Vec<Option<Fenced>>> {
    let leases: Vec<(&str, &str)> = batch
        .iter()
        .map(|p| (p.operation_id.as_str(), p.lease_token.as_str()))
        .collect();
    let mut found = fenced_many(c, &leases, lock).await?;
    Ok(leases
        .into_iter()
        .map(|(id, token)| found.remove(&(id.to_owned(), token.to_owned())))
        .collect())
}

pub(super) async fn task_heartbeat(
    c: &mut PgConnection,
    ch: &mut Changes,
    p: &HeartbeatParams,
) -> Result<HeartbeatAck> {
    let current = fenced(c, &p.operation_id, &p.lease_token).await?;
    let lease_expires_at = p
        .now
        .plus(Duration::from_millis(u64::try_from(current.lease_ms).unwrap_or(0)));
    sqlx::query("UPDATE tasks SET lease_expires_at = $2 WHERE operation_id = $1")
        .bind(p.operation_id.as_str())
        .bind(lease_expires_at.0)
        .execute(&mut *c)
        .await
        .map_err(db)?;
    if let Some(checkpoint) = &p.checkpoint {
        // Kept with the operation, not a change of its representation.
        sqlx::query("UPDATE operations SET checkpoint = $2 WHERE id = $1")
            .bind(p.operation_id.as_str())
            .bind(checkpoint.to_string())
            .execute(&mut *c)
            .await
            .map_err(db)?;
    }
    let effect = heartbeat_effect(&current, p);
    let mut version = current.version;
    if let Some(data) = &effect.event {
        let sql = format!(
            "UPDATE operations SET progress = $2, cost_units = $3, cancellable = $4, version = version + 1, updated_at = $5
              WHERE id = $1 AND state = 'running' RETURNING {OP_COLUMNS}"
        );
        let updated = update_returning(
            c,
            sqlx::query(&sql)
                .bind(p.operation_id.as_str())
                .bind(effect.progress.as_ref().map(progress_text))
                .bind(effect.cost_units)
                .bind(effect.cancellable)
                .bind(p.now.0),
        )
        .await?
        .ok_or(StoreError::LeaseLost)?;
        version = updated.version;
        event_insert(c, ch, &updated, EventType::Progress, data).await?;
    }
    let (mut cancel_requested, mut cancel_reason) = (current.cancel_requested, current.cancel_reason);
    if effect.over_budget {
        let reason = "budget_exhausted";
        version = cancel_request(c, ch, p.operation_id.as_str(), SYSTEM, Some(reason), p.now).await?;
        (cancel_requested, cancel_reason) = (true, Some(reason.to_owned()));
    }
    Ok(HeartbeatAck {
        lease_expires_at,
        cancel_requested,
        cancel_reason,
        pause_requested: current.pause_requested && !cancel_requested,
        version,
    })
}

pub(super) async fn requeue(
    c: &mut PgConnection,
    ch: &mut Changes,
    id: &str,
    next_attempt: i64,
    progress: Option<&Progress>,
    now: Timestamp,
    data: &Value,
) -> Result<Operation> {
    let available_at = now.plus(retry_backoff(next_attempt));
    sqlx::query(
        "UPDATE tasks SET status = 'ready', lease_token = NULL, lease_expires_at = NULL, worker_id = NULL, available_at = $2
          WHERE operation_id = $1",
    )
    .bind(id)
    .bind(available_at.0)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    let sql = format!(
        "UPDATE operations SET attempt = $2, version = version + 1, updated_at = $3, progress = COALESCE($4, progress)
          WHERE id = $1 AND state = 'running' RETURNING {OP_COLUMNS}"
    );
    let progress = progress.map(progress_text);
    let requeued = update_returning(
        c,
        sqlx::query(&sql).bind(id).bind(next_attempt).bind(now.0).bind(progress),
    )
    .await?
    .ok_or(StoreError::NotFound)?;
    let mut data = data.clone();
    if let Some(fields) = data.as_object_mut() {
        fields.insert("next_attempt".into(), json!(next_attempt));
        fields.insert("available_at".into(), json!(available_at.to_rfc3339()));
    }
    event_insert(c, ch, &requeued, EventType::RetryScheduled, &data).await?;
    Ok(requeued)
}

/// Applies a batch of outcomes with a constant number of statements, most
/// of them without row locks: the fenced rows are read in one statement,
/// what each outcome means decided in Rust (`decide_finish`), and the
/// endings applied by `operations_end_guarded`, each only while its
/// operation is still at the version read. An ending whose operation
/// changed in between, and every outcome that is not an ending (a retry, a
/// pause, a refusal), go through `task_finish_locked`, which reads again
/// under row locks. A stale lease refuses only its own item, before
/// anything is written; a second outcome for one operation in the same
/// batch finds the lease already gone, as it would one batch later.
///
/// Locking every row first (`FOR UPDATE`) had cost each job two WAL
/// records and two more writes of its heap pages (`pg_walinspect` over an
/// in-process drain: 6.9 `Heap/LOCK` records per job).
pub(super) async fn task_finish_batch(
    c: &mut PgConnection,
    ch: &mut Changes,
    policy: Policy,
    batch: &[&FinishParams],
) -> Result<Vec<Result<Operation>>> {
    let seen = fenced_outcomes(c, batch, Lock::None).await?;
    let mut answers: Vec<Option<Result<Operation>>> = (0..batch.len()).map(|_| None).collect();
    let mut ends: Vec<(usize, Ending, i64)> = Vec::new();
    let mut again: Vec<usize> = Vec::new();
    for (i, (p, fenced)) in batch.iter().zip(seen).enumerate() {
        let Some(fenced) = fenced else {
            // A lease, once gone, never comes back.
            answers[i] = Some(Err(StoreError::LeaseLost));
            continue;
        };
        match decide_finish(&fenced, &p.outcome) {
            Ok(Decision::End(ending)) => {
                // The worker's last progress rides the outcome's own change.
                let progress = final_progress(&fenced, p.progress.as_ref(), p.now);
                ends.push((i, ending.with_progress(progress), fenced.version));
            }
            _ => again.push(i),
        }
    }
    // In id order, as the locked path locks: two batches ending the same
    // operations cannot wait for each other.
    ends.sort_by(|a, b| batch[a.0].operation_id.as_str().cmp(batch[b.0].operation_id.as_str()));
    let endings: Vec<(&str, &Ending, Timestamp)> = ends
        .iter()
        .map(|(i, e, _)| (batch[*i].operation_id.as_str(), e, batch[*i].now))
        .collect();
    let versions: Vec<i64> = ends.iter().map(|(_, _, version)| *version).collect();
    let mut ended = operations_end_guarded(c, ch, policy, &endings, &versions).await?;
    for (i, _, _) in &ends {
        match ended.remove(batch[*i].operation_id.as_str()) {
            Some(op) => answers[*i] = Some(Ok(op)),
            None => again.push(*i),
        }
    }
    if !again.is_empty() {
        again.sort_unstable();
        let rest: Vec<&FinishParams> = again.iter().map(|&i| batch[i]).collect();
        for (i, answer) in again.into_iter().zip(task_finish_locked(c, ch, policy, &rest).await?) {
            answers[i] = Some(answer);
        }
    }
    Ok(answers.into_iter().map(|a| a.expect("every item answered")).collect())
}

/// Applies outcomes under row locks: the fenced rows are read and locked
/// (in id order) in one statement, so nothing changes them between the
/// decision and its writes.
pub(super) async fn task_finish_locked(
    c: &mut PgConnection,
    ch: &mut Changes,
    policy: Policy,
    batch: &[&FinishParams],
) -> Result<Vec<Result<Operation>>> {
    let current = fenced_outcomes(c, batch, Lock::ForUpdate).await?;
    let mut answers: Vec<Option<Result<Operation>>> = Vec::with_capacity(batch.len());
    let mut ends: Vec<(usize, &str, Ending)> = Vec::new();
    for (i, (p, fenced)) in batch.iter().zip(current).enumerate() {
        let id = p.operation_id.as_str();
        let Some(fenced) = fenced else {
            answers.push(Some(Err(StoreError::LeaseLost)));
            continue;
        };
        // The worker's last progress rides the outcome's own change.
        let progress = final_progress(&fenced, p.progress.as_ref(), p.now);
        let decision = match decide_finish(&fenced, &p.outcome) {
            Ok(decision) => decision,
            Err(refused) => {
                answers.push(Some(Err(refused)));
                continue;
            }
        };
        match decision {
            Decision::End(ending) => {
                ends.push((i, id, ending.with_progress(progress)));
                answers.push(None);
            }
            Decision::Retry { next_attempt, data } => {
                let requeued = requeue(c, ch, id, next_attempt, progress.as_ref(), p.now, &data).await?;
                answers.push(Some(Ok(requeued)));
            }
            Decision::Pause {
                attempt,
                checkpoint,
                data,
            } => {
                let paused = operation_pause(
                    c,
                    ch,
                    id,
                    Some(attempt),
                    progress.as_ref(),
                    checkpoint.as_ref(),
                    &data,
                    p.now,
                )
                .await?;
                answers.push(Some(Ok(paused)));
            }
        }
    }
    let endings: Vec<(&str, &Ending, Timestamp)> = ends.iter().map(|(i, id, e)| (*id, e, batch[*i].now)).collect();
    let mut ended = operations_end(c, ch, policy, &endings).await?;
    for (i, id, _) in &ends {
        answers[*i] = Some(ended.remove(*id).ok_or(StoreError::LeaseLost));
    }
    Ok(answers.into_iter().map(|a| a.expect("every item answered")).collect())
}

pub(super) async fn task_reap(
    c: &mut PgConnection,
    ch: &mut Changes,
    policy: Policy,
    p: &ReapParams,
) -> Result<ReapCounts> {
    let rows = sqlx::query(
        "SELECT t.operation_id, o.attempt, o.cancel_requested_at IS NOT NULL, o.cancel_requested_by, o.cancel_reason,
                COALESCE(k.rerun_safe, FALSE), COALESCE(k.max_attempts, 1), o.pause_requested_at IS NOT NULL
           FROM tasks t
           JOIN operations o ON o.id = t.operation_id
           LEFT JOIN kinds k ON k.name = t.kind
          WHERE t.status = 'leased' AND t.lease_expires_at < $1
          ORDER BY t.lease_expires_at LIMIT $2
          FOR UPDATE OF t, o SKIP LOCKED",
    )
    .bind(p.now.0)
    .bind(i64::from(p.limit))
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    let mut counts = ReapCounts::default();
    for r in &rows {
        let id: String = r.try_get(0).map_err(db)?;
        let task = Lapsed {
            attempt: r.try_get(1).map_err(db)?,
            cancel_requested: r.try_get(2).map_err(db)?,
            cancel_requested_by: r.try_get(3).map_err(db)?,
            cancel_reason: r.try_get(4).map_err(db)?,
            rerun_safe: r.try_get(5).map_err(db)?,
            max_attempts: r.try_get(6).map_err(db)?,
            pause_requested: r.try_get(7).map_err(db)?,
        };
        let decision = decide_reap(&task);
        match &decision {
            Decision::End(ending) => operation_end(c, ch, policy, &id, ending, p.now).await?,
            Decision::Retry { next_attempt, data } => requeue(c, ch, &id, *next_attempt, None, p.now, data).await?,
            Decision::Pause { attempt, data, .. } => {
                operation_pause(c, ch, &id, Some(*attempt), None, None, data, p.now).await?
            }
        };
        counts.count(&task, &decision);
    }
    Ok(counts)
}
