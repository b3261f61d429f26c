-- Schema version 13: the right to append to an upload, held by one request
-- on any node at a time (`appending_token` until `appending_until`, renewed
-- while the body streams): a `HEAD` or `PATCH` through another node waits
-- for it, so the offset it answers or checks includes what that request
-- keeps.
ALTER TABLE uploads ADD COLUMN appending_token TEXT;
ALTER TABLE uploads ADD COLUMN appending_until BIGINT;
