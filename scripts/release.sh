#!/usr/bin/env bash
# Versions, tags and the publication check of the modules users install:
# the library at the root, and the adapters txlockprom and txlockotel. They
# are released together, at one version, and each requires the others at
# that version (never a replace or a pseudo-version, which a consumer's
# build cannot resolve). RELEASING.md is the procedure.
#
#   scripts/release.sh version          prints the version the modules require each other at
#   scripts/release.sh prepare vX.Y.Z   makes every module of the repository require the
#                                       others at vX.Y.Z (go.mod and go.work); tidy them
#                                       after, with make tidy
#   scripts/release.sh check            the publication check: publishes the committed
#                                       modules (HEAD) at their version into a file-based
#                                       module proxy, then builds, outside the repository,
#                                       offline and without go.work, a fresh consumer of each
#   scripts/release.sh tag vX.Y.Z       checks, then tags HEAD vX.Y.Z, txlockprom/vX.Y.Z and
#                                       txlockotel/vX.Y.Z
#   scripts/release.sh proxy DIR        publishes the committed modules at their version into DIR
#   scripts/release.sh warm             downloads into the module cache what a consumer of each
#                                       module needs (make download), for check to build offline
#   scripts/release.sh tidy MODULE...   tidies each module directory on its own go.mod against
#                                       the committed modules published at their version (make tidy)
#
# The unreleased modules are published anew from each commit under one
# version, and the go command takes a version's content in its module cache
# to be immutable (it indexes it by path, in the build cache). So every
# command here that sees the published modules runs with a module cache of
# its own, made for the run; nothing of them ever lands in this machine's.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# The modules users install, by directory; the first is the library.
user_modules=(. txlockprom txlockotel)
# Every module of the repository that requires one of them.
all_modules=(reliability cmd/txlock-bench internal/pgtest/pgdocker txlockprom txlockotel examples/observability internal/interopcheck)
library=github.com/txlock/txlock

say() { echo "release: $*" >&2; }
die() {
	say "$*"
	exit 1
}

# current_version prints the version txlockprom requires the library at.
current_version() {
	local v
	v=$(sed -n "s#^[[:space:]]*$library \(v[^ ]*\)\$#\1#p" txlockprom/go.mod | head -1)
	[ -n "$v" ] || die "txlockprom/go.mod does not require $library"
	echo "$v"
}

valid_version() { [[ $1 =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$ ]]; }

# publish writes the user modules, as committed at HEAD, at version $2 into
# the proxy directory $1.
publish() {
	(cd internal/release && GOWORK=off go run . -repo "$root" -dir "$1" -version "$2" "${user_modules[@]}")
}

# offline_env runs a command the way a consumer's build outside this
# repository runs: no go.work, no network, no checksum database, and the
# run's own module cache ($run_cache). Modules come from the proxy
# directory $1, then (the other modules) from this machine's module cache,
# read as a proxy.
offline_env() {
	local proxy=$1
	shift
	env GOWORK=off GOFLAGS="-mod=mod -modcacherw" GOSUMDB=off GONOSUMDB= GOPRIVATE= GOTOOLCHAIN=local \
		GOMODCACHE="$run_cache" GOPROXY="file://$proxy,file://$host_cache/cache/download" "$@"
}

# online_env runs a command as offline_env does, but with this machine's
# proxy last, to download what this machine's module cache lacks: a
# consumer needs each module's own versions of its dependencies, which a
# build in the workspace does not download. keep_downloads then copies
# them into this machine's module cache.
online_env() {
	local proxy=$1
	shift
	env GOWORK=off GOFLAGS="-mod=mod -modcacherw" GONOSUMDB=$library GOTOOLCHAIN=local \
		GOMODCACHE="$run_cache" GOPROXY="file://$proxy,file://$host_cache/cache/download,$(go env GOPROXY)" "$@"
}

# run_caches makes the run's proxy directory ($proxy) and module cache
# ($run_cache), removed when the script exits.
run_caches() {
	proxy=$(mktemp -d)
	run_cache=$(mktemp -d)
	host_cache=$(go env GOMODCACHE)
	trap 'rm -rf "$proxy" "$run_cache"' EXIT
}

# keep_downloads copies what the run's module cache downloaded, but the
# published modules, into this machine's module cache, and removes from it
# any copy of them that an older script left there.
keep_downloads() {
	rm -rf "$run_cache/cache/download/$library"
	chmod -R u+w "$host_cache/$library"@* 2>/dev/null || true
	rm -rf "$host_cache/cache/download/$library" "$host_cache/$library"@*
	# File by file, and only what is missing (the cache's files are
	# read-only, and cp -n's exit status differs between versions); each
	# through a temporary file and a rename, so that a go command reading
	# the cache meanwhile never sees half a file, and the .ziphash files,
	# which say a zip is complete, last.
	(cd "$run_cache/cache/download" && find . -type f ! -name '*.ziphash' && find . -type f -name '*.ziphash') |
		while read -r f; do
			dest="$host_cache/cache/download/$f"
			if [ ! -e "$dest" ]; then
				mkdir -p "$(dirname "$dest")"
				cp "$run_cache/cache/download/$f" "$dest.tmp.$$"
				mv "$dest.tmp.$$" "$dest"
			fi
		done
}

