-- tower-backstop's Postgres dead-letter store, schema version 1.
--
-- Applied by `PostgresStore` when it opens, inside one transaction that holds the store's
-- advisory lock, with `search_path` set to the store's schema: the names below are that
-- schema's. Times are milliseconds since the Unix epoch (bigint), as every store keeps them.
-- Counts (attempts, resends) are bigint holding an unsigned 32-bit value.

-- One row per dead letter, whatever its status.
CREATE TABLE records (
    id                 text COLLATE "C" PRIMARY KEY,
    class              text COLLATE "C" NOT NULL,
    code               text COLLATE "C" NOT NULL,
    message            text NOT NULL,
    attempts           bigint NOT NULL,
    budget_spent       bigint NOT NULL,
    first_failed_at_ms bigint NOT NULL,
    last_failed_at_ms  bigint NOT NULL,
    retry_at_ms        bigint,
    status             text NOT NULL
        CHECK (status IN ('dead', 'deferred', 'in_flight', 'resolved')),
    resends            bigint NOT NULL,
    resolved_at_ms     bigint,
    -- The last errors, oldest first: a JSON array (json, not jsonb: it keeps any text exactly).
    history            json NOT NULL,
    -- Tags and metadata: JSON objects of text, searchable by containment.
    tags               jsonb NOT NULL,
    payload            bytea NOT NULL,
    payload_truncated  boolean NOT NULL,
    payload_len        bigint NOT NULL,
    content_type       text,
    metadata           jsonb NOT NULL,
    headers            json NOT NULL,
    redacted_headers   json NOT NULL,
    cause              json,
    breaker            text
);

-- The claim: only the deferred and in-flight rows, by due time then id. Dead and resolved rows
-- are not in this index, so a claim never reads them, however many there are.
CREATE INDEX records_due ON records (retry_at_ms, id)
    WHERE status IN ('deferred', 'in_flight');

-- Searches and pages, newest first, ties by id: all records, one class, one code.
CREATE INDEX records_by_time ON records (last_failed_at_ms DESC, id);
CREATE INDEX records_by_class ON records (class, last_failed_at_ms DESC, id);
CREATE INDEX records_by_code ON records (code, last_failed_at_ms DESC, id);

-- One status over a window: the counts of dead letters by class and code (read from the index
-- alone), the board's lists by status, and retention (the oldest dead or resolved first).
CREATE INDEX records_by_status ON records (status, last_failed_at_ms DESC, id)
    INCLUDE (class, code);

-- Tags: `tags @> '{"campaign": "spring"}'`.
CREATE INDEX records_by_tags ON records USING gin (tags jsonb_path_ops);

-- Each code's first sighting: the "new code" alert.
CREATE TABLE codes (
    code          text COLLATE "C" PRIMARY KEY,
    first_seen_ms bigint NOT NULL
);

-- The audit trail of re-drives, purges and prunes, in the order they were written.
CREATE TABLE audit (
    seq     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at_ms   bigint NOT NULL,
    actor   text NOT NULL,
    action  text NOT NULL,
    filter  text NOT NULL,
    planned bigint,
    sent    bigint NOT NULL,
    outcome text NOT NULL
);
