"""The HTTP/1.1 server protocol every service runs: uvicorn's httptools protocol, answering
requests it cannot parse in the API's error shape instead of uvicorn's plain text.

- a request target (path and query) longer than ``MAX_URL_BYTES``: ``414 URI_TOO_LONG``;
- any other unparsable request: ``400 BAD_REQUEST``.

Both are ``{"code", "message"}`` JSON and close the connection, as uvicorn does.
"""

from __future__ import annotations

import orjson
from tidemq.protocol import ErrorCode
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tidemq_server.common.constants import MAX_URL_BYTES

_REASONS = {400: b"Bad Request", 414: b"URI Too Long"}


class _UrlTooLong(Exception):
    pass


class JsonErrorsProtocol(HttpToolsProtocol):
    """uvicorn's protocol with two narrow overrides, ``on_url`` (a parser callback) and
    ``send_400_response`` (what uvicorn calls on any parse error); everything else, upgrades
    included, is uvicorn's own code of the installed version (pyproject.toml bounds it)."""

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > MAX_URL_BYTES:
            raise _UrlTooLong  # the parser stops; uvicorn calls send_400_response: 414 there

    def send_400_response(self, msg: str) -> None:
        if len(getattr(self, "url", b"")) > MAX_URL_BYTES:  # url: set once a request began
            self._refuse(ErrorCode.URI_TOO_LONG, f"the request target (path and query) is "
                         f"longer than {MAX_URL_BYTES} bytes: send long values in a body")
        else:
            self._refuse(ErrorCode.BAD_REQUEST, "invalid HTTP request: it could not be parsed "
                         "as HTTP/1.1")

    def _refuse(self, code: ErrorCode, message: str) -> None:
        body = orjson.dumps({"code": code.value, "message": message})
        status = code.http_status
        head = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status])]
        for name, value in self.server_state.default_headers:
            head.extend([name, b": ", value, b"\r\n"])
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\n"
                    b"connection: close\r\n\r\n" % len(body))
        self.transport.write(b"".join(head) + body)
        self.transport.close()