# consumer builds a fresh module outside the repository that requires module
# $1 at version $2 and imports its packages $4..., the way run_env ($3) runs
# commands: offline_env for the check, online_env to warm the cache.
consumer() {
	local mod=$1 version=$2 run_env=$3
	shift 3
	local dir
	dir=$(mktemp -d)
	{
		echo "module example.com/consumer"
		echo
		echo "go 1.26.0"
		echo
		echo "require $mod $version"
	} >"$dir/go.mod"
	{
		echo "// Command consumer imports what a user of $mod imports."
		echo "package main"
		echo
		echo "import ("
		for p in "$@"; do echo "	_ \"$p\""; done
		echo ")"
		echo
		echo "func main() {}"
	} >"$dir/main.go"
	if ! (cd "$dir" && $run_env "$proxy" go build ./... && $run_env "$proxy" go vet ./...) >"$dir/log" 2>&1; then
		cat "$dir/log" >&2
		die "a consumer of $mod@$version does not build from the published modules"
	fi
	[ "$run_env" = online_env ] || say "a consumer of $mod@$version builds from the published modules alone"
	rm -rf "$dir"
}

# consumers builds a consumer of each published module with run_env $1
# against the proxy directory $2.
consumers() {
	local version
	version=$(current_version)
	consumer "$library" "$version" "$1" "$library" "$library/driver" "$library/pgxlock" "$library/sqlxlock" "$library/interop"
	consumer "$library/txlockprom" "$version" "$1" "$library/txlockprom"
	consumer "$library/txlockotel" "$version" "$1" "$library/txlockotel"
}

warm() {
	run_caches
	publish "$proxy" "$(current_version)" >/dev/null
	consumers online_env
	keep_downloads
}

tidy() {
	local m
	[ $# -gt 0 ] || die "usage: scripts/release.sh tidy MODULE..."
	run_caches
	publish "$proxy" "$(current_version)" >/dev/null
	for m in "$@"; do
		(cd "$m" && online_env "$proxy" go mod tidy) || die "$m: go mod tidy failed"
	done
	keep_downloads
}

check() {
	local version m
	version=$(current_version)
	valid_version "$version" || die "the modules require $library at $version, which a consumer cannot resolve: set a release version with: scripts/release.sh prepare vX.Y.Z"
	for m in "${user_modules[@]}"; do
		if grep -q '^replace\b\|^replace (' "$m/go.mod"; then
			die "$m/go.mod has a replace directive, which a consumer's build ignores: local development goes through go.work"
		fi
		if grep -E "github.com/txlock/txlock(/[a-z]+)? v[^ ]*[-.][0-9]{14}-[0-9a-f]{12}" "$m/go.mod"; then
			die "$m/go.mod requires a txlock module at a pseudo-version: require the release version (scripts/release.sh prepare)"
		fi
		if grep -E "github.com/txlock/txlock(/[a-z]+)? v" "$m/go.mod" | grep -v " $version\( \|\$\)"; then
			die "$m/go.mod requires a txlock module at another version than $version"
		fi
	done
	if [ -n "$(git status --porcelain -- '*go.mod' go.work)" ]; then
		die "go.mod or go.work files have uncommitted changes, and the check publishes HEAD: commit them first"
	fi
	run_caches
	publish "$proxy" "$version"
	consumers offline_env
}

prepare() {
	local version=$1 old m proxy
	valid_version "$version" || die "$version is not a release version such as v0.2.0"
	old=$(current_version)
	for m in "${all_modules[@]}"; do
		(
			cd "$m"
			GOWORK=off go mod edit -require="$library@$version"
			if grep -q "$library/txlockprom v" go.mod; then
				GOWORK=off go mod edit -require="$library/txlockprom@$version"
			fi
		)
	done
	go work edit -dropreplace="$library@$old" -dropreplace="$library/txlockprom@$old" \
		-replace="$library@$version=./" -replace="$library/txlockprom@$version=./txlockprom"
	# Tidy each module against the version it will be released at, which
	# exists only in a proxy made from the working tree's last commit: so
	# commit the library first.
	say "required $version everywhere; commit, then run 'make tidy' and commit the go.sum files it changes"
}

tag() {
	local version=$1
	valid_version "$version" || die "$version is not a release version such as v0.2.0"
	[ "$(current_version)" = "$version" ] || die "the modules require $(current_version), not $version: run scripts/release.sh prepare $version first"
	[ -z "$(git status --porcelain)" ] || die "the working tree has changes: commit them first"
	check
	git tag -a "$version" -m "txlock $version"
	git tag -a "txlockprom/$version" -m "txlockprom $version"
	git tag -a "txlockotel/$version" -m "txlockotel $version"
	say "tagged $version, txlockprom/$version and txlockotel/$version; push them with: git push origin $version txlockprom/$version txlockotel/$version"
}

case "${1:-}" in
version) current_version ;;
check) check ;;
prepare) prepare "${2:?usage: scripts/release.sh prepare vX.Y.Z}" ;;
tag) tag "${2:?usage: scripts/release.sh tag vX.Y.Z}" ;;
proxy) publish "${2:?usage: scripts/release.sh proxy DIR}" "$(current_version)" ;;
warm) warm ;;
tidy)
	shift
	tidy "$@"
	;;
*)
	sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0" >&2
	exit 2
	;;
esac
