-- Schema version 14: work that starts later and work that matters more
-- (docs/api.md §10): `not_before` (when the operation may start; NULL: at
-- once) and `priority` (1–9, higher first within a tenant; 5 when not
-- given). A task carries its operation's priority, and a task of work that
-- starts later is `ready` from its creation with `available_at` at its
-- start. Claims read each priority's ready range by availability, so the
-- tasks waiting for a future time are never read by a claim, however many.
ALTER TABLE operations ADD COLUMN not_before BIGINT;
ALTER TABLE operations ADD COLUMN priority SMALLINT NOT NULL DEFAULT 5;
ALTER TABLE tasks ADD COLUMN priority SMALLINT NOT NULL DEFAULT 5;
DROP INDEX tasks_ready_by_tenant;
CREATE INDEX tasks_ready_by_tenant ON tasks (tenant, kind, priority, available_at, seq) WHERE status = 'ready';
