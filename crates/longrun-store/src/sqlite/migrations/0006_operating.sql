-- Operating: pauses of acceptance (`longrun admin pause-accepting`), global
-- (`*`) or per kind.
CREATE TABLE accept_pauses (
    scope  TEXT PRIMARY KEY
) STRICT;
