-- tower-backstop's Postgres dead-letter store, schema version 3: the counts.
--
-- Applied as version 1 is (one transaction under the store's advisory lock, `search_path` set
-- to the store's schema). `{schema}` is the store's schema, quoted: the function's statements
-- name their table in full, whatever the `search_path` of the session that writes.

-- How many records there are of each status, class and code, spread over 8 slots per key (a
-- record counts in the slot `hashtext(id) & 7`): the schedulers that finish their claims at
-- once each change the slot of their own record, not one row they would all wait on. A key's
-- count is the sum of its slots. Never below 0: a change that would take a slot there leaves
-- it at 0 (a drift that `check_counts` reports).
CREATE TABLE counts (
    status text COLLATE "C" NOT NULL,
    class  text COLLATE "C" NOT NULL,
    code   text COLLATE "C" NOT NULL,
    slot   smallint NOT NULL,
    n      bigint NOT NULL,
    PRIMARY KEY (status, class, code, slot)
);

-- Applies what one statement on `records` did to the counts, at the end of that statement (in
-- its transaction): one row of changes per key, the keys in order, so that two statements lock
-- the rows they share in the same order and never wait for each other in a cycle. A statement
-- that changes no status, class or code (a renewal) changes no count.
CREATE FUNCTION count_records() RETURNS trigger
LANGUAGE plpgsql AS $count$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {schema}.counts AS c (status, class, code, slot, n)
        SELECT status, class, code, (hashtext(id) & 7)::smallint, count(*)
        FROM new_rows GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
        ON CONFLICT (status, class, code, slot) DO UPDATE SET n = c.n + excluded.n;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO {schema}.counts AS c (status, class, code, slot, n)
        SELECT d.status, d.class, d.code, d.slot, d.n
        FROM (
            SELECT status, class, code, slot, sum(n) AS n
            FROM (
                SELECT status, class, code, (hashtext(id) & 7)::smallint AS slot, -1 AS n
                FROM old_rows
                UNION ALL
                SELECT status, class, code, (hashtext(id) & 7)::smallint, 1 FROM new_rows
            ) AS changes
            GROUP BY 1, 2, 3, 4
            HAVING sum(n) <> 0
        ) AS d
        WHERE d.n > 0 OR EXISTS (
            SELECT 1 FROM {schema}.counts AS x
            WHERE (x.status, x.class, x.code, x.slot) = (d.status, d.class, d.code, d.slot))
        ORDER BY 1, 2, 3, 4
        ON CONFLICT (status, class, code, slot) DO UPDATE SET n = greatest(c.n + excluded.n, 0);
    ELSE
        INSERT INTO {schema}.counts AS c (status, class, code, slot, n)
        SELECT d.status, d.class, d.code, d.slot, d.n
        FROM (
            SELECT status, class, code, (hashtext(id) & 7)::smallint AS slot, -count(*) AS n
            FROM old_rows GROUP BY 1, 2, 3, 4
        ) AS d
        WHERE EXISTS (
            SELECT 1 FROM {schema}.counts AS x
            WHERE (x.status, x.class, x.code, x.slot) = (d.status, d.class, d.code, d.slot))
        ORDER BY 1, 2, 3, 4
        ON CONFLICT (status, class, code, slot) DO UPDATE SET n = greatest(c.n + excluded.n, 0);
    END IF;
    RETURN NULL;
END
$count$;

-- Creating a trigger locks `records` against writes until the migration commits: no write
-- comes between the triggers and the fill below, and none is counted twice.
CREATE TRIGGER count_inserts AFTER INSERT ON records
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION count_records();
CREATE TRIGGER count_updates AFTER UPDATE ON records
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION count_records();
CREATE TRIGGER count_deletes AFTER DELETE ON records
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION count_records();

-- The records already there.
INSERT INTO counts (status, class, code, slot, n)
SELECT status, class, code, (hashtext(id) & 7)::smallint, count(*)
FROM records GROUP BY 1, 2, 3, 4;
