# PostgreSQL 15 managed by Patroni (Debian's package), for deploy/docker-compose.ha.yml.
FROM postgres:15-bookworm
RUN apt-get update \
    && apt-get install -y --no-install-recommends patroni \
    && rm -rf /var/lib/apt/lists/*
COPY patroni.yml /etc/patroni/patroni.yml
USER postgres
EXPOSE 5432 8008
CMD ["patroni", "/etc/patroni/patroni.yml"]
