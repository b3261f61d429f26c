-- Results as artifacts, and retention (docs/api.md §3 "Results", "Retention").

-- The published artifact of an operation, as the representation shows it.
ALTER TABLE operations ADD COLUMN artifact TEXT;

CREATE TABLE results (
    id            TEXT PRIMARY KEY,
    operation_id  TEXT NOT NULL,
    tenant        TEXT NOT NULL,
    storage_key   TEXT NOT NULL UNIQUE,
    content_type  TEXT NOT NULL,
    size_bytes    INTEGER NOT NULL CHECK (size_bytes >= 0),
    sha256        TEXT NOT NULL,
    -- uploaded: by a worker, not yet published by `complete`.
    state         TEXT NOT NULL CHECK (state IN ('uploaded', 'published', 'expired')),
    lease_token   TEXT,
    created_at    INTEGER NOT NULL,
    expires_at    INTEGER,
    CHECK (state = 'uploaded' OR expires_at IS NOT NULL)
) STRICT;

CREATE INDEX results_by_operation ON results (operation_id);
CREATE INDEX results_expiring ON results (expires_at) WHERE state = 'published';

-- Objects to delete from the artifact store. Rows are written in the same
-- transaction that makes an object unreachable; the retention service
-- deletes the object, then the row (so a crash in between only repeats a
-- delete).
CREATE TABLE artifact_garbage (
    storage_key  TEXT PRIMARY KEY,
    created_at   INTEGER NOT NULL
) STRICT;

-- Removed operations answer 410 gone (and their idempotency keys stay
-- taken) until the tombstone expires.
CREATE TABLE tombstones (
    operation_id  TEXT PRIMARY KEY,
    tenant        TEXT NOT NULL,
    removed_at    INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL
) STRICT;

CREATE INDEX tombstones_expiring ON tombstones (expires_at);
CREATE INDEX operations_expiring ON operations (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX idempotency_by_operation ON idempotency_keys (operation_id);
CREATE INDEX webhook_deliveries_finished ON webhook_deliveries (created_at) WHERE status <> 'pending';
CREATE INDEX webhook_attempts_by_at ON webhook_attempts (at);
