-- The right to append to an upload, held by one request on any node at a
-- time (as PostgreSQL's schema 13): a `HEAD` or `PATCH` that arrives while
-- another request appends waits for it, wherever it runs, so the offset it
-- answers or checks includes what that request keeps.
ALTER TABLE uploads ADD COLUMN appending_token TEXT;
ALTER TABLE uploads ADD COLUMN appending_until INTEGER;
