-- The example's tables. main.go creates them with this text (embedded),
-- and sqlc reads it to type the queries.
CREATE TABLE sqlcpgx_stock (
    sku text PRIMARY KEY,
    quantity bigint NOT NULL
);

CREATE TABLE sqlcpgx_reservations (
    id bigserial PRIMARY KEY,
    sku text NOT NULL REFERENCES sqlcpgx_stock (sku),
    order_id text NOT NULL,
    quantity bigint NOT NULL,
    via text NOT NULL
);
