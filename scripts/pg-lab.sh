#!/usr/bin/env bash
# Throwaway PostgreSQL cluster in a temp dir (no systemd, nothing under /etc/postgresql).
#   scripts/pg-lab.sh up      -> prints `export DATABASE_URL=...` (eval it)
#   scripts/pg-lab.sh down [--purge]
# Env: PG_LAB (default /tmp/gpufleet-pg-lab), PG_LAB_PORT (default 15432). Needs the postgresql
# Debian package; when run as root the server runs as the 'postgres' OS user.
set -euo pipefail
PGLAB="${PG_LAB:-/tmp/gpufleet-pg-lab}"; PGPORT="${PG_LAB_PORT:-15432}"
BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
[ -n "$BIN" ] || { echo "pg-lab: PostgreSQL server binaries not found (apt-get install postgresql)" >&2; exit 1; }
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
case "${1:-up}" in
  up)
    mkdir -p "$PGLAB"; [ "$(id -u)" = 0 ] && chown postgres:postgres "$PGLAB"
    if [ ! -f "$PGLAB/data/PG_VERSION" ]; then
      as_pg "$BIN/initdb" -D "$PGLAB/data" -U postgres --auth=trust -E UTF8 --no-sync >/dev/null
    fi
    if ! as_pg "$BIN/pg_ctl" -D "$PGLAB/data" status >/dev/null 2>&1; then
      as_pg "$BIN/pg_ctl" -D "$PGLAB/data" -l "$PGLAB/server.log" -w -t 30 \
        -o "-c listen_addresses=127.0.0.1 -p $PGPORT -k $PGLAB -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
        start >/dev/null
    fi
    for db in gpufleet gpufleet_test; do
      psql -h 127.0.0.1 -p "$PGPORT" -U postgres -Atc "select 1 from pg_database where datname='$db'" | grep -q 1 \
        || psql -h 127.0.0.1 -p "$PGPORT" -U postgres -qc "create database $db"
    done
    echo "export DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:$PGPORT/gpufleet"
    echo "export GPUFLEET_TEST_POSTGRES_URL=postgresql+psycopg://postgres@127.0.0.1:$PGPORT/gpufleet_test"
    ;;
  down)
    [ -f "$PGLAB/data/postmaster.pid" ] && as_pg "$BIN/pg_ctl" -D "$PGLAB/data" -m fast -w stop >/dev/null || true
    [ "${2:-}" = "--purge" ] && rm -rf "$PGLAB"
    echo "pg-lab stopped" >&2
    ;;
  *) echo "usage: $0 up|down [--purge]" >&2; exit 2 ;;
esac
