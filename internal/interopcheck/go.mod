module github.com/txlock/txlock/internal/interopcheck

go 1.26.0

require github.com/txlock/txlock v0.1.0

require (
	github.com/golang-migrate/migrate/v4 v4.20.1
	github.com/lib/pq v1.10.9 // indirect
)
