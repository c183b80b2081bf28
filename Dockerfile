FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY queue_server queue_server
RUN pip install --no-cache-dir .
USER nobody
EXPOSE 8080
CMD ["queue-server", "serve", "--host", "0.0.0.0", "--port", "8080"]
