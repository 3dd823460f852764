"""A real HTTP server on 127.0.0.1 serving fixture bytes, failing as real servers do."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@dataclass
class FixtureServer:
    base_url: str
    files: dict[str, bytes] = field(default_factory=dict)  # URL path -> body
    fail_with: dict[str, list[int]] = field(default_factory=dict)  # statuses answered first
    cut_after: dict[str, int] = field(default_factory=dict)  # next transfer stops after N bytes
    ignore_range: set[str] = field(default_factory=set)  # answer 200 with the whole body
    seen: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range header)

    def url(self, path: str) -> str:
        return self.base_url + path

    def ranges(self, path: str) -> list[str | None]:
        return [r for p, r in self.seen if p == path]


def _handler(server: FixtureServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path
            server.seen.append((path, self.headers.get("Range")))
            if server.fail_with.get(path):
                self.send_error(server.fail_with[path].pop(0))
                return
            if path not in server.files:
                self.send_error(404)
                return
            body = server.files[path]
            start = 0
            match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
            if match and path not in server.ignore_range:
                start = int(match.group(1))
                if start >= len(body):
                    self.send_error(416)
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(body) - start))
            self.end_headers()
            cut = server.cut_after.pop(path, None)
            # Announce the full length but stop early: the client sees a broken transfer.
            self.wfile.write(body[start:cut] if cut is not None else body[start:])

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def http_server() -> Iterator[FixtureServer]:
    server = FixtureServer(base_url="")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    server.base_url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield server
    httpd.shutdown()
    httpd.server_close()
    thread.join()
