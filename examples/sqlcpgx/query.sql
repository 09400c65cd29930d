-- name: GetQuantity :one
SELECT quantity FROM sqlcpgx_stock WHERE sku = $1;

-- name: SetQuantity :exec
UPDATE sqlcpgx_stock SET quantity = $2 WHERE sku = $1;

-- name: AddReservation :exec
INSERT INTO sqlcpgx_reservations (sku, order_id, quantity, via) VALUES ($1, $2, $3, $4);

-- name: Reserved :one
SELECT coalesce(sum(quantity), 0)::bigint AS reserved, count(*) AS reservations
FROM sqlcpgx_reservations WHERE sku = $1;
