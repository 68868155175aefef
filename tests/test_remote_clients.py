"""Clients outside Ray (``Producer(url=...)``, ``StreamConsumer(url=...)``,
``QueueConsumer(url=...)``, ``CheckpointConsumer(url=...)``, issue 44): two programs that
never import Ray produce and consume through the REST gateway, with authentication on,
while the topic splits twice and merges; every message is received once and each key's
messages in order. Two queue consumers that never import Ray share a subscription
through a split; one through the gateway redelivers and dead-letters. A program with
no token, a wrong one, or one that may look but not produce or consume is refused when
it starts, and a refused producer stores nothing. Both run from a fresh virtualenv
that has only the client install (``scalable-topics-on-ray[client]``: no Ray, Spark or
RayDP)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from auth_support import client_env, policy_removed  # tests/ is on sys.path under pytest
from ports import free_port
from waiting import wait_for

from actors.gateway.server import start_gateway, stop_gateway
from clients import (
    Checkpoint,
    CheckpointConsumer,
    DeadLetterPolicy,
    Producer,
    QueueConsumer,
    ScalableTopicsAdmin,
    StreamConsumer,
)
from runtime.errors import ConflictError, UnauthenticatedError, UnauthorizedError

PROGRAM = str(Path(__file__).with_name("remote_producer.py"))
CONSUMER = str(Path(__file__).with_name("remote_consumer.py"))
ROOT = Path(__file__).resolve().parent.parent
TOKENS = {name: f"{name}-remote-producer-token-0123456789" for name in ("ops", "app", "look")}
ROUNDS, KEYS = 100, 200  # 20,000 messages
PAUSES = (25, 50, 75)  # a split, a split, a merge


def policy(namespace: str) -> dict[str, Any]:
    def grant(name: str, *actions: str) -> dict[str, Any]:
        return {"principal": name, "token": TOKENS[name],
                "grants": [{"namespace": namespace, "actions": list(actions)}]}  # fmt: skip

    admin = {"namespace": "*", "actions": ["admin"]}
    return {
        "tokens": [
            {"principal": "ops", "token": TOKENS["ops"], "grants": [admin]},
            grant("app", "produce", "consume"),
            grant("look", "lookup"),
        ]
    }


@pytest.fixture(scope="module")
def world(ray_cluster) -> Iterator[dict[str, Any]]:
    namespace = f"remote/p{uuid.uuid4().hex[:6]}"
    with policy_removed():
        ScalableTopicsAdmin().load_auth(policy(namespace))  # authentication off: no token
        ops = ScalableTopicsAdmin(token=TOKENS["ops"])
        port = free_port()
        try:
            yield {"url": start_gateway(port), "ops": ops, "namespace": namespace}
        finally:
            stop_gateway(port)
            for topic in ops.list_scalable_topics(namespace):
                ops.delete_scalable_topic(topic)


def program(url: str, token: str | None, topic: str, *args: Any, path: str = PROGRAM) -> Any:
    """A client program in a process of its own: the gateway's URL and the token in its
    environment, nothing else of the cluster's (no Ray address, no policy file)."""
    env = client_env(RAYTOPICS_URL=url)
    env.pop("RAY_ADDRESS")
    if token is not None:
        env["RAYTOPICS_TOKEN"] = token
    command = [sys.executable, path, topic, *map(str, args)]
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def consumer(url: str, token: str | None, topic: str, expected: int) -> subprocess.Popen:
    return program(url, token, topic, "check", expected, path=CONSUMER)


def lines(proc: subprocess.Popen) -> Iterator[dict[str, Any]]:
    for line in proc.stdout:
        yield json.loads(line)
    proc.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr.read()[-3000:]


