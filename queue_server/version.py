"""The server distribution's version (`queue-server --version`, the OpenAPI document, logs).

`queue_server` is a namespace package (PEP 420) shared by two distributions: this one, the
server, and `queue-server-client` (client/), which ships `queue_server.client`,
`queue_server.policy` and `queue_server.wire`.
"""

__version__ = "0.1.0"
