-- The sequence txlock draws fencing tokens from (txlock.FenceToken, and a
-- txlock.Fencer whose Sequence is empty). Copy this statement into a
-- migration of your own tool (golang-migrate, goose, atlas, ...); it is
-- idempotent. CACHE 1 matters: a per-session cache would hand out tokens out
-- of order. Keep the name in step with Fencer{Schema, Sequence} if you
-- change it.
CREATE SEQUENCE IF NOT EXISTS txlock_fence_seq AS bigint CACHE 1 NO CYCLE;
