-- tower-backstop's Postgres dead-letter store, schema version 2: the fleet's notes.
--
-- Applied as version 1 is (one transaction under the store's advisory lock, `search_path` set
-- to the store's schema). Times are milliseconds since the Unix epoch (bigint).

-- One note per topic and author (`Store::put_note`): a newer one replaces the older. Readers
-- skip the expired ones, and each write deletes a few of them.
CREATE TABLE notes (
    topic         text COLLATE "C" NOT NULL,
    author        text COLLATE "C" NOT NULL,
    body          text NOT NULL,
    written_at_ms bigint NOT NULL,
    expires_at_ms bigint NOT NULL,
    PRIMARY KEY (topic, author)
);

-- The expired notes, for the writes that delete them.
CREATE INDEX notes_by_expiry ON notes (expires_at_ms);
