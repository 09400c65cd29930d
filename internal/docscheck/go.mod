module github.com/txlock/txlock/internal/docscheck

go 1.26.0
