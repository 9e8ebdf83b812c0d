-- put_many: a batch of records, merged into the rows with their ids, in one statement.
-- $1..$23: one array per column (a record per index; ids unique, the batch folded before);
-- $24, $25: the code and last failure time of every record of the batch, in batch order (the
-- first sighting of each code); $26: the history limit.
-- put_claimed is the same statement for one record with the two placeholders below filled in:
-- only a row that exists is written, only while it is in flight with $27 resends (the claim's
-- token), and the row as written comes back. For put_many both are empty.
-- The merge is `Record::merge_bounded`: the newer record's fields win, attempts and budget add
-- up (capped at 2^32 - 1), the first failure time stays, resends take the larger, tags unite
-- (newer values win), the histories concatenate and keep the last $26, the cause and breaker
-- stay when the newer record has none. Rows are written in id order, so two batches that share
-- ids lock them in the same order.
WITH noted AS (
    INSERT INTO {schema}.codes (code, first_seen_ms)
    SELECT DISTINCT ON (c.code) c.code, c.first_seen_ms
    FROM unnest($24::text[], $25::int8[]) WITH ORDINALITY AS c (code, first_seen_ms, n)
    ORDER BY c.code, c.n
    ON CONFLICT (code) DO NOTHING
)
INSERT INTO {schema}.records AS r (
    id, class, code, message, attempts, budget_spent, first_failed_at_ms, last_failed_at_ms,
    retry_at_ms, status, resends, resolved_at_ms, history, tags, payload, payload_truncated,
    payload_len, content_type, metadata, headers, redacted_headers, cause, breaker
)
SELECT b.id, b.class, b.code, b.message, b.attempts, b.budget_spent, b.first_failed_at_ms,
       b.last_failed_at_ms, b.retry_at_ms, b.status, b.resends, b.resolved_at_ms,
       b.history::json, b.tags::jsonb, b.payload, b.payload_truncated, b.payload_len,
       b.content_type, b.metadata::jsonb, b.headers::json, b.redacted_headers::json,
       b.cause::json, b.breaker
FROM unnest(
    $1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::int8[], $7::int8[],
    $8::int8[], $9::int8[], $10::text[], $11::int8[], $12::int8[], $13::text[], $14::text[],
    $15::bytea[], $16::bool[], $17::int8[], $18::text[], $19::text[], $20::text[], $21::text[],
    $22::text[], $23::text[]
) AS b (
    id, class, code, message, attempts, budget_spent, first_failed_at_ms, last_failed_at_ms,
    retry_at_ms, status, resends, resolved_at_ms, history, tags, payload, payload_truncated,
    payload_len, content_type, metadata, headers, redacted_headers, cause, breaker
)
{existing}
ORDER BY b.id
ON CONFLICT (id) DO UPDATE SET
    class = EXCLUDED.class,
    code = EXCLUDED.code,
    message = EXCLUDED.message,
    attempts = least(r.attempts + EXCLUDED.attempts, 4294967295),
    budget_spent = least(r.budget_spent + EXCLUDED.budget_spent, 4294967295),
    first_failed_at_ms = least(r.first_failed_at_ms, EXCLUDED.first_failed_at_ms),
    last_failed_at_ms = EXCLUDED.last_failed_at_ms,
    retry_at_ms = EXCLUDED.retry_at_ms,
    status = EXCLUDED.status,
    resends = greatest(r.resends, EXCLUDED.resends),
    resolved_at_ms = EXCLUDED.resolved_at_ms,
    history = (
        SELECT coalesce(json_agg(h.e ORDER BY h.n), '[]'::json)
        FROM (
            SELECT o.e, o.n FROM json_array_elements(r.history) WITH ORDINALITY AS o (e, n)
            UNION ALL
            SELECT x.e, x.n + json_array_length(r.history)
            FROM json_array_elements(EXCLUDED.history) WITH ORDINALITY AS x (e, n)
        ) AS h
        WHERE h.n > json_array_length(r.history) + json_array_length(EXCLUDED.history) - $26
    ),
    tags = r.tags || EXCLUDED.tags,
    payload = EXCLUDED.payload,
    payload_truncated = EXCLUDED.payload_truncated,
    payload_len = EXCLUDED.payload_len,
    content_type = EXCLUDED.content_type,
    metadata = EXCLUDED.metadata,
    headers = EXCLUDED.headers,
    redacted_headers = EXCLUDED.redacted_headers,
    cause = coalesce(EXCLUDED.cause, r.cause),
    breaker = coalesce(EXCLUDED.breaker, r.breaker)
{claimed}
