-- Schema version 3: fewer indexes on the job path. A state change is an
-- update PostgreSQL cannot make HOT (the state is indexed), so it inserts
-- into every index of its table: pg_walinspect counted 29 index-leaf inserts
-- per job. These were written on every job and read by no hot path.

-- Claims read ready tasks by (tenant, kind, seq): tasks_ready_by_tenant.
DROP INDEX tasks_ready;
-- The quota counts a tenant's ready and leased tasks through their own
-- partial indexes (tasks_ready_by_tenant, tasks_leased_by_tenant).
DROP INDEX tasks_by_tenant;
-- Nothing looks an operation up by seq alone (lists read (tenant, …, seq)):
-- the id is the key, and seq stays the creation order.
ALTER TABLE operations DROP CONSTRAINT operations_pkey;
ALTER TABLE operations DROP CONSTRAINT operations_id_key;
ALTER TABLE operations ADD PRIMARY KEY (id);
