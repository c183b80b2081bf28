# PgBouncer (Debian's package, transaction pooling), for deploy/docker-compose.ha.yml.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends pgbouncer \
    && rm -rf /var/lib/apt/lists/*
COPY pgbouncer.ini /etc/pgbouncer/pgbouncer.ini
COPY pgbouncer-entrypoint.sh /usr/local/bin/pgbouncer-entrypoint.sh
USER postgres
EXPOSE 6432
ENTRYPOINT ["/usr/local/bin/pgbouncer-entrypoint.sh"]
