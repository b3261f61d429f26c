-- The console's sign-in sessions: the SHA-256 of the cookie's token (the
-- token itself is never stored) and the key the session was opened with, so
-- revoking the key ends its sessions too.
CREATE TABLE console_sessions (
    token_hash  BYTEA PRIMARY KEY CHECK (length(token_hash) = 32),
    key_id      TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);
CREATE INDEX console_sessions_expiring ON console_sessions (expires_at);

-- How long each webhook attempt took, for the delivery log.
ALTER TABLE webhook_attempts ADD COLUMN latency_ms BIGINT;

-- The enforcer's search for pauses not honoured within the grace: by the
-- few running operations asked to pause, not by every stored one (it read
-- the whole table each round).
CREATE INDEX operations_pause_asked ON operations (pause_requested_at)
    WHERE state = 'running' AND pause_requested_at IS NOT NULL;

-- How many times a key's operation was answered as a replay.
ALTER TABLE idempotency_keys ADD COLUMN replays BIGINT NOT NULL DEFAULT 0;
