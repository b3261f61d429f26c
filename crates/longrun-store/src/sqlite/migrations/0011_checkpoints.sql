-- Pausing running work and resuming from checkpoints: which kinds may be
-- paused while a worker holds them, the last checkpoint a worker saved
-- (kept with the operation, so a resumed, retried or re-run attempt starts
-- there), and a pause asked of running work that its worker has not
-- answered yet.
ALTER TABLE kinds ADD COLUMN pausable INTEGER NOT NULL DEFAULT 0;
ALTER TABLE operations ADD COLUMN checkpoint TEXT;
ALTER TABLE operations ADD COLUMN pause_requested_at INTEGER;

-- Resumable artifacts: the stored pieces of an artifact a task writes in
-- parts (an export resuming at its last checkpointed row appends to it),
-- kept across attempts and pauses, joined into one result when the task
-- completes it. A `from_checkpoint` re-run copies its original's rows (the
-- objects are shared: one becomes garbage only when no row names it).
CREATE TABLE artifact_pieces (
    operation_id  TEXT NOT NULL,
    name          TEXT NOT NULL,
    piece_offset  INTEGER NOT NULL CHECK (piece_offset >= 0),
    storage_key   TEXT NOT NULL,
    size_bytes    INTEGER NOT NULL CHECK (size_bytes >= 0),
    PRIMARY KEY (operation_id, name, piece_offset)
) STRICT;
CREATE INDEX artifact_pieces_by_key ON artifact_pieces (storage_key);
