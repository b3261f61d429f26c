-- Uploads (inputs streamed before a submission names them) and named
-- result artifacts.
--
-- An upload is a list of stored pieces while it is being written (each
-- request's body is one piece, so a cut request keeps what arrived), one
-- object once complete. It lives until `expires_at`, and beyond while an
-- operation names it (`operation_uploads`, written in the submission's
-- transaction); retention then removes it through `artifact_garbage`.
CREATE TABLE uploads (
    id               TEXT PRIMARY KEY,
    tenant           TEXT NOT NULL,
    content_type     TEXT NOT NULL,
    upload_offset    INTEGER NOT NULL CHECK (upload_offset >= 0),
    complete         INTEGER NOT NULL CHECK (complete IN (0, 1)),
    sha256           TEXT,
    expected_sha256  TEXT,
    -- JSON: [{"storage_key", "size_bytes"}, ...] in order.
    chunks           TEXT NOT NULL,
    created_at       INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL
) STRICT;
CREATE INDEX uploads_expiring ON uploads (expires_at);
CREATE INDEX uploads_by_tenant ON uploads (tenant);

CREATE TABLE operation_uploads (
    operation_id  TEXT NOT NULL,
    upload_id     TEXT NOT NULL,
    PRIMARY KEY (operation_id, upload_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX operation_uploads_by_upload ON operation_uploads (upload_id);

ALTER TABLE results ADD COLUMN name TEXT NOT NULL DEFAULT 'default';
