"""uvicorn's httptools protocol, answering requests it cannot parse with a problem document.

uvicorn answers an unparsable request (a URL over its parser's limit, broken framing)
with a plain-text 400 before the application sees it; every error of this API is
`application/problem+json`, so this one is too.
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from queue_server import views

PROBLEM = views.dumps(
    {
        "type": "about:blank",
        "title": "Bad Request",
        "status": 400,
        "detail": "The request could not be parsed (for example, its URL is too long).",
        "code": "malformed-request",
    }
)


class ProblemHttpToolsProtocol(HttpToolsProtocol):
    def send_400_response(self, msg: str) -> None:
        content = [STATUS_LINE[400]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: application/problem+json\r\n",
                b"content-length: " + str(len(PROBLEM)).encode("ascii") + b"\r\n",
                b"connection: close\r\n",
                b"\r\n",
                PROBLEM,
            ]
        )
        self.transport.write(b"".join(content))
        self.transport.close()
