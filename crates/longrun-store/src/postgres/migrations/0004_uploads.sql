-- Uploads and named result artifacts (as SQLite's 0008_uploads.sql).
CREATE TABLE uploads (
    id               TEXT PRIMARY KEY,
    tenant           TEXT NOT NULL,
    content_type     TEXT NOT NULL,
    upload_offset    BIGINT NOT NULL CHECK (upload_offset >= 0),
    complete         BOOLEAN NOT NULL,
    sha256           TEXT,
    expected_sha256  TEXT,
    chunks           TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    expires_at       BIGINT NOT NULL
);
CREATE INDEX uploads_expiring ON uploads (expires_at);
CREATE INDEX uploads_by_tenant ON uploads (tenant);

CREATE TABLE operation_uploads (
    operation_id  TEXT NOT NULL,
    upload_id     TEXT NOT NULL,
    PRIMARY KEY (operation_id, upload_id)
);
CREATE INDEX operation_uploads_by_upload ON operation_uploads (upload_id);

ALTER TABLE results ADD COLUMN name TEXT NOT NULL DEFAULT 'default';
