"""The OpenAPI document is the contract: Schemathesis (``--checks all``; the examples,
coverage and fuzzing phases) against a real gateway, with authentication off and on.
With authentication off the examples and coverage phases run; with it on, the fuzzing
phase too. The stateful phase is asked for but finds nothing to chain: its links come
only from ``Location`` headers (``schemathesis.toml``), and no operation answers one yet.

The gateway runs on a Ray of its own (an embedded one, its own storage root),
started by ``raytopics serve`` as an operator would, with the default settings:
admission by capacity (by memory and by CPU) holds the whole fuzz run to what
the machine's cores carry however many topics the fuzzer asks for, which is the
point of it. Each run must send at least ``MIN_REQUESTS`` requests and find
nothing: no 5xx, no time-out, no answer the document does not describe, no
request the document allows that the server refuses, or the reverse.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_gateway import free_port

pytestmark = pytest.mark.integration  # Rays of its own (own storage root and Ray temp dir)

ST = str(Path(sys.executable).with_name("st"))
CONFIG = Path(__file__).with_name("schemathesis.toml")
RAYTOPICS = str(Path(sys.executable).with_name("raytopics"))
MIN_REQUESTS = 2_000
ADMIN_TOKEN = "schemathesis-admin-token-0123456789"


@pytest.fixture(scope="module")
def fuzz_env(tmp_path_factory) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYTOPICS_", "RAY_ADDRESS"))}
    return env | {
        "RAYTOPICS_STORAGE_ROOT": str(tmp_path_factory.mktemp("schemathesis-root")),
        "RAYTOPICS_NAMESPACE": f"schemathesis-{uuid.uuid4().hex[:6]}",
        # just under the fuzzer's limit: status long polls wait at most 12 s
        "RAYTOPICS_REST_TIMEOUT_S": "24",
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


# Loading or removing the policy changes what every later request needs, so those
# two operations are fuzzed in a run of their own, after the others.
POLICY_CHANGES = ("--exclude-operation-id", "loadAuth", "--exclude-operation-id", "disableAuth")
POLICY_OPERATIONS = ("--include-path", "/admin/v2/auth")
GENERATED = re.compile(r"(\d+) generated")


def schemathesis(
    url: str, *extra: str, phases: str = "examples,coverage,fuzzing,stateful"
) -> tuple[subprocess.CompletedProcess, int]:
    """One Schemathesis run; returns the process and how many test cases it generated."""
    proc = subprocess.run(
        [
            ST, "--config-file", str(CONFIG), "run", f"{url}/openapi.json", "--checks", "all",
            "--phases", phases,
            "--max-examples", "30", "--seed", "20261125", "--workers", "1",
            "--request-timeout", "30", "--max-response-time", "25",
            "--output-truncate", "true", *extra,
        ],
        capture_output=True, text=True, timeout=1_200, check=False,
    )  # fmt: skip
    found = GENERATED.search(proc.stdout)
    return proc, int(found.group(1)) if found else 0


def fuzz_everything(url: str, env: dict[str, str], *extra: str, **phases: str) -> int:
    """Every operation, the policy's own last; the cluster's policy is removed after
    (as an operator with Ray access can), whatever the fuzzer loaded, and the topics it
    created are deleted. Returns how many test cases were generated."""
    total = 0
    try:
        for selection in (POLICY_CHANGES, POLICY_OPERATIONS):
            proc, generated = schemathesis(url, *selection, *extra, **phases)
            print(f"schemathesis {' '.join(selection)}: {generated} test cases")
            assert proc.returncode == 0, proc.stdout[-8000:]
            total += generated
    finally:
        reset_cluster(env)
    return total


# Every topic the fuzzer created keeps a controller running: left to the next run, they
# would all be idle processes costing CPU under it.
RESET = """
import time
from runtime import connect
connect('local', log_to_driver=False)
from clients import ScalableTopicsAdmin
from storage.catalog import Catalog
catalog = Catalog()
catalog.disable_auth()
time.sleep(1.5)  # every process's copy of the policy is at most 1 s old
admin = ScalableTopicsAdmin()
for topic in catalog.all_topics():
    admin.delete_scalable_topic(str(topic))
print(len(catalog.all_topics()), "topics left")
"""


def reset_cluster(env: dict[str, str]) -> None:
    """Authentication off and no topic left, as an operator with Ray access can."""
    command = [sys.executable, "-c", RESET]
    done = subprocess.run(command, env=env, timeout=300, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.split()[-3:-2] == ["0"], done.stdout + done.stderr


def test_the_document_holds_with_authentication_off(gateway: str, fuzz_env) -> None:
    """Every operation's examples and its coverage phase (each parameter's boundaries and
    each way to break the schema); Hypothesis's random fuzzing runs with authentication
    on, below, where every route is reached the same way past the token check."""
    assert fuzz_everything(gateway, fuzz_env, phases="examples,coverage") >= MIN_REQUESTS


def test_the_document_holds_with_authentication_on(
    gateway: str, fuzz_env: dict[str, str], tmp_path: Path
) -> None:
    document = tmp_path / "tokens.json"
    admin = {"namespace": "*", "actions": ["admin"]}
    document.write_text(
        json.dumps({"tokens": [{"principal": "ops", "token": ADMIN_TOKEN, "grants": [admin]}]})
    )
    cli = [RAYTOPICS, "--address", "local"]
    subprocess.run([*cli, "auth", "load", str(document)], env=fuzz_env, check=True, timeout=120)
    time.sleep(1.5)
    bearer = ("--header", f"Authorization: Bearer {ADMIN_TOKEN}")
    assert fuzz_everything(gateway, fuzz_env, *bearer) >= MIN_REQUESTS
