"""Consume-transform-produce exactly once, with the worker killed at random points.

A worker (this file run as a program, a Ray driver of its own) reads an input topic
with a stream consumer, and for every few messages opens a transaction under its
owner name, sends one result per input to an output topic, acknowledges the inputs in
the transaction and commits. It is SIGKILLed (``os._exit``) at a seeded point of a
seeded step: before its sends, after them, between its acknowledgement and its
commit, while its commit is on its way, or once the commit is decided and nothing of it
finished (as a coordinator that crashed mid-commit leaves it). A new worker with the
same consumer name and owner starts each time; starting, it begins and aborts a
transaction of the owner, which fences whatever its predecessor left open and finishes
a commit it had decided (as Kafka's ``initTransactions`` does). After 20 kills a last
worker runs to the end. The output then holds exactly one result per input and the
input's backlog is 0.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import ray

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

INPUTS = 120
BATCH = 3
KILLS = 20
POINTS = ("before_send", "after_send", "before_commit", "during_commit", "decided")
OWNER = "ctp-worker"


def test_each_input_has_exactly_one_result_whatever_kills_the_worker(
    admin,
    unique: str,  # noqa: ANN001
) -> None:
    from clients import Producer, StreamConsumer

    source, sink = f"topic://acme/ctp/in{unique}", f"topic://acme/ctp/out{unique}"
    for topic in (source, sink):
        admin.create_scalable_topic(topic, 2)
    admin.create_subscription(source, "ctp")
    admin.create_subscription(sink, "check")
    with Producer(source) as producer:
        for i in range(INPUTS):
            producer.send(f"{i}".encode(), key=f"k{i % 6}")
    rng = random.Random(48)
    context = ray.get_runtime_context()
    env = os.environ | {
        "RAY_ADDRESS": context.gcs_address,
        "RAYTOPICS_NAMESPACE": context.namespace,
        "PYTHONPATH": str(ROOT),
    }
    killed = 0
    for _ in range(KILLS):
        point, step = rng.choice(POINTS), rng.randrange(3)
        worker = _worker(env, source, sink, point, step)
        killed += worker.returncode == 9
        assert worker.returncode in (0, 9), worker.stderr[-3000:]
    assert killed >= KILLS // 2, "the worker ran out of inputs before most kills"
    last = _worker(env, source, sink, "never", 0)
    assert last.returncode == 0, last.stderr[-3000:]

    results: list[str] = []
    with StreamConsumer(sink, "check", "c1") as consumer:
        while (message := consumer.receive(timeout=5)) is not None:
            results.append(message.value.decode())
            consumer.acknowledge_cumulative(message)
    assert sorted(results, key=lambda r: int(r.split("->")[0])) == [
        f"{i}->{2 * i}" for i in range(INPUTS)
    ]  # one result per input: none lost, none twice
    assert admin.get_stats(source)["subscriptions"]["ctp"]["backlog"] == 0


def _worker(
    env: dict[str, str], source: str, sink: str, point: str, step: int
) -> subprocess.CompletedProcess:
    command = [sys.executable, __file__, source, sink, point, str(step)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


# --- the worker (a program of its own) -----------------------------------------------


def work(source: str, sink: str, point: str, kill_step: int) -> None:
    from clients import Producer, ScalableTopicsAdmin, StreamConsumer

    admin = ScalableTopicsAdmin()
    admin.new_transaction(owner=OWNER).abort()  # fence and finish a predecessor's
    consumer = StreamConsumer(source, "ctp", "worker")
    producer = Producer(sink)

    def kill_if(here: str) -> None:
        if point == here and step == kill_step:
            os._exit(9)

    step = 0
    while True:
        batch = []
        while len(batch) < BATCH and (message := consumer.receive(timeout=3)) is not None:
            batch.append(message)
        if not batch:
            break
        txn = admin.new_transaction(owner=OWNER)
        kill_if("before_send")
        for message in batch:
            value = int(message.value)
            producer.send(f"{value}->{2 * value}".encode(), key=message.key, txn=txn)
        kill_if("after_send")
        consumer.acknowledge_cumulative(batch, txn=txn)
        kill_if("before_commit")
        if point == "during_commit" and step == kill_step:
            threading.Timer(random.uniform(0.0, 0.03), os._exit, (9,)).start()
        if point == "decided" and step == kill_step:
            producer.flush()  # as a commit does before it decides
            decide_and_die(txn.id)
        txn.commit()
        step += 1
    producer.close()
    consumer.close()


def decide_and_die(txn_id: str) -> None:
    """The commit decided in the record and nothing finished: how the coordinator leaves
    a transaction when it crashes in the middle of a commit (a client process cannot
    stop it there, so the test writes the decision itself)."""
    from runtime.transactions import Commit
    from storage.catalog import Catalog
    from storage.transactions import Transactions

    Transactions(Catalog().store).change(txn_id, Commit())
    os._exit(9)


if __name__ == "__main__":
    work(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
    os._exit(0)  # the Ray driver's shutdown adds nothing here
