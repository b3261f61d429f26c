-- Schema version 19: webhook deliveries and their log partitioned by the
-- event's id, so that retention drops them a partition at a time.
--
-- A finished delivery and its attempts were deleted row by row once past
-- the delivery retention (7 days by default): a dead tuple per row, and a
-- vacuum that scans every index of tables holding the whole window. Event
-- ids begin with their creation millisecond in an alphabet that sorts in
-- ASCII order (longrun-core's id.rs), so a range of ids is a range of
-- time: both tables are partitioned by `event_id` into about a day each
-- (the same bounds for both, so a delivery and its attempts always share
-- a day), made a day ahead by the retention pass, and a day is dropped
-- once it ended a delivery retention ago and holds no pending delivery
-- (docs/scaling.md). Each keeps its primary key: `event_id` is the
-- partition key, so every statement that names an event reads one
-- partition.
--
-- Rows whose id has no partition (the ones moved here from before, ids of
-- the older shapes that sort apart, a node whose clock runs behind a
-- dropped day) land in the default partitions, from which the retention
-- pass deletes finished deliveries row by row as before.
--
-- The key is compared bytewise (`COLLATE "C"`), whatever the database's
-- collation: the bounds are id prefixes, and the order is the id's.
--
-- The move copies the existing rows (a week of deliveries at most) in this
-- migration's transaction: webhook deliveries wait meanwhile; everything
-- else goes on.
CREATE TABLE delivery_partitions (
    -- The first id of the next partition (exclusive bound of this one).
    hi          TEXT COLLATE "C" PRIMARY KEY,
    lo          TEXT COLLATE "C" NOT NULL,
    -- Every id below `hi` was made before this millisecond.
    ends_at     BIGINT NOT NULL,
    name        TEXT NOT NULL UNIQUE,
    -- Detached from both parents, its tables not yet dropped.
    detached    BOOLEAN NOT NULL DEFAULT FALSE
);

ALTER TABLE webhook_deliveries RENAME TO webhook_deliveries_before_19;
ALTER TABLE webhook_attempts RENAME TO webhook_attempts_before_19;
ALTER INDEX webhook_deliveries_pkey RENAME TO webhook_deliveries_before_19_pkey;
ALTER INDEX webhook_attempts_pkey RENAME TO webhook_attempts_before_19_pkey;
DROP INDEX webhook_deliveries_due, webhook_deliveries_by_operation, webhook_deliveries_finished,
           webhook_attempts_by_operation;

CREATE TABLE webhook_deliveries (
    event_id         TEXT COLLATE "C" NOT NULL,
    operation_id     TEXT NOT NULL,
    tenant           TEXT NOT NULL,
    url              TEXT NOT NULL,
    type             TEXT NOT NULL,
    payload          TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('pending', 'delivered', 'given_up')),
    attempts         BIGINT NOT NULL DEFAULT 0,
    next_attempt_at  BIGINT,
    lease_until      BIGINT,
    CHECK ((status = 'pending') = (next_attempt_at IS NOT NULL))
) PARTITION BY RANGE (event_id);

CREATE TABLE webhook_attempts (
    event_id         TEXT COLLATE "C" NOT NULL,
    attempt          BIGINT NOT NULL,
    operation_id     TEXT NOT NULL,
    type             TEXT NOT NULL,
    at               BIGINT NOT NULL,
    status_code      INTEGER,
    error            TEXT,
    next_attempt_at  BIGINT,
    latency_ms       BIGINT
) PARTITION BY RANGE (event_id);

-- Rows go on being updated (pending -> delivered) in every partition: each
-- is vacuumed gently, as the tables were (schema 11).
CREATE TABLE webhook_deliveries_default PARTITION OF webhook_deliveries DEFAULT
    WITH (autovacuum_vacuum_cost_delay = 10);
CREATE TABLE webhook_attempts_default PARTITION OF webhook_attempts DEFAULT
    WITH (autovacuum_vacuum_cost_delay = 10);

-- The existing rows of ids of today's shape (29 characters after `evt_`)
-- get a first partition up to the newest of them; the others go to the
-- default partitions.
DO $$
DECLARE
    newest TEXT := (SELECT MAX(event_id COLLATE "C") FROM webhook_deliveries_before_19
                     WHERE event_id ~ '^evt_[a-z2-7]{29}$');
BEGIN
    IF newest IS NOT NULL THEN
        EXECUTE format('CREATE TABLE webhook_deliveries_first PARTITION OF webhook_deliveries
                        FOR VALUES FROM (MINVALUE) TO (%L) WITH (autovacuum_vacuum_cost_delay = 10)', newest || '0');
        EXECUTE format('CREATE TABLE webhook_attempts_first PARTITION OF webhook_attempts
                        FOR VALUES FROM (MINVALUE) TO (%L) WITH (autovacuum_vacuum_cost_delay = 10)', newest || '0');
        -- Every id in it was made before now.
        INSERT INTO delivery_partitions (hi, lo, ends_at, name)
        VALUES (newest || '0', '', (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT, 'first');
    END IF;
END $$;

INSERT INTO webhook_deliveries SELECT event_id, operation_id, tenant, url, type, payload, created_at, status,
                                      attempts, next_attempt_at, lease_until
  FROM webhook_deliveries_before_19;
INSERT INTO webhook_attempts SELECT event_id, attempt, operation_id, type, at, status_code, error,
                                    next_attempt_at, latency_ms
  FROM webhook_attempts_before_19;

DROP TABLE webhook_deliveries_before_19, webhook_attempts_before_19;

-- The keys and indexes once the rows are in: built whole, not row by row.
ALTER TABLE webhook_deliveries ADD PRIMARY KEY (event_id);
ALTER TABLE webhook_attempts ADD PRIMARY KEY (event_id, attempt);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_by_operation ON webhook_deliveries (operation_id);
CREATE INDEX webhook_deliveries_finished ON webhook_deliveries (created_at) WHERE status <> 'pending';
CREATE INDEX webhook_attempts_by_operation ON webhook_attempts (operation_id, at);

-- A history partition (schema 16) is detached under the events' lock and
-- dropped after it, as a day of deliveries is: its files' removal no
-- longer holds every event's write (postgres/history.rs).
ALTER TABLE history_partitions ADD COLUMN detached BOOLEAN NOT NULL DEFAULT FALSE;

-- When a history partition was made and first seen closed, by the
-- database's clock: its operations' ids were made in between, and the
-- upkeep finds a remaining one by id (the key) instead of by seq, which no
-- index holds (a scan of every operation). Unknown for the partitions made
-- before: they are looked for by seq, as before.
ALTER TABLE history_partitions ADD COLUMN made_clock BIGINT, ADD COLUMN closed_clock BIGINT;
