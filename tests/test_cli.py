"""The ``raytopics`` console script end to end, as a user runs it, on the real local Ray.

A CLI run as a user starts it is a fresh process that joins the test session's
cluster (``raytopics``: 1-2 s and a Ray driver each). The lifecycle test runs its
first and last commands, and one that fails, that way; the commands between run the
same ``main`` in this process, which is already that cluster's driver (``cli``), with
the same environment, arguments, output and exit code.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from test_gateway import free_port, http  # tests/ is on sys.path under pytest

from clients import cli as cli_main

RAYTOPICS = str(Path(sys.executable).with_name("raytopics"))


@pytest.fixture(scope="module")
def cli_env(ray_cluster) -> dict[str, str]:
    """Point every CLI process at this session's cluster, namespace and storage."""
    context = ray.get_runtime_context()
    return {
        **os.environ,
        "RAY_ADDRESS": context.gcs_address,
        "RAYTOPICS_NAMESPACE": context.namespace,
        "RAYTOPICS_STORAGE_ROOT": os.environ["RAYTOPICS_STORAGE_ROOT"],
        "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
    }


def raytopics(env: dict[str, str], *args: str, code: int = 0) -> str:
    """Run the CLI, check its exit code, return stdout (stderr when it must fail)."""
    proc = subprocess.run(
        [RAYTOPICS, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == code, (args, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout if code == 0 else proc.stderr


def cli(env: dict[str, str], *args: str, code: int = 0) -> str:
    """As ``raytopics``, with the CLI's ``main`` run in this process (a driver of the
    cluster ``env`` points at already) under ``env``: its exit code checked (argparse's
    2 included), stdout returned, or stderr when it must fail."""
    out, err = io.StringIO(), io.StringIO()
    with _environment(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            returned = cli_main.main(list(args))
        except SystemExit as exit_:
            returned = exit_.code
    assert returned == code, (args, out.getvalue(), err.getvalue())
    return out.getvalue() if code == 0 else err.getvalue()


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def assert_one_error_line(stderr: str, *fragments: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    for fragment in fragments:
        assert fragment in lines[0], stderr


def test_help_and_usage_errors() -> None:
    env = dict(os.environ)
    usage = raytopics(env, "--help")
    assert "examples:" in usage and "subscriptions" in usage and "serve" in usage
    assert "the following arguments are required" in raytopics(env, "split", "a/b/c", code=2)
    too_wide = raytopics(env, "split", "a/b/c", "0", "--at", "0x10000", code=2)
    assert "a hash is 0-65535" in too_wide
    assert "invalid int value" in raytopics(env, "split", "a/b/c", "0", "--parts", "x", code=2)


def test_help_is_a_command_and_every_argument_says_what_it_is() -> None:
    env = dict(os.environ)
    assert "examples:" in raytopics(env, "help")
    create = raytopics(env, "help", "create")
    assert "tenant/namespace/topic" in create and "a property stored with the topic" in create
    assert "the active segment's id" in raytopics(env, "help", "split")
    assert "its adjacent neighbour's id" in raytopics(env, "merge", "--help")
    assert "--token-file" in raytopics(env, "--help")
    garbled = raytopics(env, "--url", "127.0.0.1:8080", "list", "a/b", code=2)
    assert "did you mean http://127.0.0.1:8080?" in garbled
    assert "expected http://HOST:PORT" in raytopics(env, "--url", "ftp://x", "list", "a/b", code=2)


def test_an_empty_listing_says_so(cli_env: dict[str, str], unique: str) -> None:
    assert raytopics(cli_env, "list", f"cli/empty-{unique}").strip() == (
        f"no topics in cli/empty-{unique}"
    )


def test_topic_lifecycle(cli_env: dict[str, str], unique: str) -> None:
    topic = f"cli/ns/t-{unique}"
    created = raytopics(
        cli_env, "create", topic, "--segments", "2", "--property", "team=a", "--wait", "120"
    )
    assert f"created topic://{topic} with 2 segments" in created
    assert "#0 [0000-7fff] ACTIVE created@0" in created
    assert created.rstrip().endswith("ready: 2 of 2 segments running")
    assert cli(cli_env, "status", topic).strip() == "ready: 2 of 2 segments running"
    bad_wait = cli(cli_env, "status", topic, "--wait", "x", code=2)
    assert "expected a number of seconds" in bad_wait

    assert "into #2 and #3 (epoch 1)" in cli(cli_env, "split", topic, "0")
    assert "into #4 (epoch 2)" in cli(cli_env, "merge", f"topic://{topic}", "2", "3")
    tree = cli(cli_env, "describe", topic)
    for line in (
        "epoch 2, next segment id 5, 2 active / 5 total",
        "├── #0 [0000-7fff] SEALED created@0 sealed@1",
        "│   ├── #2 [0000-3fff] SEALED created@1 sealed@2",
        "│   │   └── #4 [0000-7fff] ACTIVE created@2",
        "│   └── #3 [4000-7fff] SEALED created@1 sealed@2",
        "#4 (merged, shown above)",
        "└── #1 [8000-ffff] ACTIVE created@0",
        "properties: team=a",
    ):
        assert line in tree, tree

    options = ("--position", "latest", "--session-grace-s", "30")
    cli(cli_env, "subscriptions", "create", topic, "billing", *options)
    assert cli(cli_env, "subscriptions", "list", topic).split() == ["billing"]
    stats = cli(cli_env, "stats", topic)
    assert "2 active / 3 sealed segments" in stats
    assert "billing" in stats and "#4" in stats and "SUBSCRIPTION" in stats
    assert json.loads(cli(cli_env, "describe", topic, "--json"))["epoch"] == 2

    reset = cli(cli_env, "subscriptions", "reset", topic, "billing", "2001-09-09T01:46:40+00:00")
    assert "reset subscription billing" in reset and "5 segments, 3 finished" in reset
    future = cli(cli_env, "subscriptions", "reset", topic, "billing", "4102444800000")
    assert "a time still to come" in future
    assert "cleared the backlog" in cli(cli_env, "subscriptions", "clear-backlog", topic, "billing")
    bad_time = cli(cli_env, "subscriptions", "reset", topic, "billing", "soon", code=2)
    assert "expected earliest, latest, epoch milliseconds or an ISO 8601 time" in bad_time

    sealed = raytopics(cli_env, "split", topic, "0", code=1)  # its own process: no traceback
    assert_one_error_line(sealed, "segment 0 is SEALED")
    hashed = cli(cli_env, "hash", "customer-42").split()  # no cluster asked
    assert hashed[2] == "customer-42" and int(hashed[0], 16) == int(hashed[1]) == 0x8335
    # the key's hash alone in a segment of its own: one split into three
    at_key = cli(cli_env, "split", topic, "1", "--at", hashed[0], "--at", "33590")
    assert "into #5, #6 and #7 (epoch 3)" in at_key
    assert "#6 [8335-8335] ACTIVE created@3" in cli(cli_env, "describe", topic)
    outside = cli(cli_env, "split", topic, "7", "--at", "0x8336", code=1)
    assert_one_error_line(outside, "[0x8337, 0xffff]")
    assert "merged #7, #5 and #6 of" in cli(cli_env, "merge", topic, "7", "5", "6")
    assert "#8 [8000-ffff] ACTIVE created@4" in cli(cli_env, "describe", topic)
    quarters = cli(cli_env, "split", topic, "8", "--parts", "4")
    assert "into #9, #10, #11 and #12 (epoch 5)" in quarters
    assert "#12 [e000-ffff] ACTIVE created@5" in cli(cli_env, "describe", topic)
    # commands generated from the Admin Client API (clients/cli_calls.py)
    position = json.loads(cli(cli_env, "position-at-time", topic, "4102444800000"))
    assert position == {"next": {str(i): 0 for i in range(13)}, "finished": []}  # all empty
    assert cli(cli_env, "terminate-segment", f"segment://{topic}/0000-7fff-0").strip() == "0"
    active = cli(cli_env, "delete-segment", f"segment://{topic}/e000-ffff-12", code=1)
    assert_one_error_line(active, "ACTIVE")
    cli(cli_env, "subscriptions", "delete", topic, "billing")
    assert cli(cli_env, "list", "cli/ns").split() == [f"topic://{topic}"]
    assert raytopics(cli_env, "delete", topic).strip() == f"deleted topic://{topic}"
    assert_one_error_line(cli(cli_env, "create", "cli/n$/x", "--segments", "1", code=1))


def test_namespace_limits(cli_env: dict[str, str], unique: str) -> None:
    namespace = f"cli/lim-{unique}"
    shown = cli(cli_env, "limits", namespace, "--set", "max_message_bytes=1000")
    limits = dict(line.split() for line in shown.splitlines())
    assert limits["max_message_bytes"] == "1000" and limits["max_topics_per_namespace"] == "10000"
    assert cli(cli_env, "limits", namespace) == shown
    refused = cli(cli_env, "limits", namespace, "--set", "max_batch_bytes=10", code=1)
    assert_one_error_line(refused, "max_batch_bytes (10) must be >= max_message_bytes (1000)")
    assert "expected NAME=INTEGER" in cli(cli_env, "limits", namespace, "--set", "x", code=2)


def test_serve_and_url_mode(cli_env: dict[str, str]) -> None:
    port = free_port()
    serve = subprocess.Popen(
        [RAYTOPICS, "serve", "--port", str(port)],
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        banner = serve.stdout.readline()
        url = f"http://127.0.0.1:{port}"
        assert url in banner, (banner, serve.stderr.read() if serve.poll() is not None else "")
        status, health = http(url, "GET", "/healthz")
        assert status == 200 and health["status"] == "ok" and health["metadata"]["durable"]
        assert raytopics(cli_env, "--url", url, "list", "cli-url/ns").strip() == (
            "no topics in cli-url/ns"
        )
        missing = raytopics(cli_env, "--url", url, "describe", "cli-url/ns/missing", code=1)
        assert_one_error_line(missing, "does not exist")
        generated = ("position-at-time", "cli-url/ns/missing", "1764000000000")
        generated_missing = raytopics(cli_env, "--url", url, *generated, code=1)
        assert_one_error_line(generated_missing, "does not exist")
        # A second `serve` on the same port refuses, naming the running gateway, and
        # stops nothing: the first one still answers.
        second = raytopics(cli_env, "serve", "--port", str(port), code=1).strip().splitlines()
        # (serve says which Ray it joined first, as it always does)
        assert second[-1].startswith("error: a gateway already serves port"), second
        assert f"{port} at {url}" in second[-1] and "--replace" in second[-1], second
        assert http(url, "GET", "/healthz")[0] == 200
        replacing = subprocess.Popen(
            [RAYTOPICS, "serve", "--port", str(port), "--replace"],
            env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert url in replacing.stdout.readline()
            serve.send_signal(signal.SIGTERM)  # the replaced one's program ends...
            out, err = serve.communicate(timeout=60)
            assert serve.returncode == 0 and "had been replaced" in out, err
            assert http(url, "GET", "/healthz")[0] == 200  # ...and the new gateway serves on
        finally:
            serve = replacing
    finally:
        serve.send_signal(signal.SIGTERM)
        out, err = serve.communicate(timeout=60)
    assert serve.returncode == 0 and "stopped" in out, err
    with pytest.raises(ValueError):
        ray.get_actor(f"gateway:{port}", namespace=ray.get_runtime_context().namespace)
