-- claim_due: up to $2 records due at $1 (deferred, or in flight with an expired lease), the
-- earliest retry-at first, claimed in one statement: status in_flight, retry-at $3 (the end of
-- the lease), one more resend. The due rows are read from the partial index `records_due` and
-- locked with SKIP LOCKED: a row another claimer holds is passed over, never waited for, and
-- never claimed twice. The claimed rows come back in due order.
WITH due AS (
    SELECT id, retry_at_ms
    FROM {schema}.records
    WHERE status IN ('deferred', 'in_flight') AND retry_at_ms <= $1
    ORDER BY retry_at_ms, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE {schema}.records AS r
    SET status = 'in_flight', retry_at_ms = $3, resends = least(r.resends + 1, 4294967295)
    FROM due
    WHERE r.id = due.id
    RETURNING due.retry_at_ms AS due_at, {returning}
)
SELECT {columns} FROM claimed ORDER BY due_at, id
