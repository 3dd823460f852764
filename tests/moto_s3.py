"""An S3-compatible server (moto) on 127.0.0.1 for the runs-store tests, and the AWS variables
pointing a client at it (or at a proxy in front of it) for as long as a test needs."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

AWS_VARIABLES = (
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
)


@contextmanager
def moto_server() -> Iterator[int]:
    """A moto server on a free port of 127.0.0.1; its port."""
    moto = pytest.importorskip("moto.server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield port
    finally:
        server.stop()


@contextmanager
def aws_endpoint(url: str, bucket: str) -> Iterator[None]:
    """The AWS variables set for ``url`` (test credentials), ``bucket`` made there; the
    variables as they were afterwards."""
    saved = {k: os.environ.get(k) for k in AWS_VARIABLES}
    os.environ.update(AWS_ENDPOINT_URL=url, AWS_ACCESS_KEY_ID="test",
                      AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1")  # fmt: skip
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(bucket)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
