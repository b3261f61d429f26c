-- Schema version 12: an idempotency record is found from its operation's
-- tombstone, not through an index on its operation id.
--
-- `idempotency_by_operation` took one more B-tree insert on every keyed
-- submission (8 index inserts a submission became 7) for one reader: the
-- burial of a tombstone, which deletes the record of the removed
-- operation. The tombstone now keeps the record's key (the operation's kind
-- and idempotency key, copied when retention removes the operation), and
-- the burial deletes by the primary key. Measured with 4 clients
-- submitting batches of 100: 34.2 k/s with the index, 35.4 k/s without.
ALTER TABLE tombstones ADD COLUMN kind TEXT, ADD COLUMN idempotency_key TEXT;
UPDATE tombstones t SET kind = k.kind, idempotency_key = k.key
  FROM idempotency_keys k
 WHERE k.operation_id = t.operation_id AND k.tenant = t.tenant;
DROP INDEX idempotency_by_operation;
