module github.com/txlock/txlock/internal/release

go 1.26.0

require golang.org/x/mod v0.43.0
