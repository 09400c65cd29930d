-- The keyspace registry (txlock.Registry with empty Schema and Table): one
-- row per keyspace namespace, with the name that owns it. A service calls
-- Registry.Register for each of its keyspaces at start-up, which fails if
-- another name already owns the namespace (two names whose 32-bit hashes
-- are equal would lock each other's keys); the txlock command's locks reads
-- it to show keyspace names. Optional: locking never reads it. Copy this
-- statement into a migration of your own tool; it is idempotent, and it is
-- the statement Registry.Create runs (Registry.DDL returns it). The CHECK
-- holds every row to txlock.NewKeyspace's hash. Keep the schema and name in
-- step with Registry{Schema, Table} if you change them.
CREATE TABLE IF NOT EXISTS "public"."txlock_keyspaces" (
    namespace integer PRIMARY KEY,
    name pg_catalog.text NOT NULL,
    registered_at timestamp with time zone NOT NULL DEFAULT pg_catalog.now(),
    last_registered_at timestamp with time zone NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT namespace_is_hash_of_name CHECK (namespace OPERATOR(pg_catalog.=) CAST(CAST('x' OPERATOR(pg_catalog.||)
        pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(name, 'UTF8')), 'hex'), 8) AS bit(32)) AS integer))
);
