"""A fault-injecting S3-compatible endpoint for the tests: a small threaded HTTP proxy on
127.0.0.1 in front of a moto server, which forwards every request unchanged except those a
scripted ``Fault`` matches (by method, a regular expression on the path and query, and a count):

- ``status``: answer with an S3 error instead of forwarding (500 InternalError, 503 SlowDown,
  429 throttling, ...);
- ``reset``: cut the connection (an RST) after ``after_bytes`` bytes of the response body (a
  GET) or of the request body (a PUT or POST);
- ``delay``: hold the request ``delay_s`` seconds, beyond the client's timeout, then forward it;
- ``drop_completion``: answer a CompleteMultipartUpload with a success the server never saw
  (its parts were accepted; the object is never assembled).

Every fault injected is recorded in ``proxy.injected`` (the scenario's count of faults survived).
"""

from __future__ import annotations

import http.client
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ERRORS = {
    500: ("InternalError", "We encountered an internal error. Please try again."),
    503: ("SlowDown", "Please reduce your request rate."),
    429: ("SlowDown", "Please reduce your request rate."),  # throttling, as some stores send it
}


@dataclass
class Fault:
    method: str  # GET, PUT, POST, HEAD, DELETE
    path: str  # a regular expression searched in the path with its query
    action: str  # status | reset | delay | drop_completion
    count: int = 1  # how many matching requests it hits
    status: int = 503
    after_bytes: int = 0
    delay_s: float = 0.0
    hits: int = field(default=0, init=False)


class FaultProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.faults: list[Fault] = []
        self.injected: list[str] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FaultProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def script(self, *faults: Fault) -> None:
        """Replace the faults to inject (and forget those injected so far)."""
        with self.lock:
            self.faults = list(faults)
            self.injected = []

    def pending(self) -> int:
        return sum(f.count - f.hits for f in self.faults)

    def match(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                hit = fault.method == method and re.search(fault.path, path)
                if hit and fault.hits < fault.count:
                    fault.hits += 1
                    self.injected.append(f"{fault.action} {method} {path}")
                    return fault
        return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: FaultProxy

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _body(self, limit: int | None = None) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length", 0))
        return self.rfile.read(length if limit is None else min(length, limit))

    def _reset(self) -> None:
        """Close the connection with an RST, as a network in trouble does."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    def _handle(self) -> None:
        fault = self.owner.match(self.command, self.path)
        if fault and fault.action == "reset" and self.command in ("PUT", "POST"):
            self._body(fault.after_bytes)
            self._reset()
            return
        body = self._body()
        if fault and fault.action == "status":
            code, message = ERRORS.get(fault.status, ("InternalError", "error"))
            payload = (
                f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f"<Message>{message}</Message></Error>"
            ).encode()
            self._respond(fault.status, [("Content-Type", "application/xml")], payload)
            return
        if fault and fault.action == "drop_completion":
            key = self.path.split("?")[0].split("/", 2)[-1]
            payload = (
                '<?xml version="1.0" encoding="UTF-8"?><CompleteMultipartUploadResult>'
                f"<Key>{key}</Key><ETag>&quot;0-1&quot;</ETag></CompleteMultipartUploadResult>"
            ).encode()
            self._respond(200, [("Content-Type", "application/xml")], payload)
            return
        if fault and fault.action == "delay":
            time.sleep(fault.delay_s)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection("127.0.0.1", self.owner.upstream_port, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body or None, headers=headers)
            answer = upstream.getresponse()
            payload = answer.read()
            status, answer_headers = answer.status, answer.getheaders()
        except OSError:  # the server stopped (a request held past the end of the tests)
            self.close_connection = True
            return
        finally:
            upstream.close()
        if fault and fault.action == "reset":  # a response body cut short
            try:
                self._head(status, answer_headers, len(payload))
                self.wfile.write(payload[: fault.after_bytes])
                self.wfile.flush()
            except OSError:
                pass
            self._reset()
            return
        try:
            self._respond(status, answer_headers, payload)
        except OSError:  # the client gave up (a delay beyond its timeout)
            self.close_connection = True

    def _head(self, status: int, headers: list[tuple[str, str]], length: int) -> None:
        self.send_response_only(status)
        for key, value in headers:
            if key.lower() not in _HOP and key.lower() != "content-length":
                self.send_header(key, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def _respond(self, status: int, headers: list[tuple[str, str]], payload: bytes) -> None:
        length = len(payload)
        if self.command == "HEAD":  # no body, but the object's length
            length = int(dict((k.lower(), v) for k, v in headers).get("content-length", 0))
        self._head(status, headers, length)
        if self.command != "HEAD":
            self.wfile.write(payload)
        self.wfile.flush()

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle


_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te",
        "upgrade", "trailer"}  # fmt: skip
