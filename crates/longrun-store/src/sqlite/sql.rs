//! The SQL of the SQLite backend. Every function runs on a connection handed
//! to it by the writer thread (inside a savepoint of a group commit) or by the
//! reader pool; none of them opens its own transaction.
//!
//! Every change of `operations` is `UPDATE OR FAIL` of one row by id, and
//! the rules the schema enforces on it (migration 0014) refuse with
//! `RAISE(FAIL)`: nothing then makes SQLite open a statement journal for the
//! update (a third of its cost on the job path), and the savepoint every
//! store write runs in is what rolls a refused write back whole. For the
//! same reason a list of constants after `IN` has at most two: a longer one
//! is evaluated through an ephemeral table built on every run.

use std::collections::BTreeMap;
use std::time::Duration;

use longrun_core::apikey::Role;
use longrun_core::fingerprint::Fingerprint;
use longrun_core::id::random_base32;
use longrun_core::lease::retry_backoff;
use longrun_core::{Id, IdKind, State, Timestamp};
use rusqlite::types::Type;
use rusqlite::{Connection, OptionalExtension, Row, params};
use serde_json::{Value, json};

use super::WritePolicy;
use crate::shared::*;
use crate::*;

const OP_COLUMNS: &str = "id, tenant, kind, state, version, attempt, input, callback_url, deadline_at, \
    budget_max_cost, cost_units, labels, progress, result, error_code, error_message, error_retryable, \
    cancel_requested_at, cancel_requested_by, cancel_reason, cancellable, idempotency_key, created_at, \
    started_at, completed_at, updated_at, expires_at, artifact, rerun_of, pause_requested_at";

const OP_COLUMN_COUNT: usize = 30;

fn conversion_error(idx: usize, e: impl std::error::Error + Send + Sync + 'static) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(idx, Type::Text, Box::new(e))
}

fn json_column(r: &Row, idx: usize) -> rusqlite::Result<Option<Value>> {
    let text: Option<String> = r.get(idx)?;
    text.map(|t| serde_json::from_str(&t).map_err(|e| conversion_error(idx, e)))
        .transpose()
}

fn ts(ms: Option<i64>) -> Option<Timestamp> {
    ms.map(Timestamp)
}

fn state_column(r: &Row, idx: usize) -> rusqlite::Result<State> {
    let s: String = r.get(idx)?;
    s.parse().map_err(|e| conversion_error(idx, e))
}

fn operation_from_row(r: &Row) -> rusqlite::Result<Operation> {
    let labels: BTreeMap<String, String> = match json_column(r, 11)? {
        Some(v) => serde_json::from_value(v).map_err(|e| conversion_error(11, e))?,
        None => BTreeMap::new(),
    };
    let error_code: Option<String> = r.get(14)?;
    let cancel_requested_at: Option<i64> = r.get(17)?;
    Ok(Operation {
        id: Id::from_trusted(r.get(0)?),
        tenant: r.get(1)?,
        kind: r.get(2)?,
        state: state_column(r, 3)?,
        version: r.get(4)?,
        attempt: r.get(5)?,
        input: json_column(r, 6)?,
        callback_url: r.get(7)?,
        deadline_at: ts(r.get(8)?),
        budget_max_cost: r.get(9)?,
        cost_units: r.get(10)?,
        labels,
        progress: json_column(r, 12)?.map(|v| progress_from_json(&v)),
        result: json_column(r, 13)?,
        error: match error_code {
            Some(code) => Some(OperationError {
                code,
                message: r.get::<_, Option<String>>(15)?.unwrap_or_default(),
                retryable: r.get::<_, Option<bool>>(16)?.unwrap_or(false),
            }),
            None => None,
        },
        cancel: match cancel_requested_at {
            Some(at) => Some(CancelRequest {
                requested_at: Timestamp(at),
                requested_by: r.get::<_, Option<String>>(18)?.unwrap_or_default(),
                reason: r.get(19)?,
            }),
            None => None,
        },
        cancellable: r.get(20)?,
        idempotency_key: r.get(21)?,
        created_at: Timestamp(r.get(22)?),
        started_at: ts(r.get(23)?),
        completed_at: ts(r.get(24)?),
        updated_at: Timestamp(r.get(25)?),
        expires_at: ts(r.get(26)?),
        artifact: None,
        artifacts: BTreeMap::new(),
        rerun_of: r.get::<_, Option<String>>(28)?.map(Id::from_trusted),
        reruns: None,
        pause_requested_at: ts(r.get(29)?),
    })
    .and_then(|mut op| {
        (op.artifact, op.artifacts) = artifacts_from_json(json_column(r, 27)?.as_ref());
        Ok(op)
    })
}

/// Records one change of `op` (its new row, after the update): the event with
/// its version and a snapshot of the representation at that version (without
/// the input), and notes the change for subscribers once the batch commits.
fn event_insert(c: &Connection, op: &Operation, event_type: &str, data: &Value) -> Result<()> {
    event_insert_at(c, None, op, event_type, data)
}

/// [`event_insert`], given the operation's `seq` when the caller has it (it
/// just inserted the row): one index lookup fewer per submission.
fn event_insert_at(c: &Connection, seq: Option<i64>, op: &Operation, event_type: &str, data: &Value) -> Result<()> {
    c.prepare_cached(
        "INSERT INTO operation_events (op_seq, version, type, state, at, data, snapshot)
         VALUES (coalesce(?8, (SELECT seq FROM operations WHERE id = ?1)), ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        op.id.as_str(),
        op.version,
        event_type,
        op.state.as_str(),
        op.updated_at.0,
        data.to_string(),
        snapshot_text(op),
        seq
    ])?;
    super::changes::record(op, event_type);
    Ok(())
}

/// Runs `sql`, an UPDATE of the one operation `WHERE id = ?1`, with `id`
/// bound as `?1` and `rest` as `?2`…, and returns the new row, or `None` if
/// the update matched nothing. The id is bound here, once, so the row
/// updated and the row read back are the same one.
///
/// Read back by id rather than with `RETURNING`: SQLite gathers returned
/// rows in an ephemeral table, and opening and closing one (a pager and
/// page cache of its own) cost more than the indexed read — a profile of
/// the in-process drain put ~6 % of the writer there.
fn update_and_read(c: &Connection, id: &str, sql: &str, rest: &[&dyn rusqlite::ToSql]) -> Result<Option<Operation>> {
    let mut args: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(1 + rest.len());
    args.push(&id);
    args.extend_from_slice(rest);
    if c.prepare_cached(sql)?.execute(&*args)? == 0 {
        return Ok(None);
    }
    operation_by_id(c, id)
}

fn operation_by_id(c: &Connection, id: &str) -> Result<Option<Operation>> {
    let sql = format!("SELECT {OP_COLUMNS} FROM operations WHERE id = ?1");
    Ok(c.prepare_cached(&sql)?
        .query_row(params![id], operation_from_row)
        .optional()?)
}

pub(super) fn operation_get(c: &Connection, tenant: &str, id: &Id) -> Result<Option<Operation>> {
    // The tenant is part of the lookup: another tenant's id is simply absent.
    let sql = format!("SELECT {OP_COLUMNS} FROM operations WHERE id = ?1 AND tenant = ?2");
    Ok(c.prepare_cached(&sql)?
        .query_row(params![id.as_str(), tenant], operation_from_row)
        .optional()?)
}

/// [`operation_get`] for readers: with its re-runs, from the partial index
/// of `rerun_of`, in the same statement, and the size of its stored JSON
/// (for the read cache).
pub(super) fn operation_read(c: &Connection, tenant: &str, id: &Id) -> Result<Option<(Operation, usize)>> {
    let sql = format!(
        "SELECT {OP_COLUMNS}, (SELECT json_group_array(id) FROM
                   (SELECT r.id FROM operations r WHERE r.rerun_of = operations.id ORDER BY r.seq)),
                COALESCE(length(input), 0) + COALESCE(length(result), 0) + COALESCE(length(progress), 0)
                  + COALESCE(length(labels), 0)
           FROM operations WHERE id = ?1 AND tenant = ?2"
    );
    Ok(c.prepare_cached(&sql)?
        .query_row(params![id.as_str(), tenant], |r| {
            let mut op = operation_from_row(r)?;
            let reruns: Vec<String> = json_column(r, OP_COLUMN_COUNT)?
                .and_then(|v| serde_json::from_value(v).ok())
                .unwrap_or_default();
            op.reruns = Some(reruns.into_iter().map(Id::from_trusted).collect());
            let json_bytes: i64 = r.get(OP_COLUMN_COUNT + 1)?;
            Ok((op, usize::try_from(json_bytes).unwrap_or(usize::MAX)))
        })
        .optional()?)
}

pub(super) fn operation_accept(c: &Connection, p: &AcceptParams) -> Result<AcceptOutcome> {
    if let Some((key, fingerprint)) = &p.idempotency {
        // Insert-or-detect: the primary key on (tenant, kind, key) is where
        // concurrent first requests converge, never an in-memory check.
        let inserted = c
            .prepare_cached(
                "INSERT INTO idempotency_keys (tenant, kind, key, fingerprint, operation_id, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
            )?
            .execute(params![
                p.tenant,
                p.kind,
                key.as_str(),
                &fingerprint.0[..],
                p.id.as_str(),
                p.now.0
            ])?;
        if inserted == 0 {
            let (stored, operation_id): (Vec<u8>, String) = c
                .prepare_cached(
                    "SELECT fingerprint, operation_id FROM idempotency_keys WHERE tenant = ?1 AND kind = ?2 AND key = ?3",
                )?
                .query_row(params![p.tenant, p.kind, key.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))?;
            let stored = Fingerprint(
                stored
                    .try_into()
                    .map_err(|_| StoreError::Corrupt("a stored fingerprint is not 32 bytes".into()))?,
            );
            let operation_id = Id::from_trusted(operation_id);
            if !fingerprint.matches(&stored) {
                return Ok(AcceptOutcome::KeyReused { operation_id });
            }
            // A removed operation's key stays taken while its tombstone
            // lives: a replay must not silently start the work again.
            let original = operation_by_id(c, operation_id.as_str())?.ok_or(StoreError::Gone)?;
            c.prepare_cached(
                "UPDATE idempotency_keys SET replays = replays + 1 WHERE tenant = ?1 AND kind = ?2 AND key = ?3",
            )?
            .execute(params![p.tenant, p.kind, key.as_str()])?;
            return Ok(AcceptOutcome::Replayed(original));
        }
    }

    // Quotas are checked after idempotency, so a replay still answers even
    // when the tenant is at its limit, and inside the transaction, so
    // concurrent submissions cannot overshoot it.
    let max_active: Option<i64> = c
        .prepare_cached("SELECT max_active FROM tenants WHERE name = ?1")?
        .query_row(params![p.tenant], |r| r.get(0))
        .optional()?
        .flatten();
    if let Some(max_active) = max_active {
        let active: i64 = c
            .prepare_cached(
                "SELECT (SELECT COUNT(*) FROM tasks WHERE tenant = ?1 AND status = 'ready')
                      + (SELECT COUNT(*) FROM tasks WHERE tenant = ?1 AND status = 'leased')",
            )?
            .query_row(params![p.tenant], |r| r.get(0))?;
        if active >= max_active {
            // The idempotency record inserted above is rolled back with this job.
            return Err(StoreError::QuotaExceeded { active, max_active });
        }
    }

    let labels = serde_json::to_string(&p.labels).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let idempotency_key = p.idempotency.as_ref().map(|(k, _)| k.as_str());
    c.prepare_cached(
        "INSERT INTO operations (id, tenant, kind, state, version, attempt, input, callback_url, deadline_at,
                                 budget_max_cost, labels, idempotency_key, created_at, updated_at, rerun_of)
         VALUES (?1, ?2, ?3, 'queued', 1, 0, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10, ?11)",
    )?
    .execute(params![
        p.id.as_str(),
        p.tenant,
        p.kind,
        p.input.to_string(),
        p.callback_url,
        p.deadline_at.map(|t| t.0),
        p.budget_max_cost,
        labels,
        idempotency_key,
        p.now.0,
        p.rerun_of.as_ref().map(Id::as_str),
    ])?;
    let seq = c.last_insert_rowid();
    if p.from_checkpoint
        && let Some(original) = &p.rerun_of
    {
        c.prepare_cached(
            "UPDATE OR FAIL operations SET checkpoint = (SELECT checkpoint FROM operations WHERE id = ?2) WHERE id = ?1",
        )?
        .execute(params![p.id.as_str(), original.as_str()])?;
        // The pieces the checkpoint counts on, shared with the original.
        c.prepare_cached(
            "INSERT INTO artifact_pieces (operation_id, name, piece_offset, storage_key, size_bytes)
             SELECT ?1, name, piece_offset, storage_key, size_bytes FROM artifact_pieces WHERE operation_id = ?2",
        )?
        .execute(params![p.id.as_str(), original.as_str()])?;
    }
    c.prepare_cached(
        "INSERT INTO tasks (operation_id, seq, tenant, kind, status, available_at) VALUES (?1, ?2, ?3, ?4, 'ready', ?5)",
    )?
    .execute(params![p.id.as_str(), seq, p.tenant, p.kind, p.now.0])?;
    for upload in &p.uploads {
        c.prepare_cached("INSERT OR IGNORE INTO operation_uploads (operation_id, upload_id) VALUES (?1, ?2)")?
            .execute(params![p.id.as_str(), upload.as_str()])?;
    }

    let created = created_operation(p);
    event_insert_at(c, Some(seq), &created, "created", &json!({}))?;
    Ok(AcceptOutcome::Created(created))
}

