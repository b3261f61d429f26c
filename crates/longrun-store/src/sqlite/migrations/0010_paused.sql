-- Pausing: the non-terminal state 'paused' (queued | running → paused,
-- paused → queued | cancelled).
--
-- The CHECK on operations.state only gains a value, which every stored row
-- already satisfies, so it is changed in place in the schema — the
-- procedure SQLite documents for loosening a constraint — instead of
-- copying the table. The store reloads the schema after migrating
-- (`PRAGMA writable_schema = RESET`); other connections see the schema
-- cookie move with the trigger below.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(sql, '''failed'', ''cancelled''))', '''failed'', ''cancelled'', ''paused''))')
 WHERE type = 'table' AND name = 'operations';
PRAGMA writable_schema = OFF;

DROP TRIGGER operations_legal_transition;
CREATE TRIGGER operations_legal_transition
BEFORE UPDATE OF state ON operations
WHEN NEW.state <> OLD.state AND NOT (
       (OLD.state = 'queued'  AND NEW.state IN ('running', 'failed', 'cancelled', 'paused'))
    OR (OLD.state = 'running' AND NEW.state IN ('succeeded', 'failed', 'cancelled', 'paused'))
    OR (OLD.state = 'paused'  AND NEW.state IN ('queued', 'cancelled'))
)
BEGIN
    SELECT RAISE(ABORT, 'illegal state transition');
END;
