-- Longrun schema, PostgreSQL. The same tables, constraints and invariants as
-- the SQLite schema (sqlite/migrations), in one file; timestamps are BIGINT
-- milliseconds since the epoch.

CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL);

CREATE TABLE tenants (
    name         TEXT PRIMARY KEY,
    created_at   BIGINT NOT NULL,
    max_active   BIGINT CHECK (max_active IS NULL OR max_active >= 0),
    max_running  BIGINT CHECK (max_running IS NULL OR max_running >= 0),
    rate         DOUBLE PRECISION CHECK (rate IS NULL OR rate > 0)
);

CREATE TABLE api_keys (
    id           TEXT PRIMARY KEY,
    tenant       TEXT NOT NULL REFERENCES tenants(name),
    role         TEXT NOT NULL CHECK (role IN ('client', 'worker', 'admin')),
    secret_hash  BYTEA NOT NULL CHECK (length(secret_hash) = 32),
    created_at   BIGINT NOT NULL,
    revoked_at   BIGINT
);

CREATE TABLE kinds (
    name                      TEXT PRIMARY KEY,
    builtin                   BOOLEAN NOT NULL,
    rerun_safe                BOOLEAN NOT NULL,
    max_attempts              BIGINT NOT NULL CHECK (max_attempts >= 1),
    default_deadline_seconds  BIGINT,
    max_deadline_seconds      BIGINT
);

CREATE TABLE operations (
    seq                  BIGSERIAL PRIMARY KEY,
    id                   TEXT NOT NULL UNIQUE,
    tenant               TEXT NOT NULL,
    kind                 TEXT NOT NULL,
    state                TEXT NOT NULL CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    version              BIGINT NOT NULL CHECK (version >= 1),
    attempt              BIGINT NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    input                TEXT,
    callback_url         TEXT,
    deadline_at          BIGINT,
    budget_max_cost      DOUBLE PRECISION,
    cost_units           DOUBLE PRECISION NOT NULL DEFAULT 0,
    labels               TEXT NOT NULL DEFAULT '{}',
    progress             TEXT,
    result               TEXT,
    error_code           TEXT,
    error_message        TEXT,
    error_retryable      BOOLEAN,
    cancel_requested_at  BIGINT,
    cancel_requested_by  TEXT,
    cancel_reason        TEXT,
    cancellable          BOOLEAN NOT NULL DEFAULT TRUE,
    idempotency_key      TEXT,
    created_at           BIGINT NOT NULL,
    started_at           BIGINT,
    completed_at         BIGINT,
    updated_at           BIGINT NOT NULL,
    expires_at           BIGINT,
    artifact             TEXT,
    CHECK (result IS NULL OR error_code IS NULL),
    CHECK ((result IS NULL AND error_code IS NULL) OR state IN ('succeeded', 'failed', 'cancelled'))
);

CREATE INDEX operations_by_tenant ON operations (tenant, seq);
CREATE INDEX operations_by_tenant_state ON operations (tenant, state, seq);
CREATE INDEX operations_by_tenant_kind ON operations (tenant, kind, seq);
CREATE INDEX operations_live_deadline ON operations (deadline_at)
    WHERE deadline_at IS NOT NULL AND state IN ('queued', 'running');
CREATE INDEX operations_system_cancel ON operations (cancel_requested_at)
    WHERE state = 'running' AND cancel_requested_by = 'system';
CREATE INDEX operations_succeeded_by_kind ON operations (kind, completed_at) WHERE state = 'succeeded';
CREATE INDEX operations_expiring ON operations (expires_at) WHERE expires_at IS NOT NULL;

-- The legal-transition table of longrun-core's State::can_become, and the
-- finality of terminal operations, enforced by the schema itself.
CREATE FUNCTION operations_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state <> OLD.state AND NOT (
           (OLD.state = 'queued'  AND NEW.state IN ('running', 'failed', 'cancelled'))
        OR (OLD.state = 'running' AND NEW.state IN ('succeeded', 'failed', 'cancelled'))) THEN
        RAISE EXCEPTION 'illegal state transition';
    END IF;
    IF OLD.state IN ('succeeded', 'failed', 'cancelled') AND (
           NEW.version <> OLD.version OR NEW.state <> OLD.state
        OR NEW.result IS DISTINCT FROM OLD.result OR NEW.error_code IS DISTINCT FROM OLD.error_code) THEN
        RAISE EXCEPTION 'terminal operation is final';
    END IF;
    IF NEW.version NOT IN (OLD.version, OLD.version + 1) THEN
        RAISE EXCEPTION 'version must increase by one per change';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER operations_guard BEFORE UPDATE ON operations FOR EACH ROW EXECUTE FUNCTION operations_guard();

