-- Linked re-runs: a re-run names the operation it re-runs. The partial index
-- holds re-runs only, so it costs ordinary submissions nothing.
ALTER TABLE operations ADD COLUMN rerun_of TEXT;
CREATE INDEX operations_reruns ON operations (rerun_of) WHERE rerun_of IS NOT NULL;
