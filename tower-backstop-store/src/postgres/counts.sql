-- counts: dead letters last failed at or after $1 by class and by code (one pass, two grouping
-- sets), the codes first seen since then with that time, and the deferred and in-flight records
-- of the window. One round trip; the rows by status are read from the index `records_by_status`.
SELECT CASE WHEN grouping(class) = 0 THEN 'class' ELSE 'code' END AS kind,
       coalesce(class, code) AS name,
       count(*) AS n
FROM {schema}.records
WHERE status = 'dead' AND last_failed_at_ms >= $1
GROUP BY GROUPING SETS ((class), (code))
UNION ALL
SELECT 'new', code, first_seen_ms FROM {schema}.codes WHERE first_seen_ms >= $1
UNION ALL
SELECT 'waiting', '', count(*)
FROM {schema}.records WHERE status IN ('deferred', 'in_flight') AND last_failed_at_ms >= $1
