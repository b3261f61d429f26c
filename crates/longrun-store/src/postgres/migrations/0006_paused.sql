-- Pausing (as SQLite's 0010_paused.sql): the state 'paused' and its
-- transitions, in the CHECK and in both halves of the guard (the trigger's
-- WHEN and the function that raises).
ALTER TABLE operations DROP CONSTRAINT operations_state_check;
ALTER TABLE operations ADD CONSTRAINT operations_state_check
    CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'paused'));

CREATE OR REPLACE FUNCTION operations_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state <> OLD.state AND NOT (
           (OLD.state = 'queued'  AND NEW.state IN ('running', 'failed', 'cancelled', 'paused'))
        OR (OLD.state = 'running' AND NEW.state IN ('succeeded', 'failed', 'cancelled', 'paused'))
        OR (OLD.state = 'paused'  AND NEW.state IN ('queued', 'cancelled'))) THEN
        RAISE EXCEPTION 'illegal state transition';
    END IF;
    IF OLD.state IN ('succeeded', 'failed', 'cancelled') AND (
           NEW.version <> OLD.version OR NEW.state <> OLD.state
        OR NEW.result IS DISTINCT FROM OLD.result OR NEW.error_code IS DISTINCT FROM OLD.error_code) THEN
        RAISE EXCEPTION 'terminal operation is final';
    END IF;
    IF NEW.version NOT IN (OLD.version, OLD.version + 1) THEN
        RAISE EXCEPTION 'version must increase by one per change';
    END IF;
    RETURN NEW;
END $$;

DROP TRIGGER operations_guard ON operations;
CREATE TRIGGER operations_guard BEFORE UPDATE ON operations FOR EACH ROW
    WHEN (
           (NEW.state <> OLD.state AND NOT (
                  (OLD.state = 'queued'  AND NEW.state IN ('running', 'failed', 'cancelled', 'paused'))
               OR (OLD.state = 'running' AND NEW.state IN ('succeeded', 'failed', 'cancelled', 'paused'))
               OR (OLD.state = 'paused'  AND NEW.state IN ('queued', 'cancelled'))))
        OR (OLD.state IN ('succeeded', 'failed', 'cancelled') AND (
                  NEW.version <> OLD.version OR NEW.state <> OLD.state
               OR NEW.result IS DISTINCT FROM OLD.result OR NEW.error_code IS DISTINCT FROM OLD.error_code))
        OR NEW.version NOT IN (OLD.version, OLD.version + 1))
    EXECUTE FUNCTION operations_guard();
