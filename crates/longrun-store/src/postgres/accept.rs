//! Accepting submissions: the one-statement group commit of the common
//! case, the transaction for what it leaves undecided (a taken key, a quota),
//! and the hand-off that leases a new operation to a waiting claim.

use super::*;

/// Accepts a batch in one round trip in the common case: one statement
/// outside any transaction (`insert_submissions`, announcing) writes the
/// idempotency records (insert-or-detect), the operations, their tasks and
/// first events and NOTIFYs what it created, all committed together when the
/// statement ends. No BEGIN, no separate NOTIFY, no COMMIT: a group commit of
/// any size costs the database one round trip and one WAL flush. What the
/// statement leaves undecided (it wrote nothing for them) goes afterwards in
/// one transaction (`operation_accept_batch`): a key already taken (a replay
/// or a reuse, perhaps of an earlier item of this batch) and a tenant with a
/// `max_active` quota.
pub(super) async fn operation_accept_run(
    w: &Writer,
    c: &mut PgConnection,
    batch: &[&AcceptParams],
) -> Result<Vec<Result<AcceptOutcome>>> {
    // A re-run's source lists it: the statement commits that change too.
    let sources: Vec<&str> = batch
        .iter()
        .filter_map(|p| p.rerun_of.as_ref().map(Id::as_str))
        .collect();
    w.reads.writing(sources.iter().copied());
    let written = insert_submissions(c, batch, Mode::Announcing).await;
    w.reads.written(sources.iter().copied());
    let written = written?;
    let mut results: Vec<Option<Result<AcceptOutcome>>> = Vec::with_capacity(batch.len());
    let mut undecided = Vec::new();
    for (p, written) in batch.iter().zip(written) {
        match written {
            Inserted::Created(op) => {
                // Its source was forgotten by `written` above.
                w.reads.evict([op.id.as_str()]);
                results.push(Some(Ok(AcceptOutcome::Created(*op))));
            }
            Inserted::Capped | Inserted::KeyTaken => {
                undecided.push(*p);
                results.push(None);
            }
        }
    }
    if !undecided.is_empty() {
        let run: Run<AcceptParams, AcceptOutcome> = |w, c, batch| {
            Box::pin(commit_batch(
                w,
                c,
                |c, ch, policy, batch| {
                    Box::pin(async move { operation_accept_batch(&mut PgDriver { c, ch, policy }, batch).await })
                },
                batch,
            ))
        };
        let mut answers = alone_on_error(w, c, run, &undecided).await.into_iter();
        for slot in results.iter_mut().filter(|r| r.is_none()) {
            *slot = answers.next();
        }
    }
    results
        .into_iter()
        .map(|r| r.ok_or_else(|| StoreError::Corrupt("a submission went unanswered".into())))
        .collect()
}

/// Accepts, in the caller's transaction, what the announcing statement left
/// undecided: the same statement, transactional, then item by item a key
/// already taken (`plan::accept::taken_key`) and a tenant with a
/// `max_active` quota (`accept_with_quota`). A refusal writes nothing, so
/// the batch needs no savepoints; a database error fails the whole batch.
pub(super) async fn operation_accept_batch(
    d: &mut PgDriver<'_>,
    batch: &[&AcceptParams],
) -> Result<Vec<Result<AcceptOutcome>>> {
    let written = insert_submissions(d.c, batch, Mode::Unchecked).await?;
    let mut results = Vec::with_capacity(batch.len());
    for (p, written) in batch.iter().zip(written) {
        let outcome = match written {
            Inserted::Created(op) => {
                d.ch.record(&op, EventType::Created);
                Ok(AcceptOutcome::Created(*op))
            }
            Inserted::Capped => accept_with_quota(d, p).await,
            Inserted::KeyTaken => plan::accept::taken_key(d, p).await,
        };
        match outcome {
            // A database error leaves the transaction aborted.
            Err(e @ (StoreError::Postgres(_) | StoreError::IllegalTransition(_))) => return Err(e),
            answered => results.push(answered),
        }
    }
    Ok(results)
}

