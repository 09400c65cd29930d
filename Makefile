# The test command CI runs: the dependencies (scripts/deps.sh installs what
# is missing, or names the command that does), formatting, vet, and the test
# suites with the race detector against throwaway PostgreSQL and PgBouncer
# servers; then the root and interop packages again on every other
# PostgreSQL version of the version matrix.
#
# The repository holds eight modules, so that what the tests and tools need
# stays out of the library's go.mod: the library at the root, the
# reliability suite, the benchmark program, pgdocker (a PostgreSQL in a
# container for the tests), the Prometheus and OpenTelemetry adapters
# (txlockprom, txlockotel), the example that serves their metrics
# (examples/observability) and interopcheck (which pins interop's keys
# against golang-migrate's own code). go.work lets go commands at the root
# reach all eight; the targets below run each module on its own go.mod, as a
# build outside this repository would.
MODULES := . reliability cmd/txlock-bench internal/pgtest/pgdocker txlockprom txlockotel examples/observability internal/interopcheck
export GOWORK := off

DEPS := scripts/deps.sh
# The version matrix runs the root package without the tests that need a hot
# standby (their names say Standby): its PostgreSQL packages have no
# pg_basebackup. It also leaves out the two longest term tests, which hold
# a term for 30 s while vacuum runs and campaign with 16 processes: they
# test the library's own loop, not what differs between versions (the
# term's isolation and transaction_timeout tests do run on every version).
MATRIX_SKIP := Standby|TermHoldsBackNoVacuum|TermExclusionAcrossProcesses

.PHONY: demo test bench deps check suites matrix download tidy fuzz
# The steps of test run in the order given.
.NOTPARALLEL:

demo:
	@$(DEPS) demo
	go run ./examples/inventory

test: deps check suites matrix

# The benchmark program (BENCHMARKS.md), once scripts/deps.sh has what it
# needs: PostgreSQL, PgBouncer and redis-server. BENCH_FLAGS are its flags:
# by default a quick run that writes no chart.
BENCH_FLAGS := -quick -svg ""
bench:
	@$(DEPS) bench
	cd cmd/txlock-bench && go run . $(BENCH_FLAGS)

deps:
	@$(DEPS) test

check:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@for m in $(MODULES); do echo "go vet ./... in $$m"; (cd $$m && go vet ./...) || exit 1; done

# Every module, on the PostgreSQL found as the test harness finds it (named,
# and passed on in TXLOCK_TEST_PG_BINDIR, with its major version in
# TXLOCK_TEST_PG_MAJOR, which TestServerVersion checks).
suites:
	@on=; if [ -z "$$TXLOCK_TEST_DATABASE_URL" ] && bin=$$($(DEPS) bindir); then \
		v=$$("$$bin/postgres" --version | sed -n 's/^postgres (PostgreSQL) \([0-9][0-9.]*\).*/\1/p'); \
		export TXLOCK_TEST_PG_BINDIR="$$bin" TXLOCK_TEST_PG_MAJOR="$${v%%.*}"; \
		on=" on PostgreSQL $$v ($$bin)"; \
	fi; \
	for m in $(MODULES); do echo "go test -race -count=1 ./... in $$m$$on"; (cd $$m && go test -race -count=1 ./...) || exit 1; done

# The root package on each version of the matrix, with Debian's PgBouncer in
# front, then the interop package, whose Hashtext is compared with each
# version's hashtext(). A version that is not installed is skipped, or fails
# when CI is set. The root package's go test runs without package arguments,
# so that TestServerVersion's "server: PostgreSQL …" line is shown.
matrix:
	@if [ -n "$$TXLOCK_TEST_DATABASE_URL" ]; then echo "version matrix skipped: TXLOCK_TEST_DATABASE_URL is set"; exit 0; fi; \
	failed=; \
	for major in $$($(DEPS) matrix); do \
		if ! bin=$$($(DEPS) bindir $$major); then \
			if [ -n "$$CI" ]; then echo "PostgreSQL $$major is not installed (scripts/deps.sh test installs it): failing, because CI is set"; failed="$$failed $$major"; \
			else echo "PostgreSQL $$major is not installed (scripts/deps.sh test installs it): skipped"; fi; \
			continue; \
		fi; \
		echo "go test -race -count=1 -skip '$(MATRIX_SKIP)' in . on PostgreSQL $$major ($$bin)"; \
		ok=1; \
		TXLOCK_TEST_PG_BINDIR="$$bin" TXLOCK_TEST_PG_MAJOR=$$major go test -race -count=1 -skip '$(MATRIX_SKIP)' || ok=; \
		echo "go test -race -count=1 ./interop on PostgreSQL $$major ($$bin)"; \
		TXLOCK_TEST_PG_BINDIR="$$bin" TXLOCK_TEST_PG_MAJOR=$$major go test -race -count=1 ./interop || ok=; \
		[ -n "$$ok" ] || failed="$$failed $$major"; \
	done; \
	if [ -n "$$failed" ]; then echo "version matrix failed on PostgreSQL$$failed"; exit 1; fi

download:
	@for m in $(MODULES); do (cd $$m && go mod download) || exit 1; done

tidy:
	@for m in $(MODULES); do (cd $$m && go mod tidy) || exit 1; done

fuzz:
	go test -run '^$$' -fuzz FuzzPgLocksRoundTrip -fuzztime 30s .
	go test -run '^$$' -fuzz FuzzStringKeySQL -fuzztime 30s .
