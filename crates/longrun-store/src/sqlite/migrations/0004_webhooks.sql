-- Webhooks (docs/api.md §5): an outbox row per state transition of an operation
-- with a callback, written in the transition's own transaction; a log of
-- every delivery attempt; signing secrets per tenant.

CREATE TABLE webhook_deliveries (
    event_id         TEXT PRIMARY KEY,
    operation_id     TEXT NOT NULL,
    tenant           TEXT NOT NULL,
    url              TEXT NOT NULL,
    type             TEXT NOT NULL,
    payload          TEXT NOT NULL,
    created_at       INTEGER NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('pending', 'delivered', 'given_up')),
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  INTEGER,
    -- A deliverer working on it; another may take it after this time.
    lease_until      INTEGER,
    CHECK ((status = 'pending') = (next_attempt_at IS NOT NULL))
) STRICT;

CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_by_operation ON webhook_deliveries (operation_id);

CREATE TABLE webhook_attempts (
    event_id         TEXT NOT NULL,
    attempt          INTEGER NOT NULL,
    operation_id     TEXT NOT NULL,
    type             TEXT NOT NULL,
    at               INTEGER NOT NULL,
    status_code      INTEGER,
    error            TEXT,
    next_attempt_at  INTEGER,
    PRIMARY KEY (event_id, attempt)
) STRICT;

CREATE INDEX webhook_attempts_by_operation ON webhook_attempts (operation_id, at);

CREATE TABLE webhook_secrets (
    tenant      TEXT NOT NULL,
    secret      TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    -- Set on rotation: the secret still signs until then (the overlap window).
    retired_at  INTEGER,
    PRIMARY KEY (tenant, secret)
) STRICT;
