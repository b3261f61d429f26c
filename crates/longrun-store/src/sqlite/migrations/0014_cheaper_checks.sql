-- The same rules on operations, in a form SQLite runs cheaply on every
-- update of the job path.
--
-- A list of more than two constants after IN (`state IN ('queued',
-- 'running', 'paused')`) is evaluated through an ephemeral table that
-- SQLite builds, fills and drops each time the statement or trigger runs;
-- a profile of the in-process drain put ~8 % of the writer thread in
-- opening and closing those. The same tests written as comparisons are
-- plain opcodes. And a trigger that may RAISE(ABORT) makes every UPDATE of
-- operations open a statement journal, in case it must undo the rows the
-- statement already changed; RAISE(FAIL) refuses the change the same way
-- without one. Nothing is lost by FAIL: a store write that errs is rolled
-- back whole, with its transaction or its savepoint (sqlite/writer.rs).
--
-- The CHECKs keep their meaning exactly and are changed in place in the
-- schema (as 0010 did); the store reloads the schema after migrating.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(
                replace(sql,
                    'CHECK (state IN (''queued'', ''running'', ''succeeded'', ''failed'', ''cancelled'', ''paused''))',
                    'CHECK (state = ''queued'' OR state = ''running'' OR state = ''succeeded'' OR state = ''failed''
                                         OR state = ''cancelled'' OR state = ''paused'')'),
                'OR state IN (''succeeded'', ''failed'', ''cancelled'', ''paused''))',
                'OR state NOT IN (''queued'', ''running''))')
 WHERE type = 'table' AND name = 'operations';
PRAGMA writable_schema = OFF;

DROP TRIGGER operations_legal_transition;
CREATE TRIGGER operations_legal_transition
BEFORE UPDATE OF state ON operations
WHEN NEW.state <> OLD.state AND NOT (
       (OLD.state = 'queued'  AND (NEW.state = 'running' OR NEW.state = 'failed' OR NEW.state = 'cancelled'
                                   OR NEW.state = 'paused'))
    OR (OLD.state = 'running' AND (NEW.state = 'succeeded' OR NEW.state = 'failed' OR NEW.state = 'cancelled'
                                   OR NEW.state = 'paused'))
    OR (OLD.state = 'paused'  AND (NEW.state = 'queued' OR NEW.state = 'cancelled'))
)
BEGIN
    SELECT RAISE(FAIL, 'illegal state transition');
END;

DROP TRIGGER operations_terminal_is_final;
CREATE TRIGGER operations_terminal_is_final
BEFORE UPDATE ON operations
WHEN (OLD.state = 'succeeded' OR OLD.state = 'failed' OR OLD.state = 'cancelled') AND (
       NEW.version <> OLD.version OR NEW.state <> OLD.state
    OR NEW.result IS NOT OLD.result OR NEW.error_code IS NOT OLD.error_code
)
BEGIN
    SELECT RAISE(FAIL, 'terminal operation is final');
END;

DROP TRIGGER operations_version_steps;
CREATE TRIGGER operations_version_steps
BEFORE UPDATE OF version ON operations
WHEN NEW.version <> OLD.version AND NEW.version <> OLD.version + 1
BEGIN
    SELECT RAISE(FAIL, 'version must increase by one per change');
END;