def test_programs_without_ray_produce_and_consume_through_splits_and_a_merge(world) -> None:
    ops, topic = world["ops"], f"topic://{world['namespace']}/orders"
    ops.create_scalable_topic(topic, 1)
    ops.create_subscription(topic, "check")
    reader = consumer(world["url"], TOKENS["app"], topic, ROUNDS * KEYS)
    read = lines(reader)
    assert next(read) == {"started": True}  # it reads while the layout changes
    proc = program(world["url"], TOKENS["app"], topic, ROUNDS, KEYS, *PAUSES)
    changes = iter([
        lambda: ops.split_segment(topic, 0),  # 0 -> 1, 2
        lambda: ops.split_segment(topic, 1),  # 1 -> 3, 4
        lambda: ops.merge_segments(topic, 3, 4),  # 3, 4 -> 5
    ])  # fmt: skip
    for line in lines(proc):
        if "paused" in line:
            next(changes)()
            proc.stdin.write("go\n")
            proc.stdin.flush()
        last = line
    assert last["sent"] == ROUNDS * KEYS and last["ray"] is False, last
    # The first round is stored before the first split (the program waits for it); what
    # the other parents took before they were sealed depends on timing, and the merge's
    # segment and the first split's upper child take what was sent after the last change.
    assert {0, 2, 5} <= set(last["segments"]) <= set(range(6)), last

    (got,) = list(read)
    assert got["ray"] is False and got["mismatched"] == 0, {k: got[k] for k in got if k != "seen"}
    assert got["received"] == ROUNDS * KEYS and got["extra"] == 0, got["received"]
    want = {f"k{k}": list(range(ROUNDS)) for k in range(KEYS)}
    assert got["seen"] == want, "lost, doubled or reordered"
    # Everything is acknowledged: a Ray driver joining the subscription finds nothing.
    with StreamConsumer(topic, "check", "checker", token=TOKENS["app"]) as checker:
        assert checker.receive(timeout=2.0) is None


def test_a_program_without_a_good_token_is_refused_and_stores_nothing(world) -> None:
    ops, topic = world["ops"], f"topic://{world['namespace']}/refused"
    ops.create_scalable_topic(topic, 2)
    ops.create_subscription(topic, "check")
    tokens = {"no token": None, "wrong": "wrong-remote-producer-token-0123456789",
              "lookup only": TOKENS["look"]}  # fmt: skip
    procs = {label: program(world["url"], token, topic, 1, 10) for label, token in tokens.items()}
    readers = {label: consumer(world["url"], token, topic, 1) for label, token in tokens.items()}
    for kind in (procs, readers):
        refused = {label: list(lines(proc))[-1] for label, proc in kind.items()}
        assert refused["no token"]["refused"] == "UnauthenticatedError", refused
        assert refused["wrong"]["refused"] == "UnauthenticatedError", refused
        assert refused["lookup only"]["refused"] == "UnauthorizedError", refused
        assert not any(line["ray"] for line in refused.values())
    with StreamConsumer(topic, "check", "checker", token=TOKENS["app"]) as checker:
        assert checker.receive(timeout=2.0) is None, "a refused producer stored a message"
    joined = ops.get_stats(topic)["subscriptions"]["check"]["assignments"]
    assert "remote-consumer" not in joined, "a refused consumer joined"


def test_a_checkpoint_consumer_through_the_gateway_resumes_exactly_after_its_checkpoint(
    world,
) -> None:
    """``CheckpointConsumer(url=...)``: the group made, reset to a checkpoint and read
    through the gateway, the records over the data plane; resumed after a split, it
    receives exactly what follows its checkpoint, each key in order. Its progress is the
    caller's: a subscription's name is refused as a group, and a group's reset needs
    ``consume``."""
    ops, topic = world["ops"], f"topic://{world['namespace']}/connector"
    ops.create_scalable_topic(topic, 2)
    ops.create_subscription(topic, "stream")
    remote = {"url": world["url"], "token": TOKENS["app"]}
    with Producer(topic, **remote) as producer:
        for i in range(600):
            producer.send(f"{i}".encode(), key=f"k{i % 20}")
    with CheckpointConsumer(topic, "connector", "reader", **remote) as first:
        before = first.receive_batch(250, timeout=10)
        while len(before) < 250:
            before += first.receive_batch(250 - len(before), timeout=10)
        checkpoint = Checkpoint.from_json(first.checkpoint().to_json())
    ops.split_segment(topic, 0)
    with Producer(topic, **remote) as producer:
        for i in range(600, 1_200):
            producer.send(f"{i}".encode(), key=f"k{i % 20}")

    with CheckpointConsumer(topic, "connector", "reader", start=checkpoint, **remote) as resumed:
        after: list = []
        deadline = time.monotonic() + 90
        while len(after) < 1_200 - len(before) and time.monotonic() < deadline:
            after += resumed.receive_batch(1_000, timeout=1)
        after += resumed.receive_batch(1_000, timeout=1)  # anything extra would be a bug
    seen_after = [int(m.value) for m in after]
    assert len(seen_after) == len(set(seen_after)), "duplicates after resume"
    assert set(seen_after) == set(range(1_200)) - {int(m.value) for m in before}
    per_key: dict[str, list[int]] = {}
    for message in before + after:
        per_key.setdefault(message.key, []).append(int(message.value))
    assert all(values == sorted(values) for values in per_key.values()), "key order broken"

    with pytest.raises(ConflictError, match="not a checkpoint group"):
        CheckpointConsumer(topic, "stream", "reader", **remote)
    with pytest.raises(UnauthorizedError):
        CheckpointConsumer(topic, "connector", "x", start=checkpoint, url=world["url"],
                           token=TOKENS["look"])  # fmt: skip


