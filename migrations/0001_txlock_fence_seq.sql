-- The sequence txlock draws fencing tokens from (txlock.FenceToken, and a
-- txlock.Fencer whose Schema and Sequence are empty). Copy this statement
-- into a migration of your own tool (golang-migrate, goose, atlas, ...); it
-- is idempotent. CACHE 1 matters: a per-session cache would hand out tokens
-- out of order. The name is schema-qualified because txlock names it so:
-- it never looks the sequence up through the search_path. Keep the schema
-- and name in step with Fencer{Schema, Sequence} if you change them.
CREATE SEQUENCE IF NOT EXISTS public.txlock_fence_seq AS bigint CACHE 1 NO CYCLE;
