-- The smallest quiet window: a DO block whose handler catches lock_timeout, without
-- the standby and isolation refusals, the lock_timeout restore or the outcome.
BEGIN;
DO $txlock$BEGIN PERFORM pg_catalog.pg_advisory_xact_lock(:client_id::bigint); EXCEPTION WHEN lock_not_available THEN NULL; END$txlock$;
COMMIT;
