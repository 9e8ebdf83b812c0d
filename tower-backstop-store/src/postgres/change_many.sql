-- change_claimed_many: the changes of a batch under claims, in one statement; no record twice
-- in a batch. Each change applies only while its claim holds: the record still in flight
-- ($10) with the lease's token as its resends. One row per change: the columns of the record
-- as written when it changed (null otherwise), then its position in the batch, and the
-- record's status and resends as the statement found them (both null: no such record).
-- One element per change in each array: $1 ids; $2 statuses; $3 retry-ats (null: none);
-- $4 resends added (-1, 0, 1); $5 whether the attempt budget starts again; $6 resolved-ats
-- (null: unchanged); $7 metadata entries to add (JSON objects); $8 the leases' tokens;
-- $9 positions in the batch.
WITH batch AS (
    SELECT *
    FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::boolean[],
                $6::bigint[], $7::text[], $8::bigint[], $9::bigint[])
        AS b(b_id, b_status, b_retry_at, b_resends, b_reset, b_resolved_at, b_metadata, b_token,
             b_at)
), changed AS (
    UPDATE {schema}.records AS r
    SET status = b.b_status,
        retry_at_ms = b.b_retry_at,
        resends = greatest(least(r.resends + b.b_resends, 4294967295), 0),
        budget_spent = CASE WHEN b.b_reset THEN 0 ELSE r.budget_spent END,
        resolved_at_ms = coalesce(b.b_resolved_at, r.resolved_at_ms),
        metadata = r.metadata || b.b_metadata::jsonb
    FROM batch AS b
    WHERE r.id = b.b_id AND r.status = $10 AND r.resends = b.b_token
    RETURNING {returning}, b.b_at AS changed_at
)
SELECT changed.*, batch.b_at, cur.status AS now_status, cur.resends AS now_resends
FROM batch
LEFT JOIN changed ON changed.changed_at = batch.b_at
LEFT JOIN {schema}.records AS cur ON cur.id = batch.b_id
ORDER BY batch.b_at
