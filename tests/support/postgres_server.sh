#!/usr/bin/env bash
# tests/support/postgres_server.sh start|stop DIR PORT: a throwaway PostgreSQL for the store's tests
# (ctest's postgres fixture). The cluster lives in DIR/data, listens on 127.0.0.1:PORT and in DIR (its
# socket), trusts every local connection, and holds an empty database kevo_test (superuser postgres).
# Missing server binaries are an error, never a skip: CI must not pass without PostgreSQL.
set -euo pipefail
action=${1:?usage: postgres_server.sh start|stop DIR PORT}
dir=${2:?usage: postgres_server.sh start|stop DIR PORT}
port=${3:?usage: postgres_server.sh start|stop DIR PORT}

# The server binaries: $KEVO_PG_BINDIR, else Debian's newest /usr/lib/postgresql/N/bin, else PATH.
bindir=${KEVO_PG_BINDIR:-}
if [ -z "$bindir" ]; then
  for candidate in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V); do bindir=$candidate; done
fi
if [ -z "$bindir" ] && command -v initdb >/dev/null; then bindir=$(dirname "$(command -v initdb)"); fi
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ] || [ ! -x "$bindir/pg_ctl" ]; then
  echo "postgres_server.sh: no PostgreSQL server binaries (initdb, pg_ctl): install the postgresql package (scripts/install-deps)" >&2
  exit 1
fi

# initdb refuses to run as root: the cluster belongs to the postgres user then.
as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

stop() {
  if [ -f "$dir/data/postmaster.pid" ]; then as_owner "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null; fi
}

case $action in
  start)
    stop || true  # a cluster left by a run that was killed
    rm -rf "$dir"
    mkdir -p "$dir"
    if [ "$(id -u)" = 0 ]; then chown postgres: "$dir"; fi
    as_owner "$bindir/initdb" -D "$dir/data" -U postgres -A trust --no-sync -E UTF8 --locale=C >"$dir/initdb.log" 2>&1 ||
      { cat "$dir/initdb.log" >&2; exit 1; }
    as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
      -o "-k $dir -h 127.0.0.1 -p $port -c fsync=off -c max_connections=200" start >/dev/null ||
      { cat "$dir/server.log" >&2; exit 1; }
    "$bindir/createdb" -h 127.0.0.1 -p "$port" -U postgres kevo_test
    echo "PostgreSQL on 127.0.0.1:$port (database kevo_test, data in $dir/data)"
    ;;
  stop)
    stop
    rm -rf "$dir"
    ;;
  *)
    echo "usage: postgres_server.sh start|stop DIR PORT" >&2
    exit 2
    ;;
esac
