-- As SQLite's 0011_checkpoints.sql: pausable kinds, the last checkpoint of
-- an operation, and a pause asked of running work not answered yet.
ALTER TABLE kinds ADD COLUMN pausable BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE operations ADD COLUMN checkpoint TEXT;
ALTER TABLE operations ADD COLUMN pause_requested_at BIGINT;
