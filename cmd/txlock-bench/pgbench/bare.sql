-- A bare blocking lock: what the benchmark's pg-blocking sends.
BEGIN;
SELECT pg_catalog.pg_advisory_xact_lock(:client_id);
COMMIT;