/// A submission and its lease in one statement outside any transaction
/// (so one round trip and one WAL flush): the operation is inserted as a
/// claim would leave it (running, version 2, attempt 1), its task leased
/// (the token drawn here, as `lease_tasks` draws it), with both events and
/// both changes announced. Nothing is written for a tenant with a quota on
/// active or running work (those are counted under the tenant's lock, as
/// `accept_with_quota` and a claim's `tasks_running` do) or a key already taken.
pub(super) const SUBMIT_LEASED: &str = "WITH q AS (
         SELECT NOT EXISTS (SELECT 1 FROM tenants
                             WHERE name = $2 AND (max_active IS NOT NULL OR max_running IS NOT NULL)) AS open
     ), k AS (
         INSERT INTO idempotency_keys (tenant, kind, key, fingerprint, operation_id, created_at)
         SELECT $2, $3, $8, $9, $1, $10 FROM q WHERE open AND $8::TEXT IS NOT NULL
         ON CONFLICT DO NOTHING RETURNING operation_id
     ), o AS (
         INSERT INTO operations (id, tenant, kind, state, version, attempt, input, deadline_at, budget_max_cost,
                                 labels, idempotency_key, created_at, updated_at, started_at, priority, not_before)
         SELECT $1, $2, $3, 'running', 2, 1, $4, $5, $6, $7, $8, $10, $10, $10, $21, $22 FROM q
          WHERE open AND ($8::TEXT IS NULL OR EXISTS (SELECT 1 FROM k))
         RETURNING id, seq
     ), t AS (
         INSERT INTO tasks (operation_id, seq, tenant, kind, status, available_at, lease_token, lease_expires_at,
                            worker_id, lease_ms, priority, started)
         SELECT o.id, o.seq, $2, $3, 'leased', $10, replace(gen_random_uuid()::TEXT, '-', ''), $11, $12, $13, $21,
                TRUE
           FROM o
         RETURNING lease_token
     ), e AS (
         INSERT INTO operation_events (op_seq, version, type, state, at, data, snapshot)
         SELECT o.seq, v.version, v.type, v.state, $10, v.data, v.snapshot
           FROM o CROSS JOIN (VALUES (1::BIGINT, $19::TEXT, 'queued', '{}', $14::TEXT, $14::TEXT IS NOT NULL),
                                     (2::BIGINT, $20::TEXT, 'running', $15::TEXT, $16::TEXT, TRUE))
                AS v(version, type, state, data, snapshot, kept)
          WHERE v.kept
     ), n AS (
         SELECT pg_notify($17, $18) FROM o
     )
     SELECT t.lease_token FROM t WHERE (SELECT count(*) FROM n) >= 0";

