-- counts: dead letters last failed at or after $1 by class and by code, the codes first seen
-- since then with that time, and the deferred and in-flight records of the window. One round
-- trip; the counts by status read the index `records_by_status` alone.
SELECT 'class' AS kind, class AS name, count(*) AS n
FROM {schema}.records WHERE status = 'dead' AND last_failed_at_ms >= $1 GROUP BY class
UNION ALL
SELECT 'code', code, count(*)
FROM {schema}.records WHERE status = 'dead' AND last_failed_at_ms >= $1 GROUP BY code
UNION ALL
SELECT 'new', code, first_seen_ms FROM {schema}.codes WHERE first_seen_ms >= $1
UNION ALL
SELECT 'waiting', '', count(*)
FROM {schema}.records WHERE status IN ('deferred', 'in_flight') AND last_failed_at_ms >= $1