pub(super) fn operation_list(c: &Connection, p: &ListParams) -> Result<OperationPage> {
    let mut sql = format!("SELECT {OP_COLUMNS}, seq FROM operations WHERE 1 = 1");
    let mut args: Vec<Box<dyn rusqlite::ToSql>> = Vec::new();
    if let Some(tenant) = &p.tenant {
        args.push(Box::new(tenant.clone()));
        sql.push_str(&format!(" AND tenant = ?{}", args.len()));
    }
    if let Some(from) = p.created_from {
        args.push(Box::new(from.0));
        sql.push_str(&format!(" AND created_at >= ?{}", args.len()));
    }
    if let Some(before) = p.created_before {
        args.push(Box::new(before.0));
        sql.push_str(&format!(" AND created_at < ?{}", args.len()));
    }
    if let Some(state) = p.state {
        args.push(Box::new(state.as_str()));
        sql.push_str(&format!(" AND state = ?{}", args.len()));
    }
    if let Some(kind) = &p.kind {
        args.push(Box::new(kind.clone()));
        sql.push_str(&format!(" AND kind = ?{}", args.len()));
    }
    if let Some((key, value)) = &p.label {
        // Label keys are validated to [a-z0-9_.-/], so quoting the path is safe.
        args.push(Box::new(format!("$.\"{key}\"")));
        args.push(Box::new(value.clone()));
        sql.push_str(&format!(
            " AND json_extract(labels, ?{}) = ?{}",
            args.len() - 1,
            args.len()
        ));
    }
    if let Some(before) = p.before_seq {
        args.push(Box::new(before));
        sql.push_str(&format!(" AND seq < ?{}", args.len()));
    }
    if let Some(now) = p.visible_at {
        args.push(Box::new(now.0));
        sql.push_str(&format!(" AND (expires_at IS NULL OR expires_at > ?{})", args.len()));
    }
    let page_size = i64::from(p.page_size.max(1));
    args.push(Box::new(page_size + 1));
    sql.push_str(&format!(" ORDER BY seq DESC LIMIT ?{}", args.len()));

    let mut stmt = c.prepare_cached(&sql)?;
    let rows = stmt.query_map(rusqlite::params_from_iter(args.iter()), |r| {
        let seq: i64 = r.get(OP_COLUMN_COUNT)?;
        Ok((seq, operation_from_row(r)?))
    })?;
    let mut operations = Vec::new();
    let mut seqs = Vec::new();
    for row in rows {
        let (seq, op) = row?;
        seqs.push(seq);
        operations.push(op);
    }
    Ok(crate::shared::page(operations, &seqs, page_size))
}

/// Whether `id` is an operation of `tenant` (another tenant's id is unknown).
fn owns(c: &Connection, tenant: &str, id: &Id) -> Result<bool> {
    Ok(
        c.prepare_cached("SELECT 1 FROM operations WHERE id = ?1 AND tenant = ?2")?
            .query_row(params![id.as_str(), tenant], |r| r.get::<_, i64>(0))
            .optional()?
            .is_some(),
    )
}

