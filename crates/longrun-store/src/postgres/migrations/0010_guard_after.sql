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
--
-- The trigger is made again from its own definition, its WHEN (0006's
-- refusal rule) kept as it is, only its timing changed.
DO $$
DECLARE
    definition TEXT;
BEGIN
    SELECT pg_get_triggerdef(oid) INTO STRICT definition
      FROM pg_trigger WHERE tgrelid = 'operations'::regclass AND tgname = 'operations_guard';
    IF position('BEFORE UPDATE' IN definition) = 0 THEN
        RAISE EXCEPTION 'operations_guard is not the BEFORE UPDATE trigger of schema 6: %', definition;
    END IF;
    DROP TRIGGER operations_guard ON operations;
    EXECUTE replace(definition, 'BEFORE UPDATE', 'AFTER UPDATE');
END $$;
