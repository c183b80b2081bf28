#!/bin/sh
# Writes PgBouncer's auth file from the environment, then runs PgBouncer in the foreground.
set -eu
: "${QUEUE_SERVER_DB_PASSWORD:?set QUEUE_SERVER_DB_PASSWORD}"
umask 077
printf '"queue_server" "%s"\n' "$QUEUE_SERVER_DB_PASSWORD" > /tmp/userlist.txt
exec pgbouncer /etc/pgbouncer/pgbouncer.ini
