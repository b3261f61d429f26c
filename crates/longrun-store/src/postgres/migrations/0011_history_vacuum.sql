-- Schema version 11: autovacuum of the tables that keep the history goes
-- gently (10 ms of sleep per unit of cost spent, against PostgreSQL's
-- default of 2 ms).
--
-- These tables grow with every operation ever accepted until retention
-- removes it. A vacuum scans each of their indexes whole, so its cost grows
-- with what is stored, not with what changed: with 1 M operations stored,
-- one vacuum of `operations` after 50 k deleted rows took 0.3 s of CPU and
-- ran in 0.5 s at the default pace. Idle pickups (submit -> claim answered,
-- on a 2-core machine) that overlapped such a vacuum had p99 6.8-8.4 ms
-- against 6.3-6.5 ms outside it; at 10 ms the same vacuum spreads over
-- 2 s and the pickups over it had p99 2.4-4.3 ms, as outside it. The queue
-- tables (tasks, tenant_dispatch) keep the default: they are small, and
-- their dead rows must go quickly.
ALTER TABLE operations SET (autovacuum_vacuum_cost_delay = 10);
ALTER TABLE operation_events SET (autovacuum_vacuum_cost_delay = 10);
ALTER TABLE idempotency_keys SET (autovacuum_vacuum_cost_delay = 10);
ALTER TABLE webhook_deliveries SET (autovacuum_vacuum_cost_delay = 10);
ALTER TABLE webhook_attempts SET (autovacuum_vacuum_cost_delay = 10);
