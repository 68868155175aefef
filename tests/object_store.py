"""A real S3 API server on loopback (moto in server mode) for the tier tests, and the
tiers this test session's cluster allows.

The operator owns where and how the cluster writes a tier (``runtime.tiering``): the
S3 endpoints and credentials live in ``RAYTOPICS_TIER_URIS``, set by ``conftest``
before any actor starts, one bucket per role:

* ``tier``: the session's server (the ``s3_endpoint`` fixture), always up;
* ``guarded``: a server a test starts that refuses every credential;
* ``flaky``: a server a test stops and starts again (an object store that goes down).

A policy then names only ``s3://tier/…``, ``s3://guarded/…`` or ``s3://flaky/…``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from ports import free_port

MOTO = Path(sys.executable).with_name("moto_server")
CREDENTIALS = "testing:testing"


# Chosen when conftest imports this module, before the session's actors read them.
PORTS = {bucket: free_port() for bucket in ("tier", "guarded", "flaky")}


def endpoint_of(bucket: str) -> str:
    return f"127.0.0.1:{PORTS[bucket]}"


def s3_uri(endpoint: str, path: str) -> str:
    """A full ``pyarrow.fs`` URI of ``path`` (``bucket/prefix``) on ``endpoint``, with its
    credentials and options: what the operator's prefix holds, and what storage-level
    tests (no cluster) open directly."""
    options = f"endpoint_override={endpoint}&scheme=http&region=us-east-1"
    return f"s3://{CREDENTIALS}@{path}?{options}"


def operator_tier_uris(file_root: str) -> str:
    """``RAYTOPICS_TIER_URIS`` of the session: a scratch directory and the three buckets."""
    buckets = [s3_uri(endpoint_of(bucket), f"{bucket}/") for bucket in PORTS]
    return ",".join([f"file://{file_root}/", *buckets])


@contextlib.contextmanager
def s3_server(
    *, enforce_auth: bool = False, port: int | None = None, bucket: str = "tier"
) -> Iterator[str]:
    """A moto S3 server on loopback (on ``port``, else a free one) with a bucket
    ``bucket``; its endpoint. Stopped on exit, and everything it held is gone then.
    ``enforce_auth``: every request must carry credentials the server issued (none are:
    whatever a client presents is refused), and no bucket is made."""
    from storage.tier import open_tier

    port = port or free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"} if enforce_auth else None
    server = subprocess.Popen(
        [str(MOTO), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        wait_until_listening(port, server)
        assert server.poll() is None, f"port {port} is taken: the S3 server could not start"
        endpoint = f"127.0.0.1:{port}"
        if not enforce_auth:
            filesystem, _ = open_tier(s3_uri(endpoint, bucket) + "&allow_bucket_creation=true")
            filesystem.create_dir(bucket)
        yield endpoint
    finally:
        server.terminate()
        server.wait(10)


def wait_until_listening(port: int, server: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            alive = server is None or server.poll() is None
            assert time.monotonic() < deadline and alive, "the S3 server did not start"
            time.sleep(0.1)
