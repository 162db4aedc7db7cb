#!/bin/sh
# The official postgres image's first start, for the stand-in: a cluster in $PGDATA owned by
# `postgres`, superuser $POSTGRES_USER with $POSTGRES_PASSWORD, database $POSTGRES_DB.
set -eu
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
as_postgres="setpriv --reuid=postgres --regid=postgres --init-groups"
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pw=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pw"
  chown postgres "$pw"
  $as_postgres "$bin/initdb" -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pw" --auth-local=trust \
    --auth-host=scram-sha-256 --encoding=UTF8 >/dev/null
  rm -f "$pw"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  if [ "${POSTGRES_DB:-$POSTGRES_USER}" != postgres ]; then
    echo "CREATE DATABASE \"${POSTGRES_DB:-$POSTGRES_USER}\"" |
      $as_postgres "$bin/postgres" --single -D "$PGDATA" postgres >/dev/null
  fi
fi
exec $as_postgres "$bin/postgres" -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql
