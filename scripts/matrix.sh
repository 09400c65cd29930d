#!/usr/bin/env bash
# The version matrix (make matrix): the root package's tests, then
# ./interop's, on every PostgreSQL version of scripts/deps.sh's matrix, each
# with Debian's PgBouncer in front (the harness starts both).
#
# The versions run side by side, each in a process of its own with servers
# of its own on free ports of 127.0.0.1: the tests spend most of their time
# waiting (for lock timeouts, hold bounds, heartbeats), not on the CPU.
# MATRIX_JOBS is how many run at once: 3 by default, which on two cores
# leaves the timing tests room; 0 runs all at once. Each version's output is
# printed whole when it ends, headed by its version.
#
# A version that is not installed is skipped, or fails when CI is set.
#
#   scripts/matrix.sh SKIP TESTFLAGS...   SKIP: the -skip pattern of the root package's tests
set -uo pipefail
cd "$(dirname "$0")/.."

skip=$1
shift
flags=("$@")
deps=scripts/deps.sh
jobs=${MATRIX_JOBS:-3}
case $jobs in
'' | *[!0-9]*)
	echo "MATRIX_JOBS must be a number (how many versions at once; 0: all), not '$jobs'" >&2
	exit 2
	;;
esac
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# one runs the matrix's tests on PostgreSQL $1 from the bin directory $2,
# with its output in $logs/$1.log, and leaves its exit status in
# $logs/$1.status.
one() {
	local major=$1 bin=$2 ok=0 start
	start=$(date +%s)
	{
		echo "go test ${flags[*]} -skip '$skip' in . on PostgreSQL $major ($bin)"
		TXLOCK_TEST_PG_BINDIR="$bin" TXLOCK_TEST_PG_MAJOR=$major go test "${flags[@]}" -skip "$skip" || ok=1
		echo "go test ${flags[*]} ./interop on PostgreSQL $major ($bin)"
		TXLOCK_TEST_PG_BINDIR="$bin" TXLOCK_TEST_PG_MAJOR=$major go test "${flags[@]}" ./interop || ok=1
		echo "PostgreSQL $major: $(($(date +%s) - start))s"
	} >"$logs/$major.log" 2>&1
	echo $ok >"$logs/$major.status"
}

failed=
majors=()
# Build the test binaries once, before the versions start together.
if ! go test -run '^$' "${flags[@]}" . ./interop >"$logs/build.log" 2>&1; then
	cat "$logs/build.log"
	echo "version matrix: the test binaries do not build"
	exit 1
fi
if ! all=$($deps matrix) || [ -z "$all" ]; then
	echo "version matrix: scripts/deps.sh matrix named no version"
	exit 1
fi
for major in $all; do
	if ! bin=$($deps bindir "$major"); then
		if [ -n "${CI:-}" ]; then
			echo "PostgreSQL $major is not installed (scripts/deps.sh test installs it): failing, because CI is set"
			failed="$failed $major"
		else
			echo "PostgreSQL $major is not installed (scripts/deps.sh test installs it): skipped"
		fi
		continue
	fi
	while [ "$jobs" -gt 0 ] && [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
		wait -n
	done
	one "$major" "$bin" &
	majors+=("$major")
done
wait
for major in "${majors[@]}"; do
	cat "$logs/$major.log"
	[ "$(cat "$logs/$major.status")" = 0 ] || failed="$failed $major"
done
if [ -n "$failed" ]; then
	echo "version matrix failed on PostgreSQL$failed"
	exit 1
fi
