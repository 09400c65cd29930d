# The test command CI runs: the dependencies (scripts/deps.sh installs what
# is missing, or names the command that does), formatting, vet, the
# documentation check (internal/docscheck: the go blocks of README.md,
# BENCHMARKS.md, RELEASING.md and docs/ compile, their links resolve, and
# their measured figures come with the command that measured them), and
# the test suites with the race detector against throwaway PostgreSQL and
# PgBouncer servers; then the root and interop packages again on every other
# PostgreSQL version of the version matrix; then the publication check of
# the modules users install (scripts/release.sh check). Each phase prints
# its duration when it ends, and the tests run in a shuffled order whose
# seed go test prints (-test.shuffle N), so that a test that passes only
# after another shows.
#
# The repository holds ten modules, so that what the tests and tools need
# stays out of the library's go.mod: the library at the root, the
# reliability suite, the benchmark program, pgdocker (a PostgreSQL in a
# container for the tests), the Prometheus and OpenTelemetry adapters
# (txlockprom, txlockotel), the example that serves their metrics
# (examples/observability), interopcheck (which pins interop's keys against
# golang-migrate's own code), docscheck (the documentation check of make
# check) and internal/release (the publication tool, outside go.work).
# Only the library and the adapters are published (scripts/release.sh).
# go.work joins the others for local development: they require each other
# at the release version, which go.work points at the working tree (see
# RELEASING.md).
MODULES := . reliability cmd/txlock-bench internal/pgtest/pgdocker txlockprom txlockotel examples/observability internal/interopcheck internal/docscheck
TESTFLAGS := -race -count=1 -shuffle=on

DEPS := scripts/deps.sh
# The version matrix runs the root package without the tests that need a hot
# standby (their names say Standby): its PostgreSQL packages have no
# pg_basebackup. It also leaves out the two longest term tests, which hold
# a term for 30 s while vacuum runs and campaign with 16 processes: they
# test the library's own loop, not what differs between versions (the
# term's isolation and transaction_timeout tests do run on every version).
MATRIX_SKIP := Standby|TermHoldsBackNoVacuum|TermExclusionAcrossProcesses

.PHONY: demo test bench deps check suites matrix modules download tidy fuzz
# The steps of test run in the order given.
.NOTPARALLEL:

# timed runs its recipe line as one phase named $(1), and prints how long
# it took when it ends, whether it passed or failed.
timed = start=$$(date +%s); status=0; ( $(2) ) || status=$$?; \
	echo "phase $(1): $$(( $$(date +%s) - start ))s$$( [ $$status -eq 0 ] || echo ", failed")"; exit $$status

demo:
	@$(DEPS) demo
	go run ./examples/inventory
	go run ./examples/exportpool

test: deps download check suites matrix modules

# The benchmark program (BENCHMARKS.md), once scripts/deps.sh has what it
# needs: PostgreSQL, PgBouncer and redis-server. BENCH_FLAGS are its flags:
# by default a quick run that writes no chart.
BENCH_FLAGS := -quick -svg ""
bench:
	@$(DEPS) bench
	cd cmd/txlock-bench && go run . $(BENCH_FLAGS)

deps:
	@$(call timed,deps,$(DEPS) test)

check:
	@$(call timed,check,out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi; \
		for m in $(MODULES); do echo "go vet ./... in $$m"; (cd $$m && go vet ./...) || exit 1; done; \
		(cd internal/release && GOWORK=off go vet ./...) || exit 1; \
		echo "go run ./internal/docscheck (go blocks compile, links resolve, figures name their command)"; \
		go run ./internal/docscheck)

# Every module, on the PostgreSQL found as the test harness finds it (named,
# and passed on in TXLOCK_TEST_PG_BINDIR, with its major version in
# TXLOCK_TEST_PG_MAJOR, which TestServerVersion checks). The root module
# and the others run side by side, each test binary with servers of its
# own, as the matrix's versions do: the tests mostly wait, and the root
# module (about 320 s) and the reliability suite (about 190 s) were the two
# longest, one after the other. Each lane's output is printed when it ends.
suites:
	@$(call timed,suites,on=; if [ -z "$$TXLOCK_TEST_DATABASE_URL" ] && bin=$$($(DEPS) bindir); then \
		v=$$("$$bin/postgres" --version | sed -n 's/^postgres (PostgreSQL) \([0-9][0-9.]*\).*/\1/p'); \
		export TXLOCK_TEST_PG_BINDIR="$$bin" TXLOCK_TEST_PG_MAJOR="$${v%%.*}"; \
		on=" on PostgreSQL $$v ($$bin)"; \
	fi; \
	lane() { for m in "$$@"; do echo "go test $(TESTFLAGS) ./... in $$m$$on"; (cd $$m && go test $(TESTFLAGS) ./...) || return 1; done; }; \
	a=$$(mktemp); b=$$(mktemp); \
	lane $(firstword $(MODULES)) > $$a 2>&1 & pa=$$!; \
	lane $(wordlist 2,$(words $(MODULES)),$(MODULES)) > $$b 2>&1 & pb=$$!; \
	sa=0; wait $$pa || sa=$$?; sb=0; wait $$pb || sb=$$?; \
	cat $$a $$b; rm -f $$a $$b; [ $$sa -eq 0 ] && [ $$sb -eq 0 ])

# The root package on each version of the matrix, with Debian's PgBouncer in
# front, then the interop package, whose Hashtext is compared with each
# version's hashtext(): scripts/matrix.sh, which runs the versions at the
# same time. A version that is not installed is skipped, or fails when CI is
# set. The root package's go test runs without package arguments, so that
# TestServerVersion's "server: PostgreSQL …" line is shown.
matrix:
	@$(call timed,matrix,if [ -n "$$TXLOCK_TEST_DATABASE_URL" ]; then echo "version matrix skipped: TXLOCK_TEST_DATABASE_URL is set"; exit 0; fi; \
		scripts/matrix.sh '$(MATRIX_SKIP)' $(TESTFLAGS))

# The publication check of the modules users install (RELEASING.md).
modules:
	@$(call timed,modules,scripts/release.sh check)

# Each module's dependencies as the workspace builds them, then what a
# consumer of each published module needs (its own versions), so that the
# publication check can build offline.
download:
	@for m in $(MODULES); do (cd $$m && go mod download) || exit 1; done
	@(cd internal/release && GOWORK=off go mod download)
	@scripts/release.sh warm

# Each module tidied on its own go.mod, without go.work, against the
# committed modules published at the release version (the version exists
# nowhere else before it is tagged).
tidy:
	@scripts/release.sh tidy $(MODULES) internal/release

fuzz:
	go test -run '^$$' -fuzz FuzzPgLocksRoundTrip -fuzztime 30s .
	go test -run '^$$' -fuzz FuzzStringKeySQL -fuzztime 30s .
