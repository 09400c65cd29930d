# The test command CI runs: formatting, vet, and the test suites with the
# race detector against throwaway PostgreSQL and PgBouncer servers.
#
# The repository holds seven modules, so that what the tests and tools need
# stays out of the library's go.mod: the library at the root, the
# reliability suite, the benchmark program, pgdocker (a PostgreSQL in a
# container for the tests), the Prometheus and OpenTelemetry adapters
# (txlockprom, txlockotel) and the example that serves their metrics
# (examples/observability). go.work lets go commands at the root reach all
# seven; the targets below run each module on its own go.mod, as a build
# outside this repository would.
MODULES := . reliability cmd/txlock-bench internal/pgtest/pgdocker txlockprom txlockotel examples/observability
export GOWORK := off

.PHONY: test check download tidy fuzz

test: check
	@for m in $(MODULES); do echo "go test -race -count=1 ./... in $$m"; (cd $$m && go test -race -count=1 ./...) || exit 1; done

check:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@for m in $(MODULES); do echo "go vet ./... in $$m"; (cd $$m && go vet ./...) || exit 1; done

download:
	@for m in $(MODULES); do (cd $$m && go mod download) || exit 1; done

tidy:
	@for m in $(MODULES); do (cd $$m && go mod tidy) || exit 1; done

fuzz:
	go test -run '^$$' -fuzz FuzzPgLocksRoundTrip -fuzztime 30s .
	go test -run '^$$' -fuzz FuzzStringKeySQL -fuzztime 30s .
