-- As SQLite's 0011_checkpoints.sql: pausable kinds, the last checkpoint of
-- an operation, and a pause asked of running work not answered yet.
ALTER TABLE kinds ADD COLUMN pausable BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE operations ADD COLUMN checkpoint TEXT;
ALTER TABLE operations ADD COLUMN pause_requested_at BIGINT;

-- Resumable artifacts (as SQLite's 0011_checkpoints.sql).
CREATE TABLE artifact_pieces (
    operation_id  TEXT NOT NULL,
    name          TEXT NOT NULL,
    piece_offset  BIGINT NOT NULL CHECK (piece_offset >= 0),
    storage_key   TEXT NOT NULL,
    size_bytes    BIGINT NOT NULL CHECK (size_bytes >= 0),
    PRIMARY KEY (operation_id, name, piece_offset)
);
CREATE INDEX artifact_pieces_by_key ON artifact_pieces (storage_key);
