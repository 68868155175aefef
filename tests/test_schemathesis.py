"""The OpenAPI document is the contract: Schemathesis (``--checks all``, every phase,
stateful included) against a real gateway, with authentication off and on.

The gateway runs on a Ray of its own (an embedded one, its own storage root),
started by ``raytopics serve`` as an operator would, with segments declaring
2 GiB each: admission by capacity then holds the whole fuzz run to a handful
of segment processes however many topics the fuzzer asks for, which is the
point of it. Each run must send at least ``MIN_REQUESTS`` requests and find
nothing: no 5xx, no time-out, no answer the document does not describe, no
request the document allows that the server refuses, or the reverse.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_gateway import free_port

ST = str(Path(sys.executable).with_name("st"))
RAYTOPICS = str(Path(sys.executable).with_name("raytopics"))
MIN_REQUESTS = 2_000
ADMIN_TOKEN = "schemathesis-admin-token-0123456789"


@pytest.fixture(scope="module")
def fuzz_env(tmp_path_factory) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYTOPICS_", "RAY_ADDRESS"))}
    return env | {
        "RAYTOPICS_STORAGE_ROOT": str(tmp_path_factory.mktemp("schemathesis-root")),
        "RAYTOPICS_NAMESPACE": f"schemathesis-{uuid.uuid4().hex[:6]}",
        "RAYTOPICS_SEGMENT_MEMORY_MB": "2048",
        "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
    }


@pytest.fixture(scope="module")
def gateway(fuzz_env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    serve = subprocess.Popen(
        [RAYTOPICS, "--address", "local", "serve", "--port", str(port)],
        env=fuzz_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        banner = serve.stdout.readline()
        url = f"http://127.0.0.1:{port}"
        assert url in banner, (banner, serve.stderr.read() if serve.poll() is not None else "")
        yield url
    finally:
        serve.terminate()
        serve.communicate(timeout=120)


def schemathesis(url: str, report: Path, *extra: str) -> tuple[subprocess.CompletedProcess, int]:
    """One Schemathesis run; returns the process and how many requests it sent."""
    proc = subprocess.run(
        [
            ST, "run", f"{url}/openapi.json", "--checks", "all",
            "--phases", "examples,coverage,fuzzing,stateful",
            "--max-examples", "60", "--seed", "20261125", "--workers", "1",
            "--request-timeout", "30", "--max-response-time", "25",
            "--report", "ndjson", "--report-ndjson-path", str(report),
            "--output-truncate", "true", *extra,
        ],
        capture_output=True, text=True, timeout=1_200, check=False,
    )  # fmt: skip
    return proc, _requests(report)


def _requests(report: Path) -> int:
    """Requests recorded in the run's NDJSON events (one interaction per request)."""
    sent = 0
    for line in report.read_text().splitlines():
        event = json.loads(line)
        for value in event.values():
            if isinstance(value, dict):
                sent += _interactions(value)
    return sent


def _interactions(node: object) -> int:
    if isinstance(node, dict):
        own = 1 if "request" in node and "response" in node else 0
        return own + sum(_interactions(v) for v in node.values())
    if isinstance(node, list):
        return sum(_interactions(v) for v in node)
    return 0


def test_the_document_holds_with_authentication_off(gateway: str, tmp_path: Path) -> None:
    proc, sent = schemathesis(gateway, tmp_path / "off.ndjson")
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert sent >= MIN_REQUESTS, (sent, proc.stdout[-2000:])


def test_the_document_holds_with_authentication_on(
    gateway: str, fuzz_env: dict[str, str], tmp_path: Path
) -> None:
    document = tmp_path / "tokens.json"
    document.write_text(
        json.dumps(
            {
                "tokens": [
                    {
                        "principal": "ops",
                        "token": ADMIN_TOKEN,
                        "grants": [{"namespace": "*", "actions": ["admin"]}],
                    }
                ]
            }
        )
    )
    cli = [RAYTOPICS, "--address", "local"]
    subprocess.run([*cli, "auth", "load", str(document)], env=fuzz_env, check=True, timeout=120)
    try:
        proc, sent = schemathesis(
            gateway, tmp_path / "on.ndjson", "--header", f"Authorization: Bearer {ADMIN_TOKEN}"
        )
    finally:
        subprocess.run(
            [*cli, "--token", ADMIN_TOKEN, "auth", "disable"], env=fuzz_env, check=True, timeout=120
        )
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert sent >= MIN_REQUESTS, (sent, proc.stdout[-2000:])
