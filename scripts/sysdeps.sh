#!/usr/bin/env bash
# The system packages the tests use (browser, broker, media tools, PostgreSQL, a TURN relay), and a running
# PostgreSQL with the test role and database. As root with apt: installs what is missing.
# Otherwise: says what is missing and stops (IDOLCAST_SKIP_SYSDEPS=1 goes on; the tests that
# need a missing part are then skipped, and listed as such at the end of the run).
set -uo pipefail
PKGS=(chromium mosquitto mosquitto-clients ffmpeg gstreamer1.0-tools gstreamer1.0-plugins-bad postgresql coturn)
PG_ROLE=${IDOLCAST_TEST_PG_ROLE:-idolcast}
PG_DB=${IDOLCAST_TEST_PG_DB:-idolcast_test}

missing=()
if command -v dpkg >/dev/null 2>&1; then
  for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "sysdeps: installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null || {
      echo "sysdeps: apt-get install failed"; exit 1; }
  elif [ "${IDOLCAST_SKIP_SYSDEPS:-0}" = 1 ]; then
    echo "sysdeps: missing ${missing[*]} (IDOLCAST_SKIP_SYSDEPS=1: the tests needing them will be skipped)"
  else
    echo "sysdeps: missing system packages: ${missing[*]}"
    echo "  install them (sudo apt-get install ${missing[*]}), run 'sudo make sysdeps',"
    echo "  or set IDOLCAST_SKIP_SYSDEPS=1 to run without them (their tests are skipped and listed)."
    exit 1
  fi
elif ! command -v dpkg >/dev/null 2>&1; then
  echo "sysdeps: no dpkg here: install ${PKGS[*]} yourself (tests needing them are skipped and listed)"
fi

# PostgreSQL: a running cluster, the test role and database (tests/persona/pg.py's default DSN).
if [ "$(id -u)" = 0 ] && command -v pg_lsclusters >/dev/null 2>&1; then
  if ! pg_lsclusters -h | grep -q .; then
    ver=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
    pg_createcluster "$ver" main >/dev/null
  fi
  pg_lsclusters -h | while read -r ver name _port status _; do
    [ "$status" = online ] || pg_ctlcluster "$ver" "$name" start
  done
  psql_su() { runuser -u postgres -- psql -qtAX "$@"; }
  for _ in 1 2 3 4 5 6 7 8 9 10; do psql_su -c 'SELECT 1' >/dev/null 2>&1 && break; sleep 1; done
  if [ "$(psql_su -c "SELECT 1 FROM pg_roles WHERE rolname = '$PG_ROLE'")" != 1 ]; then
    psql_su -c "CREATE ROLE $PG_ROLE LOGIN PASSWORD '$PG_ROLE'"
  fi
  if [ "$(psql_su -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" != 1 ]; then
    psql_su -c "CREATE DATABASE $PG_DB OWNER $PG_ROLE"
  fi
  echo "sysdeps: PostgreSQL ready (postgresql://$PG_ROLE:…@127.0.0.1:5432/$PG_DB)"
fi
exit 0
