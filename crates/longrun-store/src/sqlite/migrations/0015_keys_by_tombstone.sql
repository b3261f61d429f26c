-- An idempotency record is found from its operation's tombstone, not
-- through an index on its operation id (as PostgreSQL's schema 12).
--
-- `idempotency_by_operation` took one more B-tree insert on every keyed
-- submission for one reader: the burial of a tombstone, which deletes the
-- record of the removed operation. Under 32 clients' single submissions it
-- was 2.7 of the ~47 WAL frames each group commit wrote. The tombstone now
-- keeps the record's key (the operation's kind and idempotency key, copied
-- when retention removes the operation), and the burial deletes by the
-- primary key; the tombstones that exist are given theirs here, through
-- the index, before it goes.
ALTER TABLE tombstones ADD COLUMN kind TEXT;
ALTER TABLE tombstones ADD COLUMN idempotency_key TEXT;
UPDATE tombstones
   SET (kind, idempotency_key) = (SELECT k.kind, k.key FROM idempotency_keys k
                                   WHERE k.operation_id = tombstones.operation_id AND k.tenant = tombstones.tenant);
DROP INDEX idempotency_by_operation;