/// See [`Store::operation_accept_leased`] and [`SUBMIT_LEASED`].
pub(super) async fn operation_accept_leased(
    pool: &PgPool,
    reads: &ReadCache,
    p: &AcceptParams,
    to: &LeaseTo,
) -> Result<Option<(Operation, Task)>> {
    if !p.may_be_handed_off() {
        return Ok(None);
    }
    let created = created_operation(p);
    let running = started(created.clone(), p.now);
    let started_data = started_data(&running, &to.worker_id);
    let changes = [
        change_of(&created, EventType::Created),
        change_of(&running, EventType::Started),
    ];
    let payload = wire_text(&changes.iter().map(WireItem::change).collect::<Vec<_>>());
    let lease_expires_at = p.now.plus(to.lease);
    let mut c = pool.acquire().await.map_err(db)?;
    reads.writing([created.id.as_str()]);
    let token: Result<Option<String>> = sqlx::query_scalar(SUBMIT_LEASED)
        .bind(p.id.as_str())
        .bind(&p.tenant)
        .bind(&p.kind)
        .bind(p.input.to_string())
        .bind(p.deadline_at.map(|t| t.0))
        .bind(p.budget_max_cost)
        .bind(serde_json::to_string(&p.labels).map_err(|e| StoreError::Corrupt(e.to_string()))?)
        .bind(p.idempotency.as_ref().map(|(k, _)| k.as_str()))
        .bind(p.idempotency.as_ref().map(|(_, f)| f.0.to_vec()))
        .bind(p.now.0)
        .bind(lease_expires_at.0)
        .bind(&to.worker_id)
        .bind(lease_ms(to.lease))
        .bind(created_row(&created))
        .bind(started_data.to_string())
        .bind(event_row(&running, EventType::Started, &started_data).and_then(|row| row.snapshot))
        .bind(CHANNEL)
        .bind(payload)
        .bind(EventType::Created.as_str())
        .bind(EventType::Started.as_str())
        .bind(p.priority)
        .bind(p.not_before.map(|t| t.0))
        .fetch_optional(&mut *c)
        .await
        .map_err(db);
    reads.written([created.id.as_str()]);
    let Some(lease_token) = token? else {
        return Ok(None);
    };
    let task = Task {
        operation_id: running.id.clone(),
        tenant: running.tenant.clone(),
        kind: running.kind.clone(),
        input: p.input.clone(),
        attempt: running.attempt,
        lease_token,
        lease_expires_at,
        deadline_at: running.deadline_at,
        budget_max_cost: running.budget_max_cost,
        checkpoint: None,
    };
    Ok(Some((created, task)))
}

/// The snapshot column of `created`'s `created` event, as the submission
/// statements take it: `NULL` when the event is not written (`event_row`;
/// a written `created` event always has a snapshot, so `NULL` says it).
fn created_row(created: &Operation) -> Option<String> {
    event_row(created, EventType::Created, &serde_json::json!({})).and_then(|row| row.snapshot)
}

/// What the submission statement did with one item.
pub(super) enum Inserted {
    Created(Box<Operation>),
    /// The tenant has a `max_active` quota that was not checked: nothing written.
    Capped,
    /// The key names an earlier submission: nothing written.
    KeyTaken,
}

/// The submission statement's CTEs: what it writes (see
/// `insert_submissions`). Item `ord` of the arrays is one submission; `$13`
/// says the caller checked the quota; `$17` is each item's notification
/// (announcing only); `$18` the type of the event each records; `$19`–`$21`
/// each item's `not_before`, priority and when its task becomes claimable.
macro_rules! submit_ctes {
    () => {
        "WITH q AS (
             SELECT i.*, NOT $13 AND EXISTS (SELECT 1 FROM tenants WHERE name = i.tenant AND max_active IS NOT NULL) AS capped
               FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::TEXT[], $6::BIGINT[],
                           $7::FLOAT8[], $8::TEXT[], $9::TEXT[], $10::BYTEA[], $11::BIGINT[], $12::TEXT[],
                           $14::TEXT[], $15::TEXT[], $16::TEXT[], $17::TEXT[], $19::BIGINT[], $20::SMALLINT[],
                           $21::BIGINT[])
                    WITH ORDINALITY AS i(id, tenant, kind, input, callback_url, deadline_at, budget_max_cost,
                                         labels, key, fingerprint, now, snapshot, uploads, rerun_of,
                                         checkpoint_from, change, not_before, priority, available_at, ord)
         ), k AS (
             INSERT INTO idempotency_keys (tenant, kind, key, fingerprint, operation_id, created_at)
             SELECT tenant, kind, key, fingerprint, id, now FROM q WHERE key IS NOT NULL AND NOT capped ORDER BY ord
             ON CONFLICT DO NOTHING RETURNING operation_id
         ), o AS (
             INSERT INTO operations (id, tenant, kind, state, version, attempt, input, callback_url, deadline_at,
                                     budget_max_cost, labels, idempotency_key, created_at, updated_at, rerun_of,
                                     not_before, priority, checkpoint)
             SELECT id, tenant, kind, 'queued', 1, 0, input, callback_url, deadline_at, budget_max_cost, labels,
                    key, now, now, rerun_of, not_before, priority,
                    (SELECT r.checkpoint FROM operations r WHERE r.id = q.checkpoint_from) FROM q
              WHERE NOT capped AND (key IS NULL OR id IN (SELECT operation_id FROM k))
              ORDER BY ord
             RETURNING id, seq
         ), t AS (
             INSERT INTO tasks (operation_id, seq, tenant, kind, status, available_at, priority)
             SELECT o.id, o.seq, q.tenant, q.kind, 'ready', q.available_at, q.priority FROM o JOIN q USING (id)
         ), e AS (
             INSERT INTO operation_events (op_seq, version, type, state, at, data, snapshot)
             SELECT o.seq, 1, $18, 'queued', q.now, '{}', q.snapshot FROM o JOIN q USING (id)
              WHERE q.snapshot IS NOT NULL
         ), pc AS (
             INSERT INTO artifact_pieces (operation_id, name, piece_offset, storage_key, size_bytes)
             SELECT o.id, p.name, p.piece_offset, p.storage_key, p.size_bytes
               FROM o JOIN q USING (id) JOIN artifact_pieces p ON p.operation_id = q.checkpoint_from
         ), u AS (
             INSERT INTO operation_uploads (operation_id, upload_id)
             SELECT o.id, unnest(string_to_array(q.uploads, ',')) FROM o JOIN q USING (id) WHERE q.uploads <> ''
             ON CONFLICT DO NOTHING
         )"
    };
}

