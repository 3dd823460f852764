"""Fault 6: the download process killed mid-transfer (tests/download covers a connection cut
inside one run and a failed run's partial file; here the process itself dies, with SIGKILL). The
rerun resumes with a Range request from the bytes on disk, verifies the sha256 and puts the file
in place; until then nothing is at the output path."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fault_helpers import env

from stages.core.schema.data_manifest import Dataset
from stages.download import CACHE_DIR, HttpOptions, download_dataset

pytestmark = pytest.mark.faults

BODY = b"".join(b"Sentence %07d of a corpus served slowly.\n" % i for i in range(80_000))  # 3.4 MB
PIECE = 64 << 10


class SlowServer(ThreadingHTTPServer):
    """Serves BODY at /wiki.txt in 64 KiB pieces, 10 ms apart (honouring `Range: bytes=N-`)."""

    ranges: list[str | None]


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.ranges.append(self.headers.get("Range"))  # type: ignore[attr-defined]
        match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        start = int(match.group(1)) if match else 0
        if match:
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(BODY) - 1}/{len(BODY)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(BODY) - start))
        self.end_headers()
        try:
            for i in range(start, len(BODY), PIECE):
                self.wfile.write(BODY[i : i + PIECE])
                time.sleep(0.01)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client was killed

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[SlowServer]:
    httpd = SlowServer(("127.0.0.1", 0), Handler)
    httpd.ranges = []
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join()


CHILD = """
import sys
from pathlib import Path
from stages.core.schema.data_manifest import Dataset
from stages.download import HttpOptions, download_dataset
dataset = Dataset.model_validate_json(sys.argv[1])
download_dataset(dataset, Path(sys.argv[2]), source="remote",
                 http=HttpOptions(timeout=30, retries=0, progress=False))
"""


def test_killed_download_resumes_with_a_range_request_and_verifies(
    server: SlowServer, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{server.server_address[1]}/wiki.txt"
    dataset = Dataset.model_validate({
        "description": "a corpus served slowly",
        "output": "corpus/slow.txt",
        "files": [{"path": "corpus/slow.txt", "sha256": hashlib.sha256(BODY).hexdigest()}],
        "remote": [{"url": url, "root": "corpus/slow.txt"}],
    })  # fmt: skip
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, dataset.model_dump_json(), str(tmp_path)], env=env()
    )
    parts = tmp_path / CACHE_DIR
    deadline = time.monotonic() + 120
    while child.poll() is None and not any(
        p.stat().st_size >= 1 << 20 for p in parts.glob("*.part")
    ):  # at least a MiB on disk (the client reads in 1 MiB pieces)
        assert time.monotonic() < deadline, "the transfer did not start"
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL, "the download finished before it could be killed"

    (part,) = parts.glob("*.part")
    have = part.stat().st_size
    assert 0 < have < len(BODY) and BODY.startswith(part.read_bytes())
    assert not (tmp_path / "corpus" / "slow.txt").exists()  # nothing unverified in place

    report = download_dataset(
        dataset, tmp_path, source="remote", http=HttpOptions(timeout=30, progress=False)
    )
    assert report.action == "downloaded" and report.files == 1
    assert server.ranges == [None, f"bytes={have}-"]  # resumed, not started over
    assert (tmp_path / "corpus" / "slow.txt").read_bytes() == BODY
    assert list(parts.glob("*.part")) == []
    finished = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert finished == ["corpus/slow.txt"]  # no partial file left
    # The killed run's work folder (hidden: a SIGKILL runs no cleanup) is gone too: the rerun
    # writes the same output and removes the temporaries of its dead writers.
    assert [p.name for p in (tmp_path / "corpus").iterdir()] == ["slow.txt"]
