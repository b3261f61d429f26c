-- Schema version 10: the guard of operations' transitions (0006) runs after
-- each update instead of before it.
--
-- A BEFORE ROW trigger makes PostgreSQL fetch and lock each row it is about
-- to update (GetTupleForTrigger) before evaluating the WHEN clause: one
-- more WAL record (a LOCK) and one more lock for every operation a claim
-- starts or an outcome ends (pg_waldump of a claim of 200: 400 LOCK records
-- on operations with it BEFORE, 199 AFTER). An AFTER ROW trigger's WHEN is
-- evaluated on the old and new rows as the update is made, and only a
-- change it matches (an illegal one) queues the function, which raises at
-- the end of the statement: the statement, and its transaction, still fail.
-- scripts/drain, four alternating pairs: 13.1-16.6 k (median 14.1 k) ->
-- 14.8-15.3 k (median 15.0 k) jobs/s; WAL records a job, accept to end,
-- 37-38 -> 35.
DROP TRIGGER operations_guard ON operations;
CREATE TRIGGER operations_guard AFTER UPDATE ON operations FOR EACH ROW
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
