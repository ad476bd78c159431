#!/usr/bin/env bash
# tests/support/postgres_server.sh start|stop DIR PORT: a throwaway PostgreSQL for the store's tests
# (ctest's postgres fixture). The cluster listens on 127.0.0.1:PORT and on a Unix socket, trusts every
# local connection, and holds an empty database kevo_test (superuser postgres).
# It lives in a short private directory that `start` makes under /tmp (mktemp), never under DIR: a
# socket's path must fit in sun_path (108 bytes, its NUL included), which a build tree in a clone at a
# long path does not. DIR (in the build tree) is a link to that directory; `stop` removes both.
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

# The private directory DIR links to (DIR itself where an older run made it a directory); empty: none.
private_dir() {
  if [ -L "$dir" ]; then readlink "$dir"; elif [ -d "$dir" ]; then printf %s "$dir"; fi
}

stop() {
  local private
  private=$(private_dir)
  if [ -n "$private" ] && [ -f "$private/data/postmaster.pid" ]; then as_owner "$bindir/pg_ctl" -D "$private/data" -m fast -w stop >/dev/null; fi
}

remove() {
  local private
  private=$(private_dir)
  case $private in /tmp/kevo-pg.*) rm -rf "$private" ;; esac
  rm -rf "$dir"
}

case $action in
  start)
    stop || true  # a cluster left by a run that was killed
    remove
    private=$(mktemp -d /tmp/kevo-pg.XXXXXX)
    # The server's socket, DIR/.s.PGSQL.PORT: refused here, named, where it cannot fit.
    socket=$private/.s.PGSQL.$port
    if [ ${#socket} -gt 107 ]; then
      echo "postgres_server.sh: the server's Unix socket $socket is ${#socket} bytes, over the 107 that a socket path holds (sun_path, 108 bytes with its NUL)" >&2
      rm -rf "$private"
      exit 1
    fi
    mkdir -p "$(dirname "$dir")"
    ln -s "$private" "$dir"
    if [ "$(id -u)" = 0 ]; then chown postgres: "$private"; fi
    as_owner "$bindir/initdb" -D "$private/data" -U postgres -A trust --no-sync -E UTF8 --locale=C >"$private/initdb.log" 2>&1 ||
      { cat "$private/initdb.log" >&2; exit 1; }
    as_owner "$bindir/pg_ctl" -D "$private/data" -l "$private/server.log" -w \
      -o "-k $private -h 127.0.0.1 -p $port -c fsync=off -c max_connections=200" start >/dev/null ||
      { cat "$private/server.log" >&2; exit 1; }
    "$bindir/createdb" -h 127.0.0.1 -p "$port" -U postgres kevo_test
    echo "PostgreSQL on 127.0.0.1:$port and $socket (database kevo_test, data in $private/data; $dir links there)"
    ;;
  stop)
    stop
    remove
    ;;
  *)
    echo "usage: postgres_server.sh start|stop DIR PORT" >&2
    exit 2
    ;;
esac
