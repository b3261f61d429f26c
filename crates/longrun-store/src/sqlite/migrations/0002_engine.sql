-- The job engine: tenant quotas, fair claims across tenants, deadline enforcement.

ALTER TABLE tenants ADD COLUMN max_active INTEGER CHECK (max_active IS NULL OR max_active >= 0);
ALTER TABLE tenants ADD COLUMN max_running INTEGER CHECK (max_running IS NULL OR max_running >= 0);
ALTER TABLE tenants ADD COLUMN rate REAL CHECK (rate IS NULL OR rate > 0);

-- The lease length a worker asked for at claim time; heartbeats renew by it.
ALTER TABLE tasks ADD COLUMN lease_ms INTEGER;

-- Which tenant was served least recently: claims go round the tenants in
-- this order, so one tenant's backlog cannot starve another's.
CREATE TABLE tenant_dispatch (
    tenant        TEXT PRIMARY KEY,
    last_claimed  INTEGER NOT NULL
) STRICT;

-- Per-tenant heads of the ready queue, per kind.
CREATE INDEX tasks_ready_by_tenant ON tasks (tenant, kind, seq) WHERE status = 'ready';
-- max_running: leased tasks of a tenant.
CREATE INDEX tasks_leased_by_tenant ON tasks (tenant) WHERE status = 'leased';
-- max_active: every task row is a non-terminal operation.
CREATE INDEX tasks_by_tenant ON tasks (tenant);

-- Deadline enforcement looks only at live operations that have a deadline.
CREATE INDEX operations_live_deadline ON operations (deadline_at)
    WHERE deadline_at IS NOT NULL AND state IN ('queued', 'running');
-- Cancellations the server itself asked for, awaiting the worker.
CREATE INDEX operations_system_cancel ON operations (cancel_requested_at)
    WHERE state = 'running' AND cancel_requested_by = 'system';
