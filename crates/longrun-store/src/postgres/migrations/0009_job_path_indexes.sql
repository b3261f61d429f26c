-- Schema version 9: two indexes fewer on the job path. WAL records per job
-- (pg_stat_wal around `scripts/drain`, 20 k jobs accepted and drained, two
-- alternating pairs on 2026-12-05): 41.8-42.3 before, 37.6-37.7 after.
--
-- Every change of an operation's state is an update PostgreSQL cannot make
-- HOT, so it inserts into each full index of `operations`: three times a
-- job. `operations_by_tenant` (tenant, seq) served only lists with neither
-- a state nor a kind; they now merge the newest of each state's range of
-- `operations_by_tenant_state` (at most six probes, each LIMITed).
DROP INDEX operations_by_tenant;

-- Leased tasks had two partial indexes. One on (tenant) serves the quota's
-- and the console's counts, and the reaper, which reads the leased tasks
-- (as many as the workers' slots, never the history) for the lapsed ones.
-- A heartbeat, which moves only lease_expires_at, no longer touches an index.
DROP INDEX tasks_leased;
