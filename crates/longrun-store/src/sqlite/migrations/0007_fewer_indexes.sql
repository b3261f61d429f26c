-- Fewer indexes on the job path (as PostgreSQL's schema version 3): each
-- was written on every job and read by no hot path. Claims read ready tasks
-- by (tenant, kind, seq); the quota counts a tenant's ready and leased
-- tasks through their own partial indexes.
DROP INDEX tasks_ready;
DROP INDEX tasks_by_tenant;