def test_queue_consumers_without_ray_share_a_subscription_through_a_split(world) -> None:
    """``QueueConsumer(url=...)``: two programs that never import Ray share a queue
    subscription while the topic splits; every message reaches one of them, each
    acknowledged over the data plane, so a Ray driver that joins after finds nothing
    left, not even what a departing consumer held."""
    ops, topic = world["ops"], f"topic://{world['namespace']}/work"
    ops.create_scalable_topic(topic, 2)
    ops.create_subscription(topic, "work")
    workers = [
        program(world["url"], TOKENS["app"], topic, "work", 0, "queue", name, path=CONSUMER)
        for name in ("w1", "w2")
    ]
    said: list[list[dict[str, Any]]] = [[], []]
    readers = [
        threading.Thread(target=lambda w=w, out=out: out.extend(map(json.loads, w.stdout)))
        for w, out in zip(workers, said, strict=True)
    ]
    for reader in readers:
        reader.start()
    wait_for(lambda: all(out for out in said), 120)  # both started
    assert all(out[0] == {"started": True} for out in said), said
    remote = {"url": world["url"], "token": TOKENS["app"]}
    with Producer(topic, **remote) as producer:
        for i in range(4_000):
            producer.send(f"{i}".encode(), key=f"k{i % 50}")
            if i == 2_000:
                producer.flush()
                ops.split_segment(topic, 0)

    def values(out: list[dict[str, Any]]) -> list[str]:
        return [line["got"] for line in list(out) if "got" in line]

    everything = {str(i) for i in range(4_000)}
    wait_for(lambda: set(values(said[0]) + values(said[1])) >= everything, 120)
    for worker in workers:
        worker.stdin.write("stop\n")
        worker.stdin.flush()
    for worker, reader in zip(workers, readers, strict=True):
        reader.join(timeout=60)
        assert worker.wait(timeout=60) == 0, worker.stderr.read()[-3000:]
    assert all(out[-1] == {"done": True, "ray": False} for out in said), [o[-1] for o in said]
    assert all(values(out) for out in said), "one consumer got nothing: nothing was shared"
    segments = {line["segment"] for out in said for line in out if "segment" in line}
    assert {1, 2} <= segments, segments  # the split's children were found and read
    with QueueConsumer(topic, "work", token=TOKENS["app"]) as checker:
        assert checker.receive(timeout=2.0) is None, "a message was not acknowledged"


