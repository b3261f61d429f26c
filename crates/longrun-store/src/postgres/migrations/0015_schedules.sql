-- Schema version 15: schedules (docs/schedules.md). A schedule keeps its
-- definition as the API took it (`spec`, JSON) and what the firing needs
-- to find and fence it: `version` (each change, a firing's advance too, is
-- a compare-and-set on it), `next_fire_at` (NULL: no further firing),
-- the operation of its latest firing and a firing held back by
-- `buffer_one`. A firing is an ordinary operation whose idempotency key
-- `schedule:{id}:{fire_time}` makes it one however many nodes try it;
-- `schedule_fires` records what each firing time became.
CREATE TABLE schedules (
    id                 TEXT PRIMARY KEY,
    tenant             TEXT NOT NULL,
    version            BIGINT NOT NULL CHECK (version >= 1),
    paused             BOOLEAN NOT NULL,
    spec               TEXT NOT NULL,
    next_fire_at       BIGINT,
    last_operation_id  TEXT,
    buffered_fire_at   BIGINT,
    created_at         BIGINT NOT NULL,
    updated_at         BIGINT NOT NULL
);
CREATE INDEX schedules_by_tenant ON schedules (tenant, id);
CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE NOT paused;
CREATE INDEX schedules_buffered ON schedules (buffered_fire_at) WHERE buffered_fire_at IS NOT NULL;
CREATE TABLE schedule_fires (
    schedule_id   TEXT NOT NULL,
    fire_time     BIGINT NOT NULL,
    tenant        TEXT NOT NULL,
    operation_id  TEXT,
    decision      TEXT NOT NULL CHECK (decision IN ('started', 'triggered', 'backfilled', 'buffered', 'skipped', 'missed', 'refused')),
    recorded_at   BIGINT NOT NULL,
    PRIMARY KEY (schedule_id, fire_time)
);
