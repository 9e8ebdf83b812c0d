-- update and change_if_unchanged: one `Change` to the record $1, in one statement. With $8 not
-- null, compare-and-set: only if the record still has status $8 and $9 resends. The columns of
-- the record as written when it changed, and its status and resends now otherwise (both null:
-- no such record).
-- $2 status; $3 retry-at (null: none); $4 resends added (-1, 0, 1; kept within 0 and 2^32 - 1);
-- $5 whether the attempt budget starts again; $6 resolved-at (null: unchanged); $7 metadata
-- entries to add (a JSON object).
WITH changed AS (
    UPDATE {schema}.records
    SET status = $2,
        retry_at_ms = $3,
        resends = greatest(least(resends + $4, 4294967295), 0),
        budget_spent = CASE WHEN $5 THEN 0 ELSE budget_spent END,
        resolved_at_ms = coalesce($6, resolved_at_ms),
        metadata = metadata || $7::jsonb
    WHERE id = $1 AND ($8::text IS NULL OR (status = $8 AND resends = $9))
    RETURNING {columns}
), cur AS (
    SELECT status AS now_status, resends AS now_resends FROM {schema}.records WHERE id = $1
)
SELECT changed.*, cur.now_status, cur.now_resends
FROM (SELECT 1) AS one
LEFT JOIN changed ON true
LEFT JOIN cur ON true