/// The submission statement in the caller's transaction.
pub(super) const SUBMIT_IN_TX: &str = concat!(
    submit_ctes!(),
    " SELECT q.capped, o.id IS NOT NULL FROM q LEFT JOIN o USING (id) ORDER BY q.ord"
);

/// The submission statement on its own: it also NOTIFYs (`$22`) what it
/// created, [`CHANGES_PER_PAYLOAD`] items per payload, and commits as it
/// ends.
pub(super) const SUBMIT_ANNOUNCING: &str = concat!(
    submit_ctes!(),
    ", n AS (
         SELECT pg_notify($22, '[' || string_agg(q.change, ',' ORDER BY q.ord) || ']')
           FROM o JOIN q USING (id) GROUP BY (q.ord - 1) / ",
    changes_per_payload!(),
    "
     )
     SELECT q.capped, o.id IS NOT NULL FROM q LEFT JOIN o USING (id) WHERE (SELECT count(*) FROM n) >= 0 ORDER BY q.ord"
);

/// How `insert_submissions` runs.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Mode {
    /// On its own, outside a transaction: it commits when it ends and
    /// NOTIFYs what it created itself; tenants with a quota are left.
    Announcing,
    /// In the caller's transaction, which announces; quota tenants are left.
    Unchecked,
    /// In the caller's transaction, which holds the tenant rows and counted.
    QuotaChecked,
}

