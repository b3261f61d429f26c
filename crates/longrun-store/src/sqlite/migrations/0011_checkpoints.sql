-- Pausing running work and resuming from checkpoints: which kinds may be
-- paused while a worker holds them, the last checkpoint a worker saved
-- (kept with the operation, so a resumed, retried or re-run attempt starts
-- there), and a pause asked of running work that its worker has not
-- answered yet.
ALTER TABLE kinds ADD COLUMN pausable INTEGER NOT NULL DEFAULT 0;
ALTER TABLE operations ADD COLUMN checkpoint TEXT;
ALTER TABLE operations ADD COLUMN pause_requested_at INTEGER;
