-- Events are appended, not inserted among an operation's earlier ones.
--
-- Keyed by (operation_id, version), every new event landed on the page
-- holding that operation's history: a random page of the newest second's
-- ids, usually full, so most inserts split it. Claiming and finishing a
-- batch of 50 jobs wrote ~150 event pages to the WAL, most of the job
-- path's log (measured: ~6–9 WAL frames per job). Now the table is in
-- insertion order (new rows fill its last page) and the index that finds an
-- operation's history is keyed by the operation's `seq`, which follows
-- submission order, so the events of one claimed or finished batch share a
-- few pages of each. Events of operations that no longer exist (none should)
-- are not carried over: nothing can read them.
CREATE TABLE operation_events_appended (
    op_seq    INTEGER NOT NULL,  -- operations.seq (AUTOINCREMENT: never reused)
    version   INTEGER NOT NULL,
    type      TEXT NOT NULL,
    state     TEXT NOT NULL,
    at        INTEGER NOT NULL,
    data      TEXT NOT NULL DEFAULT '{}',
    snapshot  TEXT
) STRICT;

INSERT INTO operation_events_appended (op_seq, version, type, state, at, data, snapshot)
SELECT o.seq, e.version, e.type, e.state, e.at, e.data, e.snapshot
  FROM operation_events e JOIN operations o ON o.id = e.operation_id
 ORDER BY e.at, o.seq, e.version;

DROP TABLE operation_events;
ALTER TABLE operation_events_appended RENAME TO operation_events;
CREATE UNIQUE INDEX operation_events_by_operation ON operation_events (op_seq, version);