/// The one statement that writes submissions, item by item in batch order
/// (see `operation_accept_run`). Two items with one key: the first is
/// written, the second finds the key taken.
pub(super) async fn insert_submissions(
    c: &mut PgConnection,
    batch: &[&AcceptParams],
    mode: Mode,
) -> Result<Vec<Inserted>> {
    let created: Vec<Operation> = batch.iter().map(|p| created_operation(p)).collect();
    let mut labels = Vec::with_capacity(batch.len());
    for p in batch {
        labels.push(serde_json::to_string(&p.labels).map_err(|e| StoreError::Corrupt(e.to_string()))?);
    }
    let column = |f: fn(&AcceptParams) -> Option<&str>| batch.iter().map(|p| f(p)).collect::<Vec<_>>();
    let announcing = mode == Mode::Announcing;
    // Each item's notification as it will be if the item is created: its
    // change, after the re-run source it touches.
    let change: Vec<String> = if announcing {
        created
            .iter()
            .map(|op| {
                let change = change_of(op, EventType::Created);
                let touched =
                    Change::also_alters(op, EventType::Created.as_str()).map(|id| WireItem::touched(id.as_str()));
                let items: Vec<WireItem> = touched.into_iter().chain([WireItem::change(&change)]).collect();
                let text = wire_text(&items);
                // The statement joins the items of many submissions into
                // one array: each item's text without its brackets.
                text[1..text.len() - 1].to_owned()
            })
            .collect()
    } else {
        Vec::new()
    };
    let query = sqlx::query(if announcing { SUBMIT_ANNOUNCING } else { SUBMIT_IN_TX })
        .bind(column(|p| Some(p.id.as_str())))
        .bind(column(|p| Some(p.tenant.as_str())))
        .bind(column(|p| Some(p.kind.as_str())))
        .bind(batch.iter().map(|p| p.input.to_string()).collect::<Vec<_>>())
        .bind(column(|p| p.callback_url.as_deref()))
        .bind(batch.iter().map(|p| p.deadline_at.map(|t| t.0)).collect::<Vec<_>>())
        .bind(batch.iter().map(|p| p.budget_max_cost).collect::<Vec<_>>())
        .bind(labels)
        .bind(column(|p| p.idempotency.as_ref().map(|(k, _)| k.as_str())))
        .bind(
            batch
                .iter()
                .map(|p| p.idempotency.as_ref().map(|(_, f)| f.0.to_vec()))
                .collect::<Vec<_>>(),
        )
        .bind(batch.iter().map(|p| p.now.0).collect::<Vec<_>>())
        .bind(created.iter().map(created_row).collect::<Vec<_>>())
        .bind(mode == Mode::QuotaChecked)
        .bind(
            batch
                .iter()
                .map(|p| p.uploads.iter().map(Id::as_str).collect::<Vec<_>>().join(","))
                .collect::<Vec<_>>(),
        )
        .bind(column(|p| p.rerun_of.as_ref().map(Id::as_str)))
        .bind(column(|p| {
            p.rerun_of.as_ref().filter(|_| p.from_checkpoint).map(Id::as_str)
        }))
        .bind(change)
        .bind(EventType::Created.as_str())
        .bind(batch.iter().map(|p| p.not_before.map(|t| t.0)).collect::<Vec<_>>())
        .bind(batch.iter().map(|p| p.priority).collect::<Vec<_>>())
        .bind(batch.iter().map(|p| p.available_at().0).collect::<Vec<_>>());
    let query = if announcing { query.bind(CHANNEL) } else { query };
    let rows = query.fetch_all(&mut *c).await.map_err(db)?;
    if rows.len() != batch.len() {
        return Err(StoreError::Corrupt("the submission statement lost an item".into()));
    }
    rows.iter()
        .zip(created)
        .map(|(row, op)| {
            let capped: bool = row.try_get(0).map_err(db)?;
            let inserted: bool = row.try_get(1).map_err(db)?;
            Ok(if inserted {
                Inserted::Created(Box::new(op))
            } else if capped {
                Inserted::Capped
            } else {
                Inserted::KeyTaken
            })
        })
        .collect()
}

/// A tenant with a `max_active` quota: its row is locked while the quota is
/// counted (`plan::accept::over_quota`), so concurrent submissions cannot
/// overshoot it. A replay still answers when the tenant is full.
pub(super) async fn accept_with_quota(d: &mut PgDriver<'_>, p: &AcceptParams) -> Result<AcceptOutcome> {
    if let Some(full) = plan::accept::over_quota(d, &p.tenant).await? {
        return plan::accept::known_key(d, p).await?.ok_or(full);
    }
    match insert_submissions(d.c, &[p], Mode::QuotaChecked).await?.pop() {
        Some(Inserted::Created(op)) => {
            d.ch.record(&op, EventType::Created);
            Ok(AcceptOutcome::Created(*op))
        }
        _ => plan::accept::taken_key(d, p).await,
    }
}
