package main

import (
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// openDB opens a pool on the PostgreSQL of url for the command's own
// queries, and returns it with the server's address for messages (never
// the URL, which may hold a password). The pool uses pgx's simple protocol
// whatever the URL says, so that it works behind any pooler; doctor tests
// the URL's own default_query_exec_mode separately. Its sessions are named
// app in pg_stat_activity unless the URL names them.
func openDB(url, app string) (*sql.DB, string, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, "", err
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = app
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(4)
	return db, target(cfg), nil
}

// target names the server of cfg: host:port.
func target(cfg *pgx.ConnConfig) string {
	return fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
}
