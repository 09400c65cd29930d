# The test command CI runs: formatting, vet, and the whole suite with the
# race detector against throwaway PostgreSQL and PgBouncer servers.
.PHONY: test check fuzz

test: check
	go test -race -count=1 ./...

check:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	go vet ./...

fuzz:
	go test -run '^$$' -fuzz FuzzPgLocksRoundTrip -fuzztime 30s .
	go test -run '^$$' -fuzz FuzzStringKeySQL -fuzztime 30s .
