-- Schema version 17: queued and running work is listed from the tasks, and
-- operations_by_tenant_state keeps only the states work rests in.
--
-- A claim and a finish are updates PostgreSQL cannot make HOT, so every
-- state change left a dead entry in its old state's range of
-- operations_by_tenant_state. A page of queued or running work (and every
-- page without a filter, which merges each state's newest) walked back over
-- the dead entries of work that had moved on until VACUUM cleaned the
-- index, and VACUUM skips that on a large table (dead tuples on fewer than
-- 2 % of its pages: "index scan bypassed"). At 10 M stored, the probe of an
-- empty queued range read 446 pages to find nothing.
--
-- Queued and running operations are exactly those with a task, and the
-- tasks table holds nothing else and is vacuumed often, so their pages
-- read it by (tenant, started, seq), and the operations' index keeps
-- paused and ended work, which an operation enters once (ended) or seldom
-- (paused). A task's `status` does not say its operation's state: a
-- running operation waiting for its next attempt has a `ready` task. Its
-- new `started` does: set when the task is first leased (the operation
-- starts), never cleared (running is never left for queued). A job writes
-- one index entry fewer: its accept and its claim add none to
-- operations_by_tenant_state; its task's claim writes one into
-- tasks_by_tenant where it wrote one into tasks_leased_by_tenant, whose
-- counts tasks_by_tenant now serves (by its tenant).
--
-- Building the partial index holds writes to `operations` (not reads) for
-- as long as it takes: 5.0 s at 10 M operations here (docs/scaling.md).
DROP INDEX tasks_leased_by_tenant;
ALTER TABLE tasks ADD COLUMN started BOOLEAN NOT NULL DEFAULT FALSE;
UPDATE tasks t SET started = TRUE FROM operations o WHERE o.id = t.operation_id AND o.state = 'running';
CREATE INDEX tasks_by_tenant ON tasks (tenant, started, seq);
DROP INDEX operations_by_tenant_state;
CREATE INDEX operations_by_tenant_state ON operations (tenant, state, seq)
    WHERE state NOT IN ('queued', 'running');
