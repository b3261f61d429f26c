-- Schema version 18: no index of `operations` reads `state`, so a claim
-- (queued -> running) is an update PostgreSQL can make HOT.
--
-- An update is HOT (a new version of the row on the same page, no index
-- touched) only when it changes no column an index holds or filters on.
-- A claim changes `state`, `attempt`, `started_at`, `version` and
-- `updated_at`; of these only `state` was indexed (in
-- operations_by_tenant_state's key and in the predicates of four partial
-- indexes), so each claim wrote an entry into every index of the table:
-- its id, its seq and (tenant, kind, seq), three a job.
--
-- The indexes now read `rest_state`, a stored generated column: the state
-- of an operation that rests (paused or ended), NULL while it is queued or
-- running. A claim leaves it NULL. A finish still changes it (and the
-- indexed `completed_at` and `expires_at`), so a finish is not HOT.
--
-- A HOT update also needs room on the row's page. Under steady traffic
-- (3,000 operations submitted one by one and drained as they came, on
-- 2026-12-06) 2,897-2,939 of 3,000 claims were HOT, in a table of the same
-- size (136 pages, 134 before), and WAL records a job fell from 32 to
-- 30-31. A queue drained in bulk fills its pages with queued rows first,
-- so its claims find no room: scripts/drain, 20,000 jobs, ~380 HOT, jobs/s
-- as before. Leaving new pages half empty (fillfactor 50) makes those HOT
-- too (19,480 of 20,000; jobs/s median 11,656 -> 12,890, five alternating
-- pairs, WAL records a job 33 -> 30) but keeps every page of ended work
-- half empty (the same 3,000: 333 pages): a trade the operator makes
-- (docs/scaling.md), not this migration.
--
-- Adding a stored generated column rewrites the table and its indexes
-- under an exclusive lock: reads and writes of operations wait for it,
-- the whole migration took 6.4 s at 1 M stored operations here
-- (docs/operations.md).
ALTER TABLE operations ADD COLUMN rest_state TEXT
    GENERATED ALWAYS AS (CASE WHEN state IN ('queued', 'running') THEN NULL ELSE state END) STORED;
DROP INDEX operations_by_tenant_state, operations_live_deadline, operations_system_cancel,
    operations_pause_asked, operations_succeeded_by_kind;
CREATE INDEX operations_by_tenant_state ON operations (tenant, rest_state, seq) WHERE rest_state IS NOT NULL;
CREATE INDEX operations_live_deadline ON operations (deadline_at)
    WHERE deadline_at IS NOT NULL AND rest_state IS NULL;
CREATE INDEX operations_system_cancel ON operations (cancel_requested_at)
    WHERE rest_state IS NULL AND cancel_requested_by = 'system';
CREATE INDEX operations_pause_asked ON operations (pause_requested_at)
    WHERE rest_state IS NULL AND pause_requested_at IS NOT NULL;
CREATE INDEX operations_succeeded_by_kind ON operations (kind, completed_at) WHERE rest_state = 'succeeded';