def test_a_queue_consumer_through_the_gateway_redelivers_and_dead_letters(world) -> None:
    """Negative acknowledgements come back counted; the delivery past the policy's limit
    goes to the dead-letter topic (through the gateway too) with where it came from; a
    closed consumer's unacknowledged messages go to the next at once. A token that may
    look but not consume, or a wrong one, is refused when the consumer starts."""
    ops, ns = world["ops"], world["namespace"]
    topic, dead = f"topic://{ns}/jobs", f"topic://{ns}/jobs-dead"
    for name in (topic, dead):
        ops.create_scalable_topic(name, 1)
    ops.create_subscription(topic, "jobs")
    ops.create_subscription(dead, "audit")
    remote = {"url": world["url"], "token": TOKENS["app"]}
    with Producer(topic, **remote) as producer:
        for i in range(3):
            producer.send(f"job-{i}".encode(), key="k")
    policy = DeadLetterPolicy(2, dead)
    with QueueConsumer(topic, "jobs", "worker", dead_letter=policy, **remote) as worker:
        deliveries: list[tuple[str, int]] = []
        for _ in range(4):
            message = worker.receive(timeout=30)
            assert message is not None, deliveries
            deliveries.append((message.value.decode(), message.redelivery_count))
            if message.value == b"job-1":
                worker.negative_acknowledge(message, error="boom")
            else:
                worker.acknowledge(message)
        assert worker.receive(timeout=2.0) is None  # the third delivery was dead-lettered
    assert sorted(deliveries) == [("job-0", 0), ("job-1", 0), ("job-1", 1), ("job-2", 0)]
    with StreamConsumer(dead, "audit", "auditor", **remote) as auditor:
        buried = auditor.receive(timeout=30)
    assert buried is not None and buried.value == b"job-1", buried
    assert buried.properties["origin.error"] == "boom", buried.properties

    with Producer(topic, **remote) as producer:
        producer.send(b"held", key="k")
    with QueueConsumer(topic, "jobs", "first", **remote) as first:
        assert first.receive(timeout=30).value == b"held"  # taken, never acknowledged
    with QueueConsumer(topic, "jobs", "second", **remote) as second:
        again = second.receive(timeout=10)  # well before the ack timeout
        assert again is not None and (again.value, again.redelivery_count) == (b"held", 1)
        second.acknowledge(again)

    wrong = "wrong-remote-producer-token-0123456789"
    for token, refusal in ((TOKENS["look"], UnauthorizedError), (wrong, UnauthenticatedError)):
        with pytest.raises(refusal):
            QueueConsumer(topic, "jobs", url=world["url"], token=token)


@pytest.fixture(scope="module")
def client_python(tmp_path_factory) -> Path:
    """A fresh virtualenv with this project's client install only, as a user gets it from
    ``pip install "scalable-topics-on-ray[client]"`` (here from this checkout)."""
    where = tmp_path_factory.mktemp("client-install")
    source = where / "source"  # a copy: building in place would leave build/ in the checkout
    for package in ("actors", "clients", "runtime", "storage"):
        shutil.copytree(ROOT / package, source / package,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    for file in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / file, source / file)
    venv = where / "venv"
    subprocess.run([_base_python(), "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
               f"{source}[client]"]  # fmt: skip
    done = subprocess.run(install, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return python


def _base_python() -> str:
    """The interpreter this suite's virtualenv was made from (a venv is made from a base)."""
    return str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}")


def test_the_client_install_has_no_ray_and_produces_and_consumes_through_the_gateway(
    world, client_python: Path, tmp_path: Path
) -> None:
    listed = subprocess.run([str(client_python), "-m", "pip", "list", "--format=json"],
                            capture_output=True, text=True, check=True, timeout=120)  # fmt: skip
    installed = {package["name"].lower() for package in json.loads(listed.stdout)}
    assert "scalable-topics-on-ray" in installed
    assert not installed & {"ray", "pyspark", "raydp"}, installed

    ops, topic = world["ops"], f"topic://{world['namespace']}/from-a-client-install"
    ops.create_scalable_topic(topic, 2)
    ops.create_subscription(topic, "check")
    program_copy = shutil.copy(PROGRAM, tmp_path)  # run away from this checkout's modules
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(tmp_path)),
           "RAYTOPICS_URL": world["url"], "RAYTOPICS_TOKEN": TOKENS["app"]}  # fmt: skip
    done = subprocess.run([str(client_python), program_copy, topic, "10", "50"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    last = json.loads(done.stdout.splitlines()[-1])
    assert last["sent"] == 500 and last["ray"] is False, last

    consumed = subprocess.run([str(client_python), shutil.copy(CONSUMER, tmp_path), topic,
                               "check", "500"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=180)  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr[-3000:]
    got = json.loads(consumed.stdout.splitlines()[-1])
    assert got["ray"] is False and got["received"] == 500 and got["extra"] == 0, got
    assert got["seen"] == {f"k{k}": list(range(10)) for k in range(50)}

    # A Ray client in the client install says what is missing, not which module failed.
    probe = "from clients import ScalableTopicsAdmin"
    refused = subprocess.run([str(client_python), "-c", probe], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert refused.returncode != 0
    assert "RayNotInstalledError" in refused.stderr and "[ray]" in refused.stderr, refused.stderr
    command = [str(client_python.parent / "raytopics"), "list", world["namespace"]]
    cli = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 1 and cli.stderr.startswith("error: ") and "[ray]" in cli.stderr
    assert "Traceback" not in cli.stderr, cli.stderr
