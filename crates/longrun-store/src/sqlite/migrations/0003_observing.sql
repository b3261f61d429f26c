-- Observing: each event keeps the representation at its version (without the
-- input), so event streams can resume from any version without loss; and
-- completed durations per kind pace polling.

ALTER TABLE operation_events ADD COLUMN snapshot TEXT;

CREATE INDEX operations_succeeded_by_kind ON operations (kind, completed_at) WHERE state = 'succeeded';
