-- Longrun schema, SQLite. Timestamps are INTEGER milliseconds since the epoch (UTC).

CREATE TABLE tenants (
    name        TEXT PRIMARY KEY,
    created_at  INTEGER NOT NULL
) STRICT;

CREATE TABLE api_keys (
    id           TEXT PRIMARY KEY,
    tenant       TEXT NOT NULL REFERENCES tenants(name),
    role         TEXT NOT NULL CHECK (role IN ('client', 'worker', 'admin')),
    secret_hash  BLOB NOT NULL CHECK (length(secret_hash) = 32),
    created_at   INTEGER NOT NULL,
    revoked_at   INTEGER
) STRICT;

CREATE TABLE kinds (
    name                      TEXT PRIMARY KEY,
    builtin                   INTEGER NOT NULL CHECK (builtin IN (0, 1)),
    rerun_safe                INTEGER NOT NULL CHECK (rerun_safe IN (0, 1)),
    max_attempts              INTEGER NOT NULL CHECK (max_attempts >= 1),
    default_deadline_seconds  INTEGER,
    max_deadline_seconds      INTEGER
) STRICT;

CREATE TABLE operations (
    -- Internal order for "newest first" listing; never shown.
    seq                  INTEGER PRIMARY KEY AUTOINCREMENT,
    id                   TEXT NOT NULL UNIQUE,
    tenant               TEXT NOT NULL,
    kind                 TEXT NOT NULL,
    state                TEXT NOT NULL CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    version              INTEGER NOT NULL CHECK (version >= 1),
    attempt              INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    input                TEXT,
    callback_url         TEXT,
    deadline_at          INTEGER,
    budget_max_cost      REAL,
    cost_units           REAL NOT NULL DEFAULT 0,
    labels               TEXT NOT NULL DEFAULT '{}',
    progress             TEXT,
    result               TEXT,
    error_code           TEXT,
    error_message        TEXT,
    error_retryable      INTEGER,
    cancel_requested_at  INTEGER,
    cancel_requested_by  TEXT,
    cancel_reason        TEXT,
    cancellable          INTEGER NOT NULL DEFAULT 1 CHECK (cancellable IN (0, 1)),
    idempotency_key      TEXT,
    created_at           INTEGER NOT NULL,
    started_at           INTEGER,
    completed_at         INTEGER,
    updated_at           INTEGER NOT NULL,
    expires_at           INTEGER,
    -- A result and an error never coexist, and only terminal operations carry them.
    CHECK (result IS NULL OR error_code IS NULL),
    CHECK ((result IS NULL AND error_code IS NULL) OR state IN ('succeeded', 'failed', 'cancelled'))
) STRICT;

CREATE INDEX operations_by_tenant ON operations (tenant, seq);
CREATE INDEX operations_by_tenant_state ON operations (tenant, state, seq);
CREATE INDEX operations_by_tenant_kind ON operations (tenant, kind, seq);

-- The legal-transition table of longrun-core's State::can_become, enforced by
-- the schema itself so that no query can apply an illegal change.
CREATE TRIGGER operations_legal_transition
BEFORE UPDATE OF state ON operations
WHEN NEW.state <> OLD.state AND NOT (
       (OLD.state = 'queued'  AND NEW.state IN ('running', 'failed', 'cancelled'))
    OR (OLD.state = 'running' AND NEW.state IN ('succeeded', 'failed', 'cancelled'))
)
BEGIN
    SELECT RAISE(ABORT, 'illegal state transition');
END;

-- Terminal operations are final: their version, state, result and error never change.
CREATE TRIGGER operations_terminal_is_final
BEFORE UPDATE ON operations
WHEN OLD.state IN ('succeeded', 'failed', 'cancelled') AND (
       NEW.version <> OLD.version OR NEW.state <> OLD.state
    OR NEW.result IS NOT OLD.result OR NEW.error_code IS NOT OLD.error_code
)
BEGIN
    SELECT RAISE(ABORT, 'terminal operation is final');
END;

-- Versions only move forward, one step per change.
CREATE TRIGGER operations_version_steps
BEFORE UPDATE OF version ON operations
WHEN NEW.version NOT IN (OLD.version, OLD.version + 1)
BEGIN
    SELECT RAISE(ABORT, 'version must increase by one per change');
END;

-- Scope is tenant + kind + key; the primary key is where concurrent first
-- requests converge.
CREATE TABLE idempotency_keys (
    tenant        TEXT NOT NULL,
    kind          TEXT NOT NULL,
    key           TEXT NOT NULL,
    fingerprint   BLOB NOT NULL CHECK (length(fingerprint) = 32),
    operation_id  TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    PRIMARY KEY (tenant, kind, key)
) STRICT, WITHOUT ROWID;

CREATE TABLE operation_events (
    operation_id  TEXT NOT NULL,
    version       INTEGER NOT NULL,
    type          TEXT NOT NULL,
    state         TEXT NOT NULL,
    at            INTEGER NOT NULL,
    data          TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (operation_id, version)
) STRICT, WITHOUT ROWID;

-- The dispatch record: one row per operation that still needs a worker.
-- Rows leave when the operation ends, so claims never scan finished work.
CREATE TABLE tasks (
    operation_id      TEXT PRIMARY KEY,
    seq               INTEGER NOT NULL,
    tenant            TEXT NOT NULL,
    kind              TEXT NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('ready', 'leased')),
    available_at      INTEGER NOT NULL,
    lease_token       TEXT,
    lease_expires_at  INTEGER,
    worker_id         TEXT,
    CHECK ((status = 'leased') = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL))
) STRICT;

CREATE INDEX tasks_ready ON tasks (kind, seq) WHERE status = 'ready';
CREATE INDEX tasks_leased ON tasks (lease_expires_at) WHERE status = 'leased';

-- Server-wide secrets (the idempotency fingerprint key), shared by every
-- process on this database. Created once, never printed.
CREATE TABLE server_secrets (
    name        TEXT PRIMARY KEY,
    value       BLOB NOT NULL,
    created_at  INTEGER NOT NULL
) STRICT;