CREATE TABLE idempotency_keys (
    tenant        TEXT NOT NULL,
    kind          TEXT NOT NULL,
    key           TEXT NOT NULL,
    fingerprint   BYTEA NOT NULL CHECK (length(fingerprint) = 32),
    operation_id  TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    PRIMARY KEY (tenant, kind, key)
);
CREATE INDEX idempotency_by_operation ON idempotency_keys (operation_id);

CREATE TABLE operation_events (
    operation_id  TEXT NOT NULL,
    version       BIGINT NOT NULL,
    type          TEXT NOT NULL,
    state         TEXT NOT NULL,
    at            BIGINT NOT NULL,
    data          TEXT NOT NULL DEFAULT '{}',
    snapshot      TEXT,
    PRIMARY KEY (operation_id, version)
);

CREATE TABLE tasks (
    operation_id      TEXT PRIMARY KEY,
    seq               BIGINT NOT NULL,
    tenant            TEXT NOT NULL,
    kind              TEXT NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('ready', 'leased')),
    available_at      BIGINT NOT NULL,
    lease_token       TEXT,
    lease_expires_at  BIGINT,
    worker_id         TEXT,
    lease_ms          BIGINT,
    CHECK ((status = 'leased') = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL))
);
CREATE INDEX tasks_ready ON tasks (kind, seq) WHERE status = 'ready';
CREATE INDEX tasks_leased ON tasks (lease_expires_at) WHERE status = 'leased';
CREATE INDEX tasks_ready_by_tenant ON tasks (tenant, kind, seq) WHERE status = 'ready';
CREATE INDEX tasks_leased_by_tenant ON tasks (tenant) WHERE status = 'leased';
CREATE INDEX tasks_by_tenant ON tasks (tenant);

CREATE TABLE tenant_dispatch (tenant TEXT PRIMARY KEY, last_claimed BIGINT NOT NULL);
CREATE SEQUENCE tenant_dispatch_order;

CREATE TABLE server_secrets (name TEXT PRIMARY KEY, value BYTEA NOT NULL, created_at BIGINT NOT NULL);

CREATE TABLE webhook_deliveries (
    event_id         TEXT PRIMARY KEY,
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
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_by_operation ON webhook_deliveries (operation_id);
CREATE INDEX webhook_deliveries_finished ON webhook_deliveries (created_at) WHERE status <> 'pending';

CREATE TABLE webhook_attempts (
    event_id         TEXT NOT NULL,
    attempt          BIGINT NOT NULL,
    operation_id     TEXT NOT NULL,
    type             TEXT NOT NULL,
    at               BIGINT NOT NULL,
    status_code      INTEGER,
    error            TEXT,
    next_attempt_at  BIGINT,
    PRIMARY KEY (event_id, attempt)
);
CREATE INDEX webhook_attempts_by_operation ON webhook_attempts (operation_id, at);

CREATE TABLE webhook_secrets (
    tenant      TEXT NOT NULL,
    secret      TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    retired_at  BIGINT,
    PRIMARY KEY (tenant, secret)
);

CREATE TABLE results (
    id            TEXT PRIMARY KEY,
    operation_id  TEXT NOT NULL,
    tenant        TEXT NOT NULL,
    storage_key   TEXT NOT NULL UNIQUE,
    content_type  TEXT NOT NULL,
    size_bytes    BIGINT NOT NULL CHECK (size_bytes >= 0),
    sha256        TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('uploaded', 'published', 'expired')),
    lease_token   TEXT,
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT,
    CHECK (state = 'uploaded' OR expires_at IS NOT NULL)
);
CREATE INDEX results_by_operation ON results (operation_id);
CREATE INDEX results_expiring ON results (expires_at) WHERE state = 'published';

CREATE TABLE artifact_garbage (storage_key TEXT PRIMARY KEY, created_at BIGINT NOT NULL);

CREATE TABLE tombstones (
    operation_id  TEXT PRIMARY KEY,
    tenant        TEXT NOT NULL,
    removed_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL
);
CREATE INDEX tombstones_expiring ON tombstones (expires_at);

CREATE TABLE accept_pauses (scope TEXT PRIMARY KEY);