pub(super) fn operation_history(c: &Connection, tenant: &str, id: &Id) -> Result<Option<Vec<Event>>> {
    if !owns(c, tenant, id)? {
        return Ok(None);
    }
    let mut stmt = c.prepare_cached(
        "SELECT version, type, state, at, data FROM operation_events
          WHERE op_seq = (SELECT seq FROM operations WHERE id = ?1) ORDER BY version",
    )?;
    let events = stmt
        .query_map(params![id.as_str()], |r| {
            Ok(Event {
                operation_id: id.clone(),
                version: r.get(0)?,
                event_type: r.get(1)?,
                state: state_column(r, 2)?,
                at: Timestamp(r.get(3)?),
                data: json_column(r, 4)?.unwrap_or(Value::Null),
                snapshot: None,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(Some(events))
}

/// Moves a non-terminal operation to a terminal state, removes its dispatch
/// record, drops its input (unless kept), records the event and its webhook,
/// and returns the ended operation.
fn operation_end(c: &Connection, policy: WritePolicy, id: &str, ending: &Ending, now: Timestamp) -> Result<Operation> {
    let current = operation_by_id(c, id)?.ok_or(StoreError::LeaseLost)?;
    end_operation(c, policy, current, ending, now)
}

/// [`operation_end`] of `current`, the operation's row as just read in
/// this transaction. The ended row is [`Ending::apply`]'s, written as is
/// (at the version read), so it is not read back.
fn end_operation(
    c: &Connection,
    policy: WritePolicy,
    current: Operation,
    ending: &Ending,
    now: Timestamp,
) -> Result<Operation> {
    debug_assert!(ending.to.is_terminal());
    if current.state.is_terminal() {
        return Err(StoreError::LeaseLost);
    }
    let read_at = current.version;
    let ended = ending.apply(current, now, policy.operation_retention, policy.keep_inputs);
    let id = ended.id.clone();
    let id = id.as_str();
    let changed = c
        .prepare_cached(
            "UPDATE OR FAIL operations
                SET state = ?2, version = ?3, result = ?4, error_code = ?5, error_message = ?6,
                    error_retryable = ?7, completed_at = ?8, updated_at = ?8, expires_at = ?9,
                    input = CASE WHEN ?10 THEN NULL ELSE input END, progress = COALESCE(?11, progress)
              WHERE id = ?1 AND version = ?12",
        )?
        .execute(params![
            id,
            ended.state.as_str(),
            ended.version,
            ended.result.as_ref().map(Value::to_string),
            ended.error.as_ref().map(|e| e.code.as_str()),
            ended.error.as_ref().map(|e| e.message.as_str()),
            ended.error.as_ref().map(|e| e.retryable),
            now.0,
            ended.expires_at.map(|t| t.0),
            ending.drops_input(policy.keep_inputs),
            ending.progress_json(),
            read_at,
        ])?;
    if changed == 0 {
        return Err(StoreError::LeaseLost);
    }
    c.prepare_cached("DELETE FROM tasks WHERE operation_id = ?1")?
        .execute(params![id])?;
    let ended = if ending.publishes {
        result_publish(c, policy, ended, now)?
    } else {
        result_discard(c, id, now)?;
        ended
    };
    if ending.to == State::Cancelled {
        // Cancelled work leaves nothing behind; a failed one keeps its
        // pieces for a `from_checkpoint` re-run.
        pieces_drop(c, id, None, None, now)?;
    }
    event_insert(c, &ended, ending.to.as_str(), &ending.event_data())?;
    outbox_insert(c, &ended)?;
    Ok(ended)
}

pub(super) fn operation_cancel(c: &Connection, policy: WritePolicy, p: &CancelParams) -> Result<CancelOutcome> {
    let op = operation_get(c, &p.tenant, &p.id)?.ok_or(StoreError::NotFound)?;
    if let std::ops::ControlFlow::Break(answered) = crate::shared::cancel_checks(op, p)? {
        return Ok(answered);
    }
    // Running work waiting for a retry has no worker to tell: like queued
    // work, it is cancelled at once.
    let leased: Option<bool> = c
        .prepare_cached("SELECT status = 'leased' FROM tasks WHERE operation_id = ?1")?
        .query_row(params![p.id.as_str()], |r| r.get(0))
        .optional()?;
    let id = p.id.as_str();
    if leased == Some(true) {
        cancel_request(c, id, &p.requested_by, p.reason.as_deref(), p.now)?;
        let op = operation_by_id(c, id)?.ok_or(StoreError::NotFound)?;
        return Ok(CancelOutcome::Requested(op));
    }
    c.prepare_cached(
        "UPDATE OR FAIL operations SET cancel_requested_at = ?2, cancel_requested_by = ?3, cancel_reason = ?4 WHERE id = ?1",
    )?
    .execute(params![id, p.now.0, p.requested_by, p.reason])?;
    let op = operation_end(c, policy, id, &Ending::cancelled(), p.now)?;
    Ok(CancelOutcome::CancelledNow(op))
}

/// Tenants with ready work, least recently served first. The recursive
/// query walks the `tasks_ready_by_tenant` index one tenant at a time (a
/// loose index scan), so its cost follows the number of tenants, not tasks.
fn tenants_with_ready_work(c: &Connection) -> Result<Vec<(String, Option<i64>, i64)>> {
    let mut stmt = c.prepare_cached(
        "WITH RECURSIVE ready(tenant) AS (
             SELECT MIN(tenant) FROM tasks WHERE status = 'ready'
             UNION ALL
             SELECT (SELECT MIN(tenant) FROM tasks WHERE status = 'ready' AND tenant > ready.tenant)
               FROM ready WHERE ready.tenant IS NOT NULL
         )
         SELECT ready.tenant, t.max_running, COALESCE(d.last_claimed, 0)
           FROM ready
           LEFT JOIN tenants t ON t.name = ready.tenant
           LEFT JOIN tenant_dispatch d ON d.tenant = ready.tenant
          WHERE ready.tenant IS NOT NULL
          ORDER BY COALESCE(d.last_claimed, 0), ready.tenant",
    )?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Claims up to `max_tasks` tasks, fairly across tenants: tenants are served
/// round-robin, least recently served first, one task at a time, and a tenant
/// at its `max_running` is skipped. Within a tenant, oldest first.
pub(super) fn task_claim(c: &Connection, policy: WritePolicy, p: &ClaimParams) -> Result<Vec<Task>> {
    if p.kinds.is_empty() || p.max_tasks == 0 {
        return Ok(Vec::new());
    }
    let want = p.max_tasks as usize;
    // Each tenant's oldest claimable tasks of the wanted kinds, up to what it may run.
    let mut queues: Vec<(String, std::collections::VecDeque<String>)> = Vec::new();
    let tenants = tenants_with_ready_work(c)?;
    let record_order = records_served_order(tenants.len());
    for (tenant, max_running, _) in tenants {
        let mut allowance = want as i64;
        if let Some(max_running) = max_running {
            let running: i64 = c
                .prepare_cached("SELECT COUNT(*) FROM tasks WHERE tenant = ?1 AND status = 'leased'")?
                .query_row(params![tenant], |r| r.get(0))?;
            allowance = allowance.min(max_running - running);
        }
        if allowance <= 0 {
            continue;
        }
        let mut heads: Vec<(i64, String)> = Vec::new();
        for kind in &p.kinds {
            let mut stmt = c.prepare_cached(READY_HEADS)?;
            let rows = stmt.query_map(params![tenant, kind, p.now.0], |r| Ok((r.get(0)?, r.get(1)?)))?;
            for row in rows.take(usize::try_from(allowance).unwrap_or(0)) {
                heads.push(row?);
            }
        }
        heads.sort();
        heads.truncate(allowance as usize);
        if !heads.is_empty() {
            queues.push((tenant, heads.into_iter().map(|(_, id)| id).collect()));
        }
    }

    let mut picked: Vec<(String, String)> = Vec::with_capacity(want);
    while picked.len() < want && !queues.is_empty() {
        queues.retain_mut(|(tenant, queue)| {
            if picked.len() < want
                && let Some(id) = queue.pop_front()
            {
                picked.push((tenant.clone(), id));
            }
            !queue.is_empty()
        });
    }

    let lease_expires_at = p.now.plus(p.lease);
    let mut tasks = Vec::with_capacity(picked.len());
    let mut served: Vec<String> = Vec::new();
    for (tenant, id) in picked {
        if let Some(task) = lease_task(c, policy, p, &id, lease_expires_at)? {
            tasks.push(task);
            if record_order && !served.contains(&tenant) {
                served.push(tenant);
            }
        }
    }
    for tenant in served {
        c.prepare_cached(
            "INSERT INTO tenant_dispatch (tenant, last_claimed)
             VALUES (?1, (SELECT COALESCE(MAX(last_claimed), 0) + 1 FROM tenant_dispatch))
             ON CONFLICT (tenant) DO UPDATE SET last_claimed = excluded.last_claimed",
        )?
        .execute(params![tenant])?;
    }
    Ok(tasks)
}

/// Leases one ready task; `None` if its deadline passed (it is failed instead).
fn lease_task(
    c: &Connection,
    policy: WritePolicy,
    p: &ClaimParams,
    id: &str,
    lease_expires_at: Timestamp,
) -> Result<Option<Task>> {
    let sql = format!("SELECT {OP_COLUMNS}, checkpoint FROM operations WHERE id = ?1");
    let (current, checkpoint): (Operation, Option<String>) = c
        .prepare_cached(&sql)?
        .query_row(params![id], |r| Ok((operation_from_row(r)?, r.get(OP_COLUMN_COUNT)?)))?;
    if !matches!(current.state, State::Queued | State::Running) {
        return Err(StoreError::NotFound);
    }
    let deadline_at = current.deadline_at;
    if deadline_at.is_some_and(|d| d <= p.now) {
        // A queued operation whose deadline passed is never started.
        end_operation(
            c,
            policy,
            current,
            &Ending::failed(deadline_error_before_start()),
            p.now,
        )?;
        return Ok(None);
    }
    let was_queued = current.state == State::Queued;
    let token = random_base32::<16>();
    c.prepare_cached(
        "UPDATE tasks SET status = 'leased', lease_token = ?2, lease_expires_at = ?3, worker_id = ?4, lease_ms = ?5
          WHERE operation_id = ?1 AND status = 'ready'",
    )?
    .execute(params![id, token, lease_expires_at.0, p.worker_id, lease_ms(p.lease)])?;
    // The started row is `started`'s, written as is (at the version read),
    // so it is not read back.
    let read_at = current.version;
    let started = crate::shared::started(current, p.now);
    let changed = c
        .prepare_cached(
            "UPDATE OR FAIL operations SET state = 'running', attempt = ?2, started_at = ?3, version = ?4, updated_at = ?5
              WHERE id = ?1 AND version = ?6",
        )?
        .execute(params![
            id,
            started.attempt,
            started.started_at.map(|t| t.0),
            started.version,
            p.now.0,
            read_at
        ])?;
    if changed == 0 {
        return Err(StoreError::NotFound);
    }
    let data = json!({"attempt": started.attempt, "worker_id": p.worker_id});
    event_insert(c, &started, "started", &data)?;
    if was_queued {
        outbox_insert(c, &started)?;
    }
    Ok(Some(Task {
        operation_id: started.id,
        tenant: started.tenant,
        kind: started.kind,
        input: started.input.unwrap_or(Value::Null),
        attempt: started.attempt,
        lease_token: token,
        lease_expires_at,
        deadline_at,
        budget_max_cost: started.budget_max_cost,
        checkpoint: checkpoint.and_then(|text| serde_json::from_str(&text).ok()),
    }))
}

/// The fenced row: one table and scalar subqueries, not a join. SQLite
/// marks a join on a bound parameter as plan-dependent on its value, and
/// rusqlite clears the bindings of a cached statement when it is returned,
/// so such a statement is re-prepared on every use. The lease subquery is
/// NULL unless the caller holds the lease.
const FENCED: &str = "SELECT o.version, o.progress, o.cost_units, o.cancellable, o.cancel_requested_at IS NOT NULL,
        o.cancel_reason, o.cancel_requested_by, o.attempt,
        COALESCE((SELECT k.max_attempts FROM kinds k WHERE k.name = o.kind), 1), o.budget_max_cost,
        (SELECT COALESCE(t.lease_ms, 30000) FROM tasks t
          WHERE t.operation_id = ?1 AND t.status = 'leased' AND t.lease_token = ?2),
        o.pause_requested_at IS NOT NULL
   FROM operations o
  WHERE o.id = ?1 AND o.state = 'running'";

/// A tenant's oldest ready tasks of one kind. The index gives seq order, so
/// rows stream and the caller reads only as many as it may take. (SQLite
/// re-prepares it once per claim: an ORDER BY next to columns held equal to
/// parameters is planned for their values; the per-task statements are not.)
const READY_HEADS: &str = "SELECT seq, operation_id FROM tasks
  WHERE status = 'ready' AND tenant = ?1 AND kind = ?2 AND available_at <= ?3
  ORDER BY seq";

/// The fenced row in full, for an outcome that changes it: `None` from the
/// lease subquery unless the caller holds the lease (as in [`FENCED`]).
fn fenced_operation(c: &Connection, operation_id: &Id, lease_token: &str) -> Result<(Fenced, Operation)> {
    c.prepare_cached(&fenced_operation_sql())?
        .query_row(params![operation_id.as_str(), lease_token], |r| {
            let Some(lease_ms) = r.get::<_, Option<i64>>(OP_COLUMN_COUNT + 1)? else {
                return Ok(None);
            };
            let op = operation_from_row(r)?;
            Ok(Some((Fenced::of(&op, r.get(OP_COLUMN_COUNT)?, lease_ms), op)))
        })
        .optional()?
        .flatten()
        .ok_or(StoreError::LeaseLost)
}

fn fenced_operation_sql() -> String {
    format!(
        "SELECT {OP_COLUMNS}, COALESCE((SELECT k.max_attempts FROM kinds k WHERE k.name = o.kind), 1),
                (SELECT COALESCE(t.lease_ms, 30000) FROM tasks t
                  WHERE t.operation_id = ?1 AND t.status = 'leased' AND t.lease_token = ?2)
           FROM operations o
          WHERE o.id = ?1 AND o.state = 'running'"
    )
}

fn fenced(c: &Connection, operation_id: &Id, lease_token: &str) -> Result<Fenced> {
    c.prepare_cached(FENCED)?
        .query_row(params![operation_id.as_str(), lease_token], |r| {
            let Some(lease_ms) = r.get::<_, Option<i64>>(10)? else {
                return Ok(None);
            };
            Ok(Some(Fenced {
                version: r.get(0)?,
                progress: json_column(r, 1)?.map(|v| progress_from_json(&v)),
                cost_units: r.get(2)?,
                cancellable: r.get(3)?,
                cancel_requested: r.get(4)?,
                cancel_reason: r.get(5)?,
                cancel_requested_by: r.get(6)?,
                attempt: r.get(7)?,
                max_attempts: r.get(8)?,
                budget_max_cost: r.get(9)?,
                lease_ms,
                pause_requested: r.get(11)?,
            }))
        })
        .optional()?
        .flatten()
        .ok_or(StoreError::LeaseLost)
}

pub(super) fn task_heartbeat(c: &Connection, p: &HeartbeatParams) -> Result<HeartbeatAck> {
    let current = fenced(c, &p.operation_id, &p.lease_token)?;
    let lease_expires_at = p
        .now
        .plus(Duration::from_millis(u64::try_from(current.lease_ms).unwrap_or(0)));
    c.prepare_cached("UPDATE tasks SET lease_expires_at = ?2 WHERE operation_id = ?1")?
        .execute(params![p.operation_id.as_str(), lease_expires_at.0])?;
    if let Some(checkpoint) = &p.checkpoint {
        // Kept with the operation, not a change of its representation.
        c.prepare_cached("UPDATE OR FAIL operations SET checkpoint = ?2 WHERE id = ?1")?
            .execute(params![p.operation_id.as_str(), checkpoint.to_string()])?;
    }

    let effect = heartbeat_effect(&current, p);
    let mut version = current.version;
    if let Some(data) = &effect.event {
        let updated = update_and_read(
            c,
            p.operation_id.as_str(),
            "UPDATE OR FAIL operations SET progress = ?2, cost_units = ?3, cancellable = ?4, version = version + 1,
                    updated_at = ?5
              WHERE id = ?1 AND state = 'running'",
            params![
                effect.progress.as_ref().map(progress_text),
                effect.cost_units,
                effect.cancellable,
                p.now.0
            ],
        )?
        .ok_or(StoreError::LeaseLost)?;
        version = updated.version;
        event_insert(c, &updated, "progress", data)?;
    }
    let (mut cancel_requested, mut cancel_reason) = (current.cancel_requested, current.cancel_reason);
    if effect.over_budget {
        // Over budget: the server asks the worker to stop; it ends `failed`
        // with `budget_exhausted` when it acknowledges (or is fenced out).
        let reason = "budget_exhausted";
        version = cancel_request(c, p.operation_id.as_str(), SYSTEM, Some(reason), p.now)?;
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

/// Records a cancellation request on a running operation; returns the new version.
fn cancel_request(c: &Connection, id: &str, by: &str, reason: Option<&str>, now: Timestamp) -> Result<i64> {
    let requested = update_and_read(
        c,
        id,
        "UPDATE OR FAIL operations SET cancel_requested_at = ?2, cancel_requested_by = ?3, cancel_reason = ?4,
                version = version + 1, updated_at = ?2
          WHERE id = ?1 AND state = 'running'",
        params![now.0, by, reason],
    )?
    .ok_or(StoreError::NotFound)?;
    let data = json!({"requested_by": by, "reason": reason});
    event_insert(c, &requested, "cancel_requested", &data)?;
    Ok(requested.version)
}

pub(super) fn task_finish(c: &Connection, policy: WritePolicy, p: &FinishParams) -> Result<Operation> {
    let (current, op) = fenced_operation(c, &p.operation_id, &p.lease_token)?;
    let id = p.operation_id.as_str();
    // The worker's last progress rides the outcome's own change.
    let progress = final_progress(&current, p.progress.as_ref(), p.now);
    match decide_finish(&current, &p.outcome)? {
        Decision::End(ending) => end_operation(c, policy, op, &ending.with_progress(progress), p.now),
        Decision::Retry { next_attempt, data } => requeue(c, id, next_attempt, progress.as_ref(), p.now, &data),
        Decision::Pause {
            attempt,
            checkpoint,
            data,
        } => operation_pause(
            c,
            id,
            Some(attempt),
            progress.as_ref(),
            checkpoint.as_ref(),
            &data,
            p.now,
        ),
    }
}

/// Takes a queued or running operation out of the queue as `paused`: its
/// task row goes (no claim can take it, and a worker's lease ends), what a
/// pausing worker reports is kept, and the `paused` event and webhook are
/// written. `attempt` is the attempt a resume runs (`None`: unchanged).
fn operation_pause(
    c: &Connection,
    id: &str,
    attempt: Option<i64>,
    progress: Option<&Progress>,
    checkpoint: Option<&Value>,
    data: &Value,
    now: Timestamp,
) -> Result<Operation> {
    let paused = update_and_read(
        c,
        id,
        "UPDATE OR FAIL operations SET state = 'paused', version = version + 1, updated_at = ?2,
                attempt = COALESCE(?3, attempt), progress = COALESCE(?4, progress),
                checkpoint = COALESCE(?5, checkpoint), pause_requested_at = NULL
          WHERE id = ?1 AND state IN ('queued', 'running')",
        params![
            now.0,
            attempt,
            progress.map(progress_text),
            checkpoint.map(Value::to_string)
        ],
    )?
    .ok_or(StoreError::NotFound)?;
    c.prepare_cached("DELETE FROM tasks WHERE operation_id = ?1")?
        .execute(params![id])?;
    event_insert(c, &paused, "paused", data)?;
    outbox_insert_as(c, &paused, "operation.paused")?;
    Ok(paused)
}

/// Puts a running operation's task back in the queue for attempt
/// `next_attempt` after the backoff; the public state stays `running`.
fn requeue(
    c: &Connection,
    id: &str,
    next_attempt: i64,
    progress: Option<&Progress>,
    now: Timestamp,
    data: &Value,
) -> Result<Operation> {
    let available_at = now.plus(retry_backoff(next_attempt));
    c.prepare_cached(
        "UPDATE tasks SET status = 'ready', lease_token = NULL, lease_expires_at = NULL, worker_id = NULL,
                available_at = ?2
          WHERE operation_id = ?1",
    )?
    .execute(params![id, available_at.0])?;
    let requeued = update_and_read(
        c,
        id,
        "UPDATE OR FAIL operations SET attempt = ?2, version = version + 1, updated_at = ?3,
                progress = COALESCE(?4, progress)
          WHERE id = ?1 AND state = 'running'",
        params![next_attempt, now.0, progress.map(progress_text)],
    )?
    .ok_or(StoreError::NotFound)?;
    let mut data = data.clone();
    if let Some(fields) = data.as_object_mut() {
        fields.insert("next_attempt".into(), json!(next_attempt));
        fields.insert("available_at".into(), json!(available_at.to_rfc3339()));
    }
    event_insert(c, &requeued, "retry_scheduled", &data)?;
    Ok(requeued)
}

pub(super) fn task_reap(c: &Connection, policy: WritePolicy, p: &ReapParams) -> Result<ReapCounts> {
    let expired: Vec<(String, Lapsed)> = c
        .prepare_cached(
            "SELECT t.operation_id, o.attempt, o.cancel_requested_at IS NOT NULL, o.cancel_requested_by,
                    o.cancel_reason, COALESCE(k.rerun_safe, 0), COALESCE(k.max_attempts, 1),
                    o.pause_requested_at IS NOT NULL
               FROM tasks t
               JOIN operations o ON o.id = t.operation_id
               LEFT JOIN kinds k ON k.name = t.kind
              WHERE t.status = 'leased' AND t.lease_expires_at < ?1
              ORDER BY t.lease_expires_at LIMIT ?2",
        )?
        .query_map(params![p.now.0, p.limit], |r| {
            Ok((
                r.get(0)?,
                Lapsed {
                    attempt: r.get(1)?,
                    cancel_requested: r.get(2)?,
                    cancel_requested_by: r.get(3)?,
                    cancel_reason: r.get(4)?,
                    rerun_safe: r.get(5)?,
                    max_attempts: r.get(6)?,
                    pause_requested: r.get(7)?,
                },
            ))
        })?
        .collect::<rusqlite::Result<_>>()?;

    let mut counts = ReapCounts::default();
    for (id, task) in expired {
        let decision = decide_reap(&task);
        match &decision {
            Decision::End(ending) => operation_end(c, policy, &id, ending, p.now)?,
            Decision::Retry { next_attempt, data } => requeue(c, &id, *next_attempt, None, p.now, data)?,
            Decision::Pause { attempt, data, .. } => operation_pause(c, &id, Some(*attempt), None, None, data, p.now)?,
        };
        counts.count(&task, &decision);
    }
    Ok(counts)
}

#[derive(Debug, thiserror::Error)]
#[error("unknown role {0:?}")]
struct UnknownRole(String);

fn api_key_from_row(r: &Row) -> rusqlite::Result<ApiKeyRecord> {
    let role: String = r.get(2)?;
    Ok(ApiKeyRecord {
        id: Id::from_trusted(r.get(0)?),
        tenant: r.get(1)?,
        role: Role::parse(&role).ok_or_else(|| conversion_error(2, UnknownRole(role)))?,
        secret_hash: r.get(3)?,
        created_at: Timestamp(r.get(4)?),
        revoked_at: ts(r.get(5)?),
    })
}

pub(super) fn api_key_create(c: &Connection, p: &ApiKeyCreateParams) -> Result<()> {
    c.prepare_cached("INSERT INTO tenants (name, created_at) VALUES (?1, ?2) ON CONFLICT DO NOTHING")?
        .execute(params![p.tenant, p.now.0])?;
    c.prepare_cached("INSERT INTO api_keys (id, tenant, role, secret_hash, created_at) VALUES (?1, ?2, ?3, ?4, ?5)")?
        .execute(params![
            p.id.as_str(),
            p.tenant,
            p.role.as_str(),
            &p.secret_hash[..],
            p.now.0
        ])?;
    Ok(())
}

pub(super) fn api_key_get(c: &Connection, id: &Id) -> Result<Option<ApiKeyRecord>> {
    Ok(
        c.prepare_cached("SELECT id, tenant, role, secret_hash, created_at, revoked_at FROM api_keys WHERE id = ?1")?
            .query_row(params![id.as_str()], api_key_from_row)
            .optional()?,
    )
}

pub(super) fn api_key_list(c: &Connection) -> Result<Vec<ApiKeyRecord>> {
    Ok(c.prepare_cached(
        "SELECT id, tenant, role, secret_hash, created_at, revoked_at FROM api_keys ORDER BY created_at, id",
    )?
    .query_map([], api_key_from_row)?
    .collect::<rusqlite::Result<_>>()?)
}

pub(super) fn api_key_revoke(c: &Connection, id: &Id, now: Timestamp) -> Result<bool> {
    let n = c
        .prepare_cached("UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL")?
        .execute(params![id.as_str(), now.0])?;
    Ok(n == 1)
}

pub(super) fn api_key_count(c: &Connection) -> Result<u64> {
    let n: i64 = c.query_row("SELECT COUNT(*) FROM api_keys", [], |r| r.get(0))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

fn kind_from_row(r: &Row) -> rusqlite::Result<KindSpec> {
    Ok(KindSpec {
        name: r.get(0)?,
        builtin: r.get(1)?,
        rerun_safe: r.get(2)?,
        max_attempts: r.get(3)?,
        default_deadline_seconds: r.get(4)?,
        max_deadline_seconds: r.get(5)?,
        pausable: r.get(6)?,
    })
}

pub(super) fn kind_upsert(c: &Connection, k: &KindSpec) -> Result<()> {
    c.prepare_cached(
        "INSERT INTO kinds (name, builtin, rerun_safe, max_attempts, default_deadline_seconds, max_deadline_seconds,
                            pausable)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (name) DO UPDATE SET builtin = excluded.builtin, rerun_safe = excluded.rerun_safe,
             max_attempts = excluded.max_attempts, default_deadline_seconds = excluded.default_deadline_seconds,
             max_deadline_seconds = excluded.max_deadline_seconds, pausable = excluded.pausable",
    )?
    .execute(params![
        k.name,
        k.builtin,
        k.rerun_safe,
        k.max_attempts,
        k.default_deadline_seconds,
        k.max_deadline_seconds,
        k.pausable
    ])?;
    Ok(())
}

const KIND_COLUMNS: &str =
    "name, builtin, rerun_safe, max_attempts, default_deadline_seconds, max_deadline_seconds, pausable";

pub(super) fn kind_get(c: &Connection, name: &str) -> Result<Option<KindSpec>> {
    let sql = format!("SELECT {KIND_COLUMNS} FROM kinds WHERE name = ?1");
    Ok(c.prepare_cached(&sql)?
        .query_row(params![name], kind_from_row)
        .optional()?)
}

pub(super) fn kind_list(c: &Connection) -> Result<Vec<KindSpec>> {
    let sql = format!("SELECT {KIND_COLUMNS} FROM kinds ORDER BY name");
    Ok(c.prepare_cached(&sql)?
        .query_map([], kind_from_row)?
        .collect::<rusqlite::Result<_>>()?)
}

pub(super) fn server_secret(c: &Connection, name: &str, candidate: &[u8], now: Timestamp) -> Result<Vec<u8>> {
    c.prepare_cached(
        "INSERT INTO server_secrets (name, value, created_at) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
    )?
    .execute(params![name, candidate, now.0])?;
    Ok(c.prepare_cached("SELECT value FROM server_secrets WHERE name = ?1")?
        .query_row(params![name], |r| r.get(0))?)
}

pub(super) fn operation_intent(c: &Connection, p: &IntentParams) -> Result<Operation> {
    let op = operation_get(c, &p.tenant, &p.id)?.ok_or(StoreError::NotFound)?;
    let holder = c
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM tasks WHERE operation_id = ?1 AND status = 'leased'),
                    COALESCE((SELECT pausable FROM kinds WHERE name = ?2), 0)",
        )?
        .query_row(params![p.id.as_str(), op.kind], |r| {
            Ok(Holder {
                leased: r.get(0)?,
                pausable: r.get(1)?,
            })
        })?;
    let id = p.id.as_str();
    let change = decide_intent(&op, holder, p)?;
    match change {
        IntentChange::Unchanged => Ok(op),
        IntentChange::Pause => operation_pause(c, id, None, None, None, &json!({}), p.now),
        IntentChange::RequestPause | IntentChange::WithdrawPause => {
            let (requested_at, event) = change.pause_request(p.now);
            let changed = update_and_read(
                c,
                id,
                "UPDATE OR FAIL operations SET pause_requested_at = ?2, version = version + 1, updated_at = ?3
                  WHERE id = ?1 AND state IN ('queued', 'running')",
                params![requested_at.map(|t| t.0), p.now.0],
            )?
            .ok_or(StoreError::NotFound)?;
            event_insert(c, &changed, event, &json!({}))?;
            Ok(changed)
        }
        IntentChange::Resume => {
            let resumed = update_and_read(
                c,
                id,
                "UPDATE OR FAIL operations SET state = 'queued', version = version + 1, updated_at = ?2
                  WHERE id = ?1 AND state = 'paused'",
                params![p.now.0],
            )?
            .ok_or(StoreError::NotFound)?;
            c.prepare_cached(
                "INSERT INTO tasks (operation_id, seq, tenant, kind, status, available_at)
                 SELECT id, seq, tenant, kind, 'ready', ?2 FROM operations WHERE id = ?1",
            )?
            .execute(params![id, p.now.0])?;
            event_insert(c, &resumed, "resumed", &json!({}))?;
            outbox_insert_as(c, &resumed, "operation.resumed")?;
            Ok(resumed)
        }
    }
}

pub(super) fn operation_update(c: &Connection, p: &UpdateParams) -> Result<Operation> {
    let op = operation_get(c, &p.tenant, &p.id)?.ok_or(StoreError::NotFound)?;
    let Some(change) = crate::shared::decide_update(&op, p)? else {
        return Ok(op);
    };
    let labels_json = serde_json::to_string(&change.labels).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let updated = update_and_read(
        c,
        p.id.as_str(),
        "UPDATE OR FAIL operations SET deadline_at = ?2, labels = ?3, version = version + 1, updated_at = ?4
          WHERE id = ?1 AND state IN ('queued', 'running')",
        params![change.deadline_at.map(|t| t.0), labels_json, p.now.0],
    )?
    .ok_or(StoreError::NotFound)?;
    event_insert(c, &updated, "updated", &change.data)?;
    Ok(updated)
}

pub(super) fn deadline_enforce(c: &Connection, policy: WritePolicy, p: &EnforceParams) -> Result<EnforceCounts> {
    let mut counts = EnforceCounts::default();

    // Not started (or waiting for a retry) and past the deadline: never start it.
    let waiting: Vec<String> = c
        .prepare_cached(
            "SELECT o.id FROM operations o JOIN tasks t ON t.operation_id = o.id
              WHERE o.deadline_at IS NOT NULL AND o.deadline_at <= ?1 AND o.state IN ('queued', 'running')
                AND t.status = 'ready'
              ORDER BY o.deadline_at LIMIT ?2",
        )?
        .query_map(params![p.now.0, p.limit], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for id in waiting {
        let error = if operation_by_id(c, &id)?.is_some_and(|op| op.state == State::Queued) {
            deadline_error_before_start()
        } else {
            failing_cancel(Some(SYSTEM), Some("deadline_exceeded")).expect("a failing reason")
        };
        operation_end(c, policy, &id, &Ending::failed(error), p.now)?;
        counts.expired_before_start += 1;
    }

    // Running past the deadline: ask the worker to stop.
    let running: Vec<String> = c
        .prepare_cached(
            "SELECT o.id FROM operations o JOIN tasks t ON t.operation_id = o.id
              WHERE o.deadline_at IS NOT NULL AND o.deadline_at <= ?1 AND o.state IN ('queued', 'running')
                AND t.status = 'leased' AND o.cancel_requested_at IS NULL AND o.cancellable = 1
              ORDER BY o.deadline_at LIMIT ?2",
        )?
        .query_map(params![p.now.0, p.limit], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for id in running {
        cancel_request(c, &id, SYSTEM, Some("deadline_exceeded"), p.now)?;
        counts.cancel_requested += 1;
    }

    // Asked to stop by the server and still not acknowledged after the grace
    // period: end it as the server decided; the worker's lease is gone with
    // its task row, so its later writes get lease_lost.
    let cutoff = p.now.minus(p.grace);
    let ignored: Vec<(String, Option<String>)> = c
        .prepare_cached(
            "SELECT id, cancel_reason FROM operations
              WHERE state = 'running' AND cancel_requested_by = 'system' AND cancel_requested_at <= ?1
              ORDER BY cancel_requested_at LIMIT ?2",
        )?
        .query_map(params![cutoff.0, p.limit], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (id, reason) in ignored {
        let error = failing_cancel(Some(SYSTEM), reason.as_deref()).unwrap_or_else(|| OperationError {
            code: "deadline_exceeded".into(),
            message: "the operation's deadline passed".into(),
            retryable: false,
        });
        operation_end(c, policy, &id, &Ending::failed(error), p.now)?;
        counts.ended_without_ack += 1;
    }

    // Asked to pause and not paused within the grace period: the work goes
    // on, and the history says the request was not honoured.
    let unanswered: Vec<(String, i64)> = c
        .prepare_cached(
            "SELECT id, pause_requested_at FROM operations
              WHERE state = 'running' AND pause_requested_at <= ?1
              ORDER BY pause_requested_at LIMIT ?2",
        )?
        .query_map(params![cutoff.0, p.limit], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (id, requested_at) in unanswered {
        let withdrawn = update_and_read(
            c,
            &id,
            "UPDATE OR FAIL operations SET pause_requested_at = NULL, version = version + 1, updated_at = ?2
              WHERE id = ?1 AND state = 'running'",
            params![p.now.0],
        )?
        .ok_or(StoreError::NotFound)?;
        let data = pause_not_honoured_data(Timestamp(requested_at), p.grace);
        event_insert(c, &withdrawn, "pause_not_honoured", &data)?;
        counts.pause_not_honoured += 1;
    }
    Ok(counts)
}

pub(super) fn tenant_set(c: &Connection, t: &TenantLimits) -> Result<()> {
    c.prepare_cached(
        "INSERT INTO tenants (name, created_at, max_active, max_running, rate)
         VALUES (?1, CAST(unixepoch('subsec') * 1000 AS INTEGER), ?2, ?3, ?4)
         ON CONFLICT (name) DO UPDATE SET max_active = excluded.max_active, max_running = excluded.max_running,
             rate = excluded.rate",
    )?
    .execute(params![t.name, t.max_active, t.max_running, t.rate])?;
    Ok(())
}

pub(super) fn tenant_get(c: &Connection, name: &str) -> Result<Option<TenantLimits>> {
    Ok(
        c.prepare_cached("SELECT name, max_active, max_running, rate FROM tenants WHERE name = ?1")?
            .query_row(params![name], |r| {
                Ok(TenantLimits {
                    name: r.get(0)?,
                    max_active: r.get(1)?,
                    max_running: r.get(2)?,
                    rate: r.get(3)?,
                })
            })
            .optional()?,
    )
}

pub(super) fn task_expire_worker(c: &Connection, worker_id: &str, now: Timestamp) -> Result<u64> {
    let n = c
        .prepare_cached(
            "UPDATE tasks SET lease_expires_at = ?2 WHERE status = 'leased' AND worker_id = ?1 AND lease_expires_at >= ?2",
        )?
        .execute(params![worker_id, now.0 - 1])?;
    Ok(n as u64)
}

pub(super) fn operation_events_after(
    c: &Connection,
    tenant: &str,
    id: &Id,
    after_version: i64,
    limit: u32,
) -> Result<Option<Vec<Event>>> {
    if !owns(c, tenant, id)? {
        return Ok(None);
    }
    let mut stmt = c.prepare_cached(
        "SELECT version, type, state, at, data, snapshot FROM operation_events
          WHERE op_seq = (SELECT seq FROM operations WHERE id = ?1) AND version > ?2
          ORDER BY version LIMIT ?3",
    )?;
    let events = stmt
        .query_map(params![id.as_str(), after_version, limit], |r| {
            Ok(Event {
                operation_id: id.clone(),
                version: r.get(0)?,
                event_type: r.get(1)?,
                state: state_column(r, 2)?,
                at: Timestamp(r.get(3)?),
                data: json_column(r, 4)?.unwrap_or(Value::Null),
                snapshot: json_column(r, 5)?.as_ref().and_then(snapshot_from_json),
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(Some(events))
}

pub(super) fn kind_typical_duration(c: &Connection, kind: &str) -> Result<Option<Duration>> {
    let mut durations: Vec<i64> = c
        .prepare_cached(
            "SELECT completed_at - created_at FROM operations
              WHERE state = 'succeeded' AND kind = ?1 ORDER BY completed_at DESC LIMIT 101",
        )?
        .query_map(params![kind], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    if durations.is_empty() {
        return Ok(None);
    }
    durations.sort_unstable();
    let median = durations[durations.len() / 2].max(0);
    Ok(Some(Duration::from_millis(median as u64)))
}

/// Queues the webhook of a state transition, in the transition's transaction.
fn outbox_insert(c: &Connection, op: &Operation) -> Result<()> {
    outbox_insert_as(c, op, &format!("operation.{}", op.state.as_str()))
}

/// The webhook of a change, of type `event_type` (`operation.resumed` is a
/// move to `queued` that is not a creation).
fn outbox_insert_as(c: &Connection, op: &Operation, event_type: &str) -> Result<()> {
    let Some(url) = &op.callback_url else { return Ok(()) };
    let event_id = Id::generate(IdKind::Event);
    let payload = crate::shared::webhook_payload(op, event_type);
    c.prepare_cached(
        "INSERT INTO webhook_deliveries (event_id, operation_id, tenant, url, type, payload, created_at, status,
                                         next_attempt_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'pending', ?7)",
    )?
    .execute(params![
        event_id.as_str(),
        op.id.as_str(),
        op.tenant,
        url,
        event_type,
        payload,
        op.updated_at.0
    ])?;
    Ok(())
}

pub(super) fn webhook_due(c: &Connection, now: Timestamp, limit: u32, lease: Duration) -> Result<Vec<Delivery>> {
    let due: Vec<Delivery> = c
        .prepare_cached(
            // Streams in index order; `limit` is taken below.
            "SELECT event_id, operation_id, tenant, url, type, payload, attempts FROM webhook_deliveries
              WHERE status = 'pending' AND next_attempt_at <= ?1 AND (lease_until IS NULL OR lease_until <= ?1)
              ORDER BY next_attempt_at",
        )?
        .query_map(params![now.0], |r| {
            Ok(Delivery {
                event_id: Id::from_trusted(r.get(0)?),
                operation_id: Id::from_trusted(r.get(1)?),
                tenant: r.get(2)?,
                url: r.get(3)?,
                event_type: r.get(4)?,
                payload: r.get(5)?,
                attempts: r.get(6)?,
            })
        })?
        .take(limit as usize)
        .collect::<rusqlite::Result<_>>()?;
    let until = now.plus(lease);
    for d in &due {
        c.prepare_cached("UPDATE webhook_deliveries SET lease_until = ?2 WHERE event_id = ?1")?
            .execute(params![d.event_id.as_str(), until.0])?;
    }
    Ok(due)
}

pub(super) fn webhook_attempt(c: &Connection, p: &AttemptParams) -> Result<()> {
    let attempt = crate::shared::attempt_row(&p.outcome);
    let updated: Option<(String, String)> = c
        .prepare_cached(
            "UPDATE webhook_deliveries SET status = ?2, attempts = ?3, next_attempt_at = ?4, lease_until = NULL
              WHERE event_id = ?1 AND status = 'pending' RETURNING operation_id, type",
        )?
        .query_row(
            params![p.event_id.as_str(), attempt.status, p.attempt, attempt.next_attempt_at],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let Some((operation_id, event_type)) = updated else {
        return Err(StoreError::NotFound);
    };
    c.prepare_cached(
        "INSERT INTO webhook_attempts (event_id, attempt, operation_id, type, at, status_code, error, next_attempt_at, latency_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
         ON CONFLICT (event_id, attempt) DO NOTHING",
    )?
    .execute(params![
        p.event_id.as_str(),
        p.attempt,
        operation_id,
        event_type,
        p.now.0,
        attempt.status_code,
        attempt.error,
        attempt.next_attempt_at,
        p.latency_ms
    ])?;
    Ok(())
}

pub(super) fn webhook_log(c: &Connection, tenant: &str, id: &Id) -> Result<Option<Vec<AttemptRecord>>> {
    if !owns(c, tenant, id)? {
        return Ok(None);
    }
    let log = c
        .prepare_cached(
            "SELECT event_id, type, attempt, status_code, error, at, next_attempt_at, latency_ms FROM webhook_attempts
              WHERE operation_id = ?1 ORDER BY at, event_id, attempt",
        )?
        .query_map(params![id.as_str()], |r| {
            Ok(AttemptRecord {
                event_id: Id::from_trusted(r.get(0)?),
                event_type: r.get(1)?,
                attempt: r.get(2)?,
                status_code: r.get(3)?,
                error: r.get(4)?,
                at: Timestamp(r.get(5)?),
                next_attempt_at: ts(r.get(6)?),
                latency_ms: r.get(7)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(Some(log))
}

pub(super) fn webhook_secrets(c: &Connection, tenant: &str, candidate: &str, now: Timestamp) -> Result<Vec<String>> {
    let active = |c: &Connection| -> Result<Vec<String>> {
        Ok(c.prepare_cached(
            "SELECT secret FROM webhook_secrets WHERE tenant = ?1 AND (retired_at IS NULL OR retired_at > ?2)
              ORDER BY created_at DESC, secret",
        )?
        .query_map(params![tenant, now.0], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?)
    };
    let secrets = active(c)?;
    if !secrets.is_empty() {
        return Ok(secrets);
    }
    c.prepare_cached("INSERT INTO webhook_secrets (tenant, secret, created_at) VALUES (?1, ?2, ?3)")?
        .execute(params![tenant, candidate, now.0])?;
    active(c)
}

pub(super) fn webhook_secret_rotate(
    c: &Connection,
    tenant: &str,
    new_secret: &str,
    now: Timestamp,
    overlap: Duration,
) -> Result<()> {
    c.prepare_cached("UPDATE webhook_secrets SET retired_at = ?2 WHERE tenant = ?1 AND retired_at IS NULL")?
        .execute(params![tenant, now.plus(overlap).0])?;
    c.prepare_cached("INSERT INTO webhook_secrets (tenant, secret, created_at) VALUES (?1, ?2, ?3)")?
        .execute(params![tenant, new_secret, now.0])?;
    Ok(())
}

/// Publishes the operation's uploaded artifacts, if it has any, as its result.
fn result_publish(c: &Connection, policy: WritePolicy, op: Operation, now: Timestamp) -> Result<Operation> {
    let expires_at = result_expires_at(now, policy.result_retention, policy.operation_retention);
    // Read, then updated (only if there is something to publish): most
    // operations have no artifact, and an UPDATE … RETURNING opens an
    // ephemeral table even when it returns nothing (see `update_and_read`).
    let published: Vec<(String, ArtifactRef)> = c
        .prepare_cached(
            "SELECT name, id, content_type, size_bytes, sha256 FROM results
              WHERE operation_id = ?1 AND state = 'uploaded'",
        )?
        .query_map(params![op.id.as_str()], |r| {
            Ok((
                r.get(0)?,
                ArtifactRef {
                    id: Id::from_trusted(r.get(1)?),
                    content_type: r.get(2)?,
                    size_bytes: r.get(3)?,
                    sha256: r.get(4)?,
                    expires_at,
                },
            ))
        })?
        .collect::<rusqlite::Result<_>>()?;
    if published.is_empty() {
        return Ok(op);
    }
    c.prepare_cached(
        "UPDATE results SET state = 'published', expires_at = ?2 WHERE operation_id = ?1 AND state = 'uploaded'",
    )?
    .execute(params![op.id.as_str(), expires_at.0])?;
    let op = with_published(op, published);
    c.prepare_cached("UPDATE OR FAIL operations SET artifact = ?2 WHERE id = ?1")?
        .execute(params![
            op.id.as_str(),
            artifacts_to_json(op.artifact.as_ref(), &op.artifacts).map(|v| v.to_string())
        ])?;
    Ok(op)
}

/// Drops uploads of an operation that did not succeed: nothing is published
/// and the objects become garbage.
fn result_discard(c: &Connection, operation_id: &str, now: Timestamp) -> Result<()> {
    c.prepare_cached(
        "INSERT OR IGNORE INTO artifact_garbage (storage_key, created_at)
         SELECT storage_key, ?2 FROM results WHERE operation_id = ?1 AND state = 'uploaded'",
    )?
    .execute(params![operation_id, now.0])?;
    c.prepare_cached("DELETE FROM results WHERE operation_id = ?1 AND state = 'uploaded'")?
        .execute(params![operation_id])?;
    Ok(())
}

/// Drops the piece rows of `operation_id` (of `name`, at or past `from`,
/// when given); each object becomes garbage once no row names it, unless
/// it is `keep` (a single piece that became the result itself).
fn pieces_drop(
    c: &Connection,
    operation_id: &str,
    only: Option<(&str, i64)>,
    keep: Option<&str>,
    now: Timestamp,
) -> Result<()> {
    let (name, from) = only.map_or((None, 0), |(n, f)| (Some(n), f));
    let dropped: Vec<String> = c
        .prepare_cached(
            "DELETE FROM artifact_pieces WHERE operation_id = ?1 AND (?2 IS NULL OR name = ?2) AND piece_offset >= ?3
             RETURNING storage_key",
        )?
        .query_map(params![operation_id, name, from], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for key in dropped {
        c.prepare_cached(
            "INSERT OR IGNORE INTO artifact_garbage (storage_key, created_at)
             SELECT ?1, ?2 WHERE ?1 IS NOT ?3 AND NOT EXISTS (SELECT 1 FROM artifact_pieces WHERE storage_key = ?1)",
        )?
        .execute(params![key, now.0, keep])?;
    }
    Ok(())
}

fn pieces_of(c: &Connection, operation_id: &str, name: &str) -> Result<Vec<(i64, UploadChunk)>> {
    Ok(c.prepare_cached(
        "SELECT piece_offset, storage_key, size_bytes FROM artifact_pieces
          WHERE operation_id = ?1 AND name = ?2 ORDER BY piece_offset",
    )?
    .query_map(params![operation_id, name], |r| {
        Ok((
            r.get(0)?,
            UploadChunk {
                storage_key: r.get(1)?,
                size_bytes: r.get(2)?,
            },
        ))
    })?
    .collect::<rusqlite::Result<_>>()?)
}

pub(super) fn artifact_piece_add(c: &Connection, p: &ArtifactPieceParams) -> Result<Vec<UploadChunk>> {
    fenced(c, &p.operation_id, &p.lease_token)?;
    let id = p.operation_id.as_str();
    let pieces = pieces_of(c, id, &p.name)?;
    let kept = piece_placement(&pieces, p.offset)?;
    if kept < pieces.len() {
        pieces_drop(c, id, Some((&p.name, p.offset)), None, p.now)?;
    }
    c.prepare_cached(
        "INSERT INTO artifact_pieces (operation_id, name, piece_offset, storage_key, size_bytes)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![id, p.name, p.offset, p.piece.storage_key, p.piece.size_bytes])?;
    let mut now_held: Vec<UploadChunk> = pieces.into_iter().take(kept).map(|(_, piece)| piece).collect();
    now_held.push(p.piece.clone());
    Ok(now_held)
}

pub(super) fn artifact_pieces(
    c: &Connection,
    operation_id: &Id,
    lease_token: &str,
    name: &str,
) -> Result<Vec<UploadChunk>> {
    fenced(c, operation_id, lease_token)?;
    Ok(pieces_of(c, operation_id.as_str(), name)?
        .into_iter()
        .map(|(_, piece)| piece)
        .collect())
}

pub(super) fn result_upload(c: &Connection, p: &ResultUploadParams) -> Result<()> {
    fenced(c, &p.operation_id, &p.lease_token)?;
    if p.joins_pieces {
        pieces_drop(
            c,
            p.operation_id.as_str(),
            Some((&p.name, 0)),
            Some(&p.storage_key),
            p.now,
        )?;
    }
    // One upload per name: a new one replaces this attempt's earlier one of
    // the name, and whatever earlier attempts left.
    let replaced =
        "FROM results WHERE operation_id = ?1 AND state = 'uploaded' AND (name = ?2 OR lease_token IS NOT ?3)";
    c.prepare_cached(&format!(
        "INSERT OR IGNORE INTO artifact_garbage (storage_key, created_at) SELECT storage_key, ?4 {replaced}"
    ))?
    .execute(params![p.operation_id.as_str(), p.name, p.lease_token, p.now.0])?;
    c.prepare_cached(&format!("DELETE {replaced}"))?.execute(params![
        p.operation_id.as_str(),
        p.name,
        p.lease_token
    ])?;
    let tenant: String = c
        .prepare_cached("SELECT tenant FROM operations WHERE id = ?1")?
        .query_row(params![p.operation_id.as_str()], |r| r.get(0))?;
    c.prepare_cached(
        "INSERT INTO results (id, operation_id, tenant, storage_key, content_type, size_bytes, sha256, state,
                              lease_token, created_at, name)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'uploaded', ?8, ?9, ?10)",
    )?
    .execute(params![
        p.result_id.as_str(),
        p.operation_id.as_str(),
        tenant,
        p.storage_key,
        p.content_type,
        p.size_bytes,
        p.sha256,
        p.lease_token,
        p.now.0,
        p.name
    ])?;
    Ok(())
}

const RESULT_COLUMNS: &str =
    "id, operation_id, tenant, storage_key, content_type, size_bytes, sha256, state, created_at, expires_at, name";

fn result_from_row(r: &Row) -> rusqlite::Result<ResultRecord> {
    Ok(ResultRecord {
        id: Id::from_trusted(r.get(0)?),
        operation_id: Id::from_trusted(r.get(1)?),
        tenant: r.get(2)?,
        storage_key: r.get(3)?,
        content_type: r.get(4)?,
        size_bytes: r.get(5)?,
        sha256: r.get(6)?,
        state: r.get(7)?,
        created_at: Timestamp(r.get(8)?),
        expires_at: ts(r.get(9)?),
        name: r.get(10)?,
    })
}

pub(super) fn result_for_operation(c: &Connection, tenant: &str, id: &Id) -> Result<Vec<ResultRecord>> {
    let sql = format!(
        "SELECT {RESULT_COLUMNS} FROM results WHERE operation_id = ?1 AND tenant = ?2 AND state <> 'uploaded' ORDER BY name"
    );
    Ok(c.prepare_cached(&sql)?
        .query_map(params![id.as_str(), tenant], result_from_row)?
        .collect::<rusqlite::Result<_>>()?)
}

pub(super) fn result_get(c: &Connection, id: &Id) -> Result<Option<ResultRecord>> {
    let sql = format!("SELECT {RESULT_COLUMNS} FROM results WHERE id = ?1");
    Ok(c.prepare_cached(&sql)?
        .query_row(params![id.as_str()], result_from_row)
        .optional()?)
}

pub(super) fn operation_tombstone(c: &Connection, tenant: &str, id: &Id) -> Result<Option<Timestamp>> {
    Ok(
        c.prepare_cached("SELECT removed_at FROM tombstones WHERE operation_id = ?1 AND tenant = ?2")?
            .query_row(params![id.as_str(), tenant], |r| Ok(Timestamp(r.get(0)?)))
            .optional()?,
    )
}

/// Deletes everything of one operation but its idempotency record; its
/// result objects become garbage.
fn operation_remove(c: &Connection, id: &str, now: Timestamp) -> Result<()> {
    super::changes::touch(id);
    c.prepare_cached(
        "INSERT OR IGNORE INTO artifact_garbage (storage_key, created_at)
         SELECT storage_key, ?2 FROM results WHERE operation_id = ?1 AND state <> 'expired'",
    )?
    .execute(params![id, now.0])?;
    pieces_drop(c, id, None, None, now)?;
    for sql in [
        "DELETE FROM results WHERE operation_id = ?1",
        "DELETE FROM operation_uploads WHERE operation_id = ?1",
        // Found through the operation's row, so before it goes (below).
        "DELETE FROM operation_events WHERE op_seq = (SELECT seq FROM operations WHERE id = ?1)",
        "DELETE FROM webhook_attempts WHERE operation_id = ?1",
        "DELETE FROM webhook_deliveries WHERE operation_id = ?1",
        "DELETE FROM tasks WHERE operation_id = ?1",
        "DELETE FROM operations WHERE id = ?1",
    ] {
        c.prepare_cached(sql)?.execute(params![id])?;
    }
    Ok(())
}

pub(super) fn retention_sweep(c: &Connection, p: &RetentionParams) -> Result<RetentionCounts> {
    let mut counts = RetentionCounts::default();
    let now = p.now.0;

    // Results past their lifetime: the operation stays `succeeded`; the bytes go.
    let expired: Vec<(String, String, String)> = c
        .prepare_cached(
            "SELECT id, operation_id, storage_key FROM results
              WHERE state = 'published' AND expires_at <= ?1 ORDER BY expires_at LIMIT ?2",
        )?
        .query_map(params![now, p.limit], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (id, _operation_id, key) in expired {
        c.prepare_cached("UPDATE results SET state = 'expired' WHERE id = ?1")?
            .execute(params![id])?;
        c.prepare_cached("INSERT OR IGNORE INTO artifact_garbage (storage_key, created_at) VALUES (?1, ?2)")?
            .execute(params![key, now])?;
        counts.results_expired += 1;
    }

    // Operations past their retention: removed, with a tombstone. The
    // tombstone window counts from the operation's expiry (when readers began
    // to see it gone), not from when this sweep got to it.
    type Removable = (String, String, i64, String, Option<String>);
    let removable: Vec<Removable> = c
        .prepare_cached(
            "SELECT id, tenant, expires_at, kind, idempotency_key FROM operations
              WHERE expires_at IS NOT NULL AND expires_at <= ?1 ORDER BY expires_at LIMIT ?2",
        )?
        .query_map(params![now, p.limit], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    for (id, tenant, expired_at, kind, key) in removable {
        operation_remove(c, &id, p.now)?;
        let tombstone_until = Timestamp(expired_at).plus(p.tombstone_retention).0;
        // The tombstone keeps the key of the idempotency record it outlives,
        // which its burial deletes.
        c.prepare_cached(
            "INSERT OR REPLACE INTO tombstones (operation_id, tenant, removed_at, expires_at, kind, idempotency_key)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?
        .execute(params![id, tenant, expired_at, tombstone_until, kind, key])?;
        counts.operations_removed += 1;
    }

    // Tombstones past their window: the id is forgotten, its key freed.
    type Buried = (String, String, Option<String>, Option<String>);
    let buried: Vec<Buried> = c
        .prepare_cached(
            "SELECT operation_id, tenant, kind, idempotency_key FROM tombstones WHERE expires_at <= ?1
              ORDER BY expires_at LIMIT ?2",
        )?
        .query_map(params![now, p.limit], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    for (id, tenant, kind, key) in buried {
        c.prepare_cached(
            "DELETE FROM idempotency_keys WHERE tenant = ?2 AND kind = ?3 AND key = ?4 AND operation_id = ?1",
        )?
        .execute(params![id, tenant, kind, key])?;
        c.prepare_cached("DELETE FROM tombstones WHERE operation_id = ?1")?
            .execute(params![id])?;
        counts.tombstones_removed += 1;
    }

    // Finished deliveries and their log, past the delivery retention.
    let cutoff = p.now.minus(p.delivery_retention).0;
    let finished: Vec<String> = c
        .prepare_cached(
            "SELECT event_id FROM webhook_deliveries WHERE status <> 'pending' AND created_at <= ?1
              ORDER BY created_at LIMIT ?2",
        )?
        .query_map(params![cutoff, p.limit], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for event_id in finished {
        c.prepare_cached("DELETE FROM webhook_attempts WHERE event_id = ?1")?
            .execute(params![event_id])?;
        c.prepare_cached("DELETE FROM webhook_deliveries WHERE event_id = ?1")?
            .execute(params![event_id])?;
        counts.deliveries_removed += 1;
    }

    // Uploads past their expiry that no operation names.
    let unused: Vec<String> = c
        .prepare_cached(
            "SELECT id FROM uploads WHERE expires_at <= ?1
                AND NOT EXISTS (SELECT 1 FROM operation_uploads WHERE upload_id = uploads.id)
              ORDER BY expires_at LIMIT ?2",
        )?
        .query_map(params![now, p.limit], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for id in unused {
        upload_drop(c, &id, p.now)?;
        counts.uploads_removed += 1;
    }
    Ok(counts)
}

pub(super) fn artifact_garbage(c: &Connection, limit: u32) -> Result<Vec<String>> {
    Ok(
        c.prepare_cached("SELECT storage_key FROM artifact_garbage ORDER BY created_at LIMIT ?1")?
            .query_map(params![limit], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?,
    )
}

pub(super) fn artifact_garbage_done(c: &Connection, keys: &[String]) -> Result<()> {
    for key in keys {
        c.prepare_cached("DELETE FROM artifact_garbage WHERE storage_key = ?1")?
            .execute(params![key])?;
    }
    Ok(())
}

pub(super) fn tenant_delete(c: &Connection, tenant: &str, now: Timestamp) -> Result<TenantDeleteCounts> {
    let mut counts = TenantDeleteCounts::default();
    let ids: Vec<String> = c
        .prepare_cached("SELECT id FROM operations WHERE tenant = ?1")?
        .query_map(params![tenant], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let count = |sql: &str| -> Result<u64> {
        let n: i64 = c.query_row(sql, params![tenant], |r| r.get(0))?;
        Ok(u64::try_from(n).unwrap_or(0))
    };
    counts.results = count("SELECT COUNT(*) FROM results WHERE tenant = ?1")?;
    counts.deliveries = count("SELECT COUNT(*) FROM webhook_deliveries WHERE tenant = ?1")?;
    for id in &ids {
        operation_remove(c, id, now)?;
    }
    counts.operations = ids.len() as u64;
    // Results of operations already removed (expired ones have no object left).
    c.prepare_cached(
        "INSERT OR IGNORE INTO artifact_garbage (storage_key, created_at)
         SELECT storage_key, ?2 FROM results WHERE tenant = ?1 AND state <> 'expired'",
    )?
    .execute(params![tenant, now.0])?;
    counts.keys = c
        .prepare_cached("DELETE FROM api_keys WHERE tenant = ?1")?
        .execute(params![tenant])? as u64;
    let uploads: Vec<String> = c
        .prepare_cached("SELECT id FROM uploads WHERE tenant = ?1")?
        .query_map(params![tenant], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for id in &uploads {
        upload_drop(c, id, now)?;
    }
    counts.uploads = uploads.len() as u64;
    for sql in [
        "DELETE FROM results WHERE tenant = ?1",
        "DELETE FROM idempotency_keys WHERE tenant = ?1",
        "DELETE FROM tombstones WHERE tenant = ?1",
        "DELETE FROM webhook_deliveries WHERE tenant = ?1",
        "DELETE FROM webhook_secrets WHERE tenant = ?1",
        "DELETE FROM tenant_dispatch WHERE tenant = ?1",
        "DELETE FROM tasks WHERE tenant = ?1 AND status IN ('ready', 'leased')",
        "DELETE FROM tenants WHERE name = ?1",
    ] {
        c.prepare_cached(sql)?.execute(params![tenant])?;
    }
    Ok(counts)
}

pub(super) fn server_secret_list(c: &Connection, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
    Ok(c.prepare_cached(
        "SELECT name, value FROM server_secrets WHERE substr(name, 1, length(?1)) = ?1 ORDER BY created_at, name",
    )?
    .query_map(params![prefix], |r| Ok((r.get(0)?, r.get(1)?)))?
    .collect::<rusqlite::Result<_>>()?)
}

/// The scope of a pause of acceptance: `*` for every kind.
const ALL_KINDS: &str = "*";

pub(super) fn backlog(c: &Connection, now: Timestamp) -> Result<Backlog> {
    let oldest_active = c
        .prepare_cached(
            "SELECT o.kind, o.state, MIN(o.created_at) FROM tasks t JOIN operations o ON o.id = t.operation_id
              GROUP BY o.kind, o.state",
        )?
        .query_map([], |r| Ok((r.get(0)?, state_column(r, 1)?, Timestamp(r.get(2)?))))?
        .collect::<rusqlite::Result<_>>()?;
    let count = |sql: &str| -> Result<u64> {
        let n: i64 = c.prepare_cached(sql)?.query_row(params![now.0], |r| r.get(0))?;
        Ok(u64::try_from(n).unwrap_or(0))
    };
    Ok(Backlog {
        oldest_active,
        retention_due: count("SELECT COUNT(*) FROM operations WHERE expires_at IS NOT NULL AND expires_at <= ?1")?
            + count("SELECT COUNT(*) FROM results WHERE state = 'published' AND expires_at <= ?1")?
            + count("SELECT COUNT(*) FROM tombstones WHERE expires_at <= ?1")?,
        garbage_objects: count("SELECT COUNT(*) FROM artifact_garbage WHERE ?1 = ?1")?,
        webhooks_due: count(
            "SELECT COUNT(*) FROM webhook_deliveries WHERE status = 'pending' AND next_attempt_at <= ?1",
        )?,
        webhooks_failing: count(
            "SELECT COUNT(*) FROM webhook_deliveries WHERE status = 'pending' AND attempts > 0 AND ?1 = ?1",
        )?,
    })
}

pub(super) fn console_session_start(c: &Connection, s: &ConsoleSession) -> Result<()> {
    c.prepare_cached("DELETE FROM console_sessions WHERE expires_at <= ?1")?
        .execute(params![s.created_at.0])?;
    c.prepare_cached(
        "INSERT INTO console_sessions (token_hash, key_id, created_at, expires_at) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![s.token_hash, s.key_id.as_str(), s.created_at.0, s.expires_at.0])?;
    Ok(())
}

pub(super) fn console_session_key(c: &Connection, token_hash: &[u8], now: Timestamp) -> Result<Option<Id>> {
    Ok(
        c.prepare_cached("SELECT key_id FROM console_sessions WHERE token_hash = ?1 AND expires_at > ?2")?
            .query_row(params![token_hash, now.0], |r| r.get::<_, String>(0))
            .optional()?
            .map(Id::from_trusted),
    )
}

pub(super) fn console_session_end(c: &Connection, token_hash: &[u8]) -> Result<()> {
    c.prepare_cached("DELETE FROM console_sessions WHERE token_hash = ?1")?
        .execute(params![token_hash])?;
    Ok(())
}

pub(super) fn operation_tenant(c: &Connection, id: &Id) -> Result<Option<String>> {
    Ok(c.prepare_cached("SELECT tenant FROM operations WHERE id = ?1")?
        .query_row(params![id.as_str()], |r| r.get(0))
        .optional()?)
}

pub(super) fn operation_by_key(c: &Connection, tenant: &str, kinds: &[String], key: &str) -> Result<Option<Id>> {
    // One primary-key lookup per kind: keys are scoped by (tenant, kind).
    let mut stmt =
        c.prepare_cached("SELECT operation_id FROM idempotency_keys WHERE tenant = ?1 AND kind = ?2 AND key = ?3")?;
    for kind in kinds {
        if let Some(id) = stmt
            .query_row(params![tenant, kind, key], |r| r.get::<_, String>(0))
            .optional()?
        {
            return Ok(Some(Id::from_trusted(id)));
        }
    }
    Ok(None)
}

pub(super) fn idempotency_record(c: &Connection, tenant: &str, id: &Id) -> Result<Option<IdempotencyRecord>> {
    Ok(c.prepare_cached(
        "SELECT k.key, k.kind, k.created_at, k.replays FROM operations o
           JOIN idempotency_keys k ON k.tenant = o.tenant AND k.kind = o.kind AND k.key = o.idempotency_key
          WHERE o.id = ?1 AND o.tenant = ?2 AND k.operation_id = o.id",
    )?
    .query_row(params![id.as_str(), tenant], |r| {
        Ok(IdempotencyRecord {
            key: r.get(0)?,
            kind: r.get(1)?,
            created_at: Timestamp(r.get(2)?),
            replays: r.get(3)?,
        })
    })
    .optional()?)
}

pub(super) fn active_summary(c: &Connection, tenant: Option<&str>) -> Result<Vec<ActiveGroup>> {
    Ok(c.prepare_cached(
        "SELECT o.kind, o.state, COUNT(*), MIN(o.created_at) FROM tasks t JOIN operations o ON o.id = t.operation_id
          WHERE ?1 IS NULL OR t.tenant = ?1 GROUP BY o.kind, o.state ORDER BY o.kind, o.state",
    )?
    .query_map(params![tenant], |r| {
        Ok(ActiveGroup {
            kind: r.get(0)?,
            state: state_column(r, 1)?,
            count: u64::try_from(r.get::<_, i64>(2)?).unwrap_or(0),
            oldest_created_at: Timestamp(r.get(3)?),
        })
    })?
    .collect::<rusqlite::Result<_>>()?)
}

pub(super) fn lease_list(c: &Connection, tenant: Option<&str>, limit: u32) -> Result<Vec<LeaseInfo>> {
    Ok(c.prepare_cached(
        "SELECT t.operation_id, t.tenant, t.kind, t.worker_id, o.attempt, t.lease_expires_at, t.lease_ms, o.progress
           FROM tasks t JOIN operations o ON o.id = t.operation_id
          WHERE t.status = 'leased' AND (?1 IS NULL OR t.tenant = ?1)
          ORDER BY t.lease_expires_at LIMIT ?2",
    )?
    .query_map(params![tenant, limit], |r| {
        let expires = Timestamp(r.get(5)?);
        let lease_ms: Option<i64> = r.get(6)?;
        Ok(LeaseInfo {
            operation_id: Id::from_trusted(r.get(0)?),
            tenant: r.get(1)?,
            kind: r.get(2)?,
            worker_id: r.get(3)?,
            attempt: r.get(4)?,
            lease_expires_at: expires,
            last_heartbeat_at: lease_ms.map(|ms| Timestamp(expires.0 - ms)),
            progress: json_column(r, 7)?.map(|v| progress_from_json(&v)),
        })
    })?
    .collect::<rusqlite::Result<_>>()?)
}

pub(super) fn tenant_usage(c: &Connection) -> Result<Vec<TenantUsage>> {
    Ok(c.prepare_cached(
        "SELECT n.name, n.max_active, n.max_running, n.rate,
                (SELECT COUNT(*) FROM tasks t WHERE t.tenant = n.name),
                (SELECT COUNT(*) FROM tasks t WHERE t.tenant = n.name AND t.status = 'leased')
           FROM tenants n ORDER BY n.name",
    )?
    .query_map([], |r| {
        Ok(TenantUsage {
            limits: TenantLimits {
                name: r.get(0)?,
                max_active: r.get(1)?,
                max_running: r.get(2)?,
                rate: r.get(3)?,
            },
            active: u64::try_from(r.get::<_, i64>(4)?).unwrap_or(0),
            running: u64::try_from(r.get::<_, i64>(5)?).unwrap_or(0),
        })
    })?
    .collect::<rusqlite::Result<_>>()?)
}

pub(super) fn accepting_pause(c: &Connection, kind: Option<&str>, paused: bool) -> Result<()> {
    let scope = kind.unwrap_or(ALL_KINDS);
    if paused {
        c.prepare_cached("INSERT OR IGNORE INTO accept_pauses (scope) VALUES (?1)")?
            .execute(params![scope])?;
    } else {
        c.prepare_cached("DELETE FROM accept_pauses WHERE scope = ?1")?
            .execute(params![scope])?;
    }
    Ok(())
}

pub(super) fn accepting_pauses(c: &Connection) -> Result<Vec<Option<String>>> {
    Ok(c.prepare_cached("SELECT scope FROM accept_pauses ORDER BY scope")?
        .query_map([], |r| {
            let scope: String = r.get(0)?;
            Ok((scope != ALL_KINDS).then_some(scope))
        })?
        .collect::<rusqlite::Result<_>>()?)
}

const UPLOAD_COLUMNS: &str = "id, tenant, content_type, upload_offset, complete, sha256, expected_sha256, chunks,
    created_at, expires_at, EXISTS (SELECT 1 FROM operation_uploads WHERE upload_id = uploads.id)";

fn upload_from_row(r: &Row) -> rusqlite::Result<UploadRecord> {
    let chunks: String = r.get(7)?;
    Ok(UploadRecord {
        id: Id::from_trusted(r.get(0)?),
        tenant: r.get(1)?,
        content_type: r.get(2)?,
        offset: r.get(3)?,
        complete: r.get(4)?,
        sha256: r.get(5)?,
        expected_sha256: r.get(6)?,
        chunks: chunks_from_json(&chunks),
        created_at: Timestamp(r.get(8)?),
        expires_at: Timestamp(r.get(9)?),
        referenced: r.get(10)?,
    })
}

pub(super) fn upload_create(c: &Connection, p: &UploadCreateParams) -> Result<UploadRecord> {
    c.prepare_cached(
        "INSERT INTO uploads (id, tenant, content_type, upload_offset, complete, expected_sha256, chunks, created_at,
                              expires_at)
         VALUES (?1, ?2, ?3, 0, 0, ?4, '[]', ?5, ?6)",
    )?
    .execute(params![
        p.id.as_str(),
        p.tenant,
        p.content_type,
        p.expected_sha256,
        p.now.0,
        p.expires_at.0
    ])?;
    upload_get(c, &p.tenant, &p.id)?.ok_or(StoreError::NotFound)
}

pub(super) fn upload_get(c: &Connection, tenant: &str, id: &Id) -> Result<Option<UploadRecord>> {
    let sql = format!("SELECT {UPLOAD_COLUMNS} FROM uploads WHERE id = ?1 AND tenant = ?2");
    Ok(c.prepare_cached(&sql)?
        .query_row(params![id.as_str(), tenant], upload_from_row)
        .optional()?)
}

pub(super) fn upload_append(c: &Connection, p: &UploadAppendParams) -> Result<UploadRecord> {
    let current = upload_get(c, &p.tenant, &p.id)?.ok_or(StoreError::NotFound)?;
    let appended = upload_appended(&current, p)?;
    c.prepare_cached(
        "UPDATE uploads SET upload_offset = ?2, complete = ?3, sha256 = ?4, expected_sha256 = ?5, chunks = ?6
          WHERE id = ?1",
    )?
    .execute(params![
        p.id.as_str(),
        appended.offset,
        appended.complete,
        appended.sha256,
        appended.expected_sha256,
        chunks_to_json(&appended.chunks)
    ])?;
    Ok(appended)
}

pub(super) fn upload_complete(c: &Connection, p: &UploadCompleteParams) -> Result<UploadRecord> {
    let current = upload_get(c, &p.tenant, &p.id)?.ok_or(StoreError::NotFound)?;
    let (completed, garbage) = upload_completed(&current, p)?;
    c.prepare_cached("UPDATE uploads SET complete = 1, sha256 = ?2, chunks = ?3 WHERE id = ?1")?
        .execute(params![
            p.id.as_str(),
            completed.sha256,
            chunks_to_json(&completed.chunks)
        ])?;
    for key in garbage {
        c.prepare_cached("INSERT OR IGNORE INTO artifact_garbage (storage_key, created_at) VALUES (?1, ?2)")?
            .execute(params![key, p.now.0])?;
    }
    Ok(completed)
}

pub(super) fn upload_remove(c: &Connection, tenant: &str, id: &Id, now: Timestamp) -> Result<bool> {
    match upload_get(c, tenant, id)? {
        Some(upload) if !upload.referenced => {
            upload_drop(c, id.as_str(), now)?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Deletes an upload's row; its objects become garbage.
fn upload_drop(c: &Connection, id: &str, now: Timestamp) -> Result<()> {
    let chunks: Option<String> = c
        .prepare_cached("DELETE FROM uploads WHERE id = ?1 RETURNING chunks")?
        .query_row(params![id], |r| r.get(0))
        .optional()?;
    for chunk in chunks_from_json(chunks.as_deref().unwrap_or("[]")) {
        c.prepare_cached("INSERT OR IGNORE INTO artifact_garbage (storage_key, created_at) VALUES (?1, ?2)")?
            .execute(params![chunk.storage_key, now.0])?;
    }
    Ok(())
}

pub(super) fn upload_for_task(
    c: &Connection,
    operation_id: &Id,
    lease_token: &str,
    upload_id: &Id,
) -> Result<Option<UploadRecord>> {
    fenced(c, operation_id, lease_token)?;
    let sql = format!(
        "SELECT {UPLOAD_COLUMNS} FROM uploads WHERE id = ?1
            AND EXISTS (SELECT 1 FROM operation_uploads WHERE operation_id = ?2 AND upload_id = ?1)"
    );
    Ok(c.prepare_cached(&sql)?
        .query_row(params![upload_id.as_str(), operation_id.as_str()], upload_from_row)
        .optional()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AcceptParams, ClaimParams, FinishParams, Outcome};
    use longrun_core::IdKind;
    use rusqlite::StatementStatus;

    /// The statements of the job path stay prepared: none is re-prepared
    /// from one task to the next (a profile once found the writer re-parsing
    /// `FENCED` for every outcome).
    #[test]
    #[allow(unsafe_code)]
    fn the_job_path_never_re_prepares_its_statements() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("longrun.db");
        crate::sqlite::migrate(&path).unwrap();
        let c = Connection::open(&path).unwrap();
        let policy = WritePolicy {
            operation_retention: Duration::from_secs(3600),
            result_retention: Duration::from_secs(3600),
            keep_inputs: false,
        };
        for i in 0..5 {
            let now = Timestamp(1_800_000_000_000 + i);
            operation_accept(
                &c,
                &AcceptParams {
                    id: Id::generate(IdKind::Operation),
                    tenant: "t".into(),
                    kind: "k".into(),
                    input: serde_json::json!({}),
                    callback_url: None,
                    deadline_at: None,
                    budget_max_cost: None,
                    labels: Default::default(),
                    idempotency: None,
                    uploads: Vec::new(),
                    rerun_of: None,
                    from_checkpoint: false,
                    now,
                },
            )
            .unwrap();
            let claimed = task_claim(
                &c,
                policy,
                &ClaimParams {
                    kinds: vec!["k".into()],
                    max_tasks: 4,
                    lease: Duration::from_secs(30),
                    worker_id: "w".into(),
                    now,
                },
            )
            .unwrap();
            for task in claimed {
                task_finish(
                    &c,
                    policy,
                    &FinishParams {
                        operation_id: task.operation_id,
                        lease_token: task.lease_token,
                        outcome: Outcome::Succeeded { result: None },
                        progress: None,
                        now,
                    },
                )
                .unwrap();
            }
        }
        let fenced = c.prepare_cached(&fenced_operation_sql()).unwrap();
        assert_eq!(fenced.get_status(StatementStatus::Run), 5);
        drop(fenced);
        // Every statement the connection holds, with how often it was re-prepared.
        let mut reprepared = Vec::new();
        // SAFETY: the handle is this live connection's; sqlite3_next_stmt
        // walks its statements, which stay alive while nothing prepares or
        // finalizes, and neither happens in this loop.
        unsafe {
            let db = c.handle();
            let mut stmt = rusqlite::ffi::sqlite3_next_stmt(db, std::ptr::null_mut());
            while !stmt.is_null() {
                let n = rusqlite::ffi::sqlite3_stmt_status(stmt, rusqlite::ffi::SQLITE_STMTSTATUS_REPREPARE, 0);
                if n > 0 {
                    let sql = std::ffi::CStr::from_ptr(rusqlite::ffi::sqlite3_sql(stmt));
                    reprepared.push(sql.to_string_lossy().split_whitespace().collect::<Vec<_>>().join(" "));
                }
                stmt = rusqlite::ffi::sqlite3_next_stmt(db, stmt);
            }
        }
        // Only READY_HEADS, once per claim (its ORDER BY on a column held
        // equal to a parameter makes SQLite plan for the value).
        let ready_heads = READY_HEADS.split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(reprepared, vec![ready_heads]);
    }
}
