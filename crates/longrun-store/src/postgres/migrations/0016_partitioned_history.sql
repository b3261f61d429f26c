-- Schema version 16: the history (`operation_events`) partitioned by the
-- operation's `seq`, so that retention drops it a partition at a time.
--
-- Retention used to delete an expired operation's events row by row: three
-- to six dead tuples per operation, vacuumed with every index of a table
-- that holds every operation of the retention window, so its cost grew with
-- what is kept. Now an operation's events live in the partition of its
-- `seq` (which follows submission order and is never reused), retention
-- leaves them there, and a partition is dropped once no operation of its
-- range remains (docs/scaling.md). Partitions are made ahead by the
-- retention pass, each about a day of submissions wide; a row whose range
-- has no partition (a burst past the one made ahead, or an operation of a
-- range already dropped) lands in `operation_events_default`, from which
-- the pass removes the rows of removed operations one by one.
--
-- Keyed by (op_seq, version) like SQLite's table since schema 13: 8 bytes
-- where the operation id took 33, in the table and in its key.
--
-- The move copies the existing history into the first partition in this
-- migration's transaction: a pause of about two seconds per million events
-- on the machine of docs/benchmarks (the history is not readable or
-- writable meanwhile; every other table is).
CREATE TABLE history_partitions (
    lo           BIGINT PRIMARY KEY,
    hi           BIGINT NOT NULL CHECK (hi > lo),
    created_at   BIGINT NOT NULL,
    -- The highest seq handed out when it was made: the next width is
    -- the pace of submissions since (seqs per day).
    made_at_seq  BIGINT NOT NULL
);

ALTER TABLE operation_events RENAME TO operation_events_before_16;

CREATE TABLE operation_events (
    op_seq    BIGINT NOT NULL,
    version   BIGINT NOT NULL,
    type      TEXT NOT NULL,
    state     TEXT NOT NULL,
    at        BIGINT NOT NULL,
    data      TEXT NOT NULL DEFAULT '{}',
    snapshot  TEXT,
    PRIMARY KEY (op_seq, version)
) PARTITION BY RANGE (op_seq);

CREATE TABLE operation_events_default PARTITION OF operation_events DEFAULT;

DO $$
DECLARE
    highest BIGINT := (SELECT last_value FROM operations_seq_seq);
BEGIN
    EXECUTE format('CREATE TABLE operation_events_0 PARTITION OF operation_events FOR VALUES FROM (0) TO (%s)',
                   highest + 100000);
    INSERT INTO history_partitions (lo, hi, created_at, made_at_seq)
    VALUES (0, highest + 100000, (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT, highest);
END $$;

INSERT INTO operation_events (op_seq, version, type, state, at, data, snapshot)
SELECT o.seq, e.version, e.type, e.state, e.at, e.data, e.snapshot
  FROM operation_events_before_16 e JOIN operations o ON o.id = e.operation_id;

DROP TABLE operation_events_before_16;
