package main

// This file is the part of the example to copy: a Locker whose lock events
// feed Prometheus metrics (txlockprom), served on /metrics. The rest of the
// program is the demo around it.

import (
	"database/sql"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/txlockprom"
)

// observedLocker returns a Locker on db whose calls report to txlock's
// metrics in reg, and the handler that serves reg's metrics. txlockprom's
// Grafana dashboard (txlockprom.Dashboard, or
// txlockprom/grafana-dashboard.json) charts them.
func observedLocker(db *sql.DB, reg *prometheus.Registry) (*txlock.Locker, http.Handler, error) {
	obs, err := txlockprom.New(reg)
	if err != nil {
		return nil, nil, err
	}
	locker, err := txlock.New(db, txlock.WithObserver(obs),
		txlock.WithRetry(txlock.ExponentialBackoff{Min: time.Millisecond, Max: 20 * time.Millisecond}))
	if err != nil {
		return nil, nil, err
	}
	return locker, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}
